"""What raising max_tokens would buy: censored-tail extrapolation from a length count table.

Completions that stopped with ``finish_reason == "length"`` are right-censored: their natural
length is at least where they stopped (the ceiling C, or the context window below it).  For a
proposed limit C2 > C we estimate S(C2), the share of all completions that would still be cut
off, and the extra tokens per completion, ``integral_C^C2 S(t) dt``.  The default model is a
log-normal fitted by maximum likelihood to the upper half of the data only (left-truncated at
the median, right-censored), because the family that fits the bulk is not the one that fits the
tail; an exponential tail (constant hazard, from S(0.75 C) / S(C)) and the best-AIC full-data
censored fit (log-normal, gamma, Weibull) give a band, and a multinomial bootstrap of the count
table gives sampling error.  Every model is anchored at the observed share S(C): it only
supplies the conditional ratio R(t) = S(t | T >= C), and S(C2) = S(C) * R(C2).

Repetition loops never stop, so a share ``lf`` of the truncated completions (measured by
loops.py on a sample) stays truncated at any limit.  With pi = lf * S(C) loopers (natural length
infinite) and the rest following F, S_adj(C2) = pi + S(C) (1 - lf) R_F(C2), where F is fitted
with the loopers removed from the censored count; they also generate every extra token:
extra = pi (C2 - C) + S(C) (1 - lf) integral R_F.  Pure Python: Nelder-Mead and the special
functions are hand-written because this runs on page render.
"""

from __future__ import annotations

import math
import random

from runhealth.numeric import integrate, log_gamma_sf, log_norm_sf, multinomial, nelder_mead
from runhealth.stats import LENGTH, LengthHist, detect_ceiling, length_source, percentile_nearest_rank

NOTE = ("Extrapolation beyond the observed ceiling: the tail above it was never seen, so this is "
        "a model estimate; measure with a continuation batch for an exact answer.")
DEFAULT_MODEL = "tail log-normal"
EXP_MODEL = "exponential tail"
MIN_TAIL_EVENTS = 10
# Bootstrap refits start at the full-data optimum and only need the spread of the estimate:
# stopping at a relative NLL change of 1e-8 (0.01 nats at a million completions, far below the
# ~0.5 nats of one standard error) halves their evaluations and moves the interval by < 1e-4.
BOOTSTRAP_TOL = 1e-8
_LOG_2PI = math.log(2 * math.pi)
_BIG = 1e300


# ---------------------------------------------------------------- count-table fits

class Cells:
    """A count table compressed for fitting: log-binned events, censor points, the ceiling.

    ``ev`` rows are ``[n, sum_y, sum_y2, sum_t]`` with ``y = log(tokens)``; ``cens`` rows are
    ``[n, y]`` (length stops below the ceiling); ``n_ceil`` length stops at the ceiling;
    ``n_other`` completions below the left-truncation point ``log_m`` (not used by the fit).
    """

    def __init__(self, ev, cens, n_ceil, n_other, log_m):
        self.ev, self.cens, self.n_ceil, self.n_other, self.log_m = ev, cens, n_ceil, n_other, log_m

    @property
    def total(self) -> float:
        return self.n_other + self.n_ceil + sum(e[0] for e in self.ev) + sum(c[0] for c in self.cens)

    def counts(self) -> list[float]:
        return [self.n_other] + [e[0] for e in self.ev] + [c[0] for c in self.cens] + [self.n_ceil]

    def resampled(self, counts: list[int]) -> Cells:
        """Same bins with new counts (bin sums scaled: each bin keeps its mean)."""
        k = len(self.ev)
        ev = [[m, *(s * m / e[0] for s in e[1:])] for e, m in zip(self.ev, counts[1:k + 1], strict=True)]
        cens = [[m, c[1]] for c, m in zip(self.cens, counts[k + 1:-1], strict=True)]
        return Cells(ev, cens, counts[-1], counts[0], self.log_m)

    def event_sums(self) -> tuple[float, float, float, float]:
        return tuple(sum(e[i] for e in self.ev) for i in range(4))


def _log_bins(items, lo, hi, nbins):
    """Group ``(y, n)`` items into ``nbins`` equal bins of ``[lo, hi]``; returns bin index map."""
    width = max((hi - lo) / nbins, 1e-12)
    return [min(nbins - 1, max(0, int((y - lo) / width))) for y, _n in items]


