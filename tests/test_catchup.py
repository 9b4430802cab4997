"""Catch-up belongs to one node's real backlog, and a renamed node is counted once (issue 29,
items 2 and 5).

Real agents over the local transport (the collector's own pollers); the collector's clock is a
counter, so the polls of a few seconds stand for minutes of a run. Every consumer is read: the
store's run-level series, the alerts (health.evaluate, what webhooks send), /metrics and the
Overview under AppTest.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import streamlit as st
from prometheus_client import generate_latest
from shardgen import truth_rows, write_shard
from store_fixtures import write_reply
from streamlit.testing.v1 import AppTest

from components import loaders, tables
from runhealth.alerting import exporter
from runhealth.collect.collector import Collector
from runhealth.rules import activity, health
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store, rollup

INTERVAL_S = 10.0


@pytest.fixture(autouse=True)
def _clear_streamlit_caches():
    st.cache_data.clear()  # they leak between AppTests (streamlit #9139)
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


class Clock:
    """The collector's wall clock, moved on by hand: one poll interval per step."""

    def __init__(self, start: float):
        self.now = start

    def __call__(self) -> float:
        return self.now


def local_node(name: str, glob: str) -> NodeConfig:
    return NodeConfig(name=name, host="local", shards=[glob], python=sys.executable, gpu="off", command_timeout_s=20.0)


def run_config(*nodes: NodeConfig) -> RunConfig:
    return RunConfig(name="catchup", nodes=list(nodes), interval_s=INTERVAL_S, stall_after_s=60.0)


def metric_sum(store: Store, name: str, now: float) -> float:
    text = generate_latest(exporter.registry_for(store, clock=lambda: now)).decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))


# -- item 2: a node that has not written yet ---------------------------------------------------
def test_a_node_whose_glob_matches_nothing_yet_is_not_backfill_and_not_stalled(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "e").mkdir()  # the launch script has not written here yet
    shard = tmp_path / "w" / "a.jsonl"
    write_shard(shard, truth_rows(100, 1))  # history: written before monitoring began
    store = Store(tmp_path / "s.sqlite3")
    clock = Clock(time.time() - 40 * INTERVAL_S)
    collector = Collector(
        run_config(local_node("w", str(tmp_path / "w" / "*.jsonl")), local_node("e", str(tmp_path / "e" / "*.jsonl"))),
        store,
        clock=clock,
    )
    for i in range(30):  # five minutes of polls; the writer adds 20 lines per interval
        if i:
            write_shard(shard, truth_rows(20, 100 + i), mode="a")
        collector.poll_once()
        clock.now += INTERVAL_S
    now = clock.now
    polls = {n: [p["backfill"] for p in store.polls(node=n)] for n in ("w", "e")}
    assert polls["w"] == [1] + [0] * 29  # only the first poll counted history (100 lines)
    assert polls["e"] == [0] * 30  # nothing counted, nothing pending: never catch-up
    # The run-level series keep every bucket after the first scan as live (the chart advances).
    buckets = store.polls_by_bucket(60, since_unix=now - 3600)
    assert [b["backfill"] for b in buckets[1:]] == [0] * (len(buckets) - 1)
    assert sum(b["completions"] for b in buckets[1:]) >= 29 * 20 - 120
    assert [b["backfill"] for b in rollup.poll_history(store, 60)[1:]] == [0] * (len(buckets) - 1)
    # The node that never wrote is waiting for its first completion, not stalled, everywhere.
    rates = activity.read_rates(store, now)
    found = activity.stall_state(rates.per_node, now, 60.0)
    assert "e" not in found.nodes and "e" in found.waiting and found.run_since_unix is None
    alerts = health.evaluate(store, now)
    assert not [a for a in alerts if a.name in ("node_stalled", "run_stalled")], [a.summary for a in alerts]
    assert metric_sum(store, "runhealth_stalled", now) == 0.0
    table = tables.node_table(store.nodes(), 30.0, now=now, per_node=rates.per_node).set_index("node")
    assert table.loc["e", "last new"] == "waiting for first completion"  # the Nodes page's words
    assert table.loc["w", "last new"].endswith(" s ago")
    collector.stop()


