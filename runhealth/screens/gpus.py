"""The GPUs page's model: every GPU's latest reading, its problems and notes, at one instant.

`gpus(store, config, now)` reads the store once through `health.read_hardware` (nodes, rates,
GPU and health tables: each once, as `health.read` reads them, without the run's length counts,
which the page does not show) and derives the rest from that reading: the GPUs of the nodes the
collector polls (labelled node/gpu), whether the run is writing (the one tok/s), the GPU alerts
(`health.gpu_alerts`: those of `health.alerts_of`, worded as on the Overview), the notes that are no problem
(`hardware.gpu_notes`), the nodes' telemetry errors in sentences (`hardware.telemetry_errors`)
and whether the telemetry is simulated. The page (pages/gpus.py) lays it out; the series over a
window stay the collector's precomputed payload (runhealth.payloads.pagedata), read by the page's window.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from runhealth.records import GpuRow, NodeRow
from runhealth.rules import hardware, health
from runhealth.rules.hardware import gpu_state as gpu_state  # the GPU table's words (components/tables.py)
from runhealth.screens.events import Event, chart_events
from runhealth.settings.config import RunConfig
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store

GPU_ALERT_PREFIX = "gpu_"


@dataclasses.dataclass(frozen=True)
class Gpus:
    """The GPUs page at `now` (see the module docstring); `to_json()` is the record as JSON."""

    run: str
    now: float
    nodes: tuple[NodeRow, ...]  # the nodes the collector polls
    gpus: tuple[GpuRow, ...]  # their GPUs' latest readings
    writing: bool  # the run made tokens in the last minute (an idle GPU then is a problem)
    alerts: tuple[health.Alert, ...]  # the GPU alerts (gpu_*)
    notes: tuple[tuple[str, str], ...]  # ("info", text): worth knowing, no problem
    telemetry_errors: tuple[str, ...]  # one sentence per distinct telemetry error
    simulated: bool  # demo telemetry
    events: tuple[Event, ...] = ()  # the run's events: markers on the series charts (#33 item 7)

    @property
    def problems(self) -> list[tuple[str, str]]:
        """The alerts as (level, sentence), then the notes: the page's problem list."""
        return [("error" if a.severity == "critical" else "warning", a.summary) for a in self.alerts] + list(self.notes)

    @property
    def never_polled(self) -> bool:
        return all(n.get("last_ok_unix") is None for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "now_unix": self.now,
            "writing": self.writing,
            "simulated": self.simulated,
            "gpus": [dict(g) for g in self.gpus],
            "problems": [{"level": lv, "text": t} for lv, t in self.problems],
            "telemetry_errors": list(self.telemetry_errors),
        }


def gpus(store: Store, config: RunConfig, now: float | None = None) -> Gpus:
    """The GPUs page of `config`'s run (a RunConfig) at `now`, from one reading of `store`."""
    now = time.time() if now is None else now
    # The nodes are those the collector saved in the run's meta (none saved: every node the store
    # holds), as the GPU table has always shown them; the other settings are the config's.
    settings = dataclasses.replace(RunSettings.from_config(config), nodes=store.run_settings().nodes)
    reading = health.read_hardware(store, now, settings)
    names = {n["name"] for n in reading.nodes}
    rows = tuple(g for g in reading.gpu_latest if g["node"] in names)
    writing = bool(reading.rates.tokens_per_s_1m)
    found = {(h["node"], h["gpu"]): h["health"] for h in reading.gpu_health if h["node"] in names}
    labelled = [{**g, "label": f"{g['node']}/{g['gpu']}"} for g in rows]
    return Gpus(
        run=config.name,
        now=now,
        nodes=tuple(reading.nodes),
        gpus=rows,
        writing=writing,
        alerts=tuple(a for a in health.gpu_alerts(reading) if a.name.startswith(GPU_ALERT_PREFIX)),
        notes=tuple(hardware.gpu_notes(labelled, found, writing)),
        telemetry_errors=tuple(hardware.telemetry_errors(reading.nodes)),
        events=chart_events(store),
        simulated=any(n.get("gpu_simulated") for n in reading.nodes),
    )
