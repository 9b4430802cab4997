"""Throughput, progress and ETA from per-node poll deltas and Prometheus counters.

Each node poll yields ``(t, delta_count, delta_tokens, backfill)``: the completions and tokens
that appeared since the previous poll, at time ``t`` of one continuous clock per node
(runhealth.rules.activity.bridged_times: the node's own poll intervals, bridged over a clock step).
Rates are always computed on intervals between one node's own polls, so clock skew between
nodes and the dashboard cancels out.  Backfill polls (the first index of
existing shards, a rescan after a dashboard restart) carry data produced long before and are
excluded; their timestamp only restarts the interval.  A missed poll needs no special case:
the next delta spans the gap and is divided by the gap.

`windowed_rate` is the one rate over poll spans: runhealth.rules.activity applies it with the one
window (runhealth.settings.windows.RATE_WINDOW_S) for the live tok/s every screen and /metrics show.
`eta_seconds` is the one ETA; `eta_change` scales it for a what-if. A rate's variance is by batch
means (`ratio_rate`): the Compare page's life rates and the ETA's interval (`eta_interval`, the
stragglers' rule in runhealth.analysis.stragglers) use the same estimator.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from itertools import pairwise
from typing import NamedTuple

Point = Sequence  # (t, delta_count, delta_tokens, backfill): t on one node's continuous clock
Span = tuple[float, float, float, float]  # (t_start, t_end, delta_count, delta_tokens)
Z95 = 1.959964  # as runhealth.analysis.runcompare.Z95

# Two-sided 95% Student t quantiles by degrees of freedom (a key at or below df is used: conservative).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
T975.update({12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980})


def valid_spans(points: list[Point]) -> list[tuple[float, float, float, float]]:
    """Valid ``(t_start, t_end, delta_count, delta_tokens)`` spans between consecutive polls.

    A span ending in a backfill poll is dropped; so is one whose clock went backwards or
    stood still (node reboot, NTP step): the next span starts afresh from that poll.
    """
    spans, prev_t = [], None
    for t, d_count, d_tokens, backfill in sorted(points, key=_time):
        if prev_t is not None and not backfill and t > prev_t:
            spans.append((prev_t, t, max(0.0, d_count), max(0.0, d_tokens)))
        prev_t = t
    return spans


_time = operator.itemgetter(0)


def window_spans(points: list[Point], window_s: float, end_t: float | None = None) -> list[Span]:
    """The valid spans within the ``window_s`` seconds before ``end_t`` (default: the end of the
    last span), one straddling the window start cut to it pro rata (as `windowed_rate` counts it)."""
    return spans_in_window(valid_spans(points), window_s, end_t)


def spans_in_window(spans: list[Span], window_s: float, end_t: float | None = None) -> list[Span]:
    """`window_spans` of the spans `valid_spans` gave (a caller reading two windows finds them once)."""
    if not spans:
        return []
    start = (spans[-1][1] if end_t is None else end_t) - window_s
    out = []
    for t0, t1, d_count, d_tokens in spans:
        if t1 <= start:
            continue
        share = (t1 - max(t0, start)) / (t1 - t0)
        out.append((max(t0, start), t1, share * d_count, share * d_tokens))
    return out


def windowed_rate(
    points: list[Point], window_s: float, end_t: float | None = None
) -> tuple[float, float] | tuple[None, None]:
    """Mean rates over the ``window_s`` seconds of valid spans before ``end_t`` (the points' clock;
    default: the end of the last span).

    A span straddling the window start counts pro rata; time after the last poll is not
    counted (it is unknown, not zero).

    Returns:
        ``(completions_per_s, tokens_per_s)``, or ``(None, None)`` without a span in the window.
    """
    return spans_rate(valid_spans(points), window_s, end_t)


def spans_rate(
    spans: list[Span], window_s: float, end_t: float | None = None
) -> tuple[float, float] | tuple[None, None]:
    """`windowed_rate` of the spans `valid_spans` gave."""
    if not spans:
        return None, None
    start = (spans[-1][1] if end_t is None else end_t) - window_s
    dur = count = tokens = 0.0
    for t0, t1, d_count, d_tokens in spans:
        if t1 <= start:
            continue
        share = (t1 - max(t0, start)) / (t1 - t0)
        dur += t1 - max(t0, start)
        count += share * d_count
        tokens += share * d_tokens
    if dur <= 0:
        return None, None
    return count / dur, tokens / dur


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (Z95 past 120)."""
    if df > 120:
        return Z95
    return T975[max(k for k in T975 if k <= df)]


