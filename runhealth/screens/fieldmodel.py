"""The per-line field figures of a run (#33), read from the store at one instant.

`field_totals` gathers the store's reads of the per-line fields (store/fieldreads.py) into an
analysis.fieldfigures.FieldTotals, for the run or one node; `field_figures` turns them into
every figure (prompts answered, cuts that never answered, labels that lie, context-window
stops, groups cut), as `runhealth poll --json` prints them and the pages show them;
`prompt_completeness` is the Overview's line. Figures whose field the shards lack carry the
message naming it (analysis/fieldfigures.py), never a zero.
"""

from __future__ import annotations

from typing import Any

from runhealth.analysis import fieldfigures
from runhealth.analysis.fieldfigures import FieldTotals
from runhealth.settings.config import RunConfig
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store


def field_totals(store: Store, node: str | None = None, completions: int | None = None) -> FieldTotals:
    """The per-line field counts of `node` (None: every counted node of the run); `completions`:
    its completion count when the caller has read it already (else read here)."""
    counts = store.prompt_counts(node)
    presence = [p for p in store.field_presence() if node is None or p["node"] == node]
    id_fields = sorted({k for p in presence for k in p["id_fields"]})
    if completions is None:
        rows = store.length_counts(by="node" if node else "run")
        completions = sum(r["count"] for r in rows if node is None or r.get("node") == node)
    unanswered = store.unanswered_counts(node)
    groups = store.group_counts(node)
    return FieldTotals(
        completions=completions,
        id_lines=counts["id_lines"],
        distinct_prompts=counts["distinct_prompts"],
        answered_more_than_once=counts["answered_more_than_once"],
        id_fields=id_fields,
        prompt_token_lines=sum(p["prompt_token_lines"] for p in presence),
        group_field=next((p["group_field"] for p in presence if p["group_field"]), None),
        groups={g["group"]: (g["completions"], g["length_stops"]) for g in groups},
        group_length_tokens={g["group"]: g["length_by_tokens"] for g in groups},
        length_prompt_tokens={(r["tokens"], r["prompt_tokens"]): r["count"] for r in store.length_prompt_tokens(node)},
        no_answer={r["tokens"]: r["no_answer"] for r in unanswered if r["no_answer"]},
        reasoned={r["tokens"]: r["reasoned"] for r in unanswered if r["reasoned"]},
        ids_since=store.meta("prompt_ids_since"),
    )


def node_field_totals(store: Store, completions: dict[str, int]) -> dict[str, FieldTotals]:
    """Each node's per-line field counts (prompts, cuts' answers, `length` stops by prompt tokens;
    not the groups) from three grouped reads for all nodes at once, never one per node;
    `completions`: node -> its completion count (the caller's length counts). Nodes without any
    field rows get empty totals (their figures then name the missing field)."""
    presence = {p["node"]: p for p in store.field_presence()}
    prompts = store.prompt_counts_by_node()
    out = {n: FieldTotals(completions=c) for n, c in completions.items()}
    for node, p in presence.items():
        t = out.setdefault(node, FieldTotals())
        t.id_lines, t.id_fields, t.prompt_token_lines = p["id_lines"], p["id_fields"], p["prompt_token_lines"]
        if node in prompts:
            t.distinct_prompts = prompts[node]["distinct_prompts"]
            t.answered_more_than_once = prompts[node]["answered_more_than_once"]
    for r in store.field_counts_by_node():
        t = out.setdefault(r["node"], FieldTotals())
        if r["kind"] == "length_prompt_tokens":
            key = (r["tokens"], r["prompt_tokens"])
            t.length_prompt_tokens[key] = t.length_prompt_tokens.get(key, 0) + r["count"]
        else:
            into = t.no_answer if r["kind"] == "no_answer" else t.reasoned
            into[r["tokens"]] = into.get(r["tokens"], 0) + r["count"]
    return out


def unanswered_totals(store: Store, node: str | None = None) -> FieldTotals:
    """Only the cuts' answer counts (no_answer, reasoned) of `node` or the run: one read, for the
    Samples page's exact count beside its sample."""
    rows = store.unanswered_counts(node)
    return FieldTotals(
        no_answer={r["tokens"]: r["no_answer"] for r in rows if r["no_answer"]},
        reasoned={r["tokens"]: r["reasoned"] for r in rows if r["reasoned"]},
    )


def prompt_completeness(store: Store, config: RunConfig, completions: int) -> dict[str, Any] | None:
    """The run's prompts answered / missing (against [run] expected_prompts) / answered more
    than once, with its one-line wording (`line`); None before any completion. One statement
    (store.prompt_summary) unless a node outside the config holds prompt IDs: then the exact
    read that leaves superseded nodes out (store.prompt_counts)."""
    if not completions:
        return None
    s = store.prompt_summary()
    counts: dict[str, int] = {
        "id_lines": s["id_lines"],
        "distinct_prompts": s["distinct_prompts"],
        "answered_more_than_once": s["answered_more_than_once"],
    }
    if set(s["nodes"]) - {n.name for n in getattr(config, "nodes", [])}:
        exact = store.prompt_counts()
        counts = {"id_lines": exact["id_lines"], "distinct_prompts": exact["distinct_prompts"]}
        counts["answered_more_than_once"] = exact["answered_more_than_once"]
    totals = FieldTotals(
        completions=completions,
        id_lines=counts["id_lines"],
        distinct_prompts=counts["distinct_prompts"],
        answered_more_than_once=counts["answered_more_than_once"],
        ids_since=s["ids_since"],
    )
    return fieldfigures.completeness(totals, getattr(config, "expected_prompts", None))


def field_figures(
    store: Store, config: RunConfig | RunSettings, ceiling: int | None, node: str | None = None
) -> dict[str, Any]:
    """Every per-line field figure of the run (or `node`) at the ceiling `ceiling`."""
    typed = [r for r in store.length_counts(by="node" if node else "run") if node is None or r.get("node") == node]
    completions = sum(r["count"] for r in typed)
    rows = [dict(r) for r in typed]
    return fieldfigures.figures(
        field_totals(store, node, completions),
        rows,
        ceiling,
        config.expected_prompts,
        config.max_model_len,
    )
