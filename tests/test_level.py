"""The one ok / warn / alert rule (runhealth.rules.health.level) and the three screens that use it.

A share exactly at a threshold must be the same colour on the Overview tile, in the alert list
and on the per-group bar chart: each asks `level`, so these tests pin the boundary once.
"""

from __future__ import annotations

import pandas as pd
import pytest

from components import alerts, cards, figures
from runhealth.analysis import stats
from runhealth.rules import health
from runhealth.rules.health import level
from runhealth.settings.runsettings import RunSettings

WARN, ALERT = 0.02, 0.05


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "ok"),
        (0.0, "ok"),
        (0.0199, "ok"),
        (0.02, "warn"),
        (0.0499, "warn"),
        (0.05, "alert"),
        (0.9, "alert"),
    ],
)
def test_level_boundaries_are_inclusive(value, expected):
    assert level(value, WARN, ALERT) == expected


def summary(frac: float) -> stats.Summary:
    """A real run summary: 1,000 completions, `frac` of them cut at the 4,096 ceiling."""
    hist = stats.LengthHist()
    cut = round(frac * 1000)
    hist.add(4096, "length", False, cut)
    hist.add(1000, "stop", False, 1000 - cut)
    return stats.summarize(hist, ceiling=4096)


@pytest.mark.parametrize("frac", [0.01, 0.02, 0.03, 0.05, 0.2])
def test_tile_alert_list_and_bar_colour_agree(frac):
    expected = level(frac, WARN, ALERT)
    assert cards.truncation_tile(summary(frac), WARN, ALERT)["level"] == expected
    meta = RunSettings(truncation_warn_fraction=WARN, truncation_alert_fraction=ALERT)
    found = [kind for kind, _text in alerts.lines(health.truncation_alerts(summary(frac), meta, "run"))]
    assert found == {"ok": [], "warn": ["warning"], "alert": ["error"]}[expected]
    df = pd.DataFrame(
        {
            "group": ["a"],
            "fraction": [frac],
            "lo": [frac],
            "hi": [frac],
            "ceiling": [4096.0],
            "drift": [False],
            "completions": [1000],
        }
    )
    colour = figures.make_truncation_by_group_figure(df, WARN, ALERT).data[0].marker.color[0]
    assert (
        colour == {"ok": figures.STOP_COLOUR, "warn": figures.CEILING_COLOUR, "alert": figures.ALERT_COLOUR}[expected]
    )
