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

A step is implausible (#40 item 5) when it is more than the GPU could draw in the interval (its
power limit, else MAX_POWER_W, times PLAUSIBLE_SHARE, times the seconds), or when the counter
went back further than a reload explains (the new reading is more than the GPU could have drawn
since the interval began: a faulty read, not a restart at 0). Such a step is `dropped`: the
store then drops the node's whole interval, its tokens with it, and does not keep the reading
as the next baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

COUNTER = "counter"
MAX_POWER_W = 1500.0  # no power limit reported: above any data-centre GPU's board power (B200: 1000 W)
PLAUSIBLE_SHARE = 1.25  # a GPU may briefly draw above its limit; a faulty read is far beyond it
POWER_X_TIME = "power x time"


@dataclasses.dataclass(frozen=True)
class Reading:
    """One GPU's energy-relevant reading at one poll (dashboard clock)."""

    ts_unix: float
    uuid: str | None
    counter_mj: int | None  # NVML's total energy since the driver loaded, None: not supported
    power_w: float | None
    power_limit_w: float | None = None  # not stored: only the new reading's limit is used


@dataclasses.dataclass(frozen=True)
class Step:
    """The energy of one GPU between two readings."""

    joules: float  # 0 when nothing could be measured (see `source`)
    gpu_s: float  # the seconds the joules cover (0 when no joules were measured)
    source: str | None  # COUNTER, POWER_X_TIME, or None: a baseline only
    reset: bool = False  # the counter went back (driver reloaded)
    dropped: bool = False  # implausible (see the module docstring): measured nothing, not a baseline


def reading_of(device: Mapping[str, Any], ts_unix: float) -> Reading:
    """The agent's device dict (wire.GpuDevice) as a Reading."""
    counter = device.get("energy_mj")
    return Reading(
        ts_unix,
        device.get("uuid"),
        None if counter is None else int(counter),
        device.get("power_w"),
        device.get("power_limit_w"),
    )


def max_joules(now: Reading, seconds: float) -> float:
    """The most a GPU can plausibly use in `seconds` (its power limit, else MAX_POWER_W)."""
    limit = now.power_limit_w if now.power_limit_w and now.power_limit_w > 0 else MAX_POWER_W
    return limit * PLAUSIBLE_SHARE * seconds


def step(prev: Reading | None, now: Reading) -> Step:
    """The energy used between `prev` and `now` (None: the GPU's first reading, a baseline)."""
    dt = now.ts_unix - (prev.ts_unix if prev else now.ts_unix)
    if prev is None or dt <= 0 or (prev.uuid and now.uuid and prev.uuid != now.uuid):
        return Step(0.0, 0.0, None)
    most = max_joules(now, dt)
    if prev.counter_mj is not None and now.counter_mj is not None:
        back = now.counter_mj < prev.counter_mj
        joules = (now.counter_mj if back else now.counter_mj - prev.counter_mj) / 1000.0
        if joules > most:  # beyond the GPU's power, or gone back further than a reload to 0 explains
            return Step(0.0, 0.0, None, dropped=True)
        return Step(joules, dt, COUNTER, reset=back)
    if prev.power_w is not None and now.power_w is not None:
        joules = (prev.power_w + now.power_w) / 2.0 * dt
        return Step(0.0, 0.0, None, dropped=True) if joules > most else Step(joules, dt, POWER_X_TIME)
    return Step(0.0, 0.0, None)
