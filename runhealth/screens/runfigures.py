"""Two stored runs side by side: the numbers the Compare page shows, without Streamlit.

`run_numbers(store, ...)` reads one run's store (lengths, GPUs, poll history) into the figures
the page compares; `compare_runs(a, b)` puts two of them side by side: the differences B - A
with 95% intervals (runhealth.analysis.runcompare), the rates, A's what-if forecast checked against B, and
the one-sentence "B vs A" headline.

Rates here are averages over the run's whole collected life, not the last minute the
Overview shows (runhealth.rules.activity): a finished run has no "now". The ETA of a live run is the
Overview's (screens/runeta.py: distinct prompts or completions, at the 15-min average), one ETA
everywhere. Each node's rate is a ratio estimator, the tokens of its non-backfill polls over the time they span (the first index of old shards is not
throughput); the run's rate is the sum over nodes. Its interval comes from batch means
(neighbouring polls are alike, so spans are pooled into ~n^(1/3) consecutive batches and the
spread between batches gives a t interval); approximate, as any interval on a drifting rate.
Time is the dashboard's poll clock (`ts_unix`): over a whole run a node's clock skew cancels.

A finished run's poll history never changes, so `finished_life(store)` computes its life
figures once, keeps them in its store (page_data row FINISHED_LIFE, with the history's
`polls_version`) and reads them back while that version holds: a store that changed after all
gets them computed again. Its Overview (derived.final) and Compare read the same figures.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import time
from typing import NamedTuple

from runhealth import textsafe
from runhealth.analysis import loops, rates, runcompare, stats, tokencost
from runhealth.analysis.failed import FailedRequests, failed_requests
from runhealth.analysis.runcompare import Differences, Forecast
from runhealth.analysis.stats import cdf_points as cdf_points  # Compare's cumulative curves (components)
from runhealth.analysis.whatif import BOOTSTRAP
from runhealth.errors import RunhealthError
from runhealth.payloads import pagedata
from runhealth.records import PollRow
from runhealth.screens import runeta
from runhealth.store import Store

Z95 = runcompare.Z95
log = textsafe.get_logger(__name__)


BOTH_AT_CEILING, NOT_MEASURABLE = runcompare.BOTH_AT_CEILING, runcompare.NOT_MEASURABLE


def default_pair(runs: list[tuple[bool, int | None]]) -> tuple[int, int]:
    """Which two of `runs` ((finished, ceiling_tokens) each, config order) Compare opens with:
    (index of A, index of B), A the before and B the after.

    Runs are ordered oldest first: finished before live, then the lower ceiling (a relaunch
    raises it), then config order. B is the newest, A the one just before it, so two live
    runs at 4,096 and 8,192 open as A = 4,096, B = 8,192, as a finished 8,192 run and its live
    4,096 relaunch open as A = 8,192, B = 4,096 (the finished one is older whatever its ceiling).
    """
    order = sorted(range(len(runs)), key=lambda i: (not runs[i][0], runs[i][1] or 10**9, i))
    return order[-2], order[-1]


# The batch-means rate estimator lives with the other rates (the ETA's interval uses it too).
T975, t975, batches, _node_rate = rates.T975, rates.t975, rates.batches, rates.ratio_rate


@dataclasses.dataclass(frozen=True)
class LifeRates:
    """A run's rates over its collected life, summed over nodes, with their variances."""

    tokens_per_s: float | None = None  # None: no node has two polls apart yet
    tokens_var: float = 0.0  # (tok/s)^2
    completions_per_s: float | None = None
    completions_var: float = 0.0
    spans: int = 0  # poll-to-poll spans used
    span_s: float = 0.0  # the longest node's time covered, seconds


def life_rates(polls: list[PollRow]) -> LifeRates:
    """Tokens and completions per second over the collected life, summed over nodes, with variances."""
    by_node: dict[str, list] = {}
    for p in polls:
        by_node.setdefault(p["node"], []).append(
            (p["ts_unix"], p["completions"] or 0, p["tokens"] or 0, bool(p["backfill"]))
        )
    return _life_rates(by_node)


