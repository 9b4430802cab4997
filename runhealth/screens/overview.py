"""The Overview's model: one run's standup numbers, alerts and tiles, read at one instant.

`overview(store, config, now)` reads the store once through `health.read` (nodes, length counts,
polls, GPU and host tables: each once) plus the servers' metrics and the throughput series, and
derives everything else from that one reading: the alert banner (`health.alerts_of`), the run
state, the six tiles with their levels, the progress bar, the GPU strip and the headline record.
The Completions tile and the banner's n are the same count; a stalled or stale run never shows a
plain ETA; the average is named for what it covers (a run younger than its window says "avg
since collection began") and an ETA is given only once the window holds the run's writing.
Beside the ETA, each node's ETA to its share (screens/etas.py: the stragglers' line, only while
the ETA is shown) and the last day's run events (screens/events.py: the markers on the throughput
chart and the alert timeline; one statement).
The page (pages/overview.py), the headline download and `runhealth status` show this record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from runhealth.ages import fmt_age
from runhealth.analysis import fieldfigures, rates, tokencost
from runhealth.analysis.failed import FailedRequests
from runhealth.analysis.stats import Summary
from runhealth.analysis.stragglers import Stragglers
from runhealth.analysis.unknowns import Unknown
from runhealth.records import GpuRow, NodeRow
from runhealth.rules import activity, hardware, health
from runhealth.rules.health import Alert as Alert  # the alert lines (components/alerts.py) name it here
from runhealth.rules.health import level
from runhealth.screens import derived, etas, fieldmodel, runeta
from runhealth.screens import waste as waste_words
from runhealth.screens.events import Event, chart_events
from runhealth.screens.words import fmt_bytes, fmt_rate, fmt_window
from runhealth.settings.config import RunConfig
from runhealth.settings.runsettings import RunSettings
from runhealth.settings.windows import DROP_LOOKBACK_S, SERVER_RATE_WINDOW_S, stale_after_s
from runhealth.store import Store

RunState = runeta.RunState
SERVER_GAUGES = ("sglang:gen_throughput",)
SERVER_COUNTERS = ("vllm:generation_tokens_total",)
EVENTS_LOOKBACK_S = 24 * 3600  # the run events the Overview's charts mark: its alert timeline's day


@dataclasses.dataclass(frozen=True)
class Tile:
    """One big-number tile: its level is ok / warn / alert / muted."""

    label: str
    value: str
    sub: str = ""
    level: str = "ok"


@dataclasses.dataclass(frozen=True)
class HeatRow:
    """One GPU of the heat strip, its label saying when it is throttled or its reading old."""

    label: str
    util_pct: float | None
    power_pct: float | None
    mem_pct: float | None


@dataclasses.dataclass(frozen=True)
class ThroughputPoint:
    bucket_unix: float
    tokens_per_s: float


@dataclasses.dataclass(frozen=True)
class Average:
    """What the "15-min avg" covers: its window, the span it really covers, and whether that span
    holds enough of the run's writing for an ETA."""

    window_s: float
    covered_s: float | None  # from the first poll read (or the window start) to now (or the last poll, if later)
    enough_for_eta: bool

    @property
    def label(self) -> str:
        if self.covered_s is not None and self.covered_s < self.window_s:
            return f"avg since collection began ({fmt_age(self.covered_s)})"
        return f"{fmt_window(self.window_s)} avg"


