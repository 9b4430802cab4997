"""`runhealth collect`: the collector as a service, headless, until told to stop.

The one process that writes the stores: one `Collector` per live run (a `[[runs]]` file may
have several), /metrics and alert webhooks (runhealth/alerting/outputs.py). `runhealth dashboard`
starts it as a child process next to the Streamlit viewer, or it runs alone under the shipped
systemd unit. It follows its config file through `runhealth.settings.runset.RunSet`: when the file
changes it is loaded again; the same runs again (a touch, the same content rewritten) restart
nothing, an edit restarts only the runs it changes (the others keep their agents and
connections; a store is kept when its path is unchanged), and the alerts already announced are
not sent again (their state is in the store, runhealth/alerting/notify.py). An edit that does not load,
or whose new store cannot be opened or claimed, is logged and the previous config keeps
collecting, so a typo never stops collection. A store that another process collects into is
waited for: this process writes nothing to it and tries its lock again every interval, so it
takes over when that process stops. SIGUSR1 polls every node now (the dashboard's "Refresh now").
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runhealth import demo
from runhealth.alerting.metricsauth import MetricsAccess
from runhealth.alerting.outputs import Outbound, start_outbound
from runhealth.collect import demofill
from runhealth.collect.collector import Collector, check_store_free
from runhealth.errors import ConfigError, RunhealthError, StoreBusyError, StoreLockedError
from runhealth.settings import runs
from runhealth.settings.config import RunConfig
from runhealth.settings.runset import RunSet, store_key
from runhealth.store import Store, fileproblems

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

    def __init__(
        self,
        runset: RunSet,
        metrics_port: int | None = None,
        metrics_address: str | None = None,
        metrics_access: MetricsAccess | None = None,
        metrics_elsewhere: str | None = None,
    ):
        self.runset = runset
        self.metrics_elsewhere = metrics_elsewhere  # a supervisor serves /metrics (its URL, or "off: why")
        self.metrics_port, self.metrics_address = metrics_port, metrics_address
        self.metrics_access = metrics_access  # the command line's token, TLS, --public-without-auth
        self.collectors: list[Collector] = []
        self.stores: dict[Path, Store] = {}
        self.outbound: Outbound | None = None
        # Why the last (re)start did not happen: another process holds a store's lock (None:
        # not waiting). Tried again every `retry_s` (the shortest interval of the runs).
        self.busy: str | None = None
        self.retry_s = 1.0
        self._next_retry = 0.0

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
        self.busy = None if change is not None else self.busy
        if change is not None and change.empty and self.collectors and self.metrics_elsewhere is None:
            _log("config file rewritten with the same runs: nothing restarted")

    def retry_due(self, now: float) -> bool:
        """True when collection waits for another process's store lock and a retry is due."""
        return self.busy is not None and now >= self._next_retry

    def retry(self) -> bool:
        """Try the config again (the file unchanged): True when this process now collects."""
        try:
            self.runset.reload(apply=self._apply, force=True)
        except ConfigError:
            return False  # said when it first failed; the next try comes in `retry_s`
        self.busy = None
        _log("the store is free again: this process collects now")
        return True

    def check_locks(self) -> None:
        """Each collector's store lock (a lock file deleted: locked again, said).

        Raises:
            StoreBusyError: another process took a store: this process stops (exit 2).
        """
        for collector in self.collectors:
            collector.watch_lock()

    def refresh(self) -> None:
        for collector in self.collectors:
            collector.request_refresh()

    def _apply(self, entries: list[runs.RunEntry]) -> None:
        """Switch to `entries`' live runs, restarting only the runs whose settings or nodes
        changed (the others keep their collector: agents, connections, schedule); on any
        failure the previous runs keep collecting."""
        self.busy = None
        self._check(entries)
        record_finished_rules(entries)
        configs = [e.config for e in entries if not e.finished]
        kept = [c for c in self.collectors if c.config in configs]
        stale = [c for c in self.collectors if c not in kept]
        fresh = [c for c in configs if all(k.config != c for k in kept)]
        if not stale and not fresh and [k.config for k in kept] == configs:
            return  # only finished runs changed: nothing of the collection
        try:  # a store another process collects into: refused before anything is stopped
            for config in fresh:
                if store_key(config) not in {store_key(c.config) for c in stale}:
                    check_store_free(config.resolved_store_path())
        except StoreBusyError as exc:
            self._wait_for(exc, configs)
            raise
        try:
            opened = _open_new_stores(fresh, self.stores)  # raises before anything is stopped
        except StoreLockedError as exc:
            self._wait_for(exc, configs)
            raise
        restarting = f"config changed: restarted {_names(stale, fresh)}; {len(kept)} unchanged run(s) went on"
        self._stop_outbound()
        for collector in stale:
            collector.stop()  # releases its store's lock (a changed run may keep its store)
        stores = {**self.stores, **opened}
        try:
            started = self._start_runs(fresh, stores)
        except RunhealthError as exc:
            for store in opened.values():
                store.close()
            self.collectors = kept + self._start_runs([c.config for c in stale], self.stores)
            if self.collectors:
                self._start_outbound([c.config for c in self.collectors], self.stores)
            if isinstance(exc, (StoreBusyError, StoreLockedError)):
                self._wait_for(exc, configs)
            raise
        by_name = {c.config.name: c for c in kept + started}
        self.collectors = [by_name[c.name] for c in configs]
        for path in set(self.stores) - {store_key(c) for c in configs}:
            self.stores[path].close()  # a run no longer configured (its file stays readable)
        self.stores = {store_key(c): stores[store_key(c)] for c in configs}
        self._start_outbound(configs, self.stores)
        if (kept or stale) and self.metrics_elsewhere is None:  # a supervisor's child: the supervisor says it
            _log(restarting)
        self._announce(fresh)

    def _wait_for(self, busy: StoreBusyError | StoreLockedError, configs: list[RunConfig]) -> None:
        """Collection waits for another process's store lock (its collector lock, or SQLite's held
        past the busy timeout): tried again every interval."""
        self.busy, self.retry_s = str(busy), min(c.interval_s for c in configs)
        self._next_retry = time.monotonic() + self.retry_s

    def _start_runs(self, configs: list[RunConfig], stores: dict[Path, Store]) -> list[Collector]:
        """A started collector per config; all or none (StoreError when another process
        collects into one of the stores: those started are stopped again)."""
        started: list[Collector] = []
        try:
            for config in configs:
                collector = Collector(config, stores[store_key(config)], context=self.runset.context)
                try:
                    collector.start()  # StoreBusyError (nothing written) when another process collects into it
                except (sqlite3.Error, OSError) as exc:  # a damaged store, a lock file it may not write
                    collector.stop()
                    raise fileproblems.refusal(config.resolved_store_path(), exc) from None
                started.append(collector)
        except RunhealthError:
            for collector in started:
                collector.stop()
            raise
        return started

    def _start_outbound(self, configs: list[RunConfig], stores: dict[Path, Store]) -> None:
        self.outbound = start_outbound(
            [(c, stores[store_key(c)]) for c in configs],
            self.metrics_port,
            self.metrics_address,
            context=self.runset.context,
            metrics_access=self.metrics_access,
            metrics_elsewhere=self.metrics_elsewhere,
        )

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

    def _stop_outbound(self, final: bool = False) -> None:
        if self.outbound is not None:
            self.outbound.stop(final)  # frees the /metrics port for the restarted exporter
            self.outbound = None

    def _stop_collecting(self, final: bool = False) -> None:
        self._stop_outbound(final)
        for collector in self.collectors:
            collector.stop()  # releases the store's collector lock
        self.collectors = []

    def stop(self) -> None:
        self._stop_collecting(final=True)
        for store in self.stores.values():
            store.close()
        self.stores = {}


