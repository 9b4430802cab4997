"""Stand-in for nvidia-ml-py's pynvml module, for tests on machines without a GPU.

It keeps pynvml's real function names, constants and error classes (NVMLError.__new__ maps an
error code to a generated subclass such as NVMLError_NotSupported, exactly as pynvml's
_extractNVMLErrorsAsClasses does), so the agent's NVML layer runs unchanged against it.
It reproduces the behaviours documented in pynvml.py, not a driver; the layer itself was run
against a real H200 (driver 580.159, nvidia-ml-py's pynvml) with scripts/gpu_check.py on
2026-12-04, which found that v1 memory info counts the driver's reserved memory (now mirrored
here as "mem_reserved").

Tests set the scenario with `configure(gpus, missing=())` (`set_reading(gpu, field, value)`
changes one reading between polls: an energy counter that grows, or resets when the driver
reloads): each GPU is a dict of readings; a
reading equal to NOT_SUPPORTED or LOST raises that NVML error, `"lost": True` makes the handle
lookup fail, and names in `missing` raise NVMLError_FunctionNotFound (an old driver).
`raise_xid(gpu, xid)` queues a critical XID event, delivered by nvmlEventSetWait_v2 to the
event sets the GPU is registered with (NVMLError_Timeout once none is left).
Stdlib only: the bootstrap test ships this file as the node's pynvml source.
"""

import string
import sys

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
nvmlEventTypeXidCriticalError = 0x0000000000000008

nvmlClocksThrottleReasonGpuIdle = 0x0000000000000001
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksThrottleReasonSwPowerCap = 0x0000000000000004
nvmlClocksThrottleReasonHwSlowdown = 0x0000000000000008
nvmlClocksThrottleReasonSyncBoost = 0x0000000000000010
nvmlClocksThrottleReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksThrottleReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksThrottleReasonDisplayClockSetting = 0x0000000000000100
nvmlClocksEventReasonSwPowerCap = nvmlClocksThrottleReasonSwPowerCap
nvmlMemory_v2 = 0x02000028


class NVMLError(Exception):
    _valClassMapping = dict()
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


def _extractNVMLErrorsAsClasses():
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)

            return new

        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()

# ---------------------------------------------------------------------------- scenario
NOT_SUPPORTED = "<not supported>"
LOST = "<gpu lost>"
H200 = {
    "name": "NVIDIA H200",
    "util": 97,
    "mem_used": 120000 << 20,  # as nvidia-smi's memory.used shows it
    "mem_reserved": 615 << 20,  # the driver's own, in v1's used only (an idle H200 read 615 MiB)
    "mem_total": 143771 << 20,
    "power_mw": 650210,
    "limit_mw": 700000,
    "energy_mj": 8_123_456_789,  # since the driver loaded (about 3.5 h at 650 W)
    "temp": 61,
    "sm_mhz": 1980,
    "reasons": nvmlClocksThrottleReasonSwPowerCap,
    "procs": [(4321, 119000 << 20)],
    "ecc_volatile": 0,
    "ecc_aggregate": 0,
    "retired_pending": NOT_SUPPORTED,
    "remapped": (0, 0, 0, 0),
    "pcie_replay": 0,
}
_gpus = [dict(H200, uuid="GPU-aaaa"), dict(H200, uuid="GPU-bbbb", util=12)]
_missing = set()
init_calls = 0


_event_sets = []  # each: {"gpus": set of indexes registered, "queue": [(index, xid)]}


def configure(gpus, missing=()):
    global _gpus, _missing, init_calls, _event_sets
    _gpus, _missing, init_calls, _event_sets = [dict(g) for g in gpus], set(missing), 0, []


def set_reading(index, field, value):
    _gpus[index][field] = value


def raise_xid(index, xid):
    for es in _event_sets:
        if index in es["gpus"]:
            es["queue"].append((index, xid))


class _Struct:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class c_nvmlDevice_t:
    def __init__(self, index):
        self.index = index


def _read(name, handle, field):
    if name in _missing:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    value = _gpus[handle.index][field]
    if value == NOT_SUPPORTED:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if value == LOST:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return value


# ---------------------------------------------------------------------------- pynvml's API
def nvmlInit():
    global init_calls
    init_calls += 1


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_gpus)


