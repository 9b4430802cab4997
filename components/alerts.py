"""The Overview's alert lines: `runhealth.rules.health.evaluate()`'s alerts, as the page shows them.

There is one alert engine, in the core: this module only maps an Alert's severity to the
page's level ("error" for critical, "warning") and keeps evaluate's order (most serious first),
so the Overview, the webhooks and /metrics can never disagree about what holds.
"""

from __future__ import annotations

from components import loaders
from runhealth.rules import health
from runhealth.settings.config import RunConfig
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store


def current(store: Store, config: RunConfig) -> list[health.Alert]:
    """Every alert that holds now for the run of `config`: the core's evaluate (a cached read)."""
    return loaders.load_alerts(store, RunSettings.from_config(config))


HARDWARE_PREFIXES = {"gpu": ("gpu_",), "host": ("host_",)}


def of_kind(found: list[health.Alert], kind: str) -> list[health.Alert]:
    """The alerts about GPUs ("gpu": gpu_*) or hosts ("host": host_*), in evaluate's order: the
    GPUs page's and the Nodes page's problem lists are these, worded as on the Overview."""
    return [a for a in found if a.name.startswith(HARDWARE_PREFIXES[kind])]


def lines(found: list[health.Alert]) -> list[tuple[str, str]]:
    """[(level "error" | "warning", sentence)] in evaluate's order: critical is an "error"."""
    return [("error" if a.severity == "critical" else "warning", a.summary) for a in found]
