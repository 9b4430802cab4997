"""What raising max_tokens would buy: censored-tail extrapolation, back-tested on the run's own data.

Completions that stopped with ``finish_reason == "length"`` are right-censored: their natural
length is at least where they stopped (the ceiling C, or the context window below it).  For a
proposed limit C2 > C we estimate S(C2), the share of all completions that would still be cut
off, and the extra tokens per completion, ``integral_C^C2 S(t) dt``.  Every model (tailfit.py:
a log-normal fitted to the upper half only, an exponential tail, the best-AIC full-data family,
a two-component log-normal mixture) supplies only the conditional ratio R(t) = S(t | T >= C);
all are anchored at the observed share S(C), so S(C2) = S(C) * R(C2).

No model is trusted on its own word.  The back-test censors the observed lengths again at a
lower cut c = C / r (and C / sqrt(r)), with r = C2 / C the asked ratio, fits every model on
that, and compares each prediction of the share above C with the exact, observed one.  The
model with the smallest error (scaled to the asked ratio in log distance) is the headline;
models within ADMIT of it form the interval's envelope, and each end is widened by the
headline's own back-test error and by a multinomial bootstrap of the count table (the tail
log-normal's relative spread).  The extra tokens get the same calibration, checked against the
exactly known tokens between c and C.  When no cut can be back-tested, the envelope of every
model is the interval, and the result says so.

Repetition loops never stop, so a share ``lf`` of the truncated completions stays truncated at
any limit: S_adj(C2) = pi + S(C) (1 - lf) R_F(C2) with pi = lf * S(C), F fitted with the loopers
removed from the censored count; they also generate every extra token.  A sampled loop share
(``loop_sample=(loops, sampled)``) enters with its Wilson interval, and both ends of the
interval are taken at the loop share's ends (the estimate rises with lf). A sample counts only
once it holds MIN_LOOP_SAMPLES sampled truncated completions: below that the what-if is the one
it would be with no sample at all (no loop term: the model's interval alone, "assuming no loops"
beside it), so a store with a short sample and shards without one (``runhealth compare``) give
the same interval (#41).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Collection, Sequence
from typing import Any

from runhealth.analysis.numeric import integrate, multinomial
from runhealth.analysis.stats import LengthHist, detect_ceiling, length_source, percentile_nearest_rank
from runhealth.analysis.tailfit import (
    Cells,
    CensoredRow,
    Ratio,
    build_cells,
    coarsened,
    exp_ratio,
    fit_full,
    fit_mixture,
    fit_tail,
    ln_ratio,
)
from runhealth.records import LENGTH

NOTE = (
    "Extrapolation beyond the observed ceiling: the tail above it was never seen, so this is "
    "a model estimate; measure with a continuation batch for an exact answer."
)
DEFAULT_MODEL = "tail log-normal"
EXP_MODEL = "exponential tail"
MIX_MODEL = "log-normal mixture"
# Order of preference when back-test errors tie (or no back-test is possible).
PREFERENCE = (DEFAULT_MODEL, MIX_MODEL, EXP_MODEL)
MIN_TAIL_EVENTS = 10
MIN_LOOP_SAMPLES = 20
# Models whose back-test error is within a factor 1.5 of the best stay in the interval's envelope.
ADMIT = math.log(1.5)
# The back-test's error understates the error one step further out (the tail above C is
# lighter or heavier than the stretch below it in ways the lower cut cannot show): measured on
# the generated family of tests/whatif_family.py (bench/whatif.py), the real error was up to
# about twice the back-test's, so the interval is widened by CALIBRATION times it.
CALIBRATION = (3.0, 1.5)
# Bootstrap refits start at the full-data optimum and only need the spread of the estimate:
# stopping at a relative NLL change of 1e-8 (0.01 nats at a million completions, far below the
# ~0.5 nats of one standard error) halves their evaluations and moves the interval by < 1e-4.
BOOTSTRAP_TOL = 1e-8
BOOTSTRAP = 200  # replicates of every what-if a screen, the collector's payload or the CLI shows
_Z95 = 1.959964


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """What raising max_tokens from ``ceiling_tokens`` to ``limit_tokens`` would buy: `what_if`'s answer.

    Shares are fractions of all completions; extra tokens are per completion. The nested parts
    stay plain dicts (they go to JSON as they are): ``loops`` is `loop_share`'s answer,
    ``backtest`` the checks behind the headline, ``curve`` one `at_limit` dict per curve limit.
    `to_json()` gives the object ``runhealth scan --whatif --json`` prints (keys ``limit`` and
    ``ceiling`` for the two token fields, ``bootstrap_reps`` only when a model was fitted).
    """

    limit_tokens: int  # the proposed max_tokens
    ceiling_tokens: int | None  # the current ceiling, given or detected; None when there is none
    truncated_fraction: float | None  # headline share still cut at the limit; None: hard bounds only
    interval: list[float]  # calibrated 95% interval [lo, hi] of truncated_fraction
    extra_tokens_per_completion: float | None  # headline extra tokens per completion (negative below C)
    extra_tokens_interval: list[float]  # its calibrated interval [lo, hi]
    model: str | None  # the headline model ("empirical" at or below the ceiling)
    model_reason: str | None  # why that model, in words
    band: dict[str, float]  # model -> its share still cut at the limit
    extra_tokens_band: dict[str, float]  # model -> its extra tokens per completion
    hard_bounds: list[float]  # [0, today's share at the ceiling]: known without any model
    current_truncated_fraction: float  # today's share at the ceiling
    loop_fraction: float  # the loop share used (point)
    loops: dict[str, Any]  # `loop_share`: point, interval, loops, sampled, used, needed
    backtest: dict[str, Any] | None  # the back-test's checks and errors; None when none was possible
    note: str  # what kind of answer this is, for people
    curve: list[dict[str, Any]]  # `at_limit` per curve limit (same fits)
    bootstrap_reps: int | None = None  # bootstrap replicates that converged; None when no model was fitted

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WhatIf:
        """The result back from its `to_json()` object (as the collector stores it for the page)."""
        return _typed(data)

    def to_json(self) -> dict[str, Any]:
        """The JSON object, key for key as `what_if` returned it before it was typed."""
        out = dataclasses.asdict(self)
        reps = out.pop("bootstrap_reps")
        out = {"limit": out.pop("limit_tokens"), "ceiling": out.pop("ceiling_tokens"), **out}
        if reps is not None:
            out["bootstrap_reps"] = reps
        return out


def _typed(result: dict[str, Any]) -> WhatIf:
    fields = dict(result)
    return WhatIf(limit_tokens=fields.pop("limit"), ceiling_tokens=fields.pop("ceiling"), **fields)


# ---------------------------------------------------------------- fits at one ceiling


def _tail_cells(rows: Sequence[CensoredRow], ceiling: int) -> Cells | None:
    """The upper half of the data, or None when too few completions finished below the ceiling."""
    median = percentile_nearest_rank([(t, n) for t, _c, n in rows], 50)
    if median is None:
        return None
    tail = build_cells(rows, ceiling, math.log(max(median, 0.5)), ev_bins=32, cens_bins=8)
    if median >= ceiling or sum(e[0] for e in tail.ev) < MIN_TAIL_EVENTS:
        return None
    return tail


def _fit_models(
    rows: Sequence[CensoredRow], tail: Cells | None, ceiling: int, lf: float, families: Collection[str] | None = None
) -> tuple[dict[str, Ratio], list[float] | None]:
    """Fit every model once: name -> tail ratio R(t), and the tail log-normal's parameters.

    The fits do not depend on the proposed limit, so one fit serves every limit asked about.
    ``families`` restricts the AIC candidates (the back-test refits the one the data chose);
    without ``tail`` (a back-test cut below the median) the tail log-normal is left out.
    """
    full = build_cells(rows, ceiling)
    n_cut = full.n_ceil
    n_fit = n_cut * (1 - lf)
    models, params = {}, None
    if tail is not None:
        params = fit_tail(tail, ceiling, n_fit)
        models[DEFAULT_MODEL] = ln_ratio(params[0], math.exp(params[1]), ceiling)
    models[EXP_MODEL] = exp_ratio(rows, ceiling, lf * n_cut)
    fits = fit_full(full, ceiling, n_fit, families) if full.ev else {}
    if fits:
        family = min(fits, key=lambda f: fits[f][0])
        models[f"{family} (AIC)"] = fits[family][1]
    # 256 log bins suit the two-parameter fits; EM steps cost per bin, and 64 bins (about a
    # twentieth of a log unit each on a typical run) are far finer than either mode's width.
    mix = fit_mixture(coarsened(full, 4), ceiling, n_fit)
    if mix is not None:
        models[MIX_MODEL] = mix[0]
    return models, params


def _combine(
    ratio: Ratio, cells_total: float, n_ceil: float, lf: float, ceiling: int, new_limit: int
) -> tuple[float, float]:
    """Anchor a tail ratio at the observed share; loopers stay truncated (module docstring)."""
    pi = lf * n_ceil / cells_total
    rest = (1.0 - lf) * n_ceil / cells_total
    share = pi + rest * ratio(new_limit)
    extra = pi * (new_limit - ceiling) + rest * integrate(ratio, ceiling, new_limit)
    return share, extra


# ---------------------------------------------------------------- back-test on the run's own data


def backtest(
    rows: Sequence[CensoredRow], ceiling: int, new_limit: int, lf: float, families: Collection[str] | None = None
) -> list[dict]:
    """Censor the observed lengths at c = C / r and C / sqrt(r), predict the share above C.

    Returns:
        One check per cut that has a modellable tail: ``{"cut", "limit" (= C), "ratio",
        "truth", "truth_extra", "predicted": {model: share}, "predicted_extra": {model:
        tokens}}``; truth is exact (every length below C was observed).
    """
    n_total = sum(n for _t, _c, n in rows)
    n_ceil = sum(n for t, cz, n in rows if cz and t >= ceiling)
    r = new_limit / ceiling
    loopers, checks = lf * n_ceil, []
    for rho in sorted({r, math.sqrt(r)}, reverse=True):
        cut = int(ceiling / rho)
        if not 2 <= cut < ceiling:
            continue
        # Everything at or above the cut is one censored row (fewer rows to bin).
        cut_rows = [row for row in rows if row[0] < cut] + [(cut, True, sum(n for t, _c, n in rows if t >= cut))]
        n_cut = sum(n for t, cz, n in cut_rows if cz and t >= cut)
        below = sum(n for t, cz, n in cut_rows if not cz)
        if n_cut <= loopers or below < MIN_TAIL_EVENTS:
            continue
        # A cut below the median leaves no upper half for the tail log-normal: the other models
        # are still checked (it then cannot be the headline; see choose_headline).
        lf_cut = loopers / n_cut
        models, _params = _fit_models(cut_rows, _tail_cells(cut_rows, cut), cut, lf_cut, families)
        pred = {m: _combine(ratio, n_total, n_cut, lf_cut, cut, ceiling) for m, ratio in models.items()}
        checks.append(
            {
                "cut": cut,
                "limit": ceiling,
                "ratio": ceiling / cut,
                "truth": n_ceil / n_total,
                "truth_extra": sum(n * (min(t, ceiling) - min(t, cut)) for t, _c, n in rows) / n_total,
                "predicted": {m: v[0] for m, v in pred.items()},
                "predicted_extra": {m: v[1] for m, v in pred.items()},
            }
        )
    return checks


def backtest_errors(checks: list[dict], ratio: float, key: str = "") -> dict[str, float]:
    """Each model's worst |log(predicted / truth)| over the checks, scaled to the asked ratio.

    A check at ratio rho is scaled by log(ratio) / log(rho): the error of an extrapolation is
    taken to grow with its distance in log tokens.  ``key`` "" for shares, "_extra" for tokens.
    """
    errors: dict[str, float] = {}
    for check in checks:
        scale = math.log(ratio) / math.log(check["ratio"]) if check["ratio"] > 1 else 1.0
        truth = check["truth" + key]
        for model, pred in check["predicted" + key].items():
            err = abs(math.log(pred / truth)) * scale if pred > 0 and truth > 0 else math.inf
            errors[model] = max(errors.get(model, 0.0), err)
    return errors


def choose_headline(models: Collection[str], errors: dict[str, float], checks: Sequence[dict] = ()) -> tuple[str, str]:
    """The model with the smallest back-test error (ties: PREFERENCE order), and why.

    Only models checked at every cut compete: one left out of the longest extrapolation (the
    tail log-normal when that cut lies below the median) would win on its shorter check alone.
    """
    order = [m for m in PREFERENCE if m in models] + [m for m in models if m not in PREFERENCE]
    checked = [m for m in order if m in errors and all(m in c["predicted"] for c in checks)]
    if not checked:
        return DEFAULT_MODEL, "no back-test possible (too few completions below the lower cut): the tail log-normal"
    best = min(checked, key=lambda m: (round(errors[m], 6), order.index(m)))
    return best, f"smallest back-test error ({math.expm1(errors[best]):.0%} off, scaled to this limit)"


# ---------------------------------------------------------------- calibrated intervals


def _envelope(
    values: dict[str, float], head: str, errors: dict[str, float], boot: tuple[float, float], fixed: float
) -> tuple[float, float]:
    """Admitted models' range, widened by the headline's back-test error and the bootstrap.

    ``fixed`` is the loopers' part, which no model changes; only the rest is widened.
    """
    err = errors.get(head, 0.0) if errors else 0.0
    admitted = [m for m in values if not errors or errors.get(m, math.inf) <= errors[head] + ADMIT] or [head]
    lo, hi = min(values[m] for m in admitted), max(values[m] for m in admitted)
    lo = fixed + max(0.0, lo - fixed) * boot[0] * math.exp(-CALIBRATION[0] * err)
    hi = fixed + max(0.0, hi - fixed) * boot[1] * math.exp(CALIBRATION[1] * err)
    return lo, hi


def at_limit(fit: dict, limit: int, boot: tuple[float, float] = (1.0, 1.0)) -> dict:
    """Headline, calibrated interval and band at ``limit`` from one set of fits (``fit`` as
    built by `_analyse`); both interval ends are taken at the loop share's ends."""
    ceiling, tail, models, head = fit["ceiling"], fit["tail"], fit["models"], fit["head"]
    scale = math.log(limit / ceiling) / math.log(fit["ratio"]) if fit["ratio"] > 1 else 1.0
    err_s = {m: e * scale for m, e in fit["errors"].items()}
    err_e = {m: e * scale for m, e in fit["errors_extra"].items()}
    s_c = tail.n_ceil / tail.total
    ends = {}
    for lf in sorted({fit["lf"], *fit["lf_range"]}):
        band = {m: _combine(ratio, tail.total, tail.n_ceil, lf, ceiling, limit) for m, ratio in models.items()}
        ends[lf] = (
            band,
            _envelope({m: v[0] for m, v in band.items()}, head, err_s, boot, lf * s_c),
            _envelope({m: v[1] for m, v in band.items()}, head, err_e, boot, lf * s_c * (limit - ceiling)),
        )
    band = ends[fit["lf"]][0]
    share, extra = band[head]
    lo_lf, hi_lf = fit["lf_range"]
    return {
        "limit": limit,
        "truncated_fraction": share,
        "extra_tokens_per_completion": extra,
        "interval": [max(0.0, min(share, ends[lo_lf][1][0])), min(s_c, max(share, ends[hi_lf][1][1]))],
        "extra_tokens_interval": [
            max(0.0, min(extra, ends[lo_lf][2][0])),
            min(s_c * (limit - ceiling), max(extra, ends[hi_lf][2][1])),
        ],
        "band": {m: v[0] for m, v in band.items()},
        "extra_tokens_band": {m: v[1] for m, v in band.items()},
    }