def build_cells(rows, ceiling, log_m=None, ev_bins=256, cens_bins=16) -> Cells:
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


def _bin_events(events, nbins):
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


def _bin_cens(cens, nbins):
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

def _ln_nll(cells: Cells, log_c: float, n_ceil: float):
    n_e, s_y, s_y2, _s_t = cells.event_sums()
    n_fit = n_e + n_ceil + sum(c[0] for c in cells.cens)

    def nll(p):
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


def _gamma_nll(cells: Cells, ceiling: float, n_ceil: float):
    n_e, s_y, _s_y2, s_t = cells.event_sums()

    def nll(p):
        log_a, log_th = p
        if not -6.0 < log_a < 8.0 or not -10.0 < log_th < 30.0:
            return _BIG
        a, th = math.exp(log_a), math.exp(log_th)
        ll = (a - 1) * s_y - s_t / th - n_e * (a * log_th + math.lgamma(a))
        ll += n_ceil * log_gamma_sf(a, ceiling / th)
        ll += sum(n * log_gamma_sf(a, math.exp(y) / th) for n, y in cells.cens)
        return -ll
    return nll


def _weibull_nll(cells: Cells, log_c: float, n_ceil: float):
    n_e, s_y, _s_y2, _s_t = cells.event_sums()
    bins = [(e[0], e[1] / e[0]) for e in cells.ev]

    def nll(p):
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


def _loglogistic_nll(cells: Cells, log_c: float, n_ceil: float):
    n_e, s_y, _s_y2, _s_t = cells.event_sums()
    bins = [(e[0], e[1] / e[0]) for e in cells.ev]

    def nll(p):
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


def _loglogistic_ratio(b, log_a, ceiling):
    base = _softplus(b * (math.log(ceiling) - log_a))
    return lambda t: math.exp(min(0.0, base - _softplus(b * (math.log(t) - log_a))))


def _ln_ratio(mu, s, ceiling):
    base = log_norm_sf((math.log(ceiling) - mu) / s)
    return lambda t: math.exp(min(0.0, log_norm_sf((math.log(t) - mu) / s) - base))


def _gamma_ratio(a, th, ceiling):
    base = log_gamma_sf(a, ceiling / th)
    return lambda t: math.exp(min(0.0, log_gamma_sf(a, t / th) - base))


def _weibull_ratio(k, lam, ceiling):
    base = (ceiling / lam) ** k
    return lambda t: math.exp(min(0.0, base - (t / lam) ** k))


def _moment_start(cells: Cells) -> tuple[float, float]:
    n_e, s_y, s_y2, _s_t = cells.event_sums()
    mean = s_y / n_e
    return mean, math.sqrt(max(s_y2 / n_e - mean * mean, 1e-4))


def fit_full(cells: Cells, ceiling: int, n_ceil: float) -> dict:
    """Censored MLE of log-normal, gamma, Weibull, log-logistic: ``{family: (aic, ratio)}``."""
    log_c = math.log(ceiling)
    mean_y, sd_y = _moment_start(cells)
    mean_t = cells.event_sums()[3] / cells.event_sums()[0]
    s = max(math.log(mean_t) - mean_y, 1e-3)
    shape = (3 - s + math.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)
    k0 = math.pi / (sd_y * math.sqrt(6))
    fits = {}
    for family, nll, start, make in (
            ("log-normal", _ln_nll(cells, log_c, n_ceil), [mean_y, math.log(sd_y)],
             lambda p: _ln_ratio(p[0], math.exp(p[1]), ceiling)),
            ("gamma", _gamma_nll(cells, ceiling, n_ceil), [math.log(shape), math.log(mean_t / shape)],
             lambda p: _gamma_ratio(math.exp(p[0]), math.exp(p[1]), ceiling)),
            ("Weibull", _weibull_nll(cells, log_c, n_ceil), [math.log(k0), mean_y + 0.5772 / k0],
             lambda p: _weibull_ratio(math.exp(p[0]), math.exp(p[1]), ceiling)),
            ("log-logistic", _loglogistic_nll(cells, log_c, n_ceil),
             [math.log(math.pi / (sd_y * math.sqrt(3))), mean_y],
             lambda p: _loglogistic_ratio(math.exp(p[0]), p[1], ceiling))):
        p, value = nelder_mead(nll, start)
        if value < _BIG:
            fits[family] = (2 * 2 + 2 * value, make(p))
    return fits