@dataclasses.dataclass(frozen=True)
class Overview:
    """The Overview at `now` (see the module docstring); `to_json()` is `runhealth status --json`."""

    run: str
    now: float
    as_of: float | None  # the last successful collection
    state: RunState
    target: int | None
    summary: Summary
    standup: derived.Standup
    average: Average
    eta_s: float | None  # None unless the run writes and the average holds enough of it
    alerts: tuple[health.Alert, ...]
    nodes: tuple[NodeRow, ...]
    per_node: dict[str, activity.NodeRate] | None  # None for a finished run
    heat: tuple[HeatRow, ...]
    gpu_simulated: bool
    gpu_notes: tuple[tuple[str, str], ...]
    server_tokens_per_s: float | None
    throughput: tuple[ThroughputPoint, ...]  # complete live buckets of the last hour
    tiles: tuple[Tile, ...]
    final: derived.Final | None = None
    waste: tokencost.Waste | None = None  # tokens cut at the ceiling and in loops (#33)
    energy: tokencost.EnergyCost | None = None  # GPU energy per usable token; None: no GPU energy rows
    # Prompts answered / missing / answered twice (#33; screens/fieldmodel.py), with its `line`.
    prompts: dict[str, Any] | None = None
    # Each node's ETA to its share, and the late ones (#33 item 6); None unless the run's ETA is shown.
    stragglers: Stragglers | None = None
    events: tuple[Event, ...] = ()  # the last day's run events: the throughput and alert charts' markers (#33 item 7)
    run_eta: runeta.RunEta | None = None  # the ETA's basis (distinct prompts or completions) and rate (#33 item 1)
    done_nodes: tuple[str, ...] = ()  # fixed shares: the nodes that wrote their share (health.done_nodes)
    failed: FailedRequests | None = None  # failed requests beside the completions (#39; analysis/failed.py)
    unknown: Unknown | None = None  # why the share at the ceiling is unknown (#39; analysis/unknowns.py)

    @property
    def failed_level(self) -> str:
        """The failed line's colour: the failed_requests_high alert's severity (one engine), else ok."""
        found = [a.severity for a in self.alerts if a.name == "failed_requests_high"]
        return "alert" if "critical" in found else "warn" if found else "ok"

    @property
    def failed_line(self) -> str:
        """ "Failed requests 12 (0.5% of requests) · server_error 12" (analysis/failed.py), or ""
        while none failed (an agent that cannot tell a failed request reports none: "0" would
        claim what it does not know; the JSON says 0)."""
        return self.failed.line if self.failed is not None and self.failed.failed else ""

    @property
    def straggler_line(self) -> str:
        """ "most nodes done by 14:10; node-7 finishes at 16:40" (screens/etas.py), or ""."""
        return runeta.straggler_line(etas.straggler_line(self.stragglers, self.now), self.run_eta)

    @property
    def straggler_help(self) -> str:
        return etas.assumption(self.stragglers) if self.stragglers is not None else ""

    @property
    def waste_line(self) -> str:
        """ "18.0% of completions, 31.0% of tokens were cut at 4,096 ..." (screens/waste.py); while
        the share at the ceiling is unknown (#39), "unknown" and why, never a calm 0.0%."""
        if self.unknown is not None:
            return f"unknown: {self.unknown.short}"
        return waste_words.waste_line(self.waste) if self.waste is not None else ""

    waste_help = waste_words.WASTE_HELP

    @property
    def energy_line(self) -> str:
        return waste_words.energy_line(self.energy)

    @property
    def progress(self) -> tuple[float, str] | None:
        """(share, words) for the progress bar: distinct prompts answered of [run] expected_prompts
        when both are known (#33: a retry is not progress), else completions of the target; None
        without either."""
        p = self.prompts or {}
        found = runeta.progress(
            fieldfigures.run_total_answered(p), p.get("expected"), self.summary.completions, self.target
        )
        return None if found is None else (found.share, found.words)

    def headline(self) -> dict[str, Any]:
        """The standup figures as one flat record (the download and `status --json`), rounded for people."""
        s, up, e = self.summary, self.standup, self.energy
        lo, hi = s.at_ceiling_interval
        loop = self.waste.loops if self.waste else None
        known = bool(s.completions) and self.unknown is None

        def r(x: float | None, nd: int = 1) -> float | None:
            return None if x is None else round(float(x), nd)

        return {
            "run": self.run,
            "run_state": self.state,
            "stalled": self.state == "stalled",
            "numbers_as_of": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.as_of)) if self.as_of else None,
            "completions": s.completions,
            "target_completions": self.target,
            "ceiling_tokens": s.ceiling_tokens,
            "truncated_pct": r(100 * s.at_ceiling_fraction, 2) if known else None,
            "truncated_pct_95ci_low": r(100 * lo, 2) if lo is not None and known else None,
            "truncated_pct_95ci_high": r(100 * hi, 2) if hi is not None and known else None,
            # null truncated_pct with a reason: the finish reason or token count is missing (#39)
            "truncated_unknown": self.unknown.to_json() if self.unknown is not None else None,
            "truncated_count": s.at_ceiling,
            "truncated_of": s.length_count,
            "length_stops_below_ceiling": s.length_below_ceiling,
            "truncated_tokens_pct": r(100 * s.at_ceiling_token_fraction, 2) if s.tokens_total and known else None,
            "truncated_tokens": s.at_ceiling_tokens,
            "tokens_total": s.tokens_total,
            "usable_completions": s.usable_completions,
            "tokens_per_usable_completion": r(s.tokens_per_usable, 1),
            "loop_tokens_pct": r(100 * loop.share, 2) if loop else None,
            "loop_tokens_pct_95ci": [r(100 * loop.low, 2), r(100 * loop.high, 2)] if loop else None,
            "loop_sample_n": loop.n if loop else None,
            "waste_line": self.waste_line,
            "energy_j": r(e.joules, 1) if e else None,
            "energy_source": e.source if e else None,
            "energy_dropped_steps": e.dropped_steps if e else None,  # intervals left out, tokens too (#40)
            "joules_per_1m_usable_tokens": r(e.joules_per_m, 1) if e else None,
            "gpu_hours_per_1m_usable_tokens": r(e.gpu_hours_per_m, 4) if e else None,
            "energy_line": self.energy_line,
            "tokens_per_s_last_1_min": r(up.tokens_per_s_1m, 0),
            "tokens_per_s_15_min_avg": r(up.tokens_per_s_15m, 0),
            "average_label": self.average.label,
            "eta_hours_at_15_min_avg": r(self.eta_s / 3600, 2) if self.eta_s is not None else None,
            **runeta.to_json(self.run_eta),
            "straggler_line": self.straggler_line,
            **etas.to_json(self.stragglers),
            "nodes_up": up.nodes_up,
            "nodes_stale": up.nodes_stale,
            "nodes_down": up.nodes_down,
            "nodes": up.nodes,
            "done_nodes": sorted(self.done_nodes),
            "alerts": [
                {"name": a.name, "severity": a.severity, "node": a.node, "summary": a.summary} for a in self.alerts
            ],
            **self._prompt_fields(),
            **(self.failed.to_json() if self.failed is not None else {}),
        }

    def _prompt_fields(self) -> dict[str, Any]:
        p = self.prompts or {}
        return {
            "prompts_answered": p.get("answered"),
            "prompts_expected": p.get("expected"),
            "prompts_missing": p.get("missing"),
            "prompts_answered_twice": p.get("answered_more_than_once"),
            "prompts_line": p.get("line"),
            # Set when prompt IDs were counted only since a store upgrade (#40 item 4): answered is since then.
            "prompts_counted_since_unix": p.get("counted_since_unix"),
            "prompts_completions_before_counting": p.get("completions_before"),
            "progress_pct": round(100 * self.progress[0], 2) if self.progress else None,
            "progress_line": self.progress[1] if self.progress else None,
        }

    def to_json(self) -> dict[str, Any]:
        """The headline record with the tiles as shown (JSON-ready)."""
        return {**self.headline(), "tiles": [dataclasses.asdict(t) for t in self.tiles]}

    def text(self) -> str:
        """A few lines for a terminal: the state, the tiles, the alerts."""
        lines = [f"{self.run}: {self.state}"]
        lines += [f"  {t.label}: {t.value}" + (f" ({t.sub})" if t.sub else "") for t in self.tiles]
        lines += [f"  {x}" for x in (self.waste_line, self.energy_line, self.straggler_line, self.failed_line) if x]
        if self.prompts:
            lines.append(f"  {self.prompts['line']}")
        lines += [f"  ! {a.summary}" for a in self.alerts]
        return "\n".join(lines)