def _life_rates(by_node: dict[str, list]) -> LifeRates:
    """life_rates over each node's points (ts_unix, completions, tokens, backfill), oldest first."""
    tps = cps = None
    tokens_var = completions_var = span_s = 0.0
    n_spans = 0
    for points in by_node.values():
        spans = rates.valid_spans(points)
        pooled = batches(spans)
        tok, comp = _node_rate(spans, 3, pooled), _node_rate(spans, 2, pooled)
        if tok is None or comp is None:
            continue
        tps, cps = (tps or 0.0) + tok[0], (cps or 0.0) + comp[0]
        tokens_var += tok[1]
        completions_var += comp[1]
        n_spans += len(spans)
        span_s = max(span_s, spans[-1][1] - spans[0][0])
    return LifeRates(tps, tokens_var, cps, completions_var, n_spans, span_s)


@dataclasses.dataclass(frozen=True)
class LifeFigures:
    """What a run's whole poll history says: its life rates and when it ran (None: unknown)."""

    life: LifeRates
    started_unix: float | None  # its first poll
    completed_unix: float | None  # its last poll with new completions


def life_figures(store: Store) -> LifeFigures:
    """LifeFigures of a store's whole poll history: life_rates over store.polls(), with the
    five columns it needs read as tuples (a third of the time on a day of 10 s polls)."""
    rows = store.cursor("SELECT node, ts_unix, completions, tokens, backfill FROM polls ORDER BY ts_unix").fetchall()
    by_node: dict[str, list] = {}
    for node, ts, completions, tokens, backfill in rows:
        by_node.setdefault(node, []).append((ts, completions or 0, tokens or 0, bool(backfill)))
    grown = [r[1] for r in rows if r[2]]
    return LifeFigures(
        life=_life_rates(by_node),
        started_unix=rows[0][1] if rows else None,
        completed_unix=max(grown) if grown else None,
    )


FINISHED_LIFE = "finished_life"  # page_data row: a finished run's FinishedLife


@dataclasses.dataclass(frozen=True)
class FinishedLife:
    """The FINISHED_LIFE payload: a finished run's LifeFigures (flat) and the `polls_version` they were computed at."""

    version: tuple[int | float | None, ...]
    life: LifeRates
    started_unix: float | None
    completed_unix: float | None


def polls_version(store: Store) -> tuple[int | float | None, ...]:
    """What the poll history's figures depend on, in one aggregate (milliseconds where reading
    the rows takes most of a second): rows added, removed or changed change it."""
    row = store.cursor(
        "SELECT COUNT(*), MAX(rowid), MIN(ts_unix), MAX(ts_unix), SUM(completions), SUM(tokens),"
        " SUM(backfill), TOTAL(ts_unix) FROM polls"
    ).fetchone()
    return tuple(row)


def finished_life(store: Store) -> LifeFigures:
    """A finished run's LifeFigures: read back from its store while its poll history is the one
    they were computed from, else computed from every poll row once and stored (a store that
    cannot be written, e.g. a read-only file, still gets them, computed each time)."""
    version = polls_version(store)
    stored = pagedata.get(store, FINISHED_LIFE, FinishedLife)  # one that does not fit: logged, None
    if stored is not None and stored[1].version == version:
        return LifeFigures(stored[1].life, stored[1].started_unix, stored[1].completed_unix)
    figures = life_figures(store)
    try:
        payload = FinishedLife(version, figures.life, figures.started_unix, figures.completed_unix)
        pagedata.put(store, {FINISHED_LIFE: payload}, time.time())
    except (sqlite3.Error, RunhealthError) as exc:
        log.warning("final figures not stored in %s (%s): computed on every read", store.path, exc)
    return figures


def _interval(value: float | None, var: float, scale: float = 1.0) -> list[float] | None:
    if value is None or not math.isfinite(var):
        return None
    half = Z95 * math.sqrt(var)
    return [max(0.0, value - half) * scale, (value + half) * scale]  # a rate is never below 0