def batches(spans: list[Span]) -> list[tuple[float, float, float]]:
    """Consecutive spans pooled into about n^(1/3) batches: (duration, completions, tokens) each.

    Few, long batches: a batch must outlast the rate's drift for batches to be nearly
    independent (on drifting test series, sqrt(n) batches covered 72-87%, n^(1/3) 88-94%)."""
    n = len(spans)
    k = max(2, math.ceil(n ** (1 / 3) - 1e-9)) if n >= 4 else n
    out = []
    for b in range(k):
        part = spans[b * n // k : (b + 1) * n // k]
        out.append((sum([s[1] - s[0] for s in part]), sum([s[2] for s in part]), sum([s[3] for s in part])))
    return out


def ratio_rate(
    spans: list[Span], index: int, pooled: list[tuple[float, float, float]] | None = None
) -> tuple[float, float] | None:
    """(rate, variance) of delta[index] / duration over one node's spans (ratio estimator).

    The variance is by batch means: neighbouring polls of a live run are alike (rates drift
    slowly), so treating spans as independent gives an interval far too narrow. Consecutive
    spans are pooled into about n^(1/3) batches, long enough to be nearly independent, and
    the ratio estimator's variance comes from the spread between batches, inflated by
    (t / z)^2 for its few degrees of freedom, so Z95 * sqrt(variance) is a t interval
    (infinite with fewer than two batches). `pooled`: batches(spans), when the caller has them.
    """
    dur = sum([s[1] - s[0] for s in spans])
    if dur <= 0:
        return None
    rate = sum([s[index] for s in spans]) / dur
    pooled = batches(spans) if pooled is None else pooled
    k = len(pooled)
    if k < 2:
        return rate, math.inf
    j = index - 1  # (duration, completions, tokens): spans' index 2 -> 1, 3 -> 2
    resid = sum((b[j] - rate * b[0]) ** 2 for b in pooled)
    return rate, k / (k - 1) * resid / dur**2 * (t975(k - 1) / Z95) ** 2


def window_rates(
    points: list[Point], window_s: float, end_t: float | None = None
) -> tuple[float | None, float | None, float | None]:
    """`windowed_rate`'s (completions/s, tokens/s) with the completions rate's batch-means
    variance (`ratio_rate`), from one pass over the window's spans; (None, None, None) without one."""
    return spans_window_rates(valid_spans(points), window_s, end_t)


def spans_window_rates(
    spans: list[Span], window_s: float, end_t: float | None = None
) -> tuple[float | None, float | None, float | None]:
    """`window_rates` of the spans `valid_spans` gave."""
    spans = spans_in_window(spans, window_s, end_t)
    found = ratio_rate(spans, 2)
    if found is None:
        return None, None, None
    return found[0], sum([s[3] for s in spans]) / sum([s[1] - s[0] for s in spans]), found[1]


def counter_rate(samples: list[tuple[float, float]]) -> float | None:
    """Per-second rate of a Prometheus counter from ``(t_unix, value)`` samples.

    A drop in value is a counter reset (server restart): the new value is the increase since
    the reset, as in PromQL ``rate()``.

    Returns:
        Increase / elapsed seconds, or None with fewer than two samples or no elapsed time.
    """
    ordered = sorted((t, v) for t, v in samples if v is not None and not math.isnan(v))
    if len(ordered) < 2 or ordered[-1][0] <= ordered[0][0]:
        return None
    increase = 0.0
    for (_t0, v0), (_t1, v1) in pairwise(ordered):
        increase += v1 - v0 if v1 >= v0 else v1
    return increase / (ordered[-1][0] - ordered[0][0])


def progress(done: int, target: int | None) -> float | None:
    """Share of the target done, clipped to [0, 1]; None without a positive target."""
    if not target or target <= 0 or done is None:
        return None
    return min(1.0, max(0.0, done / target))


def eta_seconds(done: int, target: int | None, completions_per_s: float | None) -> float | None:
    """Seconds until ``target`` completions at the current rate.

    Returns:
        0.0 when the target is reached; None without a target or a positive rate.
    """
    if not target or target <= 0 or done is None:
        return None
    remaining = target - done
    if remaining <= 0:
        return 0.0
    if not completions_per_s or completions_per_s <= 0:
        return None
    return remaining / completions_per_s


def eta_interval(
    done: int, target: int | None, completions_per_s: float | None, variance: float | None
) -> tuple[float, float] | None:
    """The 95% interval of `eta_seconds` from its rate's (rate ± Z95·sd): the remaining work is
    exact, the rate an estimate. The upper end is infinite when the rate's interval reaches 0.

    Returns:
        (0, 0) when the target is reached; None without an ETA or a variance.
    """
    eta = eta_seconds(done, target, completions_per_s)
    if eta is None or variance is None:
        return None
    if eta == 0:
        return 0.0, 0.0
    assert target is not None and completions_per_s is not None
    sd = math.sqrt(variance) if math.isfinite(variance) else math.inf
    hi_rate, lo_rate = completions_per_s + Z95 * sd, completions_per_s - Z95 * sd
    remaining = target - done
    return remaining / hi_rate, remaining / lo_rate if lo_rate > 0 else math.inf


def tokens_per_joule(tokens_per_s: float | None, power_w: float | None) -> float | None:
    """Energy efficiency in tokens per joule (tokens/s divided by watts); None if unknown."""
    if tokens_per_s is None or not power_w or power_w <= 0:
        return None
    return tokens_per_s / power_w


class EtaChange(NamedTuple):
    """The ETA now and with more tokens per completion (seconds; None without an ETA now)."""

    eta_s_now: float | None
    eta_s_new: float | None
    delta_s: float | None
    delta_s_interval: tuple[float, float] | None


def eta_change(
    eta_s_now: float | None,
    mean_tokens_now: float | None,
    extra_tokens_per_completion: float | None,
    extra_tokens_interval: Sequence[float] | None = None,
) -> EtaChange:
    """`eta_seconds` (the one ETA) with each completion `extra_tokens_per_completion` longer.

    At the same token throughput a completion takes time in proportion to its tokens, so the
    ETA scales by (mean + extra) / mean. The change is linear in the extra tokens: its interval
    is the extra tokens' interval scaled (the rate is measured, not modelled).
    """
    if eta_s_now is None or not mean_tokens_now or mean_tokens_now <= 0:
        return EtaChange(eta_s_now, None, None, None)
    per_token = eta_s_now / mean_tokens_now
    extra = extra_tokens_per_completion or 0.0
    lo, hi = extra_tokens_interval or (extra, extra)
    return EtaChange(eta_s_now, eta_s_now + extra * per_token, extra * per_token, (lo * per_token, hi * per_token))
