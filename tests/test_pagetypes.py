"""The page payloads' types (runhealth/payloads/pagetypes.py, #31 item 3).

Every payload the collector computes from a real store is a frozen dataclass that round-trips
through typedjson; `pagedata.encode` writes exactly `typedjson.dump`'s JSON (the GPU bands' fast
path included); a payload written as the untyped dicts of main 5082861 (the previous version) reads
back typed and equal; a row that does not fit its type is logged and read as missing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import zlib
from typing import Any

import pytest
import store_fixtures
import streamlit as st

from components import loaders
from runhealth import typedjson
from runhealth.analysis import lengthtime, loops, stats, whatif
from runhealth.payloads import pagedata, pagetypes, truncbuckets
from runhealth.payloads.pagetypes import GpuWindow, GroupTable, RunLengths, Table, WhatIfDefault
from runhealth.screens import runfigures
from runhealth.store import Store

CEILING = store_fixtures.CEILING
INTERVAL_S = 10.0


@pytest.fixture(scope="module")
def computed(tmp_path_factory) -> tuple[Store, float, dict[str, Any]]:
    """compute_all over ceiling_18 (4 nodes x 8 GPUs: bands, and the what-if) and, for the
    per-GPU series, over a one-node run of 4 GPUs."""
    store, _config = store_fixtures.make_store(tmp_path_factory.mktemp("c18"), "ceiling_18")
    now = time.time()
    out = pagedata.compute_all(store, CEILING, INTERVAL_S, now=now)
    small = Store(tmp_path_factory.mktemp("small") / "x.sqlite3")
    store_fixtures.build_run(small, now=now, trunc_frac=0.01, nodes=1, gpus=4, polls=5)
    out["gpu:small"] = pagedata.gpu_window(small, 3600, now)
    out[runfigures.FINISHED_LIFE] = finished_life(store)
    return store, now, out


def finished_life(store: Store) -> runfigures.FinishedLife:
    figures = runfigures.life_figures(store)
    version = runfigures.polls_version(store)
    return runfigures.FinishedLife(version, figures.life, figures.started_unix, figures.completed_unix)


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(typedjson.dump(value)))


def test_every_payload_is_typed_and_round_trips(computed):
    _store, _now, out = computed
    kinds = {name: type(p) for name, p in out.items()}
    assert kinds["run_lengths"] is RunLengths and kinds["whatif"] is WhatIfDefault
    assert kinds["groups:node"] is kinds["groups:shard"] is GroupTable
    assert kinds["lengths_over_time"] is pagetypes.LengthsOverTime
    assert kinds["truncation_over_time"] is pagetypes.TruncationOverTime
    assert all(kinds[f"gpu:{w}"] is GpuWindow for w in pagedata.GPU_WINDOWS_S)
    assert out["gpu:1 h"].bands is not None and out["gpu:small"].series is not None  # both GPU shapes
    for name, payload in out.items():
        assert dataclasses.is_dataclass(payload) and type(payload).__dataclass_params__.frozen, name
        assert typedjson.load(type(payload), as_json(payload), name) == payload, name
    # Not vacuous: the payloads hold the run.
    assert out["run_lengths"].rows.total == 12_000 and len(out["groups:node"].table) == 4
    assert out["truncation_over_time"].polls and out["lengths_over_time"].rows


def test_encode_writes_what_typedjson_dump_gives(computed):
    """The GPU bands go in as pre-serialised text, the rest through json's default hook: the
    stored JSON is typedjson.dump's all the same."""
    _store, _now, out = computed
    for name, payload in out.items():
        assert json.loads(zlib.decompress(pagedata.encode(payload))) == as_json(payload), name


