"""Prometheus export: the exposition itself, docs/prometheus/ checked by promtool, and a REAL
Prometheus server (Debian's /usr/bin/prometheus, on loopback, own config and temp storage)
scraping runhealth, whose PromQL answers must equal the store's figures."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from store_fixtures import poll_reply, write_reply

from runhealth.alerting import exporter
from runhealth.rules import activity, health
from runhealth.store import Store
from tests.store_fixtures import CEILING, RUN_NAME, make_store

DOCS = Path(__file__).resolve().parent.parent / "docs" / "prometheus"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
META = {
    "name": RUN_NAME,
    "max_output_tokens": CEILING,
    "interval_s": 10,
    "target_completions": 80_000,
    "truncation_alert_fraction": 0.05,
}


def _store(tmp_path: Path, scenario: str = "node_down", now: float | None = None, **meta) -> Store:
    store, _cfg = make_store(tmp_path, scenario, now=now)
    store.set_meta("run", {**META, **meta})
    return store


def _samples(store: Store, now: float) -> dict[str, list]:
    text = generate_latest(exporter.registry_for(store, clock=lambda: now)).decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_exposition_equals_the_dashboard_figures(tmp_path):
    now = time.time()
    store = _store(tmp_path, now=now)
    summary = health.run_summary(store, CEILING)
    got = _samples(store, now)
    assert sum(s.value for s in got["runhealth_completions_total"]) == summary.completions
    by_reason: dict[str, float] = {}
    for s in got["runhealth_completions_total"]:
        by_reason[s.labels["finish_reason"]] = by_reason.get(s.labels["finish_reason"], 0) + s.value
    assert by_reason == summary.finish_reasons
    assert sum(s.value for s in got["runhealth_completions_at_ceiling_total"]) == summary.at_ceiling
    assert got["runhealth_truncated_ratio"][0].value == pytest.approx(summary.at_ceiling_fraction, abs=1e-12)
    assert sum(s.value for s in got["runhealth_completion_length_tokens_sum"]) == summary.tokens_total
    done = sum(n["completions"] for n in store.nodes())
    assert got["runhealth_progress_ratio"][0].value == pytest.approx(done / 80_000)


def test_histogram_has_the_ceiling_as_a_bucket_and_exact_cumulative_counts(tmp_path):
    now = time.time()
    store = _store(tmp_path, now=now)
    buckets = [
        s for s in _samples(store, now)["runhealth_completion_length_tokens_bucket"] if s.labels["node"] == "node-1"
    ]
    bounds = [s.labels["le"] for s in buckets]
    assert f"{CEILING}.0" in bounds and f"{CEILING - 1}.0" in bounds and bounds[-1] == "+Inf"
    rows = [r for r in store.length_counts(by="node") if r["node"] == "node-1"]
    for s in buckets:
        le = float(s.labels["le"])
        assert s.value == sum(r["count"] for r in rows if r["tokens"] <= le), s.labels
    assert exporter.length_buckets(4096)[-2:] == [4095.0, 4096.0]
    assert exporter.length_buckets(None)[0] == 64.0


def test_node_and_gpu_series(tmp_path):
    now = time.time()
    store = _store(tmp_path, now=now)
    got = _samples(store, now)
    up = {s.labels["node"]: s.value for s in got["runhealth_node_up"]}
    assert up == {"node-1": 1.0, "node-2": 0.0, "node-3": 0.0, "node-4": 1.0}  # node-2 stale, node-3 down
    ages = {s.labels["node"]: s.value for s in got["runhealth_last_poll_age_seconds"]}
    assert 590 < ages["node-3"] < 620 and ages["node-1"] < 10
    assert {s.value for s in got["runhealth_stalled"]} == {0.0}
    tps = {s.labels["node"]: s.value for s in got["runhealth_generation_tokens_per_second"]}
    assert set(tps) == {"node-1", "node-4"} and all(v > 0 for v in tps.values())
    throttled = [s for s in got["runhealth_gpu_throttled"] if s.value == 1.0]
    assert [(s.labels["node"], s.labels["gpu"], s.labels["reason"]) for s in throttled] == [
        ("node-2", "6", "sw_power_cap")
    ]
    util = {(s.labels["node"], s.labels["gpu"]): s.value for s in got["runhealth_gpu_utilization_ratio"]}
    assert util[("node-2", "5")] == pytest.approx(0.03)
    assert ("node-4", "3") not in util  # the lost GPU has no numbers: no sample, not a zero
    mem = {(s.labels["node"], s.labels["gpu"]): s.value for s in got["runhealth_gpu_memory_used_bytes"]}
    assert mem[("node-1", "0")] == 120_000 * 1024 * 1024


def test_stall_is_exported_and_alerted(tmp_path):
    """A node that keeps answering but whose shards stop growing is stalled after the window."""
    now = time.time()
    store = _store(tmp_path, "healthy", now=now - 900)  # the last growth was 15 minutes ago
    for k in range(60):  # node-1 keeps answering every 10 s with nothing new
        ts = now - 600 + 10 * k
        write_reply(store, "node-1", {"time_unix": ts, "shards": {"files": {}}, "gpus": {}}, ts, 5.0)
    stalled = {s.labels["node"]: s.value for s in _samples(store, now)["runhealth_stalled"]}
    assert stalled["node-1"] == 1.0
    assert stalled["node-2"] == 0.0  # not polled lately: down, not stalled
    found = health.evaluate(store, now)
    names = {(a.name, a.node) for a in found}
    stalled_since = next(a.value for a in found if a.name == "run_stalled")
    assert stalled_since is not None and stalled_since >= 900  # since its last completion, not the quiet polls'
    # node-1 is the only node up and it writes nothing: the run is stalled (one stall rule), and
    # no sentence claims that other nodes write.
    assert ("run_stalled", None) in names and ("node_down", "node-2") in names
    assert not any(name == "node_stalled" for name, _node in names)


def _late_poll_store(tmp_path: Path, now: float) -> Store:
    """One node polled every 10 s until 90 s ago, then once more 5 s ago (a late poll): the live
    minute's only span opens 90 s back, before a lookback of the window and two intervals (80 s)."""
    store = Store(tmp_path / "late.sqlite3")
    store.set_meta("run", {**META, "nodes": ["node-1"]})
    store.register_node("node-1", {"name": "node-1", "host": "local", "shards": ["/data/out/*.jsonl"]})
    offset = 0
    for ts in [now - 200 + 10 * k for k in range(12)] + [now - 5]:
        end = offset + 4000
        entry = {"inode": 1, "size": end, "offset_from": offset, "offset": end, "reset": False, "lines": 10}
        entry |= {"malformed": 0, "tokens": 1000, "counts": [[100, "stop", 0, 10]], "error": None}
        write_reply(store, "node-1", poll_reply(ts, [], {"/data/out/a.jsonl": entry}), ts)
        offset = end
    return store


