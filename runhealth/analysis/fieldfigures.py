"""Figures from the per-line fields (#33): prompts answered, cuts that never answered, labels
that lie, context-window stops, and which groups are cut.

Pure functions over counted values (the store's reads, or the CLI's in-memory totals from
poll replies): computed, never fetched. Each figure is a JSON-ready dict; where the shards
lack the field a figure needs, it carries `message` naming that field and how to configure
it, and its counts are None (not zero).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runhealth.analysis.stats import is_cut, wilson_interval
from runhealth.records import LENGTH

ID_CANDIDATES = "custom_id, prompt_id, metadata.id, id, request_id"
NO_ID_MESSAGE = (
    "no prompt ID in the shards (looked for " + ID_CANDIDATES + "): set [[nodes]] prompt_id_path (scan: "
    "--prompt-id-path) to the field that names each prompt"
)
NO_PROMPT_TOKENS_MESSAGE = (
    "no prompt token count in the shards (looked for usage.prompt_tokens, meta_info.prompt_tokens): "
    "set [[nodes]] prompt_tokens_path (scan: --prompt-tokens-path)"
)
NO_MAX_MODEL_LEN_MESSAGE = (
    "set [run] max_model_len (scan: --max-model-len), the server's context window, to count context-window stops"
)
NO_REASONING_MESSAGE = (
    "no reasoning text in the completions cut at the ceiling (no reasoning_content/reasoning field, no <think>)"
)
NO_GROUP_MESSAGE = (
    "no grouping field configured and no prompt token count in the shards: set [[nodes]] group_path "
    "(scan: --group-path; a dataset, source or category field) or prompt_tokens_path"
)


@dataclasses.dataclass
class FieldTotals:
    """Per-line field counts summed over shards (a node's, or the run's)."""

    completions: int = 0
    id_lines: int = 0
    distinct_prompts: int = 0
    answered_more_than_once: int = 0  # distinct prompts that came back twice or more
    id_fields: list[str] = dataclasses.field(default_factory=list)  # dotted paths the IDs were found at
    prompt_token_lines: int = 0
    group_field: str | None = None
    groups: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # label -> (n, length stops)
    # label -> {tokens: length stops}: the agents' split of each group's stops (#41); a group whose
    # stops it does not all account for (an older agent's) has no split
    group_length_tokens: dict[str, dict[int, int]] = dataclasses.field(default_factory=dict)
    length_prompt_tokens: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    no_answer: dict[int, int] = dataclasses.field(default_factory=dict)  # tokens -> length stops
    reasoned: dict[int, int] = dataclasses.field(default_factory=dict)
    # Prompt IDs counted only since a store upgrade (#40 item 4): {"since_unix", "completions_before"}
    # (migrations._to_v8), None when they were counted from the run's first line.
    ids_since: Mapping[str, Any] | None = None


def hash_totals(counts: Mapping[int, int]) -> tuple[int, int]:
    """(distinct prompts, prompts answered more than once) of a hash -> lines map."""
    return len(counts), sum(1 for n in counts.values() if n > 1)


def completeness(t: FieldTotals, expected: int | None = None) -> dict[str, Any]:
    """Prompts answered (distinct IDs), answered more than once, and missing against `expected`.

    `line` is the Overview's wording: "prompts answered N of M · not answered K · answered twice D",
    or the message naming the field to configure when no line had an ID.
    """
    if not t.id_lines:
        return {"answered": None, "message": NO_ID_MESSAGE, "line": NO_ID_MESSAGE}
    since = t.ids_since
    # Counted since an upgrade: the run's earlier prompts are unknown, so nothing is missing "of" expected.
    missing = max(0, expected - t.distinct_prompts) if expected and not since else None
    field = ", ".join(t.id_fields) or None
    out = {
        "answered": t.distinct_prompts,
        "expected": expected,
        "missing": missing,
        "answered_more_than_once": t.answered_more_than_once,
        "extra_answers": t.id_lines - t.distinct_prompts,  # lines beyond each prompt's first
        "lines_with_id": t.id_lines,
        "lines_without_id": max(0, t.completions - t.id_lines),
        "id_field": field,
        "progress": t.distinct_prompts / expected if expected and not since else None,
        "message": None,
        "counted_since_unix": since["since_unix"] if since else None,
        "completions_before": since["completions_before"] if since else None,
    }
    out["line"] = completeness_line(out)
    return out


def completeness_line(c: Mapping[str, Any]) -> str:
    """One line in plain words (numbers with thousands separators)."""
    if c.get("answered") is None:
        return str(c["message"])
    if c.get("counted_since_unix") is not None:
        return since_line(c)
    of = f" of {c['expected']:,}" if c.get("expected") else ""
    # "not answered", not "missing": on a live run most of them are simply still to come.
    missing = f" · not answered {c['missing']:,}" if c.get("missing") is not None else ""
    return f"prompts answered {c['answered']:,}{of}{missing} · answered twice {c['answered_more_than_once']:,}"


def since_line(c: Mapping[str, Any]) -> str:
    """The line for prompt IDs counted only since a store upgrade: never a run total."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(c["counted_since_unix"]))
    return (
        f"prompts answered since the store upgrade ({when}): {c['answered']:,} · answered twice"
        f" {c['answered_more_than_once']:,} · the {c['completions_before']:,} completions counted before it"
        " were not read for prompt IDs, so the run's total and the prompts not answered are unknown"
    )


