"""Pages at fleet size: the GPUs charts fold each node's GPUs into one heatmap row, the Nodes page
lists every node's problems in one table and details one node, picked (default: the worst)."""

from __future__ import annotations

import time

import streamlit as st
from store_fixtures import build_run, write_config

from runhealth.store import Store
from tests.test_pages import assert_clean, run_page, texts


def test_gpus_and_nodes_pages_at_40_nodes(tmp_path, monkeypatch):
    st.cache_data.clear()
    st.cache_resource.clear()
    store = Store(tmp_path / "x.sqlite3")
    build_run(store, now=time.time(), trunc_frac=0.01, nodes=40, polls=3, per_shard=5, down={"node-7": 600})
    store.close()
    config = write_config(tmp_path, tmp_path / "x.sqlite3", nodes=40)
    at = run_page("gpus", config, monkeypatch)
    assert_clean(at)
    specs = [_spec(chart) for chart in at.get("plotly_chart")]
    history = [s for s in specs if "median of each node's GPUs" in s["layout"]["title"]["text"]]
    assert len(history) == 5, "one node x time heatmap per GPU metric"
    # a row per node that reported GPUs in the window (node-7 has been down for 10 min)
    assert all(s["data"][0]["type"] == "heatmap" and len(s["data"][0]["y"]) == 39 for s in history)
    names = {d.get("name") for s in specs for d in s.get("data", [])}
    assert "node-1/0" not in names  # never one trace per GPU at this size
    st.cache_data.clear()
    at = run_page("nodes", config, monkeypatch)
    assert_clean(at)
    assert "40 nodes: 1 not up, 0 up with a problem" in texts(at)
    problems = next(f.value for f in at.dataframe if "problem" in f.value.columns)
    assert list(problems["node"]) == ["node-7"] and problems["problem"].iloc[0] == "not up", problems
    assert problems["detail"].iloc[0] == "never reached: agent did not answer within 30 s"
    # One card (was: one per node not up, up to 32): the worst node's, picked by default.
    assert _cards(at) == ["node-7"]
    picker = at.selectbox(key="nodes_node_select")
    assert picker.options[:4] == ["node-7 (DOWN)", "node-1 (UP)", "node-2 (UP)", "node-3 (UP)"]  # worst first
    picker.select("node-12").run()
    assert_clean(at)
    assert _cards(at) == ["node-12"]
    st.cache_data.clear()
    st.cache_resource.clear()


def test_a_small_fleet_keeps_a_card_per_node(tmp_path, monkeypatch):
    st.cache_data.clear()
    store = Store(tmp_path / "x.sqlite3")
    build_run(store, now=time.time(), trunc_frac=0.01, nodes=8, polls=2, per_shard=5, down={"node-3": 600})
    store.close()
    at = run_page("nodes", write_config(tmp_path, tmp_path / "x.sqlite3", nodes=8), monkeypatch)
    assert_clean(at)
    assert _cards(at) == [f"node-{i}" for i in range(1, 9)]
    assert not at.selectbox and "Problems by node" not in texts(at)
    st.cache_data.clear()


def _cards(at) -> list[str]:
    """The node names of the detail cards' headings ("#### :red[DOWN] node-7")."""
    return [m.value.split()[-1] for m in at.markdown if m.value.startswith("#### ")]


def _spec(chart):
    import json

    return json.loads(chart.proto.spec)


def test_node_problems_lists_every_problem_worst_node_first():
    import pandas as pd

    from components.tables import node_problems

    now = 10_000.0
    nodes = [
        {"name": "ok", "last_ok_unix": now - 5},
        {"name": "globs", "last_ok_unix": now - 5, "unmatched_globs": ["/x/*.jsonl"], "gpu_error": "NVML gone"},
        {"name": "stale", "last_ok_unix": now - 60, "last_error": "timeout", "failing_since_unix": now - 50},
        {"name": "down-late", "last_ok_unix": now - 900},
        {"name": "down-early", "last_ok_unix": now - 3000},
        {"name": "never", "last_error": "connection refused", "last_error_unix": now - 1},
        {"name": "flaky", "last_ok_unix": now - 5, "last_error": "reset", "last_error_unix": now - 2},
        {"name": "healed", "last_ok_unix": now - 5, "last_error": "old", "last_error_unix": now - 100},
        {"name": "metrics", "last_ok_unix": now - 5, "metrics_errors": {"http://a/metrics": "refused"}},
    ]
    shards = pd.DataFrame(
        {"node": ["ok", "metrics", "metrics"], "path": ["/a", "/b", "/c"], "error": [None, "EACCES", None]}
    )
    table, order = node_problems(nodes, shards, 30.0, now)
    assert order == [
        *["never", "down-early", "down-late", "stale"],  # not up: the longest silent first
        *["flaky", "globs", "metrics"],  # up with a problem (polled at the same time: by name)
        *["healed", "ok"],  # the rest
    ]
    rows = list(zip(table["node"], table["status"], table["problem"], table["detail"], strict=True))
    assert rows[0] == ("never", "DOWN", "not up", "never reached: connection refused")
    assert rows[3] == ("stale", "STALE", "not up", "stale for 60 s: timeout")
    assert rows[4][:3] == ("flaky", "UP", "last poll failed") and rows[4][3].endswith(": reset")
    assert rows[5:] == [
        ("globs", "UP", "no shard matched", "/x/*.jsonl"),
        ("globs", "UP", "GPU telemetry", "NVML gone"),
        ("metrics", "UP", "server metrics", "http://a/metrics: refused"),
        ("metrics", "UP", "cannot read shard", "/b: EACCES"),
    ]
    assert "healed" not in set(table["node"]) and "ok" not in set(table["node"])  # a resolved error is history
    empty, names = node_problems(nodes[:1], shards.iloc[0:0], 30.0, now)
    assert empty.empty and list(empty.columns) == ["node", "status", "last seen", "problem", "detail"]
    assert names == ["ok"]
