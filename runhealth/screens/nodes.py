"""The Nodes page's model: every node's state in words, its shards, hosts and servers, at one instant.

`nodes(store, config, now, finished)` reads the store once through `health.read` (nodes, rates,
host tables: each once) plus the shards, the servers' latest metrics and the collector's status,
and derives the rest from that reading: each node's state and reason (`health.node_status`, the
one rule), the per-node rates (None for a finished run), the host alerts (`health.alerts_of`,
worded as on the Overview), the nodes no longer in the config, the shards each node reads (a
replaced one named), and why no collector writes the run (None: one does, or it is finished).
The page (pages/nodes.py) and its CSV lay this record out.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from runhealth import heartbeat
from runhealth.analysis import servermetrics, stats, tokencost
from runhealth.analysis.failed import FailedRequests, failed_requests
from runhealth.analysis.stragglers import Stragglers
from runhealth.records import HostReading, LengthCountRow, MetricRow, NodeRow, ShardRow
from runhealth.rules import activity, health
from runhealth.screens import etas, fieldmodel, nodefields, nodestates, runeta
from runhealth.screens import waste as waste_words
from runhealth.screens.words import NA, fmt_count, fmt_share
from runhealth.settings.config import RunConfig
from runhealth.settings.runsettings import RunSettings
from runhealth.settings.windows import DROP_LOOKBACK_S
from runhealth.store import Store

HOST_ALERT_PREFIX = "host_"


@dataclasses.dataclass(frozen=True)
class NodeState:
    """One node's state (pending / up / stale / down) and the reason, in words."""

    name: str
    state: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Removed:
    """A node no longer in the config: the completions it counted, and the current node that reads
    its files again (so holds those completions instead), or None (they stay in the totals)."""

    name: str
    completions: int
    read_by: str | None

    @property
    def text(self) -> str:
        kept = (
            f"read again by {self.read_by}, so counted there, not twice" if self.read_by else "kept in the run's totals"
        )
        return f"{self.name}: no longer in the config; its {self.completions:,} completions are {kept}."


@dataclasses.dataclass(frozen=True)
class NodeCost:
    """One node's token waste (exact, at the run's ceiling) and GPU energy per usable token."""

    node: str
    waste: tokencost.Waste
    energy: tokencost.EnergyCost | None

    def row(self) -> dict[str, str]:
        """The Nodes page's table row, in words (words.py's format)."""
        w, e = self.waste, self.energy
        return {
            "Node": self.node,
            "Cut at ceiling (completions)": fmt_share(w.completion_share) if w.completions else NA,
            "Cut at ceiling (tokens)": fmt_share(w.token_share) if w.tokens_total else NA,
            "Tokens per usable completion": fmt_count(w.tokens_per_usable),
            "Energy per 1M usable tokens": waste_words.per_m_joules(e),
            "GPU-hours per 1M usable tokens": waste_words.per_m_gpu_hours(e),
            "Energy from": waste_words.energy_source(e) if e is not None else NA,
        }


def node_costs(
    store: Store, names: list[str], ceiling: int | None, length_rows: Sequence[LengthCountRow]
) -> tuple[NodeCost, ...]:
    """Per node: its length counts (`length_rows`, by node) summarised at the run's ceiling, and
    its energy rows."""
    hists: dict[str, stats.LengthHist] = {n: stats.LengthHist() for n in names}
    for r in length_rows:
        if r["node"] in hists:
            hists[r["node"]].add(r["tokens"], r["finish_reason"], r["estimated"], r["count"])
    energy = {e["node"]: e for e in store.node_energy()}
    return tuple(
        NodeCost(
            n,
            tokencost.waste(stats.summarize(hists[n], ceiling)),
            tokencost.energy_cost([energy[n]]) if n in energy else None,
        )
        for n in names
    )


