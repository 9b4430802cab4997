"""Fail the test run when a test leaves a process running (an sshd, an agent, a browser).

Every process the tests start inherits RUNHEALTH_TEST_SESSION (set when this module is
imported, before any test runs), whoever its parent is by the end. sshd rewrites its own
environment block (setproctitle), so a process whose command line names this session's
pytest temp folder (an sshd's HostKey is there) counts too: an sshd re-parented to init after
its test lost track of it is found either way. At session end, after every fixture's
teardown, processes that carry this session's mark get a few seconds to exit (connections
closing); any still running are listed, killed, and the run fails.

Used by tests/conftest.py; `pytest -p leakcheck` loads it on its own (its own test does that).
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

MARK = "RUNHEALTH_TEST_SESSION"
os.environ[MARK] = _session = uuid.uuid4().hex
GRACE_S = 5.0


def marked_processes(basetemp: str | None = None) -> dict[int, str]:
    """pid -> command line of every live process (not this one) carrying this session's mark."""
    needle = f"{MARK}={_session}".encode()
    folder = basetemp.encode() + b"/" if basetemp else None
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # exited, waiting for its parent to reap it
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ")
            if folder is None or folder not in cmdline:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle not in f.read().split(b"\0"):
                        continue
            found[int(entry)] = cmdline.decode(errors="replace").strip()[:200]
        except (OSError, IndexError):
            continue
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = str(factory.getbasetemp()) if factory is not None else None
    deadline = time.monotonic() + GRACE_S
    left = marked_processes(basetemp)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_processes(basetemp)
    if not left:
        return
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} process(es) left running by the tests (now killed):"]
    lines += [f"  pid {pid}: {cmd}" for pid, cmd in sorted(left.items())]
    if reporter:
        reporter.write_line("\n".join(lines), red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