# ---------------------------------------------------------------- bootstrap and loops


def _tail_estimate(
    cells: Cells,
    ceiling: int,
    new_limit: int,
    lf: float,
    start: Sequence[float] | None = None,
    step: float = 0.3,
    tol: float = 1e-10,
) -> tuple[float, float] | None:
    if sum(e[0] for e in cells.ev) < 2 or cells.n_ceil <= 0:
        return None
    p = fit_tail(cells, ceiling, cells.n_ceil * (1 - lf), start, step, tol)
    return _combine(ln_ratio(p[0], math.exp(p[1]), ceiling), cells.total, cells.n_ceil, lf, ceiling, new_limit)


def _bootstrap(fit: dict, new_limit: int, reps: int, seed: int) -> tuple[tuple[float, float], int]:
    """Relative 95% spread ``(lo / point, hi / point)`` of the tail log-normal's share over a
    multinomial bootstrap of the count table; the other models are taken to share it (all are
    anchored at the same S(C); bootstrapping each would be too slow for page render)."""
    tail, ceiling, lf = fit["tail"], fit["ceiling"], fit["lf"]
    point = _combine(fit["models"][DEFAULT_MODEL], tail.total, tail.n_ceil, lf, ceiling, new_limit)[0]
    rng = random.Random(seed)
    n, weights, shares = int(round(tail.total)), tail.counts(), []
    for _ in range(reps):
        est = _tail_estimate(
            tail.resampled(multinomial(rng, n, weights)),
            ceiling,
            new_limit,
            lf,
            list(fit["params"]),
            step=0.1,
            tol=BOOTSTRAP_TOL,
        )
        if est is not None:
            shares.append(est[0])
    if not shares or point <= 0:
        return (1.0, 1.0), len(shares)
    return (min(1.0, _quantile(shares, 0.025) / point), max(1.0, _quantile(shares, 0.975) / point)), len(shares)


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))]