@dataclasses.dataclass(frozen=True)
class Nodes:
    """The Nodes page at `now` (see the module docstring); `to_json()` is the record as JSON."""

    run: str
    now: float
    finished: bool
    stale_after: float
    nodes: tuple[NodeRow, ...]  # the nodes the config names now
    states: tuple[NodeState, ...]  # one per node, in the same order ("done": wrote its share, #41)
    per_node: Mapping[str, activity.NodeRate] | None  # None for a finished run
    removed: tuple[Removed, ...]
    shards: tuple[ShardRow, ...]  # every shard of every node
    hosts: dict[str, HostReading]
    host_alerts: tuple[health.Alert, ...]
    collector_fault: str | None  # why no collector writes the run (None: one does, or finished)
    server_metrics: tuple[MetricRow, ...]  # the latest value of each server metric on each node
    costs: tuple[NodeCost, ...] = ()  # per node: tokens cut at the ceiling, energy per usable token (#33)
    fields: tuple[nodefields.NodeFields, ...] = ()  # per node: prompts answered, cuts' answers, labels (#33)
    prompts_answered: int | None = None  # the run's distinct prompts (not the nodes' sum); None: no IDs
    prompts: Mapping[str, Any] | None = None  # the run's prompt completeness (its upgrade mark, #40 item 4)
    stragglers: Stragglers | None = None  # each node's ETA to its share (#33 item 6); None: no target, finished
    # Per node, its failed requests beside its completions (#39; analysis/failed.py); empty while
    # no request failed anywhere in the run.
    failed: tuple[tuple[str, FailedRequests], ...] = ()
    done_nodes: tuple[str, ...] = ()  # fixed shares: the nodes that wrote their share (health.done_nodes)
    eta_withheld: str = ""  # why no node has an ETA while the run has none (runeta.live_eta), e.g. "run stalled"

    failed_caption = (
        "Failed requests (an error status or object, expired or canceled): not completions, not in any "
        "length statistic; the share is of requests (completions + failed)."
    )

    def failed_rows(self) -> list[dict[str, str]]:
        """The per-node failed table as shown (and as the CSV would hold it)."""
        return [{"Node": name, "Failed requests": f.value, "Reasons": f.reasons_text or "—"} for name, f in self.failed]

    @property
    def eta_cells(self) -> dict[str, str]:
        """Each node's ETA as the node table shows it (screens/etas.py); empty without a target."""
        return etas.eta_cells(self.stragglers, self.now)

    @property
    def eta_caption(self) -> str:
        if self.stragglers is None:
            return (
                f"No node ETA while the run has none ({self.eta_withheld}), as the Overview."
                if self.eta_withheld
                else ""
            )
        line = etas.straggler_sentence(self.stragglers, self.now)
        return (line + ". " if line else "") + etas.assumption(self.stragglers)

    costs_caption = (
        "Tokens cut at the run's ceiling: exact, from each node's counts. Energy: NVML's energy counter "
        "(or power × time where a GPU has none, said in the last column) over the polls the collector "
        "measured, per usable token (a natural stop) written over the same polls."
    )

    @property
    def fields_caption(self) -> str:
        return nodefields.caption(self.fields, self.prompts_answered, self.prompts)

    @property
    def fields_missing(self) -> tuple[str, ...]:
        """One line per field some node lacks: its cell's words and how to configure it."""
        return nodefields.missing(self.fields)

    def state_of(self, name: str) -> NodeState:
        return next(s for s in self.states if s.name == name)

    def shards_of(self, name: str) -> tuple[ShardRow, ...]:
        return tuple(s for s in self.shards if s["node"] == name)

    def replaced(self, name: str) -> tuple[ShardRow, ...]:
        """The node's shards found rewritten under the same inode and recounted from byte 0."""
        return tuple(s for s in self.shards_of(name) if s["replaced_unix"] is not None)

    @property
    def counts(self) -> dict[str, int]:
        """How many nodes are in each state."""
        out = dict.fromkeys(("up", "done", "stale", "down", "pending"), 0)
        for s in self.states:
            out[s.state] = out.get(s.state, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "now_unix": self.now,
            "finished": self.finished,
            "collector_fault": self.collector_fault,
            "nodes": [dataclasses.asdict(s) for s in self.states],
            "counts": self.counts,
            "removed": [{**dataclasses.asdict(r), "text": r.text} for r in self.removed],
            "host_alerts": [{"name": a.name, "severity": a.severity, "summary": a.summary} for a in self.host_alerts],
            "shards": [
                {k: s[k] for k in ("node", "path", "completions", "error", "replaced_unix")} for s in self.shards
            ],
            **etas.to_json(self.stragglers),
            "costs": [
                {"node": c.node, **c.waste.to_json(), "energy": c.energy.to_json() if c.energy else None}
                for c in self.costs
            ],
            "fields": [f.to_json() for f in self.fields],
            "prompts_answered": self.prompts_answered,
            "failed": [{"node": name, **f.to_json()} for name, f in self.failed],
        }