@dataclasses.dataclass(frozen=True)
class RunNumbers:
    """One run's figures for the Compare page."""

    name: str
    finished: bool
    hist: stats.LengthHist
    summary: stats.Summary
    gpus: int  # GPUs its nodes reported
    target: int | None  # completions
    as_of: float | None  # last collection, unix seconds
    life: LifeRates
    tokens_per_s_per_gpu: float | None  # over its collected life
    tokens_per_s_per_gpu_interval: list[float] | None  # 95%
    completions_per_hour: float | None
    completions_per_hour_interval: list[float] | None
    eta_s: float | None  # the Overview's ETA (15-min average); None when finished or no rate
    loop_sample: tuple[int, int] | None  # the what-if's loop term (whatif.for_run)
    energy: tokencost.EnergyCost | None = None  # GPU energy per usable token (#33); None: no GPU energy
    eta_basis: runeta.Basis = "completions"  # the ETA's: distinct prompts with expected_prompts (screens/runeta.py)
    eta_why_none: str = ""  # why a live run has no ETA: "run stalled", "numbers stale", "after 15 min of writing"
    failed: FailedRequests | None = None  # failed requests beside its completions (#39; analysis/failed.py)


def run_numbers(
    store: Store, name: str, ceiling: int | None, target: int | None, finished: bool, now: float | None = None
) -> RunNumbers:
    """One run's figures for the Compare page (see the module docstring for the rates), its
    ETA at `now` (default: the clock)."""
    hist = stats.LengthHist.from_rows(store.run_length_rows())
    nodes = store.counted_nodes()
    summary = stats.summarize(hist, ceiling=ceiling, unparseable=sum(n["malformed"] or 0 for n in nodes))
    gpus = sum(n["gpus_found"] or 0 for n in nodes)
    life = (finished_life(store) if finished else life_figures(store)).life
    tps, cps = life.tokens_per_s, life.completions_per_s
    per_gpu = tps / gpus if tps is not None and gpus else None
    basis, why = (None, "") if finished else runeta.store_eta(store, summary, target, _now(now))
    eta = basis.eta_s if basis else None
    return RunNumbers(
        name=name,
        finished=finished,
        hist=hist,
        summary=summary,
        gpus=gpus,
        target=target,
        as_of=store.last_collection_unix(),
        life=life,
        tokens_per_s_per_gpu=per_gpu,
        tokens_per_s_per_gpu_interval=_interval(per_gpu, life.tokens_var / gpus**2) if per_gpu else None,
        completions_per_hour=cps * 3600 if cps is not None else None,
        completions_per_hour_interval=_interval(cps, life.completions_var, 3600) if cps else None,
        eta_s=eta,
        loop_sample=loops.loop_sample(store.latest_sample_batch()),
        energy=tokencost.energy_cost(store.node_energy()),
        eta_basis=basis.basis if basis else "completions",
        eta_why_none=why,
        failed=failed_requests(store.failed_rows(), summary.completions),
    )


def sample_size(s: stats.Summary) -> str:
    """A run's n as every caption on the Compare page says it: the completions its shares and
    length statistics count (`length_count`), with those whose length was only estimated said
    beside it when there are any (#41: one caption said 30,247, another 30,057 for one run)."""
    left_out = s.completions - s.length_count
    return f"{s.length_count:,} completions" + (
        f" (of {s.completions:,}; {left_out:,} without an exact length)" if left_out > 0 else ""
    )


def _now(now: float | None) -> float:
    return time.time() if now is None else now


class RateChange(NamedTuple):
    """(b - a) / a with its 95% interval (None when a variance is not finite)."""

    relative: float
    relative_interval: list[float] | None


