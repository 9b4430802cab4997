"""Lengths per hour over the whole run: exact share at the ceiling, percentiles within one bin."""

from __future__ import annotations

import math
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from shardgen import truth_rows, write_shard
from store_fixtures import write_reply

from runhealth.analysis import lengthtime, stats
from runhealth.collect.collector import Collector
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store

HOUR = 3600


def _reply(counts):
    return {"shards": {"files": {"/a.jsonl": {"counts": counts}}}, "gpus": {}, "time_unix": 0}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40_000), st.sampled_from(["stop", "length"])), min_size=1, max_size=300))
def test_binned_percentiles_are_within_one_bin_and_the_ceiling_share_is_exact(tmp_path_factory, rows):
    store = Store(tmp_path_factory.mktemp("lt") / "s.sqlite3")
    counts: dict[tuple, int] = {}
    for t, f in rows:
        counts[(t, f)] = counts.get((t, f), 0) + 1
    write_reply(store, "n", _reply([[t, f, 0, n] for (t, f), n in counts.items()]), 10 * HOUR + 5, 1.0)
    ceiling = max(t for t, _ in rows)
    [hour] = lengthtime.hourly(store, ceiling)
    exact = stats.LengthHist.from_rows([(t, f, 0, n) for (t, f), n in counts.items()])
    assert hour["bucket_unix"] == 10 * HOUR and hour["completions"] == len(rows)
    assert hour["at_ceiling"] == sum(1 for t, f in rows if f == "length" and t >= ceiling)
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        v = stats.percentile_nearest_rank(exact, q)
        assert v <= hour[name] <= math.ceil(v * 2 ** (1 / 16)) + 1, (name, v, hour[name])


def _poll(store, ts, counts, offset_from, offset, pending=0):
    entry = {
        "inode": 1,
        "size": offset,
        "offset_from": offset_from,
        "offset": offset,
        "reset": False,
        "lines": sum(c[3] for c in counts),
        "malformed": 0,
        "tokens": 0,
        "counts": counts,
        "error": None,
    }
    reply = {"shards": {"files": {"/a.jsonl": entry}, "pending_bytes": pending}, "gpus": {}, "time_unix": ts}
    write_reply(store, "n", reply, ts, 1.0)  # with its hourly length rows, in the same transaction


def test_hours_are_kept_apart_and_backfill_is_flagged(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    _poll(store, HOUR + 1, [[100, "stop", 0, 10], [4096, "length", 0, 10]], 0, 100)  # first scan: backfill
    _poll(store, 2 * HOUR + 1, [], 100, 100)
    _poll(store, 2 * HOUR + 2, [[100, "stop", 0, 9], [4096, "length", 0, 1]], 100, 200)
    hours = lengthtime.hourly(store, 4096)
    assert [(h["bucket_unix"], h["completions"], h["at_ceiling"], h["backfill"]) for h in hours] == [
        (HOUR, 20, 10, 1),
        (2 * HOUR, 10, 1, 0),
    ]
    assert hours[1]["at_ceiling_fraction"] == 0.1


def test_the_collector_fills_it_from_real_polls(tmp_path):
    rows = truth_rows(500, 3)
    write_shard(tmp_path / "a.jsonl", rows)
    config = RunConfig(
        name="lt",
        nodes=[
            NodeConfig(name="n", host="local", shards=[str(tmp_path / "*.jsonl")], gpu="off", python=sys.executable)
        ],
    )
    store = Store(tmp_path / "s.sqlite3")
    with Collector(config, store) as collector:
        collector.poll_once()
    [hour] = lengthtime.hourly(store, 4096)
    assert hour["completions"] == 500 and hour["backfill"] == 1  # the first scan: written before
    assert hour["at_ceiling"] == sum(1 for t, f in rows if f == "length" and t >= 4096)


def test_output_lengths_page_draws_lengths_per_hour(tmp_path, monkeypatch):
    import streamlit

    from tests.store_fixtures import make_store
    from tests.test_pages import assert_clean, run_page, texts

    streamlit.cache_data.clear()
    store, config = make_store(tmp_path, "ceiling_18")
    now = store.last_collection_unix()
    for k in range(3):  # a shard of its own, 100 completions in each of three hours
        entry = {
            "offset_from": 100 * k,
            "offset": 100 * (k + 1),
            "counts": [[700, "stop", 0, 82], [4096, "length", 0, 18]],
        }
        reply = {"shards": {"files": {"/hourly.jsonl": entry}}, "gpus": {}, "time_unix": 0}
        write_reply(store, "node-1", reply, now - (2 - k) * HOUR, 1.0)
    store.close()
    at = run_page("lengths", config, monkeypatch)
    assert_clean(at)
    assert "Per hour of the whole run" in texts(at)
    charts = [c for c in at.get("plotly_chart") if "Lengths per hour" in c.proto.spec]
    assert len(charts) == 1
    streamlit.cache_data.clear()
