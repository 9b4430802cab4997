"""Censored fits of a length count table: the models behind the what-if (whatif.py).

Every model gives a tail ratio R(t) = S(t) / S(C) above the ceiling C, fitted by maximum
likelihood with the length stops at the ceiling (and context-window stops below it) as
right-censored observations: a log-normal on the upper half only (left-truncated at the
median), full-data log-normal, gamma, Weibull and log-logistic, a two-component log-normal
mixture (EM, so a second mode near the ceiling is modelled instead of read as a heavy tail), and
an exponential tail.  Pure Python (math only): these run on page render over a few hundred cells.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

from runhealth.analysis.numeric import log_gamma_sf, log_norm_sf, nelder_mead

_LOG_2PI = math.log(2 * math.pi)
_BIG = 1e300

Ratio = Callable[[float], float]  # a tail ratio R(t) = S(t) / S(C), t in tokens
Nll = Callable[[Sequence[float]], float]  # a negative log-likelihood of a model's parameters
CensoredRow = tuple[int, bool, int]  # (tokens, censored: stopped at a length limit, count)

# ---------------------------------------------------------------- count-table fits


class Cells:
    """A count table compressed for fitting: log-binned events, censor points, the ceiling.

    ``ev`` rows are ``[n, sum_y, sum_y2, sum_t]`` with ``y = log(tokens)``; ``cens`` rows are
    ``[n, y]`` (length stops below the ceiling); ``n_ceil`` length stops at the ceiling;
    ``n_other`` completions below the left-truncation point ``log_m`` (not used by the fit).
    """

    def __init__(
        self, ev: list[list[float]], cens: list[list[float]], n_ceil: float, n_other: float, log_m: float | None
    ) -> None:
        self.ev, self.cens, self.n_ceil, self.n_other, self.log_m = ev, cens, n_ceil, n_other, log_m

    @property
    def total(self) -> float:
        return self.n_other + self.n_ceil + sum(e[0] for e in self.ev) + sum(c[0] for c in self.cens)

    def counts(self) -> list[float]:
        return [self.n_other] + [e[0] for e in self.ev] + [c[0] for c in self.cens] + [self.n_ceil]

    def resampled(self, counts: list[int]) -> Cells:
        """Same bins with new counts (bin sums scaled: each bin keeps its mean)."""
        k = len(self.ev)
        ev = [[m, *(s * m / e[0] for s in e[1:])] for e, m in zip(self.ev, counts[1 : k + 1], strict=True)]
        cens = [[m, c[1]] for c, m in zip(self.cens, counts[k + 1 : -1], strict=True)]
        return Cells(ev, cens, counts[-1], counts[0], self.log_m)

    def event_sums(self) -> tuple[float, float, float, float]:
        n, s_y, s_y2, s_t = (float(sum(e[i] for e in self.ev)) for i in range(4))
        return n, s_y, s_y2, s_t


def _log_bins(items: Sequence[tuple[float, float]], lo: float, hi: float, nbins: int) -> list[int]:
    """Group ``(y, n)`` items into ``nbins`` equal bins of ``[lo, hi]``; returns bin index map."""
    width = max((hi - lo) / nbins, 1e-12)
    return [min(nbins - 1, max(0, int((y - lo) / width))) for y, _n in items]


def build_cells(
    rows: Sequence[CensoredRow], ceiling: int, log_m: float | None = None, ev_bins: int = 256, cens_bins: int = 16
) -> Cells:
    """Compress rows ``(tokens, censored, n)``; only tokens >= exp(log_m) enter the fit."""
    m = math.exp(log_m) if log_m is not None else -1.0
    events = [(math.log(max(t, 0.5)), t, n) for t, cz, n in rows if not cz and t >= m]
    cens = [(math.log(max(t, 0.5)), n) for t, cz, n in rows if cz and m <= t < ceiling]
    n_ceil = sum(n for t, cz, n in rows if cz and t >= ceiling)
    used = sum(n for _y, _t, n in events) + sum(n for _y, n in cens) + n_ceil
    n_other = sum(n for _t, _c, n in rows) - used
    ev_out = _bin_events(events, ev_bins)
    cens_out = _bin_cens(cens, cens_bins)
    return Cells(ev_out, cens_out, n_ceil, n_other, log_m)


def _bin_events(events: Sequence[tuple[float, int, int]], nbins: int) -> list[list[float]]:
    if not events:
        return []
    ys = [y for y, _t, _n in events]
    idx = _log_bins([(y, n) for y, _t, n in events], min(ys), max(ys), nbins)
    bins = [[0.0, 0.0, 0.0, 0.0] for _ in range(nbins)]
    for (y, t, n), i in zip(events, idx, strict=True):
        b = bins[i]
        b[0] += n
        b[1] += n * y
        b[2] += n * y * y
        b[3] += n * t
    return [b for b in bins if b[0] > 0]


def _bin_cens(cens: Sequence[tuple[float, int]], nbins: int) -> list[list[float]]:
    if not cens:
        return []
    ys = [y for y, _n in cens]
    idx = _log_bins(cens, min(ys), max(ys), nbins)
    bins = [[0.0, 0.0] for _ in range(nbins)]
    for (y, n), i in zip(cens, idx, strict=True):
        bins[i][0] += n
        bins[i][1] += n * y
    return [[n, sy / n] for n, sy in bins if n > 0]


# ---------------------------------------------------------------- likelihoods and tail ratios


def _ln_nll(cells: Cells, log_c: float, n_ceil: float) -> Nll:
    n_e, s_y, s_y2, _s_t = cells.event_sums()
    n_fit = n_e + n_ceil + sum(c[0] for c in cells.cens)

    def nll(p: Sequence[float]) -> float:
        mu, log_s = p
        if not -8.0 < log_s < 4.0 or not -50.0 < mu < 60.0:
            return _BIG
        s = math.exp(log_s)
        ll = -n_e * (log_s + 0.5 * _LOG_2PI) - (s_y2 - 2 * mu * s_y + mu * mu * n_e) / (2 * s * s)
        ll -= s_y  # Jacobian dy/dt, so the likelihood is a density in tokens (AIC-comparable)
        ll += n_ceil * log_norm_sf((log_c - mu) / s)
        ll += sum(n * log_norm_sf((y - mu) / s) for n, y in cells.cens)
        if cells.log_m is not None:
            ll -= n_fit * log_norm_sf((cells.log_m - mu) / s)
        return -ll

    return nll


def _gamma_nll(cells: Cells, ceiling: float, n_ceil: float) -> Nll:
    n_e, s_y, _s_y2, s_t = cells.event_sums()

    def nll(p: Sequence[float]) -> float:
        log_a, log_th = p
        if not -6.0 < log_a < 8.0 or not -10.0 < log_th < 30.0:
            return _BIG
        a, th = math.exp(log_a), math.exp(log_th)
        ll = (a - 1) * s_y - s_t / th - n_e * (a * log_th + math.lgamma(a))
        ll += n_ceil * log_gamma_sf(a, ceiling / th)
        ll += sum(n * log_gamma_sf(a, math.exp(y) / th) for n, y in cells.cens)
        return -ll

    return nll


def _weibull_nll(cells: Cells, log_c: float, n_ceil: float) -> Nll:
    n_e, s_y, _s_y2, _s_t = cells.event_sums()
    bins = [(e[0], e[1] / e[0]) for e in cells.ev]

    def nll(p: Sequence[float]) -> float:
        log_k, log_l = p
        if not -6.0 < log_k < 5.0 or not -10.0 < log_l < 30.0:
            return _BIG
        k = math.exp(log_k)
        ll = n_e * (log_k - k * log_l) + (k - 1) * s_y
        try:
            ll -= sum(n * math.exp(k * (y - log_l)) for n, y in bins)
            ll -= sum(n * math.exp(k * (y - log_l)) for n, y in cells.cens)
            ll -= n_ceil * math.exp(k * (log_c - log_l))
        except OverflowError:
            return _BIG
        return -ll

    return nll


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _loglogistic_nll(cells: Cells, log_c: float, n_ceil: float) -> Nll:
    n_e, s_y, _s_y2, _s_t = cells.event_sums()
    bins = [(e[0], e[1] / e[0]) for e in cells.ev]

    def nll(p: Sequence[float]) -> float:
        log_b, log_a = p
        if not -6.0 < log_b < 5.0 or not -10.0 < log_a < 30.0:
            return _BIG
        b = math.exp(log_b)
        ll = n_e * (log_b - b * log_a) + (b - 1) * s_y
        ll -= 2 * sum(n * _softplus(b * (y - log_a)) for n, y in bins)
        ll -= sum(n * _softplus(b * (y - log_a)) for n, y in cells.cens)
        ll -= n_ceil * _softplus(b * (log_c - log_a))
        return -ll

    return nll


def _loglogistic_ratio(b: float, log_a: float, ceiling: float) -> Ratio:
    base = _softplus(b * (math.log(ceiling) - log_a))
    return lambda t: math.exp(min(0.0, base - _softplus(b * (math.log(t) - log_a))))


def ln_ratio(mu: float, s: float, ceiling: float) -> Ratio:
    base = log_norm_sf((math.log(ceiling) - mu) / s)
    return lambda t: math.exp(min(0.0, log_norm_sf((math.log(t) - mu) / s) - base))


def _gamma_ratio(a: float, th: float, ceiling: float) -> Ratio:
    base = log_gamma_sf(a, ceiling / th)
    return lambda t: math.exp(min(0.0, log_gamma_sf(a, t / th) - base))


def _weibull_ratio(k: float, lam: float, ceiling: float) -> Ratio:
    base = (ceiling / lam) ** k
    return lambda t: math.exp(min(0.0, base - (t / lam) ** k))


def _moment_start(cells: Cells) -> tuple[float, float]:
    n_e, s_y, s_y2, _s_t = cells.event_sums()
    mean = s_y / n_e
    return mean, math.sqrt(max(s_y2 / n_e - mean * mean, 1e-4))


def fit_full(
    cells: Cells, ceiling: int, n_ceil: float, families: Collection[str] | None = None
) -> dict[str, tuple[float, Ratio]]:
    """Censored MLE of log-normal, gamma, Weibull, log-logistic: ``{family: (aic, ratio)}``
    (only ``families`` when given: the back-test refits the family the full data chose)."""
    log_c = math.log(ceiling)
    mean_y, sd_y = _moment_start(cells)
    mean_t = cells.event_sums()[3] / cells.event_sums()[0]
    s = max(math.log(mean_t) - mean_y, 1e-3)
    shape = (3 - s + math.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)
    k0 = math.pi / (sd_y * math.sqrt(6))
    fits = {}
    for family, nll, start, make in (
        (
            "log-normal",
            _ln_nll(cells, log_c, n_ceil),
            [mean_y, math.log(sd_y)],
            lambda p: ln_ratio(p[0], math.exp(p[1]), ceiling),
        ),
        (
            "gamma",
            _gamma_nll(cells, ceiling, n_ceil),
            [math.log(shape), math.log(mean_t / shape)],
            lambda p: _gamma_ratio(math.exp(p[0]), math.exp(p[1]), ceiling),
        ),
        (
            "Weibull",
            _weibull_nll(cells, log_c, n_ceil),
            [math.log(k0), mean_y + 0.5772 / k0],
            lambda p: _weibull_ratio(math.exp(p[0]), math.exp(p[1]), ceiling),
        ),
        (
            "log-logistic",
            _loglogistic_nll(cells, log_c, n_ceil),
            [math.log(math.pi / (sd_y * math.sqrt(3))), mean_y],
            lambda p: _loglogistic_ratio(math.exp(p[0]), p[1], ceiling),
        ),
    ):
        if families is not None and family not in families:
            continue
        p, value = nelder_mead(nll, start)
        if value < _BIG:
            fits[family] = (2 * 2 + 2 * value, make(p))
    return fits


def fit_tail(
    cells: Cells,
    ceiling: int,
    n_ceil: float,
    start: Sequence[float] | None = None,
    step: float = 0.3,
    tol: float = 1e-10,
) -> list[float]:
    """Left-truncated, right-censored log-normal MLE; returns ``(mu, log_sigma)``."""
    nll = _ln_nll(cells, math.log(ceiling), n_ceil)
    if start is None:
        mean, sd = _moment_start(cells)
        start = [mean, math.log(sd)]
    p, _value = nelder_mead(nll, start, step=step, tol=tol)
    return p


def exp_ratio(rows: Sequence[CensoredRow], ceiling: int, loopers: float) -> Ratio:
    """Constant-hazard tail with the rate from S(0.75 C) / S(C) (loopers removed)."""
    at_c = sum(n for t, cz, n in rows if cz and t >= ceiling) - loopers
    above = sum(n for t, _cz, n in rows if t >= 0.75 * ceiling) - loopers
    rate = math.log(above / at_c) / (0.25 * ceiling) if at_c > 0 and above > at_c else 0.0
    return lambda t: math.exp(-rate * (t - ceiling))


# ---------------------------------------------------------------- two-component mixture


def _norm_pdf(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _censored_moments(mu: float, s: float, y: float) -> tuple[float, float, float]:
    """``(log P(Y >= y), E[Y | Y >= y], E[Y^2 | Y >= y])`` for Y ~ N(mu, s^2)."""
    z = (y - mu) / s
    log_q = log_norm_sf(z)
    lam = math.exp(-0.5 * z * z - 0.5 * _LOG_2PI - log_q)  # inverse Mills ratio phi / Q
    return log_q, mu + s * lam, mu * mu + s * s + s * lam * (mu + y)


def _mixture_step(cells: Cells, n_ceil: float, log_c: float, p: Sequence[float]) -> tuple[list[float], float]:
    """One EM step on the log lengths; returns ``(new params, log-likelihood at p)``."""
    w, mu1, s1, mu2, s2 = p
    # Component 2's log density minus component 1's, as a quadratic in y (one exp per bin).
    c0 = math.log1p(-w) - math.log(w) - math.log(s2 / s1) - 0.5 * ((mu2 / s2) ** 2 - (mu1 / s1) ** 2)
    c1, c2 = mu2 / s2**2 - mu1 / s1**2, -0.5 / s2**2 + 0.5 / s1**2
    base = math.log(w) - math.log(s1) - 0.5 * _LOG_2PI
    a0 = a1 = a2 = b0 = b1 = b2 = 0.0  # per component: weight, sum y, sum y^2
    loglik = 0.0
    for n, s_y, s_y2, _t in cells.ev:
        y = s_y / n
        d = c0 + y * (c1 + y * c2)
        r1 = 1.0 / (1.0 + math.exp(d)) if d < 700 else 0.0
        loglik += n * (base - 0.5 * ((y - mu1) / s1) ** 2 + (math.log1p(math.exp(d)) if d < 30 else d))
        a0 += r1 * n
        a1 += r1 * s_y
        a2 += r1 * s_y2
        b0 += (1 - r1) * n
        b1 += (1 - r1) * s_y
        b2 += (1 - r1) * s_y2
    lw = (math.log(w), math.log1p(-w))
    for n, y in [*cells.cens, (n_ceil, log_c)]:
        if n <= 0:
            continue
        m1, m2 = _censored_moments(mu1, s1, y), _censored_moments(mu2, s2, y)
        l1, l2 = lw[0] + m1[0], lw[1] + m2[0]
        top = max(l1, l2)
        tot = math.exp(l1 - top) + math.exp(l2 - top)
        loglik += n * (top + math.log(tot))
        r1 = n * math.exp(l1 - top) / tot
        a0 += r1
        a1 += r1 * m1[1]
        a2 += r1 * m1[2]
        b0 += n - r1
        b1 += (n - r1) * m2[1]
        b2 += (n - r1) * m2[2]
    new = [min(0.995, max(0.005, a0 / (a0 + b0)))]
    for k0, k1, k2 in ((a0, a1, a2), (b0, b1, b2)):
        m = k1 / max(k0, 1e-12)
        new += [m, max(0.05, math.sqrt(max(k2 / max(k0, 1e-12) - m * m, 0.0)))]
    return new, loglik


def fit_mixture(
    cells: Cells, ceiling: int, n_ceil: float, max_iter: int = 80, tol: float = 1e-6
) -> tuple[Ratio, float] | None:
    """Censored two-component log-normal mixture by EM; returns ``(tail ratio, log-likelihood)``
    (events at their bin means), or None without events.

    Two starts (split at the event mean, and a narrow upper mode just below the ceiling) run a
    few steps each; only the better one runs on, which halves the cost on page render.
    """
    if not cells.ev:
        return None
    log_c = math.log(ceiling)
    mean, sd = _moment_start(cells)
    runs = []
    for p in (
        [0.5, mean - 0.7 * sd, 0.6 * sd, mean + 0.7 * sd, 0.6 * sd],
        [0.7, mean - 0.3 * sd, 0.7 * sd, log_c - 0.3, 0.3],
    ):
        runs.append(_em(cells, n_ceil, log_c, p, 12, tol))
    p, loglik = _em(cells, n_ceil, log_c, max(runs, key=lambda r: r[1])[0], max_iter, tol)
    return ln_mixture_ratio(p, ceiling), loglik


def _em(cells: Cells, n_ceil: float, log_c: float, p: list[float], iters: int, tol: float) -> tuple[list[float], float]:
    prev = -math.inf
    for _ in range(iters):
        new, loglik = _mixture_step(cells, n_ceil, log_c, p)
        if loglik - prev < tol * abs(loglik):
            return p, loglik
        p, prev = new, loglik
    return p, prev


def coarsened(cells: Cells, factor: int) -> Cells:
    """The same table with every ``factor`` consecutive event bins merged (sums add)."""
    ev = []
    for i in range(0, len(cells.ev), factor):
        group = cells.ev[i : i + factor]
        ev.append([sum(g[j] for g in group) for j in range(4)])
    return Cells(ev, cells.cens, cells.n_ceil, cells.n_other, cells.log_m)


def ln_mixture_ratio(p: Sequence[float], ceiling: float) -> Ratio:
    w, mu1, s1, mu2, s2 = p

    def log_sf(t: float) -> float:
        y = math.log(t)
        a, b = math.log(w) + log_norm_sf((y - mu1) / s1), math.log1p(-w) + log_norm_sf((y - mu2) / s2)
        top = max(a, b)
        return top + math.log(math.exp(a - top) + math.exp(b - top))

    base = log_sf(ceiling)
    return lambda t: math.exp(min(0.0, log_sf(t) - base))
