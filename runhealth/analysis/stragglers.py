"""Stragglers: each node's ETA from its own rate, and which nodes finish later than the run's ETA.

The run's ETA (the caller's: screens/runeta.py `rate_eta`, the one completions ETA) divides the
work left by the run's mean rate: it is when the run ends if the nodes share the work left between
them as they go (a shared queue). A run
configured with a total only (`target_completions`; nothing in the config says how the work is
split across nodes or shards) gives no node a target of its own, so a node's ETA here is when
it writes *its share*, target / nodes, at its own 15-min average rate: the honest reading of
"node-7 finishes at 16:40" when each node was handed an equal slice of the prompts. A node past
its share is done (ETA 0). Shards have no targets of their own in any config, so there is no
per-shard ETA.

A node is *late* when its ETA's 95% interval lies wholly after the run ETA's (its lower end is
later than the run ETA's upper end): a difference the rates' own noise cannot explain. A node
the rule named at one of the last few polls (`held`, the caller's) stays named while its ETA
still lies after the run's: near the edge the intervals cross back and forth from poll to poll,
and the line came and went (#41). Both
intervals come from the rates' batch-means variance (rates.eta_interval). "Most nodes done by"
is the latest ETA of the nodes that are not late.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from runhealth.analysis import rates


@dataclasses.dataclass(frozen=True)
class NodeEta:
    """One node's share of the target, what it has written and when it writes the rest."""

    node: str
    done: int  # completions counted on its shards
    share: float  # target / nodes: the work assumed to be its own
    completions_per_s: float | None  # its 15-min average
    eta_s: float | None  # seconds to its share at that rate; 0 once written; None: no rate
    eta_interval_s: tuple[float, float] | None  # 95%; None without a variance


@dataclasses.dataclass(frozen=True)
class Stragglers:
    """The run's ETA with its interval, every node's ETA, and the late ones (latest first)."""

    target: int
    run_eta_s: float | None
    run_eta_interval_s: tuple[float, float] | None
    nodes: tuple[NodeEta, ...]
    late: tuple[NodeEta, ...]
    most_done_s: float | None  # the latest ETA among nodes that are not late (None: none has one)

    @property
    def share(self) -> float:
        """The per-node share assumed: target / nodes."""
        return self.target / max(1, len(self.nodes))


def node_eta(node: str, done: int, share: float, cps: float | None, var: float | None) -> NodeEta:
    """`node`'s ETA to `share` completions at `cps` completions/s (variance `var`)."""
    need = max(0, int(round(share)))
    eta = rates.eta_seconds(done, need, cps) if need else 0.0
    interval = rates.eta_interval(done, need, cps, var) if need else (0.0, 0.0)
    return NodeEta(node, done, share, cps, eta, interval)


def stragglers(
    target: int | None,
    run_eta: float | None,
    run_iv: tuple[float, float] | None,
    per_node: Mapping[str, tuple[int, float | None, float | None]],
    held: Collection[str] = (),
) -> Stragglers | None:
    """The run's ETA `run_eta` (its 95% interval `run_iv`; computed by the caller, screens/runeta.py)
    beside each node's: `per_node` maps a node to (its completions, its completions/s, the rate's
    variance). `held`: the nodes named late at one of the last polls (they stay named while their
    ETA lies after the run's).

    Returns:
        None without a target or nodes.
    """
    if not target or target <= 0 or not per_node:
        return None
    share = target / len(per_node)
    nodes = tuple(node_eta(n, d, share, c, v) for n, (d, c, v) in sorted(per_node.items()))
    late: list[NodeEta] = []
    if run_iv is not None and run_eta:
        late = [
            n
            for n in nodes
            if (n.eta_interval_s is not None and n.eta_interval_s[0] > run_iv[1])
            or (n.node in held and n.eta_s is not None and n.eta_s > run_eta)
        ]
    late.sort(key=lambda n: -(n.eta_s or 0.0))
    named = {n.node for n in late}  # by name: `n not in late` compared dataclasses, n x late of them
    rest = [n.eta_s for n in nodes if n.node not in named and n.eta_s is not None]
    return Stragglers(target, run_eta, run_iv, nodes, tuple(late), max(rest) if rest else None)
