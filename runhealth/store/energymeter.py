"""GPU energy between two polls: NVML's total-energy counter, else power x time (#33 item 2).

NVML's `nvmlDeviceGetTotalEnergyConsumption` (the agent's `energy_mj`) counts millijoules since
the driver was last loaded, on Volta and newer; nvidia-smi has no query field for it, and older
GPUs answer NOT_SUPPORTED (the agent then sends None). Between two readings of one GPU the
energy is the counter's difference. The counter restarts at 0 when the driver reloads: a reading
below the previous one is such a reset, and the energy is then the new reading (what was used
since the reload; the part before it in that interval is lost, so this is a lower bound, and the
reset is counted). A GPU whose UUID changed is another GPU: its interval only sets a baseline.
Where either reading lacks the counter, the energy is the mean of the two power readings times
the time between them (trapezoid), and is counted apart as `integrated_j` so the screens can say
how much of a figure is power x time. A leaf module (no store, no analysis): the store's poll
write applies it in the poll's transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

COUNTER = "counter"
POWER_X_TIME = "power x time"


@dataclasses.dataclass(frozen=True)
class Reading:
    """One GPU's energy-relevant reading at one poll (dashboard clock)."""

    ts_unix: float
    uuid: str | None
    counter_mj: int | None  # NVML's total energy since the driver loaded, None: not supported
    power_w: float | None


@dataclasses.dataclass(frozen=True)
class Step:
    """The energy of one GPU between two readings."""

    joules: float  # 0 when nothing could be measured (see `source`)
    gpu_s: float  # the seconds the joules cover (0 when no joules were measured)
    source: str | None  # COUNTER, POWER_X_TIME, or None: a baseline only
    reset: bool = False  # the counter went back (driver reloaded)


def reading_of(device: Mapping[str, Any], ts_unix: float) -> Reading:
    """The agent's device dict (wire.GpuDevice) as a Reading."""
    counter = device.get("energy_mj")
    return Reading(ts_unix, device.get("uuid"), None if counter is None else int(counter), device.get("power_w"))


def step(prev: Reading | None, now: Reading) -> Step:
    """The energy used between `prev` and `now` (None: the GPU's first reading, a baseline)."""
    dt = now.ts_unix - (prev.ts_unix if prev else now.ts_unix)
    if prev is None or dt <= 0 or (prev.uuid and now.uuid and prev.uuid != now.uuid):
        return Step(0.0, 0.0, None)
    if prev.counter_mj is not None and now.counter_mj is not None:
        if now.counter_mj < prev.counter_mj:
            return Step(now.counter_mj / 1000.0, dt, COUNTER, reset=True)
        return Step((now.counter_mj - prev.counter_mj) / 1000.0, dt, COUNTER)
    if prev.power_w is not None and now.power_w is not None:
        return Step((prev.power_w + now.power_w) / 2.0 * dt, dt, POWER_X_TIME)
    return Step(0.0, 0.0, None)