def fit_tail(cells: Cells, ceiling: int, n_ceil: float, start=None, step=0.3, tol=1e-10):
    """Left-truncated, right-censored log-normal MLE; returns ``(mu, log_sigma)``."""
    nll = _ln_nll(cells, math.log(ceiling), n_ceil)
    if start is None:
        mean, sd = _moment_start(cells)
        start = [mean, math.log(sd)]
    p, _value = nelder_mead(nll, start, step=step, tol=tol)
    return p


def exp_ratio(rows, ceiling: int, loopers: float):
    """Constant-hazard tail with the rate from S(0.75 C) / S(C) (loopers removed)."""
    at_c = sum(n for t, cz, n in rows if cz and t >= ceiling) - loopers
    above = sum(n for t, _cz, n in rows if t >= 0.75 * ceiling) - loopers
    rate = math.log(above / at_c) / (0.25 * ceiling) if at_c > 0 and above > at_c else 0.0
    return lambda t: math.exp(-rate * (t - ceiling))


# ---------------------------------------------------------------- estimates and bootstrap

def _combine(ratio, cells_total, n_ceil, lf, ceiling, new_limit):
    """Anchor a tail ratio at the observed share; loopers stay truncated (module docstring)."""
    pi = lf * n_ceil / cells_total
    rest = (1.0 - lf) * n_ceil / cells_total
    share = pi + rest * ratio(new_limit)
    extra = pi * (new_limit - ceiling) + rest * integrate(ratio, ceiling, new_limit)
    return share, extra


def _tail_estimate(cells: Cells, ceiling, new_limit, lf, start=None, step=0.3, tol=1e-10):
    total = cells.total
    if total <= 0 or cells.n_ceil <= 0:
        return 0.0, 0.0, start
    if sum(e[0] for e in cells.ev) < 2:
        return None, None, start
    p = fit_tail(cells, ceiling, cells.n_ceil * (1 - lf), start, step, tol)
    ratio = _ln_ratio(p[0], math.exp(p[1]), ceiling)
    share, extra = _combine(ratio, total, cells.n_ceil, lf, ceiling, new_limit)
    return share, extra, p


def _bootstrap(cells, ceiling, new_limit, lf, start, reps, seed):
    rng = random.Random(seed)
    n, weights = int(round(cells.total)), cells.counts()
    shares, extras = [], []
    for _ in range(reps):
        boot = cells.resampled(multinomial(rng, n, weights))
        share, extra, _p = _tail_estimate(boot, ceiling, new_limit, lf, list(start), step=0.1, tol=BOOTSTRAP_TOL)
        if share is not None:
            shares.append(share)
            extras.append(extra)
    return shares, extras


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))]


def _base_result(ceiling, new_limit, s_c, lf) -> dict:
    return {"limit": int(new_limit), "ceiling": ceiling, "truncated_fraction": None,
            "interval": [0.0, s_c], "extra_tokens_per_completion": None,
            "extra_tokens_interval": [0.0, s_c * max(0, new_limit - (ceiling or 0))],
            "model": None, "band": {}, "extra_tokens_band": {}, "hard_bounds": [0.0, s_c],
            "current_truncated_fraction": s_c, "loop_fraction": lf, "note": NOTE, "curve": []}


def _censored_rows(hist: LengthHist, ceiling: int):
    used, _est, _src = length_source(hist)
    rows = [(t, fr == LENGTH, n) for t, fr, _e, n in used.rows()]
    n_total = sum(n for _t, _c, n in rows)
    n_ceil = sum(n for t, cz, n in rows if cz and t >= ceiling)
    return rows, n_total, n_ceil


def _lowered(result, rows, n_total, ceiling, new_limit):
    """A limit at or below the ceiling needs no model: the lengths below C were observed."""
    still = sum(n for t, _cz, n in rows if t >= new_limit)
    lost = sum(n * (min(t, ceiling) - min(t, new_limit)) for t, _cz, n in rows)
    result.update(truncated_fraction=still / n_total, interval=[still / n_total] * 2,
                  extra_tokens_per_completion=-lost / n_total,
                  extra_tokens_interval=[-lost / n_total] * 2, model="empirical",
                  note="Limit at or below the observed ceiling: exact from the observed lengths.")
    return result


