"""Two runs side by side: run B (e.g. a relaunch at a higher max_tokens) against run A.

Pure core for `runhealth compare` (and a later Compare page): the differences B - A with 95%
intervals, a one-sentence "B vs A" summary, and the check of A's what-if forecast against what
B measured at B's ceiling.

Intervals:
- truncated share (at the ceiling): Newcombe's hybrid score interval (his method 10), built from
  the two Wilson intervals; it keeps its coverage near 0% and 100%, where a Wald interval fails.
- mean tokens: a Welch (normal) interval from the two sample variances; the relative change
  ("31% longer") is the ratio of means with the same interval divided by A's mean (A's mean is
  measured on hundreds of completions or more, so its own spread is small beside the change).
- percentiles: the distribution-free order-statistic interval of each run's percentile
  (binomial ranks), combined the Newcombe way; approximate, and labelled so.

The forecast assumes B's prompts come from the same distribution as A's: B measures the lengths
A's what-if extrapolated only if the same kind of prompts were asked.  Nothing here can check
that, so every output says it.
"""

from __future__ import annotations

import math
from typing import TypedDict

from runhealth.analysis import stats, whatif
from runhealth.analysis.stats import LengthHist, Summary, length_source, wilson_interval

Z95 = 1.959964
SAME_PROMPTS = (
    "The forecast assumes B's prompts come from the same distribution as A's; "
    "if they differ, a miss says nothing about the what-if."
)


# The shapes below are `runhealth compare --json`'s too: TypedDicts, so the JSON stays as it is
# while every reader's keys are checked.
class ShareDiff(TypedDict):
    a: float  # shares, 0..1
    b: float
    difference: float  # b - a
    interval: list[float]  # 95%, [lo, hi]


class MeanDiff(TypedDict):
    a: float  # mean tokens per completion
    b: float
    difference: float
    interval: list[float]
    relative: float | None  # difference / a
    relative_interval: list[float] | None


class PercentileDiff(TypedDict):
    a: int  # tokens
    b: int
    difference: int
    interval: list[float]  # approximate
    at_ceiling: list[str]  # "a", "b": whose value is only a lower bound


class Differences(TypedDict):
    truncated_fraction: ShareDiff
    mean_tokens: MeanDiff | None
    p50: PercentileDiff | None
    p90: PercentileDiff | None
    p99: PercentileDiff | None


class Forecast(TypedDict):
    limit: int  # B's ceiling, tokens
    predicted_fraction: float
    interval: list[float]
    interval_note: str  # the loop term, said beside the interval ("" when none)
    measured_fraction: float
    inside: bool
    measured_interval: list[float]
    model: str | None  # the what-if's model (set whenever a forecast is made)
    predicted_extra_tokens: float | None
    predicted_extra_tokens_interval: list[float]
    measured_extra_tokens: float | None
    assumes_same_prompts: bool


def newcombe_diff(k_a: int, n_a: int, k_b: int, n_b: int) -> ShareDiff:
    """Share difference p_b - p_a with Newcombe's hybrid score 95% interval."""
    p_a = k_a / n_a if n_a else 0.0
    p_b = k_b / n_b if n_b else 0.0
    lo_a, hi_a = wilson_interval(k_a, n_a)
    lo_b, hi_b = wilson_interval(k_b, n_b)
    d = p_b - p_a
    lo = d - math.sqrt((p_b - lo_b) ** 2 + (hi_a - p_a) ** 2)
    hi = d + math.sqrt((hi_b - p_b) ** 2 + (p_a - lo_a) ** 2)
    return {"a": p_a, "b": p_b, "difference": d, "interval": [max(-1.0, lo), min(1.0, hi)]}


def _moments(pairs: list[tuple[int, int]]) -> tuple[int, float, float]:
    """(n, mean, sample variance) of (tokens, count) pairs."""
    n = sum(c for _t, c in pairs)
    if n == 0:
        return 0, 0.0, 0.0
    mean = sum(t * c for t, c in pairs) / n
    var = sum(c * (t - mean) ** 2 for t, c in pairs) / (n - 1) if n > 1 else 0.0
    return n, mean, var


def mean_diff(pairs_a: list[tuple[int, int]], pairs_b: list[tuple[int, int]]) -> MeanDiff | None:
    """Mean tokens per completion, B - A, with a Welch 95% interval and the relative change."""
    n_a, m_a, v_a = _moments(pairs_a)
    n_b, m_b, v_b = _moments(pairs_b)
    if not n_a or not n_b:
        return None
    d = m_b - m_a
    half = Z95 * math.sqrt(v_a / n_a + v_b / n_b)
    rel = d / m_a if m_a else None
    rel_iv = [(d - half) / m_a, (d + half) / m_a] if m_a else None
    return {
        "a": m_a,
        "b": m_b,
        "difference": d,
        "interval": [d - half, d + half],
        "relative": rel,
        "relative_interval": rel_iv,
    }


def quantile_interval(pairs: list[tuple[int, int]], q: float) -> tuple[int, int, int] | None:
    """(point, lo, hi): the nearest-rank q-quantile (0 < q < 1) and its order-statistic 95% interval."""
    n = sum(c for _t, c in pairs)
    if n == 0:
        return None
    half = Z95 * math.sqrt(n * q * (1 - q))
    ranks = (math.ceil(q * n - 1e-9), math.floor(q * n - half), math.ceil(q * n + half) + 1)
    point, lo, hi = (stats.value_at_rank(pairs, min(n, max(1, r))) for r in ranks)
    return point, lo, hi


