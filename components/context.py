"""The dashboard process's one runtime: config, store, collector (and the demo simulator).

`get_runtime()` keeps one runtime per process in an `st.cache_resource` holder, so however
many browser tabs are open the process holds one store and one collector, and pages never talk
to nodes themselves. With no config file it serves the built-in demo run through the same
collector and agent a real run uses. `RUNHEALTH_COLLECTOR=off` (`runhealth dashboard
--no-collect`) renders from the store alone: tests, or a viewer next to `runhealth collect`.

Every page run compares the config file's (path, mtime, size) with the runtime's: when the file
changed, was created or was fixed, the runtime is rebuilt (collector restarted with the new
nodes, the store kept when its path is unchanged), so no change to the config needs a restart.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Protocol, cast

import streamlit as st

from runhealth import demo, runs
from runhealth.collector import Collector
from runhealth.config import RunConfig, RunContext, find_config_path
from runhealth.demo import Simulator
from runhealth.errors import RunhealthError
from runhealth.outbound import Outbound, start_outbound
from runhealth.store import Store

COLLECTOR_ENV = "RUNHEALTH_COLLECTOR"


@dataclasses.dataclass
class RunHandle:
    """One run of the process: its config, its own store, its collector (None when finished)."""

    config: RunConfig
    store: Store
    collector: Collector | None = None
    finished: bool = False


@dataclasses.dataclass
class Runtime:
    """What every page reads from. `config_error` is set (and the rest None) when the config is bad."""

    config: RunConfig | None
    store: Store | None
    collector: Collector | None = None
    demo: bool = False  # context.demo, kept as its own field for the pages
    context: RunContext = dataclasses.field(default_factory=RunContext)  # where the config came from
    config_error: str | None = None
    simulator: Simulator | None = None
    notice: str | None = None  # why this process is not collecting, when it is not
    config_path: Path | None = None  # the file loaded, absolute; None: the built-in demo
    signature: tuple | None = None  # config_signature() when built: a change means rebuild
    follows_file: bool = False  # held by get_runtime(), which rebuilds it when the file changes
    outbound: Outbound | None = None  # /metrics and webhooks, served by the process that collects
    # Every run (runhealth.runs); config/store/collector above are the one this page shows
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
    def outbound(self) -> Outbound | None: ...
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
    """A runtime for the config found now (see `runhealth.config.find_config_path`)."""
    return build_runtime_for(_config_path())


def build_runtime_for(path: Path | None, previous: Runtime | None = None) -> Runtime:
    """Load `path` (None: the demo), open each run's store (or keep `previous`'s) and start collecting."""
    collect, simulator = collecting(), None
    try:
        if path is not None:
            entries = runs.load_runs(path)
            entries += runs.discover_finished(entries)
            context = RunContext.for_file(path)
        else:
            simulator = previous.simulator if previous and previous.demo else None
            if collect and simulator is None:
                simulator = demo.live_simulator()
                if not simulator.start():  # another dashboard process already simulates
                    simulator = None
            entries = [
                runs.RunEntry(c, f)
                for c, f in demo.demo_runs(metrics_port=simulator.metrics_port if simulator else None)
            ]
            context = demo.DEMO_CONTEXT
        kept = {h.store.path: h.store for h in (previous.runs if previous else [])}
        handles = [
            RunHandle(
                e.config,
                kept.get(e.config.resolved_store_path()) or Store(e.config.resolved_store_path()),
                finished=e.finished,
            )
            for e in entries
        ]
        if simulator is not None:  # this process writes the demo: run A's history too, once
            for h in handles:
                if h.finished:
                    demo.fill_finished(h.config, h.store)
    except RunhealthError as exc:
        return Runtime(
            config=None, store=None, config_error=str(exc), config_path=path, signature=config_signature(path)
        )
    shown = next((h for h in handles if not h.finished), handles[0])
    runtime = Runtime(
        config=shown.config,
        store=shown.store,
        demo=context.demo,
        context=context,
        simulator=simulator,
        config_path=path,
        signature=config_signature(path),
        runs=handles,
    )
    if collect:
        _start_collectors(runtime)
    return runtime


def _start_collectors(runtime: Runtime) -> None:
    """One collector per live run; /metrics (all of them on one port) and webhooks for every live run."""
    for h in runtime.runs:
        if h.finished:
            continue
        collector = Collector(h.config, h.store, context=runtime.context)
        try:
            collector.start()
            h.collector = collector
        except RunhealthError as exc:
            runtime.notice = f"run {h.config.name}: {exc}"
    shown = next((h for h in runtime.runs if h.store is runtime.store), None)
    if shown is not None and shown.collector is not None:
        runtime.collector = shown.collector
    live = [(h.config, h.store) for h in runtime.runs if h.collector is not None]
    if live:
        try:
            runtime.outbound = start_outbound(live, context=runtime.context)
        except RunhealthError as exc:
            runtime.notice = str(exc)


def _config_path() -> Path | None:
    path = find_config_path()
    return path.expanduser().absolute() if path is not None else None


class _Holder:
    """The process's current runtime, swapped under a lock when the config file changes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runtime: Runtime | None = None


@st.cache_resource(show_spinner=False, max_entries=1)
def _holder() -> _Holder:
    return _Holder()


def get_runtime() -> Runtime:
    """The runtime for the config as it is on disk now (rebuilt when the file changed)."""
    holder = _holder()
    path = _config_path()
    with holder.lock:
        old = holder.runtime
        if old is not None and old.config_path == path and old.signature == config_signature(path):
            return old
        if old is not None and old.outbound is not None:
            old.outbound.stop()  # frees the /metrics port and ends its webhook senders
        for h in old.runs if old is not None else []:
            if h.collector is not None:
                h.collector.stop()  # releases the store's collector lock for the new collector
        new = build_runtime_for(path, previous=old)
        if old is not None and old.simulator is not None and old.simulator is not new.simulator:
            old.simulator.stop()  # the demo is no longer shown
        new.follows_file = True
        holder.runtime = new
        return new


def is_stale(rt: Runtime) -> bool:
    """True when `rt` follows the config file and the file changed since it was built.

    The sidebar's timed fragment asks this, so a screen nobody reloads (the standup wall) still
    switches to an edited config within seconds: it then reruns the whole page.
    """
    if not rt.follows_file:
        return False
    path = _config_path()
    return rt.config_path != path or rt.signature != config_signature(path)
