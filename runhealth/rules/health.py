"""Is the run healthy *now*? Node states, the alert set and the one ok/warn/alert rule.

One definition per term: the node states (pending / up / stale / down), the alert set
(`evaluate`) and `level` live here; the stale and stall windows in runhealth.settings.windows; the
tok/s, the stall rule and the rate drop in runhealth.rules.activity; a GPU's state in
runhealth.rules.hardware. `evaluate()` returns the alerts that hold at one instant: the Overview words
exactly these (components/alerts.py), `runhealth.alerting.notify` diffs successive answers into start /
resolve messages, and the exporter reads the same rules.

Alerts (name, severity): collector_down (the collector that wrote the run is gone, stopped or
silent: named by pid and host, in place of the node states, stalls and drops it no longer
refreshes; runhealth.heartbeat), collection_stale, store_write_failure, node_down (critical) /
node_stale, shards_unmatched, shards_unreadable (warning); run_stalled (critical, since the
last completion) or node_stalled (warning, only while another node writes) and rate_drop
(warning), none once the target is reached; truncation_high (warning at the warn share,
critical at the alert share), or truncation_unknown (critical: the one figure
the run is watched for cannot be counted) in its place when the finish reason
or the token count is missing on too many completions (analysis/unknowns.py, #39);
failed_requests_high (warning / critical at [run] failed_warn_share / failed_crit_share of requests,
analysis/failed.py, #39); gpu_error (critical), gpu_throttled, gpu_hot, gpu_idle while the
run writes (warning): every GPU finding of runhealth.rules.hardware that is not information; and
the GPU's and host's health (`hardware_alerts`): gpu_xid (critical XID events in the last hour),
gpu_ecc_uncorrected, gpu_row_remap_failed, gpu_missing (a GPU that reported within the hour is
absent from an up node's latest poll) (critical); gpu_rows_pending, host_memory, host_swap,
host_load (warning). Whatever a page colours as a warning or an error is one of these: the
pages word only these, and the GPUs and Nodes pages add information lines (hardware.gpu_notes).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Literal

from runhealth import heartbeat
from runhealth.ages import fmt_age, fmt_ago
from runhealth.analysis import failed as failed_reqs
from runhealth.analysis import reasons, stats, unknowns
from runhealth.records import GpuEventRow, GpuHealthReading, GpuRow, HostReading, NodeRow
from runhealth.rules import activity, hardware
from runhealth.rules.hardware import host_problems as host_problems  # re-exported: one import for the words
from runhealth.rules.hardware import missing_gpus as missing_gpus
from runhealth.settings import windows
from runhealth.settings.runsettings import RunSettings
from runhealth.settings.windows import HARDWARE_WINDOW_S
from runhealth.settings.windows import stale_after_s as stale_after_s  # re-exported: tests ask health
from runhealth.settings.windows import stall_after_s as stall_after_s
from runhealth.store import Store
from runhealth.store.failedreads import FailedRow

# -- Node states, stalls and alerts (from the store) ------------------------------------
# Moved here from runhealth/alerts.py (#14).
DOWN_AFTER_STALE = 5  # a node is "down" once it has failed for 5 x stale_after


def node_status(node: NodeRow, now: float, stale_after: float) -> tuple[str, str]:
    """(state, one-line reason). The rule, also shown on the Nodes page:

    pending = never polled; up = last success within stale_after; down = never succeeded but
    failing, or no success for 5 x stale_after; stale = in between.
    """
    last_ok, err = node.get("last_ok_unix"), node.get("last_error")
    failing = node.get("failing_since_unix") is not None
    if last_ok is None:
        return ("down", f"never reached: {err}") if err else ("pending", "waiting for first poll")
    age = now - last_ok
    if age <= stale_after:
        return "up", f"last poll {fmt_ago(age)}"
    why = f": {err}" if failing and err else ""
    state = "down" if age > DOWN_AFTER_STALE * stale_after else "stale"
    return state, f"{state} for {fmt_age(age)}{why}"


def stalled_nodes(
    store: Store, now: float, window: float, memo: dict[tuple, activity.RunRates] | None = None
) -> dict[str, float]:
    """Every quiet node under the one stall rule (activity.stall_state), the run stalled or not:
    {node: seconds since its last new completion (or since it was first seen)}. `memo`: as
    activity.read_rates's (a scrape reads the polls once for this and `evaluate`)."""
    found = activity.stall_state(activity.read_rates(store, now, 2 * window, memo=memo).per_node, now, window)
    return {node: now - since for node, since in found.nodes.items()}


