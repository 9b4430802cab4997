"""The alert history (#32 item 5): a real collector (local agents, no webhooks configured) keeps
every alert's episode in the store, and the Overview, the Nodes page and the CSV show them.

The collector's wall clock and the history's interval clock are moved by hand, one poll
interval per step, an hour in the past (pages read them with the real clock: nothing lies
ahead of it). n2 goes down for real: its agent is killed and its python refuses to start
while a marker file exists.
"""

from __future__ import annotations

import datetime
import io
import json
import re
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from shardgen import truth_rows, write_shard
from streamlit.testing.v1 import AppTest
from test_pages import _clear_streamlit_caches  # noqa: F401 (autouse fixture)

from runhealth.alerting import alerthistory
from runhealth.collect.collector import Collector
from runhealth.rules import health
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store
from runhealth.store.migrations import MIGRATIONS

INTERVAL_S = 10.0
START = time.time() - 3600  # the run's first poll, an hour before the scenario is built (set again there)


class Clock:
    def __init__(self, start: float):
        self.now = start

    def __call__(self) -> float:
        return self.now


def flaky_python(tmp: Path) -> tuple[Path, Path]:
    """A python for n2 that refuses to start while `down` exists (the node is unreachable)."""
    down = tmp / "down"
    script = tmp / "python-n2"
    script.write_text(
        f'#!/bin/sh\n[ -e "{down}" ] && {{ echo "node unreachable" >&2; exit 1; }}\nexec "{sys.executable}" "$@"\n'
    )
    script.chmod(0o755)
    return script, down


def stops(n: int, seed: int) -> list[tuple[int, str]]:
    return [(t, "stop") for t, _ in truth_rows(n, seed, trunc_share=0.0)]


@pytest.fixture
def scenario(tmp_path):
    """Steps every 10 s from START, as the collector would poll and evaluate:
    t=20: 8 length stops in 208 (3.8 %: warning); t=60: 48 in 248 (19 %: critical);
    t=50: n2 goes down (its last poll t=40: stale at t=80, down at t=200); t=250: the collector
    restarts (a new process on the store); t=300: n2 is back; t=320: 2,600 more stops bring
    truncation under 2 %; last step t=400."""
    global START  # an hour before now, not before the module's import: under xdist a test may run
    START = time.time() - 3600  # minutes after collection, and "(5x min ago)" must still hold
    for name in ("n1", "n2"):
        (tmp_path / name).mkdir()
    write_shard(tmp_path / "n1" / "a.jsonl", stops(100, 1))
    write_shard(tmp_path / "n2" / "a.jsonl", stops(100, 2))
    python2, down = flaky_python(tmp_path)
    nodes = [
        NodeConfig(
            name=n, host="local", shards=[str(tmp_path / n / "*.jsonl")], python=p, gpu="off", command_timeout_s=20.0
        )
        for n, p in (("n1", sys.executable), ("n2", str(python2)))
    ]
    config = RunConfig(name="hist", nodes=nodes, interval_s=INTERVAL_S, target_completions=1, max_output_tokens=4096)
    store = Store(tmp_path / "store.sqlite3")
    clock = Clock(START)

    def collector() -> Collector:
        c = Collector(config, store, clock=clock)
        c.alert_history.monotonic = clock  # the interval clock moves with the steps
        return c

    c = collector()
    shard1 = tmp_path / "n1" / "a.jsonl"
    for step in range(41):
        t = step * INTERVAL_S
        clock.now = START + t
        if t == 20:
            write_shard(shard1, [(4096, "length")] * 8, mode="a")
        if t == 60:
            write_shard(shard1, [(4096, "length")] * 40, mode="a")
        if t == 50:
            down.touch()
            c.pollers["n2"].transport.close()  # the agent's connection is gone
        if t == 250:
            c.stop()
            c = collector()
        if t == 300:
            down.unlink()
        if t == 320:
            write_shard(shard1, stops(2600, 3), mode="a")
        for poller in c.pollers.values():
            poller.transport.retry_now()  # no reconnect backoff: each step is a poll interval
        c.poll_once()
        c.alert_history.check()
    c.stop()
    return tmp_path, config, store


def driven(rows: list) -> list:
    """The episodes the scenario drives: host_load/memory/swap read this test machine's /proc."""
    return [r for r in rows if not r["name"].startswith("host_")]


def test_the_history_holds_exactly_the_episodes_with_their_times(scenario):
    _tmp, _config, store = scenario
    got = sorted(
        (r["name"], r["node"], r["severity"], r["started_unix"] - START, r["resolved_unix"] - START)
        for r in driven(store.alert_episodes())
        if r["resolved_unix"] is not None
    )
    assert got == [
        ("node_down", "n2", "critical", 200.0, 300.0),
        ("node_stale", "n2", "warning", 80.0, 200.0),
        ("truncation_high", None, "critical", 20.0, 320.0),  # a warning first, critical from t=60
    ]
    assert [r for r in driven(store.alert_episodes()) if r["resolved_unix"] is None] == []
    trunc = next(r for r in store.alert_episodes() if r["name"] == "truncation_high")
    assert trunc["value_start"] == pytest.approx(8 / 208) and trunc["value_end"] == pytest.approx(48 / 248)
    assert "3.8%" in trunc["summary_start"] and "19.4%" in trunc["summary_end"]
    down = next(r for r in store.alert_episodes() if r["name"] == "node_down")
    assert down["last_seen_unix"] - START == 290.0  # the restart at t=250 neither split nor restarted it


