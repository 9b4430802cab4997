"""`runhealth collect`: the collector alone, headless, until told to stop.

Runs one `Collector` per live run (a `[[runs]]` file may have several), each into its run's
store, and follows the config file like the dashboard
does: when its (mtime, size) changes the file is loaded again and the collector restarted with
the new nodes (the store kept when its path is unchanged). A config that no longer loads is
reported and the running collector keeps going, so a typo never stops collection.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from runhealth import runs
from runhealth.collector import Collector
from runhealth.config import RunConfig, RunContext
from runhealth.errors import ConfigError, RunhealthError
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


def _start(
    configs: list[RunConfig],
    context: RunContext,
    stores: dict[Path, Store],
    metrics_port: int | None = None,
    metrics_address: str | None = None,
) -> tuple[list[Collector], dict[Path, Store], Outbound]:
    """A collector per live run, each into its own store (kept from `stores` when its path is
    unchanged; the stores of runs no longer configured are closed); /metrics (every run on the
    first run's port) and webhooks for every live run."""
    kept: dict[Path, Store] = {}
    collectors = []
    for config in configs:
        path = config.resolved_store_path()
        store = kept[path] = stores.pop(path) if path in stores else Store(path)
        collector = Collector(config, store, context=context)
        collector.start()
        collectors.append(collector)
    for old in stores.values():
        old.close()
    first = configs[0]
    outbound = start_outbound(
        [(c, kept[c.resolved_store_path()]) for c in configs], metrics_port, metrics_address, context=context
    )
    where = f"; /metrics on {outbound.metrics_url}" if outbound.metrics_url else ""
    for config in configs:
        _log(
            f"collecting {len(config.nodes)} node(s) of {config.name} every {config.interval_s:g} s into "
            f"{config.resolved_store_path()} (config {context.source}){where if config is first else ''}; "
            "stop with SIGTERM or Ctrl-C"
        )
    for notice in outbound.notices:
        _log(notice)
    return collectors, kept, outbound


def live_runs(path: Path) -> list[RunConfig]:
    """The runs of the file that are polled (`[[runs]]` with finished = true are not)."""
    configs = [e.config for e in runs.load_runs(path) if not e.finished]
    if not configs:
        raise ConfigError(f"{path}: every run is finished: nothing to collect")
    return configs


def run_collector(
    path: Path, stop: threading.Event, metrics_port: int | None = None, metrics_address: str | None = None
) -> None:
    """Collect until `stop` is set; raises RunhealthError when the first config cannot start.

    `metrics_port`/`metrics_address` (the command line) win over `[run] metrics_port`/`_address`.
    """
    path = path.expanduser().absolute()
    seen = file_signature(path)
    context = RunContext.for_file(path)
    collectors, stores, outbound = _start(live_runs(path), context, {}, metrics_port, metrics_address)
    try:
        while not stop.wait(CHECK_EVERY_S):
            now = file_signature(path)
            if now == seen:
                continue
            seen = now
            try:
                configs = live_runs(path)
            except RunhealthError as exc:
                _log(f"config changed but does not load, still collecting with the previous one: {exc}")
                continue
            outbound.stop()  # frees the /metrics port for the restarted exporter
            for collector in collectors:
                collector.stop()
            _log("config changed: restarting the collector")
            collectors, stores, outbound = _start(configs, context, stores, metrics_port, metrics_address)
    finally:
        outbound.stop()
        for collector in collectors:
            collector.stop()
        for store in stores.values():
            store.close()
