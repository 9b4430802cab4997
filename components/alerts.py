"""The Overview's alert lines: `runhealth.rules.health.evaluate()`'s alerts, as the page shows them.

There is one alert engine, in the core: this module only maps an Alert's severity to the
page's level ("error" for critical, "warning") and keeps evaluate's order (most serious first),
so the Overview, the webhooks and /metrics can never disagree about what holds.
"""

from __future__ import annotations

from runhealth.screens import overview as overview_model


def lines(found: list[overview_model.Alert]) -> list[tuple[str, str]]:
    """[(level "error" | "warning", sentence)] in evaluate's order: critical is an "error"."""
    return [("error" if a.severity == "critical" else "warning", a.summary) for a in found]
