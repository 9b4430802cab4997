"""The Compare page's model: run B against run A, both read at one instant.

`compare(a, b, now)` takes the two runs' figures (`runfigures.run_numbers`, each read from its
own store) and builds what the page lays out: how old each run's numbers are (a live run's in
red once older than its stale_after), why there is nothing to compare yet, and otherwise the
comparison (`runfigures.compare_runs`: differences with their intervals, a censored percentile
as a one-sided bound, the rates, A's forecast checked against B, the headline) with its table
rows as display text, and whether B answered A's prompts (`prompt_overlap`: the two stores'
hashed prompt IDs, #33 item 1). The page (pages/compare.py) only lays this record out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from runhealth.ages import fmt_age, fmt_ago
from runhealth.analysis.fieldfigures import NO_ID_MESSAGE, compare_prompts
from runhealth.analysis.whatif import BOOTSTRAP
from runhealth.screens import waste as waste_words
from runhealth.screens.runfigures import Comparison, RunNumbers, compare_runs, comparison_rows
from runhealth.screens.words import NA, fmt_count, fmt_share
from runhealth.store import Store


@dataclasses.dataclass(frozen=True)
class AsOf:
    """How old one run's numbers are, in words, and whether that is too old (level "alert")."""

    text: str
    level: str  # "ok" or "alert"


@dataclasses.dataclass(frozen=True)
class PromptOverlap:
    """How many of run A's distinct prompts run B answered (fieldfigures.compare_prompts), or,
    when a run's shards have no prompt ID, which one and how to configure it (`line`)."""

    a_prompts: int | None
    b_prompts: int | None
    in_both: int | None
    share: float | None  # of A's prompts, the share B answered
    missing_from_b: int | None
    line: str


def prompt_overlap(a: Store, b: Store, a_name: str = "A", b_name: str = "B") -> PromptOverlap:
    """B's answers against A's prompt set: one read-only join of the two stores' hash tables
    (Store.prompt_overlap), exact up to the 64-bit hashes' collision rate (node/fields.py)."""
    o = a.prompt_overlap(b.path)
    lacking = [
        f"{k} ({name})" for k, name, n in (("A", a_name, o["a_prompts"]), ("B", b_name, o["b_prompts"])) if not n
    ]
    if lacking:
        line = f"Prompts answered cannot be compared: run {' and '.join(lacking)} has no prompt IDs: {NO_ID_MESSAGE}"
        return PromptOverlap(o["a_prompts"], o["b_prompts"], o["in_both"], None, None, line)
    upgraded = [f"{k} ({name})" for k, name, s in (("A", a_name, a), ("B", b_name, b)) if s.meta("prompt_ids_since")]
    if upgraded:  # #40 item 4: such a run's prompt set is only its lines since the upgrade
        line = (
            f"Prompts answered cannot be compared in full: run {' and '.join(upgraded)} read prompt IDs only"
            f" since its store was upgraded mid-run (A {fmt_count(o['a_prompts'])} and B"
            f" {fmt_count(o['b_prompts'])} distinct prompts counted, {fmt_count(o['in_both'])} in both)"
        )
        return PromptOverlap(o["a_prompts"], o["b_prompts"], o["in_both"], None, None, line)
    c = compare_prompts(o["a_prompts"], o["b_prompts"], o["in_both"])
    line = f"{c['line']} (B answered {fmt_count(o['b_prompts'])} distinct prompts, A {fmt_count(o['a_prompts'])})"
    return PromptOverlap(o["a_prompts"], o["b_prompts"], o["in_both"], c["share"], c["missing_from_b"], line)


@dataclasses.dataclass(frozen=True)
class Compare:
    """Run B against run A at `now`: the two runs' figures, their ages and, once both have
    completions, the comparison and its table."""

    now: float
    a: RunNumbers
    b: RunNumbers
    as_of: tuple[AsOf, AsOf]
    empty: str  # why there is nothing to compare ("" when there is)
    comparison: Comparison | None
    rows: tuple[dict[str, str], ...]  # the side-by-side table: metric, A, B, B − A, 95% interval
    prompts: PromptOverlap | None = None  # B's answers against A's prompts (None: not read)

    @property
    def headline(self) -> str:
        return self.comparison.headline if self.comparison else self.empty

    def to_json(self) -> dict[str, Any]:
        """The record as JSON: headline, each run's as-of line, the differences and forecast."""
        c = self.comparison
        return {
            "now_unix": self.now,
            "a": self.a.name,
            "b": self.b.name,
            "headline": self.headline,
            "as_of": [dataclasses.asdict(x) for x in self.as_of],
            "differences": c.differences if c else None,
            "forecast": c.forecast if c else None,
            "forecast_note": c.forecast_note if c else self.empty,
            "rows": list(self.rows),
            "prompts": dataclasses.asdict(self.prompts) if self.prompts else None,
            "failed": {k: r.failed.to_json() if r.failed else None for k, r in (("a", self.a), ("b", self.b))},
        }


