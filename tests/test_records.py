"""Every Store read returns rows with exactly the keys its runhealth/records.py TypedDict declares.

The rows come from stores written the way the collector writes them (tests/store_fixtures.py,
plus one poll carrying GPU health, an XID and a host reading, which the fixtures' replies lack),
so a renamed SQL column, a new `SELECT *` column or a dropped `AS` name fails here, not on a page.
Each case says which of the row type's optional keys that read must have (length_counts by node
has `node`, by shard `node` and `path`; host_latest has the host fields the agent sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from store_fixtures import write_reply

from runhealth import records
from runhealth.alerting.outputs import STATUS_KEY, Outbound, read_status
from runhealth.store import Store, rollup
from tests.store_fixtures import build_run, gpu_device, make_store, poll_reply

HOST = {
    "cpus": 64,
    "mem_total_bytes": 2 << 40,
    "mem_available_bytes": 1 << 40,
    "swap_total_bytes": 8 << 30,
    "swap_free_bytes": 8 << 30,
}


def key_problems(rows: list[Any], row_type: type, optional_present: frozenset[str] = frozenset()) -> list[str]:
    """What is wrong with `rows`' keys against `row_type` (empty: every row has exactly its
    required keys plus `optional_present`, which must be among its optional ones)."""
    required, optional = set(row_type.__required_keys__), set(row_type.__optional_keys__)
    assert optional_present <= optional, f"{sorted(optional_present - optional)} are not optional keys"
    want = required | optional_present
    problems = []
    for row in rows:
        keys = set(row)
        if keys != want:
            problems.append(f"missing {sorted(want - keys)}, undeclared {sorted(keys - want)}")
    return sorted(set(problems))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    now = time.time()
    store, _config = make_store(tmp_path_factory.mktemp("records"), "healthy", now=now)
    device = {**gpu_device(0, 50.0), "health": {"ecc_uncorrected_volatile": 2, "pcie_replay": 7, "xid": [79]}}
    reply = {**poll_reply(now + 1, [device], {}), "host": HOST}
    write_reply(store, "node-1", reply, now + 1, rtt_ms=10.0)
    store.new_sample_batch(5, now + 2)  # drawn, not finished: the pending batch
    Outbound(stores=[store], notices=["a notice"], webhook_targets=["https://hooks.example/…"]).write_status(now + 3)
    episode = {"key": '["node_down", "node-2", null]', "name": "node_down", "severity": "critical"}
    episode |= {"node": "node-2", "gpu": None, "summary": "node-2 down", "value": 400.0}
    store.write_alert_episodes(now + 4, started=[episode])
    return store


# (name, read, row type, optional keys present)
CASES: list[tuple[str, Callable[[Store], list[Any]], type, frozenset[str]]] = [
    ("nodes", Store.nodes, records.NodeRow, frozenset()),
    ("shards", Store.shards, records.ShardRow, frozenset()),
    ("length_counts run", lambda s: s.length_counts(by="run"), records.LengthCountRow, frozenset()),
    ("length_counts node", lambda s: s.length_counts(by="node"), records.LengthCountRow, frozenset({"node"})),
    (
        "length_counts shard",
        lambda s: s.length_counts(by="shard", finish_reason="length"),
        records.LengthCountRow,
        frozenset({"node", "path"}),
    ),
    ("group_totals node", lambda s: s.group_totals("node"), records.GroupTotalRow, frozenset()),
    ("group_totals shard", lambda s: s.group_totals("shard"), records.GroupTotalRow, frozenset({"path"})),
    ("polls", Store.polls, records.PollRow, frozenset()),
    ("polls_by_bucket", lambda s: s.polls_by_bucket(60), records.PollBucket, frozenset()),
    ("length_stops_by_bucket", lambda s: s.length_stops_by_bucket(60, 4096), records.LengthStopBucket, frozenset()),
    ("gpu_health", Store.gpu_health, records.GpuHealthReading, frozenset()),
    ("gpu_events", lambda s: s.gpu_events(0), records.GpuEventRow, frozenset()),
    ("host_latest", lambda s: list(s.host_latest().values()), records.HostReading, frozenset(HOST)),
    ("gpu_latest", Store.gpu_latest, records.GpuRow, frozenset()),
    ("gpu_series", lambda s: s.gpu_series(max_points=50), records.GpuSeriesPoint, frozenset()),
    ("metric_latest", Store.metric_latest, records.MetricRow, frozenset()),
    ("node_energy", Store.node_energy, records.EnergyRow, frozenset()),
    ("metric_series", lambda s: s.metric_series("sglang:gen_throughput"), records.MetricPoint, frozenset()),
    ("latest_sample_batch", lambda s: [s.latest_sample_batch()], records.SampleBatch, frozenset()),
    ("samples", lambda s: s.latest_sample_batch()["samples"], records.StoredSample, frozenset()),
    ("pending_sample_batch", lambda s: [s.pending_sample_batch()], records.PendingSampleBatch, frozenset()),
    ("alert_episodes", Store.alert_episodes, records.AlertEpisodeRow, frozenset()),
    # what the collecting process writes (run meta "collector"), as the viewer reads it back
    ("collector status", lambda s: [s.meta(STATUS_KEY)], records.CollectorStatus, frozenset()),
    ("read_status", lambda s: [read_status(s)], records.CollectorStatus, frozenset()),
]


@pytest.mark.parametrize(("read", "row_type", "optional"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_read_has_exactly_its_declared_keys(store, read, row_type, optional):
    rows = read(store)
    assert rows and all(r is not None for r in rows), "the fixture store must give this read rows to check"
    assert key_problems(rows, row_type, optional) == []


def test_a_node_the_store_cannot_write_gains_store_error(store, monkeypatch):
    monkeypatch.setattr(store, "write_failures", {"node-2": ("cannot write the history store: disk full", 1.0, 2.0)})
    rows = {r["name"]: r for r in store.nodes()}
    assert key_problems([rows["node-2"]], records.NodeRow, frozenset({"store_error"})) == []
    assert key_problems([rows["node-1"]], records.NodeRow) == []


def test_rollup_reads_have_the_shape_of_the_raw_reads(tmp_path):
    """rollup.gpu_history / poll_history over rolled-up rows return what Store.gpu_series /
    polls_by_bucket return (the pages use either)."""
    now = time.time()
    store = Store(tmp_path / "r.sqlite3")
    build_run(store, now=now, trunc_frac=0.1, nodes=2, gpus=8, polls=20, per_shard=5)
    rollup.rollup(store, now=now, raw_keep_s=60, chunk_s=3600, pause_s=0.0)
    assert rollup.has_rollups(store)
    gpu, polls = rollup.gpu_history(store, max_points=50), rollup.poll_history(store, 60)
    assert gpu and polls
    assert key_problems(gpu, records.GpuSeriesPoint) == []
    assert key_problems(polls, records.PollBucket) == []


def test_a_renamed_column_is_caught(store, monkeypatch):
    """The check bites: a read whose SQL renamed a column (planted here by wrapping the method;
    monkeypatch puts the real one back) no longer matches its row type."""
    real = Store.polls

    def renamed(self: Store, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return [
            {("round_trip_ms" if k == "rtt_ms" else k): v for k, v in r.items()} for r in real(self, *args, **kwargs)
        ]

    monkeypatch.setattr(Store, "polls", renamed)
    problems = key_problems(store.polls(), records.PollRow)
    assert problems == ["missing ['rtt_ms'], undeclared ['round_trip_ms']"]
    monkeypatch.undo()
    assert key_problems(store.polls(), records.PollRow) == []
