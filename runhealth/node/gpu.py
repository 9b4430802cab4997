"""runhealth node agent, GPU telemetry: NVML through pynvml, else nvidia-smi, or demo readings.

Part of the node agent (runhealth/node/, shipped together with agent.py): it runs on the GPU
node, imports only the standard library (pynvml is the node's own, or the dashboard's copy that
the bootstrap handed over in ``__modules__``, registered only when the node has none), keeps
Python 3.8-compatible syntax and is read-only there: its only subprocess is `nvidia-smi` from an
argv list. A thin NVML layer: every call goes through the choke point _nv() (unsupported or
missing -> None), one small getter per metric; a GPU that errors becomes an error entry.
read_gpus() is the entry point; the NVML state (module, init error, missing functions) is
module-level here, once per process.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
import types
from typing import Any


class _Nvml:
    """NVML state of this process: the initialised pynvml module, why not, functions it lacks,
    and the XID event set (kept open between polls so no event is lost in between)."""

    def __init__(self):
        self.module: Any = None  # the pynvml module once initialised
        self.error = None
        self.missing = []  # NVML functions this driver lacks, noted once each
        self.events = None  # nvmlEventSet_t, or False once it cannot be had


NVML = _Nvml()


# ---------------------------------------------------------------------------- GPUs: NVML
_THROTTLE_NAMES = (  # nvmlClocksThrottleReason<X> bit -> name shown on screen
    ("GpuIdle", 0x1, "gpu_idle"),
    ("ApplicationsClocksSetting", 0x2, "applications_clocks"),
    ("SwPowerCap", 0x4, "sw_power_cap"),
    ("HwSlowdown", 0x8, "hw_slowdown"),
    ("SyncBoost", 0x10, "sync_boost"),
    ("SwThermalSlowdown", 0x20, "sw_thermal_slowdown"),
    ("HwThermalSlowdown", 0x40, "hw_thermal_slowdown"),
    ("HwPowerBrakeSlowdown", 0x80, "hw_power_brake_slowdown"),
    ("DisplayClockSetting", 0x100, "display_clock_setting"),
)


def _import_pynvml():
    """The node's pynvml, else the copy the dashboard shipped in __modules__ (registered lazily).

    agent.py gives this module the bootstrap's ``__modules__`` when it registers it.
    """
    try:
        import pynvml  # no stubs; the node may have none at all

        return pynvml
    except ImportError:
        source = globals().get("__modules__", {}).get("pynvml")
        if not source:
            raise
    mod = types.ModuleType("pynvml")
    sys.modules["pynvml"] = mod  # pynvml looks itself up in sys.modules while it loads
    try:
        exec(compile(source, "pynvml.py", "exec"), mod.__dict__)
    except BaseException:
        del sys.modules["pynvml"]
        raise
    return mod


def _nvml():
    """Initialised pynvml module or None (nvmlInit is tried once per process)."""
    if NVML.module is None and NVML.error is None:
        try:
            mod = _import_pynvml()
            mod.nvmlInit()
            NVML.module = mod
        except Exception as exc:
            NVML.error = "NVML: %s: %s" % (type(exc).__name__, exc)
    return NVML.module


def _nv(name, *args):
    """The one choke point for NVML calls: unsupported or missing -> None, others raise."""
    nv = NVML.module
    fn = getattr(nv, name, None)
    if fn is None:
        return _note_missing(name)
    soft = tuple(
        c for c in (getattr(nv, "NVMLError_NotSupported", None), getattr(nv, "NVMLError_FunctionNotFound", None)) if c
    )
    try:
        return fn(*args)
    except soft as exc:
        if type(exc).__name__ == "NVMLError_FunctionNotFound":
            _note_missing(name)
        return None


def _note_missing(name):
    if name not in NVML.missing:
        NVML.missing.append(name)  # noted once; stderr stays quiet
    return None


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _util_pct(h):
    """nvidia-smi utilization.gpu [%]."""
    rates = _nv("nvmlDeviceGetUtilizationRates", h)
    return None if rates is None else rates.gpu


def _mem_mib(h):
    """nvidia-smi memory.used, memory.total [MiB] (NVML reports bytes).

    nvidia-smi leaves the driver's reserved memory out of "used"; only NVML's v2 struct does
    too (v1 counts it: 615 MiB more on an idle H200, measured). v2 where pynvml and the driver
    have it, else v1.
    """
    mem = _memory_info_v2(h)
    if mem is None:
        mem = _nv("nvmlDeviceGetMemoryInfo", h)
    return (None, None) if mem is None else (mem.used >> 20, mem.total >> 20)


def _memory_info_v2(h):
    """nvmlDeviceGetMemoryInfo(h, nvmlMemory_v2), or None where pynvml or the driver lacks it."""
    nv = NVML.module
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is None:  # pynvml older than the v2 struct
        return None
    try:
        return nv.nvmlDeviceGetMemoryInfo(h, version)
    except (TypeError, nv.NVMLError):  # no version argument, or a driver without _v2
        return None


def _power_w(h):
    """nvidia-smi power.draw [W] (NVML reports mW)."""
    mw = _nv("nvmlDeviceGetPowerUsage", h)
    return None if mw is None else mw / 1000.0


def _energy_mj(h):
    """NVML's total energy since the driver was last loaded [mJ] (Volta and newer; None where
    NOT_SUPPORTED). nvidia-smi has no --query-gpu field for it: the dashboard integrates
    power.draw over time where this is None, and says so (runhealth/store/energymeter.py)."""
    mj = _nv("nvmlDeviceGetTotalEnergyConsumption", h)
    return None if mj is None else int(mj)


def _power_limit_w(h):
    """nvidia-smi enforced.power.limit [W] (NVML reports mW)."""
    mw = _nv("nvmlDeviceGetEnforcedPowerLimit", h)
    return None if mw is None else mw / 1000.0


def _temp_c(h):
    """nvidia-smi temperature.gpu [C]."""
    return _nv("nvmlDeviceGetTemperature", h, getattr(NVML.module, "NVML_TEMPERATURE_GPU", 0))


def _sm_clock_mhz(h):
    """nvidia-smi clocks.sm [MHz]."""
    return _nv("nvmlDeviceGetClockInfo", h, getattr(NVML.module, "NVML_CLOCK_SM", 1))


def _throttle_reasons(h):
    """nvidia-smi clocks_event_reasons.active (bitmask) as names; newer drivers say "event"."""
    mask = _nv("nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:
        mask = _nv("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    if mask is None:
        return None
    bits = ((getattr(NVML.module, "nvmlClocksThrottleReason" + c, v), n) for c, v, n in _THROTTLE_NAMES)
    return [name for bit, name in bits if mask & bit]


def _processes(h):
    """nvidia-smi --query-compute-apps=pid,used_memory [MiB]; the name comes from /proc."""
    procs = _nv("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is None:
        return None
    return [
        {
            "pid": p.pid,
            "name": _proc_name(p.pid),
            "mem_used_mib": None if p.usedGpuMemory is None else p.usedGpuMemory >> 20,
        }
        for p in procs
    ]


def _proc_name(pid):
    try:
        with open("/proc/%d/comm" % pid, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None  # another PID namespace (containers): NVML sees it, /proc does not


def _ecc_uncorrected(h, counter):
    """nvidia-smi ecc.errors.uncorrected.{volatile,aggregate}.total; counter is
    NVML_VOLATILE_ECC (since the driver loaded) or NVML_AGGREGATE_ECC (lifetime)."""
    nv = NVML.module
    return _nv(
        "nvmlDeviceGetTotalEccErrors",
        h,
        getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        getattr(nv, counter, 0 if counter == "NVML_VOLATILE_ECC" else 1),
    )


def _retired_pages_pending(h):
    """nvidia-smi retired_pages.pending (pre-Ampere): a reset is needed to retire them."""
    state = _nv("nvmlDeviceGetRetiredPagesPendingStatus", h)
    return None if state is None else bool(state)


def _remapped_rows(h):
    """nvidia-smi remapped_rows.{pending,failure} (Ampere and later)."""
    rows = _nv("nvmlDeviceGetRemappedRows", h)
    if rows is None:
        return None, None
    _corr, _unc, pending, failure = rows
    return bool(pending), bool(failure)


def _pcie_replay(h):
    """nvidia-smi pcie.replay_counter (link-level retries; climbing = a failing link)."""
    return _nv("nvmlDeviceGetPcieReplayCounter", h)


def _health(h):
    """What predicts a GPU falling out of a long run; an unsupported reading is left out."""
    pending, failure = _remapped_rows(h)
    found = {
        "ecc_uncorrected_volatile": _ecc_uncorrected(h, "NVML_VOLATILE_ECC"),
        "ecc_uncorrected_aggregate": _ecc_uncorrected(h, "NVML_AGGREGATE_ECC"),
        "retired_pages_pending": _retired_pages_pending(h),
        "remapped_rows_pending": pending,
        "row_remap_failure": failure,
        "pcie_replay": _pcie_replay(h),
    }
    return {k: v for k, v in found.items() if v is not None}


def _xid_events(handles):
    """{gpu index: [XID, ...]} since the last poll, drained from the event set kept open.

    The set is created on the first poll (events before that are not seen); a driver
    without event support leaves it False and XIDs absent (None)."""
    nv = NVML.module
    if NVML.events is None:
        NVML.events = _nv("nvmlEventSetCreate") or False
        kind = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        for h in handles.values():
            if NVML.events and h is not None:
                _nv("nvmlDeviceRegisterEvents", h, kind, NVML.events)
    if not NVML.events:
        return None
    found: dict = {}
    timeout = getattr(nv, "NVMLError_Timeout", None)
    for _ in range(256):  # bounded: a storm of events must not stall the poll
        try:
            event = nv.nvmlEventSetWait_v2(NVML.events, 0)
        except Exception as exc:
            if timeout is None or not isinstance(exc, timeout):
                _note_missing("nvmlEventSetWait_v2")
            break
        found.setdefault(_nv("nvmlDeviceGetIndex", event.device), []).append(int(event.eventData))
    return found


def _nvml_device(i, h=None):
    """One GPU's readings; a GPU that errors (e.g. fell off the bus) becomes an error entry."""
    try:
        h = h if h is not None else NVML.module.nvmlDeviceGetHandleByIndex(i)
        used, total = _mem_mib(h)
        return {
            "index": i,
            "name": _text(_nv("nvmlDeviceGetName", h)),
            "uuid": _text(_nv("nvmlDeviceGetUUID", h)),
            "util_pct": _util_pct(h),
            "mem_used_mib": used,
            "mem_total_mib": total,
            "power_w": _power_w(h),
            "power_limit_w": _power_limit_w(h),
            "energy_mj": _energy_mj(h),
            "temp_c": _temp_c(h),
            "sm_clock_mhz": _sm_clock_mhz(h),
            "throttle_reasons": _throttle_reasons(h),
            "processes": _processes(h),
            "health": _health(h),
            "error": None,
        }
    except Exception as exc:
        return {"index": i, "error": str(exc) or type(exc).__name__}


