"""The Overview's alert sentences: which core rule fired, in words, most serious first.

The rules themselves live in the core (runhealth.health: node states, stalls,
rate drops and the one ok/warn/alert `level`); these functions only word what they found, as
(level "error" | "warning", text) pairs for `cards.render_alerts`.
"""

from __future__ import annotations

from typing import Any

from components.format import fmt_clock, fmt_rate
from runhealth.analysis.stats import Summary
from runhealth.health import fmt_age, level, node_status
from runhealth.records import NodeRow


def health_alerts(
    health: dict[str, Any], nodes: list[NodeRow], stale_after: float, stall_after: float, target_reached: bool = False
) -> list[tuple[str, str]]:
    """Stall and rate-drop alerts: the run, then each node that stopped while others write."""
    from runhealth import health as core

    if target_reached:
        return []
    now = health["now"]
    live = {n["name"] for n in nodes if node_status(n, now, stale_after)[0] == "up"}
    found = core.stalls(health["per_node"], now, stall_after, live)
    out: list[tuple[str, str]] = []
    if found["run"] is not None:
        since = found["run"]
        out.append(
            (
                "error",
                f"Run stalled: no new completions from any node since {fmt_clock(since)} "
                f"({fmt_age(now - since)}; alert after {fmt_age(stall_after)}).",
            )
        )
    else:
        for node, since in sorted(found["nodes"].items()):
            out.append(
                (
                    "warning",
                    f"{node}: no new completions for {fmt_age(now - since)} "
                    f"(since {fmt_clock(since)}) while other nodes write.",
                )
            )
        if health.get("drop_median") is not None:
            out.append(
                (
                    "warning",
                    f"Throughput dropped: {fmt_rate(health['tokens_per_s_1m'])} tok/s over the last "
                    f"minute, below half the last hour's median ({fmt_rate(health['drop_median'])} tok/s).",
                )
            )
    return out


def run_alerts(
    summary: Summary | None,
    nodes: list[NodeRow],
    now: float,
    stale_after: float,
    warn: float,
    alert: float,
    last_collection: float | None,
) -> list[tuple[str, str]]:
    """One-sentence alerts, most serious first: [(level "error"|"warning", text)]."""
    out: list[tuple[str, str]] = []
    if last_collection is not None and now - last_collection > stale_after:
        out.append(("error", f"No successful collection for {fmt_age(now - last_collection)}: these numbers are old."))
    for message in sorted({n["store_error"] for n in nodes if n.get("store_error")}):
        out.append(("error", f"{message} — new data is not being saved (see Nodes)."))
    for n in nodes:
        state, why = node_status(n, now, stale_after)
        if state in ("down", "stale"):
            out.append(("error" if state == "down" else "warning", f"{n['name']} {why}"))
        for glob in n.get("unmatched_globs") or []:
            out.append(("warning", f"No shard matched {glob} on {n['name']}."))
        if n.get("shard_errors"):
            out.append(("warning", f"{n['name']}: {n['shard_errors']} shard(s) cannot be read (see Nodes)."))
    if summary and summary.completions and summary.ceiling_tokens:
        frac = summary.at_ceiling_fraction
        found = level(frac, warn, alert)
        if found != "ok":
            out.append(
                (
                    "error" if found == "alert" else "warning",
                    f"{frac:.1%} of completions stop at the {summary.ceiling_tokens:,}-token ceiling.",
                )
            )
    out.sort(key=lambda a: a[0] != "error")
    return out
