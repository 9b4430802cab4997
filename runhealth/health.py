"""Is the run healthy *now*? Rates, stalls, node states, alerts and GPU/host problems, in one place.

One definition per term: the node states (pending / up / stale / down), the one stale rule
(`stale_after_s`), the stall rule and the alert set live here; the Overview's cards, the
Prometheus exporter and the webhook notifier all read them from this module. `evaluate()`
returns the alerts that hold at one instant; `runhealth.notify` diffs successive answers into
start / resolve messages.

Rates, stalls and rate drops are pure functions over poll rows (no Streamlit, no SQL), so each
rule is unit-tested on its own.

A poll row is ``(ts_unix, node_ts_unix, delta_completions, delta_tokens, backfill)``: the
dashboard's clock says *when we saw it* (stalls are reported in the viewer's time), the node's
clock gives the rate (as in runhealth.analysis.rates, skew cancels out).

Definitions used on screen:
- "Tokens/s (last 1 min)": each node's mean rate over the last 60 s of its own clock, ending
  at *now* (the node's clock estimated from its latest poll), summed over nodes. A node with
  no poll in the window adds nothing: its absence shows on the Nodes tile, not as a made-up rate.
- "15-min average": the same with a 900 s window. ETA uses it (stated on the tile).
- Stalled: a node whose shards have not grown for ``stall_after_s`` (the run: no node grew).
  The first poll (the index of what was already there) counts as growth at the moment we saw it.
- Rate drop: the last minute's rate below half the median per-minute rate of the last hour.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Literal

from runhealth.analysis import rates, stats
from runhealth.node.wire import GpuHealth
from runhealth.records import GpuEventRow, HostReading, NodeRow, PollBucket
from runhealth.store import Store
from runhealth.windows import stale_after_s as stale_after_s  # re-exported: the exporter and tests ask health
from runhealth.windows import stall_after_s as stall_after_s

SHORT_WINDOW_S = 60.0
LONG_WINDOW_S = 900.0
DROP_FRACTION = 0.5
MIN_MINUTES_FOR_MEDIAN = 10  # a median over fewer minutes is noise, not a baseline


@dataclasses.dataclass
class NodeRate:
    """One node's throughput and when its shards last grew (dashboard clock)."""

    tokens_per_s_1m: float | None
    tokens_per_s_15m: float | None
    completions_per_s_15m: float | None
    last_growth_unix: float | None
    first_seen_unix: float | None


def node_rate(rows: list[tuple], now: float) -> NodeRate:
    """Rates and last growth of one node from its poll rows (any order)."""
    rows = sorted(rows, key=lambda r: r[0])
    if not rows:
        return NodeRate(None, None, None, None, None)
    latest = rows[-1]
    skew = (latest[1] - latest[0]) if latest[1] is not None else 0.0
    node_now = now + skew
    points = [(r[1] if r[1] is not None else r[0], r[2] or 0, r[3] or 0, bool(r[4])) for r in rows]
    _, tps_1m = window_rate(points, node_now, SHORT_WINDOW_S)
    cps_15m, tps_15m = window_rate(points, node_now, LONG_WINDOW_S)
    grown = [r[0] for r in rows if (r[2] or 0) > 0]
    return NodeRate(tps_1m, tps_15m, cps_15m, grown[-1] if grown else None, rows[0][0])


def window_rate(points: list, end_t: float, window_s: float) -> tuple[float | None, float | None]:
    """Mean (completions/s, tokens/s) over the spans inside [end_t - window_s, end_t].

    A span straddling the start counts pro rata; the time after the last poll is not counted
    (it is unknown, not zero). (None, None) when no span reaches into the window.
    """
    return rates.windowed_rate(points, window_s, end_t)


def run_rates(rows_by_node: dict[str, list[tuple]], now: float) -> dict[str, Any]:
    """Per-node NodeRate and run totals: tokens/s over 1 min and 15 min, completions/s over 15 min."""
    per_node = {name: node_rate(rows, now) for name, rows in rows_by_node.items()}

    def total(attr: str) -> float | None:
        known = [getattr(r, attr) for r in per_node.values() if getattr(r, attr) is not None]
        return float(sum(known)) if known else None

    return {
        "per_node": per_node,
        "tokens_per_s_1m": total("tokens_per_s_1m"),
        "tokens_per_s_15m": total("tokens_per_s_15m"),
        "completions_per_s_15m": total("completions_per_s_15m"),
    }


