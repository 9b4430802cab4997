"""The alert history: every alert's episode (start, end) kept in the store by the collecting process.

The webhooks were the only record of when truncation crossed its threshold, a node went down or
a run stalled, and they only run when receivers are configured. `AlertHistory` evaluates the
alert set (`health.evaluate`) every poll interval on a thread of the collector, whether or not
webhooks are configured, and turns successive answers into episodes with the webhooks' own rule,
`notify.AlertTracker` (an alert that is absent for under `clear_s` is the same episode): a start
opens a row of the store's `alert_history` table at the evaluation that first saw it; while it
holds, the row takes its newest wording and value and its worst severity; once the tracker
resolves it, the row is closed at the first evaluation the alert no longer held (that is when it
ended; the webhook's "resolved" goes out `clear_s` later). Times are stored wall-clock; the
hysteresis runs on the monotonic clock, so a step of the wall clock neither ends nor splits an
episode. The open rows are the history's state: a restarted collector reads them back (the
tracker's `since` is the row's start) and never opens a second episode for an alert that still
holds; one that ended while no collector ran is closed by the first evaluation.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from runhealth import textsafe
from runhealth.alerting.notify import CLEAR_S, AlertTracker, Held
from runhealth.rules import health
from runhealth.store import Store

log = textsafe.get_logger(__name__)

NEVER = float("inf")  # the history's tracker never repeats: an episode is one row


def _key(key: tuple) -> str:
    return json.dumps(list(key))


def _row(alert: health.Alert) -> dict[str, Any]:
    return {
        "key": _key(alert.key),
        "name": alert.name,
        "severity": alert.severity,
        "node": alert.node,
        "gpu": alert.gpu,
        "summary": alert.summary,
        "value": alert.value,
    }


def load_open(store: Store, now: float, mono: float) -> dict[tuple, Held]:
    """The episodes left open in the store, as the tracker holds them (`last_seen` on the
    caller's interval clock, `mono` at wall time `now`, never later than now)."""
    held = {}
    for r in store.alert_episodes(open_only=True):
        summary = r["summary_end"] or r["summary_start"]
        alert = health.Alert(r["name"], r["severity"], "", summary, r["node"], r["gpu"], r["value_end"])
        seen = mono - max(0.0, now - r["last_seen_unix"])
        held[alert.key] = Held(alert, r["started_unix"], seen, mono)
    return held


class AlertHistory:
    """Evaluates the alerts at most once per `interval_s` and keeps their episodes in the store."""

    def __init__(
        self,
        store: Store,
        interval_s: float = 10.0,
        *,
        clear_s: float = CLEAR_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        evaluate: Callable[[Store, float], list[health.Alert]] = health.evaluate,
    ):
        self.store, self.interval_s = store, interval_s
        self.tracker = AlertTracker(renotify_s=NEVER, clear_s=clear_s)
        self.clock, self.monotonic, self.evaluate = clock, monotonic, evaluate
        self._loaded = False
        self._last_mono: float | None = None
        self._lock = threading.Lock()  # one evaluation at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """Evaluate once and write what changed (raises when the store cannot be read or written:
        the tracker's state then stays as it was, so the next evaluation writes it again)."""
        with self._lock:
            now, mono = self.clock(), self.monotonic()
            if not self._loaded:
                self.tracker.held.update(load_open(self.store, now, mono))
                self._loaded = True
            current = self.evaluate(self.store, now)
            before = {key: dataclasses.replace(h) for key, h in self.tracker.held.items()}
            try:
                events = self.tracker.update(current, now, mono)
                present = {a.key for a in current}
                started = {e.alert.key for e in events if e.kind == "start"}
                self.store.write_alert_episodes(
                    now,
                    started=[_row(e.alert) for e in events if e.kind == "start"],
                    held=[_row(a) for a in current if a.key not in started],
                    absent=[_key(key) for key in self.tracker.held if key not in present],
                    resolved=[_key(e.alert.key) for e in events if e.kind == "resolve"],
                )
            except Exception:
                self.tracker.held = before  # written next time: no episode is lost or doubled
                raise
            self._last_mono = mono

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="runhealth-alert-history", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # a store that cannot be read now: the next interval tries again
                log.warning("alert history not updated: %s", textsafe.escape(exc))
            self._stop.wait(self.interval_s)
