"""`runhealth collect` end to end: a real collector process serving /metrics on loopback and
sending an alert webhook to a real local receiver, stopped by SIGTERM; the Nodes page, as a
viewer (RUNHEALTH_COLLECTOR=off), shows what that process serves from the status it stores."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import streamlit as st
from prometheus_client.parser import text_string_to_metric_families
from shardgen import truth_rows, write_shard

from runhealth.serve import supervise
from runhealth.settings.config import RunContext, parse_config
from tests.test_pages import _clear_streamlit_caches, assert_clean, run_page, texts  # noqa: F401 (autouse fixture)
from tests.test_prometheus import _free_port
from tests.test_webhooks import SECRET, Receiver

ROOT = Path(__file__).resolve().parent.parent


def _config(tmp_path: Path, port: int | None = None) -> Path:
    write_shard(tmp_path / "a.jsonl", truth_rows(250, 7))
    config = tmp_path / "runhealth.toml"
    config.write_text(f"""
[run]
name = "collect-test"
store_path = "{tmp_path / "store.sqlite3"}"
interval_s = 1
{f"metrics_port = {port}" if port else ""}

[[nodes]]
name = "localhost"
host = "local"
shards = ["{tmp_path / "*.jsonl"}"]
python = "{sys.executable}"
gpu = "off"

