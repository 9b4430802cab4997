"""What is wrong with the run right now, computed from the store alone (no Streamlit).

One definition per term: the node states (pending / up / stale / down), the stall rule and
the alert set live here; the Overview's cards, the Prometheus exporter and the webhook
notifier all read them from this module. `evaluate()` returns the alerts that hold at one
instant; `runhealth.notify` diffs successive answers into start / resolve messages.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from runhealth.analysis import stats
from runhealth.store import Store

DOWN_AFTER_STALE = 5  # a node is "down" once it has failed for 5 x stale_after
GPU_HOT_C = 85.0  # GPU core temperature that counts as "hot" (NVIDIA datacenter parts slow down near 90)
# Throttle reasons that mean lost speed; gpu_idle, sync_boost and the clock settings are benign.
HARMFUL_THROTTLE = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown")
STALL_MIN_S = 120.0  # the default stall window is max(3 x interval_s, this): RunConfig.stall_after


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


def node_status(node: dict[str, Any], now: float, stale_after: float) -> tuple[str, str]:
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


def stall_after_s(meta: dict[str, Any]) -> float:
    """How long an up node may add no completions before it counts as stalled: the run's
    `stall_after_s` as the collector saved it (the Overview's rule, one definition), else
    the same default as `RunConfig.stall_after`."""
    if meta.get("stall_after_s"):
        return float(meta["stall_after_s"])
    return max(STALL_MIN_S, 3 * float(meta.get("interval_s") or 10.0))


def stalled_nodes(store: Store, now: float, window: float) -> dict[str, float]:
    """Nodes polled throughout the last stall window that added no completion in it.

    Returns {node: seconds since its last new completion (or since the window's first poll)}.
    Only the last two windows of polls are read, so this stays cheap on a week-long run.
    """
    rows = store._rows(  # the store has no public read of this shape; kept here, away from store.py
        "SELECT node, MIN(ts_unix) AS first, MAX(CASE WHEN completions > 0 THEN ts_unix END) AS last_new"
        " FROM polls WHERE ts_unix >= ? GROUP BY node", (now - 2 * window,))
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
    interval = float(meta.get("interval_s") or 10.0)
    stale_after = float(meta.get("stale_after_s") or max(3 * interval, 30.0))
    out: list[Alert] = []
    last = store.last_collection_unix()
    if last is not None and now - last > stale_after:
        out.append(Alert("collection_stale", "critical", run,
                         f"No successful collection for {fmt_age(now - last)}.", value=now - last))
    out += _node_alerts(store, run, now, stale_after, stall_after_s(meta))
    out += _truncation_alerts(store, meta, run)
    out += _gpu_alerts(store, run)
    return out


def _node_alerts(store: Store, run: str, now: float, stale_after: float, stall_s: float) -> list[Alert]:
    out = []
    up = set()
    for n in store.nodes():
        state, why = node_status(n, now, stale_after)
        age = now - n["last_ok_unix"] if n.get("last_ok_unix") else None
        if n.get("store_error"):  # set by the store when this node's poll could not be written (#12)
            out.append(Alert("store_write_failure", "critical", run,
                             f"{n['name']}: its poll could not be written to the history store: {n['store_error']}",
                             node=n["name"]))
        if state == "up":
            up.add(n["name"])
        elif state in ("down", "stale"):
            out.append(Alert(f"node_{state}", "critical" if state == "down" else "warning", run,
                             f"{n['name']} {why}", node=n["name"], value=age))
    for node, quiet in sorted(stalled_nodes(store, now, stall_s).items()):
        if node in up:
            out.append(Alert("node_stalled", "warning", run,
                             f"{node}: no new completion for {fmt_age(quiet)} while reachable.",
                             node=node, value=quiet))
    return out


def _truncation_alerts(store: Store, meta: dict, run: str) -> list[Alert]:
    threshold = meta.get("truncation_alert_fraction")
    if threshold is None:
        return []
    summary = run_summary(store, meta.get("max_output_tokens"))
    frac = summary["at_ceiling_fraction"]
    if not summary["completions"] or not summary["ceiling"] or frac < threshold:
        return []
    return [Alert("truncation_high", "critical", run,
                  f"{frac:.1%} of completions stop at the {summary['ceiling']:,}-token ceiling"
                  f" (alert at {threshold:.1%}; n={summary['length_count']:,}).", value=frac)]


def _gpu_alerts(store: Store, run: str) -> list[Alert]:
    out = []
    for g in store.gpu_latest():
        harmful = [r for r in g["throttle_reasons"] if r in HARMFUL_THROTTLE]
        if harmful:
            out.append(Alert("gpu_throttled", "warning", run,
                             f"{g['node']}/GPU {g['gpu']} throttled: {', '.join(harmful)}.",
                             node=g["node"], gpu=g["gpu"], value=1.0))
        if g.get("temp_c") is not None and g["temp_c"] >= GPU_HOT_C:
            out.append(Alert("gpu_hot", "warning", run,
                             f"{g['node']}/GPU {g['gpu']} at {g['temp_c']:.0f} °C (hot from {GPU_HOT_C:.0f} °C).",
                             node=g["node"], gpu=g["gpu"], value=float(g["temp_c"])))
    return out


def run_summary(store: Store, ceiling: int | None) -> dict[str, Any]:
    """The run's length summary, exactly as the Overview computes it."""
    rows = store.length_counts(by="run")
    hist = stats.LengthHist.from_rows((r["tokens"], r["finish_reason"], r["estimated"], r["count"]) for r in rows)
    malformed = sum(n["malformed"] for n in store.nodes())
    return stats.summarize(hist, ceiling=ceiling, unparseable=malformed)
