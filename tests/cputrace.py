"""Per-test CPU of a pytest worker's process tree (RUNHEALTH_TEST_CPU=FILE; off by default).

On two cores the suite's time is its CPU: a test that waits on a server or a browser still
costs the CPU those burn. Each test's line in FILE is the CPU seconds (user + system) its
worker, and every process under it (sshd, streamlit servers, Chromium, reaped children
included), spent from its setup to its teardown: where the suite's time goes, so it is cut
where it is spent. Read from /proc (Linux); a test's figure includes what its worker's
session fixtures (the demo server, its collector) burnt meanwhile.
"""

from __future__ import annotations

import os
import time

import pytest

_TICK = os.sysconf("SC_CLK_TCK")
_OUT = os.environ.get("RUNHEALTH_TEST_CPU")  # read at import: the hermetic session drops RUNHEALTH_*


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its descendants (their reaped children included)."""
    parent: dict[int, int] = {}
    spent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(name)] = int(fields[1])
        spent[int(name)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        total += spent.get(pid, 0)
        todo += children.get(pid, [])
    return total / _TICK


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = _OUT
    if not out:
        yield
        return
    before, wall = tree_cpu_s(os.getpid()), time.monotonic()
    yield
    cpu, wall = tree_cpu_s(os.getpid()) - before, time.monotonic() - wall
    with open(out, "a") as f:
        f.write(f"{cpu:.2f}\t{wall:.2f}\t{os.environ.get('PYTEST_XDIST_WORKER', '-')}\t{item.nodeid}\n")
