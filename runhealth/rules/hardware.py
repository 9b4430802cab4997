"""GPUs and hosts in words: the one rule that classifies a GPU's state, and the problem lists.

`gpu_findings` is the one classification of a GPU reading (error / throttled / hot / idle while
the run writes / at the power cap): the GPUs page's state column and its "need a look" line, the
Overview's problem list, its heat strip's "throttled" mark and the gpu_throttled / gpu_hot
alerts (runhealth.rules.health.evaluate) all read it, so one GPU is never information on one screen
and a warning on another. `sw_power_cap` is information: a GPU at its power cap under full load
is doing its job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from runhealth.node.wire import GpuHealth
from runhealth.records import GpuEventRow, HostReading

HOT_C = 85  # GPU core temperature that counts as "hot" (NVIDIA datacenter parts slow down near 90)
IDLE_PCT = 10
# Throttle reasons that mean lost speed; gpu_idle, sync_boost and the clock settings are benign,
# sw_power_cap is information (normal under full load).
HW_THROTTLE = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown")
POWER_CAP = "sw_power_cap"
RAM_USED_WARN = 0.92
SWAP_USED_WARN = 0.10
LOAD_PER_CPU_WARN = 1.5
GpuLevel = Literal["error", "warning", "info"]
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


@dataclasses.dataclass(frozen=True)
class GpuFinding:
    """One thing to say about one GPU: its level, what kind, and the words (without the GPU's name)."""

    level: GpuLevel
    kind: Literal["error", "throttled", "hot", "idle", "power_cap"]
    text: str
    detail: str = ""  # the short form a grouped list puts in brackets after the GPU


def _number(value: Any) -> float | None:
    """A reading, or None when missing (pandas turns a missing reading into NaN)."""
    return None if value is None or value != value else float(value)


def gpu_findings(g: Mapping[str, Any], run_writing: bool) -> list[GpuFinding]:
    """The one rule for a GPU's latest reading (a gpu_latest row), most serious first.

    Args:
        g: needs error, util_pct, temp_c, throttle_reasons (missing keys: not reported).
        run_writing: the run produced tokens in the last minute (an idle GPU matters then).
    """
    error = g.get("error")
    if isinstance(error, str) and error:
        return [GpuFinding("error", "error", f"error: {error}", error)]
    reasons = list(g.get("throttle_reasons") or [])
    out = []
    harmful = [r for r in reasons if r in HW_THROTTLE]
    if harmful:
        out.append(GpuFinding("warning", "throttled", f"throttled: {', '.join(harmful)}", ", ".join(harmful)))
    temp, util = _number(g.get("temp_c")), _number(g.get("util_pct"))
    if temp is not None and temp >= HOT_C:
        out.append(GpuFinding("warning", "hot", f"at {temp:.0f} °C (hot from {HOT_C:.0f} °C)", f"{temp:.0f} °C"))
    if run_writing and util is not None and util < IDLE_PCT:
        out.append(GpuFinding("warning", "idle", f"idle while the run writes ({util:.0f}% util)", f"{util:.0f}%"))
    if POWER_CAP in reasons:
        out.append(GpuFinding("info", "power_cap", "at the power cap (normal under full load)"))
    return out


def gpu_state(g: Mapping[str, Any], run_writing: bool) -> str:
    """The GPUs table's state cell: "ok", the information, or "⚠ " and what needs a look."""
    found = gpu_findings(g, run_writing)
    if not found:
        return "ok"
    words = "; ".join(f.text for f in found)
    return f"⚠ {words}" if any(f.level != "info" for f in found) else words


def name_list(names: Sequence[str], shown: int = 8) -> str:
    """The names joined with commas, at most `shown` of them, then "and N more"."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _group(level: str, what: str, labels: list[str]) -> list[tuple[str, str]]:
    return [(level, f"{what}: {name_list(labels)}")] if labels else []


def telemetry_errors(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """One sentence per distinct GPU telemetry error, naming the nodes that have it: a fleet
    whose nodes all lack the NVIDIA driver reads one line, not one per node."""
    by_error: dict[tuple[str, str], list[str]] = {}
    for n in nodes:
        if n.get("gpu_error"):
            key = (n.get("gpu_source") or "no source", n["gpu_error"])
            by_error.setdefault(key, []).append(n["name"])
    out = []
    for (source, error), names in by_error.items():
        where = names[0] if len(names) == 1 else f"{len(names)} nodes ({name_list(names)})"
        out.append(f"{where}: GPU telemetry error ({source}): {error}")
    return out


def _by_kind(gpus: Sequence[Mapping[str, Any]], run_writing: bool, kind: str) -> list[str]:
    """Labels of the GPUs with a finding of `kind`, with its detail in brackets."""
    out = []
    for g in gpus:
        for f in gpu_findings(g, run_writing):
            if f.kind == kind:
                out.append(f"{g['label']} ({f.detail})" if f.detail else g["label"])
    return out


def gpu_notes(
    gpus: list[dict[str, Any]], health: dict[tuple[str, int], GpuHealth], run_writing: bool
) -> list[tuple[str, str]]:
    """What is worth knowing about the GPUs but is no problem: [("info", text)], one per kind
    (at the power cap, PCIe replays). Everything worse is an alert (runhealth.rules.health.evaluate:
    gpu_error, gpu_xid, gpu_ecc_uncorrected, gpu_row_remap_failed, gpu_missing, gpu_throttled,
    gpu_hot, gpu_idle, gpu_rows_pending), so it is worded once, there."""
    out = _group(
        "info", "At the power cap (sw_power_cap: normal under full load)", _by_kind(gpus, run_writing, "power_cap")
    )
    h = {k: v for k, v in health.items() if v}
    replays = [f"{n}/{i} ({v['pcie_replay']:,})" for (n, i), v in h.items() if (v.get("pcie_replay") or 0) > 0]
    out += _group("info", "PCIe replays since the driver loaded", replays)
    return out


def missing_gpus(seen: dict[str, set[int]], now_gpus: dict[str, set[int]], live: set[str]) -> list[tuple[str, str]]:
    """GPUs that reported within the last hour but are absent from a live node's latest poll."""
    return [("error", text) for _node, _gone, text in missing_gpu_findings(seen, now_gpus, live)]


def missing_gpu_findings(
    seen: dict[str, set[int]], now_gpus: dict[str, set[int]], live: set[str]
) -> list[tuple[str, list[int], str]]:
    """(node, missing GPU indexes, sentence) per live node with a GPU that reported within the
    window but not in the latest poll (a GPU fallen off the bus)."""
    out = []
    for node in sorted(live):
        gone = sorted(seen.get(node, set()) - now_gpus.get(node, set()))
        if gone:
            reporting, expected = len(now_gpus.get(node, set())), len(seen[node] | now_gpus.get(node, set()))
            text = f"{node}: GPU {', '.join(map(str, gone))} missing from the latest poll ({reporting} of {expected} reporting)"
            out.append((node, gone, text))
    return out


@dataclasses.dataclass(frozen=True)
class HealthFinding:
    """A GPU's health counters in words: uncorrected ECC, failed or pending row remaps."""

    node: str
    gpu: int
    level: GpuLevel
    kind: Literal["ecc_uncorrected", "row_remap_failed", "rows_pending"]
    text: str
    value: float = 1.0


def health_findings(health: dict[tuple[str, int], GpuHealth]) -> list[HealthFinding]:
    """The health counters that need a look, per GPU, most serious first (the alerts' source)."""
    out = []
    for (node, gpu), v in sorted(health.items()):
        if not v:
            continue
        ecc = v.get("ecc_uncorrected_volatile") or 0
        if ecc > 0:
            text = f"{node}/GPU {gpu}: {ecc:,} uncorrected ECC error{'s' if ecc != 1 else ''} since the driver loaded"
            out.append(HealthFinding(node, gpu, "error", "ecc_uncorrected", text, float(ecc)))
        if v.get("row_remap_failure"):
            text = f"{node}/GPU {gpu}: row remapping failed (the GPU needs service)"
            out.append(HealthFinding(node, gpu, "error", "row_remap_failed", text))
        if v.get("remapped_rows_pending") or v.get("retired_pages_pending"):
            text = (
                f"{node}/GPU {gpu}: memory rows waiting to be remapped or retired (takes effect at the next GPU reset)"
            )
            out.append(HealthFinding(node, gpu, "warning", "rows_pending", text))
    return sorted(out, key=lambda f: f.level != "error")


def xid_findings(xids: Sequence[GpuEventRow]) -> list[tuple[str, int, int, str]]:
    """(node, gpu, latest XID, sentence) per GPU that reported critical XID events in the window."""
    by_gpu: dict[tuple[str, int], list[GpuEventRow]] = {}
    for e in xids:
        by_gpu.setdefault((e["node"], e["gpu"]), []).append(e)
    out = []
    for (node, gpu), events in sorted(by_gpu.items()):
        seen: dict[int, None] = {}
        for e in events:
            seen.setdefault(e["xid"], None)
        words = ", ".join(f"XID {x} ({XID_MEANING.get(x, 'see NVIDIA XID catalogue')})" for x in seen)
        out.append((node, gpu, events[-1]["xid"], f"{node}/GPU {gpu}: {words}"))
    return out


def host_findings(
    hosts: dict[str, HostReading], loadavg: dict[str, list[float] | None]
) -> list[tuple[str, Literal["host_memory", "host_swap", "host_load"], str, float]]:
    """(node, kind, sentence, value) per host reading that needs a look: RAM nearly full, swap in
    use, CPU load above the cores."""
    out: list[tuple[str, Literal["host_memory", "host_swap", "host_load"], str, float]] = []
    for node, h in sorted(hosts.items()):
        total, avail = h.get("mem_total_bytes"), h.get("mem_available_bytes")
        if total and avail is not None and 1 - avail / total >= RAM_USED_WARN:
            used = 1 - avail / total
            out.append((node, "host_memory", f"{node}: RAM {used:.0%} used ({avail / 2**30:.1f} GiB available)", used))
        swap, free = h.get("swap_total_bytes"), h.get("swap_free_bytes")
        if swap and free is not None and 1 - free / swap >= SWAP_USED_WARN:
            used = 1 - free / swap
            out.append((node, "host_swap", f"{node}: swap {used:.0%} used (the host is short of memory)", used))
        loads, cpus = loadavg.get(node) or [], h.get("cpus")
        load = loads[0] if loads else None
        if load is not None and cpus and load / cpus >= LOAD_PER_CPU_WARN:
            out.append((node, "host_load", f"{node}: CPU load {load:.1f} on {cpus} CPUs", float(load)))
    return out


def host_problems(hosts: dict[str, HostReading], loadavg: dict[str, list[float] | None]) -> list[tuple[str, str]]:
    """RAM nearly full, swap in use, CPU load above the cores: [(level, text)] per node."""
    return [("warning", text) for _node, _kind, text, _value in host_findings(hosts, loadavg)]
