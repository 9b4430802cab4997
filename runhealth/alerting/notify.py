"""Alert webhooks: one message when an alert starts, one when it resolves, sent off-thread.

`AlertTracker` (pure) diffs successive `runhealth.rules.health.evaluate()` answers into events:
"start" when an alert appears, "resolve" once it has been absent for `clear_s` (hysteresis: a
node that flaps for a few seconds is one alert, not ten), "repeat" every `renotify_s` while it
holds (default 1 h). `Notifier` runs the tracker on its own thread and hands each message to
every receiver's own sender thread through its own bounded queue, so neither a slow or dead
webhook nor another receiver's backlog delays collection or the other receivers; each delivery
is retried with exponential backoff, every attempt ends at its deadline (runhealth.alerting.webhook), and
its outcome is written to the store (table `webhook_deliveries`), which the Nodes page shows.
Recording is best-effort: a store that cannot be written never re-sends a delivered message
or stops a sender (the failure to record is logged). The tracker's state (the alerts announced
that still hold, when each started and was last sent) is kept in the store too (table
`alert_state`), read when a notifier first evaluates and written after each evaluation, so a
restarted collector (a config edit, a new process) neither announces them again nor changes
their `since`; an alert that ended while no collector ran is resolved on the first evaluation.

URLs, their checks and redaction, and the HTTP attempt itself live in runhealth.alerting.webhook. URLs
to hooks.slack.com, or written `slack+https://...` (Mattermost, Rocket.Chat and other
Slack-compatible receivers), get `{"text": ...}`; every other URL gets the generic JSON object.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from runhealth.alerting.webhook import (  # noqa: F401 - URLS_ENV, load_urls, is_slack: part of this module's API
    DEADLINE_S,
    URLS_ENV,
    describe_error,
    is_slack,
    load_urls,
    post_json,
    redact,
)
from runhealth.rules import health
from runhealth.store import Store
from runhealth.textsafe import escape

log = logging.getLogger(__name__)

RENOTIFY_S = 3600.0
CLEAR_S = 60.0
RETRIES = 5
QUEUE_MAX = 1000  # per receiver
KEEP_DELIVERIES = 2000


# -- events ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Event:
    kind: str  # "start" | "repeat" | "resolve"
    alert: health.Alert
    since: float  # when the alert started (unix)
    at: float

    def generic(self) -> dict[str, Any]:
        a = self.alert
        return {
            "alert": a.name,
            "severity": a.severity,
            "run": a.run,
            "node": a.node,
            "gpu": a.gpu,
            "value": a.value,
            "since": self.since,
            "resolved": self.kind == "resolve",
            "repeat": self.kind == "repeat",
            "summary": a.summary,
            "time": self.at,
        }

    def slack(self) -> dict[str, Any]:
        a = self.alert
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        if self.kind == "resolve":
            return {"text": f":white_check_mark: RESOLVED [{a.run}] {a.name}: {a.summary} (since {since})"}
        icon = ":rotating_light:" if a.severity == "critical" else ":warning:"
        again = " (still firing)" if self.kind == "repeat" else ""
        return {"text": f"{icon} {a.severity.upper()} [{a.run}] {a.name}{again}: {a.summary} (since {since})"}


@dataclasses.dataclass
class _Held:
    alert: health.Alert
    since: float  # wall clock: shown in the message
    last_seen: float  # these two on the tracker's interval clock (monotonic in the Notifier)
    last_sent: float


Held = _Held  # the public name: runhealth.alerting.alerthistory restores its open episodes as these


class AlertTracker:
    """Turns the alert set at successive instants into start / repeat / resolve events."""

    def __init__(self, renotify_s: float = RENOTIFY_S, clear_s: float = CLEAR_S):
        self.renotify_s = renotify_s
        self.clear_s = clear_s
        self.held: dict[tuple, _Held] = {}

    def update(self, current: list[health.Alert], now: float, mono: float | None = None) -> list[Event]:
        """Events at wall time `now`; `clear_s` and `renotify_s` are measured on `mono` (the
        Notifier passes time.monotonic(), so a wall-clock step neither resolves nor mutes an
        alert); without `mono`, on `now`."""
        mono = now if mono is None else mono
        events = []
        for a in current:
            held = self.held.get(a.key)
            if held is None:
                self.held[a.key] = _Held(a, now, mono, mono)
                events.append(Event("start", a, now, now))
                continue
            held.alert, held.last_seen = a, mono  # the newest value and wording
            if mono - held.last_sent >= self.renotify_s:
                held.last_sent = mono
                events.append(Event("repeat", a, held.since, now))
        present = {a.key for a in current}
        for key, held in list(self.held.items()):
            if key not in present and mono - held.last_seen >= self.clear_s:  # absent long enough: resolved
                del self.held[key]
                events.append(Event("resolve", held.alert, held.since, now))
        return events


def load_held(store: Store, now: float | None = None, mono: float | None = None) -> dict[tuple, _Held]:
    """The alerts announced by an earlier notifier on this store that were not resolved.

    Stored times are wall-clock; `last_seen`/`last_sent` come back on the caller's interval clock
    (`mono` at wall time `now`), none of them later than now (a clock that moved back)."""
    now = time.time() if now is None else now
    mono = now if mono is None else mono
    held = {}
    for row in store.query("SELECT * FROM alert_state"):
        alert = health.Alert(**json.loads(row["alert"]))
        seen, sent = (mono - max(0.0, now - row[k]) for k in ("last_seen_unix", "last_sent_unix"))
        held[alert.key] = _Held(alert, row["since_unix"], seen, sent)
    return held


def save_held(store: Store, held: dict[tuple, _Held], now: float | None = None, mono: float | None = None) -> None:
    """Replace the stored alert state with `held` (one transaction); its interval-clock times
    (`mono` at wall time `now`) are stored as wall-clock times."""
    now = time.time() if now is None else now
    mono = now if mono is None else mono
    with store.transaction() as db:
        db.execute("DELETE FROM alert_state")
        db.executemany(
            "INSERT INTO alert_state VALUES (?,?,?,?,?)",
            [
                (
                    json.dumps(list(key)),
                    json.dumps(dataclasses.asdict(h.alert)),
                    h.since,
                    now - (mono - h.last_seen),
                    now - (mono - h.last_sent),
                )
                for key, h in held.items()
            ],
        )


# -- delivery -------------------------------------------------------------------------------
def record_delivery(
    store: Store, url: str, event: Event, ok: bool, attempts: int, error: str | None, now: float
) -> None:
    with store.transaction() as db:
        db.execute(
            "INSERT INTO webhook_deliveries VALUES (?,?,?,?,?,?,?,?)",
            (now, redact(url), event.alert.name, event.alert.node, event.kind, int(ok), attempts, error),
        )
        db.execute(
            "DELETE FROM webhook_deliveries WHERE rowid <= (SELECT MAX(rowid) FROM webhook_deliveries) - ?",
            (KEEP_DELIVERIES,),
        )


def delivery_status(store: Store, since_unix: float) -> list[dict[str, Any]]:
    """Per webhook target (redacted): sends and failures since `since_unix`, the last error."""
    return store.query(
        "SELECT target, SUM(ok) AS delivered, SUM(1 - ok) AS failed, MAX(CASE WHEN ok THEN ts_unix END) AS last_ok_unix,"
        " MAX(CASE WHEN NOT ok THEN ts_unix END) AS last_failure_unix,"
        " (SELECT error FROM webhook_deliveries d2 WHERE d2.target = d.target AND NOT ok ORDER BY ts_unix DESC LIMIT 1)"
        " AS last_error FROM webhook_deliveries d WHERE ts_unix >= ? GROUP BY target ORDER BY target",
        (since_unix,),
    )


class Notifier:
    """Evaluates alerts every `interval_s` on its own thread; one sender thread per receiver."""

    def __init__(
        self,
        store: Store,
        urls: list[str],
        interval_s: float = 10.0,
        *,
        tracker: AlertTracker | None = None,
        retries: int = RETRIES,
        backoff_s: float = 2.0,
        deadline_s: float = DEADLINE_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        evaluate: Callable[[Store, float], list[health.Alert]] = health.evaluate,
    ):
        self.store, self.urls, self.interval_s = store, list(dict.fromkeys(urls)), interval_s
        self.tracker = tracker or AlertTracker()
        self.retries, self.backoff_s, self.deadline_s = retries, backoff_s, deadline_s
        self.clock, self.monotonic, self.evaluate = clock, monotonic, evaluate
        self.queues: dict[str, queue.Queue] = {url: queue.Queue(maxsize=QUEUE_MAX) for url in self.urls}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loaded = False  # the stored alert state was read into the tracker

    def check(self) -> list[Event]:
        """Evaluate once and queue the resulting messages (never waits for a webhook).

        The first call reads the alert state an earlier notifier left in the store (raising when
        it cannot: evaluating without it would announce every held alert again).
        """
        now, mono = self.clock(), self.monotonic()
        if not self._loaded:
            self.tracker.held.update(load_held(self.store, now, mono))
            self._loaded = True
        before = bool(self.tracker.held)
        events = self.tracker.update(self.evaluate(self.store, now), now, mono)
        if before or self.tracker.held:
            self._save_held(now, mono)
        for event in events:
            for url, q in self.queues.items():
                try:
                    q.put_nowait(event)
                except queue.Full:  # this receiver is far behind: say so, drop, keep collecting
                    self._record(url, event, False, 0, "queue full: message dropped")
        return events

    def _save_held(self, now: float, mono: float) -> None:
        """save_held, best-effort: a store that cannot be written now never stops alerting."""
        try:
            save_held(self.store, self.tracker.held, now, mono)
        except Exception as exc:
            log.warning("alert state not recorded in the store (a restart may announce it again): %s", escape(exc))

    def deliver(self, url: str, event: Event) -> bool:
        """Send one message with retries and backoff; the outcome goes to the store if it can."""
        payload = event.slack() if is_slack(url) else event.generic()
        error, attempt = None, 0
        for attempt in range(1, self.retries + 1):
            try:
                post_json(url, payload, self.deadline_s)
            except Exception as exc:  # any failure: retry, then record
                error = describe_error(exc, url)
                log.info("webhook %s: attempt %d failed: %s", redact(url), attempt, error)
            else:
                self._record(url, event, True, attempt, None)  # delivered: never sent again
                return True
            if attempt < self.retries and self._stop.wait(self.backoff_s * 2 ** (attempt - 1)):
                break
        self._record(url, event, False, attempt, error)
        return False

    def _record(self, url: str, event: Event, ok: bool, attempts: int, error: str | None) -> None:
        """record_delivery, best-effort: delivery never depends on the store being writable."""
        try:
            record_delivery(self.store, url, event, ok, attempts, error, self.clock())
        except Exception as exc:
            log.warning(
                "webhook %s: %s of %s %s (%s) not recorded in the store: %s",
                redact(url),
                "delivery" if ok else "failure",
                event.kind,
                event.alert.name,
                event.alert.node or "run",
                escape(exc),
            )

    def start(self) -> None:
        if self._threads:
            return
        self._threads = [threading.Thread(target=self._check_loop, name="runhealth-alerts", daemon=True)]
        self._threads += [
            threading.Thread(target=self._send_loop, args=(url,), name=f"runhealth-webhook-{i}", daemon=True)
            for i, url in enumerate(self.urls)
        ]
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every thread; waits at most `timeout_s` in all (a sender may be mid-attempt)."""
        self._stop.set()
        end = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(timeout=max(0.0, end - time.monotonic()))

    def _check_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # a bad read must not end alerting for good
                log.warning("alert evaluation failed: %s", escape(exc))
            self._stop.wait(self.interval_s)

    def _send_loop(self, url: str) -> None:
        q = self.queues[url]
        while not self._stop.is_set():
            try:
                event = q.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.deliver(url, event)
            except Exception as exc:  # whatever breaks, this receiver's later messages still go out
                log.error("webhook %s: message skipped after an error: %s", redact(url), describe_error(exc, url))