def test_a_restarted_history_opens_no_second_episode_and_closes_what_ended(tmp_path):
    """The open rows are the state: a new AlertHistory on the store goes on from them."""
    store = Store(tmp_path / "s.sqlite3")
    now = [1000.0]
    held = [health.Alert("node_down", "critical", "r", "n2 down", node="n2", value=1.0)]

    def history() -> alerthistory.AlertHistory:
        clock = lambda: now[0]  # noqa: E731
        return alerthistory.AlertHistory(store, 10, clock=clock, monotonic=clock, evaluate=lambda s, t: list(held))

    history().check()
    now[0] = 1100.0
    history().check()  # a restart while it holds
    assert [(r["started_unix"], r["resolved_unix"], r["last_seen_unix"]) for r in store.alert_episodes()] == [
        (1000.0, None, 1100.0)
    ]
    held.clear()
    now[0] = 1200.0  # it ended while no collector ran: closed at the first check (clear_s passed)
    history().check()
    assert [(r["started_unix"], r["resolved_unix"]) for r in store.alert_episodes()] == [(1000.0, 1200.0)]


def test_an_alert_absent_under_clear_s_is_one_episode(tmp_path):
    """The webhooks' hysteresis: a flap shorter than clear_s is not a second episode."""
    store = Store(tmp_path / "s.sqlite3")
    now = [0.0]
    alert = health.Alert("node_stale", "warning", "r", "n1 stale", node="n1")
    present = [True, False, True, False, False, False, False, False, False, False, False]
    clock = lambda: now[0]  # noqa: E731
    holds = [True]
    h = alerthistory.AlertHistory(
        store, 10, clear_s=60, clock=clock, monotonic=clock, evaluate=lambda s, t: [alert] if holds[0] else []
    )
    for i, p in enumerate(present):
        now[0], holds[0] = i * 10.0, p
        h.check()
    assert [(r["started_unix"], r["resolved_unix"]) for r in store.alert_episodes()] == [(0.0, 30.0)]


def test_an_alert_that_stopped_holding_is_not_shown_as_still_holding(tmp_path):
    """For CLEAR_S after an alert stops holding its episode stays open (a flap is one episode).
    The Overview's alerts no longer show it then; the history said "still holding (last seen 47 s
    ago)" and counted it among the day's holding alerts (seen on the demo after a restart: node_down
    twice, both nodes up). Now it reads cleared, at the first check that no longer saw it."""
    from components.alerthistory_view import episodes_table, holding, timeline_frame

    store = Store(tmp_path / "s.sqlite3")
    now = [1000.0]
    holds = [True]
    alert = health.Alert("node_down", "critical", "r", "n1 down for 19 min", node="n1")
    clock = lambda: now[0]  # noqa: E731
    h = alerthistory.AlertHistory(
        store, 10, clear_s=60, clock=clock, monotonic=clock, evaluate=lambda s, t: [alert] if holds[0] else []
    )
    for t, p in ((1000.0, True), (1010.0, True), (1020.0, False), (1030.0, False)):
        now[0], holds[0] = t, p
        h.check()
    (row,) = store.alert_episodes()
    assert row["resolved_unix"] is None and row["absent_unix"] == 1020.0 and not holding(row)
    table = episodes_table([row], 1047.0)
    assert "cleared" in table["ended"][0] and "still holding" not in table["ended"][0], table["ended"][0]
    assert table["duration"][0] == "20 s"  # to the first check that no longer saw it
    assert "still holding" not in timeline_frame([row], 1047.0)["hover"][0]
    now[0], holds[0] = 1040.0, True  # back within CLEAR_S: the same episode, holding again
    h.check()
    (row,) = store.alert_episodes()
    assert row["absent_unix"] is None and holding(row)
    assert episodes_table([row], 1047.0)["ended"][0].startswith("still holding")


def test_migration_7_opens_the_alerts_the_notifier_held(tmp_path):
    """A store whose notifier held an alert before the history existed: that alert's episode
    starts at its `since`, so the first evaluation after the upgrade does not start it again."""
    import json
    import sqlite3

    from runhealth.store.migrations import migrate

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, path, [m for m in MIGRATIONS if m.version <= 6])
    alert = {
        "name": "node_down",
        "severity": "critical",
        "run": "r",
        "summary": "n2 down",
        "node": "n2",
        "gpu": None,
        "value": 5.0,
    }
    db.execute(
        "INSERT INTO alert_state VALUES (?,?,?,?,?)",
        (json.dumps(["node_down", "n2", None]), json.dumps(alert), 500.0, 900.0, 900.0),
    )
    assert migrate(db, path, [m for m in MIGRATIONS if m.version <= 7]) == 7
    db.close()
    store = Store(path)
    (row,) = store.alert_episodes(open_only=True)
    assert (row["name"], row["node"], row["started_unix"], row["last_seen_unix"]) == ("node_down", "n2", 500.0, 900.0)


