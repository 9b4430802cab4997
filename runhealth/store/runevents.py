"""The run's events (migration 10's `run_events`): what moved the lines on the time charts.

The collecting process writes them: `record` when it claims a run's store (a collector start,
the config changes found against the settings the store last recorded, a new run registered:
runhealth.collect.changes), when its lock file was deleted or replaced under it and it locked a
new one (runhealth/collect/storelock.py), and `insert` inside a poll's own transaction when the
poll reset or rewrote shards (a relaunch). Each row is (ts_unix, kind, node, detail): `detail` a small JSON
object; the words are the screens' (runhealth/screens/events.py). `read` returns them oldest
first, at most MAX_READ of the newest (a chart has room for a few dozen markers, not thousands).
So no read ever returns an event older than the newest MAX_READ, whatever its `since_unix`:
`prune` (the hourly housekeeping, `Store.prune`) drops those and nothing a chart draws, which
bounds the table (a run relaunched every few minutes for months wrote an event each time).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:  # writes.py imports this module: the Store is only a type here
    from runhealth.store.lifecycle import StoreFile as Store

EventKind = Literal["run_registered", "collector_started", "config_changed", "shards_reset", "store_lock_replaced"]
MAX_READ = 500


class EventRow(TypedDict):
    """One `run_events` row, its detail decoded."""

    ts_unix: float
    kind: str  # an EventKind (a newer runhealth may write others: shown by kind)
    node: str | None
    detail: dict[str, Any]


def insert(
    db: sqlite3.Connection, ts_unix: float, kind: EventKind, detail: dict[str, Any], node: str | None = None
) -> None:
    """Add one event inside the caller's transaction (a poll's write)."""
    db.execute(
        "INSERT INTO run_events (ts_unix, kind, node, detail) VALUES (?,?,?,?)",
        (ts_unix, kind, node, json.dumps(detail, sort_keys=True)),
    )


def record(store: Store, ts_unix: float, events: Iterable[tuple[EventKind, dict[str, Any]]]) -> None:
    """Add `events` ((kind, detail) each, run-wide) at `ts_unix` in one transaction."""
    with store.transaction() as db:
        for kind, detail in events:
            insert(db, ts_unix, kind, detail)


def read(store: Store, since_unix: float | None = None) -> list[EventRow]:
    """The events from `since_unix` on (None: the whole run), oldest first: one statement."""
    rows = store.cursor(
        "SELECT ts_unix, kind, node, detail FROM (SELECT * FROM run_events WHERE ts_unix >= ?"
        " ORDER BY ts_unix DESC, id DESC LIMIT ?) ORDER BY ts_unix, id",
        (float("-inf") if since_unix is None else since_unix, MAX_READ),
    )
    return [EventRow(ts_unix=r[0], kind=r[1], node=r[2], detail=_decoded(r[3])) for r in rows]


def prune(db: sqlite3.Connection, keep: int = MAX_READ) -> int:
    """Delete every event older than the newest `keep` (as `read` orders them) inside the
    caller's transaction; returns how many went. `keep` MAX_READ: what any `read` can return."""
    return db.execute(
        "DELETE FROM run_events WHERE id NOT IN (SELECT id FROM run_events ORDER BY ts_unix DESC, id DESC LIMIT ?)",
        (keep,),
    ).rowcount


def _decoded(text: str) -> dict[str, Any]:
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
