"""Prometheus text from an SGLang or vLLM ``/metrics`` endpoint -> the few values we show.

Parsing uses ``prometheus_client.parser.text_string_to_metric_families``.  That parser renames
counter *families* (it strips ``_total``), so values are matched on *sample* names, which keep
the suffix exactly as the server wrote it.  Values are summed across label sets (several
models, data-parallel ranks), except ratio-like gauges (cache usage, acceptance length) which
are averaged.  Malformed or oversized text yields an error string, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from runhealth.node.wire import METRICS_MAX_BYTES as MAX_TEXT_BYTES  # the agent fetches at most this much

if TYPE_CHECKING:  # imported lazily at run time (_families): the agent-side paths never need it
    from prometheus_client.metrics_core import Metric

SUMMED = (
    "sglang:gen_throughput",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:generation_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
# Ratios: a sum over ranks would exceed 1 / be meaningless, so these are averaged.
AVERAGED = (
    "sglang:token_usage",
    "sglang:spec_accept_length",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
)
SUCCESS = "vllm:request_success_total"
FINISHED_REASONS = ("stop", "length", "abort")  # vLLM's reasons, zero until seen; "repetition" etc. as they come
# Token histograms (#33 item 4): generated tokens per request (vLLM, SGLang with
# --collect-tokens-histogram) and the max_tokens each request asked for (vLLM). Kept as
# '<name>_bucket{le="4095"}', '<name>_count' and '<name>_sum', summed over label sets.
GEN_TOKENS = ("vllm:request_generation_tokens", "sglang:generation_tokens_histogram")
MAX_TOKENS = "vllm:request_max_num_generation_tokens"
HISTOGRAMS = (*GEN_TOKENS, MAX_TOKENS)
_HIST_SAMPLES = {f"{h}{suffix}": h for h in HISTOGRAMS for suffix in ("_bucket", "_count", "_sum")}


def bucket_key(histogram: str, le: float) -> str:
    """The stored name of one cumulative bucket: 'vllm:request_generation_tokens_bucket{le="4095"}'."""
    edge = "+Inf" if math.isinf(le) else f"{le:g}" if le != int(le) else str(int(le))
    return f'{histogram}_bucket{{le="{edge}"}}'


def is_bucket(name: str) -> bool:
    """A histogram bucket's stored name (kept as the latest value only, not as a time series)."""
    return "_bucket{le=" in name


def _result(values: dict[str, float] | None = None, error: str | None = None, server: str | None = None) -> dict:
    return {"values": values or {}, "error": error, "server": server}


def _families(text: str) -> Iterable[Metric]:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:  # pragma: no cover - dependency missing
        raise RuntimeError("prometheus_client missing: pip install prometheus_client") from exc
    return text_string_to_metric_families(text)


def _collect(text: str) -> tuple[dict, dict, str | None]:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    server = None
    for family in _families(text):
        for sample in family.samples:
            name, value = sample.name, sample.value
            if server is None and name.startswith(("sglang:", "vllm:")):
                server = name.split(":", 1)[0]
            if value is None or math.isnan(value):
                continue
            key = name
            if name == SUCCESS:
                reason = sample.labels.get("finished_reason")
                key = f'{SUCCESS}{{finished_reason="{reason}"}}' if reason else SUCCESS
            elif name in _HIST_SAMPLES:
                if name.endswith("_bucket"):
                    key = bucket_key(_HIST_SAMPLES[name], float(sample.labels["le"]))
            elif name not in SUMMED and name not in AVERAGED:
                continue
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    return sums, counts, server


def parse_server_metrics(text: str | bytes | bytearray | None) -> dict:
    """Extract the dashboard's server values from Prometheus exposition text.

    Args:
        text: the ``/metrics`` body (str or UTF-8 bytes), at most 8 MiB.

    Returns:
        ``{"values": {name: float}, "error": str | None, "server": "sglang" | "vllm" | None}``.
        ``vllm:request_success_total`` is broken out by ``finished_reason`` into keys like
        ``vllm:request_success_total{finished_reason="length"}``; the older
        ``vllm:gpu_cache_usage_perc`` also fills ``vllm:kv_cache_usage_perc``.  On any parse
        error ``values`` is empty and ``error`` says why.
    """
    if text is None:
        return _result(error="no metrics text")
    if len(text) > MAX_TEXT_BYTES:
        return _result(error=f"metrics text too large ({len(text)} > {MAX_TEXT_BYTES} bytes)")
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    try:
        sums, counts, server = _collect(str(text))
    except Exception as exc:  # the parser raises bare ValueError/IndexError/etc. on bad input
        return _result(error=f"malformed metrics text: {type(exc).__name__}: {exc}"[:300])
    values = {k: (v / counts[k] if k in AVERAGED else v) for k, v in sums.items()}
    if any(k.startswith(SUCCESS + "{") for k in values):
        for reason in FINISHED_REASONS:  # a reason not seen yet is a zero, not unknown
            values.setdefault(f'{SUCCESS}{{finished_reason="{reason}"}}', 0.0)
    if "vllm:gpu_cache_usage_perc" in values:
        values.setdefault("vllm:kv_cache_usage_perc", values["vllm:gpu_cache_usage_perc"])
    return _result(values, None, server)


def merge_endpoints(reply: dict) -> dict[str, float]:
    """Server metrics of every endpoint on a node (a poll reply's ``metrics``): summed, except
    the ratios in AVERAGED, which are averaged over the endpoints that report them."""
    per_name: dict[str, list[float]] = {}
    for entry in (reply.get("metrics") or {}).values():
        if entry.get("text") is None:
            continue
        parsed = parse_server_metrics(entry["text"])
        for name, value in parsed["values"].items():
            per_name.setdefault(name, []).append(value)
    return {n: (sum(v) / len(v) if n in AVERAGED else sum(v)) for n, v in per_name.items()}
