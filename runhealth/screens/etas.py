"""Each node's ETA in words, and the Overview's straggler line (#33 item 6).

The record is screens/runeta.py's `node_shares` (the run's ETA computed there, as every ETA);
the Overview says "most nodes done by 14:10; node-7 finishes at
16:40" when a node's ETA lies after the run's by more than the intervals, and the Nodes table
shows each node's ETA. Both say what they assume: the config gives the run a total only, so a
node's ETA is when it writes an equal share (target / nodes) at its own rate.
"""

from __future__ import annotations

import time

from runhealth.ages import fmt_age
from runhealth.analysis.stragglers import NodeEta, Stragglers
from runhealth.screens.words import fmt_count, fmt_plural

NAMED = 3  # late nodes named in the line; more are counted


def clock(ts_unix: float, now: float) -> str:
    """A finish time: "16:40" today, "Sun 09:10" on another day (local time, as every clock shown)."""
    day = time.strftime("%Y-%m-%d", time.localtime(ts_unix)) != time.strftime("%Y-%m-%d", time.localtime(now))
    return time.strftime("%a %H:%M" if day else "%H:%M", time.localtime(ts_unix))


def assumption(s: Stragglers) -> str:
    """What a node's ETA assumes, said wherever one is shown."""
    return (
        f"A node's ETA is when it writes its share, target / {fmt_plural(len(s.nodes), 'node')} = "
        f"{fmt_count(s.share)} completions, at its own 15-min average: the config gives the run a total only "
        "(no per-node or per-shard targets). If the nodes take work from one shared queue, the run ends at the "
        "run's ETA instead."
    )


def straggler_line(s: Stragglers | None, now: float) -> str:
    """ "most nodes done by 14:10; node-7 finishes at 16:40" when a node is late, else ""."""
    if s is None or not s.late:
        return ""
    late = [n for n in s.late if n.eta_s is not None]
    named = ", ".join(
        f"{n.node} finishes at {clock(now + (n.eta_s or 0.0), now)}"
        if i == 0
        else f"{n.node} at {clock(now + (n.eta_s or 0.0), now)}"
        for i, n in enumerate(late[:NAMED])
    )
    more = f" and {fmt_plural(len(late) - NAMED, 'more node')}" if len(late) > NAMED else ""
    if s.most_done_s is None:
        head = "no other node has a rate"
    elif s.most_done_s == 0:
        head = "the other nodes have written their shares"
    else:
        others = [n.node for n in s.nodes if n not in s.late]
        who = f"{others[0]} done by" if len(others) == 1 else "most nodes done by"  # two nodes: name the other
        head = f"{who} {clock(now + s.most_done_s, now)}"
    return f"{head}; {named}{more}"


def straggler_sentence(s: Stragglers | None, now: float) -> str:
    """`straggler_line` as a sentence of its own ("Most nodes done by ..."): its own first word
    capitalised, a node's name never ("loc done by 14:10", not "Loc": #41)."""
    line = straggler_line(s, now)
    own = line.startswith(("most nodes", "no other node", "the other nodes"))
    return line[:1].upper() + line[1:] if own else line


def eta_cell(n: NodeEta | None, now: float) -> str:
    """A node's ETA in the Nodes table: "16:40 (in 2h 10m)", "share written", "no rate"."""
    if n is None:
        return "N/A"
    if n.eta_s == 0:
        return "share written"
    if n.eta_s is None:
        return "no rate"
    return f"{clock(now + n.eta_s, now)} (in {fmt_age(n.eta_s)})"


def eta_cells(s: Stragglers | None, now: float) -> dict[str, str]:
    """Each node's ETA cell by name (empty without a target)."""
    return {} if s is None else {n.node: eta_cell(n, now) for n in s.nodes}


def to_json(s: Stragglers | None) -> dict:
    """The per-node ETAs for `status --json` and the downloads (seconds; None: no rate)."""
    if s is None:
        return {"node_share": None, "node_eta_s": {}, "late_nodes": []}
    return {
        "node_share": round(s.share, 1),
        "node_eta_s": {n.node: None if n.eta_s is None else round(n.eta_s, 1) for n in s.nodes},
        "late_nodes": [n.node for n in s.late],
    }