def run_total_answered(c: Mapping[str, Any] | None) -> int | None:
    """Distinct prompts answered over the whole run, None when unknown (no IDs, or counted only
    since an upgrade): what progress and the prompts ETA may use."""
    if not c or c.get("counted_since_unix") is not None:
        return None
    return c.get("answered")


def unanswered(t: FieldTotals, length_stops_at_ceiling: int, ceiling: int | None) -> dict[str, Any]:
    """Completions cut at the ceiling that never answered (empty answer beside reasoning, or an
    unclosed <think>) apart from those cut mid-answer."""
    at = (lambda tok: tok >= ceiling) if ceiling else (lambda tok: True)
    reasoned = sum(n for tok, n in t.reasoned.items() if at(tok))
    never = sum(n for tok, n in t.no_answer.items() if at(tok))
    if not reasoned:
        return {"never_answered": None, "cut_mid_answer": None, "message": NO_REASONING_MESSAGE}
    return {
        "length_stops": length_stops_at_ceiling,
        "with_reasoning": reasoned,
        "never_answered": never,
        "cut_mid_answer": length_stops_at_ceiling - never,
        "message": None,
    }


def mislabelled(length_rows: Iterable[Mapping[str, Any]], ceiling: int | None) -> dict[str, Any]:
    """Completions at or above the ceiling labelled other than `length` (exact token counts only),
    by label; from the (tokens, finish_reason) counts every shard has."""
    if not ceiling:
        return {"count": None, "by_reason": {}, "message": "no ceiling known: set [run] max_output_tokens"}
    by: dict[str, int] = {}
    for r in length_rows:
        if r["tokens"] >= ceiling and not r.get("estimated") and r["finish_reason"] != LENGTH:
            name = r["finish_reason"] if r["finish_reason"] is not None else "(none)"
            by[name] = by.get(name, 0) + r["count"]
    return {"count": sum(by.values()), "by_reason": dict(sorted(by.items())), "ceiling": ceiling, "message": None}


def context_stops(t: FieldTotals, ceiling: int | None, max_model_len: int | None) -> dict[str, Any]:
    """`length` stops below the ceiling whose prompt and completion filled the context window
    (prompt_tokens + tokens >= max_model_len), exact where prompt tokens are known."""
    if not t.prompt_token_lines:
        return {"count": None, "message": NO_PROMPT_TOKENS_MESSAGE}
    if not max_model_len:
        return {"count": None, "message": NO_MAX_MODEL_LEN_MESSAGE}
    below = [(tok, p, n) for (tok, p), n in t.length_prompt_tokens.items() if not ceiling or tok < ceiling]
    return {
        "count": sum(n for tok, p, n in below if tok + p >= max_model_len),
        "length_below_ceiling_with_prompt_tokens": sum(n for _, _, n in below),
        "max_model_len": max_model_len,
        "message": None,
    }


NO_SPLIT_CEILING = (
    "no max_tokens ceiling known (set [run] max_output_tokens, or wait until length stops pile up at one"
    " length): the column counts every length stop, context-window stops included"
)
NO_SPLIT_AGENT = (
    "some shards' node agents predate #41 and do not send each group's length stops by token count:"
    " the column counts every length stop, context-window stops included, and cannot be split at the ceiling"
    " (upgrade the agent)"
)


def group_cut_counts(t: FieldTotals, ceiling: int | None) -> tuple[dict[str, tuple[int, int]] | None, str | None]:
    """Per group (cut, `length` stops below the ceiling) by `stats.is_cut` (the headline's rule),
    or (None, why) where the split is unknown: no ceiling, or an older agent's groups."""
    if ceiling is None:
        return None, NO_SPLIT_CEILING
    out: dict[str, tuple[int, int]] = {}
    for label, (_n, stops) in t.groups.items():
        by = t.group_length_tokens.get(label, {})
        if sum(by.values()) != stops:
            return None, NO_SPLIT_AGENT
        cut = sum(k for tok, k in by.items() if is_cut(tok, LENGTH, ceiling))
        out[label] = (cut, stops - cut)
    return out, None


