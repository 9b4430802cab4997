"""What a collector's start finds changed: the run events it writes when it claims a store.

The store keeps the run's settings as the last collector recorded them (`meta("run")`,
collector.run_meta). A collector that claims the store compares them with its config: none
recorded is a new run registered; otherwise it is a collector (re)start (a process start, or
a config reload that restarted the run), and each setting that moves the charts and differs is
a config change: the ceiling (max_output_tokens), the target, the poll interval, nodes added
or removed. Pure: runhealth.store.runevents writes what this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runhealth.store.runevents import EventKind

# The recorded settings whose change is worth a marker (run_meta's keys).
WATCHED = ("max_output_tokens", "target_completions", "interval_s")


def on_claim(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[tuple[EventKind, dict[str, Any]]]:
    """The events of a collector claiming a store whose recorded settings are `old` (None: none)
    with the settings `new`: (kind, detail) each, in the order they are worth reading."""
    nodes = list(new.get("nodes") or [])
    if not old:
        return [("run_registered", {"nodes": nodes, **{k: new.get(k) for k in WATCHED}})]
    out: list[tuple[EventKind, dict[str, Any]]] = []
    for key in WATCHED:
        if old.get(key) != new.get(key):
            out.append(("config_changed", {"field": key, "old": old.get(key), "new": new.get(key)}))
    before = list(old.get("nodes") or [])
    added = [n for n in nodes if n not in before]
    removed = [n for n in before if n not in nodes]
    if added or removed:
        out.append(("config_changed", {"field": "nodes", "added": added, "removed": removed, "nodes": len(nodes)}))
    out.append(("collector_started", {"config_changed": bool(out)}))
    return out
