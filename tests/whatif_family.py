"""A broad family of generated length distributions with known truth, for the what-if (#19).

Each shape is a natural-length distribution (a draw and its exact survival S(t)); a case cuts it
at the ceiling C where S(C) equals a chosen censoring share and asks about 2 C, so the truth
S(2 C) and the extra tokens integral_C^2C S(t) dt are known exactly.  Used by
tests/test_whatif_family.py (few shapes, small n) and bench/whatif.py (all shapes, 30,000).
"""

from __future__ import annotations

import math
import random

from runhealth.analysis.stats import LengthHist


def _ln_sf(median, sigma):
    mu = math.log(median)
    return lambda t: 0.5 * math.erfc((math.log(max(t, 1e-9)) - mu) / (sigma * math.sqrt(2)))


def _erlang_sf(k, theta):
    return lambda t: math.exp(-t / theta) * sum((t / theta) ** j / math.factorial(j) for j in range(k))


def _mix(parts):
    """Mixture of ``(weight, draw, sf)`` parts."""

    def draw(rng):
        u, acc = rng.random(), 0.0
        for w, d, _sf in parts:
            acc += w
            if u < acc:
                return d(rng)
        return parts[-1][1](rng)

    return draw, lambda t: sum(w * sf(t) for w, _d, sf in parts)


def _ln(median, sigma):
    return (lambda r: r.lognormvariate(math.log(median), sigma)), _ln_sf(median, sigma)


def _gamma(k, theta):
    return (lambda r: r.gammavariate(k, theta)), _erlang_sf(k, theta)


def _lomax(scale, alpha):
    return ((lambda r: scale * ((1.0 - r.random()) ** (-1.0 / alpha) - 1.0)), lambda t: (1.0 + t / scale) ** -alpha)


SHAPES = {
    "gamma": _gamma(3, 900.0),
    "log-normal narrow": _ln(1500, 0.5),
    "log-normal wide": _ln(1500, 1.2),
    "Weibull": ((lambda r: r.weibullvariate(2800.0, 1.5)), lambda t: math.exp(-((t / 2800.0) ** 1.5))),
    "log-logistic": (
        (lambda r: 2400.0 * (lambda u: (u / (1 - u)) ** (1 / 3.0))(r.random())),
        lambda t: 1 / (1 + (t / 2400.0) ** 3),
    ),
    "Pareto tail": _lomax(1000.0, 2.5),
    "bimodal": _mix([(0.6, *_ln(600, 0.5)), (0.4, *_ln(3000, 0.7))]),
    "bimodal narrow upper": _mix([(0.7, *_ln(500, 0.6)), (0.3, *_ln(3000, 0.25))]),
    "reasoning mixture": _mix([(0.5, *_ln(800, 0.6)), (0.5, *_gamma(4, 800.0))]),
}
SHARES = (0.01, 0.05, 0.15, 0.40)


def ceiling_for(sf, share: float) -> int:
    """The integer ceiling C with S(C) closest to ``share`` (bisection on the monotone S)."""
    lo, hi = 1.0, 1e7
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if sf(mid) > share else (lo, mid)
    return max(2, round(lo))


def integral(f, lo, hi, steps=4000):
    h = (hi - lo) / steps
    return sum(f(lo + (i + 0.5) * h) for i in range(steps)) * h


def case(shape: str, share: float, n: int, seed: int, ratio: float = 2.0) -> dict:
    """A censored run and its truth: ``{"hist", "ceiling", "limit", "share", "extra"}``."""
    draw, sf = SHAPES[shape]
    ceiling = ceiling_for(sf, share)
    limit = int(ceiling * ratio)
    rng = random.Random(f"{shape}:{share}:{seed}")
    hist = LengthHist()
    for _ in range(n):
        t = max(1, math.ceil(draw(rng)))
        hist.add(min(t, ceiling), "length" if t >= ceiling else "stop")
    return {
        "hist": hist,
        "ceiling": ceiling,
        "limit": limit,
        "share": sf(limit),
        "extra": integral(sf, ceiling, limit),
        "current": sf(ceiling),
    }
