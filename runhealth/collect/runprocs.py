"""`runhealth collect` over several live runs: one collector process per run, one supervisor.

One process collecting every run shared its interpreter's lock between them: at 512 nodes one
run's polls, writes and page data used most of a core, and the other run's polls fell behind.
So with two or more live runs, `runhealth collect` (and the dashboard's collector, which is that
command) becomes a supervisor: it starts `runhealth collect --run NAME` per live run (each holds
its own store's lock and sends its own webhooks), serves /metrics over every live run's store
itself (one endpoint, as before: the exporter reads the stores), follows the config file (a run
added: a child started; removed or finished: its child stopped; a run's own edit is its child's
to apply), forwards SIGUSR1 ("Refresh now") to every child, and starts a child again when it
dies (after RESTART_MIN_S, doubling up to RESTART_MAX_S while it keeps dying young). No child
outlives it: SIGTERM stops them all, and each child gets SIGTERM from the kernel when the
supervisor dies however it dies (PR_SET_PDEATHSIG, runhealth/serve/supervise.py).
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runhealth.alerting.metricsauth import MetricsAccess
from runhealth.alerting.outputs import Outbound, serve_metrics
from runhealth.collect import service
from runhealth.errors import ConfigError
from runhealth.serve import launch, supervise
from runhealth.settings import runs
from runhealth.settings.config import RunConfig
from runhealth.settings.runset import RunSet, store_key
from runhealth.store import Store

RESTART_MIN_S = 1.0  # a dead child is started again after this ...
RESTART_MAX_S = 30.0  # ... doubled while it keeps dying within YOUNG_S, up to this
YOUNG_S = 60.0
CHECK_EVERY_S = 0.5


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def several_live_runs(path: Path) -> bool:
    """True when the file loads with two or more live runs (then one process per run)."""
    try:
        return len(service.live_runs(path)) >= 2
    except ConfigError:
        return False


@dataclasses.dataclass
class Child:
    """One run's collector process and its restart schedule (monotonic seconds)."""

    name: str
    proc: subprocess.Popen | None = None
    ready_fd: int | None = None
    started: float = 0.0
    due: float = 0.0  # when a dead child is started again
    backoff_s: float = RESTART_MIN_S
    restarts: int = 0