def what_if(hist: LengthHist, ceiling: int | None, new_limit: int, *, loop_fraction: float = 0.0,
            bootstrap: int = 200, seed: int = 0, curve_limits: tuple[int, ...] = ()) -> dict:
    """Estimate the share still truncated, and the extra tokens, if max_tokens were ``new_limit``.

    Args:
        hist: the run's length counts (exact rows unless all are estimated).
        ceiling: the current max_tokens; detected from the data when None.
        new_limit: the proposed max_tokens.
        loop_fraction: share of truncated completions that are repetition loops (loops.py).
        bootstrap: multinomial bootstrap replicates of the default method (0 to skip).
        seed: bootstrap seed (results are deterministic).
        curve_limits: limits to also evaluate from the same fits, as ``result["curve"]`` (the
            points of `what_if_curve`; empty when the tail cannot be modelled).

    Returns:
        The what-if dict (keys documented in docs/design.md); degenerate data give the hard
        bounds and a note, never an exception.
    """
    ceiling = int(ceiling) if ceiling is not None else detect_ceiling(hist)
    lf = min(1.0, max(0.0, float(loop_fraction or 0.0)))
    if ceiling is None:
        result = _base_result(None, new_limit, 0.0, lf)
        result.update(truncated_fraction=0.0, extra_tokens_per_completion=0.0,
                      note="No max_tokens ceiling detected: nothing is cut off at a limit.")
        return result
    rows, n_total, n_ceil = _censored_rows(hist, ceiling)
    s_c = n_ceil / n_total if n_total else 0.0
    result = _base_result(ceiling, new_limit, s_c, lf)
    if n_total == 0 or n_ceil == 0:
        result.update(truncated_fraction=0.0, interval=[0.0, 0.0], extra_tokens_per_completion=0.0,
                      extra_tokens_interval=[0.0, 0.0], note="No completion stopped at the ceiling.")
        return result
    if new_limit <= ceiling:
        return _lowered(result, rows, n_total, ceiling, new_limit)
    median = percentile_nearest_rank([(t, n) for t, _c, n in rows], 50)
    tail = build_cells(rows, ceiling, math.log(max(median, 0.5)), ev_bins=32, cens_bins=8)
    if median >= ceiling or sum(e[0] for e in tail.ev) < MIN_TAIL_EVENTS:
        result["note"] = ("Too few completions finished below the ceiling to model the tail: "
                          "only the hard bounds are known. " + NOTE)
        return result
    return _fill_estimates(result, rows, tail, ceiling, new_limit, lf, bootstrap, seed, curve_limits)


def _fit_models(rows, tail, ceiling, lf):
    """Fit every model once: name -> tail ratio R(t), and the default model's parameters.

    The fits do not depend on the proposed limit, so one fit serves every limit asked about.
    """
    params = fit_tail(tail, ceiling, tail.n_ceil * (1 - lf))
    models = {DEFAULT_MODEL: _ln_ratio(params[0], math.exp(params[1]), ceiling),
              EXP_MODEL: exp_ratio(rows, ceiling, lf * tail.n_ceil)}
    full = build_cells(rows, ceiling)
    fits = fit_full(full, ceiling, tail.n_ceil * (1 - lf)) if full.ev else {}
    if fits:
        family = min(fits, key=lambda f: fits[f][0])
        models[f"{family} (AIC)"] = fits[family][1]
    return models, params


def _fill_estimates(result, rows, tail, ceiling, new_limit, lf, reps, seed, curve_limits=()):
    models, params = _fit_models(rows, tail, ceiling, lf)
    result["curve"] = _curve(models, tail, ceiling, curve_limits, lf)
    band = {name: _combine(ratio, tail.total, tail.n_ceil, lf, ceiling, new_limit) for name, ratio in models.items()}
    share, extra = band[DEFAULT_MODEL]
    shares, extras = _bootstrap(tail, ceiling, new_limit, lf, params, reps, seed)
    s_lo, s_hi = _envelope([v[0] for v in band.values()], share, shares)
    e_lo, e_hi = _envelope([v[1] for v in band.values()], extra, extras)
    s_c = result["current_truncated_fraction"]
    result.update(
        truncated_fraction=share, extra_tokens_per_completion=extra, model=DEFAULT_MODEL,
        interval=[max(0.0, s_lo), min(s_c, s_hi)],
        extra_tokens_interval=[max(0.0, e_lo), min(s_c * (new_limit - ceiling), e_hi)],
        band={k: v[0] for k, v in band.items()},
        extra_tokens_band={k: v[1] for k, v in band.items()}, bootstrap_reps=len(shares))
    return result


