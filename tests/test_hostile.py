"""Faults found by hostile testing (issue #12), each with real processes, files and filesystems.

Every scenario here made the collector stop, hang or go quiet while the screen still looked
normal before its fix; each test reproduces the fault for real and checks what the operator
now sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from runhealth.store import Store

pytestmark = pytest.mark.faults


def wait_for(predicate, timeout_s=30.0, step_s=0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return False


def hold_write_lock(path, seconds: float) -> subprocess.Popen:
    """Another process (as the sqlite3 shell or a backup would) holding the write lock."""
    code = ("import sqlite3, sys, time\n"
            "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "db.execute('BEGIN IMMEDIATE')\n"
            "print('held', flush=True)\n"
            "time.sleep(float(sys.argv[2]))\n"
            "db.execute('ROLLBACK')\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


# ---------------------------------------------------------------------------- 1: write lock
def test_a_write_that_times_out_on_a_busy_store_does_not_block_later_writes(tmp_path):
    store = Store(tmp_path / "s.sqlite3", busy_timeout_s=0.2)
    holder = hold_write_lock(store.path, 1.0)
    try:
        with pytest.raises(Exception, match="locked"):
            store.record_failure("n1", "first", time.time())
    finally:
        holder.wait(timeout=10)
    done = threading.Event()

    def later_write():
        store.record_failure("n1", "second", time.time())
        done.set()

    threading.Thread(target=later_write, daemon=True).start()
    assert done.wait(5), "the write lock leaked: a later write never ran"
    assert store.nodes()[0]["last_error"] == "second"
