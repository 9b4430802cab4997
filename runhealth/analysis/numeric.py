"""Small numerical tools for the what-if fits: special functions, an optimiser, resampling.

Pure Python (math and random only) on purpose: the fits run on page render over a count
table of a few thousand cells, where these are fast enough and a SciPy dependency is not
worth its weight.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

_BIG = 1e300
_LOG_2PI = math.log(2 * math.pi)


def log_norm_sf(z: float) -> float:
    """log P(Z >= z) for a standard normal, accurate far into the tail."""
    if z < 25.0:
        value = 0.5 * math.erfc(z / math.sqrt(2.0))
        return math.log(value) if value > 0 else -745.0
    return -0.5 * z * z - math.log(z) - 0.5 * _LOG_2PI + math.log1p(-1.0 / (z * z))


def log_gamma_sf(a: float, x: float) -> float:
    """log Q(a, x), the regularized upper incomplete gamma (series / Lentz continued fraction)."""
    if x <= 0:
        return 0.0
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1.0
            term *= x / ap
            total += term
            if term < total * 1e-15:
                break
        p = math.exp(log_prefix + math.log(total))
        return math.log1p(-p) if p < 1.0 else -745.0
    b, c, d = x + 1.0 - a, 1e300, 1.0 / (x + 1.0 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = b + an / c
        c = c if abs(c) > 1e-300 else 1e-300
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return log_prefix + math.log(h)


def nelder_mead(
    f: Callable[[list[float]], float],
    x0: Sequence[float],
    step: float = 0.3,
    max_evals: int = 600,
    tol: float = 1e-10,
) -> tuple[list[float], float]:
    """Minimise ``f`` from ``x0`` (standard Nelder-Mead); returns ``(x_best, f_best)``."""
    dim = len(x0)
    simplex = [list(x0)] + [[x0[j] + (step if j == i else 0.0) for j in range(dim)] for i in range(dim)]
    values = [f(p) for p in simplex]
    evals = dim + 1
    while evals < max_evals:
        order = sorted(range(dim + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tol * (1.0 + abs(values[0])):
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / dim for j in range(dim)]
        worst = simplex[-1]

        def along(coef: float, centroid: list[float] = centroid, worst: list[float] = worst) -> list[float]:
            return [c + coef * (c - w) for c, w in zip(centroid, worst, strict=True)]

        reflected = along(1.0)
        f_r = f(reflected)
        evals += 1
        if f_r < values[0]:
            expanded = along(2.0)
            f_e = f(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, f_e) if f_e < f_r else (reflected, f_r)
        elif f_r < values[-2]:
            simplex[-1], values[-1] = reflected, f_r
        else:
            contracted = along(0.5 if f_r < values[-1] else -0.5)
            f_c = f(contracted)
            evals += 1
            if f_c < min(f_r, values[-1]):
                simplex[-1], values[-1] = contracted, f_c
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (p - b) for b, p in zip(best, q, strict=True)] for q in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
                evals += dim
    i = min(range(dim + 1), key=values.__getitem__)
    return simplex[i], values[i]


# ---------------------------------------------------------------- the count table, compressed


def integrate(ratio: Callable[[float], float], lo: float, hi: float, intervals: int = 64) -> float:
    """Simpson's rule for ``integral_lo^hi ratio(t) dt``."""
    h = (hi - lo) / intervals
    total = ratio(lo) + ratio(hi)
    for i in range(1, intervals):
        total += (4 if i % 2 else 2) * ratio(lo + i * h)
    return total * h / 3.0


def binomial(rng: random.Random, n: int, p: float) -> int:
    """One binomial draw: normal approximation when n p (1 - p) > 25, else waiting times."""
    if n <= 0 or p <= 0.0:
        return 0
    if p >= 1.0:
        return n
    if n * p * (1 - p) > 25.0:
        return min(n, max(0, round(rng.gauss(n * p, math.sqrt(n * p * (1 - p))))))
    if p > 0.5:
        return n - binomial(rng, n, 1.0 - p)
    log_q, pos, hits = math.log1p(-p), 0, -1
    while pos <= n:
        pos += int(math.log(1.0 - rng.random()) / log_q) + 1
        hits += 1
    return hits


def multinomial(rng: random.Random, n: int, counts: list[float]) -> list[int]:
    """Resample ``n`` draws over cells with probabilities proportional to ``counts``."""
    left_n, left_w, out = n, float(sum(counts)), []
    for w in counts:
        draw = binomial(rng, left_n, w / left_w) if left_w > 0 else 0
        out.append(draw)
        left_n -= draw
        left_w -= w
    return out
