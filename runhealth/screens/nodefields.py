"""The Nodes page's per-line field table (#33 item 1): each node's prompts and labels, in words.

Per node: prompts answered (distinct within the node) and answered more than once, lines
without a prompt ID, cuts at the ceiling that never answered, completions at the ceiling
mislabelled, and `length` stops below it that filled the context window. The counts come from
screens/fieldmodel.node_field_totals (three grouped reads for every node at once) and the
node's length counts (read once with the page's costs); each figure is analysis/fieldfigures'
run figure on the node's counts, so a node and the run are worded alike. A field a node's
shards lack reads as such in its cell ("no prompt ID field"), never 0; the caption names how
to configure it, and that the nodes' prompts do not sum to the run's distinct prompts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from runhealth.analysis import fieldfigures
from runhealth.records import LENGTH
from runhealth.screens import fieldmodel
from runhealth.screens.words import fmt_count
from runhealth.store import Store

NO_ID = "no prompt ID field"
NO_REASONING = "no reasoning text"
NO_PROMPT_TOKENS = "no prompt token count"
NO_MAX_MODEL_LEN = "max_model_len not set"
NO_CEILING = "no ceiling known"
# The short cell wording -> the message that says how to configure the field (under the table).
HOW_TO = {
    NO_ID: fieldfigures.NO_ID_MESSAGE,
    NO_REASONING: fieldfigures.NO_REASONING_MESSAGE,
    NO_PROMPT_TOKENS: fieldfigures.NO_PROMPT_TOKENS_MESSAGE,
    NO_MAX_MODEL_LEN: fieldfigures.NO_MAX_MODEL_LEN_MESSAGE,
    NO_CEILING: "set [run] max_output_tokens (the ceiling) to count mislabelled completions",
}


@dataclasses.dataclass(frozen=True)
class NodeFields:
    """One node's per-line field figures (analysis/fieldfigures' dicts, None counts: field missing)."""

    node: str
    prompts: Mapping[str, Any]  # fieldfigures.completeness
    unanswered: Mapping[str, Any]  # fieldfigures.unanswered
    mislabelled: Mapping[str, Any]  # fieldfigures.mislabelled
    context_stops: Mapping[str, Any]  # fieldfigures.context_stops

    def row(self) -> dict[str, str]:
        """The table row in words: a count, or the missing field's short name."""
        p, u, m, c = self.prompts, self.unanswered, self.mislabelled, self.context_stops
        has_ids = p.get("answered") is not None
        return {
            "Node": self.node,
            "Prompts answered": fmt_count(p["answered"]) if has_ids else NO_ID,
            "Answered more than once": fmt_count(p["answered_more_than_once"]) if has_ids else NO_ID,
            "Lines without an ID": fmt_count(p["lines_without_id"]) if has_ids else NO_ID,
            "Cut, never answered": (
                f"{u['never_answered']:,} of {u['length_stops']:,} cuts"
                if u["never_answered"] is not None
                else NO_REASONING
            ),
            "Mislabelled at the ceiling": fmt_count(m["count"]) if m["count"] is not None else NO_CEILING,
            "Context-window stops": fmt_count(c["count"]) if c["count"] is not None else _context_missing(c),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "prompts": dict(self.prompts),
            "unanswered": dict(self.unanswered),
            "mislabelled": dict(self.mislabelled),
            "context_stops": dict(self.context_stops),
        }


def _context_missing(c: Mapping[str, Any]) -> str:
    return NO_PROMPT_TOKENS if c["message"] == fieldfigures.NO_PROMPT_TOKENS_MESSAGE else NO_MAX_MODEL_LEN


def node_fields(
    store: Store,
    names: Sequence[str],
    length_rows: Sequence[Mapping[str, Any]],
    ceiling: int | None,
    max_model_len: int | None,
) -> tuple[NodeFields, ...]:
    """Each of `names`' figures at the run's `ceiling`, from `length_rows` (the store's length
    counts by node, read once by the caller) and three grouped field reads."""
    rows: dict[str, list[Mapping[str, Any]]] = {n: [] for n in names}
    for r in length_rows:
        if r["node"] in rows:
            rows[r["node"]].append(r)
    totals = fieldmodel.node_field_totals(store, {n: sum(r["count"] for r in rows[n]) for n in names})
    out = []
    for n in names:
        t = totals[n]
        cut = sum(
            r["count"] for r in rows[n] if r["finish_reason"] == LENGTH and (not ceiling or r["tokens"] >= ceiling)
        )
        out.append(
            NodeFields(
                n,
                fieldfigures.completeness(t),
                fieldfigures.unanswered(t, cut, ceiling),
                fieldfigures.mislabelled(rows[n], ceiling),
                fieldfigures.context_stops(t, ceiling, max_model_len),
            )
        )
    return tuple(out)


def caption(fields: Sequence[NodeFields], run_answered: int | None, run: Mapping[str, Any] | None = None) -> str:
    """Why the prompts column does not add up to the run's figure, with both numbers; `run`: the
    run's completeness, whose upgrade mark (#40 item 4) says the column counts since then."""
    per_node = [f.prompts["answered"] for f in fields if f.prompts.get("answered") is not None]
    out = (
        "Exact counts from each node's shards. Prompts answered are distinct within a node: a prompt "
        "answered on two nodes (a retry elsewhere) counts on both, so the run's total is not the sum"
    )
    if per_node and run_answered is not None:
        out += f" (this column sums to {sum(per_node):,}; the run answered {run_answered:,} distinct prompts)"
    if run and run.get("counted_since_unix") is not None:
        out += ". " + fieldfigures.since_line(run)[0].upper() + fieldfigures.since_line(run)[1:]
    return out + "."


def missing(fields: Sequence[NodeFields]) -> tuple[str, ...]:
    """For each field some node's shards lack, one line: its cell's words and how to configure it."""
    cells = {cell for f in fields for cell in f.row().values()}
    return tuple(f"“{cell}”: {HOW_TO[cell]}." for cell in HOW_TO if cell in cells)