def nvmlDeviceGetHandleByIndex(index):
    if _gpus[index].get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return c_nvmlDevice_t(index)


def nvmlDeviceGetName(handle):
    return _read("nvmlDeviceGetName", handle, "name")


def nvmlDeviceGetUUID(handle):
    return _read("nvmlDeviceGetUUID", handle, "uuid")


def nvmlDeviceGetUtilizationRates(handle):
    return _Struct(gpu=_read("nvmlDeviceGetUtilizationRates", handle, "util"), memory=0)


def nvmlDeviceGetMemoryInfo(handle, version=None):
    """As the driver answers: v1's used includes the driver's reserved memory, v2's does not."""
    if not version:
        used = _read("nvmlDeviceGetMemoryInfo", handle, "mem_used")
        total = _read("nvmlDeviceGetMemoryInfo", handle, "mem_total")
        reserved = _gpus[handle.index].get("mem_reserved", 0)
        return _Struct(total=total, used=used + reserved, free=total - used - reserved)
    used = _read("nvmlDeviceGetMemoryInfo_v2", handle, "mem_used")
    total = _read("nvmlDeviceGetMemoryInfo_v2", handle, "mem_total")
    reserved = _gpus[handle.index].get("mem_reserved", 0)
    return _Struct(version=version, total=total, reserved=reserved, used=used, free=total - used - reserved)


def nvmlDeviceGetPowerUsage(handle):
    return _read("nvmlDeviceGetPowerUsage", handle, "power_mw")


def nvmlDeviceGetTotalEnergyConsumption(handle):
    """mJ since the driver was last reloaded (Volta and newer, else NVMLError_NotSupported)."""
    return _read("nvmlDeviceGetTotalEnergyConsumption", handle, "energy_mj")


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return _read("nvmlDeviceGetEnforcedPowerLimit", handle, "limit_mw")


def nvmlDeviceGetTemperature(handle, sensor):
    return _read("nvmlDeviceGetTemperature", handle, "temp")


def nvmlDeviceGetClockInfo(handle, type):
    return _read("nvmlDeviceGetClockInfo", handle, "sm_mhz")


def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
    return _read("nvmlDeviceGetCurrentClocksThrottleReasons", handle, "reasons")


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return _read("nvmlDeviceGetCurrentClocksEventReasons", handle, "reasons")


def nvmlDeviceGetComputeRunningProcesses(handle):
    procs = _read("nvmlDeviceGetComputeRunningProcesses", handle, "procs")
    return [
        _Struct(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
        for pid, mem in procs
    ]


def nvmlDeviceGetIndex(handle):
    return handle.index


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
    field = "ecc_volatile" if counterType == NVML_VOLATILE_ECC else "ecc_aggregate"
    return _read("nvmlDeviceGetTotalEccErrors", handle, field)


def nvmlDeviceGetRetiredPagesPendingStatus(handle):
    return _read("nvmlDeviceGetRetiredPagesPendingStatus", handle, "retired_pending")


def nvmlDeviceGetRemappedRows(handle):
    return _read("nvmlDeviceGetRemappedRows", handle, "remapped")


def nvmlDeviceGetPcieReplayCounter(handle):
    return _read("nvmlDeviceGetPcieReplayCounter", handle, "pcie_replay")


class c_nvmlEventSet_t:
    def __init__(self, state):
        self.state = state


def nvmlEventSetCreate():
    if "nvmlEventSetCreate" in _missing:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    state = {"gpus": set(), "queue": []}
    _event_sets.append(state)
    return c_nvmlEventSet_t(state)


def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
    eventSet.state["gpus"].add(handle.index)


def nvmlEventSetWait_v2(eventSet, timeoutms):
    if not eventSet.state["queue"]:
        raise NVMLError(NVML_ERROR_TIMEOUT)
    index, xid = eventSet.state["queue"].pop(0)
    return _Struct(
        device=c_nvmlDevice_t(index),
        eventType=nvmlEventTypeXidCriticalError,
        eventData=xid,
        gpuInstanceId=0xFFFFFFFF,
        computeInstanceId=0xFFFFFFFF,
    )


def nvmlEventSetFree(eventSet):
    _event_sets.remove(eventSet.state)