def record_finished_rules(entries: list[runs.RunEntry]) -> None:
    """Each finished run's `allowed_users` as the config says now, into its store's run meta (#40):
    no collector claims that store any more, and a run retired from the config later is shown
    under the rule its store holds. A store that cannot be written is logged; collection goes on."""
    for entry in entries:
        path = entry.config.resolved_store_path()
        if not entry.finished or not path.is_file():
            continue
        users = list(entry.config.allowed_users)
        try:
            with contextlib.closing(Store(path)) as store:
                meta = store.meta("run")
                if isinstance(meta, dict) and meta.get("allowed_users") != users:
                    store.set_meta("run", {**meta, "allowed_users": users})
        except (RunhealthError, sqlite3.Error, OSError) as exc:
            _log(f"cannot record run {entry.config.name}'s allowed_users in {path}: {exc}")


def _names(stale: list[Collector], fresh: list[RunConfig]) -> str:
    """The runs a reload stops or starts, by name ("a (removed), b (changed), c (new)")."""
    return restarted_names({c.config.name for c in stale}, {c.name for c in fresh})


def restarted_names(gone: set[str], new: set[str]) -> str:
    """Runs stopped (`gone`) and started (`new`) by a reload: "a (removed), b (changed), c (new)"."""
    words = [f"{n} ({'changed' if n in new else 'removed'})" for n in sorted(gone)]
    return ", ".join(words + [f"{n} (new)" for n in sorted(new - gone)])


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


