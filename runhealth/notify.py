"""Alert webhooks: one message when an alert starts, one when it resolves, sent off-thread.

`AlertTracker` (pure) diffs successive `runhealth.health.evaluate()` answers into events:
"start" when an alert appears, "resolve" once it has been absent for `clear_s` (hysteresis: a
node that flaps for a few seconds is one alert, not ten), "repeat" every `renotify_s` while it
holds (default 1 h). `Notifier` runs the tracker on its own thread and hands messages to a
sender thread through a bounded queue, so a slow or dead webhook never delays collection;
each delivery is retried with exponential backoff and its outcome is written to the store
(table `webhook_deliveries`), which the Nodes page shows.

Webhook URLs are secrets (a Slack URL is a write credential): they come only from
`.streamlit/secrets.toml` (`[alerts] webhook_urls = [...]`) or `RUNHEALTH_WEBHOOK_URLS`
(comma-separated), and only `redact(url)` (scheme and host) is ever logged, stored or shown.
URLs to hooks.slack.com, or written `slack+https://...` (Mattermost, Rocket.Chat and other
Slack-compatible receivers), get `{"text": ...}`; every other URL gets the generic JSON object.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runhealth import health
from runhealth.config import SECRETS_PATH
from runhealth.errors import ConfigError
from runhealth.store import Store

log = logging.getLogger(__name__)

URLS_ENV = "RUNHEALTH_WEBHOOK_URLS"
RENOTIFY_S = 3600.0
CLEAR_S = 60.0
RETRIES = 5
QUEUE_MAX = 1000
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS webhook_deliveries (ts_unix REAL NOT NULL, target TEXT NOT NULL,"
    " alert TEXT, node TEXT, kind TEXT, ok INTEGER NOT NULL, attempts INTEGER NOT NULL, error TEXT)"
)
KEEP_DELIVERIES = 2000


# -- URLs ---------------------------------------------------------------------------------
def load_urls(secrets_path: Path = SECRETS_PATH, environ: Mapping[str, str] | None = None) -> list[str]:
    """Webhook URLs from RUNHEALTH_WEBHOOK_URLS if set, else secrets.toml [alerts] webhook_urls.

    Raises:
        ConfigError: a URL is not http(s); the message gives its position, never the URL.
    """
    environ = os.environ if environ is None else environ
    if environ.get(URLS_ENV, "").strip():
        urls, where = [u.strip() for u in environ[URLS_ENV].split(",") if u.strip()], URLS_ENV
    else:
        where = f"{secrets_path} [alerts] webhook_urls"
        try:
            raw = tomllib.loads(Path(secrets_path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{secrets_path}: cannot read secrets file ({type(exc).__name__})") from None
        urls = (raw.get("alerts") or {}).get("webhook_urls") or []
        if not isinstance(urls, list):
            raise ConfigError(f"{where} must be a list of URLs")
    for i, url in enumerate(urls):
        parsed = urllib.parse.urlsplit(url if isinstance(url, str) else "")
        if parsed.scheme not in ("http", "https", "slack+http", "slack+https") or not parsed.hostname:
            raise ConfigError(f"{where}: entry {i + 1} is not an http(s) URL")
    return list(urls)


def redact(url: str) -> str:
    """What may be shown of a webhook URL: its scheme and host (the path is the secret)."""
    parsed = urllib.parse.urlsplit(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.hostname or '?'}{port}/…"


def is_slack(url: str) -> bool:
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme.startswith("slack+") or (parsed.hostname or "").endswith("hooks.slack.com")


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
    since: float
    last_seen: float
    last_sent: float


class AlertTracker:
    """Turns the alert set at successive instants into start / repeat / resolve events."""

    def __init__(self, renotify_s: float = RENOTIFY_S, clear_s: float = CLEAR_S):
        self.renotify_s = renotify_s
        self.clear_s = clear_s
        self.held: dict[tuple, _Held] = {}

    def update(self, current: list[health.Alert], now: float) -> list[Event]:
        events = []
        for a in current:
            held = self.held.get(a.key)
            if held is None:
                self.held[a.key] = _Held(a, now, now, now)
                events.append(Event("start", a, now, now))
                continue
            held.alert, held.last_seen = a, now  # the newest value and wording
            if now - held.last_sent >= self.renotify_s:
                held.last_sent = now
                events.append(Event("repeat", a, held.since, now))
        present = {a.key for a in current}
        for key, held in list(self.held.items()):
            if key not in present and now - held.last_seen >= self.clear_s:  # absent long enough: resolved
                del self.held[key]
                events.append(Event("resolve", held.alert, held.since, now))
        return events


# -- delivery -------------------------------------------------------------------------------
def post_json(url: str, payload: dict[str, Any], timeout_s: float = 5.0) -> None:
    """POST `payload`; raises on a network error or a non-2xx answer."""
    target = url.split("+", 1)[1] if url.startswith("slack+") else url
    req = urllib.request.Request(
        target,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "runhealth"},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # http(s) only: checked in load_urls
        resp.read(1024)


def _plain_error(exc: BaseException, url: str) -> str:
    text = (
        f"HTTP {exc.code}"
        if isinstance(exc, urllib.error.HTTPError)
        else str(getattr(exc, "reason", None) or exc or type(exc).__name__)
    )
    return text.replace(url, redact(url))[:300]  # never echo the secret path back


def ensure_schema(store: Store) -> None:
    with store.transaction() as db:  # the table belongs to this module; the store only hosts it
        db.execute(_SCHEMA)


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
    if not store.query("SELECT 1 FROM sqlite_master WHERE name = 'webhook_deliveries'"):
        return []  # nothing sent yet (and a read-only viewer must not create tables)
    return store.query(
        "SELECT target, SUM(ok) AS delivered, SUM(1 - ok) AS failed, MAX(CASE WHEN ok THEN ts_unix END) AS last_ok_unix,"
        " MAX(CASE WHEN NOT ok THEN ts_unix END) AS last_failure_unix,"
        " (SELECT error FROM webhook_deliveries d2 WHERE d2.target = d.target AND NOT ok ORDER BY ts_unix DESC LIMIT 1)"
        " AS last_error FROM webhook_deliveries d WHERE ts_unix >= ? GROUP BY target ORDER BY target",
        (since_unix,),
    )


class Notifier:
    """Evaluates alerts every `interval_s` on its own thread and delivers events on another."""

    def __init__(
        self,
        store: Store,
        urls: list[str],
        interval_s: float = 10.0,
        *,
        tracker: AlertTracker | None = None,
        retries: int = RETRIES,
        backoff_s: float = 2.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        evaluate: Callable[[Store, float], list[health.Alert]] = health.evaluate,
    ):
        self.store, self.urls, self.interval_s = store, list(urls), interval_s
        self.tracker = tracker or AlertTracker()
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.clock, self.evaluate = clock, evaluate
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_MAX)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        ensure_schema(store)

    def check(self) -> list[Event]:
        """Evaluate once and queue the resulting messages (never waits for a webhook)."""
        now = self.clock()
        events = self.tracker.update(self.evaluate(self.store, now), now)
        for event in events:
            for url in self.urls:
                try:
                    self.queue.put_nowait((url, event))
                except queue.Full:  # the receivers are far behind: say so, drop, keep collecting
                    record_delivery(self.store, url, event, False, 0, "queue full: message dropped", now)
        return events

    def deliver(self, url: str, event: Event) -> bool:
        """Send one message with retries and backoff; the outcome goes to the store."""
        payload = event.slack() if is_slack(url) else event.generic()
        error = None
        for attempt in range(1, self.retries + 1):
            try:
                post_json(url, payload, self.timeout_s)
                record_delivery(self.store, url, event, True, attempt, None, self.clock())
                return True
            except Exception as exc:  # any failure: retry, then record
                error = _plain_error(exc, url)
                log.info("webhook %s: attempt %d failed: %s", redact(url), attempt, error)
            if attempt < self.retries and self._stop.wait(self.backoff_s * 2 ** (attempt - 1)):
                break
        record_delivery(self.store, url, event, False, attempt, error, self.clock())
        return False

    def start(self) -> None:
        if self._threads:
            return
        self._threads = [
            threading.Thread(target=self._check_loop, name="runhealth-alerts", daemon=True),
            threading.Thread(target=self._send_loop, name="runhealth-webhooks", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=timeout_s)

    def _check_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # a bad read must not end alerting for good
                log.warning("alert evaluation failed: %s", exc)
            self._stop.wait(self.interval_s)

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            try:
                url, event = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            self.deliver(url, event)
