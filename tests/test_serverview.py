"""The servers' view beside the shards' (#33 item 4): vLLM's finished reasons (repetition
included) and token histograms, SGLang's generation-tokens histogram, parsed from exposition
text in the servers' own format (tests/fixtures/metrics/*_tokens.txt: two vLLM engines with
vLLM's default 1-2-5 buckets, which have no edge near 4,096; one SGLang server started with
custom bucket edges at 4,095 and 4,096), written as a poll writes them and shown on Output lengths.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import store_fixtures
from test_pages import _clear_streamlit_caches, run_page, texts  # noqa: F401 (autouse fixture)
from test_tokencost import build

from runhealth import ingest
from runhealth.analysis import servermetrics, stats
from runhealth.screens import lengths, serverview
from runhealth.settings.config import load_config

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
VLLM = (FIXTURES / "vllm_tokens.txt").read_text()
SGLANG = (FIXTURES / "sglang_tokens.txt").read_text()
# The fixtures' truth (tests/fixtures/metrics: two engines of 10,000 and 9,000 requests; SGLang 15,000).
VLLM_LENGTH, VLLM_REPETITION, VLLM_TOTAL, VLLM_LE_2000 = 1790 + 1621, 12 + 7, 19_000, 14_113
SGLANG_AT_CEILING, SGLANG_TOTAL = 2702, 15_000


def test_vllm_reasons_and_token_histograms_are_parsed_and_summed_over_engines():
    got = servermetrics.parse_server_metrics(VLLM)
    v = got["values"]
    assert got["error"] is None and got["server"] == "vllm"
    assert v['vllm:request_success_total{finished_reason="length"}'] == VLLM_LENGTH
    assert v['vllm:request_success_total{finished_reason="repetition"}'] == VLLM_REPETITION
    assert v[servermetrics.bucket_key("vllm:request_generation_tokens", 2000)] == VLLM_LE_2000
    assert v['vllm:request_generation_tokens_bucket{le="+Inf"}'] == VLLM_TOTAL
    assert v["vllm:request_generation_tokens_count"] == VLLM_TOTAL
    assert v['vllm:request_max_num_generation_tokens_bucket{le="5000"}'] == VLLM_TOTAL
    assert not any("created" in k for k in v)  # the _created gauges are not counts


def test_sglang_generation_tokens_histogram_is_parsed():
    v = servermetrics.parse_server_metrics(SGLANG)["values"]
    assert v['sglang:generation_tokens_histogram_bucket{le="4095"}'] == SGLANG_TOTAL - SGLANG_AT_CEILING
    assert v["sglang:generation_tokens_histogram_count"] == SGLANG_TOTAL


def _rows(text: str, node: str = "node-1") -> list:
    values = servermetrics.parse_server_metrics(text)["values"]
    return [{"node": node, "name": k, "value": x, "ts_unix": 0.0} for k, x in values.items()]


def _summary(length: int, n: int) -> stats.Summary:
    hist = stats.LengthHist.from_rows([(4096, "length", 0, length), (900, "stop", 0, n - length)])
    return stats.summarize(hist, 4096)


def test_vllm_view_beside_the_shards_and_bounds_without_an_edge():
    view = serverview.server_view(_rows(VLLM), _summary(180, 1000))
    assert view is not None and view.length_share == pytest.approx(VLLM_LENGTH / VLLM_TOTAL)
    lines = view.lines()
    assert lines[0] == "vLLM server: 18.0% of 19,000 requests finished by length; shards: 18.0%."
    assert "stopped 19 requests for repetition" in lines[1]
    low, high = view.gen_tokens.at_least(4096)  # type: ignore[union-attr]
    assert (low, high) == (0.0, pytest.approx(1 - VLLM_LE_2000 / VLLM_TOTAL))
    assert "no bucket edge at 4,095" in lines[2] and "--generation-tokens-buckets custom" in lines[2]
    assert "max_tokens of at most 5,000" in lines[3]


def test_sglang_view_is_exact_with_an_edge_at_ceiling_minus_one():
    view = serverview.server_view(_rows(SGLANG), _summary(180, 1000))
    assert view is not None and view.gen_tokens is not None and view.gen_tokens.edges_for(4096)
    low, high = view.gen_tokens.at_least(4096)
    assert low == high == pytest.approx(SGLANG_AT_CEILING / SGLANG_TOTAL)
    assert view.lines() == [
        "Server's generated-tokens histogram: 18.0% of 15,000 requests reached 4,096 tokens; "
        "shards: 18.0% cut at the ceiling."
    ]


def test_no_server_metrics_no_view():
    assert serverview.server_view([], _summary(1, 10)) is None


def test_poll_writes_buckets_as_latest_only_and_output_lengths_shows_the_view(tmp_path, monkeypatch):
    now = time.time()
    store, _truth = build(tmp_path / "x.sqlite3", now)
    reply = store_fixtures.poll_reply(now, [], {}, metrics={"http://127.0.0.1:8000/metrics": {"text": VLLM}})
    store.write_poll("node-1", ingest.read_poll(reply, servermetrics.merge_endpoints(reply)), now, 5.0)
    names = {r["name"] for r in store.query("SELECT DISTINCT name FROM metric_samples")}
    assert names and not any(servermetrics.is_bucket(n) for n in names)
    assert any(servermetrics.is_bucket(m["name"]) for m in store.metric_latest())
    config = store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3", nodes=2)
    m = lengths.lengths(store, load_config(config), now)
    assert m.server is not None and m.server.lines()[0].startswith("vLLM server: 18.0% of 19,000 requests")
    store.close()
    at = run_page("lengths", config, monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    shown = texts(at)
    assert "vLLM server: 18.0% of 19,000 requests finished by length; shards:" in shown
    assert "The servers' view" in shown