def stalls(
    per_node: dict[str, NodeRate], now: float, stall_after_s: float, live: set[str] | None = None
) -> dict[str, Any]:
    """Which nodes (and whether the whole run) have had no new completions for stall_after_s.

    Args:
        per_node: from run_rates.
        live: nodes currently answering polls; a node that is down is reported as down
            elsewhere and is left out here (its shards cannot be seen growing).

    Returns:
        ``{"run": since_unix or None, "nodes": {name: since_unix}}``. ``since`` is the last
        time the node's shards grew (or when we first saw them, if they never did).
    """
    names = [n for n in per_node if live is None or n in live]
    since = {n: per_node[n].last_growth_unix or per_node[n].first_seen_unix for n in names}
    stalled = {n: s for n, s in since.items() if s is not None and now - s >= stall_after_s}
    run = None
    if names and len(stalled) == len(names):
        run = max(stalled.values())
    return {"run": run, "nodes": stalled}


def minute_rates(buckets: list[PollBucket], bucket_s: float = 60.0) -> list[float]:
    """Tokens/s of each complete, non-backfill bucket (polls_by_bucket rows; the last one is
    still filling and is dropped)."""
    return [b["tokens"] / bucket_s for b in buckets[:-1] if not b["backfill"] and b["tokens"] is not None]


def rate_drop(current_tps: float | None, minute_tps: list[float]) -> float | None:
    """The last hour's median per-minute rate when `current_tps` is below half of it, else None."""
    if current_tps is None or len(minute_tps) < MIN_MINUTES_FOR_MEDIAN:
        return None
    median = statistics.median(minute_tps)
    return median if median > 0 and current_tps < DROP_FRACTION * median else None


# -- Node states, stalls and alerts (from the store) ------------------------------------
# Moved here from runhealth/alerts.py (#14).
DOWN_AFTER_STALE = 5  # a node is "down" once it has failed for 5 x stale_after
GPU_HOT_C = 85  # GPU core temperature that counts as "hot" (NVIDIA datacenter parts slow down near 90)
# Throttle reasons that mean lost speed; gpu_idle, sync_boost and the clock settings are benign.
HARMFUL_THROTTLE = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown")


