"""Tests for runhealth.analysis.servermetrics on hand-written SGLang / vLLM /metrics fixtures."""

from pathlib import Path

import pytest

from runhealth.analysis.servermetrics import HISTOGRAMS, MAX_TEXT_BYTES, merge_endpoints, parse_server_metrics

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def load(name):
    return (FIXTURES / name).read_text()


def test_sglang_fixture():
    out = parse_server_metrics(load("sglang.txt"))
    assert out["error"] is None and out["server"] == "sglang"
    assert out["values"] == {
        "sglang:gen_throughput": 5231.42,
        "sglang:num_running_reqs": 212.0,
        "sglang:num_queue_reqs": 37.0,
        "sglang:token_usage": 0.87,
        "sglang:generation_tokens_total": 1906712843.0,
        "sglang:spec_accept_length": 2.71,
    }


def test_vllm_fixture_sums_engines_and_breaks_out_finish_reasons():
    out = parse_server_metrics(load("vllm.txt"))
    values = out["values"]
    assert out["error"] is None and out["server"] == "vllm"
    # prometheus_client names the counter family "vllm:generation_tokens"; the sample keeps _total.
    assert values["vllm:generation_tokens_total"] == 9.5e8 + 9.25e8
    assert values["vllm:num_requests_running"] == 356.0
    assert values["vllm:num_requests_waiting"] == 21.0
    assert values["vllm:kv_cache_usage_perc"] == pytest.approx(0.90)  # averaged, not summed
    assert values['vllm:request_success_total{finished_reason="length"}'] == 81100.0
    assert values['vllm:request_success_total{finished_reason="stop"}'] == 358500.0
    assert values['vllm:request_success_total{finished_reason="abort"}'] == 15.0
    # Buckets only of the token histograms the servers' view reads (#33 item 4), none of latencies.
    kept = tuple(f"{h}_bucket" for h in HISTOGRAMS)
    assert not any(("bucket" in k and not k.startswith(kept)) or "created" in k or "prompt" in k for k in values)


def test_older_vllm_cache_metric_and_missing_reasons():
    values = parse_server_metrics(load("vllm_v0_old.txt"))["values"]
    assert values["vllm:kv_cache_usage_perc"] == 0.41
    assert values['vllm:request_success_total{finished_reason="length"}'] == 0.0
    assert values['vllm:request_success_total{finished_reason="stop"}'] == 900.0


def test_bytes_input_and_untyped_lines():
    text = b'vllm:num_requests_running{model_name="m"} 3\nvllm:num_requests_running{model_name="n"} 4\n'
    out = parse_server_metrics(text)
    assert out["values"] == {"vllm:num_requests_running": 7.0} and out["server"] == "vllm"


@pytest.mark.parametrize(
    "text",
    [
        'vllm:num_requests_running{model_name="m" 3\n',
        "this is not prometheus text\n",
        '# TYPE x counter\nx_total{a="b"} notanumber\n',
        "# TYPE\n",
        "\x00\xff" * 100,
    ],
)
def test_malformed_text_gives_an_error_not_an_exception(text):
    out = parse_server_metrics(text)
    assert out["values"] == {} and isinstance(out["error"], str) and out["error"]


def test_huge_text_is_refused_before_parsing():
    huge = "sglang:num_running_reqs 1\n" * (MAX_TEXT_BYTES // 25 + 10)
    out = parse_server_metrics(huge)
    assert out["values"] == {} and "too large" in out["error"]


def test_empty_and_none():
    assert parse_server_metrics("") == {"values": {}, "error": None, "server": None}
    assert parse_server_metrics(None)["error"]
    out = parse_server_metrics("# HELP up Up.\n# TYPE up gauge\nup 1\n")
    assert out == {"values": {}, "error": None, "server": None}


def test_two_endpoints_on_one_node_sum_counts_and_average_ratios():
    sglang = load("sglang.txt")
    reply = {
        "metrics": {
            "http://a/metrics": {"text": sglang},
            "http://b/metrics": {"text": sglang},
            "http://c/metrics": {"text": None, "error": "connection refused"},
        }
    }
    merged = merge_endpoints(reply)
    assert merged["sglang:num_running_reqs"] == 2 * 212.0
    assert merged["sglang:generation_tokens_total"] == 2 * 1906712843.0
    assert merged["sglang:token_usage"] == pytest.approx(0.87)  # a ratio: averaged, not summed
    assert merged["sglang:spec_accept_length"] == pytest.approx(2.71)
    assert merge_endpoints({"metrics": None}) == {} and merge_endpoints({}) == {}
