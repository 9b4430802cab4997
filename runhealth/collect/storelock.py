"""The store's collector lock: one writing process per store, whatever is deleted under it.

The lock is an `flock` on `<store>.collector.lock`. An flock belongs to the open file, not to its
name: `rm <store>.collector.lock` (or `rm store.sqlite3*`, a tmp cleaner, a user "starting
afresh") let a second collector create a new file there and lock it while the first still
wrote. So a lock is taken as lock files usually are (lock, then check that the file locked is
still the one at the path, else again), and a process that wins the flock also reads the status
the collecting process records in the store (runhealth.heartbeat): a live collector on
this host that has not stopped still holds the store, its lock file gone, and the newcomer is
refused naming its pid. The holder `check`s its lock file before every write to the store (one
stat: `StoreFile.writer_check`) and every half second: replaced or deleted, it locks the file
at the path again when it can (and says so: a log line and a run event on the charts), or it
stops writing and the process exits non-zero saying who holds the store now.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sqlite3
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, TextIO

from runhealth import heartbeat, textsafe
from runhealth.errors import StoreBusyError, StoreError
from runhealth.store import storefile

log = textsafe.get_logger(__name__)
SUFFIX = ".collector.lock"
ATTEMPTS = 10  # lock files replaced this often while locking: give up (someone is playing with it)
STOP = "stop it first, or set [run] store_path to another file"


def lock_path(store_path: str | Path) -> Path:
    return Path(f"{store_path}{SUFFIX}")


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def _lock_file(path: Path, store_path: Path) -> TextIO:
    """The lock file at `path`, flocked, and still the file at `path` once locked.

    Raises:
        StoreBusyError: another process holds it (the message names it, from the file).
    """
    for _ in range(ATTEMPTS):
        lock_file = storefile.open_private(path, "a+")  # "a+": the holder's pid stays
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            raise StoreBusyError(
                f"another runhealth process is already collecting into {store_path} ({_holder(path)}): {STOP}"
            ) from None
        if _ident(lock_file.fileno()) == storefile.file_id(path):
            return lock_file
        lock_file.close()  # unlinked or replaced between the open and the lock: lock the one there now
    raise StoreError(f"the collector lock file {path} was replaced {ATTEMPTS} times while runhealth locked it")


def _recorded_status(store_path: Path) -> Any:
    """The collector status recorded in the store (None: no store, no status, or unreadable).
    Read-only: it never creates or changes the store."""
    if not store_path.exists():
        return None
    uri = f"file:{urllib.parse.quote(os.fspath(store_path))}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (heartbeat.STATUS_KEY,)).fetchone()
    except sqlite3.Error:
        return None  # opening the store says what is wrong with it
    return heartbeat.parse_status(row[0]) if row else None


def live_holder(store_path: Path, now: float | None = None) -> str | None:
    """Who still collects into the store although this process won its lock: a collector on this
    host whose status is recent, not stopped, and whose pid is alive (its lock file was
    deleted or replaced under it). None: nobody."""
    status = _recorded_status(store_path)
    if status is None or status["pid"] == os.getpid() or status["host"] != socket.gethostname():
        return None
    now = time.time() if now is None else now
    if status["stopped_unix"] is not None or now - status["written_unix"] > heartbeat.silent_after_s(0):
        return None
    if heartbeat.pid_gone(status):
        return None
    return f"pid {status['pid']} on {status['host']}"


class StoreLock:
    """This process's hold on a store's collector lock; `check` before writing."""

    def __init__(self, store_path: Path, lock_file: TextIO):
        self.store_path, self.path = store_path, lock_path(store_path)
        self._file: TextIO | None = lock_file
        self._id = _ident(lock_file.fileno())
        self._relock = threading.Lock()
        self.lost: str | None = None  # why this process may no longer write the store
        self.events: list[dict[str, Any]] = []  # re-locks not yet recorded as run events
        _say_pid(lock_file)

    @classmethod
    def acquire(cls, store_path: Path) -> StoreLock:
        """Lock the store for this process.

        Raises:
            StoreBusyError: another process holds the lock, or still collects into the store
                although its lock file was deleted (the message names its pid).
        """
        lock_file = _lock_file(lock_path(store_path), store_path)
        holder = live_holder(store_path)
        if holder is not None:
            lock_file.close()
            raise StoreBusyError(
                f"another runhealth process is already collecting into {store_path} ({holder}; its lock file "
                f"{lock_path(store_path)} was deleted or replaced under it): {STOP}"
            )
        return cls(store_path, lock_file)

    def check(self) -> None:
        """Raise StoreBusyError once this process no longer holds the store; one stat when it does.

        A lock file deleted or replaced under this process is locked again at the path when no
        one else holds it there (recorded in `events`); when another process does, the lock is
        lost for good and every later check raises.
        """
        if self.lost is not None:
            raise StoreBusyError(self.lost)
        if self._file is None or storefile.file_id(self.path) == self._id:
            return
        with self._relock:
            if self.lost is None and self._file is not None and storefile.file_id(self.path) != self._id:
                self._take_again()
        if self.lost is not None:
            raise StoreBusyError(self.lost)

    def _take_again(self) -> None:
        how = "deleted" if storefile.file_id(self.path) is None else "replaced"
        try:
            lock_file = _lock_file(self.path, self.store_path)
        except StoreBusyError:
            self.lost = (
                f"this process (pid {os.getpid()}) stopped collecting into {self.store_path}: its lock file "
                f"{self.path} was {how} while it collected, and another process ({_holder(self.path)}) locked "
                "the store meanwhile; that one writes it now, this one wrote nothing more"
            )
            log.error("%s", self.lost)
            return
        except (OSError, StoreError) as exc:  # e.g. its folder is gone too: tried again at the next check
            log.warning("the collector lock file %s was %s and cannot be made again yet: %s", self.path, how, exc)
            return
        assert self._file is not None
        self._file.close()
        self._file, self._id = lock_file, _ident(lock_file.fileno())
        _say_pid(lock_file)
        log.warning(
            "the collector lock file %s was %s while this process (pid %d) collected into %s: it locked a new one"
            " there, so a second collector is still refused",
            self.path,
            how,
            os.getpid(),
            self.store_path,
        )
        self.events.append({"how": how, "pid": os.getpid(), "path": str(self.path)})

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # releases the flock
            self._file = None


def _holder(path: Path) -> str:
    """The holder a lock file names ("pid 123 on host"), as its holder wrote it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(200).strip() or "pid unknown"
    except OSError:
        return "pid unknown"


def _say_pid(lock_file: TextIO) -> None:
    lock_file.truncate(0)
    lock_file.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock_file.flush()


def check_store_free(store_path: Path) -> None:
    """Raise StoreBusyError when another process collects into the store (a check: the lock is
    let go at once, so a caller can refuse a restart before stopping anything). A lock file that
    cannot be opened (no folder yet) is no answer: opening the store says what is wrong."""
    try:
        StoreLock.acquire(store_path).release()
    except OSError:
        return