def as_of(label: str, r: RunNumbers, stale_after: float, now: float) -> AsOf:
    """`label: Numbers as of <clock> (<age> ago)`; a live run's in red past its stale_after."""
    if r.as_of is None:
        return AsOf(f"{label}: waiting for first poll", "ok")
    age = now - r.as_of  # fmt_ago says when that is after now (a clock moved back)
    text = f"{label}: Numbers as of {time.strftime('%H:%M:%S', time.localtime(r.as_of))} ({fmt_ago(age)})"
    if r.finished:
        return AsOf(f"{text} · finished, not polled any more", "ok")
    if age > stale_after:
        return AsOf(f"⚠ {text}: older than {fmt_age(stale_after)}, these numbers are stale.", "alert")
    return AsOf(text, "ok")


def compare(
    a: RunNumbers,
    b: RunNumbers,
    stale_after: tuple[float, float],
    now: float,
    comparison: Comparison | None = None,
    bootstrap: int = BOOTSTRAP,
    prompts: PromptOverlap | None = None,
) -> Compare:
    """Run B against run A at `now` (`stale_after`: each run's, seconds). `comparison`: the
    runs' `compare_runs(a, b)` when the caller has it already (the page reuses it while both
    runs' numbers stand), else it is computed here; `prompts`: the runs' prompt_overlap."""
    ages = (as_of(f"A {a.name}", a, stale_after[0], now), as_of(f"B {b.name}", b, stale_after[1], now))
    missing = [r.name for r in (a, b) if not r.summary.completions]
    if missing:
        empty = "No completions in " + " and ".join(missing) + " yet: nothing to compare."
        return Compare(now, a, b, ages, empty, None, (), prompts)
    cmp = comparison if comparison is not None else compare_runs(a, b, bootstrap)
    rows = tuple(comparison_rows(a, b, cmp)) + cost_rows(a, b) + failed_rows(a, b)
    return Compare(now, a, b, ages, "", cmp, rows, prompts)


def failed_rows(a: RunNumbers, b: RunNumbers) -> tuple[dict[str, str], ...]:
    """Each run's failed requests, a share of its requests (#39; analysis/failed.py's words)."""
    fa, fb = a.failed, b.failed
    if fa is None or fb is None:
        return ()
    sa, sb = fa.share, fb.share
    diff = f"{100 * (sb - sa):+.1f} pts" if sa is not None and sb is not None else ""
    return ({"metric": "failed requests", "A": fa.value, "B": fb.value, "B − A": diff, "95% interval": "exact"},)


def _relative(x: float | None, y: float | None) -> str:
    return f"{100 * (y - x) / x:+.0f}%" if x and y is not None else ""


def cost_rows(a: RunNumbers, b: RunNumbers) -> tuple[dict[str, str], ...]:
    """What the cut cost in each run (#33): the share of tokens cut at the ceiling, tokens per
    usable completion, and energy and GPU-hours per 1M usable tokens (did raising the limit cost
    more energy per usable token?). Exact counts; energy over each run's measured polls."""
    sa, sb = a.summary, b.summary
    per_a, per_b = sa.tokens_per_usable, sb.tokens_per_usable
    ea, eb = a.energy, b.energy
    ja, jb = (e.joules_per_m if e else None for e in (ea, eb))
    ha, hb = (e.gpu_hours_per_m if e else None for e in (ea, eb))
    cut_a, cut_b = sa.at_ceiling_token_fraction, sb.at_ceiling_token_fraction
    return (
        {
            "metric": "tokens cut at the ceiling",
            "A": fmt_share(cut_a) if sa.tokens_total else NA,
            "B": fmt_share(cut_b) if sb.tokens_total else NA,
            "B − A": f"{100 * (cut_b - cut_a):+.1f} pts" if sa.tokens_total and sb.tokens_total else "",
            "95% interval": "exact",
        },
        {
            "metric": "tokens per usable completion",
            "A": fmt_count(per_a),
            "B": fmt_count(per_b),
            "B − A": _relative(per_a, per_b),
            "95% interval": "exact",
        },
        {
            "metric": "energy per 1M usable tokens",
            "A": waste_words.per_m_joules(ea),
            "B": waste_words.per_m_joules(eb),
            "B − A": _relative(ja, jb),
            "95% interval": "measured: " + " / ".join(waste_words.energy_source(e) if e else NA for e in (ea, eb)),
        },
        {
            "metric": "GPU-hours per 1M usable tokens",
            "A": waste_words.per_m_gpu_hours(ea),
            "B": waste_words.per_m_gpu_hours(eb),
            "B − A": _relative(ha, hb),
            "95% interval": "measured",
        },
    )
