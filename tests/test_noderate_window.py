"""activity.node_rate reads only the polls its windows can hold (#42 item 3): the rates a node's
hour of polls gives are exactly those of every poll read, on clocks that step and with backfill.

The reference below is node_rate as it was before, over every poll: the rates over the whole
list of points. Exact equality, not approximate: a span that ends before the window starts adds
nothing to any sum, so leaving it out must not change a single bit."""

from __future__ import annotations

import random

import pytest

from runhealth.analysis import rates
from runhealth.rules import activity


def every_poll(rows: list[tuple], now: float, window_s: float, average_s: float) -> tuple:
    times = activity.bridged_times(rows)
    points = [(t, r[2] or 0, r[3] or 0, bool(r[4])) for t, r in zip(times, rows, strict=True)]
    _, tps_1m = rates.windowed_rate(points, window_s, now)
    cps, tps, var = rates.window_rates(points, average_s, now)
    return tps_1m, tps, cps, var


def hour_of_polls(rng: random.Random, steps: bool) -> list[tuple]:
    """An hour of 10 s polls (ts, node_ts, completions, tokens, backfill, prompts, interval_s)."""
    rows, ts, node_ts = [], 1_000_000.0, 2_000_000.0
    for k in range(360):
        gap = 10.0 + rng.uniform(-0.5, 0.5)
        ts += gap
        node_ts += gap
        mono: float | None = gap
        if steps and rng.random() < 0.03:  # a wall clock stepped (either one, either way)
            jump = rng.choice([-600.0, -30.0, 45.0, 900.0])
            if rng.random() < 0.5:
                ts += jump
            else:
                node_ts += jump
            mono = None if rng.random() < 0.5 else gap  # the monotonic measure known, or not
        node = None if rng.random() < 0.02 else node_ts
        n = 0 if rng.random() < 0.1 else rng.randint(1, 60)
        rows.append((ts, node, n, n * rng.randint(300, 4000), k == 0 or rng.random() < 0.02, None, mono))
    return rows


@pytest.mark.parametrize("steps", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_rates_over_the_window_equal_rates_over_every_poll(seed, steps):
    rng = random.Random(seed)
    rows = hour_of_polls(rng, steps)
    for now in (rows[-1][0] + 3.0, rows[-1][0] - 1200.0, rows[0][0] + 100.0):
        for window_s, average_s in ((60.0, 900.0), (20.0, 300.0), (3600.0, 60.0)):
            found = activity.node_rate(rows, now, window_s, average_s)
            want = every_poll(rows, now, window_s, average_s)
            got = (
                found.tokens_per_s_1m,
                found.tokens_per_s_15m,
                found.completions_per_s_15m,
                found.completions_var_15m,
            )
            assert got == want, (seed, steps, now, window_s, average_s)
            assert found.last_growth_unix == [r[0] for r in rows if r[2] > 0][-1]  # the last poll that grew


def test_a_clock_that_goes_back_reads_every_poll():
    """Bridged times that decrease (both wall clocks stepped back 10 min, no monotonic measure):
    polls early in the list lie inside the window again, so the rates read every poll (the
    window's polls found by bisection would leave them out: 59.7 tok/s, not 54.2)."""
    rows = [(1000.0 + 10 * k, 5000.0 + 10 * k, 5, 500 + k, k == 0, None, None) for k in range(100)]
    rows = rows[:50] + [(r[0] - 600.0, r[1] - 600.0, *r[2:]) for r in rows[50:]]
    times = activity.bridged_times(rows)
    assert any(b < a for a, b in zip(times, times[1:], strict=False))  # the case under test
    now = rows[-1][0] + 5.0
    found = activity.node_rate(rows, now, 60.0, 300.0)
    want = every_poll(rows, now, 60.0, 300.0)
    assert (found.tokens_per_s_1m, found.tokens_per_s_15m, found.completions_per_s_15m) == want[:3]
    assert round(want[0], 1) == 54.2