def _handle(i):
    try:
        return NVML.module.nvmlDeviceGetHandleByIndex(i)
    except Exception:
        return None  # _nvml_device turns it into the GPU's error entry


def _nvml_devices():
    nv = _nvml()
    if nv is None:
        return None
    handles = {i: _handle(i) for i in range(nv.nvmlDeviceGetCount())}
    devices = [_nvml_device(i, h) for i, h in handles.items()]
    try:
        xids = _xid_events(handles)
    except Exception:
        xids = None  # events are a bonus: never lose the readings for them
    for d in devices:
        if xids is not None and "health" in d:
            d["health"]["xid"] = xids.get(d["index"], [])
    return devices


# ---------------------------------------------------------------------------- GPUs: other sources
SMI_FIELDS = (
    "index",
    "name",
    "uuid",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "clocks.sm",
)
SMI_ARGV = ["nvidia-smi", "--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits"]


def _smi_number(text, kind):
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None  # "[N/A]", "[Not Supported]", "[Unknown Error]"
    try:
        return kind(float(text)) if kind is int else kind(text)
    except ValueError:
        return None


def parse_smi_csv(text):
    """Devices from `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`."""
    devices = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(SMI_FIELDS):
            continue
        kinds = (int, int, int, float, float, int, int)
        num = [_smi_number(cols[3 + j], kind) for j, kind in enumerate(kinds)]
        devices.append(
            {
                "index": _smi_number(cols[0], int),
                "name": cols[1],
                "uuid": cols[2],
                "util_pct": num[0],
                "mem_used_mib": num[1],
                "mem_total_mib": num[2],
                "power_w": num[3],
                "power_limit_w": num[4],
                "energy_mj": None,  # no nvidia-smi field: the dashboard integrates power x time
                "temp_c": num[5],
                "sm_clock_mhz": num[6],
                "throttle_reasons": None,
                "processes": None,
                "error": None,
            }
        )
    return devices


