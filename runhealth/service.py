"""`runhealth collect`: the collector as a service, headless, until told to stop.

The one process that writes the stores: one `Collector` per live run (a `[[runs]]` file may
have several), /metrics and alert webhooks (runhealth/outbound.py). `runhealth dashboard`
starts it as a child process next to the Streamlit viewer, or it runs alone under the shipped
systemd unit. It follows its config file through `runhealth.runset.RunSet`: when the file
changes it is loaded again and the collectors restarted with the new runs (a store kept when
its path is unchanged). An edit that does not load, or whose new store cannot be opened or
claimed, is logged and the previous config keeps collecting, so a typo never stops collection.
SIGUSR1 polls every node now (the dashboard's "Refresh now").
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from runhealth import demo, runs
from runhealth.collector import Collector
from runhealth.config import RunConfig
from runhealth.errors import ConfigError, RunhealthError
from runhealth.outbound import Outbound, start_outbound
from runhealth.runset import RunSet, store_key
from runhealth.store import Store

CHECK_EVERY_S = 0.5
KEPT = "config changed but does not load, still collecting with the previous one"


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def check_live(entries: list[runs.RunEntry], source: str) -> None:
    """A config `collect` can use: at least one run is polled."""
    if not any(not e.finished for e in entries):
        raise ConfigError(f"{source}: every run is finished: nothing to collect")


def live_runs(path: Path) -> list[RunConfig]:
    """The runs of the file that are polled (`[[runs]]` with finished = true are not)."""
    entries = runs.load_runs(path)
    check_live(entries, str(path))
    return [e.config for e in entries if not e.finished]


class Service:
    """The collectors, stores and outbound of a RunSet's live runs, restarted on a good edit."""

    def __init__(self, runset: RunSet, metrics_port: int | None = None, metrics_address: str | None = None):
        self.runset = runset
        self.metrics_port, self.metrics_address = metrics_port, metrics_address
        self.collectors: list[Collector] = []
        self.stores: dict[Path, Store] = {}
        self.outbound: Outbound | None = None

    def _check(self, entries: list[runs.RunEntry]) -> None:
        check_live(entries, str(self.runset.path or self.runset.context.source))

    def start(self) -> None:
        """Load the config and start collecting. Raises RunhealthError when it cannot."""
        self.runset.reload(apply=self._apply)

    def follow(self) -> None:
        """Reload the config if the file changed; a refused edit is logged and changes nothing."""
        try:
            change = self.runset.reload(apply=self._apply)
        except ConfigError as exc:
            _log(f"{KEPT if self.collectors else 'config changed but does not load yet'}: {exc}")
            return
        if change is not None:
            _log("config changed: restarting the collector")

    def refresh(self) -> None:
        for collector in self.collectors:
            collector.request_refresh()

    def _apply(self, entries: list[runs.RunEntry]) -> None:
        """Switch to `entries`' live runs; on any failure the previous runs keep collecting."""
        self._check(entries)
        configs = [e.config for e in entries if not e.finished]
        opened = _open_new_stores(configs, self.stores)  # raises before anything is stopped
        previous = [c.config for c in self.collectors]
        self._stop_collecting()
        stores = {**self.stores, **opened}
        try:
            self._start(configs, stores)
        except RunhealthError:
            self._stop_collecting()
            for store in opened.values():
                store.close()
            if previous:
                self._start(previous, self.stores)
            raise
        for path in set(self.stores) - {store_key(c) for c in configs}:
            self.stores[path].close()  # a run no longer configured (its file stays readable)
        self.stores = {store_key(c): stores[store_key(c)] for c in configs}

    def _start(self, configs: list[RunConfig], stores: dict[Path, Store]) -> None:
        for config in configs:
            collector = Collector(config, stores[store_key(config)], context=self.runset.context)
            self.collectors.append(collector)
            collector.start()  # StoreError when another process collects into it
        self.outbound = start_outbound(
            [(c, stores[store_key(c)]) for c in configs],
            self.metrics_port,
            self.metrics_address,
            context=self.runset.context,
        )
        self._announce(configs)

    def _announce(self, configs: list[RunConfig]) -> None:
        assert self.outbound is not None
        where = f"; /metrics on {self.outbound.metrics_url}" if self.outbound.metrics_url else ""
        for i, config in enumerate(configs):
            _log(
                f"collecting {len(config.nodes)} node(s) of {config.name} every {config.interval_s:g} s into "
                f"{config.resolved_store_path()} (config {self.runset.context.source}){where if i == 0 else ''}; "
                "stop with SIGTERM or Ctrl-C"
            )
        for notice in self.outbound.notices:
            _log(notice)

    def _stop_collecting(self, final: bool = False) -> None:
        if self.outbound is not None:
            self.outbound.stop(final)  # frees the /metrics port for the restarted exporter
            self.outbound = None
        for collector in self.collectors:
            collector.stop()  # releases the store's collector lock
        self.collectors = []

    def stop(self) -> None:
        self._stop_collecting(final=True)
        for store in self.stores.values():
            store.close()
        self.stores = {}


