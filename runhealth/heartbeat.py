"""Whether a collector writes the run: the collecting process's status in the run's store, read back.

The collecting process records its status (`records.CollectorStatus`: pid, host, when it
started, when it last wrote, whether it stopped, what it serves) in each live run's meta under
STATUS_KEY when it starts and every HEARTBEAT_S (runhealth/alerting/outputs.py writes it). This module
reads it, and says who is at fault when the numbers stop moving (`fault`): the collector (gone,
stopped, or alive but silent, e.g. SIGSTOP: a second collector would be refused while it holds
the store's lock), not the nodes. `health.evaluate` raises it as `collector_down` in place of the
node states the collector is no longer refreshing; the Nodes page and "Refresh now" say the same.
A leaf beside the store: health, outbound and the pages import it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import sqlite3
import time
from typing import Literal, cast

from runhealth.errors import StoreError
from runhealth.records import CollectorStatus
from runhealth.store import Store

log = logging.getLogger(__name__)
STATUS_KEY = "collector"  # the run meta key of CollectorStatus
HEARTBEAT_S = 10.0  # below the shortest stale_after_s (30 s), so a live collector never reads as gone
START = "start `runhealth collect` or `runhealth dashboard`"


def read_status(store: Store) -> CollectorStatus | None:
    """The status the collecting process last recorded in `store`; None when none was (a store
    written before the status existed, or never collected into) or it is not a status."""
    try:
        got = store.meta(STATUS_KEY)
    except (StoreError, sqlite3.Error) as exc:
        log.warning("cannot read the collector's status from %s: %s", store.path, exc)
        return None
    return _status(got)


def parse_status(text: str) -> CollectorStatus | None:
    """The status from its stored JSON text (the meta row's value); None when it is not one."""
    try:
        return _status(json.loads(text))
    except ValueError:
        return None


def _status(got: object) -> CollectorStatus | None:
    keys = CollectorStatus.__required_keys__
    if not isinstance(got, dict) or not keys <= set(got) or not isinstance(got["pid"], int):
        return None
    return cast(CollectorStatus, {k: got[k] for k in keys})


def pid_gone(status: CollectorStatus) -> bool:
    """True when `status` was written on this host by a process that no longer exists."""
    if status["host"] != socket.gethostname():
        return False  # another machine's pid says nothing here
    try:
        os.kill(status["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it exists, as another user
        return False
    return _zombie(status["pid"])


def _zombie(pid: int) -> bool:
    """True when `pid` has exited and waits to be reaped (it holds no lock, writes nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def collector_alive(status: CollectorStatus | None, now: float, stale_after_s: float) -> bool:
    """Whether the process that wrote `status` still collects: it did not stop, wrote its
    heartbeat within `stale_after_s`, and (on this host) its pid exists."""
    if status is None or status["stopped_unix"] is not None:
        return False
    return now - status["written_unix"] <= silent_after_s(stale_after_s) and not pid_gone(status)


@dataclasses.dataclass(frozen=True)
class CollectorFault:
    """Why no collector refreshes the run: `kind` and one sentence naming the process."""

    kind: Literal["stopped", "exited", "silent"]
    text: str
    pid: int
    age_s: float  # since its last heartbeat


def fault(status: CollectorStatus | None, now: float, stale_after_s: float) -> CollectorFault | None:
    """The collector's fault, when the one that last wrote the run no longer does (None: it does,
    or no collector ever recorded a status here, so nothing can be said about one)."""
    if status is None or collector_alive(status, now, stale_after_s):
        return None
    who = f"The collector (pid {status['pid']} on {status['host']})"
    age = now - status["written_unix"]
    since = time.strftime("%H:%M:%S", time.localtime(status["written_unix"]))
    if status["stopped_unix"] is not None:
        return CollectorFault("stopped", f"{who} stopped at {since}: {START}.", status["pid"], age)
    if pid_gone(status):
        return CollectorFault("exited", f"{who} exited without a word after {since}: {START}.", status["pid"], age)
    silent = f"{who} has not written since {since} ({_age(age)} ago)"
    if status["host"] == socket.gethostname():
        text = (
            f"{silent} but is still there, stopped or hung: `kill -CONT {status['pid']}` or restart it"
            " (another collector would be refused while it holds the store's lock)."
        )
    else:
        text = f"{silent}: check it on {status['host']}, or {START}."
    return CollectorFault("silent", text, status["pid"], age)


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def silent_after_s(stale_after_s: float) -> float:
    """How old a status may be before its process counts as gone: the run's stale_after_s, but
    never under three heartbeats (a configured stale_after_s of 5 s must not flap between them)."""
    return max(stale_after_s, 3 * HEARTBEAT_S)