def average_of(r: activity.RunRates, now: float, last_poll: float | None = None) -> Average:
    """What the average covers at `now`, and whether its window holds enough of the run's writing
    (its first live completion at least the window, less the live window, ago) for an ETA.
    `last_poll`: the latest collection; when it is stamped after `now` (this host's clock stepped
    back and no poll has come on the new clock yet) the polls still cover up to it, not 0 s."""
    seen = [
        n.first_seen_bridged if n.first_seen_bridged is not None else n.first_seen_unix
        for n in r.per_node.values()
        if n.first_seen_unix is not None
    ]
    end = now if last_poll is None else max(now, last_poll)
    covered = min(r.average_s, end - min(seen)) if seen else None
    return Average(r.average_s, covered, runeta.enough_for_eta(r, now))


def server_rate(store: Store, now: float, stale_after: float) -> float | None:
    """The servers' own tok/s: fresh gauges summed, plus their token counters' rates."""
    server = None
    fresh = now - stale_after
    gauges = [m["value"] for m in store.metric_latest() if m["name"] in SERVER_GAUGES and m["ts_unix"] >= fresh]
    if gauges:
        server = float(sum(gauges))
    for name in SERVER_COUNTERS:
        per_node: dict[str, list[tuple[float, float]]] = {}
        for m in store.metric_series(name, since_unix=now - SERVER_RATE_WINDOW_S):
            per_node.setdefault(m["node"], []).append((m["ts_unix"], m["value"]))
        node_rates = [x for x in (rates.counter_rate(s) for s in per_node.values()) if x is not None]
        if node_rates:
            server = (server or 0.0) + float(sum(node_rates))
    return server


