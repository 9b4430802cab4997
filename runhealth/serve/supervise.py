"""`runhealth dashboard`'s two processes, started and stopped together.

The collector (`python -m runhealth collect ...`) starts first and says when it is running
(one byte on a pipe); then Streamlit starts as a pure viewer. SIGTERM, SIGINT or SIGHUP to the
launcher, or the exit of either child, ends both; each child also gets SIGTERM from the kernel
if the launcher dies without a word (PR_SET_PDEATHSIG), so no collector is left behind. The port
is checked before anything starts: a busy port is one clear error, not a URL that serves
someone else's page.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

READY_WAIT_S = 120.0  # the demo fills its finished run's history first
STOP_WAIT_S = 15.0
PR_SET_PDEATHSIG = 1


def port_problem(port: int, address: str) -> str | None:
    """Why `address:port` cannot be served (None when it is free)."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"cannot serve on {address}:{port}: {exc.strerror or exc}"
    family, kind, _proto, _name, sockaddr = infos[0]
    with socket.socket(family, kind) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tornado binds
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            return f"cannot serve on {address}:{port}: {exc.strerror or exc} (pass --port or set STREAMLIT_SERVER_PORT)"
    return None


def _die_with_parent(death_signal: int = signal.SIGTERM) -> None:
    """In the child: `death_signal` when the launcher goes, however it goes (Linux; elsewhere a
    no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, death_signal)


def spawn(
    argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = (), death_signal: int = signal.SIGTERM
) -> subprocess.Popen:
    """`argv` as a child that gets `death_signal` when the launcher dies: SIGTERM for the collector
    (it records a clean stop), SIGKILL for the viewer, which holds nothing to save and was seen
    still serving 14 min after a launcher killed during its start (SIGTERM not yet handled)."""
    return subprocess.Popen(  # noqa: PLW1509
        argv, env=env, pass_fds=pass_fds, preexec_fn=functools.partial(_die_with_parent, death_signal)
    )


def start_collector(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start the collector with `--ready-fd N` appended; return once it said ready (or exited,
    or READY_WAIT_S passed: the viewer then starts anyway and shows what the stores hold)."""
    return start_collector_said(argv, env)[0]


def start_collector_said(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`start_collector`, and what the collector said: "collecting", "viewer" (another process
    collects into its store; it takes over when that one stops), "waiting" (its config does not
    load yet), or "" (it exited, or said nothing within READY_WAIT_S)."""
    read_fd, write_fd = os.pipe()
    try:
        proc = spawn([*argv, "--ready-fd", str(write_fd)], env, pass_fds=(write_fd,))
    finally:
        os.close(write_fd)
    said = b""
    try:
        if select.select([read_fd], [], [], READY_WAIT_S)[0]:  # a word, or EOF when it exits
            said = os.read(read_fd, 64)
    finally:
        os.close(read_fd)
    return proc, said.decode(errors="replace")


def supervise(children: dict[str, subprocess.Popen]) -> int:
    """Wait until a signal arrives or a child exits; then stop every child. Returns the exit code
    (0 after a signal, else the code of the child that ended)."""
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    code = 0
    while not stopping:
        ended = [(name, p) for name, p in children.items() if p.poll() is not None]
        if ended:
            name, proc = ended[0]
            code = proc.returncode or 0
            print(f"runhealth dashboard: {name} exited ({code}); stopping", file=sys.stderr, flush=True)
            break
        time.sleep(0.2)
    stop_all(list(children.values()))
    return code


def stop_all(children: list[subprocess.Popen]) -> None:
    """SIGTERM every child still running, SIGKILL those that do not go within STOP_WAIT_S."""
    for proc in children:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_WAIT_S
    for proc in children:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_dashboard(
    viewer: tuple[list[str], dict[str, str]],
    collector: tuple[list[str], dict[str, str]] | None,
    announce: Callable[[str], None],
) -> int:
    """Start the collector (if any), then the viewer; `announce(state)` prints the URL in
    between, with what the collector said (`start_collector_said`; "" without one)."""
    children: dict[str, subprocess.Popen] = {}
    said = ""
    try:
        if collector is not None:
            proc, said = start_collector_said(*collector)
            children["the collector"] = proc
            if proc.poll() is not None:
                print("runhealth dashboard: the collector did not start (its error is above)", file=sys.stderr)
                return proc.returncode or 2
            viewer[1]["RUNHEALTH_COLLECTOR_PID"] = str(proc.pid)
        announce(said)
        children["streamlit"] = spawn(*viewer, death_signal=signal.SIGKILL)
        return supervise(children)
    finally:
        stop_all(list(children.values()))
