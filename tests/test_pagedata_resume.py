"""A restarted collector resumes its page data instead of reading the whole history (issue 42 item 4).

The Refresher keeps GPU bands per step and truncation buckets between passes; a new collector on
the same store used to start them empty, so its first pass read every GPU row of the history (165
CPU s at 512 nodes x 24 h). Now the kept state is written to the store (pagedata.STATE) and read
back: the first pass after a restart reads only the rows written since, and gives what a pass
from scratch gives. A state whose rows the store no longer holds as they were is not used.
"""

from __future__ import annotations

import store_fixtures
from test_gpubands import add_round, rows_of

from runhealth.payloads import gpubands, pagedata, truncbuckets
from runhealth.payloads.pagetypes import GpuWindow, TruncationOverTime
from runhealth.store import Store


def _refresher(store: Store, now: list[float]) -> pagedata.Refresher:
    return pagedata.Refresher(
        store, store_fixtures.CEILING, 10.0, min_interval_s=10, clock=lambda: now[0], monotonic=lambda: now[0]
    )


def _payloads(store: Store) -> dict[str, object]:
    out: dict[str, object] = {}
    for window in pagedata.GPU_WINDOWS_S:
        got = pagedata.get(store, f"gpu:{window}", GpuWindow)
        assert got is not None and got[1].bands is not None
        out[window] = ({v: rows_of(got[1].bands[v]) for v in pagedata.GPU_VALUES}, got[1].limits)
    trunc = pagedata.get(store, "truncation_over_time", TruncationOverTime)
    assert trunc is not None
    out["truncation"] = trunc[1]
    return out


def _counting(monkeypatch) -> list[int]:
    read_rows: list[int] = []
    real = gpubands.gpu_means
    monkeypatch.setattr(gpubands, "gpu_means", lambda *a: read_rows.append(len(out := real(*a))) or out)
    return read_rows


def _store(tmp_path, now: float) -> Store:
    store = Store(tmp_path / "x.sqlite3")
    store_fixtures.build_run(store, now=now, trunc_frac=0.01, nodes=12, polls=150, per_shard=2)
    return store


def test_a_restarted_refresher_reads_only_the_new_rows_and_gives_the_same_payloads(tmp_path, monkeypatch):
    now = [1_800_000_000.0]
    store = _store(tmp_path, now[0])
    read_rows = _counting(monkeypatch)
    first = _refresher(store, now)
    first.run_now()
    from_scratch = sum(read_rows)
    assert first.save_on_stop()  # the collector stops: its state is kept in the store
    for _ in range(2):  # polls land while no collector runs on it... and after the restart
        now[0] += 10
        add_round(store, now[0], 12, 55.0)
    read_rows.clear()
    restarted = _refresher(store, now)  # a new process: nothing in memory
    restarted.run_now()
    resumed = sum(read_rows)
    assert 0 < resumed < from_scratch / 10, (resumed, from_scratch)  # on main: == from_scratch
    got = _payloads(store)
    with store.transaction() as db:  # the reference pass: no payload, no state
        db.execute("DELETE FROM page_data")
    _refresher(store, now).run_now()  # no state: every window from scratch
    assert got == _payloads(store)


def test_state_whose_rows_were_replaced_is_not_used(tmp_path, monkeypatch):
    """A store emptied and refilled to past the kept rowid (a file recreated) must not resume:
    the row the state last read is not there as it was."""
    now = [1_800_000_000.0]
    store = _store(tmp_path, now[0])
    first = _refresher(store, now)
    first.run_now()
    assert first.save_on_stop()
    with store.transaction() as db:  # the same rowids, other readings
        db.execute("UPDATE gpu_samples SET node = node || '-x'")
        db.execute("UPDATE polls SET node = node || '-x'")
    restarted = _refresher(store, now)
    assert restarted.restore_state() == (0, False)


def test_truncation_snapshot_round_trips(tmp_path):
    now = 1_800_000_000.0
    store = _store(tmp_path, now)
    kept = truncbuckets.Truncation(store)
    want = kept.buckets(60.0, store_fixtures.CEILING)
    again = truncbuckets.Truncation(store)
    assert again.restore(pagedata.decode(pagedata.encode(kept.snapshot())))
    assert again.buckets(60.0, store_fixtures.CEILING) == want
    assert again.redone_from is None  # nothing new: nothing read again