def removed_nodes(store: Store, keep: set[str] | None) -> tuple[Removed, ...]:
    """Nodes the store holds that the config no longer names (none when the store does not say)."""
    if keep is None:
        return ()
    by = store.superseded_nodes()
    counted = {n["name"]: n["completions"] for n in store.nodes()}
    return tuple(Removed(name, counted[name], by.get(name)) for name in sorted(set(counted) - keep))


def collector_fault(store: Store, now: float, stale_after: float) -> str | None:
    """runhealth.heartbeat's sentence on why no collector writes the run (None: one does)."""
    status = heartbeat.read_status(store)
    if status is None:
        return f"No collector has written this run's status yet: {heartbeat.START}."
    found = heartbeat.fault(status, now, stale_after)
    return None if found is None else found.text


def nodes(store: Store, config: RunConfig, now: float | None = None, finished: bool = False) -> Nodes:
    """The Nodes page of `config`'s run (a RunConfig) at `now`, from one reading of `store`."""
    now = time.time() if now is None else now
    # The nodes are those the collector saved in the run's meta (none saved: every node the store
    # holds), as the node table has always shown them; the other settings are the config's.
    settings = dataclasses.replace(RunSettings.from_config(config), nodes=store.run_settings().nodes)
    reading = health.read(store, now, settings, rates_lookback_s=DROP_LOOKBACK_S)
    stale_after = config.stale_after
    done = tuple(sorted(health.done_nodes(reading.nodes, settings))) if not finished else ()
    states = tuple(NodeState(n["name"], *nodestates.state_at(n, now, stale_after, done)) for n in reading.nodes)
    found = health.alerts_of(reading)
    names = [n["name"] for n in reading.nodes]
    by_node = store.length_counts(by="node")  # one read for the costs and the field table
    ceiling = reading.summary.ceiling_tokens
    run_prompts = fieldmodel.prompt_completeness(store, config, reading.summary.completions)
    p = run_prompts or {}
    state = runeta.run_state(found, finished)
    since = p.get("counted_since_unix") is not None
    live = (
        None
        if finished
        else runeta.live_eta(store, reading, reading.summary.completions, p.get("answered"), since, state)
    )
    return Nodes(
        run=config.name,
        now=now,
        finished=finished,
        stale_after=stale_after,
        nodes=tuple(reading.nodes),
        states=states,
        per_node=None if finished else reading.rates.per_node,
        removed=removed_nodes(store, settings.node_names),
        shards=tuple(store.shards()),
        hosts=reading.host_latest,
        host_alerts=tuple(a for a in found if a.name.startswith(HOST_ALERT_PREFIX)),
        collector_fault=None if finished else collector_fault(store, now, stale_after),
        server_metrics=tuple(m for m in store.metric_latest() if not servermetrics.is_bucket(m["name"])),
        costs=node_costs(store, names, ceiling, by_node),
        fields=nodefields.node_fields(store, names, by_node, ceiling, config.max_model_len),
        prompts_answered=run_prompts.get("answered") if run_prompts else None,
        prompts=run_prompts,
        stragglers=None if live is None else live.shown_shares,
        eta_withheld=live.withheld if live is not None and config.target_completions else "",
        failed=node_failed(reading),
        done_nodes=done,
    )


def node_failed(reading: health.Reading) -> tuple[tuple[str, FailedRequests], ...]:
    """Each node's failed requests (the one definition, analysis/failed.py), from the reading's
    rows: no read of its own; none while no request failed."""
    if not reading.failed_rows:
        return ()
    return tuple(
        (n["name"], failed_requests(reading.failed_rows, n["completions"], node=n["name"])) for n in reading.nodes
    )
