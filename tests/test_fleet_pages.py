"""Pages at fleet size: the GPUs charts fold each node's GPUs into one heatmap row, the Nodes page
details only the nodes that need a look (and the ones picked)."""

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
    page = texts(at)
    assert "40 nodes: details below for the 1 not up" in page
    cards = [m.value for m in at.markdown if m.value.startswith("#### ")]
    assert len(cards) == 1 and "node-7" in cards[0], cards  # the one failing node's card, no others
    st.cache_data.clear()
    st.cache_resource.clear()


def _spec(chart):
    import json

    return json.loads(chart.proto.spec)