def done_nodes(nodes: Sequence[NodeRow], settings: RunSettings) -> set[str]:
    """The nodes that wrote their share: with fixed shares (the default; [run] shared_queue =
    false) each node's share is target / nodes (analysis/stragglers.py), and a node past it is
    done, a state of its own: never stalled, never alerted (#41). None with one shared queue."""
    target = settings.target_completions
    if settings.shared_queue or not target or not nodes:
        return set()
    need = max(0, int(round(target / len(nodes))))
    return {n["name"] for n in nodes if n["completions"] >= need}


@dataclasses.dataclass(frozen=True)
class Alert:
    """One condition that holds now. `key` identifies it across evaluations."""

    name: str  # truncation_high, node_down/stale/stalled, gpu_throttled/hot, collection_stale, store_write_failure
    severity: str  # "critical" | "warning"
    run: str
    summary: str  # one sentence for people
    node: str | None = None
    gpu: int | None = None
    value: float | None = None

    @property
    def key(self) -> tuple:
        return (self.name, self.node, self.gpu)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the GPU and host rules read at one instant (`read_hardware`; every `Reading` holds it
    too): the GPUs page's reading, without the run's length counts it never shows."""

    now: float
    settings: RunSettings  # the run's (runhealth.settings.runsettings): its name, windows, nodes, target
    nodes: list[NodeRow]  # the nodes the config names now
    rates: activity.RunRates
    gpu_latest: list[GpuRow]
    gpu_health: list[GpuHealthReading]
    gpu_events: list[GpuEventRow]
    gpus_seen: dict[str, set[int]]
    host_latest: dict[str, HostReading]

    @property
    def stale_after(self) -> float:
        return self.settings.stale_after


@dataclasses.dataclass(frozen=True)
class Reading(Hardware):
    """What the alert rules read from the store at one instant (`read`): a screen that words
    the alerts and shows tiles builds both from one Reading, so they cannot disagree."""

    last_collection_unix: float | None
    fault: heartbeat.CollectorFault | None  # the collector is gone (only looked up when stale)
    summary: stats.Summary
    failed: failed_reqs.FailedRequests | None = None  # the run's failed requests (#39); None: not read
    failed_rows: tuple[FailedRow, ...] = ()  # by node and reason (Store.failed_rows): the Nodes page's

    @property
    def unknown(self) -> unknowns.Unknown | None:
        """Why the share at the ceiling is unknown (analysis/unknowns.py), or None."""
        return unknowns.unknown_of(self.summary)

    @property
    def stall_after(self) -> float:
        return self.settings.stall_after


def read(
    store: Store,
    now: float | None = None,
    settings: RunSettings | None = None,
    rates_lookback_s: float | None = None,
    memo: dict[tuple, activity.RunRates] | None = None,
    summary: stats.Summary | None = None,
) -> Reading:
    """Everything `evaluate` needs at `now`, each table read once. `rates_lookback_s`: how far
    back the rates read polls (default: what the alerts need; a screen passes the hour it shows).
    `memo`: rate readings already taken at `now` (/metrics passes one per scrape, so its stall
    series and its alerts read the polls once). `summary`: the run's length summary as the
    caller counted it at this instant (a screen that shows it: runeta.store_eta), not counted again."""
    now = time.time() if now is None else now
    settings = store.run_settings() if settings is None else settings
    stale_after = settings.stale_after
    last = store.last_collection_unix()
    stale = last is None or now - last > stale_after
    fault = heartbeat.fault(heartbeat.read_status(store), now, stale_after) if stale else None
    every = store.nodes()
    gone = store.superseded_nodes()
    if summary is None:
        malformed = sum(n["malformed"] for n in every if n["name"] not in gone)
        summary = _summary(store.run_length_rows(), settings.max_output_tokens, malformed)
    failed_rows = store.failed_rows(gone)  # one statement; their prompt IDs only when some failed
    failed_prompts = store.failed_prompts() if failed_rows else None
    hw = _hardware(store, now, settings, every, rates_lookback_s, memo)
    return Reading(
        **{f.name: getattr(hw, f.name) for f in dataclasses.fields(Hardware)},
        last_collection_unix=last,
        fault=fault,
        summary=summary,
        failed=failed_reqs.failed_requests(failed_rows, summary.completions, prompts=failed_prompts),
        failed_rows=tuple(failed_rows),
    )


def read_hardware(store: Store, now: float | None = None, settings: RunSettings | None = None) -> Hardware:
    """What the GPU and host rules need at `now` (`gpu_alerts`), as `read` reads it, without the
    run's length counts and failed requests (most of `read`'s time on a run's every rerun of the
    GPUs page, which shows neither)."""
    now = time.time() if now is None else now
    settings = store.run_settings() if settings is None else settings
    return _hardware(store, now, settings, store.nodes())


def _hardware(
    store: Store,
    now: float,
    settings: RunSettings,
    every: list[NodeRow],
    rates_lookback_s: float | None = None,
    memo: dict[tuple, activity.RunRates] | None = None,
) -> Hardware:
    keep = settings.node_names  # a node removed from the config raises no alert (its history stays)
    interval_s = settings.interval_s
    lookback = _rates_lookback(store, now, settings.stall_after, interval_s)
    return Hardware(
        now=now,
        settings=settings,
        nodes=[n for n in every if keep is None or n["name"] in keep],
        rates=activity.read_rates(store, now, max(lookback, rates_lookback_s or 0.0), interval_s, memo),
        gpu_latest=store.gpu_latest(),
        gpu_health=store.gpu_health(),
        gpu_events=store.gpu_events(now - HARDWARE_WINDOW_S),
        gpus_seen=store.gpus_seen(now - HARDWARE_WINDOW_S),
        host_latest=store.host_latest(),
    )


def evaluate(
    store: Store,
    now: float | None = None,
    settings: RunSettings | None = None,
    memo: dict[tuple, activity.RunRates] | None = None,
) -> list[Alert]:
    """Every alert that holds at `now`, most serious first: the Overview words exactly these,
    the notifier sends them and the exporter counts them.

    Args:
        settings: the run's settings; default: what the collector saved in the store
            (`RunSettings.from_meta`). The Overview passes its own config's (`RunSettings.from_config`).
        memo: rate readings already taken at `now` (activity.read_rates): /metrics passes one
            per scrape, so its stall series and its alerts read the polls once.
    """
    return alerts_of(read(store, now, settings, memo=memo))


def alerts_of(r: Reading) -> list[Alert]:
    """The alerts that hold in reading `r` (no store read: the rules only)."""
    now, settings = r.now, r.settings
    run = settings.name
    stale_after = r.stale_after
    out: list[Alert] = []
    last = r.last_collection_unix
    stale = last is None or now - last > stale_after
    if r.fault is not None:  # the collector's fault, not the nodes': say so, and blame no node
        out.append(Alert("collector_down", "critical", run, r.fault.text, value=r.fault.age_s))
    elif last is not None and stale:
        age = fmt_age(now - last)
        out.append(Alert("collection_stale", "critical", run, f"No successful collection for {age}.", value=now - last))
    keep = settings.node_names
    nodes = r.nodes
    out += _node_alerts(nodes, run, now, stale_after)
    summary = r.summary
    target = settings.target_completions
    if not (target and summary.completions >= target):  # a run that reached its target stops on purpose
        up = {n["name"] for n in nodes if node_status(n, now, stale_after)[0] == "up"} - done_nodes(nodes, settings)
        out += _stall_alerts(r.rates, run, now, r.stall_after, up)
    unknown = r.unknown
    if unknown is not None:  # the share at the ceiling would read as a calm 0%: say it is unknown
        out.append(Alert("truncation_unknown", "critical", run, f"Truncation unknown: {unknown.text}"))
    else:
        out += truncation_alerts(summary, settings, run)
    if r.failed is not None:
        out += failed_alerts(r.failed, settings, run)
    out += gpu_alerts(r)
    out = [a for a in out if a.node is None or keep is None or a.node in keep]
    if r.fault is not None:  # node states, stalls and drops are frozen at the collector's last poll
        out = [a for a in out if a.name not in COLLECTOR_FROZEN]
    return sorted(out, key=lambda a: a.severity != "critical")


def _rates_lookback(store: Store, now: float, stall_s: float, interval_s: float) -> float:
    """How far back `evaluate` reads polls: twice the stall window, so a quiet node's last growth
    is in it; but in a store younger than the stall window no node can have been quiet that long
    (a finished run's view, whose stall window no age reaches, is the usual case), and then
    only what the live rate and the rate drop need: the live window and a few polls.
    Reading a finished run's every poll made its Overview take most of a second (issue 34)."""
    live = windows.rates_lookback_s(interval_s, windows.rate_window_s(interval_s))
    lookback = max(2 * stall_s, live)
    first = store.cursor("SELECT MIN(ts_unix) FROM polls").fetchone()[0]
    if first is not None and now - first < stall_s:
        return min(lookback, max(live, 3 * interval_s))
    return lookback


# Alerts that only say the collector stopped refreshing them when it is gone (collector_down says that).
COLLECTOR_FROZEN = frozenset({"node_stale", "node_down", "run_stalled", "node_stalled", "rate_drop"})


def _node_alerts(nodes: list[NodeRow], run: str, now: float, stale_after: float) -> list[Alert]:
    out = []
    for n in nodes:
        name = n["name"]
        state, why = node_status(n, now, stale_after)
        age = now - n["last_ok_unix"] if n["last_ok_unix"] else None
        if n.get("store_error"):  # set by the store when this node's poll could not be written (#12)
            text = f"{name}: {n['store_error']} — new data is not being saved (see Nodes)."
            out.append(Alert("store_write_failure", "critical", run, text, node=name))
        if state in ("down", "stale"):
            out.append(
                Alert(
                    f"node_{state}",
                    "critical" if state == "down" else "warning",
                    run,
                    f"{name} {why}",
                    node=name,
                    value=age,
                )
            )
        for glob in n.get("unmatched_globs") or []:
            out.append(Alert("shards_unmatched", "warning", run, f"No shard matched {glob} on {name}.", node=name))
        if n.get("shard_errors"):
            text = f"{name}: {n['shard_errors']} shard(s) cannot be read (see Nodes)."
            out.append(Alert("shards_unreadable", "warning", run, text, node=name, value=float(n["shard_errors"])))
    return out


def _stall_alerts(rates_now: activity.RunRates, run: str, now: float, stall_s: float, up: set[str]) -> list[Alert]:
    """The one stall rule (activity.stall_state) and the rate drop, over the up nodes."""
    found = activity.stall_state(rates_now.per_node, now, stall_s, up)
    if found.run_since_unix is not None:
        since = found.run_since_unix
        text = (
            f"Run stalled: no new completions from any node since {_clock(since)} "
            f"({fmt_age(now - since)}; alert after {fmt_age(stall_s)})."
        )
        return [Alert("run_stalled", "critical", run, text, value=now - since)]
    out = []
    writers = sorted(found.writing)
    others = (
        f"{', '.join(writers)} write{'s' if len(writers) == 1 else ''}"
        if len(writers) <= 3
        else (f"{len(writers)} other nodes write")
    )
    for node, since in sorted(found.lone().items()):
        text = f"{node}: no new completions for {fmt_age(now - since)} (since {_clock(since)}) while {others}."
        out.append(Alert("node_stalled", "warning", run, text, node=node, value=now - since))
    if rates_now.drop_median_tps is not None and rates_now.tokens_per_s_1m is not None:
        text = (
            f"Throughput dropped: {rates_now.tokens_per_s_1m:,.0f} tok/s over the last minute, below half "
            f"the last hour's median ({rates_now.drop_median_tps:,.0f} tok/s)."
        )
        out.append(Alert("rate_drop", "warning", run, text, value=rates_now.tokens_per_s_1m))
    return out


def _clock(ts: float) -> str:
    """A wall-clock time for "since when" sentences (the host's time zone)."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def truncation_alerts(summary: stats.Summary, settings: RunSettings, run: str) -> list[Alert]:
    """The share at the ceiling against the one `level` rule: warning, then critical."""
    warn, alert = settings.truncation_warn_fraction, settings.truncation_alert_fraction
    if alert is None or not summary.completions or not summary.ceiling_tokens:
        return []
    frac = summary.at_ceiling_fraction
    found = level(frac, alert if warn is None else warn, alert)
    if found == "ok":
        return []
    return [
        Alert(
            "truncation_high",
            "critical" if found == "alert" else "warning",
            run,
            f"{frac:.1%} of completions stop at the {summary.ceiling_tokens:,}-token ceiling"
            f" ({'alert' if found == 'alert' else 'warning'} at {alert if found == 'alert' else warn:.1%};"
            f" n={summary.length_count:,}).",
            value=frac,
        )
    ]


def failed_alerts(failed: failed_reqs.FailedRequests, settings: RunSettings, run: str) -> list[Alert]:
    """The share of requests that failed (analysis/failed.py) against the one `level` rule."""
    warn, crit, share = settings.failed_warn_share, settings.failed_crit_share, failed.share
    if crit is None or share is None or not failed.failed:
        return []
    found = level(share, crit if warn is None else warn, crit)
    if found == "ok":
        return []
    limit = crit if found == "alert" else warn
    return [
        Alert(
            "failed_requests_high",
            "critical" if found == "alert" else "warning",
            run,
            f"{failed.failed:,} requests failed, {share:.1%} of {failed.requests:,}"
            f" ({'critical' if found == 'alert' else 'warning'} at {limit:.1%}; {failed.reasons_text}).",
            value=share,
        )
    ]


def _gpu_alerts(latest: list[GpuRow], run: str, run_writing: bool) -> list[Alert]:
    """Every GPU finding (hardware.gpu_findings, the one GPU rule) that is not information:
    gpu_error (critical), gpu_throttled, gpu_hot, gpu_idle while the run writes (warning)."""
    out = []
    for g in latest:
        for f in hardware.gpu_findings(g, run_writing):
            if f.level == "info":
                continue
            value = float(g["temp_c"]) if f.kind == "hot" and g["temp_c"] is not None else 1.0
            text = f"{g['node']}/GPU {g['gpu']} {f.text}."
            severity = "critical" if f.level == "error" else "warning"
            out.append(Alert(f"gpu_{f.kind}", severity, run, text, node=g["node"], gpu=g["gpu"], value=value))
    return out


def gpu_alerts(h: Hardware) -> list[Alert]:
    """The GPU and host alerts at `h`, most serious first, exactly as `alerts_of` holds them among
    the others (the GPUs page reads these alone: `read_hardware`)."""
    run, keep = h.settings.name, h.settings.node_names
    out = _gpu_alerts(h.gpu_latest, run, bool(h.rates.tokens_per_s_1m)) + hardware_alerts(h, run)
    out = [a for a in out if a.node is None or keep is None or a.node in keep]
    return sorted(out, key=lambda a: a.severity != "critical")


def hardware_alerts(r: Hardware, run: str) -> list[Alert]:
    """A GPU's and a host's health as alerts: XIDs of the last hour, uncorrected ECC, failed and
    pending row remaps, a GPU missing from an up node's latest poll, RAM, swap and CPU load."""
    now, nodes, stale_after = r.now, r.nodes, r.stale_after
    out = []
    for node, gpu, xid, text in hardware.xid_findings(r.gpu_events):
        out.append(Alert("gpu_xid", "critical", run, f"{text}.", node=node, gpu=gpu, value=float(xid)))
    health_rows = {(h["node"], h["gpu"]): h["health"] for h in r.gpu_health}
    for f in hardware.health_findings(health_rows):
        severity = "critical" if f.level == "error" else "warning"
        out.append(Alert(f"gpu_{f.kind}", severity, run, f"{f.text}.", node=f.node, gpu=f.gpu, value=f.value))
    reporting: dict[str, set[int]] = {}
    for g in r.gpu_latest:
        reporting.setdefault(g["node"], set()).add(int(g["gpu"]))
    # A GPU is missing from an up node whose telemetry answered (no telemetry at all is its own error).
    up = {
        n["name"]
        for n in nodes
        if node_status(n, now, stale_after)[0] == "up" and n.get("gpu_source") and not n.get("gpu_error")
    }
    for node, gone, text in hardware.missing_gpu_findings(r.gpus_seen, reporting, up):
        out.append(Alert("gpu_missing", "critical", run, f"{text}.", node=node, value=float(len(gone))))
    loads = {n["name"]: n.get("loadavg") for n in nodes}
    for node, kind, text, value in hardware.host_findings(r.host_latest, loads):
        out.append(Alert(kind, "warning", run, f"{text}.", node=node, value=value))
    return out


def run_summary(store: Store, ceiling: int | None) -> stats.Summary:
    """The run's length summary, exactly as the Overview computes it."""
    return _summary(store.run_length_rows(), ceiling, sum(n["malformed"] for n in store.counted_nodes()))


def _summary(rows: list[tuple[int, str | None, int, int]], ceiling: int | None, malformed: int) -> stats.Summary:
    """stats.summarize over the run's length rows (Store.run_length_rows); a store from before
    reasons were bounded may hold 100,000 distinct ones: they are folded into "other" first
    (summarize bounds them the same way, so the Summary is the same), and a scrape's alerts stay cheap."""
    totals: dict[str, int] = {}
    for _tokens, reason, _estimated, count in rows:
        totals[reason or ""] = totals.get(reason or "", 0) + count
    if len(totals) > len(reasons.KNOWN) + reasons.MAX_SHOWN_OTHERS + 2:
        names = reasons.shown_names(totals)
        shown = {r: r for r in names} | {"": ""}
        rows = [(t, shown.get(r or "", reasons.OTHER) or None, e, n) for t, r, e, n in rows]
    return stats.summarize(stats.LengthHist.from_rows(rows), ceiling=ceiling, unparseable=malformed)


# -- one ok / warn / alert rule -----------------------------------------------------------------
Level = Literal["ok", "warn", "alert"]


def level(value: float | None, warn_at: float, alert_at: float) -> Level:
    """The one threshold rule for a "higher is worse" number: "alert" at or above `alert_at`,
    "warn" at or above `warn_at`, else "ok" (a missing value is "ok": nothing to alarm on).

    Tiles (components/cards.py), the what-if tile (pages/lengths.py) and the per-group bar
    colours (components/figures.py) all ask this, so a share exactly at a threshold is the same
    colour everywhere.
    """
    if value is None:
        return "ok"
    if value >= alert_at:
        return "alert"
    return "warn" if value >= warn_at else "ok"
