"""Fail the test run when a test leaves a process running (an sshd, an agent, a browser).

Every process the tests start inherits RUNHEALTH_TEST_SESSION (set when this module is
imported, before any test runs), whoever its parent is by the end. sshd rewrites its own
environment block (setproctitle), so the mark cannot be read back from it: tests/sshd.py
records each sshd it starts with `track(pid)` (the pid with its start time, so a pid reused by
another process later is not taken for it), and a recorded sshd re-parented to init after its
test lost track of it is found either way. Nothing is matched by command line: a process of
another test run (or anyone's) that merely names a path of this session is not ours. At session
end, after every fixture's teardown, processes that carry this session's mark or were recorded
get a few seconds to exit (connections closing); any still running are listed, killed, and the
run fails.

Under pytest-xdist each worker checks for its own processes (they carry the worker's mark) and
hands the list to the controller, which reports them all and fails the run.

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
_tracked: dict[int, bytes] = {}  # pid -> its start time (field 22 of /proc/<pid>/stat)


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/<pid>/stat after the command name: [state, ppid, ..., starttime at index 19, ...]."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def track(pid: int) -> None:
    """Count `pid` as this session's even when its environment no longer says so (sshd)."""
    try:
        _tracked[pid] = _stat_fields(pid)[19]
    except (OSError, IndexError):
        pass  # already gone


def _ours(pid: int, stat: list[bytes]) -> bool:
    if _tracked.get(pid) == stat[19]:
        return True
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f"{MARK}={_session}".encode() in f.read().split(b"\0")


def marked_processes() -> dict[int, str]:
    """pid -> command line of every live process (not this one) that is this session's."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = _stat_fields(int(entry))
            if stat[0] == b"Z" or not _ours(int(entry), stat):
                continue  # Z: exited, waiting for its parent to reap it
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ")
            found[int(entry)] = cmdline.decode(errors="replace").strip()[:200]
        except (OSError, IndexError):
            continue
    return found


_from_workers: list[str] = []  # pytest-xdist: what each worker found, reported by the controller


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: a worker finished; keep the leaks it found (a worker's own
    exit status and terminal never reach the run's)."""
    _from_workers.extend(getattr(node, "workeroutput", {}).get("leaked", []))


@pytest.hookimpl(trylast=True)  # in xdist's controller: after its workers have been shut down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    deadline = time.monotonic() + GRACE_S
    left = marked_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_processes()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    found = [f"  pid {pid}: {cmd}" for pid, cmd in sorted(left.items())]
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports (pytest_testnodedown)
        workeroutput["leaked"] = found
        return
    found += _from_workers
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(found)} process(es) left running by the tests (now killed):", *found]
    if reporter:
        reporter.write_line("\n".join(lines), red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