def what_if_curve(hist: LengthHist, ceiling: int, limits: list[int], *, loop_fraction: float = 0.0) -> list[dict]:
    """The default estimate and the band across models at several limits, from one set of fits.

    Returns:
        One ``{"limit", "truncated_fraction", "band": {method: share}}`` per limit above the
        ceiling (no bootstrap: the band dominates the interval); empty when the tail cannot
        be modelled (see `what_if` for why).
    """
    lf = min(1.0, max(0.0, float(loop_fraction or 0.0)))
    rows, n_total, n_ceil = _censored_rows(hist, ceiling)
    if n_total == 0 or n_ceil == 0:
        return []
    median = percentile_nearest_rank([(t, n) for t, _c, n in rows], 50)
    tail = build_cells(rows, ceiling, math.log(max(median, 0.5)), ev_bins=32, cens_bins=8)
    if median >= ceiling or sum(e[0] for e in tail.ev) < MIN_TAIL_EVENTS:
        return []
    models, _params = _fit_models(rows, tail, ceiling, lf)
    return _curve(models, tail, ceiling, limits, lf)


def _curve(models, tail: Cells, ceiling: int, limits, lf: float) -> list[dict]:
    out = []
    for limit in sorted(x for x in limits if x > ceiling):
        band = {name: _combine(ratio, tail.total, tail.n_ceil, lf, ceiling, limit)[0] for name, ratio in models.items()}
        out.append({"limit": limit, "truncated_fraction": band[DEFAULT_MODEL], "band": band})
    return out


def _envelope(band_values: list[float], point: float, boot: list[float]) -> tuple[float, float]:
    """Band across methods, each end widened by the default's relative bootstrap spread.

    The other methods were not bootstrapped (too slow for page render); their sampling error
    is taken to be the default's in relative terms (all share the anchor S(C)).
    """
    lo, hi = min(band_values), max(band_values)
    if not boot or point <= 0:
        return lo, hi
    return lo * min(1.0, _quantile(boot, 0.025) / point), hi * max(1.0, _quantile(boot, 0.975) / point)


def eta_change(remaining_completions: int, tokens_per_s: float | None, mean_tokens_now: float,
               extra_tokens_per_completion: float) -> dict:
    """Time to finish the run now and with the extra tokens per completion.

    Returns:
        ``{"eta_s_now", "eta_s_new", "delta_s"}`` in seconds (None without a throughput).
    """
    if not tokens_per_s or tokens_per_s <= 0 or mean_tokens_now is None:
        return {"eta_s_now": None, "eta_s_new": None, "delta_s": None}
    remaining = max(0, remaining_completions)
    now = remaining * mean_tokens_now / tokens_per_s
    new = remaining * (mean_tokens_now + (extra_tokens_per_completion or 0.0)) / tokens_per_s
    return {"eta_s_now": now, "eta_s_new": new, "delta_s": new - now}


def _messages(prompt) -> list[dict]:
    if isinstance(prompt, list):
        return [dict(m) for m in prompt]
    return [{"role": "user", "content": str(prompt)}]


def continuation_requests(samples: list[dict], new_limit: int, ceiling: int,
                          model: str = "") -> list[dict]:
    """OpenAI Batch lines that continue truncated completions up to ``new_limit`` tokens.

    Each body is a chat request whose last message is the partial assistant answer, with
    ``continue_final_message=True`` and ``add_generation_prompt=False`` (vLLM / SGLang
    continuation) and ``max_tokens = new_limit - ceiling``.  Samples without full text
    (``prompt`` or ``text`` None) are skipped.

    Returns:
        One dict per JSONL line: ``{"custom_id": "path:line_no", "method", "url", "body"}``.
    """
    budget = int(new_limit) - int(ceiling)
    if budget <= 0:
        return []
    lines = []
    for sample in samples:
        if sample.get("prompt") is None or sample.get("text") is None:
            continue
        messages = _messages(sample["prompt"]) + [{"role": "assistant", "content": sample["text"]}]
        body = {"model": model, "messages": messages, "max_tokens": budget,
                "continue_final_message": True, "add_generation_prompt": False}
        lines.append({"custom_id": f"{sample.get('path')}:{sample.get('line_no')}",
                      "method": "POST", "url": "/v1/chat/completions", "body": body})
    return lines
