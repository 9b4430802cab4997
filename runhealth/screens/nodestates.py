"""Node states as the screens show them, at a screen model's instant: the door components/ use.

The state of a node (pending / up / stale / down, with its reason in words) is one rule,
`runhealth.rules.health.node_status`; components/ may not import the rules (components/ruff.toml,
issue #41), so the tables and cards that lay out a node list ask here, with the `now` of the model
they show (the Nodes model's, the Overview's), never a clock of their own: a node cannot read "up"
in the table and "stale" in the tile above it.
"""

from __future__ import annotations

from collections.abc import Iterable

from runhealth.records import NodeRow
from runhealth.rules.activity import NodeRate as NodeRate  # the per-node rates the node tables show
from runhealth.rules.health import DOWN_AFTER_STALE as DOWN_AFTER_STALE  # the Nodes page states the rule
from runhealth.rules.health import node_status


def state_at(node: NodeRow, now: float, stale_after: float) -> tuple[str, str]:
    """(state, one-line reason) of `node` at `now` (a screen model's instant): health.node_status."""
    return node_status(node, now, stale_after)


def any_down(nodes: Iterable[NodeRow], now: float, stale_after: float) -> bool:
    """Whether a node is down at `now` (the kiosk shows the Nodes page only then)."""
    return any(node_status(n, now, stale_after)[0] == "down" for n in nodes)