def fmt_age(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "N/A"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


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
        return "up", f"last poll {fmt_age(age)} ago"
    why = f": {err}" if failing and err else ""
    state = "down" if age > DOWN_AFTER_STALE * stale_after else "stale"
    return state, f"{state} for {fmt_age(age)}{why}"


def stalled_nodes(store: Store, now: float, window: float) -> dict[str, float]:
    """Nodes polled throughout the last stall window that added no completion in it.

    Returns {node: seconds since its last new completion (or since the window's first poll)}.
    Only the last two windows of polls are read, so this stays cheap on a week-long run.
    """
    rows = store.query(  # the stall rule's own read: its SQL stays with the rule
        "SELECT node, MIN(ts_unix) AS first, MAX(CASE WHEN completions > 0 THEN ts_unix END) AS last_new"
        " FROM polls WHERE ts_unix >= ? GROUP BY node",
        (now - 2 * window,),
    )
    out = {}
    for r in rows:
        last = r["last_new"] if r["last_new"] is not None else r["first"]
        if r["first"] <= now - window and last <= now - window:
            out[r["node"]] = now - last
    return out


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


def evaluate(store: Store, now: float | None = None) -> list[Alert]:
    """Every alert that holds at `now`, from the store and the run settings the collector saved."""
    now = time.time() if now is None else now
    meta = store.meta("run") or {}
    run = str(meta.get("name") or "run")
    interval_s = float(meta.get("interval_s") or 10.0)
    stale_after = stale_after_s(interval_s, meta.get("stale_after_s"))
    out: list[Alert] = []
    last = store.last_collection_unix()
    if last is not None and now - last > stale_after:
        out.append(
            Alert(
                "collection_stale",
                "critical",
                run,
                f"No successful collection for {fmt_age(now - last)}.",
                value=now - last,
            )
        )
    out += _node_alerts(store, run, now, stale_after, stall_after_s(interval_s, meta.get("stall_after_s")))
    out += _truncation_alerts(store, meta, run)
    out += _gpu_alerts(store, run)
    return out


def _node_alerts(store: Store, run: str, now: float, stale_after: float, stall_s: float) -> list[Alert]:
    out = []
    up = set()
    for n in store.nodes():
        state, why = node_status(n, now, stale_after)
        age = now - n["last_ok_unix"] if n["last_ok_unix"] else None
        if n.get("store_error"):  # set by the store when this node's poll could not be written (#12)
            out.append(
                Alert(
                    "store_write_failure",
                    "critical",
                    run,
                    f"{n['name']}: its poll could not be written to the history store: {n['store_error']}",
                    node=n["name"],
                )
            )
        if state == "up":
            up.add(n["name"])
        elif state in ("down", "stale"):
            out.append(
                Alert(
                    f"node_{state}",
                    "critical" if state == "down" else "warning",
                    run,
                    f"{n['name']} {why}",
                    node=n["name"],
                    value=age,
                )
            )
    for node, quiet in sorted(stalled_nodes(store, now, stall_s).items()):
        if node in up:
            out.append(
                Alert(
                    "node_stalled",
                    "warning",
                    run,
                    f"{node}: no new completion for {fmt_age(quiet)} while reachable.",
                    node=node,
                    value=quiet,
                )
            )
    return out


def _truncation_alerts(store: Store, meta: dict, run: str) -> list[Alert]:
    threshold = meta.get("truncation_alert_fraction")
    if threshold is None:
        return []
    summary = run_summary(store, meta.get("max_output_tokens"))
    frac = summary.at_ceiling_fraction
    if not summary.completions or not summary.ceiling_tokens or frac < threshold:
        return []
    return [
        Alert(
            "truncation_high",
            "critical",
            run,
            f"{frac:.1%} of completions stop at the {summary.ceiling_tokens:,}-token ceiling"
            f" (alert at {threshold:.1%}; n={summary.length_count:,}).",
            value=frac,
        )
    ]


def _gpu_alerts(store: Store, run: str) -> list[Alert]:
    out = []
    for g in store.gpu_latest():
        harmful = [r for r in g["throttle_reasons"] if r in HARMFUL_THROTTLE]
        if harmful:
            out.append(
                Alert(
                    "gpu_throttled",
                    "warning",
                    run,
                    f"{g['node']}/GPU {g['gpu']} throttled: {', '.join(harmful)}.",
                    node=g["node"],
                    gpu=g["gpu"],
                    value=1.0,
                )
            )
        if g["temp_c"] is not None and g["temp_c"] >= GPU_HOT_C:
            out.append(
                Alert(
                    "gpu_hot",
                    "warning",
                    run,
                    f"{g['node']}/GPU {g['gpu']} at {g['temp_c']:.0f} °C (hot from {GPU_HOT_C:.0f} °C).",
                    node=g["node"],
                    gpu=g["gpu"],
                    value=float(g["temp_c"]),
                )
            )
    return out


def run_summary(store: Store, ceiling: int | None) -> stats.Summary:
    """The run's length summary, exactly as the Overview computes it."""
    rows = store.length_counts(by="run")
    hist = stats.LengthHist.from_rows((r["tokens"], r["finish_reason"], r["estimated"], r["count"]) for r in rows)
    malformed = sum(n["malformed"] for n in store.nodes())
    return stats.summarize(hist, ceiling=ceiling, unparseable=malformed)


# -- GPUs and hosts, in words -------------------------------------------------------------
HOT_C = GPU_HOT_C  # one threshold for the GPU page's sentence and the gpu_hot alert
IDLE_PCT = 10
HW_THROTTLE = HARMFUL_THROTTLE  # one list for the GPU page's sentence and the gpu_throttled alert
RAM_USED_WARN = 0.92
SWAP_USED_WARN = 0.10
LOAD_PER_CPU_WARN = 1.5
XID_MEANING = {
    13: "graphics engine exception",
    31: "memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    61: "internal micro-controller error",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remap",
    64: "ECC page retirement / row remap failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}


def _group(level: str, what: str, labels: list[str]) -> list[tuple[str, str]]:
    if not labels:
        return []
    shown = ", ".join(labels[:8]) + (f" and {len(labels) - 8} more" if len(labels) > 8 else "")
    return [(level, f"{what}: {shown}")]


def gpu_problems(
    gpus: list[dict[str, Any]],
    health: dict[tuple[str, int], GpuHealth],
    xids: list[GpuEventRow],
    run_writing: bool,
) -> list[tuple[str, str]]:
    """GPU problems as sentences, one per kind, most serious first: [(level, text)].

    Args:
        gpus: latest rows (node, gpu, label, util_pct, temp_c, throttle_reasons, error).
        health: (node, gpu) -> the agent's health dict (keys absent where unsupported).
        xids: XID events (node, gpu, xid, ts_unix) in the window the caller chose.
        run_writing: the run produced tokens in the last minute (idle GPUs matter then).
    """
    out = _group("error", "GPU errors", [f"{g['label']} ({g['error']})" for g in gpus if g.get("error")])
    for e in xids:
        meaning = XID_MEANING.get(e["xid"], "see NVIDIA's XID catalogue")
        out.append(("error", f"XID {e['xid']} on {e['node']}/{e['gpu']} ({meaning})"))
    h = {k: v for k, v in health.items() if v}
    out += _group(
        "error",
        "Uncorrected ECC errors since the driver loaded",
        [
            f"{n}/{i} ({v['ecc_uncorrected_volatile']})"
            for (n, i), v in h.items()
            if (v.get("ecc_uncorrected_volatile") or 0) > 0
        ],
    )
    out += _group(
        "error",
        "Row remapping failed (the GPU needs service)",
        [f"{n}/{i}" for (n, i), v in h.items() if v.get("row_remap_failure")],
    )
    out += _group(
        "warning",
        "Memory rows waiting to be remapped or retired (takes effect at the next GPU reset)",
        [f"{n}/{i}" for (n, i), v in h.items() if v.get("remapped_rows_pending") or v.get("retired_pages_pending")],
    )
    ok = [g for g in gpus if not g.get("error")]
    out += _group(
        "warning",
        "Throttled by hardware (slower clocks)",
        [
            f"{g['label']} ({', '.join(r for r in g['throttle_reasons'] if r in HW_THROTTLE)})"
            for g in ok
            if any(r in HW_THROTTLE for r in g.get("throttle_reasons") or [])
        ],
    )
    out += _group(
        "warning",
        f"Hot (≥ {HOT_C} °C)",
        [f"{g['label']} ({g['temp_c']:.0f} °C)" for g in ok if g.get("temp_c") is not None and g["temp_c"] >= HOT_C],
    )
    if run_writing:
        out += _group(
            "warning",
            f"Idle while the run writes (< {IDLE_PCT}% util)",
            [
                f"{g['label']} ({g['util_pct']:.0f}%)"
                for g in ok
                if g.get("util_pct") is not None and g["util_pct"] < IDLE_PCT
            ],
        )
    out += _group(
        "info",
        "At the power cap (sw_power_cap: normal under full load)",
        [g["label"] for g in ok if "sw_power_cap" in (g.get("throttle_reasons") or [])],
    )
    out += _group(
        "info",
        "PCIe replays since the driver loaded",
        [f"{n}/{i} ({v['pcie_replay']:,})" for (n, i), v in h.items() if (v.get("pcie_replay") or 0) > 0],
    )
    return out


def missing_gpus(seen: dict[str, set[int]], now_gpus: dict[str, set[int]], live: set[str]) -> list[tuple[str, str]]:
    """GPUs that reported within the last hour but are absent from a live node's latest poll."""
    out = []
    for node in sorted(live):
        gone = sorted(seen.get(node, set()) - now_gpus.get(node, set()))
        if gone:
            out.append(
                (
                    "error",
                    f"{node}: GPU {', '.join(map(str, gone))} missing from the latest poll "
                    f"({len(now_gpus.get(node, set()))} of {len(seen[node] | now_gpus.get(node, set()))} reporting)",
                )
            )
    return out


def host_problems(hosts: dict[str, HostReading], loadavg: dict[str, list[float] | None]) -> list[tuple[str, str]]:
    """RAM nearly full, swap in use, CPU load above the cores: [(level, text)] per node."""
    out = []
    for node, h in sorted(hosts.items()):
        total, avail = h.get("mem_total_bytes"), h.get("mem_available_bytes")
        if total and avail is not None and 1 - avail / total >= RAM_USED_WARN:
            out.append(("warning", f"{node}: RAM {1 - avail / total:.0%} used ({avail / 2**30:.1f} GiB available)"))
        swap, free = h.get("swap_total_bytes"), h.get("swap_free_bytes")
        if swap and free is not None and 1 - free / swap >= SWAP_USED_WARN:
            out.append(("warning", f"{node}: swap {1 - free / swap:.0%} used (the host is short of memory)"))
        loads, cpus = loadavg.get(node) or [], h.get("cpus")
        load = loads[0] if loads else None
        if load is not None and cpus and load / cpus >= LOAD_PER_CPU_WARN:
            out.append(("warning", f"{node}: CPU load {load:.1f} on {cpus} CPUs"))
    return out


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