class RunProcesses:
    """The supervisor: a collector child per live run of `path`, and /metrics over their stores."""

    def __init__(
        self,
        path: Path,
        metrics_port: int | None = None,
        metrics_address: str | None = None,
        metrics_access: MetricsAccess | None = None,
        public: bool = False,
    ):
        self.runset = RunSet(path)
        self.metrics_port, self.metrics_address = metrics_port, metrics_address
        self.metrics_access = metrics_access or MetricsAccess()
        self.public = public
        self.children: dict[str, Child] = {}
        self.metrics: Outbound | None = None
        self._metrics_key: list[RunConfig] | None = None
        self._stores: dict[Path, Store] = {}
        self._lock = threading.Lock()

    # -- the config ---------------------------------------------------------------------------
    def start(self) -> None:
        """Load the config, serve /metrics and start a child per live run (ConfigError: it does not load)."""
        self.runset.reload(apply=self._apply)

    def follow(self) -> None:
        """The file changed: start and stop children to match (a bad edit is logged, nothing changes)."""
        before = {c.name for c in self.runset.live}
        try:
            change = self.runset.reload(apply=self._apply)
        except ConfigError as exc:
            _log(f"{service.KEPT}: {exc}")
            return
        if change is None or not before:
            return
        if change.empty:
            _log("config file rewritten with the same runs: nothing restarted")
            return
        live = {c.name for c in self.runset.live}
        gone, new = (before - live) | (set(change.changed) & before), (live - before) | (set(change.changed) & live)
        # a changed run is restarted by its own process, which follows the file too
        _log(
            f"config changed: restarted {service.restarted_names(gone, new)}; {len(live - new)} unchanged run(s) went on"
        )

    def _apply(self, entries: list[runs.RunEntry]) -> None:
        service.check_live(entries, str(self.runset.path))
        service.record_finished_rules(entries)
        live = [e.config for e in entries if not e.finished]
        self._serve_metrics(live)
        names = [c.name for c in live]
        for name in [n for n in self.children if n not in names]:
            _log(f"run {name} is no longer live in the config: its collector process stops")
            self._stop_child(self.children.pop(name))
        for name in [n for n in names if n not in self.children]:
            self.children[name] = child = Child(name)
            self._spawn(child)

    def _serve_metrics(self, live: list[RunConfig]) -> None:
        """/metrics over the live runs' stores, restarted only when its stores or settings change."""
        if live == self._metrics_key:
            return
        if self.metrics is not None:
            self.metrics.stop()
        for path in set(self._stores) - {store_key(c) for c in live}:
            self._stores.pop(path).close()
        for config in live:
            if store_key(config) not in self._stores:
                self._stores[store_key(config)] = Store(config.resolved_store_path())
        pairs = [(c, self._stores[store_key(c)]) for c in live]
        self.metrics = serve_metrics(pairs, self.metrics_port, self.metrics_address, self.metrics_access)
        self._metrics_key = live
        for notice in self.metrics.notices:
            _log(notice)
        if self.metrics.metrics_url:
            _log(f"/metrics on {self.metrics.metrics_url} (every run; one collector process per run)")

    # -- the children -------------------------------------------------------------------------
    def child_command(self, name: str) -> tuple[list[str], dict[str, str]]:
        """`runhealth collect --run NAME` over the same file, told where /metrics is served."""
        assert self.runset.path is not None
        argv, env = launch.collector_command(self.runset.path, public=self.public)
        served = self.metrics.metrics_url if self.metrics else None
        off = self.metrics.metrics_off if self.metrics else None
        note = served or f"off: {off or 'not served'}"
        return [*argv, "--run", name, "--metrics-elsewhere", note, "--supervisor-pid", str(os.getpid())], env

    def _spawn(self, child: Child) -> None:
        argv, env = self.child_command(child.name)
        read_fd, write_fd = os.pipe()
        try:
            child.proc = supervise.spawn([*argv, "--ready-fd", str(write_fd)], env, pass_fds=(write_fd,))
        finally:
            os.close(write_fd)
        child.ready_fd, child.started = read_fd, time.monotonic()

    def _stop_child(self, child: Child) -> None:
        if child.proc is not None:
            supervise.stop_all([child.proc])
        self._close_ready(child)

    @staticmethod
    def _close_ready(child: Child) -> None:
        if child.ready_fd is not None:
            os.close(child.ready_fd)
            child.ready_fd = None

    def wait_ready(self, timeout_s: float = supervise.READY_WAIT_S) -> str:
        """What the children said once each said a word or exited: "collecting" when one collects,
        else "viewer" (their stores are another process's), else "waiting"."""
        said: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fds = {c.ready_fd: c for c in self.children.values() if c.ready_fd is not None}
            if not fds:
                break
            for fd in select.select(list(fds), [], [], max(0.0, deadline - time.monotonic()))[0]:
                said[fds[fd].name] = os.read(fd, 64).decode(errors="replace")
                self._close_ready(fds[fd])
        words = set(said.values())
        return next((w for w in ("collecting", "viewer", "waiting") if w in words), "")

    def check_children(self, now: float) -> None:
        """Start again each child that died (its backoff doubled when it died young)."""
        for child in self.children.values():
            proc = child.proc
            if proc is not None and proc.poll() is not None:
                self._close_ready(child)
                young = now - child.started < YOUNG_S
                child.backoff_s = min(RESTART_MAX_S, 2 * child.backoff_s) if young else RESTART_MIN_S
                child.due, child.proc = now + child.backoff_s, None
                _log(
                    f"the collector process of run {child.name} (pid {proc.pid}) exited ({proc.returncode}):"
                    f" started again in {child.backoff_s:g} s"
                )
            elif proc is None and now >= child.due:
                child.restarts += 1
                self._spawn(child)
                self._close_ready(child)  # a restarted child's word is not waited for

    def refresh(self) -> None:
        """SIGUSR1 to every child: each polls its nodes now."""
        for child in self.children.values():
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        """Stop every child (SIGTERM, SIGKILL after supervise.STOP_WAIT_S) and /metrics."""
        supervise.stop_all([c.proc for c in self.children.values() if c.proc is not None])
        for child in self.children.values():
            self._close_ready(child)
        self.children = {}
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None
        for store in self._stores.values():
            store.close()
        self._stores = {}


def run_supervisor(
    path: Path,
    stop: threading.Event,
    refresh: threading.Event,
    metrics_port: int | None = None,
    metrics_address: str | None = None,
    metrics_access: MetricsAccess | None = None,
    ready: Callable[[str], None] | None = None,
    wait_for_config: bool = False,
) -> None:
    """Supervise a collector process per live run until `stop` is set (see the module docstring).

    Raises ConfigError when the first config cannot start, unless `wait_for_config`."""
    public = metrics_access is not None and metrics_access.public
    procs = RunProcesses(path, metrics_port, metrics_address, metrics_access, public=public)
    try:
        try:
            procs.start()
        except ConfigError as exc:
            if not wait_for_config:
                raise
            _log(f"not collecting yet (tried again when the config file changes): {exc}")
        state = procs.wait_ready() if procs.children else "waiting"
        if ready is not None:
            ready(state)
        while not stop.wait(CHECK_EVERY_S):
            if refresh.is_set():
                refresh.clear()
                procs.refresh()
            if procs.runset.changed_on_disk():
                procs.follow()
            procs.check_children(time.monotonic())
    finally:
        procs.stop()
