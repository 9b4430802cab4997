"""`runhealth collect`: the collector alone, headless, until told to stop.

Runs one `Collector` into the config's store and follows the config file like the dashboard
does: when its (mtime, size) changes the file is loaded again and the collector restarted with
the new nodes (the store kept when its path is unchanged). A config that no longer loads is
reported and the running collector keeps going, so a typo never stops collection.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from runhealth.collector import Collector
from runhealth.config import RunConfig, RunContext, load_config
from runhealth.errors import RunhealthError
from runhealth.outbound import Outbound, start_outbound
from runhealth.store import Store

CHECK_EVERY_S = 1.0


def file_signature(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size)


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _start(config: RunConfig, context: RunContext, store: Store | None, metrics_port: int | None = None,
           metrics_address: str | None = None) -> tuple[Collector, Store, Outbound]:
    path = config.resolved_store_path()
    if store is None or store.path != path:
        if store is not None:
            store.close()
        store = Store(path)
    collector = Collector(config, store, context=context)
    collector.start()
    outbound = start_outbound(config, store, metrics_port, metrics_address, context=context)
    where = f"; /metrics on {outbound.metrics_url}" if outbound.metrics_url else ""
    _log(f"collecting {len(config.nodes)} node(s) of {config.name} every {config.interval_s:g} s into {store.path}"
         f" (config {context.source}){where}; stop with SIGTERM or Ctrl-C")
    for notice in outbound.notices:
        _log(notice)
    return collector, store, outbound


def run_collector(path: Path, stop: threading.Event, metrics_port: int | None = None,
                  metrics_address: str | None = None) -> None:
    """Collect until `stop` is set; raises RunhealthError when the first config cannot start.

    `metrics_port`/`metrics_address` (the command line) win over `[run] metrics_port`/`_address`.
    """
    path = path.expanduser().absolute()
    seen = file_signature(path)
    context = RunContext.for_file(path)
    collector, store, outbound = _start(load_config(path), context, None, metrics_port, metrics_address)
    try:
        while not stop.wait(CHECK_EVERY_S):
            now = file_signature(path)
            if now == seen:
                continue
            seen = now
            try:
                config = load_config(path)
            except RunhealthError as exc:
                _log(f"config changed but does not load, still collecting with the previous one: {exc}")
                continue
            outbound.stop()  # frees the /metrics port for the restarted exporter
            collector.stop()
            _log("config changed: restarting the collector")
            collector, store, outbound = _start(config, context, store, metrics_port, metrics_address)
    finally:
        outbound.stop()
        collector.stop()
        store.close()
