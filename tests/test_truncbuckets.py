"""Truncation over time kept per bucket (runhealth/payloads/truncbuckets.py), and a page-data refresh whose
work does not grow with the run's history."""

from __future__ import annotations

import random

import pytest

from runhealth.payloads import pagedata, truncbuckets
from runhealth.store import Store, rollup

NOW = 1_800_000_000.0


def add_polls(store: Store, rng: random.Random, start: float, n: int, nodes: int = 3, backfill: float = 0.2) -> None:
    """`n` rounds of polls from `start`, 10 s apart: deltas, some backfill, a few length stops each."""
    polls, stops = [], []
    for k in range(n):
        for i in range(nodes):
            ts = start + 10 * k + i * 0.01
            polls.append(
                (ts, f"node-{i}", ts, rng.randint(0, 9), rng.randint(0, 9000), 2, 0, int(rng.random() < backfill))
            )
            for tokens in rng.sample([512, 2000, 4095, 4096], rng.randint(0, 2)):
                stops.append((ts, f"node-{i}", tokens, rng.randint(1, 3)))
    with store.transaction() as db:
        db.executemany(
            "INSERT INTO polls (ts_unix, node, node_ts_unix, completions, tokens, length_stops, malformed, backfill)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            polls,
        )
        db.executemany("INSERT INTO poll_length_stops VALUES (?, ?, ?, ?)", stops)


def full(store: Store, bucket_s: float, ceiling: int | None) -> tuple[list, list]:
    return rollup.poll_history(store, bucket_s), store.length_stops_by_bucket(bucket_s, ceiling)


@pytest.mark.parametrize("bucket_s", [30.0, 3600.0])
def test_kept_buckets_equal_a_full_read_through_late_rows_and_rollups(tmp_path, bucket_s):
    store, rng = Store(tmp_path / "x.sqlite3"), random.Random(int(bucket_s))
    add_polls(store, rng, NOW - 6 * 3600, 1800)
    cache = truncbuckets.Truncation(store)
    assert cache.buckets(bucket_s, 4096) == full(store, bucket_s, 4096)
    t = NOW - 1200
    for step in range(8):
        add_polls(store, rng, t, 3)
        t += 30
        if step == 2:  # a slow node's poll, stamped an hour back
            add_polls(store, rng, t - 3600, 1, nodes=1, backfill=1.0)
        if step == 4:  # the hourly fold: raw polls older than 2 h become minutes
            rollup.rollup(store, NOW, raw_keep_s=2 * 3600, pause_s=0)
        got = cache.buckets(bucket_s, 4096)
        assert got == full(store, bucket_s, 4096), step
        if step in (0, 1, 3):  # only the newest minute was read again
            assert cache.redone_from == int((t - 30) / truncbuckets.PIECE_S) * truncbuckets.PIECE_S
    assert cache.buckets(bucket_s, 4096) == full(store, bucket_s, 4096)  # nothing new: nothing read
    assert cache.redone_from is None
    assert cache.buckets(bucket_s, 2000) == full(store, bucket_s, 2000)  # another ceiling: all again


def build_history(store: Store, nodes: int, hours: float, end: float) -> None:
    """`hours` of 10 s polls of `nodes` x 8 GPUs (what bench/fleet.py --history writes)."""
    polls = int(hours * 360)
    first = end - polls * 10
    with store.transaction() as db:
        db.execute("CREATE TEMP TABLE n (i INTEGER PRIMARY KEY, name TEXT)")
        db.executemany("INSERT INTO n VALUES (?, ?)", [(i, f"node-{i}") for i in range(nodes)])
        steps = "WITH RECURSIVE p(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM p WHERE k < ?)"
        gpus = "(WITH RECURSIVE g(gpu) AS (SELECT 0 UNION ALL SELECT gpu + 1 FROM g WHERE gpu < 7) SELECT gpu FROM g)"
        db.execute(
            f"INSERT INTO gpu_samples {steps} SELECT ? + k * 10 + i * 0.001, name, gpu, 90 + (k * 7 + gpu) % 9,"
            f" 120000.0, 143771.0, 600 + (k * 13 + i) % 90, 700.0, 60.0, 1980.0, 0 FROM p, n, {gpus}",
            (polls - 1, first),
        )
        db.execute(
            f"INSERT INTO polls (ts_unix, node, node_ts_unix, completions, tokens, length_stops, malformed, backfill, rtt_ms) {steps} SELECT ? + k * 10 + i * 0.001, name, NULL, 40, 40000, 2, 0, 0, 20.0 FROM p, n",
            (polls - 1, first),
        )
        db.execute(
            f"INSERT INTO poll_length_stops {steps} SELECT ? + k * 10 + i * 0.001, name, 4096, 2 FROM p, n",
            (polls - 1, first),
        )
        db.execute(f"INSERT OR REPLACE INTO gpu_seen SELECT name, gpu, ? FROM n, {gpus}", (end,))
        db.execute("DROP TABLE n")


def steady_refresh_steps(store: Store, end: float) -> int:
    """SQLite VM steps (in thousands) of one page-data refresh after a poll, every GPU window due."""
    clock = [end]
    refresher = pagedata.Refresher(
        store, 4096, 10.0, min_interval_s=10, clock=lambda: clock[0], monotonic=lambda: clock[0]
    )
    refresher.run_now()  # the first pass reads the whole history once
    steps = [0]
    db = store._db()
    for _ in range(2):
        clock[0] += 400  # past the 24 h window's 360 s steps: every window is due again
        build_history(store, 4, 1 / 360, clock[0])  # one more poll of every node
        steps[0] = 0
        db.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1), 1000)
        try:
            refresher.run_now()
        finally:
            db.set_progress_handler(None, 0)
    return steps[0]


def test_a_refresh_reads_what_the_poll_added_not_the_history(tmp_path):
    """A day of history costs a refresh what an hour does: it reads the new rows, not the old."""
    found = {}
    for hours in (1, 24):
        store = Store(tmp_path / f"{hours}.sqlite3")
        build_history(store, 4, hours, NOW)
        found[hours] = steady_refresh_steps(store, NOW)
        store.close()
    assert found[24] <= 1.5 * found[1] + 50, found  # on main: 24 h read 10-20x the 1 h's rows
