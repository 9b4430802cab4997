"""What the collecting process sends out besides the store: Prometheus /metrics and alert webhooks.

`start_outbound()` is called once by whichever process collects (`runhealth collect`, or the
dashboard's runtime when it collects). Neither part can stop collection: a port already in
use or a bad webhook setting becomes a notice (a bad webhook URL is skipped, the others are
used), and the collector goes on.

The viewer is another process (`runhealth dashboard`'s Streamlit, RUNHEALTH_COLLECTOR=off), so
the collecting process records what it serves in each live run's store (meta key "collector",
`records.CollectorStatus`: the /metrics URL or why it is off, the notices, the number of webhook
receivers and their redacted targets, its pid and host) when its outbound (re)starts, and again
every HEARTBEAT_S: the Nodes page reads it, and tells a live process from one that is gone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

from runhealth.alerting import exporter, metricsauth, notify, webhook
from runhealth.errors import ConfigError, StoreError
from runhealth.heartbeat import HEARTBEAT_S, STATUS_KEY
from runhealth.heartbeat import collector_alive as collector_alive  # re-exported: the viewer reads them here
from runhealth.heartbeat import pid_gone as pid_gone
from runhealth.heartbeat import read_status as read_status
from runhealth.heartbeat import silent_after_s as silent_after_s
from runhealth.records import CollectorStatus
from runhealth.settings.config import RunConfig, RunContext
from runhealth.store import Store

log = logging.getLogger(__name__)
METRICS_UNSET = "set [run] metrics_port or --metrics-port"


@dataclasses.dataclass
class Outbound:
    metrics_server: Any = None
    notifiers: list[notify.Notifier] = dataclasses.field(default_factory=list)  # one per live run
    notices: list[str] = dataclasses.field(default_factory=list)
    stores: list[Store] = dataclasses.field(default_factory=list)  # where the status is written
    metrics_off: str | None = METRICS_UNSET  # why /metrics is not served
    webhook_targets: list[str] = dataclasses.field(default_factory=list)  # redacted
    served_elsewhere: str | None = None  # the supervisor's /metrics URL (runhealth/collect/runprocs.py)
    started_unix: float = dataclasses.field(default_factory=time.time)
    written_unix: float | None = None
    written_mono: float | None = None  # time.monotonic() of that write: the heartbeat's clock
    _stopping: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False)
    _heart: threading.Thread | None = dataclasses.field(default=None, repr=False)

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_server is None:
            return self.served_elsewhere
        host, port = self.metrics_server.server_address[:2]
        return f"{getattr(self.metrics_server, 'scheme', 'http')}://{host}:{port}/metrics"

    def status(self, now: float, stopped: bool = False) -> CollectorStatus:
        return CollectorStatus(
            pid=os.getpid(),
            host=socket.gethostname(),
            started_unix=self.started_unix,
            written_unix=now,
            stopped_unix=now if stopped else None,
            metrics_url=self.metrics_url,
            metrics_off=None if self.metrics_url else self.metrics_off,
            notices=list(self.notices),
            webhook_receivers=len(self.webhook_targets),
            webhook_targets=list(self.webhook_targets),
        )

    def write_status(self, now: float | None = None, stopped: bool = False) -> None:
        """Record this process's outbound status in every live run's store (a store that cannot
        be written is logged: the status is for the viewer, it never stops collection)."""
        now = time.time() if now is None else now
        self.written_unix, self.written_mono = now, time.monotonic()
        for store in self.stores:
            try:
                store.set_meta(STATUS_KEY, self.status(now, stopped))
            except (StoreError, sqlite3.Error, OSError) as exc:
                log.warning("cannot record the collector's status in %s: %s", store.path, exc)

    def beat(self, now: float, mono: float | None = None) -> None:
        """The heartbeat: rewrite the status (stamped `now`, wall clock) once HEARTBEAT_S passed
        since the last write on the monotonic clock (`mono`, default time.monotonic()), so a step
        of the wall clock (NTP, a VM resumed) never silences it."""
        mono = time.monotonic() if mono is None else mono
        if self.written_mono is None or mono - self.written_mono >= HEARTBEAT_S:
            self.write_status(now)
            self.written_mono = mono

    def start_heartbeat(self) -> None:
        """Write the status now and every HEARTBEAT_S in a thread of its own (a store locked by
        another process then delays only the heartbeat, not the service's reload and refresh)."""
        self.write_status()
        self._heart = threading.Thread(target=self._heartbeat, name="runhealth-status", daemon=True)
        self._heart.start()

    def _heartbeat(self) -> None:
        while not self._stopping.wait(1.0):
            self.beat(time.time())

    def stop(self, final: bool = False) -> None:
        """Stop serving; `final` (the process stops, no restart follows): record it as stopped."""
        self._stopping.set()
        if self._heart is not None:
            self._heart.join(timeout=HEARTBEAT_S)  # its last write must not land after "stopped"
        if final:
            self.write_status(stopped=True)  # a viewer on another host knows at once
        for notifier in self.notifiers:
            notifier.stop()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()


def _serve_metrics(
    out: Outbound, runs: Sequence[tuple[RunConfig, Store]], port: int, address: str, access: metricsauth.MetricsAccess
) -> None:
    """Start /metrics on `out`, or record why not (a notice): a token or TLS file that does not
    read, an anonymous non-loopback bind without --public-without-auth, a port in use."""
    try:
        guard = metricsauth.guard(access, address)
    except ConfigError as exc:
        out.metrics_off = f"not served: {exc}"
        out.notices.append(f"Prometheus /metrics {out.metrics_off}")
        return
    seen = [True] * len(runs) if guard.token else metricsauth.anonymous_runs(c.allowed_users for c, _s in runs)
    if not all(seen):
        out.notices.append(
            f"Prometheus /metrics has no token, so an anonymous scrape leaves out {seen.count(False)} run(s) with"
            f" allowed_users; a scrape with a bearer token sees them {metricsauth.HOW_TO_MAKE}"
        )
    if guard.token is None and not metricsauth.is_loopback(address):
        out.notices.append(f"Prometheus /metrics is open to anyone who reaches {address}:{port} ({metricsauth.FLAG})")
    stores = [s for (_c, s), ok in zip(runs, seen, strict=True) if ok]
    try:
        out.metrics_server = exporter.serve(stores, port, address, guard.token, guard.tls)
    except OSError as exc:
        out.metrics_off = f"not served on {address}:{port}: {exc.strerror or exc}"
        out.notices.append(f"Prometheus /metrics {out.metrics_off}")


def serve_metrics(
    runs: Sequence[tuple[RunConfig, Store]],
    metrics_port: int | None = None,
    metrics_address: str | None = None,
    metrics_access: metricsauth.MetricsAccess | None = None,
) -> Outbound:
    """/metrics alone over `runs` (start_outbound's rules: the port and address given, else the
    first run's keys), no webhooks and no status written: the supervisor of one collector
    process per run serves it (runhealth/collect/runprocs.py), each child the rest."""
    out = Outbound()
    if not runs:
        return out
    first = runs[0][0]
    port = metrics_port if metrics_port is not None else first.metrics_port
    if port is not None:
        access = (metrics_access or metricsauth.MetricsAccess()).resolved(first)
        _serve_metrics(out, runs, port, metrics_address or first.metrics_address, access)
    return out


def start_outbound(
    runs: Sequence[tuple[RunConfig, Store]],
    metrics_port: int | None = None,
    metrics_address: str | None = None,
    webhook_urls: list[str] | None = None,
    context: RunContext | None = None,
    metrics_access: metricsauth.MetricsAccess | None = None,
    metrics_elsewhere: str | None = None,
) -> Outbound:
    """For every live run in `runs` (config, store): serve /metrics when a port is set (argument,
    else the first run's `metrics_port`), all runs on the one port, and evaluate alerts and send
    webhooks when URLs are configured (secrets.toml or RUNHEALTH_WEBHOOK_URLS); each event names its run.
    /metrics follows runhealth/alerting/metricsauth.py (`metrics_access`: the command line's options,
    else the first run's keys): with a token file every scrape must carry it; without one a scrape
    sees only the runs without allowed_users, and a non-loopback address is refused (a notice)
    unless --public-without-auth. `metrics_elsewhere`: another process serves /metrics (a
    supervisor's child, runhealth/collect/runprocs.py): its URL, or "off: why"; none served here."""
    out = Outbound(stores=[store for _config, store in runs])
    if not runs:
        return out
    first = runs[0][0]
    port = metrics_port if metrics_port is not None else first.metrics_port
    address = metrics_address or first.metrics_address
    if metrics_elsewhere is not None:
        port = None
        if metrics_elsewhere.startswith("off: "):
            out.metrics_off = metrics_elsewhere[len("off: ") :]
        else:
            out.served_elsewhere = metrics_elsewhere
    if port is not None:
        _serve_metrics(out, runs, port, address, (metrics_access or metricsauth.MetricsAccess()).resolved(first))
    try:  # a refused entry is a notice and is skipped; the other webhooks are used
        urls, refused = (
            webhook.load_urls() if webhook_urls is None else webhook.check_urls(webhook_urls, "webhook_urls")
        )
        out.notices += refused
    except ConfigError as exc:
        urls = []
        out.notices.append(f"alert webhooks off: {exc}")
    if urls and context is not None and context.demo:  # made-up alerts must not page anyone
        urls = []
        out.notices.append("alert webhooks off: this is the demo run")
    if urls:
        for config, store in runs:
            notifier = notify.Notifier(store, urls, interval_s=config.interval_s)
            notifier.start()
            out.notifiers.append(notifier)
        out.webhook_targets = [webhook.redact(u) for u in urls]
        log.info("alert webhooks: %s", ", ".join(out.webhook_targets))
    for notice in out.notices:
        log.warning("%s", notice)
    out.start_heartbeat()
    return out
