"""Node states as the screens show them, at a screen model's instant: the door components/ use.

The state of a node (pending / up / stale / down, with its reason in words) is one rule,
`runhealth.rules.health.node_status`; components/ may not import the rules (components/ruff.toml,
issue #41), so the tables and cards that lay out a node list ask here, with the `now` of the model
they show (the Nodes model's, the Overview's), never a clock of their own: a node cannot read "up"
in the table and "stale" in the tile above it. The backlog's indexing progress (share done, speed,
time left) is worded here too, from the same node rows.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from runhealth.ages import fmt_age
from runhealth.records import NodeRow
from runhealth.rules.activity import NodeRate as NodeRate  # the per-node rates the node tables show
from runhealth.rules.health import DOWN_AFTER_STALE as DOWN_AFTER_STALE  # the Nodes page states the rule
from runhealth.rules.health import node_status
from runhealth.screens.words import fmt_bytes

DONE_WHY = "wrote its share of the target (fixed shares): finished its work, not stalled"


def state_at(node: NodeRow, now: float, stale_after: float, done: Collection[str] = ()) -> tuple[str, str]:
    """(state, one-line reason) of `node` at `now` (a screen model's instant): health.node_status;
    an up node in `done` (the model's done_nodes: health.done_nodes, it wrote its fixed share) is
    "done", a state of its own (#41), as the alerts and /metrics' runhealth_node_done have it."""
    state, why = node_status(node, now, stale_after)
    if state == "up" and node["name"] in done:
        return "done", DONE_WHY
    return state, why


def any_down(nodes: Iterable[NodeRow], now: float, stale_after: float) -> bool:
    """Whether a node is down at `now` (the kiosk shows the Nodes page only then)."""
    return any(node_status(n, now, stale_after)[0] == "down" for n in nodes)


def indexing_progress(nodes: list[NodeRow]) -> tuple[float, str] | None:
    """(share done, sentence) while a backlog is being indexed: bytes done of total, speed, time left."""
    done = sum(n.get("bytes_indexed") or 0 for n in nodes)
    total = sum(n.get("bytes_total") or 0 for n in nodes)
    pending = sum(n.get("pending_bytes") or 0 for n in nodes)
    total = max(total, done + pending)
    if not (pending > 0 or done < total):
        return None
    busy = [n for n in nodes if n.get("pending_bytes")]
    rate = sum(n.get("index_bytes_per_s") or 0 for n in busy)
    lefts = [p / s for n in busy if (s := n.get("index_bytes_per_s")) and (p := n["pending_bytes"])]
    speed = f" · {fmt_bytes(rate)}/s" if rate else ""
    eta = f" · about {fmt_age(max(lefts))} left" if lefts and len(lefts) == len(busy) else ""
    return (
        done / total if total else 0.0,
        f"Indexing the backlog: {fmt_bytes(done)} of {fmt_bytes(total)}{speed}{eta} — numbers will grow",
    )
