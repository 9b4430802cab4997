"""What the collecting process sends out besides the store: Prometheus /metrics and alert webhooks.

`start_outbound()` is called once by whichever process collects (`runhealth collect`, or the
dashboard's runtime when it collects). Neither part can stop collection: a port already in
use or a bad webhook setting becomes a notice (a bad webhook URL is skipped, the others are
used), and the collector goes on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from runhealth import exporter, notify, webhook
from runhealth.config import RunConfig, RunContext
from runhealth.errors import ConfigError
from runhealth.store import Store

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Outbound:
    metrics_server: Any = None
    notifiers: list[notify.Notifier] = dataclasses.field(default_factory=list)  # one per live run
    notices: list[str] = dataclasses.field(default_factory=list)

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_server is None:
            return None
        host, port = self.metrics_server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def stop(self) -> None:
        for notifier in self.notifiers:
            notifier.stop()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()


def start_outbound(
    runs: Sequence[tuple[RunConfig, Store]],
    metrics_port: int | None = None,
    metrics_address: str | None = None,
    webhook_urls: list[str] | None = None,
    context: RunContext | None = None,
) -> Outbound:
    """For every live run in `runs` (config, store): serve /metrics when a port is set (argument,
    else the first run's `metrics_port`), all runs on the one port, and evaluate alerts and send
    webhooks when URLs are configured (secrets.toml or RUNHEALTH_WEBHOOK_URLS); each event names its run."""
    out = Outbound()
    if not runs:
        return out
    first = runs[0][0]
    port = metrics_port if metrics_port is not None else first.metrics_port
    address = metrics_address or first.metrics_address
    if port is not None:
        try:
            out.metrics_server = exporter.serve([store for _config, store in runs], port, address)
        except OSError as exc:
            out.notices.append(f"Prometheus /metrics not served on {address}:{port}: {exc.strerror or exc}")
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
        log.info("alert webhooks: %s", ", ".join(notify.redact(u) for u in urls))
    for notice in out.notices:
        log.warning("%s", notice)
    return out