def throughput_series(store: Store, now: float, interval_s: float) -> tuple[ThroughputPoint, ...]:
    """The chart's tok/s per bucket of a few polls over the last hour, complete buckets only (the
    last one is still filling), each poll's tokens spread over the time it covers
    (`activity.throughput_buckets`: the tiles' rates on the same terms); a bucket no poll covers
    is left out and the chart breaks its line there (components/figures.py `gaps`)."""
    bucket_s = stale_after_s(interval_s)
    rows = activity.poll_rows(store, now, DROP_LOOKBACK_S)  # the rates' read: its kept rows, no second read
    got = activity.throughput_buckets(rows, bucket_s, now - DROP_LOOKBACK_S, now)
    return tuple(ThroughputPoint(b, tps) for b, tps in got)


def heat_rows(gpus: list[GpuRow], now: float, stale_after: float) -> tuple[HeatRow, ...]:
    """The GPU strip: old readings and hardware-throttled GPUs are named (a throttled GPU would
    otherwise look busy and well)."""
    out = []
    for g in gpus:
        label = f"{g['node']}/{g['gpu']}"
        if any(x in hardware.HW_THROTTLE for x in g.get("throttle_reasons") or []):
            label += " ⚠ throttled"
        if g["ts_unix"] is not None and now - g["ts_unix"] > stale_after:
            label += " (old)"
        out.append(
            HeatRow(
                label,
                g["util_pct"],
                _pct(g["power_w"], g["power_limit_w"]),
                _pct(g["mem_used_mib"], g["mem_total_mib"]),
            )
        )
    return tuple(out)


def _pct(x: float | None, of: float | None) -> float | None:
    return 100 * x / of if x is not None and of else None


def overview(store: Store, config: RunConfig, now: float | None = None, finished: bool = False) -> Overview:
    """The Overview of `config`'s run (a RunConfig) at `now`, from one reading of `store`: a live
    run's reads inside one read snapshot (every table as of one commit, however many polls land
    meanwhile); a finished run's store no longer changes (and its final figures are kept in it)."""
    now = time.time() if now is None else now
    with contextlib.nullcontext() if finished else store.snapshot():
        return _overview(store, config, now, finished)