def test_prune_drops_resolved_episodes_after_30_days(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    row = {"name": "x", "severity": "warning", "node": None, "gpu": None, "summary": "s", "value": None}
    store.write_alert_episodes(0.0, started=[{**row, "key": '["old"]'}, {**row, "key": '["open"]'}])
    store.write_alert_episodes(10.0, resolved=['["old"]'])
    store.write_alert_episodes(29 * 86400.0, started=[{**row, "key": '["recent"]'}])
    store.write_alert_episodes(29 * 86400.0 + 5, resolved=['["recent"]'])
    store.prune(14 * 86400, now_unix=31 * 86400.0)
    kept = {r["started_unix"]: r["resolved_unix"] for r in store.alert_episodes()}
    assert kept == {0.0: None, 29 * 86400.0: 29 * 86400.0 + 5}  # the open one stays, the old one went


# -- the screens ----------------------------------------------------------------------------
def write_config(tmp: Path, config: RunConfig, store: Store) -> Path:
    lines = ["[run]", f'name = "{config.name}"', "target_completions = 1", f"interval_s = {INTERVAL_S}"]
    lines += [f'store_path = "{store.path}"', "max_output_tokens = 4096"]
    for n in config.nodes:
        lines += ["", "[[nodes]]", f'name = "{n.name}"', 'host = "local"', f'shards = ["{n.shards[0]}"]']
    path = tmp / "runhealth.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _app_script(start: str) -> None:
    import app

    app.main(start)


def run_page(page: str, config: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = AppTest.from_function(_app_script, args=(page,), default_timeout=30)
    at.run()
    assert not at.exception, at.exception
    return at


def test_the_overview_draws_the_days_episodes(scenario, monkeypatch):
    tmp, config, store = scenario
    at = run_page("overview", write_config(tmp, config, store), monkeypatch)
    charts = [c for c in at.get("plotly_chart") if "Alerts, last " in c.proto.spec]
    assert len(charts) == 1
    spec = json.loads(charts[0].proto.spec)
    # #41: the strip's window fits the run (an hour old: its first episode ~1 h ago, and a tenth
    # more), not a day, where an hour's bars were a few pixels wide.
    lo, hi = (datetime.datetime.fromisoformat(x).timestamp() for x in spec["layout"]["xaxis"]["range"])
    first = min(r["started_unix"] for r in store.alert_episodes())
    assert hi - lo == pytest.approx(1.1 * (time.time() - first), rel=0.02), (hi - lo) / 3600
    assert re.match(r"Alerts, last \d+ min", spec["layout"]["title"]["text"]), spec["layout"]["title"]["text"]
    bars = spec["data"]
    labels = {y: bar["name"] for bar in bars for y in bar["y"]}  # row -> severity (the colour)
    assert {k: v for k, v in labels.items() if not k.startswith("host_")} == {
        "truncation_high · run": "critical",
        "node_stale · n2": "warning",
        "node_down · n2": "critical",
    }
    captions = " ".join(c.value for c in at.caption)
    n = len(store.alert_episodes(since_unix=time.time() - 86400))
    assert n >= 3 and f"Today's alerts: {n:,} in the last 24 h" in captions


def test_the_nodes_page_lists_the_episodes_newest_first_with_durations(scenario, monkeypatch):
    tmp, config, store = scenario
    at = run_page("nodes", write_config(tmp, config, store), monkeypatch)
    assert any("Alert history" in s.value for s in at.subheader)
    (table,) = [df.value for df in at.dataframe if "at start" in df.value.columns]
    table = table[~table["alert"].str.startswith("host_")]
    assert list(table["alert"]) == ["node_down", "node_stale", "truncation_high"]  # newest start first
    assert list(table["duration"]) == ["2 min", "2 min", "5 min"]  # 100 s, 120 s, 300 s
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(5\d min ago\)$", t) for t in table["ended"])
    assert [b.proto.label for b in at.sidebar.get("download_button") if "alert history" in b.proto.label] == [
        "Download alert history (CSV)"
    ]
    assert list(table["node"]) == ["n2", "n2", "run"]


def test_the_alert_history_csv_carries_the_episodes(scenario):
    from components.alerthistory_view import history_csv

    _tmp, _config, store = scenario
    csv = pd.read_csv(io.StringIO(history_csv(driven(store.alert_episodes())).to_csv(index=False)))
    assert list(csv["alert"]) == ["node_down", "node_stale", "truncation_high"]
    assert list(csv["started_unix"] - START) == pytest.approx([200, 80, 20])
    assert list(csv["duration_s"]) == pytest.approx([100, 120, 300])
