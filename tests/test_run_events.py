"""Run events (#33 item 7): the collector writes them, every time chart draws them.

A real collector over real local agents registers a run, restarts with a changed ceiling and an
added node, and polls a shard that a relaunch truncated and rewrote: each leaves its row in
`run_events` (migration 10), worded by the screens. The figures carry the markers as shapes and
annotations whose hover is the event's sentence, on every time chart: the pure builders, then
the pages as a browser gets them (AppTest's plotly specs).
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import pandas as pd
import pytest
import store_fixtures
from shardgen import truth_rows, write_shard
from store_fixtures import write_reply
from test_pages import _clear_streamlit_caches, assert_clean, run_page  # noqa: F401 (autouse fixture)

from components import figures, markers
from runhealth.collect import changes
from runhealth.collect.collector import Collector
from runhealth.screens import events as run_events
from runhealth.screens.events import Event
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store, runevents

HOUR = 3600


def local_node(name: str, glob: str) -> NodeConfig:
    return NodeConfig(name=name, host="local", shards=[glob], python=sys.executable, gpu="off", command_timeout_s=20.0)


# -- what a claim finds changed (pure) ---------------------------------------------------------------
def test_a_claim_words_what_changed_against_the_recorded_settings():
    old = {"max_output_tokens": 4096, "target_completions": 1000, "interval_s": 10.0, "nodes": ["a", "b", "c"]}
    assert changes.on_claim(None, old) == [
        (
            "run_registered",
            {"nodes": ["a", "b", "c"], "max_output_tokens": 4096, "target_completions": 1000, "interval_s": 10.0},
        )
    ]
    assert changes.on_claim(old, dict(old)) == [("collector_started", {"config_changed": False})]
    new = {**old, "max_output_tokens": 8192, "nodes": ["a", "b", "d"]}
    assert changes.on_claim(old, new) == [
        ("config_changed", {"field": "max_output_tokens", "old": 4096, "new": 8192}),
        ("config_changed", {"field": "nodes", "added": ["d"], "removed": ["c"], "nodes": 3}),
        ("collector_started", {"config_changed": True}),
    ]


# -- the collector writes them ---------------------------------------------------------------------------
@pytest.fixture
def shards(tmp_path):
    for i, (n, seed) in enumerate([(300, 1), (200, 2)], start=1):
        (tmp_path / f"n{i}").mkdir()
        write_shard(tmp_path / f"n{i}" / "a.jsonl", truth_rows(n, seed))
    return tmp_path


@pytest.mark.parametrize("transport", ["local", "sshd"])
def test_a_restart_with_a_changed_config_and_a_relaunch_leave_their_rows(shards, transport, request):
    """The run registered, restarted with ceiling 8,192 and node n2 added, then n1's shard
    truncated and rewritten by a relaunch: four kinds of rows, in order, worded; n1 polled
    through a local agent, and through a real sshd."""
    store = Store(shards / "store.sqlite3")
    n1 = local_node("n1", str(shards / "n1" / "*.jsonl"))
    if transport == "sshd":
        n1 = request.getfixturevalue("sshd_node")("127.0.0.34").node_config(name="n1", gpu="off", shards=n1.shards)
    first = RunConfig(name="t", nodes=[n1], interval_s=0.5)
    with Collector(first, store) as collector:
        collector.claim()
        collector.poll_once()
    second = RunConfig(
        name="t",
        nodes=[n1, local_node("n2", str(shards / "n2" / "*.jsonl"))],
        interval_s=0.5,
        max_output_tokens=8192,
    )
    with Collector(second, store) as collector:
        collector.claim()
        collector.poll_once()
        write_shard(shards / "n1" / "a.jsonl", truth_rows(40, 9))  # the relaunch starts the file again
        collector.poll_once()
        collector.poll_once()  # counts the new file: no second event
    rows = runevents.read(store)
    assert [(r["kind"], r["node"]) for r in rows] == [
        ("run_registered", None),
        ("config_changed", None),
        ("config_changed", None),
        ("collector_started", None),
        ("shards_reset", "n1"),
    ]
    assert rows[-1]["detail"]["shards"] == 1 and rows[-1]["detail"]["paths"] == [str(shards / "n1" / "a.jsonl")]
    words = [e.text for e in run_events.chart_events(store)]
    assert words == [
        "Collection began: run registered with 1 node",
        "Config changed: ceiling (max_output_tokens) detected → 8,192 tokens",
        "Config changed: nodes added n2 (now 2 nodes)",
        "Collector restarted with the changed config",
        f"n1: 1 shard started over, counted afresh (a relaunch?): {shards / 'n1' / 'a.jsonl'}",
    ]
    assert sum(r["completions"] for r in store.shards() if r["node"] == "n1") == 40  # counted afresh, exactly
    store.close()


def test_a_viewer_writes_no_events(shards):
    store = Store(shards / "store.sqlite3")
    config = RunConfig(name="t", nodes=[local_node("n1", str(shards / "n1" / "*.jsonl"))], interval_s=0.5)
    with Collector(config, store, register=False) as viewer:
        viewer.claim()
    assert runevents.read(store) == []


# -- every time chart draws them --------------------------------------------------------------------------
T0 = 1_700_000_000.0
EVENT = Event(T0 + 1800, "config_changed", "config", "Config changed: ceiling (max_output_tokens) 4,096 → 8,192 tokens")


def marks(fig) -> list[str]:
    """The hover sentences of the figure's event markers (their rule drawn too)."""
    layout = fig.to_plotly_json()["layout"]
    texts = [a["hovertext"] for a in layout.get("annotations", []) if a.get("hovertext")]
    rules = [
        s for s in layout.get("shapes", []) if s.get("line", {}).get("dash") == "dot" and s.get("yref") == "y domain"
    ]
    assert len(rules) == len(texts)
    return texts