def group_shares(t: FieldTotals, ceiling: int | None = None) -> dict[str, Any]:
    """The share cut per group (stopped by `length` at the ceiling: `stats.is_cut`, the headline's
    rule) with its 95% interval, the most cut first; `length` stops below the ceiling (context
    window) in `below_ceiling`, apart. Where the split is unknown (`counts` "length stops",
    `note` says why) the share is of every `length` stop and `cut` / `below_ceiling` are None."""
    if not t.groups:
        return {"field": None, "rows": [], "message": NO_GROUP_MESSAGE}
    split, why = group_cut_counts(t, ceiling)
    rows: list[dict[str, Any]] = []
    for label, (n, stops) in t.groups.items():
        cut, below = split[label] if split is not None else (None, None)
        k = stops if cut is None else cut
        lo, hi = wilson_interval(k, n) if n else (0.0, 1.0)
        rows.append(
            {
                "group": label,
                "completions": n,
                "cut": cut,
                "length_stops": stops,
                "below_ceiling": below,
                "share": k / n if n else None,
                "low": lo,
                "high": hi,
            }
        )
    rows.sort(key=lambda r: (-(r["share"] or 0), r["group"]))
    return {
        "field": t.group_field,
        "rows": rows,
        "counts": "cut" if split is not None else "length stops",
        "ceiling": ceiling,
        "note": why,
        "message": None,
    }


def compare_prompts(a_prompts: int, b_prompts: int, in_both: int) -> dict[str, Any]:
    """How many of run A's distinct prompts run B answered (hash sets; see store prompt_overlap)."""
    if not a_prompts:
        return {"share": None, "missing_from_b": None, "line": "run A has no prompt IDs to compare"}
    share = in_both / a_prompts
    missing = a_prompts - in_both
    return {
        "a_prompts": a_prompts,
        "b_prompts": b_prompts,
        "in_both": in_both,
        "share": share,
        "missing_from_b": missing,
        "line": f"B answered {100 * share:.1f}% of A's prompts; {missing:,} of A's prompts are missing from B",
    }


def figures(
    t: FieldTotals,
    length_rows: Sequence[Mapping[str, Any]],
    ceiling: int | None,
    expected: int | None = None,
    max_model_len: int | None = None,
) -> dict[str, Any]:
    """Every per-line-field figure at once (the CLI's `fields` object, the screens' source)."""
    at_ceiling = sum(
        r["count"] for r in length_rows if r["finish_reason"] == LENGTH and (not ceiling or r["tokens"] >= ceiling)
    )
    return {
        "prompts": completeness(t, expected),
        "unanswered": unanswered(t, at_ceiling, ceiling),
        "mislabelled": mislabelled(length_rows, ceiling),
        "context_stops": context_stops(t, ceiling, max_model_len),
        "groups": group_shares(t, ceiling),
    }


def add_update(t: FieldTotals, f: Any, hashes: dict[int, int]) -> None:
    """Add one reply entry's fields (an ingest.FieldUpdate) to `t`; `hashes` keeps hash -> lines
    (the CLI's in-memory set; the store keeps its own)."""
    for h in f.id_hashes:
        hashes[h] = hashes.get(h, 0) + 1
    t.id_lines += len(f.id_hashes)  # distinct_prompts: hash_totals(hashes) once all are added
    t.id_fields = sorted(set(t.id_fields) | set(f.id_fields))
    t.prompt_token_lines += f.prompt_token_lines
    t.group_field = t.group_field or f.group_field
    for label, n, cut, by_tokens in f.groups:
        old = t.groups.get(label, (0, 0))
        t.groups[label] = (old[0] + n, old[1] + cut)
        by = t.group_length_tokens.setdefault(label, {})
        for tok, k in by_tokens or ():
            by[tok] = by.get(tok, 0) + k
    for tok, p, n in f.length_prompt_tokens:
        t.length_prompt_tokens[(tok, p)] = t.length_prompt_tokens.get((tok, p), 0) + n
    for tok, n in f.no_answer:
        t.no_answer[tok] = t.no_answer.get(tok, 0) + n
    for tok, n in f.reasoned:
        t.reasoned[tok] = t.reasoned.get(tok, 0) + n
