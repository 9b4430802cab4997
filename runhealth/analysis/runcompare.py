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
  (binomial ranks), combined the Newcombe way; approximate, and labelled so. A run's
  percentile (or the end of its interval) at its ceiling is censored: the completions there
  were cut, so the true value is only known to be at least the ceiling. Then the difference
  has one side only: with A's censored, B - A is at most a bound (no lower end), with B's at
  least one; with both, nothing is measured. Never a two-sided interval past a bound.
- the uncut lengths: when the ceilings differ, the completions below the lower ceiling (cut in
  neither run) are compared (their share, Newcombe; their mean, Welch), so the headline can
  say whether a change in mean length is all in the completions no longer cut.

The forecast assumes B's prompts come from the same distribution as A's: B measures the lengths
A's what-if extrapolated only if the same kind of prompts were asked.  Nothing here can check
that, so every output says it.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import TypedDict

from runhealth.analysis import stats, whatif
from runhealth.analysis.stats import LengthHist, Summary, length_source, wilson_interval

Z95 = 1.959964
Z95_ONE_SIDED = 1.644854  # a one-sided 95% bound
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
    difference: int  # b - a; with `bound` "at most"/"at least", a bound itself
    bound: str  # "" (a measurement), "at most", "at least", or "not measurable" (both censored)
    interval: list[float | None]  # approximate 95% [lo, hi]; None: no bound on that side
    at_ceiling: list[str]  # "a", "b": whose value is only a lower bound


class UncutDiff(TypedDict):
    below: int  # tokens: the lower of the two ceilings; completions below it were cut in neither run
    share: ShareDiff  # share of each run's completions below it
    mean: MeanDiff  # their mean tokens
    unchanged: bool  # both intervals hold 0: no change measured in the uncut lengths


class Differences(TypedDict):
    truncated_fraction: ShareDiff
    mean_tokens: MeanDiff | None
    p50: PercentileDiff | None
    p90: PercentileDiff | None
    p99: PercentileDiff | None
    uncut: UncutDiff | None  # None unless both ceilings are known and differ


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


def quantile_interval(pairs: list[tuple[int, int]], q: float, z: float = Z95) -> tuple[int, int, int] | None:
    """(point, lo, hi): the nearest-rank q-quantile (0 < q < 1) and its order-statistic interval
    (95% two-sided at the default `z`; each end a 95% one-sided bound at Z95_ONE_SIDED)."""
    n = sum(c for _t, c in pairs)
    if n == 0:
        return None
    half = z * math.sqrt(n * q * (1 - q))
    ranks = (math.ceil(q * n - 1e-9), math.floor(q * n - half), math.ceil(q * n + half) + 1)
    point, lo, hi = (stats.value_at_rank(pairs, min(n, max(1, r))) for r in ranks)
    return point, lo, hi


def percentile_diff(
    pairs_a: list[tuple[int, int]],
    pairs_b: list[tuple[int, int]],
    q: float,
    ceilings: tuple[int | None, int | None] = (None, None),
) -> PercentileDiff | None:
    """Percentile B - A with an approximate 95% interval (the two order-statistic intervals combined).

    A value at its run's ceiling is censored (those completions were cut: the truth is at
    least the ceiling). With A's point there, B - A is "at most" the difference; with B's, "at
    least"; with both, "not measurable". An interval end needs the other run's opposite end
    uncensored: B - A's lower end needs A's upper end below A's ceiling, its upper end B's.
    With one end missing the other is a one-sided 95% bound; with both, two-sided.
    """
    a, b = quantile_interval(pairs_a, q), quantile_interval(pairs_b, q)
    a1, b1 = quantile_interval(pairs_a, q, Z95_ONE_SIDED), quantile_interval(pairs_b, q, Z95_ONE_SIDED)
    if a is None or b is None or a1 is None or b1 is None:
        return None
    c_a, c_b = ceilings
    cut_a, cut_b = (c is not None and v >= c for v, c in ((a[0], c_a), (b[0], c_b)))
    open_a, open_b = (c is not None and v >= c for v, c in ((a[2], c_a), (b[2], c_b)))  # upper end censored
    d = b[0] - a[0]
    interval: list[float | None] = [None, None]
    bound = "not measurable" if cut_a and cut_b else "at most" if cut_a else "at least" if cut_b else ""
    if not (cut_a and cut_b):
        ea, eb = (a1, b1) if open_a or open_b else (a, b)  # one side only: each end a one-sided 95% bound
        if not open_a:
            interval[0] = d - math.sqrt((eb[0] - eb[1]) ** 2 + (ea[2] - ea[0]) ** 2)
        if not open_b:
            interval[1] = d + math.sqrt((eb[2] - eb[0]) ** 2 + (ea[0] - ea[1]) ** 2)
    cut = [name for name, flag in (("a", cut_a), ("b", cut_b)) if flag]
    return {"a": a[0], "b": b[0], "difference": d, "bound": bound, "interval": interval, "at_ceiling": cut}


BOUND_SIGN = {"at most": "≤ ", "at least": "≥ "}
BOTH_AT_CEILING = "both at ceiling"  # a percentile's B - A when both runs' sit at their ceilings
NOT_MEASURABLE = "not measurable"  # ... and its interval