def time_frames() -> dict[str, object]:
    """One small frame per time chart, spanning T0 .. T0 + 1 h."""
    ts = [T0 + k * 600 for k in range(7)]
    trunc = pd.DataFrame(
        {"bucket_unix": ts, "completions": 100, "at_ceiling": 18, "below_ceiling": 1, "unsplit": 0, "backfill": 0}
    )
    hourly = pd.DataFrame(
        {"bucket_unix": [T0, T0 + HOUR], "completions": 100, "at_ceiling": 18, "backfill": 0}
        | {"at_ceiling_fraction": 0.18, "p50": 900, "p90": 4096, "p99": 4096}
    )
    gpu = pd.DataFrame({"ts_unix": ts * 2, "label": ["n1/0"] * 7 + ["n1/1"] * 7, "util_pct": 90.0})
    bands = pd.DataFrame({"node": "n1", "t_unix": ts, "median": 90.0, "min": 80.0, "max": 99.0, "gpus": 8})
    alerts = pd.DataFrame(
        {"label": ["run_stalled · run"], "severity": ["critical"], "started_unix": [T0], "ended_unix": [T0 + 600]}
        | {"hover": ["no new completions"]}
    )
    many = pd.concat([bands.assign(node=f"n{i}") for i in range(figures.BAND_MAX_NODES + 1)])
    return {
        "throughput": lambda ev: figures.make_throughput_figure(
            pd.DataFrame({"bucket_unix": ts, "tokens_per_s": 1e4}), ev
        ),
        "truncation over time": lambda ev: figures.make_truncation_over_time_figure(trunc, 0.02, 0.05, ev),
        "lengths per hour": lambda ev: figures.make_lengths_over_time_figure(hourly, 4096, ev),
        "GPU lines": lambda ev: figures.make_gpu_timeseries_figure(gpu, "util_pct", "Utilization", "%", None, ev),
        "GPU bands": lambda ev: figures.make_gpu_band_figure(bands, "Utilization", "%", events=ev),
        "GPU heatmap": lambda ev: figures.make_gpu_band_figure(many, "Utilization", "%", events=ev),
        "alert timeline": lambda ev: figures.make_alert_timeline_figure(alerts, T0 - 12 * HOUR, T0 + 12 * HOUR, ev),
    }


@pytest.mark.parametrize("chart", list(time_frames()))
def test_every_time_chart_carries_the_markers(chart):
    build = time_frames()[chart]
    assert marks(build((EVENT,))) == [EVENT.text]
    assert marks(build(())) == []  # no events: the chart as before
    outside = Event(T0 + 30 * HOUR, "collector_started", "restart", "Collector restarted")
    assert marks(build((outside,))) == []  # an event off the chart's span does not stretch its axis


def test_the_alert_timeline_marks_in_local_time_as_its_axis():
    fig = time_frames()["alert timeline"]((EVENT,))
    (note,) = [a for a in fig.to_plotly_json()["layout"]["annotations"] if a.get("hovertext")]
    assert note["x"] == datetime.datetime.fromtimestamp(EVENT.ts_unix).isoformat()
    assert time_frames()["throughput"]((EVENT,)).to_plotly_json()["layout"]["annotations"][-1]["x"] == (
        pd.Timestamp(EVENT.ts_unix, unit="s").isoformat()  # the other charts' axes: naive UTC
    )


def test_events_close_together_share_one_marker_and_frames_can_carry_them():
    restart = Event(EVENT.ts_unix + 5, "collector_started", "restart", "Collector restarted with the changed config")
    fig = time_frames()["throughput"]((EVENT, restart))
    assert marks(fig) == [EVENT.text + "<br>" + restart.text]
    assert fig.to_plotly_json()["layout"]["annotations"][-1]["text"] == "⚑ config · restart"
    framed = pd.DataFrame({"bucket_unix": [T0, T0 + HOUR], "tokens_per_s": 1.0})
    framed.attrs["events"] = (EVENT,)  # the Output lengths loaders hand them over this way
    assert marks(figures.make_throughput_figure(framed)) == [EVENT.text]
    assert markers.time_span(figures.make_throughput_figure(framed)) == (T0, T0 + HOUR)