def legacy(store: Store, now: float, out: dict[str, Any]) -> dict[str, Any]:
    """The payloads as main 5082861's compute_all and finished_life wrote them: untyped dicts."""
    hist = stats.LengthHist.from_rows(
        (r["tokens"], r["finish_reason"], r["estimated"], r["count"]) for r in store.length_counts(by="run")
    )
    malformed = sum(n["malformed"] for n in store.counted_nodes())
    old: dict[str, Any] = {
        "run_lengths": {
            "ceiling": CEILING,
            "rows": [list(r) for r in hist.rows()],
            "malformed": malformed,
            "bins": [list(b) for b in stats.histogram(hist)],
            "cdf": [list(p) for p in stats.cdf_points(hist)],
        }
    }
    ceiling = stats.summarize(hist, ceiling=CEILING, unparseable=malformed).ceiling_tokens
    columns = ["group", "completions", "at_ceiling", "fraction", "lo", "hi", "ceiling", "drift"]
    for by in ("node", "shard"):
        rows = pagedata.group_lengths(store, by, ceiling)
        table = {"columns": columns, "data": {c: [r.get(c) for r in rows] for c in columns}}
        old[f"groups:{by}"] = {"ceiling": ceiling, "table": table}
    old["lengths_over_time"] = {"ceiling": ceiling, "rows": lengthtime.hourly(store, ceiling)}
    trunc = out["truncation_over_time"]
    polls, split = truncbuckets.Truncation(store).buckets(trunc.bucket_s, ceiling)
    old["truncation_over_time"] = {
        "interval_s": INTERVAL_S,
        "ceiling": ceiling,
        "bucket_s": trunc.bucket_s,
        "polls": polls,
        "split": split,
    }
    sample = loops.loop_sample(store.latest_sample_batch())
    result = whatif.for_run(hist, ceiling, 2 * ceiling, sample, whatif.BOOTSTRAP)
    old["whatif"] = {
        "ceiling": ceiling,
        "limit": 2 * ceiling,
        "hist_key": stats.hist_digest(hist),
        "loop_sample": list(sample),
        "result": result.to_json(),
    }
    for name in ("gpu:1 h", "gpu:small"):  # the window dicts' keys, their tables as they were stored
        w = out[name]
        bands = {v: {"columns": t.columns, "data": dict(t.data)} for v, t in w.bands.items()} if w.bands else None
        series = {"columns": w.series.columns, "data": dict(w.series.data)} if w.series else None
        old[name] = {"since": w.since, "labels": list(w.labels), "series": series, "bands": bands, "limits": w.limits}
    figures = runfigures.life_figures(store)
    old[runfigures.FINISHED_LIFE] = {"version": list(runfigures.polls_version(store)), **dataclasses.asdict(figures)}
    return old


def test_a_store_written_by_the_previous_version_reads_back_typed(computed):
    store, now, out = computed
    old = legacy(store, now, out)
    ts = time.time()
    with store.transaction() as db:  # main's encode: compact JSON of the dicts, zlib level 1
        blobs = [(n, ts, zlib.compress(json.dumps(p, separators=(",", ":")).encode(), 1)) for n, p in old.items()]
        db.executemany("INSERT OR REPLACE INTO page_data (name, ts_unix, payload) VALUES (?, ?, ?)", blobs)
    for name, payload in old.items():
        got = pagedata.get(store, name, type(out[name]))
        assert got is not None and got[0] == ts, name
        assert got[1] == out[name], name
        assert json.loads(zlib.decompress(pagedata.encode(out[name]))) == json.loads(json.dumps(payload)), (
            name
        )  # same keys
    assert runfigures.finished_life(store) == runfigures.life_figures(store)  # read back, not recomputed
    st.cache_data.clear()
    st.cache_resource.clear()
    assert loaders.load_run_lengths(store, CEILING).as_of == ts


def test_a_row_that_does_not_fit_its_type_is_logged_and_missing(computed, caplog):
    store, _now, out = computed
    pagedata.put(store, {"groups:node": {"ceiling": "4096", "table": out["groups:node"].table}}, time.time())  # a str
    pagedata.put(store, {"run_lengths": {"ceiling": CEILING, "rows": [[1, "stop", 0, 5]]}}, time.time())  # no malformed
    whatif_json = typedjson.dump(out["whatif"])
    pagedata.put(store, {"whatif": whatif_json | {"result": {"limit": 1}}}, time.time())  # no WhatIf
    with caplog.at_level(logging.WARNING):
        assert pagedata.get(store, "groups:node", GroupTable) is None
        assert pagedata.get(store, "run_lengths", RunLengths) is None
        assert pagedata.get(store, "whatif", WhatIfDefault) is None
    assert "groups:node.ceiling: int is needed, not str" in caplog.text
    assert "needs field 'malformed'" in caplog.text and "not a WhatIf" in caplog.text
    assert pagedata.get(store, "groups:node") is not None  # the raw JSON is still there
    st.cache_data.clear()
    st.cache_resource.clear()
    assert loaders.load_group_lengths(store, "node", CEILING).attrs["as_of"] is None  # computed on demand
    assert loaders.load_run_lengths(store, CEILING).as_of is None


def test_table_checks_its_shape():
    table = Table(["a", "b"], {"a": [1, 2], "b": [3, 4]})
    assert Table.from_json(json.loads(json.dumps(table.to_json()))) == table and len(table) == 2
    for broken in (
        {"columns": ["a"], "data": {"a": [1], "b": [2]}},  # a column not named
        {"columns": ["a", "b"], "data": {"a": [1], "b": [2, 3]}},  # lengths differ
        {"columns": ["a"], "data": {"a": 1}},  # not a list
    ):
        with pytest.raises(typedjson.TypedJsonError):
            typedjson.load(Table, broken)