def test_a_scrape_computes_the_rates_once_the_alerts_reading(tmp_path, monkeypatch):
    """#42 item 3: the tok/s series, the stall series and the alerts share one reading of every
    node's rates a scrape (each node's rates cost ~0.1-0.35 CPU s a scrape at 1,024 nodes)."""
    now = time.time()
    store = _store(tmp_path, now=now)
    calls = []
    real = activity.run_rates
    monkeypatch.setattr(activity, "run_rates", lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
    got = _samples(store, now)
    assert calls == [now]  # one computation: the stall rule's, the alerts' and the tok/s series'
    tps = {s.labels["node"]: s.value for s in got["runhealth_generation_tokens_per_second"]}
    memo: dict = {}
    health.stalled_nodes(store, now, store.run_settings().stall_after, memo)
    (reading,) = memo.values()
    assert tps == {n: r.tokens_per_s_1m for n, r in reading.per_node.items() if r.tokens_per_s_1m is not None}
    assert set(tps) == {"node-1", "node-4"}


def test_a_late_poll_gives_the_scrape_the_rate_the_alerts_and_the_overview_read(tmp_path):
    """The live minute's span opened by a poll 90 s back: the scrape's tok/s is the one the alerts
    and the screens read (their hour of polls), not a missing series (a shorter lookback missed it)."""
    now = time.time()
    store = _late_poll_store(tmp_path, now)
    got = _samples(store, now)
    tps = {s.labels["node"]: s.value for s in got["runhealth_generation_tokens_per_second"]}
    alerts = health.read(store, now).rates.per_node["node-1"].tokens_per_s_1m
    screens = activity.read_rates(store, now).per_node["node-1"].tokens_per_s_1m  # the hour the pages read
    assert alerts is not None and alerts > 0
    assert tps == {"node-1": alerts} and screens == alerts
    store.close()


def test_serve_binds_loopback_by_default(tmp_path):
    store = _store(tmp_path, "empty")
    server = exporter.serve(store, 0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).read().decode()
        assert "runhealth_node_up{" in body and "passphrase" not in body
    finally:
        server.shutdown()
        server.server_close()


def test_every_live_run_in_one_exposition(tmp_path):
    """Two runs on one /metrics: each family once (valid for promtool), series told apart by run."""
    now = time.time()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _store(tmp_path / "a", "healthy", now=now)
    b = _store(tmp_path / "b", "ceiling_18", now=now, name="relaunch")
    text = generate_latest(exporter.registry_for([a, b], clock=lambda: now)).decode()
    families = [f.name for f in text_string_to_metric_families(text)]
    assert len(families) == len(set(families)) and "runhealth_completions" in families
    ratios = {
        s.labels["run"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "runhealth_truncated_ratio"
    }
    assert ratios.keys() == {RUN_NAME, "relaunch"} and ratios["relaunch"] > 0.1 > ratios[RUN_NAME]
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- promtool -----------------------------------------------------------------------------
def _promtool(*args: str) -> str:
    proc = subprocess.run([PROMTOOL, *args], cwd=DOCS, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_alert_rules_pass_promtool_check_and_unit_tests():
    assert "8 rules found" in _promtool("check", "rules", "runhealth-alerts.yml")
    assert "SUCCESS" in _promtool("test", "rules", "runhealth-alerts.test.yml")
    _promtool("check", "config", "prometheus.yml")


def test_promtool_rule_tests_can_fail(tmp_path):
    """The rule tests are not vacuous: a wrong expectation makes promtool fail."""
    broken = (DOCS / "runhealth-alerts.test.yml").read_text().replace("eval_time: 13m", "eval_time: 11m")
    (tmp_path / "t.yml").write_text(broken.replace("runhealth-alerts.yml", str(DOCS / "runhealth-alerts.yml")))
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "t.yml")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0


# -- a real Prometheus server ---------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def prometheus(tmp_path):
    """Start Prometheus scraping a runhealth exporter every second; yields (query, store, now)."""
    now = time.time()
    store = _store(tmp_path, now=now)
    server = exporter.serve(store, 0)
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n  - job_name: runhealth\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{server.server_port}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def query(q: str) -> list[dict]:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        reply = json.loads(urllib.request.urlopen(url, timeout=5).read())
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    try:
        deadline = time.time() + 60
        while True:  # ready, and at least one scrape of runhealth landed
            try:
                if query('up{job="runhealth"} == 1') and query("runhealth_truncated_ratio"):
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.time() < deadline, "Prometheus did not scrape runhealth within 60 s"
            time.sleep(0.5)
        yield query, store, now
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        server.shutdown()
        server.server_close()


def _value(result: list[dict]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_real_prometheus_answers_equal_the_store(prometheus):
    query, store, _now = prometheus
    summary = health.run_summary(store, CEILING)
    assert _value(query("sum(runhealth_completions_total)")) == summary.completions
    per_node = {r["metric"]["node"]: float(r["value"][1]) for r in query("sum by (node) (runhealth_completions_total)")}
    assert per_node == {t["node"]: t["completions"] for t in store.group_totals("node")}
    assert _value(query('sum(runhealth_completions_total{finish_reason="length"})')) == summary.finish_reasons["length"]
    assert _value(query("runhealth_truncated_ratio")) == pytest.approx(summary.at_ceiling_fraction, rel=1e-12)
    share = query(
        f'1 - sum(runhealth_completion_length_tokens_bucket{{le="{CEILING - 1}.0"}})'
        " / sum(runhealth_completion_length_tokens_count)"
    )
    assert _value(share) == pytest.approx(summary.at_ceiling / summary.length_count, rel=1e-12)
    # histogram_quantile interpolates inside a bucket: the exact p90 must lie in the bucket it returns.
    p90 = _value(query("histogram_quantile(0.9, sum by (le) (runhealth_completion_length_tokens_bucket))"))
    bounds = [0.0, *exporter.length_buckets(CEILING)]
    lo, hi = next((a, b) for a, b in zip(bounds, bounds[1:], strict=False) if a < p90 <= b)
    assert lo < summary.tokens.p90 <= hi
    assert _value(query("count(runhealth_gpu_utilization_ratio)")) == len(
        [g for g in store.gpu_latest() if g["util_pct"] is not None]
    )
    assert _value(query("sum(runhealth_node_up)")) == 2


def test_grafana_dashboard_queries_run_on_real_prometheus(prometheus):
    query, _store_, _now = prometheus
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    exposed = {r["metric"]["__name__"] for r in query('{__name__=~"runhealth_.+"}')}
    for expr in exprs:
        for name in re.findall(r"runhealth_[a-z_]+", expr):
            assert name in exposed, f"{name} in the dashboard is not exported"
        query(expr.replace("$run", ".*"))  # Prometheus accepts it (status success)
    rules = (DOCS / "runhealth-alerts.yml").read_text()
    for name in set(re.findall(r"runhealth_[a-z_]+", rules)):
        assert name in exposed, f"{name} in the alert rules is not exported"
