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
from runhealth.config import RunConfig, load_config
from runhealth.errors import RunhealthError
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


def _start(config: RunConfig, store: Store | None) -> tuple[Collector, Store]:
    path = config.resolved_store_path()
    if store is None or store.path != path:
        if store is not None:
            store.close()
        store = Store(path)
    collector = Collector(config, store)
    collector.start()
    _log(f"collecting {len(config.nodes)} node(s) of {config.name} every {config.interval_s:g} s into {store.path}"
         f" (config {config.source}); stop with SIGTERM or Ctrl-C")
    return collector, store


def run_collector(path: Path, stop: threading.Event) -> None:
    """Collect until `stop` is set; raises RunhealthError when the first config cannot start."""
    path = path.expanduser().absolute()
    seen = file_signature(path)
    collector, store = _start(load_config(path), None)
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
            collector.stop()
            _log("config changed: restarting the collector")
            collector, store = _start(config, store)
    finally:
        collector.stop()
        store.close()
