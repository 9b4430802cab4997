"""The dashboard process's one runtime: the runs of the config file and their stores, read only.

The dashboard is a viewer: `runhealth dashboard` runs the collector as a process of its own
(`runhealth collect`, runhealth/collect/service.py) and starts this one with RUNHEALTH_COLLECTOR=off, as
does `--no-collect` next to the systemd unit. `streamlit run app.py` alone (the variable unset)
runs that same service in a thread of this process, so the demo still works with no launcher.

`get_runtime()` keeps one `runhealth.settings.runset.RunSet` per process in an `st.cache_resource`
holder and checks the config file's (path, mtime, size) on every page run: a good edit rebuilds
the runtime (stores kept when their path is unchanged); a bad one keeps the last good runtime
with `config_error` set, which every page shows as a banner (components/page.py) while it goes
on showing the last good numbers. Each live run gets an unstarted `Collector` (register=False):
the Samples page draws through its transports; "Refresh now" asks the collecting process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Protocol, cast

import streamlit as st

from runhealth import demo
from runhealth.collect import service
from runhealth.collect.collector import Collector
from runhealth.errors import ConfigError, RunhealthError
from runhealth.settings import runs
from runhealth.settings.config import RunConfig, RunContext, find_config_path
from runhealth.settings.runset import RunSet, store_key
from runhealth.store import Store

log = logging.getLogger(__name__)
COLLECTOR_ENV = "RUNHEALTH_COLLECTOR"
COLLECTOR_PID_ENV = "RUNHEALTH_COLLECTOR_PID"  # set by `runhealth dashboard`: SIGUSR1 polls now


@dataclasses.dataclass
class RunHandle:
    """One run of the process: its config, its own store, its collector (None when finished)."""

    config: RunConfig
    store: Store
    collector: Collector | None = None
    finished: bool = False
    access_known: bool = True  # False: a retired run whose store does not record its allowed_users


@dataclasses.dataclass
class Runtime:
    """What every page reads from. `config_error`: the latest edit of the config was refused; with
    `config` set this is the last good runtime (pages show it under a banner), else nothing loaded."""

    config: RunConfig | None
    store: Store | None
    collector: Collector | None = None
    demo: bool = False  # context.demo, kept as its own field for the pages
    context: RunContext = dataclasses.field(default_factory=RunContext)  # where the config came from
    config_error: str | None = None
    notice: str | None = None  # why this process is not collecting, when it is not
    config_path: Path | None = None  # the file loaded, absolute; None: the built-in demo
    signature: tuple | None = None  # config_signature() when built: a change means rebuild
    follows_file: bool = False  # held by get_runtime(), which rebuilds it when the file changes
    stored_only: bool = False  # the file never loaded: its runs as found from their stores, read-only
    # Every run (runhealth.settings.runs); config/store/collector above are the one this page shows
    # (components.runpicker), the first live run until a user picks another.
    runs: list[RunHandle] = dataclasses.field(default_factory=list)


class PageRuntime(Protocol):
    """What a page's render(rt) reads: a runtime whose config loaded (app.py stops before any
    page when it did not), so config and store are never None here."""

    @property
    def config(self) -> RunConfig: ...
    @property
    def store(self) -> Store: ...
    @property
    def collector(self) -> Collector | None: ...
    @property
    def demo(self) -> bool: ...
    @property
    def runs(self) -> list[RunHandle]: ...


def ready(rt: Runtime) -> PageRuntime:
    """`rt` as a page sees it; only for a runtime whose config loaded (page.setup checked)."""
    if rt.config is None or rt.store is None:
        raise ValueError(f"no run to show: {rt.config_error or 'no run configured'}")
    return cast(PageRuntime, rt)


def collecting() -> bool:
    return os.environ.get(COLLECTOR_ENV, "on").lower() not in ("off", "0", "false", "no")


def config_signature(path: Path | None) -> tuple | None:
    """What identifies one version of the config file: path, mtime and size (None: demo)."""
    if path is None:
        return None
    try:
        info = path.stat()
    except OSError:
        return (str(path), None, None)
    return (str(path), info.st_mtime_ns, info.st_size)


def build_runtime() -> Runtime:
    """A runtime for the config found now (see `runhealth.settings.config.find_config_path`)."""
    return build_runtime_for(_config_path())


def _runset(path: Path | None) -> RunSet:
    """The runs this process shows: the file's, or the demo's (read only: no simulator here)."""
    if path is not None:  # a run whose entry was removed is still shown (finished, from its store)
        return RunSet(path, lambda: _with_found(runs.load_runs(path)))
    return RunSet(None, lambda: _with_found([runs.RunEntry(c, f) for c, f in demo.demo_runs()]), demo.DEMO_CONTEXT)


def _with_found(entries: list[runs.RunEntry]) -> list[runs.RunEntry]:
    return entries + runs.discover_finished(entries)


def build_runtime_for(path: Path | None, previous: Runtime | None = None) -> Runtime:
    """Load `path` (None: the demo) and open each run's store (or keep `previous`'s)."""
    runset = _runset(path)
    try:
        return _reload(runset, previous)
    except ConfigError:
        return _failed(runset, None)


def _reload(runset: RunSet, previous: Runtime | None) -> Runtime:
    """The runtime of `runset` after a reload; raises ConfigError (last good set kept) on a bad edit."""
    kept = {store_key(h.config): h.store for h in (previous.runs if previous else [])}
    opened: dict[Path, Store] = {}

    def open_stores(entries: list[runs.RunEntry]) -> None:  # all or none, before the set is accepted
        try:
            for e in entries:
                key = store_key(e.config)
                if key not in kept and key not in opened:
                    opened[key] = Store(e.config.resolved_store_path())
        except RunhealthError:
            for store in opened.values():
                store.close()
            raise

    if runset.reload(apply=open_stores) is None and not runset.entries:
        raise ConfigError(runset.error or "no run configured")  # unchanged, and it never loaded
    stores = {**kept, **opened}
    handles = [
        RunHandle(e.config, stores[store_key(e.config)], finished=e.finished, access_known=e.access_known)
        for e in runset.entries
    ]
    for h in handles:
        if not h.finished:  # draws samples through the nodes' transports; never polls
            h.collector = ViewerCollector(h.config, h.store, context=runset.context, register=False)
    shown = next((h for h in handles if not h.finished), handles[0])
    return Runtime(
        config=shown.config,
        store=shown.store,
        collector=shown.collector,
        demo=runset.context.demo,
        context=runset.context,
        config_path=runset.path,
        signature=config_signature(runset.path),
        runs=handles,
    )


def _failed(runset: RunSet, last_good: Runtime | None) -> Runtime:
    """After a refused edit: the last good runtime with the error as its banner (or the error alone)."""
    signature = config_signature(runset.path)
    if last_good is None or last_good.config is None:
        stored = _stored_runs(runset.path)
        if stored:  # a broken file at start: its runs' history from their stores, under the error
            first = stored[0]
            return Runtime(
                config=first.config,
                store=first.store,
                config_error=runset.error,
                config_path=runset.path,
                signature=signature,
                runs=stored,
                stored_only=True,
            )
        return Runtime(config=None, store=None, config_error=runset.error, config_path=runset.path, signature=signature)
    return dataclasses.replace(last_good, config_error=runset.error, signature=signature)


def _stored_runs(path: Path | None) -> list[RunHandle]:
    """The runs a config file that does not load still names, from their stores (runs.stored_runs),
    each finished: read, never polled."""
    handles = []
    for e in runs.stored_runs(path) if path is not None else []:
        try:
            handles.append(RunHandle(e.config, Store(e.config.resolved_store_path()), finished=True))
        except RunhealthError as exc:
            log.warning("stored run %s not shown: %s", e.config.name, exc)
    return handles


class ViewerCollector(Collector):
    """A run's collector as the viewer holds it: never started; "Refresh now" asks the process
    that collects (SIGUSR1 to `runhealth dashboard`'s collector, or this process's own thread)."""

    def request_refresh(self) -> None:
        holder = _holder()
        if holder.inprocess is not None:
            holder.inprocess.refresh.set()
        pid = os.environ.get(COLLECTOR_PID_ENV, "")
        if pid.isdigit():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGUSR1)


@dataclasses.dataclass
class InProcess:
    """`runhealth collect` in a thread of this process (`streamlit run app.py` alone)."""

    path: Path | None
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    refresh: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: str | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="runhealth-collect", daemon=True).start()

    def _run(self) -> None:
        try:
            service.run_collector(self.path, self.stop, refresh=self.refresh, wait_for_config=True)
        except RunhealthError as exc:  # e.g. another process already runs the demo
            self.error = f"not collecting in this process: {exc}"
            log.warning("%s", self.error)


def _config_path() -> Path | None:
    path = find_config_path()
    return path.expanduser().absolute() if path is not None else None


class _Holder:
    """The process's runs (one RunSet) and current runtime, swapped under a lock on a config change."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runset: RunSet | None = None
        self.runtime: Runtime | None = None
        self.inprocess: InProcess | None = None