def _open_new_stores(configs: list[RunConfig], kept: dict[Path, Store]) -> dict[Path, Store]:
    """Open the stores of `configs` not in `kept`; all or none (those opened are closed on failure)."""
    opened: dict[Path, Store] = {}
    try:
        for config in configs:
            key = store_key(config)
            if key not in kept and key not in opened:
                opened[key] = Store(config.resolved_store_path())
    except RunhealthError:
        for store in opened.values():
            store.close()
        raise
    return opened


def demo_service(metrics_port: int | None = None, metrics_address: str | None = None) -> tuple[Service, Callable]:
    """The built-in demo as a service: the simulator writes run B's shards (and serves its
    engines' /metrics), run A's history is filled once, run B is collected. Returns the service
    and a function that stops the simulator."""
    simulator = demo.live_simulator()
    if not simulator.start():
        raise RunhealthError("another runhealth process already runs the demo simulator")
    entries = [runs.RunEntry(c, f) for c, f in demo.demo_runs(metrics_port=simulator.metrics_port)]
    service = Service(RunSet(None, lambda: entries, demo.DEMO_CONTEXT), metrics_port, metrics_address)
    finished = [e.config for e in entries if e.finished]
    for config in finished:
        with contextlib.closing(Store(config.resolved_store_path())) as store:
            demo.fill_finished(config, store)
    return service, simulator.stop


def run_collector(
    path: Path | None,
    stop: threading.Event,
    metrics_port: int | None = None,
    metrics_address: str | None = None,
    refresh: threading.Event | None = None,
    wait_for_config: bool = False,
    ready: Callable[[], None] | None = None,
) -> None:
    """Collect until `stop` is set (`path` None: the built-in demo).

    Raises RunhealthError when the first config cannot start, unless `wait_for_config` (the
    dashboard's child): then the error is logged and the file followed until an edit loads.
    `metrics_port`/`metrics_address` (the command line) win over `[run] metrics_port`/`_address`.
    `refresh` set: poll every node now. `ready` is called once collection started or the first
    config error was logged.
    """
    stop_demo: Callable = lambda: None  # noqa: E731
    if path is None:
        service, stop_demo = demo_service(metrics_port, metrics_address)
    else:
        service = Service(RunSet(path), metrics_port, metrics_address)
    try:
        _first_start(service, wait_for_config)
        if ready is not None:
            ready()
        while not stop.wait(CHECK_EVERY_S):
            if refresh is not None and refresh.is_set():
                refresh.clear()
                service.refresh()
            if service.runset.changed_on_disk():
                service.follow()
    finally:
        service.stop()
        stop_demo()


def _first_start(service: Service, wait_for_config: bool) -> None:
    try:
        service.start()
    except RunhealthError as exc:
        if not wait_for_config:
            raise
        _log(f"not collecting yet (tried again when the config file changes): {exc}")