def relative_change(a: float | None, var_a: float, b: float | None, var_b: float) -> RateChange | None:
    """(b - a) / a with a delta-method 95% interval (independent a and b)."""
    if a is None or b is None or a <= 0:
        return None
    rel = (b - a) / a
    if not (math.isfinite(var_a) and math.isfinite(var_b)):
        return RateChange(rel, None)
    se = math.sqrt(var_b + (b / a) ** 2 * var_a) / a
    return RateChange(rel, [max(-1.0, rel - Z95 * se), rel + Z95 * se])  # a rate falls by 100% at most


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Run B against run A: what the Compare page shows under its two pickers."""

    differences: Differences | None  # None when a run has no completions yet
    rates: dict[str, RateChange | None]  # "tokens_per_s_per_gpu", "completions_per_hour"
    forecast: Forecast | None
    forecast_note: str  # why there is no forecast, or what it assumes
    headline: str


def compare_runs(a: RunNumbers, b: RunNumbers, bootstrap: int = BOOTSTRAP) -> Comparison:
    """Run B against run A: differences, rate changes, forecast check and the headline."""
    sa, sb = a.summary, b.summary
    if not sa.completions or not sb.completions:
        return Comparison(
            differences=None,
            rates={},
            forecast=None,
            forecast_note="no forecast check: a run has no completions yet",
            headline=f"{b.name} vs {a.name}: no completions to compare yet",
        )
    diffs = runcompare.differences(a.hist, sa, b.hist, sb)
    la, lb = a.life, b.life
    gpu_a, gpu_b = max(a.gpus, 1), max(b.gpus, 1)
    rate_changes = {
        "tokens_per_s_per_gpu": relative_change(
            a.tokens_per_s_per_gpu, la.tokens_var / gpu_a**2, b.tokens_per_s_per_gpu, lb.tokens_var / gpu_b**2
        ),
        "completions_per_hour": relative_change(
            la.completions_per_s, la.completions_var, lb.completions_per_s, lb.completions_var
        ),
    }
    forecast, note = runcompare.forecast_check(a.hist, sa, b.hist, sb, bootstrap=bootstrap, loop_sample=a.loop_sample)
    return Comparison(
        differences=diffs,
        rates=rate_changes,
        forecast=forecast,
        forecast_note=note,
        headline=headline(sa, sb, diffs, rate_changes),
    )


def headline(
    sum_a: stats.Summary, sum_b: stats.Summary, diffs: Differences, rate_changes: dict[str, RateChange | None]
) -> str:
    """runhealth.analysis.runcompare's sentence, plus the tok/s per GPU change (with its 95% interval)
    when both runs have a rate."""
    text = runcompare.headline(sum_a, sum_b, diffs)
    tps = rate_changes.get("tokens_per_s_per_gpu")
    if tps is not None:
        text += f"; tok/s per GPU {_signed_pct(tps.relative)}"
        iv = tps.relative_interval
        if iv is not None:  # a rate from polls is an estimate: its interval goes with it
            text += f" ({_signed_pct(iv[0])} to {_signed_pct(iv[1])})"
    return text


def _signed_pct(x: float) -> str:
    return f"{'+' if x >= 0 else '−'}{abs(100 * x):.0f}%"


def fmt_interval(iv: list[float] | None, scale: float = 1.0, fmt: str = "{:+,.0f}") -> str:
    return "—" if iv is None else f"{fmt.format(iv[0] * scale)} to {fmt.format(iv[1] * scale)}"


def comparison_rows(a: RunNumbers, b: RunNumbers, cmp: Comparison) -> list[dict[str, str]]:
    """The side-by-side table: metric, A, B, B - A and its 95% interval, all as display text."""
    rows = [*_length_rows(a.summary, b.summary, cmp.differences), *_rate_rows(a, b, cmp.rates)]
    rows.append({"metric": "ETA", "A": _eta_text(a), "B": _eta_text(b), "B − A": "", "95% interval": ""})
    return rows


def _length_rows(sa: stats.Summary, sb: stats.Summary, d: Differences | None) -> list[dict[str, str]]:
    """The share cut, mean and percentile rows (none before both runs have completions)."""
    if d is None:
        return []
    rows = []
    share = d["truncated_fraction"]
    if share:
        ia, ib = (stats.wilson_interval(s.at_ceiling, s.length_count) for s in (sa, sb))
        rows.append(
            {
                "metric": "cut at the ceiling",
                "A": f"{100 * share['a']:.1f}% ({100 * ia[0]:.1f}–{100 * ia[1]:.1f})",
                "B": f"{100 * share['b']:.1f}% ({100 * ib[0]:.1f}–{100 * ib[1]:.1f})",
                "B − A": f"{100 * share['difference']:+.1f} pts",
                "95% interval": fmt_interval(share["interval"], 100, "{:+.1f}") + " pts",
            }
        )
    mean = d["mean_tokens"]
    if mean:
        rows.append(
            {
                "metric": "mean tokens per completion",
                "A": f"{mean['a']:,.0f}",
                "B": f"{mean['b']:,.0f}",
                "B − A": f"{mean['difference']:+,.0f} ({100 * (mean['relative'] or 0):+.0f}%)",
                "95% interval": fmt_interval(mean["interval"]),
            }
        )
    for label, p in (("median", d["p50"]), ("P90", d["p90"]), ("P99", d["p99"])):
        if p:
            rows.append(_percentile_row(f"{label} tokens", p))
    return rows


def _percentile_row(metric: str, p: runcompare.PercentileDiff) -> dict[str, str]:
    """A percentile's row. One at its run's ceiling is only a lower bound (those completions were
    cut): its cell reads "≥"; B - A and its interval are runcompare.percentile_texts' (a bound and a
    one-sided interval when a run is censored, "not measurable" when both are)."""
    cut = p["at_ceiling"]
    cells = {k.upper(): ("≥ " if k in cut else "") + f"{value:,}" for k, value in (("a", p["a"]), ("b", p["b"]))}
    diff, interval = runcompare.percentile_texts(p)
    return {"metric": metric, **cells, "B − A": diff, "95% interval": interval}


def _rate_rows(a: RunNumbers, b: RunNumbers, changes: dict[str, RateChange | None]) -> list[dict[str, str]]:
    out = []
    for key, label in (("tokens_per_s_per_gpu", "tok/s per GPU"), ("completions_per_hour", "completions per hour")):
        ch = changes.get(key)
        cells = [_rate_cell(getattr(r, key), getattr(r, key + "_interval")) for r in (a, b)]
        out.append(
            {
                "metric": label,
                "A": cells[0],
                "B": cells[1],
                "B − A": f"{100 * ch.relative:+.1f}%" if ch else "—",
                "95% interval": fmt_interval(ch.relative_interval, 100, "{:+.1f}") + "%"
                if ch and ch.relative_interval
                else "—",
            }
        )
    return out


def _rate_cell(value: float | None, interval: list[float] | None) -> str:
    if value is None:
        return "no rate yet"
    return f"{value:,.0f}" + (f" ({interval[0]:,.0f}–{interval[1]:,.0f})" if interval else "")


def _eta_text(r: RunNumbers) -> str:
    if r.finished:
        return "finished"
    if r.eta_s is None:  # the Overview's rule (runeta.shown_eta), and why
        return f"— ({r.eta_why_none or 'no target or rate'})"
    if r.eta_basis == "prompts":
        return f"{r.eta_s / 3600:,.1f} h (distinct prompts)" if r.eta_s else "all expected prompts answered"
    return f"{r.eta_s / 3600:,.1f} h" if r.eta_s else "target reached"


def overlay_bins(hist: stats.LengthHist, width: int, max_tokens: int) -> list[tuple[int, float]]:
    """(bin_start, share of the run's completions) on fixed `width`-token bins up to `max_tokens`,
    the same edges for every run so two runs overlay; a ceiling's pile-up lands in the bin
    starting at it (ceilings are multiples of the width on the usual limits)."""
    pairs = stats.length_source(hist)[0].length_pairs()
    n = sum(c for _t, c in pairs)
    bins = [0] * (max_tokens // width + 1)
    for tokens, count in pairs:
        bins[min(tokens // width, len(bins) - 1)] += count
    return [(i * width, c / n) for i, c in enumerate(bins)] if n else []


def overlay_width(max_tokens: int) -> int:
    """A bin width giving about 80 bins over `max_tokens` (a power of two times 64: ceilings sit on edges)."""
    width = 64
    while max_tokens / width > 80:
        width *= 2
    return width
