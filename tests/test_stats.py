"""Tests for runhealth.analysis.stats against independent computations on expanded, sorted lists."""

import bisect
import math
import random
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from runhealth.analysis.stats import (
    CDF_POINTS,
    LengthHist,
    TokenStats,
    cdf_points,
    ceiling_drift,
    detect_ceiling,
    histogram,
    percentile_nearest_rank,
    summarize,
    wilson_interval,
)


def simulated_run(seed, n=3000, ceiling=4096, context_stops=30, none_reasons=10):
    """The founding incident in miniature: log-normal lengths cut at max_tokens, a few
    context-window stops scattered below, some lines with no finish_reason."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        t = int(rng.lognormvariate(math.log(1800), 0.9))
        rows.append((ceiling, "length") if t >= ceiling else (max(t, 1), "stop"))
    rows += [(rng.randint(500, ceiling - 1), "length") for _ in range(context_stops)]
    rows += [(rng.randint(1, 3000), None) for _ in range(none_reasons)]
    return rows


def hist_of(rows, estimated=0):
    hist = LengthHist()
    for t, fr in rows:
        hist.add(t, fr, estimated)
    return hist


def reference_percentile(sorted_values, q):
    """Nearest rank, written from the definition: the ceil(q/100 * N)-th smallest value."""
    return sorted_values[max(1, math.ceil(q * len(sorted_values) / 100)) - 1]


def test_summarize_matches_an_independent_computation():
    rows = simulated_run(1)
    summary = summarize(hist_of(rows), ceiling=4096, unparseable=4)
    lengths = sorted(t for t, _fr in rows)
    assert summary.completions == len(rows)
    assert summary.unparseable == 4
    assert summary.finish_reasons == {
        "stop": sum(fr == "stop" for _t, fr in rows),
        "length": sum(fr == "length" for _t, fr in rows),
        "missing": sum(fr is None for _t, fr in rows),
    }
    at_ceiling = sum(fr == "length" and t >= 4096 for t, fr in rows)
    assert summary.at_ceiling == at_ceiling
    assert summary.at_ceiling_fraction == at_ceiling / len(rows)
    assert summary.length_below_ceiling == 30
    assert summary.tokens_total == sum(lengths)
    assert math.isclose(summary.tokens.mean, sum(lengths) / len(lengths))
    for key, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert getattr(summary.tokens, key) == reference_percentile(lengths, q)
    assert summary.tokens.max == lengths[-1]
    assert (summary.ceiling_tokens, summary.ceiling_source) == (4096, "given")
    assert summary.length_source == "completion_tokens"
    assert summary.estimated_count == 0 and summary.exact is True


def test_the_founding_incident_p90_equals_p99_equals_the_ceiling():
    rows = [(4096, "length")] * 18 + [(1000 + i, "stop") for i in range(82)]
    summary = summarize(hist_of(rows))
    assert summary.tokens.p90 == summary.tokens.p99 == 4096
    assert (summary.ceiling_tokens, summary.ceiling_source) == (4096, "detected")
    assert summary.at_ceiling_fraction == 0.18


def test_estimated_lengths_are_kept_apart():
    hist = hist_of([(100, "stop"), (200, "stop")]).merge(hist_of([(9000, "stop")] * 3, 1))
    summary = summarize(hist)
    assert summary.completions == 5
    assert summary.estimated_count == 3
    assert summary.tokens.max == 200
    assert summary.tokens_total == 300
    assert summary.length_source == "completion_tokens"
    only_estimates = summarize(hist.estimated_only())
    assert only_estimates.length_source == "chars/4 estimate"
    assert only_estimates.tokens.p50 == 9000


def test_empty_histogram_gives_zeros_not_exceptions():
    summary = summarize(LengthHist())
    assert summary.completions == 0 and summary.at_ceiling_fraction == 0.0
    assert summary.tokens == TokenStats(mean=None, p50=None, p90=None, p95=None, p99=None, max=None)
    assert summary.to_json()["tokens"] == {
        "mean": None,
        "p50": None,
        "p90": None,
        "p95": None,
        "p99": None,
        "max": None,
    }
    assert summary.ceiling_tokens is None and summary.ceiling_source is None
    assert histogram(LengthHist()) == [] and cdf_points(LengthHist()) == []
    assert percentile_nearest_rank(LengthHist(), 50) is None


def test_hist_rows_merge_and_filters():
    a = LengthHist.from_rows([(10, "stop", 0, 2), (20, None, 1, 1)])
    b = LengthHist.from_rows([(10, "stop", 0, 3), (5, "length", 0, 0)])
    merged = a.merge(b)
    assert merged.rows() == [(10, "stop", 0, 5), (20, None, 1, 1)]
    assert a.total == 3 and merged.total == 6
    assert merged.exact_only().total == 5 and merged.estimated_only().total == 1


def test_detects_4096_and_8192_with_context_stops_scattered_below():
    assert detect_ceiling(hist_of(simulated_run(2, ceiling=4096, context_stops=300))) == 4096
    assert detect_ceiling(hist_of(simulated_run(3, ceiling=8192))) == 8192


def test_no_ceiling_without_a_pile_up():
    scattered = [(1000 + 7 * i, "length") for i in range(50)] + [(500, "stop")] * 100
    assert detect_ceiling(hist_of(scattered)) is None
    assert detect_ceiling(hist_of([(4096, "length")] * 2 + [(10, "stop")])) is None


def test_ceiling_drift_flags_the_misconfigured_node():
    groups = {f"node-{i}": hist_of(simulated_run(10 + i)) for i in range(4)}
    groups["node-4"] = hist_of(simulated_run(20, ceiling=8192))
    assert ceiling_drift(groups) == {"node-4": 8192}
    del groups["node-4"]
    assert ceiling_drift(groups) == {}


def test_wilson_interval_known_values():
    # statsmodels proportion_confint(18, 100, method="wilson") = (0.11700, 0.26667)
    lo, hi = wilson_interval(18, 100)
    assert math.isclose(lo, 0.11700, abs_tol=5e-5) and math.isclose(hi, 0.26667, abs_tol=5e-5)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and math.isclose(hi, 0.27754, abs_tol=5e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_histogram_gives_the_ceiling_its_own_bin():
    rows = simulated_run(4)
    bins = histogram(hist_of(rows))
    spike = [b for b in bins if b[0] == 4096]
    assert spike and spike[0][1] == 4097
    assert spike[0][3] == sum(fr == "length" and t >= 4096 for t, fr in rows)
    assert sum(b[2] + b[3] + b[4] for b in bins) == len(rows)
    assert all(b[0] < b[1] for b in bins) and all(x[1] == y[0] for x, y in pairwise(bins))
    assert len(histogram(hist_of(rows), bin_width=1, max_bins=200)) <= 205


def test_cdf_points_thin_but_keep_the_spike_and_the_end():
    rows = simulated_run(5, n=6000)
    points = cdf_points(hist_of(rows), max_points=300)
    assert len(points) <= 700 and points[-1] == (4096, 1.0)
    below = sum(t < 4096 for t, _fr in rows) / len(rows)
    assert any(math.isclose(f, below) for _t, f in points)
    assert all(a[1] <= b[1] for a, b in pairwise(points))


def test_cdf_points_as_sent_draw_within_a_pixel_of_the_full_curve():
    """The default thinning (stats.CDF_POINTS, #42): drawn as steps, the curve is never more than
    0.25% (a pixel of a 400 px axis) from the full CDF at any distinct length, in far fewer points."""
    hist = hist_of(simulated_run(5, n=20_000))
    full, sent = cdf_points(hist, max_points=10**9), cdf_points(hist)
    assert len(full) > 3 * CDF_POINTS and len(sent) <= CDF_POINTS
    xs = [t for t, _ in sent]
    drawn = [sent[bisect.bisect_right(xs, t) - 1][1] for t, _ in full]  # every full point is at or after xs[0]
    assert max(abs(f - d) for (_t, f), d in zip(full, drawn, strict=True)) < 0.0025


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9000), st.integers(1, 5)), min_size=1, max_size=40), st.floats(0.5, 100.0))
def test_percentile_matches_the_definition(pairs, q):
    hist = LengthHist.from_rows([(t, "stop", 0, n) for t, n in pairs])
    expanded = sorted(t for t, n in pairs for _ in range(n))
    assert percentile_nearest_rank(hist, q) == reference_percentile(expanded, q)