def test_one_nodes_catch_up_does_not_hide_another_nodes_live_polls(tmp_path):
    """Store level: in a bucket where node a catches up and node b writes, the bucket is b's live
    output (a's history is not throughput, and b's new completions are not "first scan")."""
    store = Store(tmp_path / "s.sqlite3")
    t0 = 1_700_000_040.0

    def reply(path: str, offset_from: int, lines: int, pending: int) -> dict:
        counts = [[100, "stop", 0, lines - 1], [4096, "length", 0, 1]]
        entry = {"inode": 1, "offset_from": offset_from, "offset": offset_from + lines * 100, "size": 10**9}
        entry |= {"counts": counts, "tokens": 100 * (lines - 1) + 4096}
        return {"ok": True, "time_unix": None, "shards": {"files": {path: entry}, "pending_bytes": pending}}

    for i in range(6):
        write_reply(store, "a", reply("/a.jsonl", i * 100_000, 1000, 10**8), t0 + 10 * i, 5.0)  # a backlog
        write_reply(store, "b", reply("/b.jsonl", i * 1000, 10, 0), t0 + 10 * i + 1, 5.0)  # live
    (bucket,) = store.polls_by_bucket(60)
    assert bucket["backfill"] == 0
    assert (bucket["completions"], bucket["length_stops"]) == (50, 5)  # b's five live polls after its first
    assert bucket["tokens"] == 5 * (9 * 100 + 4096)
    (split,) = [s for s in store.length_stops_by_bucket(60, 4096) if s["backfill"] == 0]
    assert split["at_ceiling"] == 5  # the truncated share of the live bucket is b's alone
    assert activity.minute_rates([bucket, {**bucket, "bucket_unix": t0 + 60}]) == [bucket["tokens"] / 60]
    chart = loaders.load_truncation_over_time(store, 10.0, 4096)  # what the Overview draws
    assert not chart["backfill"].any()  # no bucket grey as "first scan"
    assert (chart["completions"].sum(), chart["at_ceiling"].sum(), chart["unsplit"].sum()) == (50, 5, 0)


# -- item 5: renaming a node -------------------------------------------------------------------
def config_file(tmp_path: Path, store_path: Path, name: str, shards: str) -> Path:
    path = tmp_path / "runhealth.toml"
    path.write_text(
        f'[run]\nname = "catchup"\ninterval_s = {INTERVAL_S}\nstore_path = "{store_path}"\n'
        f'[[nodes]]\nname = "{name}"\nhost = "local"\nshards = ["{shards}"]\n'
        f'gpu = "off"\npython = "{sys.executable}"\n',
        encoding="utf-8",
    )
    return path


def test_renaming_a_node_counts_its_files_once_on_every_consumer(tmp_path, monkeypatch):
    from runhealth.settings.config import load_config

    (tmp_path / "data").mkdir()
    write_shard(tmp_path / "data" / "a.jsonl", truth_rows(3000, 5))
    glob = str(tmp_path / "data" / "*.jsonl")
    store_path = tmp_path / "s.sqlite3"
    store = Store(store_path)
    now = time.time()
    clock = Clock(now - 34 * 60)
    first = Collector(load_config(config_file(tmp_path, store_path, "n1", glob)), store, clock=clock)
    first.poll_once()
    first.stop()
    clock.now = now  # 34 minutes later the config names the same host and files "n2"
    path = config_file(tmp_path, store_path, "n2", glob)
    second = Collector(load_config(path), store, clock=clock)  # as a reload rebuilds it
    second.poll_once()
    second.stop()
    assert sum(r["count"] for r in store.length_counts(by="run")) == 3000
    assert health.run_summary(store, None).completions == 3000
    alerts = health.evaluate(store, now)
    assert not [a for a in alerts if a.node == "n1"], [a.summary for a in alerts]
    assert metric_sum(store, "runhealth_completions_total", now) == 3000
    store.close()
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(path))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = AppTest.from_function(_app_script, args=("overview",), default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    tiles = " ".join(m.value for m in at.markdown if "rh-tile" in m.value)
    assert '<div class="rh-label">Completions</div><div class="rh-value">3,000</div>' in tiles, tiles
    assert '<div class="rh-label">Nodes up</div><div class="rh-value">1 / 1</div>' in tiles, tiles
    shown = " ".join(e.value for e in [*at.error, *at.warning])
    assert "n1" not in shown, shown
    nodes = AppTest.from_function(_app_script, args=("nodes",), default_timeout=30).run()
    assert not nodes.exception, [e.value for e in nodes.exception]
    assert "n1: no longer in the config; its 3,000 completions are read again by n2" in " ".join(
        c.value for c in nodes.caption
    )
    assert list(nodes.dataframe[0].value["node"]) == ["n2"]


def test_a_removed_node_on_another_host_keeps_its_counts(tmp_path):
    """A node taken out of the config whose files no current node reads: its completions stay in
    the run's total (history; the total never goes backwards) and it raises no alert."""
    for name, n in (("old", 400), ("new", 600)):
        (tmp_path / name).mkdir()
        write_shard(tmp_path / name / "a.jsonl", truth_rows(n, len(name)))
    store = Store(tmp_path / "s.sqlite3")
    nodes = {n: local_node(n, str(tmp_path / n / "*.jsonl")) for n in ("old", "new")}
    # Each collector is stopped (its store lock released) before the next takes the store, as the
    # service does on a config edit: an unstopped one still holds the lock through the store's
    # writer check (collect/storelock.py).
    for config in (run_config(nodes["old"], nodes["new"]), run_config(nodes["new"])):
        with Collector(config, store) as collector:
            collector.poll_once()
    now = time.time()
    assert health.run_summary(store, None).completions == 1000
    assert metric_sum(store, "runhealth_completions_total", now) == 1000
    assert not [a for a in health.evaluate(store, now) if a.node == "old"]


def _app_script(start: str) -> None:
    import app

    app.main(start)