def wilson(k: int, n: int, z: float = _Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (contains k / n; [0, 1] for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p, zz = k / n, z * z
    mid, half = (p + zz / (2 * n)) / (1 + zz / n), z * math.sqrt(p * (1 - p) / n + zz / (4 * n * n)) / (1 + zz / n)
    return max(0.0, min(p, mid - half)), min(1.0, max(p, mid + half))


def loop_share(loop_fraction: float, loop_sample: tuple[int, int] | None) -> dict:
    """The loop share used: a known fraction, or a sample's with its Wilson interval.

    Below MIN_LOOP_SAMPLES sampled truncated completions the sample does not count: the loop
    share is the given one (default 0), as with no sample at all, and ``needed`` says how many
    more it takes (one small re-sample cannot swing the headline; #41: the same interval as
    a what-if over shards, which have no sample).
    """
    if loop_sample is None:
        lf = min(1.0, max(0.0, float(loop_fraction or 0.0)))
        return {"point": lf, "interval": [lf, lf], "loops": None, "sampled": None, "used": True, "needed": 0}
    k, n = int(loop_sample[0]), int(loop_sample[1])
    if n < MIN_LOOP_SAMPLES:
        lf = min(1.0, max(0.0, float(loop_fraction or 0.0)))
        return {
            "point": lf,
            "interval": [lf, lf],
            "loops": k,
            "sampled": n,
            "used": False,
            "needed": MIN_LOOP_SAMPLES - n,
        }
    return {"point": k / n, "interval": list(wilson(k, n)), "loops": k, "sampled": n, "used": True, "needed": 0}


# ---------------------------------------------------------------- the what-if


def _base_result(ceiling: int | None, new_limit: int, s_c: float, loops: dict) -> dict:
    return {
        "limit": int(new_limit),
        "ceiling": ceiling,
        "truncated_fraction": None,
        "interval": [0.0, s_c],
        "extra_tokens_per_completion": None,
        "extra_tokens_interval": [0.0, s_c * max(0, new_limit - (ceiling or 0))],
        "model": None,
        "model_reason": None,
        "band": {},
        "extra_tokens_band": {},
        "hard_bounds": [0.0, s_c],
        "current_truncated_fraction": s_c,
        "loop_fraction": loops["point"],
        "loops": loops,
        "backtest": None,
        "note": NOTE,
        "curve": [],
    }


def _censored_rows(hist: LengthHist, ceiling: int) -> tuple[list[CensoredRow], int, int]:
    used, _est, _src = length_source(hist)
    rows = [(t, fr == LENGTH, n) for t, fr, _e, n in used.rows()]
    n_total = sum(n for _t, _c, n in rows)
    n_ceil = sum(n for t, cz, n in rows if cz and t >= ceiling)
    return rows, n_total, n_ceil


def _lowered(
    result: dict[str, Any], rows: Sequence[CensoredRow], n_total: int, ceiling: int, new_limit: int
) -> dict[str, Any]:
    """A limit at or below the ceiling needs no model: the lengths below C were observed."""
    still = sum(n for t, _cz, n in rows if t >= new_limit)
    lost = sum(n * (min(t, ceiling) - min(t, new_limit)) for t, _cz, n in rows)
    result.update(
        truncated_fraction=still / n_total,
        interval=[still / n_total] * 2,
        extra_tokens_per_completion=-lost / n_total,
        extra_tokens_interval=[-lost / n_total] * 2,
        model="empirical",
        model_reason="the lengths below the ceiling were observed",
        note="Limit at or below the observed ceiling: exact from the observed lengths.",
    )
    return result


def _analyse(rows: Sequence[CensoredRow], ceiling: int, new_limit: int, loops: dict) -> dict | None:
    """Fit every model, back-test them, choose the headline; None when the tail cannot be modelled."""
    tail = _tail_cells(rows, ceiling)
    if tail is None:
        return None
    lf = loops["point"]
    models, params = _fit_models(rows, tail, ceiling, lf)
    ratio = max(new_limit, ceiling + 1) / ceiling
    aic = [m[: -len(" (AIC)")] for m in models if m.endswith(" (AIC)")]
    checks = backtest(rows, ceiling, max(new_limit, ceiling + 1), lf, aic)
    errors, errors_extra = backtest_errors(checks, ratio), backtest_errors(checks, ratio, "_extra")
    head, reason = choose_headline(models, errors, checks)
    return {
        "ceiling": ceiling,
        "tail": tail,
        "models": models,
        "params": params,
        "lf": lf,
        "lf_range": loops["interval"],
        "ratio": ratio,
        "checks": checks,
        "errors": errors,
        "errors_extra": errors_extra,
        "head": head,
        "reason": reason,
    }


def _backtest_summary(fit: dict) -> dict | None:
    checks, head = fit["checks"], fit["head"]
    if not checks:
        return None
    return {
        "checks": [
            {
                "cut": c["cut"],
                "limit": c["limit"],
                "truth": c["truth"],
                "predicted": c["predicted"].get(head),
                "truth_extra": c["truth_extra"],
                "predicted_extra": c["predicted_extra"].get(head),
                "by_model": c["predicted"],
            }
            for c in checks
        ],
        "errors": fit["errors"],
        "extra_errors": fit["errors_extra"],
        "model": head,
    }


def what_if(
    hist: LengthHist,
    ceiling: int | None,
    new_limit: int,
    *,
    loop_fraction: float = 0.0,
    loop_sample: tuple[int, int] | None = None,
    bootstrap: int = BOOTSTRAP,
    seed: int = 0,
    curve_limits: tuple[int, ...] = (),
) -> WhatIf:
    """Estimate the share still truncated, and the extra tokens, if max_tokens were ``new_limit``.

    Args:
        hist: the run's length counts (exact rows unless all are estimated).
        ceiling: the current max_tokens; detected from the data when None.
        new_limit: the proposed max_tokens.
        loop_fraction: known share of truncated completions that are repetition loops.
        loop_sample: ``(loops, sampled)`` truncated completions from a sample (loops.py); when
            given it replaces ``loop_fraction`` and its uncertainty enters the interval.
        bootstrap: multinomial bootstrap replicates of the tail log-normal (0 to skip).
        seed: bootstrap seed (results are deterministic).
        curve_limits: limits to also evaluate from the same fits, as ``result["curve"]`` (the
            bootstrap's relative spread at ``new_limit`` is applied to each).

    Returns:
        The `WhatIf`; degenerate data give the hard bounds and a note, never an exception.
    """
    ceiling = int(ceiling) if ceiling is not None else detect_ceiling(hist)
    loops = loop_share(loop_fraction, loop_sample)
    if ceiling is None:
        result = _base_result(None, new_limit, 0.0, loops)
        result.update(
            truncated_fraction=0.0,
            extra_tokens_per_completion=0.0,
            note="No max_tokens ceiling detected: nothing is cut off at a limit.",
        )
        return _typed(result)
    rows, n_total, n_ceil = _censored_rows(hist, ceiling)
    s_c = n_ceil / n_total if n_total else 0.0
    result = _base_result(ceiling, new_limit, s_c, loops)
    if n_total == 0 or n_ceil == 0:
        result.update(
            truncated_fraction=0.0,
            interval=[0.0, 0.0],
            extra_tokens_per_completion=0.0,
            extra_tokens_interval=[0.0, 0.0],
            note="No completion stopped at the ceiling.",
        )
        return _typed(result)
    if new_limit <= ceiling:
        return _typed(_lowered(result, rows, n_total, ceiling, new_limit))
    fit = _analyse(rows, ceiling, new_limit, loops)
    if fit is None:
        result["note"] = (
            "Too few completions finished below the ceiling to model the tail: only the hard bounds are known. " + NOTE
        )
        return _typed(result)
    boot, reps = _bootstrap(fit, new_limit, bootstrap, seed) if bootstrap > 0 else ((1.0, 1.0), 0)
    result.update(
        at_limit(fit, new_limit, boot),
        model=fit["head"],
        model_reason=fit["reason"],
        backtest=_backtest_summary(fit),
        bootstrap_reps=reps,
        curve=[at_limit(fit, x, boot) for x in sorted(set(curve_limits)) if x > ceiling],
    )
    return _typed(result)


def what_if_curve(
    hist: LengthHist,
    ceiling: int,
    limits: list[int],
    *,
    new_limit: int | None = None,
    loop_fraction: float = 0.0,
    loop_sample: tuple[int, int] | None = None,
) -> list[dict]:
    """The headline and its calibrated interval at several limits, from one set of fits.

    ``new_limit`` is the limit the back-test is scaled to (default: the largest of ``limits``).

    Returns:
        One `at_limit` dict per limit above the ceiling (no bootstrap: the curve's band comes
        from the models and the back-test); empty when the tail cannot be modelled.
    """
    rows, n_total, n_ceil = _censored_rows(hist, ceiling)
    above = sorted(set(x for x in limits if x > ceiling))
    if n_total == 0 or n_ceil == 0 or not above:
        return []
    fit = _analyse(rows, ceiling, new_limit or above[-1], loop_share(loop_fraction, loop_sample))
    return [at_limit(fit, x) for x in above] if fit else []


def forecast_outcome(forecast: WhatIf, hist: LengthHist) -> dict | None:
    """How a what-if forecast did, given a later run's lengths at the forecast's limit.

    Returns:
        ``{"limit", "forecast", "interval", "observed", "covered", "error"}`` (shares of all
        completions), or None when the later run has no completions or the forecast no estimate.
    """
    if forecast.truncated_fraction is None:
        return None
    rows, n_total, n_ceil = _censored_rows(hist, forecast.limit_tokens)
    if n_total == 0:
        return None
    observed = n_ceil / n_total
    lo, hi = forecast.interval
    return {
        "limit": forecast.limit_tokens,
        "forecast": forecast.truncated_fraction,
        "interval": [lo, hi],
        "observed": observed,
        "covered": lo <= observed <= hi,
        "error": forecast.truncated_fraction - observed,
    }


# ---------------------------------------------------------------- the one what-if of a run


def curve_limits(ceiling: int, chosen: int) -> tuple[int, ...]:
    """The limits the what-if chart shows: a few between the ceiling and 4x it, and the chosen one."""
    return tuple(sorted({int(ceiling * f) for f in (1.25, 1.5, 2, 2.5, 3, 4)} | {chosen}))


def for_run(
    hist: LengthHist, ceiling: int, new_limit: int, loop_sample: tuple[int, int] | None, bootstrap: int = BOOTSTRAP
) -> WhatIf:
    """The what-if every screen and the CLI show for a run: the Output lengths page, the
    collector's precomputed copy, Compare's forecast check and ``runhealth scan --whatif`` /
    ``runhealth compare``. Same inputs, same interval everywhere.

    Args:
        loop_sample: ``(loops, sampled)`` truncated completions of the run's latest sample
            batch (`loops.loop_sample`): a run with a store has one (an empty batch is
            ``(0, 0)``). It enters once it holds MIN_LOOP_SAMPLES; below that, as with None (no
            samples at all: the CLI over files), there is no loop term, the model's interval
            alone, which `loop_note` says beside the interval.
    """
    return what_if(
        hist,
        ceiling,
        new_limit,
        loop_sample=loop_sample,
        bootstrap=bootstrap,
        curve_limits=curve_limits(ceiling, new_limit),
    )


LOOPS_UNMEASURED = " assuming no loops"


def loop_note(r: WhatIf) -> str:
    """ " assuming no loops" when no measured loop share entered the interval (no sample, or one
    under MIN_LOOP_SAMPLES) and none was given, else "": said beside the interval wherever it is
    shown (tile, Compare, CLI), by one rule for all of them."""
    loops = r.loops or {}
    measured = loops.get("sampled") is not None and loops.get("used")
    return LOOPS_UNMEASURED if not measured and not r.loop_fraction else ""