def _overview(store: Store, config: RunConfig, now: float, finished: bool) -> Overview:
    # The alerts' reading (health.read's own lookback: the rate windows and twice the stall window,
    # no longer the hour): the same alerts the history records, and a third of the hour's cost
    # at 512 nodes. The throughput chart and the rate drop read the hour, summed in SQL.
    reading = health.read(store, now, RunSettings.from_config(config))
    found = health.alerts_of(reading)
    state = runeta.run_state(found, finished)
    nodes = reading.nodes
    names = {n["name"] for n in nodes}
    gpus = [g for g in reading.gpu_latest if g["node"] in names]
    power = [g["power_w"] for g in gpus if g["power_w"] is not None]
    up = derived.standup(
        reading.summary.completions,
        config.target_completions,
        reading.rates,
        nodes,
        len(gpus) or sum(x.get("gpus_found") or 0 for x in nodes),
        float(sum(power)) if gpus else None,
        config.stale_after,
        now,
        reading.last_collection_unix,
    )
    average = average_of(reading.rates, now, reading.last_collection_unix)
    prompts = fieldmodel.prompt_completeness(store, config, reading.summary.completions)
    p = prompts or {}
    since = p.get("counted_since_unix") is not None
    live = runeta.live_eta(store, reading, up.completions, p.get("answered"), since, state, hold=not finished)
    basis, eta = live.basis, live.eta_s
    health_rows = {(h["node"], h["gpu"]): h["health"] for h in reading.gpu_health if h["node"] in names}
    labelled = [{**g, "label": f"{g['node']}/{g['gpu']}"} for g in gpus]
    model = Overview(
        run=config.name,
        now=now,
        as_of=reading.last_collection_unix,
        state=state,
        target=config.target_completions,
        summary=reading.summary,
        standup=up,
        average=average,
        eta_s=eta,
        alerts=tuple(found),
        nodes=tuple(nodes),
        per_node=None if finished else dict(reading.rates.per_node),
        heat=heat_rows(gpus, now, config.stale_after),
        gpu_simulated=any(n.get("gpu_simulated") for n in nodes),
        gpu_notes=tuple(hardware.gpu_notes(labelled, health_rows, bool(reading.rates.tokens_per_s_1m))),
        server_tokens_per_s=None if finished else server_rate(store, now, config.stale_after),
        throughput=throughput_series(store, now, config.interval_s),
        tiles=(),
        final=derived.final(store, reading.summary.completions) if finished else None,
        waste=tokencost.waste(reading.summary, store.latest_loop_sample()),
        energy=tokencost.energy_cost(e for e in store.node_energy() if e["node"] in names),
        prompts=prompts,
        stragglers=live.shown_shares,
        events=chart_events(store, now - EVENTS_LOOKBACK_S),
        run_eta=basis,
        done_nodes=tuple(sorted(health.done_nodes(nodes, reading.settings))),
        failed=reading.failed,
        unknown=reading.unknown,
    )
    tiles = final_tiles(model, config) if finished else live_tiles(model, config)
    return dataclasses.replace(model, tiles=tuple(tiles))


def truncation_tile(summary: Summary, warn: float, alert: float, unknown: Unknown | None = None) -> Tile:
    """The share at the ceiling, its interval and n (the level: health.level, as the alerts);
    "unknown" in red, never 0%, when the finish reason or token count is missing (#39)."""
    if not summary.completions:
        return Tile("Truncated", "—", "no completions counted yet", "muted")
    if unknown is not None:  # the banner (the truncation_unknown alert) says where we looked and what to set
        return Tile("Truncated", "unknown", unknown.short, "alert")
    if not summary.ceiling_tokens:
        return Tile("Truncated", "none", "no max_tokens ceiling found in the data", "ok")
    frac = summary.at_ceiling_fraction
    lo, hi = summary.at_ceiling_interval
    src = "exact" if summary.length_source == "completion_tokens" else "chars/4 estimate"
    return Tile(
        "Truncated",
        f"{frac:.1%}",
        f"at the {summary.ceiling_tokens:,} ceiling · 95% CI {lo:.1%}–{hi:.1%} · {src} · "
        f"{summary.at_ceiling:,} of {summary.length_count:,}",
        level(frac, warn, alert),
    )


def _rate_tile(m: Overview) -> Tile:
    n = m.standup
    tps = n.tokens_per_s_1m
    sub = (
        (
            f"{m.average.label} {fmt_rate(n.tokens_per_s_15m)}"
            if n.tokens_per_s_15m is not None
            else f"{m.average.label} —"
        )
        + (f" · {fmt_rate(n.tokens_per_s_per_gpu)} per GPU" if n.tokens_per_s_per_gpu is not None else "")
        + (f" · {n.tokens_per_joule:.1f} tok/J" if n.tokens_per_joule else "")
        + (f" · server says {fmt_rate(m.server_tokens_per_s)}" if m.server_tokens_per_s is not None else "")
    )
    label = f"Tokens / s · last {fmt_window(n.rate_window_s)}"
    value = fmt_rate(tps) if tps is not None else "—"
    if m.state == "stalled":  # a rate over the last minute still shows the past
        return Tile(label, value, "run stalled: no new completions · " + sub, "alert")
    if m.state == "stale":
        return Tile(label, value, "collection stale: not a current rate · " + sub, "warn")
    return Tile(
        label,
        value,
        sub if tps is not None else "waiting for two polls",
        "ok" if tps else "warn" if tps == 0 else "muted",
    )


