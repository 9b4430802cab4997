"""One collector process per live run under one supervisor (issue 42 item 5).

Real `runhealth collect` processes over local shards. With two runs, the supervisor starts a
`collect --run NAME` child per run; a child killed leaves the other polling at its rate and is
started again; SIGTERM, or kill -9, of the supervisor leaves no process behind; /metrics stays
one endpoint serving both runs. Processes are found in /proc by their command line.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from test_service_follow import _run

from runhealth.collect import runprocs

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(tmp_path: Path, names: tuple[str, ...] = ("a", "b")) -> Path:
    config = tmp_path / "runhealth.toml"
    config.write_text("".join(_run(tmp_path, n) for n in names), encoding="utf-8")
    return config


def _start(config: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "runhealth", "collect", "--config", str(config), *extra]
    log = open(config.parent / "collect.log", "w")  # noqa: SIM115 - a file, not a pipe: nothing blocks
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def _procs() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, command line)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, cmd)
    return out


def children(config: Path) -> dict[str, int]:
    """The per-run collector processes of `config`: run name -> pid."""
    found = {}
    for pid, (_ppid, cmd) in _procs().items():
        m = re.search(rf"collect --config {re.escape(str(config))} .*--run (\S+)", cmd)
        if m and "<defunct>" not in cmd:
            found[m.group(1)] = pid
    return found


def leftovers(tmp_path: Path) -> list[str]:
    """Processes still running anything of this test's folder (collectors, agents)."""
    return [cmd for _ppid, cmd in _procs().values() if str(tmp_path) in cmd]


def polls_since(tmp_path: Path, name: str, since_unix: float) -> int:
    path = tmp_path / f"{name}.sqlite3"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
        return int(db.execute("SELECT COUNT(*) FROM polls WHERE ts_unix >= ?", (since_unix,)).fetchone()[0])


def wait_for(cond, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cond()


def _log(config: Path) -> str:
    return (config.parent / "collect.log").read_text()


def test_two_runs_get_a_process_each_and_one_dying_does_not_stop_the_other(tmp_path):
    config = _config(tmp_path)
    port = _free_port()
    proc = _start(config, "--metrics-port", str(port))
    try:
        wait_for(lambda: set(children(config)) == {"a", "b"})
        first = children(config)
        assert all(_procs()[pid][0] == proc.pid for pid in first.values())  # the supervisor's own
        wait_for(lambda: polls_since(tmp_path, "a", 0) > 0 and polls_since(tmp_path, "b", 0) > 0)
        # /metrics is one endpoint, the supervisor's, over both runs' stores
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'run="a"' in body and 'run="b"' in body
        os.kill(first["a"], signal.SIGKILL)
        killed = time.time()
        time.sleep(5)
        # run b went on polling at its rate (interval 1 s) while run a's process was dead
        assert polls_since(tmp_path, "b", killed) >= 3, _log(config)
        wait_for(lambda: children(config).get("a") not in (None, first["a"]))  # started again
        assert children(config)["b"] == first["b"]  # the other run's process was left alone
        restarted = time.time()
        wait_for(lambda: polls_since(tmp_path, "a", restarted) > 0)
        assert f"the collector process of run a (pid {first['a']}) exited (-9)" in _log(config)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=40)
    assert proc.returncode == 0, _log(config)
    wait_for(lambda: leftovers(tmp_path) == [], 20)


def test_a_killed_supervisor_leaves_no_collector_behind(tmp_path):
    """kill -9 gives the supervisor no chance to stop its children: the kernel does (PDEATHSIG)."""
    config = _config(tmp_path)
    proc = _start(config)
    try:
        wait_for(lambda: set(children(config)) == {"a", "b"})
        wait_for(lambda: polls_since(tmp_path, "a", 0) > 0 and polls_since(tmp_path, "b", 0) > 0)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    wait_for(lambda: leftovers(tmp_path) == [], 30)


def test_a_run_added_to_the_config_gets_its_process_and_a_removed_one_loses_it(tmp_path):
    config = _config(tmp_path)
    proc = _start(config)
    try:
        wait_for(lambda: set(children(config)) == {"a", "b"})
        kept = children(config)["a"]
        config.write_text(_run(tmp_path, "a") + _run(tmp_path, "c"), encoding="utf-8")
        wait_for(lambda: set(children(config)) == {"a", "c"})
        assert children(config)["a"] == kept  # an unchanged run is not restarted
        wait_for(lambda: polls_since(tmp_path, "c", 0) > 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=40)
    assert "run b is no longer live in the config: its collector process stops" in _log(config)
    wait_for(lambda: leftovers(tmp_path) == [], 20)


def test_one_live_run_is_collected_in_process(tmp_path):
    """A single run needs no supervisor: the file decides at start (several_live_runs)."""
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    assert not runprocs.several_live_runs(_config(tmp_path / "1", ("a",)))
    assert runprocs.several_live_runs(_config(tmp_path / "2"))
