"""Tests for runhealth.analysis.rates on scripted poll sequences whose true rates are known."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from runhealth.analysis.rates import (
    counter_rate,
    eta_seconds,
    progress,
    tokens_per_joule,
    windowed_rate,
)
from runhealth.rules import activity


def scripted_node(clock_offset_s, completions_per_s, tokens_per_completion):
    """A node producing at a constant rate, polled every 5 s (node clock), with:
    - a backfill poll first (index of 50,000 existing completions),
    - a missed poll (t=30 never arrives; the next delta spans 10 s),
    - a dashboard restart (no polls 50..60, then a rescan backfill poll at 60).
    """

    def poll(t, span_s, backfill=False):
        count = completions_per_s * span_s
        return (clock_offset_s + t, count, count * tokens_per_completion, backfill)

    points = [poll(0, 0, backfill=True)]
    points[0] = (clock_offset_s, 50000, 50000 * 2000, True)
    points += [poll(t, 5) for t in (5, 10, 15, 20, 25)]
    points.append(poll(35, 10))  # missed poll at 30
    points += [poll(t, 5) for t in (40, 45, 50)]
    points.append((clock_offset_s + 60, 90000, 9e7, True))  # restart: rescan backfill
    points += [poll(t, 5) for t in (65, 70, 75, 80)]
    return points


def test_scripted_sequence_recovers_the_true_rates():
    points = scripted_node(0.0, 10.0, 2000)
    for cps, tps in (windowed_rate(points, 300), windowed_rate(points, 60), windowed_rate(points, 12)):
        assert math.isclose(cps, 10.0) and math.isclose(tps, 20000.0)


def test_poll_order_does_not_matter_and_too_little_data_gives_none():
    points = scripted_node(0.0, 4.0, 100)
    assert windowed_rate(list(reversed(points)), 60) == windowed_rate(points, 60)
    assert windowed_rate([], 60) == (None, None)
    assert windowed_rate([(1.0, 10, 10, True), (2.0, 10, 10, True)], 60) == (None, None)
    assert windowed_rate([(5.0, 10, 10, False)], 60) == (None, None)


def test_clock_going_backwards_restarts_the_interval():
    points = [
        (100.0, 0, 0, True),
        (110.0, 50, 500, False),
        (20.0, 999, 999, False),  # node clock stepped back (NTP / reboot)
        (30.0, 50, 500, False),
    ]
    assert windowed_rate(points, 1000) == (5.0, 50.0)


def test_the_one_tok_s_sums_nodes_each_on_its_own_clock():
    """runhealth.rules.activity's live rate (the one tok/s): each node over the last minute of its own
    clock, ending now, summed; a node's clock offset cancels out."""
    base = 1.7e9

    def rows(offset_s, cps, tokens_per_completion):  # dashboard time = node time - offset
        return [(t - offset_s, t, c, k, b) for t, c, k, b in scripted_node(base + offset_s, cps, tokens_per_completion)]

    by_node = {
        "gpu-1": rows(1.7, 10.0, 2000),  # node clock ~ dashboard
        "gpu-2": rows(-3600, 5.0, 1000),  # an hour behind
        "gpu-3": rows(86400, 2.0, 3000),  # a day ahead
        "gpu-4": [],  # not polled yet
    }
    out = activity.run_rates(by_node, now=base + 80)
    assert math.isclose(out.tokens_per_s_1m, 20000 + 5000 + 6000)
    assert math.isclose(out.completions_per_s_15m, 17.0)
    assert out.per_node["gpu-4"].tokens_per_s_1m is None
    assert activity.run_rates({}, now=base).tokens_per_s_1m is None


def test_counter_rate_handles_a_reset():
    # 10/s throughout; the server restarted just after t=20 (counter back to 0).
    samples = [(0.0, 0.0), (10.0, 100.0), (20.0, 200.0), (30.0, 100.0), (40.0, 200.0)]
    assert counter_rate(samples) == 10.0
    assert counter_rate(samples[:1]) is None and counter_rate([]) is None
    assert counter_rate([(5.0, 1.0), (5.0, 2.0)]) is None
    assert counter_rate([(0.0, 1.0), (1.0, float("nan")), (2.0, 5.0)]) == 2.0


def test_progress_eta_and_efficiency():
    assert progress(450, 1000) == 0.45 and progress(1200, 1000) == 1.0
    assert progress(5, 0) is None and progress(5, None) is None
    assert eta_seconds(400, 1000, 2.0) == 300.0
    assert eta_seconds(1000, 1000, None) == 0.0
    assert eta_seconds(10, 1000, 0.0) is None and eta_seconds(10, None, 1.0) is None
    assert tokens_per_joule(7000.0, 700.0) == 10.0
    assert tokens_per_joule(7000.0, None) is None and tokens_per_joule(None, 700.0) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.5, 120.0), min_size=1, max_size=30), st.floats(0.1, 500.0), st.floats(-1e9, 1e9))
def test_constant_rate_is_recovered_whatever_the_poll_gaps(gaps_s, rate, offset_s):
    points, t = [(offset_s, 123456, 1e9, True)], offset_s
    for gap in gaps_s:
        t += gap
        points.append((t, rate * gap, 3 * rate * gap, False))
    cps, tps = windowed_rate(points, 100)
    assert math.isclose(cps, rate, rel_tol=1e-6) and math.isclose(tps, 3 * rate, rel_tol=1e-6)