def percentile_texts(p: PercentileDiff) -> tuple[str, str]:
    """(B - A, its 95% interval) as display text, one wording for the page and the CLI:
    "≤ +1,034" beside "≤ +1,120 (one-sided)", never a two-sided interval past a bound."""
    if p["bound"] == "not measurable":
        return BOTH_AT_CEILING, NOT_MEASURABLE
    diff = BOUND_SIGN.get(p["bound"], "") + f"{p['difference']:+,}"
    lo, hi = p["interval"]
    if lo is not None and hi is not None:
        return diff, f"{lo:+,.0f} to {hi:+,.0f} (approx.)"
    if hi is not None:
        return diff, f"≤ {hi:+,.0f} (one-sided, approx.)"
    if lo is not None:
        return diff, f"≥ {lo:+,.0f} (one-sided, approx.)"
    return diff, NOT_MEASURABLE


def uncut_diff(
    pairs_a: list[tuple[int, int]], pairs_b: list[tuple[int, int]], ceilings: tuple[int | None, int | None]
) -> UncutDiff | None:
    """The completions below the lower ceiling, cut in neither run: their share and mean, B - A.

    None unless both ceilings are known and differ (with one ceiling, every length is "uncut").
    """
    c_a, c_b = ceilings
    if c_a is None or c_b is None or c_a == c_b:
        return None
    below = min(c_a, c_b)
    low_a, low_b = ([(t, c) for t, c in pairs if t < below] for pairs in (pairs_a, pairs_b))
    n_a, n_b = (sum(c for _t, c in pairs) for pairs in (pairs_a, pairs_b))
    share = newcombe_diff(sum(c for _t, c in low_a), n_a, sum(c for _t, c in low_b), n_b)
    mean = mean_diff(low_a, low_b)
    if mean is None:
        return None
    holds_zero = all(iv[0] <= 0 <= iv[1] for iv in (share["interval"], mean["interval"]))
    return {"below": below, "share": share, "mean": mean, "unchanged": holds_zero}


def differences(hist_a: LengthHist, sum_a: Summary, hist_b: LengthHist, sum_b: Summary) -> Differences:
    """B - A for the truncated share (each at its own ceiling), mean, median, P90, P99 and the uncut lengths."""
    pairs_a, pairs_b = length_source(hist_a)[0].length_pairs(), length_source(hist_b)[0].length_pairs()
    ceilings = (sum_a.ceiling_tokens, sum_b.ceiling_tokens)
    return {
        "truncated_fraction": newcombe_diff(sum_a.at_ceiling, sum_a.length_count, sum_b.at_ceiling, sum_b.length_count),
        "mean_tokens": mean_diff(pairs_a, pairs_b),
        "p50": percentile_diff(pairs_a, pairs_b, 0.5, ceilings),
        "p90": percentile_diff(pairs_a, pairs_b, 0.9, ceilings),
        "p99": percentile_diff(pairs_a, pairs_b, 0.99, ceilings),
        "uncut": uncut_diff(pairs_a, pairs_b, ceilings),
    }


# A's what-ifs at B's ceiling, by their inputs (A's histogram by its digest): a finished A, the
# pair Compare usually shows, is fitted once instead of at every redraw (~0.1 CPU s each, most of
# a redraw's model; #42 item 2). A few entries: one per pair and limit shown.
_WHATIFS: OrderedDict[tuple, whatif.WhatIf] = OrderedDict()
_WHATIFS_LOCK = threading.Lock()
WHATIF_CACHE_ENTRIES = 8


def _whatif_of(
    hist: LengthHist, ceiling: int, limit: int, loop_sample: tuple[int, int] | None, bootstrap: int
) -> whatif.WhatIf:
    """whatif.for_run(...), reused while the same inputs come again (a pure function of them;
    the WhatIf is only read here)."""
    key = (stats.hist_digest(hist), ceiling, limit, loop_sample, bootstrap)
    with _WHATIFS_LOCK:
        hit = _WHATIFS.get(key)
        if hit is not None:
            _WHATIFS.move_to_end(key)
            return hit
    w = whatif.for_run(hist, ceiling, limit, loop_sample, bootstrap)
    with _WHATIFS_LOCK:
        _WHATIFS[key] = w
        while len(_WHATIFS) > WHATIF_CACHE_ENTRIES:
            _WHATIFS.popitem(last=False)
    return w


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
    w = _whatif_of(hist_a, c_a, c_b, loop_sample, bootstrap)
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
    return f"{first}; completions {abs(100 * rel):.0f}% {word}{_uncut_words(diffs['uncut'], (sum_b.ceiling_tokens or 0) > (sum_a.ceiling_tokens or 0))}"


def _uncut_words(uncut: UncutDiff | None, raised: bool) -> str:
    """What the uncut lengths did: unchanged (the change is all at the ceiling) or their own change."""
    if uncut is None:
        return ""
    if uncut["unchanged"]:
        where = "no longer cut" if raised else "now cut"
        return f", all of it in the ones {where}: the uncut lengths (below {uncut['below']:,}) are unchanged"
    rel = uncut["mean"]["relative"]
    if rel is None:
        return ""
    return f" (the uncut ones, below {uncut['below']:,}: {'+' if rel >= 0 else '−'}{abs(100 * rel):.0f}% in mean)"
