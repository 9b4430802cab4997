"""The fast text exposition (runhealth/alerting/exposition.py) writes exactly what
prometheus_client's generate_latest writes: on real stores (two runs in one exposition), on
families with every value and label edge (escapes, -0.0, NaN, infinities, big numbers,
timestamps, _created samples, a non-legacy label name), and over HTTP for the Accept headers
scrapers send."""

from __future__ import annotations

import gzip
import time
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from runhealth.alerting import exporter, exposition
from tests.test_prometheus import _store


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _edge_families() -> list[Metric]:
    gauge = GaugeMetricFamily("x_gauge", 'help with \\ and "quotes"\nand a newline', labels=["run", "node", "a"])
    values = [0.0, -0.0, 1, 1.5, -2.25, 1e-9, 123456.0, 1234567.0, 1e22, 2**53, float("nan"), float("inf")]
    values += [float("-inf"), 0.1 + 0.2, 7]
    for i, v in enumerate(values):
        gauge.add_metric(["r", f'n\\{i}"\n', "é→😀" if i % 2 else ""], v, timestamp=None if i % 3 else 1.5 + i)
    counter = CounterMetricFamily("x_count", "c", labels=["z", "b"], created=None)
    counter.add_metric(["1", "2"], 5)
    counter.add_metric(["1", "3"], 6, created=1700000000.25)
    hist = HistogramMetricFamily("x_len", "h", labels=["node"])
    hist.add_metric(["n"], [("1.0", 1), ("4096.0", 3), ("+Inf", 4)], 100)
    odd = GaugeMetricFamily("x_odd", "a label name outside the legacy set", labels=["dotted.name"])
    odd.add_metric(["v"], 1)
    bare = GaugeMetricFamily("x_bare", "no labels", value=3.5)
    empty = GaugeMetricFamily("x_empty", "no samples", labels=["a"])
    return [gauge, counter, hist, odd, bare, empty]


def test_edge_families_match_generate_latest():
    families = _edge_families()
    assert exposition.text(families) == generate_latest(_Families(families))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0.0, -0.0, 3.0, 1e300, 5e-324, 1234567.125, 10**7, float("nan")])
def test_go_float_is_prometheus_clients(value):
    from prometheus_client.utils import floatToGoString

    assert exposition.go_float(value) == floatToGoString(value)


def test_store_exposition_matches_generate_latest(tmp_path):
    now = time.time()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _store(tmp_path / "a", "node_down", now=now)
    b = _store(tmp_path / "b", "ceiling_18", now=now, name="relaunch")
    registry = exporter.registry_for([a, b], clock=lambda: now)
    fast = exporter.scrape_text([a, b], clock=lambda: now)
    assert fast == generate_latest(registry) and b"runhealth_gpu_power_watts{" in fast


@pytest.mark.parametrize(
    ("accept", "encoding", "fast"),
    [
        (None, None, True),
        (None, "gzip", True),
        ("text/plain;version=0.0.4;q=0.3,*/*;q=0.2", None, True),
        (  # Prometheus 2.x's default scrape Accept header
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
            "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            "gzip",
            True,
        ),
        ("application/openmetrics-text;version=1.0.0", None, False),
    ],
)
def test_served_body_is_the_text_format_when_accepted(tmp_path, accept, encoding, fast):
    now = time.time()
    store = _store(tmp_path, "healthy", now=now)
    server = exporter.serve(store, 0)
    try:
        headers = {k: v for k, v in (("Accept", accept), ("Accept-Encoding", encoding)) if v}
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as reply:
            body, kind = reply.read(), reply.headers["Content-Type"]
            zipped = reply.headers.get("Content-Encoding") == "gzip"
    finally:
        server.shutdown()
        server.server_close()
    body = gzip.decompress(body) if zipped else body
    assert zipped == (encoding == "gzip")
    if fast:
        assert kind.startswith("text/plain; version=0.0.4") and body.startswith(b"# HELP runhealth_completions_total")
        assert b"runhealth_node_up{" in body
    else:
        assert kind.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