def _smi_devices():
    """(devices, None) from nvidia-smi, or (None, why not)."""
    try:
        done = subprocess.run(
            SMI_ARGV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "nvidia-smi: %s" % (exc.strerror if isinstance(exc, OSError) else exc)
    if done.returncode != 0:
        return None, "nvidia-smi exit %d: %s" % (done.returncode, done.stderr.decode("utf-8", "replace").strip()[:300])
    return parse_smi_csv(done.stdout.decode("utf-8", "replace")), None


DEMO_DRIVER_LOADED_UNIX = 1.7e9  # the simulated energy counters count from here


def _demo_phases(i, seed):
    """GPU `i` of simulated node `seed`'s two phases: each node's GPUs their own curves (#41: the
    demo showed node-1's GPU numbers on node-2)."""
    return i * 0.9 + seed * 2.39, i + seed * 1.71


def _demo_energy_j(t, i, seed=0):
    """The integral of the demo's power curve (below) from the simulated driver load to t [J]."""
    p1, p2 = _demo_phases(i, seed)

    def f(x):
        return 895.0 * x - 810.0 * math.cos(x / 9.0 + p1) - 11.5 * math.cos(x / 2.3 + p2)

    return f(t) - f(DEMO_DRIVER_LOADED_UNIX)


def _demo_devices(count, t=None, seed=0):
    """Simulated B200-like readings that move smoothly with the clock `t` (default: now; the
    collector sends its own, which differs when it fills a finished demo run poll by poll); the
    energy counter is the exact integral of the power curve, as NVML's would be. `seed`: which
    simulated node (collector.poll_request's demo_seed): each node's GPUs read their own."""
    t = time.time() if t is None else float(t)
    devices = []
    for i in range(count):
        p1, p2 = _demo_phases(i, seed)
        wave = 0.5 + 0.5 * math.sin(t / 9.0 + p1)
        power_w = round(805.0 + 180.0 * wave + 5.0 * math.sin(t / 2.3 + p2), 1)  # 800-990 W
        mem_used_mib = int(174080 + 2048 * math.sin(t / 31.0 + p2))
        devices.append(
            {
                "index": i,
                "name": "NVIDIA B200",
                "uuid": "GPU-demo-%04d-0000-%04d" % (seed % 10000, i),
                "util_pct": int(90 + 9 * wave),
                "mem_used_mib": mem_used_mib,
                "mem_total_mib": 187392,
                "power_w": power_w,
                "power_limit_w": 1000.0,
                "energy_mj": int(1000 * _demo_energy_j(t, i, seed)),
                "temp_c": int(55 + 15 * wave),
                "sm_clock_mhz": int(1965 - 120 * wave),
                "throttle_reasons": ["sw_power_cap"] if power_w > 975 else [],
                "processes": [{"pid": 4200 + i, "name": "python3", "mem_used_mib": mem_used_mib - 600}],
                "error": None,
            }
        )
    return devices


def read_gpus(mode, demo_gpus=8, demo_time_unix=None, demo_seed=0):
    """GPU telemetry for the poll reply.

    Args:
        mode: "auto" (NVML through pynvml, else nvidia-smi), "demo" (simulated), "off".
        demo_gpus: how many simulated GPUs "demo" reports.
        demo_time_unix: the clock the simulated readings follow (None: now).

    Returns:
        {"source", "error", "simulated", "reason", "devices"}; source is None when there is
        no telemetry, with the cause in "error" (or in "reason" when it is switched off).
    """
    out: dict = {"source": None, "error": None, "simulated": False, "reason": None, "devices": []}
    if mode == "off":
        out["reason"] = 'GPU telemetry is off (gpu = "off")'
    elif mode == "demo":
        out.update(source="demo", simulated=True, devices=_demo_devices(int(demo_gpus), demo_time_unix, int(demo_seed)))
    elif mode != "auto":
        out["error"] = "unknown gpu mode %r (auto, demo, off)" % (mode,)
    else:
        try:
            devices = _nvml_devices()
        except Exception as exc:  # nvmlDeviceGetCount itself failed
            devices, NVML.error = None, "NVML: %s" % exc
        if devices is not None:
            out.update(source="nvml", devices=devices)
        else:
            devices, why = _smi_devices()
            if devices is not None:
                out.update(source="nvidia-smi", devices=devices)
            else:
                out["error"] = "no GPU telemetry: %s; %s" % (NVML.error, why)
    return out