[[nodes]]
name = "down"
host = "127.0.0.1"
port = 1
shards = ["/x/*.jsonl"]
connect_timeout_s = 2
""")
    return config


def _scrape(url: str) -> dict[tuple, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_collect_serves_metrics_and_sends_webhooks_until_sigterm(tmp_path):
    port = _free_port()
    receiver = Receiver(200)
    # a bad port (issue 23 #9) is refused in a sentence; collection and the good webhook go on
    urls = f"http://127.0.0.1:99999/{SECRET},{receiver.url()}"
    env = {**os.environ, "RUNHEALTH_WEBHOOK_URLS": urls, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runhealth", "collect", "--config", str(_config(tmp_path)), "--metrics-port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, got = time.time() + 60, {}
        while time.time() < deadline:
            try:
                got = _scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                got = {}
            done = sum(v for (name, _l), v in got.items() if name == "runhealth_completions_total")
            if done == 250 and any(p["node"] == "down" for p in receiver.posts):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.3)
        assert done == 250, got
        up = {dict(labels)["node"]: v for (name, labels), v in got.items() if name == "runhealth_node_up"}
        assert up == {"localhost": 1.0, "down": 0.0}
        alert = next(p for p in receiver.posts if p["node"] == "down")
        assert alert["alert"] == "node_down" and alert["run"] == "collect-test" and not alert["resolved"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        receiver.close()
    assert proc.returncode == 0, err
    assert f"/metrics on http://127.0.0.1:{port}/metrics" in err and SECRET not in err
    assert "RUNHEALTH_WEBHOOK_URLS: webhook entry 1 has a port that is not a number from 1 to 65535" in err
    assert "Traceback" not in err


def test_metrics_port_from_config_and_port_in_use_is_a_notice(tmp_path):
    from runhealth.alerting.outputs import start_outbound
    from runhealth.store import Store

    config = parse_config(
        {
            "run": {"name": "r", "metrics_port": _free_port()},
            "nodes": [{"name": "n", "host": "local", "shards": ["/x"]}],
        }
    )
    store = Store(tmp_path / "s.sqlite3")
    first = start_outbound([(config, store)], webhook_urls=[])
    try:
        assert first.metrics_url == f"http://127.0.0.1:{config.metrics_port}/metrics" and not first.notices
        second = start_outbound([(config, store)], webhook_urls=[])  # the same port again: refused, not fatal
        assert second.metrics_server is None and "not served" in second.notices[0]
        assert (
            second.status(time.time())["metrics_off"]
            == f"not served on 127.0.0.1:{config.metrics_port}: " + (second.notices[0].split(": ", 1)[1])
        )
    finally:
        first.stop()


def test_the_demo_run_never_sends_webhooks(tmp_path):
    from runhealth.alerting.outputs import start_outbound
    from runhealth.store import Store

    config = parse_config({"run": {"name": "r"}, "nodes": [{"name": "n", "host": "local", "shards": ["/x"]}]})
    out = start_outbound(
        [(config, Store(tmp_path / "s.sqlite3"))],
        webhook_urls=[f"http://127.0.0.1:9/{SECRET}"],
        context=RunContext(source="<built-in demo>", demo=True),
    )
    assert not out.notifiers and out.notices == ["alert webhooks off: this is the demo run"]


def test_every_live_run_on_one_metrics_port_and_each_with_its_notifier(tmp_path):
    """Several [[runs]]: one /metrics (the first run's port) exposes both runs by label, and each
    run gets its own alert notifier writing to its own store."""
    from runhealth.alerting.outputs import start_outbound
    from runhealth.store import Store

    runs = []
    for name in ("seed", "relaunch"):
        config = parse_config({"run": {"name": name}, "nodes": [{"name": "n", "host": "local", "shards": ["/x"]}]})
        store = Store(tmp_path / f"{name}.sqlite3")
        store.set_meta("run", {"name": name, "interval_s": 10})
        store.register_node("n", {})
        runs.append((config, store))
    out = start_outbound(runs, metrics_port=0, webhook_urls=["http://127.0.0.1:9/hook"])
    try:
        body = urllib.request.urlopen(out.metrics_url, timeout=5).read().decode()
        up = [
            s.labels["run"]
            for f in text_string_to_metric_families(body)
            for s in f.samples
            if s.name == "runhealth_node_up"
        ]
        assert sorted(up) == ["relaunch", "seed"]
        assert [n.store for n in out.notifiers] == [store for _config, store in runs]
    finally:
        out.stop()


def test_the_nodes_page_as_a_viewer_shows_the_collectors_metrics_url_and_notices(tmp_path, monkeypatch):
    """Issue 24: the viewer process has no Outbound of its own; the Nodes page reads what the
    collecting process stored: where /metrics is served, the refused webhook entry, which
    process wrote it; once that process is gone, it says so."""
    port, config = _free_port(), _config(tmp_path)
    env = {**os.environ, "RUNHEALTH_WEBHOOK_URLS": f"http://127.0.0.1:99999/{SECRET}", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "runhealth", "collect", "--config", str(config), "--metrics-port", str(port)]
    proc = supervise.start_collector(argv, env)  # returns once it said it is collecting
    try:
        assert proc.poll() is None
        at = run_page("nodes", config, monkeypatch)
        assert_clean(at)
        page, warnings = texts(at), [w.value for w in at.warning]
        assert f"Prometheus metrics: http://127.0.0.1:{port}/metrics" in page, page
        assert any("webhook entry 1 has a port that is not a number from 1 to 65535" in w for w in warnings), warnings
        assert f"pid {proc.pid} on {socket.gethostname()}" in page, page
        assert "Alert webhooks: none configured" in page and SECRET not in page
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    st.cache_data.clear()  # the status loader's ttl: this page run reads the store again
    at = run_page("nodes", config, monkeypatch)
    assert_clean(at)
    gone = [w.value for w in at.warning if f"The collector (pid {proc.pid}" in w.value]
    assert gone and " stopped at " in gone[0] and "`runhealth collect` or `runhealth dashboard`" in gone[0], gone
    assert "Prometheus metrics: http://" not in texts(at)  # not served any more: not shown as if it were


def test_a_killed_collector_and_a_silent_one_on_another_host_are_named_on_the_nodes_page(tmp_path, monkeypatch):
    """A collector killed without a word (SIGKILL: no clean stop recorded) is found gone by its
    pid; one on another host, by the age of its heartbeat. Its webhook shows redacted."""
    from runhealth.store import Store

    config = _config(tmp_path)
    env = {**os.environ, "RUNHEALTH_WEBHOOK_URLS": f"http://127.0.0.1:9/{SECRET}", "PYTHONPATH": str(ROOT)}
    proc = supervise.start_collector([sys.executable, "-m", "runhealth", "collect", "--config", str(config)], env)
    try:
        at = run_page("nodes", config, monkeypatch)
        assert_clean(at)
        page = texts(at)
        assert "Prometheus metrics: off (set [run] metrics_port or --metrics-port)" in page, page
        assert "Alert webhooks: http://127.0.0.1:9/…" in page and SECRET not in page
    finally:
        proc.kill()
        proc.wait(timeout=30)
    store = Store(tmp_path / "store.sqlite3")
    status = store.meta("collector")
    assert status["pid"] == proc.pid and status["webhook_receivers"] == 1 and SECRET not in json.dumps(status)
    st.cache_data.clear()
    at = run_page("nodes", config, monkeypatch)
    gone = [w.value for w in at.warning if w.value.startswith("The collector (pid")]
    assert gone and f"pid {proc.pid} on {socket.gethostname()}) exited without a word" in gone[0], gone

    status_time = time.time() - 300
    store.set_meta("collector", {**status, "host": "gpu-head-2", "written_unix": status_time})
    store.close()
    st.cache_data.clear()
    at = run_page("nodes", config, monkeypatch)
    gone = [w.value for w in at.warning if "The collector (pid" in w.value]
    since = time.strftime("%H:%M:%S", time.localtime(status_time))
    assert gone == [
        f"The collector (pid {proc.pid} on gpu-head-2) has not written since {since} (5 min ago): check it on"
        " gpu-head-2, or start `runhealth collect` or `runhealth dashboard`."
    ], gone
    assert "Prometheus metrics:" not in texts(at)


def test_the_status_is_rewritten_every_heartbeat_and_a_junk_status_reads_as_none(tmp_path):
    from runhealth.alerting.outputs import HEARTBEAT_S, STATUS_KEY, Outbound, collector_alive, read_status
    from runhealth.store import Store

    store = Store(tmp_path / "s.sqlite3")
    out, t0 = Outbound(stores=[store]), 1_000_000.0
    out.write_status(t0)
    m0 = out.written_mono
    out.beat(t0 + HEARTBEAT_S / 2, m0 + HEARTBEAT_S / 2)  # too soon: not rewritten
    assert read_status(store)["written_unix"] == t0
    out.beat(t0 + HEARTBEAT_S, m0 + HEARTBEAT_S)
    status = read_status(store)
    assert status["written_unix"] == t0 + HEARTBEAT_S and status["pid"] == os.getpid()
    assert collector_alive(status, t0 + HEARTBEAT_S + 30, 30) and not collector_alive(status, t0 + HEARTBEAT_S + 31, 30)
    # a configured stale_after_s below the heartbeat: alive between two heartbeats, gone after three
    assert collector_alive(status, t0 + 2.5 * HEARTBEAT_S, 5) and not collector_alive(status, t0 + 4.1 * HEARTBEAT_S, 5)
    out.write_status(t0 + 20, stopped=True)
    assert not collector_alive(read_status(store), t0 + 20, 30)
    for junk in ("text", {"pid": "1"}, {**status, "pid": None}):
        store.set_meta(STATUS_KEY, junk)
        assert read_status(store) is None


def test_the_heartbeat_thread_rewrites_the_status_until_a_final_stop(tmp_path, monkeypatch):
    from runhealth.alerting import outputs as outbound
    from runhealth.store import Store

    monkeypatch.setattr(outbound, "HEARTBEAT_S", 0.2)
    config = parse_config({"run": {"name": "r"}, "nodes": [{"name": "n", "host": "local", "shards": ["/x"]}]})
    store = Store(tmp_path / "s.sqlite3")
    out = outbound.start_outbound([(config, store)], webhook_urls=[])
    first = outbound.read_status(store)
    deadline = time.time() + 10
    while outbound.read_status(store)["written_unix"] == first["written_unix"]:
        assert time.time() < deadline, "the status was not rewritten"
        time.sleep(0.05)
    out.stop(final=True)
    assert out._heart is not None and not out._heart.is_alive()  # joined: no heartbeat lands after "stopped"
    status = outbound.read_status(store)
    assert status["stopped_unix"] is not None and status["started_unix"] == first["started_unix"]
    assert not outbound.collector_alive(status, time.time(), 30)