def _eta_tile(m: Overview) -> Tile:
    """The ETA on its basis (screens/runeta.py: distinct prompts or completions), its rate named."""
    n = m.standup  # an Overview built without its basis: the completions ETA (runeta's, as every ETA)
    e = m.run_eta or runeta.run_eta(n.completions, m.target, None, None, None)
    words = runeta.tile_words(e, m.eta_s, m.average.label, m.average.enough_for_eta, fmt_window(m.average.window_s))
    if e.eta_s == 0 or not e.goal:
        return Tile("ETA", *words)
    if m.state == "stalled":
        return Tile("ETA", "—", "no ETA: the run is stalled (no new completions)", "alert")
    if m.state == "stale":
        return Tile("ETA", "—", "no ETA: the numbers are stale (no recent collection)", "warn")
    return Tile("ETA", *words)


def live_tiles(m: Overview, config: RunConfig) -> list[Tile]:
    """The six standup tiles: done, throughput, ETA, truncation, nodes, data age; every one
    follows the run state (a stalled or stale run has no plain ETA and no calm rate)."""
    n = m.standup
    p = m.prompts or {}
    found = runeta.progress(p.get("answered"), p.get("expected"), n.completions, m.target)
    done_sub = "no target_completions set" if not m.target else f"of {m.target:,} target"
    if found is not None:  # the one progress, as the bar and /metrics: prompts when they are known
        done_sub += f" ({found.share:.1%})" if found.basis == "completions" else f" · {found.share:.1%} of prompts"
    age = n.data_age_s
    return [
        Tile("Completions", f"{n.completions:,}", done_sub, "ok" if n.completions else "muted"),
        _rate_tile(m),
        _eta_tile(m),
        truncation_tile(m.summary, config.truncation_warn_fraction, config.truncation_alert_fraction, m.unknown),
        Tile(
            "Nodes up",
            f"{n.nodes_up} / {n.nodes}",
            f"{n.nodes_stale} stale · {n.nodes_down} down"
            + (f" · disk free ≥ {fmt_bytes(n.min_disk_free_bytes)}" if n.min_disk_free_bytes else ""),
            "alert" if n.nodes_down else "warn" if n.nodes_stale or not n.nodes_up else "ok",
        ),
        Tile(
            "Data age",
            fmt_age(age) if age is not None else "—",
            "waiting for first poll" if age is None else f"stale after {fmt_age(config.stale_after)}",
            "muted" if age is None else "alert" if age > config.stale_after else "ok",
        ),
    ]


def final_tiles(m: Overview, config: RunConfig) -> list[Tile]:
    """A finished run's six tiles: its final figures, no live placeholders, no node states."""
    f = m.final
    assert f is not None
    target = m.target
    # The big number holds the clock time (a full date overflowed the tile); the date goes below.
    when = time.strftime("%H:%M", time.localtime(f.completed_unix)) if f.completed_unix else "—"
    day = time.strftime("%Y-%m-%d", time.localtime(f.completed_unix)) if f.completed_unix else ""
    last = time.strftime("%Y-%m-%d %H:%M", time.localtime(f.last_poll_unix)) if f.last_poll_unix else "never"
    duration = f"over {fmt_age(f.duration_s)}" if f.duration_s is not None else "duration unknown"
    return [
        Tile("Completions", f"{f.completions:,}", f"of {target:,} target" if target else "final count", "ok"),
        Tile("Tokens / s · average over its life", fmt_rate(f.tokens_per_s_life), duration, "ok"),
        Tile(
            "Completed at",
            when,
            " · ".join(x for x in (day, f"duration {fmt_age(f.duration_s)}" if f.duration_s is not None else "") if x),
            "ok",
        ),
        truncation_tile(m.summary, config.truncation_warn_fraction, config.truncation_alert_fraction, m.unknown),
        Tile("Nodes", f"{len(m.nodes)}", "finished: no longer polled", "muted"),
        Tile("Numbers", "final", f"last poll {last}", "muted"),
    ]
