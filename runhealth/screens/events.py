"""The run's events in words: the markers on every time chart (#33 item 7).

The collecting process records its starts, the config changes it found, a new run and shards
that started over (runhealth.store.runevents); `chart_events(store, since)` reads them in one
statement and words each as an `Event`: a short label drawn at the top of its marker and the
sentence its hover shows. The screen models carry them (Overview, GPUs; the Output lengths
charts' frames), the figures draw them (components/markers.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runhealth.ages import fmt_age
from runhealth.screens.words import fmt_count, fmt_plural
from runhealth.settings.windows import ALERT_STRIP_MIN_S, ALERT_TIMELINE_S
from runhealth.store import Store
from runhealth.store.runevents import EventRow, read

LABELS = {
    "run_registered": "new run",
    "collector_started": "restart",
    "config_changed": "config",
    "shards_reset": "relaunch",
    "store_lock_replaced": "lock",
}
SETTINGS = {  # run_meta key -> (its name in words, unit)
    "max_output_tokens": ("ceiling (max_output_tokens)", "tokens"),
    "target_completions": ("target", "completions"),
    "interval_s": ("poll interval", "s"),
}


@dataclasses.dataclass(frozen=True)
class Event:
    """One marker: when, its short label and its hover sentence."""

    ts_unix: float
    kind: str
    label: str
    text: str


def _setting(value: Any, unit: str) -> str:
    """A setting's value, its unit only when `unit` is given: "8,192", "10", "detected"."""
    if value is None:
        return "detected" if unit == "tokens" else "not set"
    number = f"{value:g}" if isinstance(value, float) and not value.is_integer() else fmt_count(value)
    return f"{number} {unit}" if unit else number


def _config_text(d: dict[str, Any]) -> str:
    if d.get("field") == "nodes":
        parts = [f"{how} {', '.join(d[how])}" for how in ("added", "removed") if d.get(how)]
        now = f" (now {fmt_plural(int(d['nodes']), 'node')})" if d.get("nodes") is not None else ""
        return "nodes " + "; ".join(parts) + now
    name, unit = SETTINGS.get(str(d.get("field")), (str(d.get("field")), ""))
    old = _setting(d.get("old"), "" if d.get("old") is not None else unit)
    return f"{name} {old} → {_setting(d.get('new'), unit)}"


def _reset_text(node: str | None, d: dict[str, Any]) -> str:
    n, replaced = int(d.get("shards") or 0), int(d.get("replaced") or 0)
    how = f" ({replaced:,} rewritten in place)" if replaced else ""
    where = f": {', '.join(d['paths'])}" if d.get("paths") else ""
    return f"{node or 'a node'}: {fmt_plural(n, 'shard')} started over{how}, counted afresh (a relaunch?){where}"


def text_of(row: EventRow) -> str:
    """The hover sentence of one stored event."""
    kind, d = row["kind"], row["detail"]
    if kind == "run_registered":
        nodes = d.get("nodes") or []
        return f"Collection began: run registered with {fmt_plural(len(nodes), 'node')}"
    if kind == "collector_started":
        return "Collector restarted" + (" with the changed config" if d.get("config_changed") else "")
    if kind == "config_changed":
        return "Config changed: " + _config_text(d)
    if kind == "shards_reset":
        return _reset_text(row["node"], d)
    if kind == "store_lock_replaced":
        return (
            f"The collector's lock file {d.get('path', '')} was {d.get('how', 'replaced')} while it collected"
            f" (pid {d.get('pid', '?')}): it locked a new one, so a second collector is still refused"
        )
    return f"{kind} ({row['node']})" if row["node"] else kind


def word(row: EventRow) -> Event:
    return Event(row["ts_unix"], row["kind"], LABELS.get(row["kind"], row["kind"]), text_of(row))


def chart_events(store: Store, since_unix: float | None = None) -> tuple[Event, ...]:
    """The run's events from `since_unix` on (None: the whole run), oldest first, in words."""
    return tuple(word(r) for r in read(store, since_unix))


def alert_window_s(now: float, first_unix: float | None) -> float:
    """The alert strip's width (Overview): the run's age so far (`first_unix`: the earliest instant
    it shows, an episode's start or a run event) and a tenth more, at least ALERT_STRIP_MIN_S, at
    most the day (ALERT_TIMELINE_S). A run minutes old drew its bars a few pixels wide on a 24 h
    axis (#41)."""
    if first_unix is None:
        return ALERT_TIMELINE_S
    return min(ALERT_TIMELINE_S, max(ALERT_STRIP_MIN_S, 1.1 * (now - first_unix)))


def alert_window_words(width_s: float) -> str:
    """The strip's width in its title: "24 h", "30 min", "2.5 h"."""
    return "24 h" if width_s >= ALERT_TIMELINE_S else fmt_age(width_s)
