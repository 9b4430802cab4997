"""One lookback for rates (#30, item 5): the live tok/s window follows the poll interval (a minute,
or two intervals when polls are slower: runhealth.settings.windows.rate_window_s), and every consumer reads
the same rate. Swept over interval_s's range (0.5 s to 1 h): the Overview's tile and /metrics'
runhealth_generation_tokens_per_second give the same number, and neither is missing. Before, with
interval_s = 90 the exporter's fixed 2-minute read held one poll (no series at all) while the
Overview read an hour.
"""

from __future__ import annotations

import html
import math
import re
import time

import pytest
import store_fixtures
import test_pages
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runhealth.alerting import exporter
from runhealth.rules import activity
from runhealth.settings import windows
from runhealth.store import Store

UNITS = {"": 1.0, "K": 1e3, "M": 1e6}


def metrics_tps(store: Store) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(exporter.StoreMetrics(store))
    return {
        s.labels["node"]: s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "runhealth_generation_tokens_per_second"
    }


def tile(at, label_start: str) -> tuple[str, str]:
    """(label, value) of the Overview tile whose label starts with `label_start`."""
    for md in at.markdown:
        for m in re.finditer(r'rh-label">([^<]*)</div><div class="rh-value">([^<]*)<', md.value):
            if html.unescape(m.group(1)).startswith(label_start):
                return html.unescape(m.group(1)), html.unescape(m.group(2))
    raise AssertionError(f"no tile {label_start!r}")


def number(text: str) -> float:
    m = re.fullmatch(r"([\d,.]+)\s*([KM]?)", text.strip())
    assert m, text
    return float(m.group(1).replace(",", "")) * UNITS[m.group(2)]


@pytest.mark.parametrize("interval_s", [0.5, 10.0, 90.0, 600.0, 3600.0])
def test_the_page_and_metrics_read_the_same_rate_at_every_poll_interval(interval_s, tmp_path, monkeypatch):
    now = time.time()
    store_path = tmp_path / "x.sqlite3"
    config = store_fixtures.write_config(tmp_path, store_path, nodes=1, interval_s=interval_s)
    store = Store(store_path)
    polls = max(6, math.ceil(240 / interval_s))  # a few live-window spans
    store_fixtures.build_run(store, now=now, trunc_frac=0.1, nodes=1, polls=polls, interval_s=interval_s)
    store.set_meta("run", {"name": store_fixtures.RUN_NAME, "interval_s": interval_s, "nodes": ["node-1"]})
    window = windows.rate_window_s(interval_s)
    assert window == max(60.0, 2 * interval_s)

    scraped = metrics_tps(store)
    assert set(scraped) == {"node-1"}, scraped  # the node has a rate in /metrics at every interval
    read = activity.read_rates(store, time.time())
    assert read.window_s == window and read.tokens_per_s_1m is not None
    assert scraped["node-1"] == pytest.approx(read.tokens_per_s_1m, rel=0.02)
    store.close()

    at = test_pages.run_page("overview", config, monkeypatch)
    assert not at.exception
    label, value = tile(at, "Tokens / s")
    assert number(value) == pytest.approx(scraped["node-1"], rel=0.05), (label, value, scraped)
    expected_label = "1 min" if window == 60 else None
    if expected_label:
        assert label.endswith(expected_label), label
    else:
        assert "1 min" not in label, label  # the tile names the window it shows