@st.cache_resource(show_spinner=False, max_entries=1)
def _holder() -> _Holder:
    return _Holder()


def get_runtime() -> Runtime:
    """The runtime for the config as it is on disk now (rebuilt after a good edit; after a bad
    one the last good runtime, its `config_error` naming the file and the error)."""
    holder = _holder()
    path = _config_path()
    with holder.lock:
        old = holder.runtime
        if old is not None and old.config_path == path and old.signature == config_signature(path):
            return old
        if holder.runset is None or holder.runset.path != path:
            holder.runset, old = _runset(path), None  # another file: nothing of the old one is kept
            _follow_in_process(holder, path)
        try:
            new = _reload(holder.runset, old)
            _close_dropped(old, new)
        except ConfigError:
            new = _failed(holder.runset, old)
        if holder.inprocess is not None and holder.inprocess.error:
            new.notice = holder.inprocess.error
        new.follows_file = True
        holder.runtime = new
        return new


def _close_dropped(old: Runtime | None, new: Runtime) -> None:
    """Stop the old runtime's samplers; close the stores the new one no longer reads."""
    for h in old.runs if old is not None else []:
        if h.collector is not None:
            h.collector.stop()
        if all(n.store is not h.store for n in new.runs):
            h.store.close()


def _follow_in_process(holder: _Holder, path: Path | None) -> None:
    """With the collector on in this process, (re)start its service thread for `path`."""
    if holder.inprocess is not None:
        holder.inprocess.stop.set()
        holder.inprocess = None
    if collecting():
        holder.inprocess = InProcess(path)
        holder.inprocess.start()


def is_stale(rt: Runtime) -> bool:
    """True when `rt` follows the config file and the file changed since it was built.

    The sidebar's timed fragment asks this, so a screen nobody reloads (the standup wall) still
    switches to an edited config within seconds: it then reruns the whole page.
    """
    if not rt.follows_file:
        return False
    path = _config_path()
    return rt.config_path != path or rt.signature != config_signature(path)