def chart_marks(at, title: str) -> list[str]:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if title in c.proto.spec]
    assert specs, f"no chart {title!r}"
    found = [a.get("hovertext") for s in specs for a in s["layout"].get("annotations", []) if a.get("hovertext")]
    rules = [r for s in specs for r in s["layout"].get("shapes", []) if r.get("line", {}).get("dash") == "dot"]
    assert len([r for r in rules if r.get("yref") == "y domain"]) == len(found)  # each marker has its rule
    return found


def test_the_pages_draw_the_stored_events_on_their_time_charts(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    now = store.last_collection_unix()
    assert now is not None
    for k in range(2):  # two hours of lengths, so the per-hour chart is drawn
        entry = {
            "offset_from": 100 * k,
            "offset": 100 * (k + 1),
            "counts": [[700, "stop", 0, 82], [4096, "length", 0, 18]],
        }
        write_reply(
            store,
            "node-1",
            {"shards": {"files": {"/hourly.jsonl": entry}}, "gpus": {}, "time_unix": 0},
            now - (1 - k) * HOUR,
            1.0,
        )
    runevents.record(store, now - 120, [("config_changed", {"field": "max_output_tokens", "old": 4096, "new": 8192})])
    store.close()
    text = "Config changed: ceiling (max_output_tokens) 4,096 → 8,192 tokens"
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    assert chart_marks(at, "Throughput") == [text]
    at = run_page("gpus", config, monkeypatch)
    assert_clean(at)
    assert chart_marks(at, "Utilization") == [text] and chart_marks(at, "Power") == [text]
    at = run_page("lengths", config, monkeypatch)
    assert_clean(at)
    assert chart_marks(at, "Truncated over time") == [text] and chart_marks(at, "Lengths per hour") == [text]


def test_the_read_keeps_the_newest_few_hundred(tmp_path):
    store = Store(tmp_path / "x.sqlite3")
    runevents.record(store, T0, [("collector_started", {"config_changed": False})] * (runevents.MAX_READ + 5))
    assert len(runevents.read(store)) == runevents.MAX_READ and runevents.read(store, T0 + 1) == []
    started = time.perf_counter()
    run_events.chart_events(store)
    assert time.perf_counter() - started < 0.5


def test_housekeeping_bounds_the_events_and_keeps_every_marker_a_chart_draws(tmp_path):
    """Issue 40 item 9: run_events was never pruned (a run relaunched every few minutes for
    months grew it without end). The hourly housekeeping now keeps the newest MAX_READ events,
    all that any read can return: every chart, whole-run or windowed, draws what it drew."""
    store = Store(tmp_path / "x.sqlite3")
    kinds = ["collector_started", "config_changed", "shards_reset"]
    n = 3 * runevents.MAX_READ
    with store.transaction() as db:
        for i in range(n):  # out of time order too (a clock step): the read orders by time
            ts = T0 + (i * 7919) % n * 60.0
            runevents.insert(db, ts, kinds[i % 3], {"field": "interval_s", "old": i, "new": i + 1}, "n1")
    sinces = [None, T0, T0 + (n - 100) * 60.0, T0 + (n - 700) * 60.0]
    before = [run_events.chart_events(store, since) for since in sinces]
    config = RunConfig(name="r", nodes=[local_node("n1", str(tmp_path / "*.jsonl"))])
    Collector(config, store).housekeep()
    assert store.cursor("SELECT COUNT(*) FROM run_events").fetchone()[0] == runevents.MAX_READ
    assert [run_events.chart_events(store, since) for since in sinces] == before
    assert before[0][0].ts_unix == T0 + (n - runevents.MAX_READ) * 60.0  # the oldest drawn: still there


def test_the_alert_strip_fits_a_young_run_and_a_day_at_most():
    """#41: the 24 h alert strip was unreadable on a run minutes old (its bars a few pixels wide)."""
    from runhealth.screens.events import alert_window_s, alert_window_words
    from runhealth.settings.windows import ALERT_STRIP_MIN_S, ALERT_TIMELINE_S

    now = 1_800_000_000.0
    assert alert_window_s(now, now - 5 * 60) == ALERT_STRIP_MIN_S  # minutes old: half an hour
    assert alert_window_s(now, now - 3 * 3600) == pytest.approx(1.1 * 3 * 3600)
    assert alert_window_s(now, now - 3 * 86400) == ALERT_TIMELINE_S and alert_window_s(now, None) == ALERT_TIMELINE_S
    assert alert_window_words(ALERT_TIMELINE_S) == "24 h" and alert_window_words(ALERT_STRIP_MIN_S) == "30 min"