def percentile_diff(pairs_a, pairs_b, q: float, ceilings=(None, None)) -> PercentileDiff | None:
    """Percentile B - A with an approximate 95% interval (the two order-statistic intervals combined).

    A percentile at its run's ceiling is only a lower bound (those completions were cut):
    ``at_ceiling`` names the runs ("a", "b") where that is so.
    """
    a, b = quantile_interval(pairs_a, q), quantile_interval(pairs_b, q)
    if a is None or b is None:
        return None
    d = b[0] - a[0]
    lo = d - math.sqrt((b[0] - b[1]) ** 2 + (a[2] - a[0]) ** 2)
    hi = d + math.sqrt((b[2] - b[0]) ** 2 + (a[0] - a[1]) ** 2)
    cut = [
        name for name, value, c in (("a", a[0], ceilings[0]), ("b", b[0], ceilings[1])) if c is not None and value >= c
    ]
    return {"a": a[0], "b": b[0], "difference": d, "interval": [lo, hi], "at_ceiling": cut}


def differences(hist_a: LengthHist, sum_a: Summary, hist_b: LengthHist, sum_b: Summary) -> Differences:
    """B - A for the truncated share (each at its own ceiling), mean, median, P90 and P99."""
    pairs_a, pairs_b = length_source(hist_a)[0].length_pairs(), length_source(hist_b)[0].length_pairs()
    ceilings = (sum_a.ceiling_tokens, sum_b.ceiling_tokens)
    return {
        "truncated_fraction": newcombe_diff(sum_a.at_ceiling, sum_a.length_count, sum_b.at_ceiling, sum_b.length_count),
        "mean_tokens": mean_diff(pairs_a, pairs_b),
        "p50": percentile_diff(pairs_a, pairs_b, 0.5, ceilings),
        "p90": percentile_diff(pairs_a, pairs_b, 0.9, ceilings),
        "p99": percentile_diff(pairs_a, pairs_b, 0.99, ceilings),
    }


def forecast_check(
    hist_a: LengthHist,
    sum_a: Summary,
    hist_b: LengthHist,
    sum_b: Summary,
    bootstrap: int = whatif.BOOTSTRAP,
    loop_sample: tuple[int, int] | None = None,
) -> tuple[Forecast | None, str]:
    """A's what-if (whatif.for_run, with A's loop sample: the same interval A's Output lengths
    page shows at that limit) at B's ceiling against B's measured share still cut there.

    Returns:
        ``(forecast, note)``; forecast is None (note says why) when B's ceiling is not above
        A's, either is unknown, or A's tail cannot be modelled.  ``inside`` is the measured
        share (a point) within the predicted interval; B's own sampling interval is given too.
    """
    c_a, c_b = sum_a.ceiling_tokens, sum_b.ceiling_tokens
    if c_a is None or c_b is None:
        return None, "no forecast check: a run's ceiling is unknown (pass --ceiling-a / --ceiling-b)"
    if c_b <= c_a:
        return None, f"no forecast check: B's ceiling ({c_b:,}) is not above A's ({c_a:,})"
    w = whatif.for_run(hist_a, c_a, c_b, loop_sample, bootstrap)
    outcome = whatif.forecast_outcome(w, hist_b)
    if outcome is None:
        return None, f"no forecast check: {w.note}"
    mean_a, mean_b = sum_a.tokens.mean, sum_b.tokens.mean
    mean = mean_b - mean_a if sum_a.length_count and mean_a is not None and mean_b is not None else None
    forecast: Forecast = {
        "limit": int(c_b),
        "predicted_fraction": outcome["forecast"],
        "interval": outcome["interval"],
        "interval_note": whatif.loop_note(w),  # said beside the interval, as on the Output lengths page
        "measured_fraction": outcome["observed"],
        "inside": bool(outcome["covered"]),
        "measured_interval": list(wilson_interval(sum_b.at_ceiling, sum_b.length_count)),
        "model": w.model,
        "predicted_extra_tokens": w.extra_tokens_per_completion,
        "predicted_extra_tokens_interval": w.extra_tokens_interval,
        "measured_extra_tokens": mean,
        "assumes_same_prompts": True,
    }
    return forecast, SAME_PROMPTS


def headline(sum_a: Summary, sum_b: Summary, diffs: Differences) -> str:
    """The "B vs A" sentence, e.g. "At 8,192: 2.4% still cut (was 18.0% at 4,096); completions 31% longer"."""

    def at(s: Summary) -> str:
        return f"at {s.ceiling_tokens:,}" if s.ceiling_tokens is not None else "with no ceiling detected"

    share = diffs["truncated_fraction"]
    first = (
        f"{at(sum_b)[0].upper()}{at(sum_b)[1:]}: {100 * share['b']:.1f}% still cut"
        f" (was {100 * share['a']:.1f}% {at(sum_a)})"
    )
    mean = diffs["mean_tokens"]
    if not mean or mean["relative"] is None:
        return first
    rel = mean["relative"]
    word = "longer" if rel >= 0 else "shorter"
    return f"{first}; completions {abs(100 * rel):.0f}% {word}"