def one_run(path: Path, name: str) -> RunSet:
    """The runs of `path` reduced to run `name` (a supervisor's child, runhealth/collect/runprocs.py):
    the run's own edits restart it; a file without it any more is refused like a bad edit (the
    supervisor stops this process then)."""

    def load() -> list[runs.RunEntry]:
        entries = [e for e in runs.load_runs(path) if e.config.name == name]
        if not entries:
            raise ConfigError(f"{path}: no run named {name!r} any more")
        return entries

    return RunSet(path, load)


def demo_service(
    metrics_port: int | None = None,
    metrics_address: str | None = None,
    metrics_access: MetricsAccess | None = None,
) -> tuple[Service, Callable]:
    """The built-in demo as a service: the simulator writes run B's shards (and serves its
    engines' /metrics), run A's history is filled once, run B is collected. Returns the service
    and a function that stops the simulator."""
    simulator = demo.live_simulator()
    if not simulator.start():
        raise RunhealthError("another runhealth process already runs the demo simulator")
    entries = [runs.RunEntry(c, f) for c, f in demo.demo_runs(metrics_port=simulator.metrics_port)]
    runset = RunSet(None, lambda: entries, demo.DEMO_CONTEXT)
    service = Service(runset, metrics_port, metrics_address, metrics_access)
    finished = [e.config for e in entries if e.finished]
    for config in finished:
        with contextlib.closing(Store(config.resolved_store_path())) as store:
            demofill.fill_finished(config, store)
    return service, simulator.stop


def run_collector(
    path: Path | None,
    stop: threading.Event,
    metrics_port: int | None = None,
    metrics_address: str | None = None,
    refresh: threading.Event | None = None,
    wait_for_config: bool = False,
    ready: Callable[[str], None] | None = None,
    metrics_access: MetricsAccess | None = None,
    only_run: str | None = None,
    metrics_elsewhere: str | None = None,
) -> None:
    """Collect until `stop` is set (`path` None: the built-in demo; `only_run`: that run of
    `path` alone, with /metrics served `metrics_elsewhere`, as a supervisor's child).

    Raises RunhealthError when the first config cannot start, unless `wait_for_config` (the
    dashboard's child): then the error is logged and the file followed until an edit loads.
    `metrics_port`/`metrics_address`/`metrics_access` (the command line: token and TLS files,
    --public-without-auth; runhealth/alerting/metricsauth.py) win over `[run]`'s keys.
    `refresh` set: poll every node now. `ready(state)` is called once collection started
    ("collecting"), or the first config error was logged ("viewer": another process collects
    into a store, tried again every interval; "waiting": the config does not load).
    """
    stop_demo: Callable = lambda: None  # noqa: E731
    if path is None:
        service, stop_demo = demo_service(metrics_port, metrics_address, metrics_access)
    else:
        runset = RunSet(path) if only_run is None else one_run(path, only_run)
        service = Service(runset, metrics_port, metrics_address, metrics_access, metrics_elsewhere)
    try:
        _first_start(service, wait_for_config)
        if ready is not None:
            ready("collecting" if service.collectors else "viewer" if service.busy else "waiting")
        while not stop.wait(CHECK_EVERY_S):
            service.check_locks()  # raises when another process took a store: collection ends here
            if refresh is not None and refresh.is_set():
                refresh.clear()
                service.refresh()
            if service.runset.changed_on_disk():
                service.follow()
            elif service.retry_due(time.monotonic()):
                service.retry()
    finally:
        service.stop()
        stop_demo()


def _first_start(service: Service, wait_for_config: bool) -> None:
    try:
        service.start()
    except RunhealthError as exc:
        if not wait_for_config:
            raise
        if service.busy:
            _log(
                f"not collecting: {service.busy}; its lock is tried every {service.retry_s:g} s, "
                "so this process takes over collection when that one stops"
            )
        else:
            _log(f"not collecting yet (tried again when the config file changes): {exc}")
