"""The per-line field panels of Output lengths (#33 items 3, 4, 5), worded, from one figures read.

`panels(figures)` turns analysis/fieldfigures.figures' dict (screens/fieldmodel.field_figures,
read with the page's model) into the three panels the page lays out: "Cut before answering"
(among completions cut at the ceiling: never answered vs cut mid-answer, each with its 95%
Wilson interval), "Label checks" (completions at or above the ceiling labelled other than
`length`; `length` stops below it that filled the context window) and "Which prompts get cut"
(the cut share per group with its interval, the most cut first). `recovered(...)` is the
what-if's part: how many never-answered cuts a higher limit would let finish, under the
assumption its caption states. A figure whose field the shards lack keeps the message naming
the field and how to configure it; it is never shown as a zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from runhealth.analysis.stats import wilson_interval
from runhealth.screens.words import fmt_count, fmt_share

RECOVERED_ASSUMPTION = (
    "Assumes the never-answered cuts finish below the new limit as often as all cut completions do "
    "(the what-if's share). They were still reasoning when cut, so fewer may finish: read it as an upper estimate."
)


@dataclasses.dataclass(frozen=True)
class Part:
    """k of n with its 95% Wilson interval."""

    k: int
    n: int
    lo: float
    hi: float

    @property
    def share(self) -> float | None:
        return self.k / self.n if self.n else None


def part(k: int, n: int) -> Part:
    return Part(k, n, *wilson_interval(k, n))


@dataclasses.dataclass(frozen=True)
class CutSplit:
    """Completions cut at the ceiling: never answered (all budget spent reasoning) vs cut mid-answer."""

    cut: int | None  # `length` stops at the ceiling (None: the shards lack the field)
    never_answered: Part | None
    mid_answer: Part | None
    message: str | None  # which field is missing and how to configure it


@dataclasses.dataclass(frozen=True)
class LabelChecks:
    """Labels that lie: completions at or above the ceiling not labelled `length`, and `length`
    stops below it that filled the context window (exact counts; "0 mislabelled" is a result)."""

    mislabelled: int | None
    by_reason: dict[str, int]
    ceiling: int | None
    mislabelled_message: str | None
    context_stops: int | None
    context_checked: int | None  # `length` stops below the ceiling whose prompt tokens are known
    max_model_len: int | None
    context_message: str | None


@dataclasses.dataclass(frozen=True)
class GroupCut:
    group: str
    completions: int
    cut: int  # stopped by `length` at the ceiling (stats.is_cut); every `length` stop where unsplit
    below_ceiling: int | None  # `length` stops below the ceiling (context window); None: unsplit
    share: float | None
    lo: float
    hi: float


@dataclasses.dataclass(frozen=True)
class GroupCuts:
    """The `length` share per group with its interval, the most cut first."""

    field: str | None  # the grouping field, or None for prompt-token bins
    rows: tuple[GroupCut, ...]
    message: str | None
    counts: str = "cut"  # what `cut` counts: "cut" (at the ceiling) or "length stops" (no split)
    note: str | None = None  # why the stops are not split at the ceiling (counts "length stops")

    @property
    def label(self) -> str:
        return self.field or "prompt tokens (bins)"


@dataclasses.dataclass(frozen=True)
class FieldPanels:
    split: CutSplit
    labels: LabelChecks
    groups: GroupCuts


def cut_split(u: Mapping[str, Any]) -> CutSplit:
    if u.get("never_answered") is None:
        return CutSplit(None, None, None, u.get("message"))
    n = int(u["length_stops"])
    return CutSplit(n, part(int(u["never_answered"]), n), part(int(u["cut_mid_answer"]), n), None)


def label_checks(mis: Mapping[str, Any], ctx: Mapping[str, Any]) -> LabelChecks:
    return LabelChecks(
        mislabelled=mis.get("count"),
        by_reason=dict(mis.get("by_reason") or {}),
        ceiling=mis.get("ceiling"),
        mislabelled_message=mis.get("message"),
        context_stops=ctx.get("count"),
        context_checked=ctx.get("length_below_ceiling_with_prompt_tokens"),
        max_model_len=ctx.get("max_model_len"),
        context_message=ctx.get("message"),
    )


def group_cuts(g: Mapping[str, Any]) -> GroupCuts:
    rows = tuple(
        GroupCut(
            r["group"],
            r["completions"],
            r["length_stops"] if r.get("cut") is None else r["cut"],
            r.get("below_ceiling"),
            r["share"],
            r["low"],
            r["high"],
        )
        for r in g.get("rows") or []
    )
    return GroupCuts(g.get("field"), rows, g.get("message"), g.get("counts") or "length stops", g.get("note"))


def panels(figures: Mapping[str, Any]) -> FieldPanels:
    """The three panels from one `fieldfigures.figures` dict."""
    return FieldPanels(
        cut_split(figures["unanswered"]),
        label_checks(figures["mislabelled"], figures["context_stops"]),
        group_cuts(figures["groups"]),
    )


@dataclasses.dataclass(frozen=True)
class Recovered:
    """Never-answered cuts a higher limit would let finish (an estimate: RECOVERED_ASSUMPTION)."""

    limit: int
    never_answered: int
    finish_share: float  # of all cut completions, the what-if's share that would finish below `limit`
    finish_interval: tuple[float, float]
    answers: float
    answers_interval: tuple[float, float]

    def line(self) -> str:
        lo, hi = self.answers_interval
        return (
            f"Raising max_tokens to {self.limit:,} would let about {fmt_count(self.answers)} of the "
            f"{fmt_count(self.never_answered)} never-answered cuts finish (95% {fmt_count(lo)}–{fmt_count(hi)}): "
            f"the what-if says {fmt_share(self.finish_share)} of cut completions finish below {self.limit:,}."
        )


def recovered(
    split: CutSplit, limit: int, now_fraction: float, at_limit: float | None, interval: tuple[float, float]
) -> Recovered | None:
    """How many never-answered cuts finish below `limit`: their count times the share of cut
    completions the what-if expects to finish there, 1 - (share still cut at `limit`) / (share
    cut now). None without the reasoning field, a fraction at the limit, or anything cut now."""
    if split.never_answered is None or at_limit is None or not now_fraction:
        return None
    never = split.never_answered.k

    def finish(still: float) -> float:
        return min(1.0, max(0.0, 1.0 - still / now_fraction))

    share, lo, hi = finish(at_limit), finish(interval[1]), finish(interval[0])
    return Recovered(limit, never, share, (lo, hi), never * share, (never * lo, never * hi))
