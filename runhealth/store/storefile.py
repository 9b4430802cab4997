"""The history store's file on disk: what is under its path, and what may be opened there.

store/lifecycle.py watches the file under `store_path` (deleted, truncated or replaced under a running
collector or dashboard). This module holds the file-level rules it needs:

- SQLite finds a database's write-ahead log and shared-memory index by *name* (`<path>-wal`,
  `<path>-shm`), not by the file they belong to. After `mv other.sqlite3 store.sqlite3` the
  ones at the path still belong to the replaced file (mv moves one file), and a connection
  opened on the new file would replay that log onto it and destroy it (so would any other
  process opening the path). `drop_replaced_journal` removes the old ones as soon as the
  replacement is seen, and the new file is judged on its own bytes (`precheck`: SQLite's
  immutable mode ignores any -wal beside it) before it is opened. This process's old connections keep
  their open descriptors, so they still save their log into the file they belong to (`retire`)
  before closing; SQLite itself neither checkpoints nor deletes anything by name when a
  connection whose file has moved is closed (its "database moved" check).
- A file that is not empty and not a runhealth store (another program's database, a damaged
  file), or one newer than this code, is refused untouched (`check_is_store`, `precheck`),
  before anything (even the WAL switch) is written to it.
- A store holds prompt and completion text (the `samples` table): a new one is created owner-only
  (`create_private`: the file 0600 before SQLite opens it, so its -wal/-shm, which SQLite
  creates with the database file's mode, are 0600 too; folders it makes 0700), and
  `readable_by_others` says when an existing one is not.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import urllib.parse
from pathlib import Path
from typing import TextIO, cast

from runhealth import textsafe
from runhealth.errors import StoreError
from runhealth.store import fileproblems
from runhealth.store.migrations import refuse_newer

log = textsafe.get_logger(__name__)

FileId = tuple[int, int]  # (st_dev, st_ino)
JOURNAL_SUFFIXES = ("-wal", "-shm")
# The tables every runhealth store has had since its first release (a store from before schema
# versions carries user_version 0 and these).
_CORE_TABLES = frozenset({"meta", "nodes", "shards", "length_counts"})


def file_id(path: str | Path) -> FileId | None:
    """(device, inode) of the file at `path`, None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def held_open() -> set[FileId] | None:
    """(device, inode) of every file this process holds open; None where /proc cannot say."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    held = set()
    for fd in fds:
        with contextlib.suppress(OSError):  # closed since listed
            st = os.stat(f"/proc/self/fd/{fd}")
            held.add((st.st_dev, st.st_ino))
    return held


def journal_ids(path: str | Path) -> set[FileId]:
    """The files now at `<path>-wal` and `<path>-shm` (recorded when a store is opened)."""
    ids = (file_id(f"{path}{suffix}") for suffix in JOURNAL_SUFFIXES)
    return {i for i in ids if i is not None}


def drop_replaced_journal(path: str | Path, recorded: set[FileId]) -> list[str]:
    """Unlink the `-wal`/`-shm` at `path` that belong to the file replaced there; returns their names.

    Ours are the ones this process holds open (its connections to the replaced file) and the
    ones seen when this process last connected to it (a process whose connections are all closed
    while another process still writes the old file). Any other (a log moved in together with
    the new file, or one another process made for it already) is left to the file it came with.
    """
    ours = (held_open() or set()) | recorded
    dropped = []
    for suffix in JOURNAL_SUFFIXES:
        name = f"{path}{suffix}"
        ident = file_id(name)
        if ident is not None and ident in ours:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
                dropped.append(name)
        elif ident is not None:
            log.info("%s was not opened by this process (another's, or moved in with %s): left as it is", name, path)
    return dropped


def retire(db: sqlite3.Connection, wait_s: float = 1.0) -> None:
    """Close a connection to a file no longer under the store's path, its log saved into that file.

    The checkpoint goes through the connection's own descriptors, so it reaches the file the log
    belongs to (renamed aside it keeps its last writes; unlinked, nothing is lost that still had
    a name). A reader in another thread (a page's, the alerts') keeps the frames after its
    snapshot in the log: the checkpoint is tried again for up to `wait_s` until every frame is in
    the file (each try never waits on a lock), then the connection is closed as it is.
    """
    deadline, pause = time.monotonic() + wait_s, threading.Event()
    while True:
        try:
            _busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error:
            log.debug("checkpoint of the replaced store failed", exc_info=True)
            break
        if frames < 0 or copied >= frames or time.monotonic() >= deadline:
            break
        pause.wait(0.02)  # not time.sleep: it fails under libfaketime after a step back
    with contextlib.suppress(sqlite3.Error):
        db.close()


PRIVATE_FILE_MODE, PRIVATE_DIR_MODE = 0o600, 0o700


def create_private(path: str | Path) -> None:
    """Make the folders up to `path` (new ones 0700) and an empty file there (0600) if none is.

    An existing file or folder keeps its mode (the Nodes page says when a store is readable by
    others: `readable_by_others`); only what this call creates is made owner-only.
    """
    path = Path(path)
    missing = [p for p in reversed(path.parents) if not p.exists()]
    for folder in missing:
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            folder.mkdir(mode=PRIVATE_DIR_MODE)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE))


def open_private(path: str | Path, mode: str = "w") -> TextIO:
    """`open(path, mode)` for a text mode "w", "a" or "a+", the file created owner-only (0600)
    when it does not exist yet."""
    flags = {"w": os.O_WRONLY | os.O_TRUNC, "a": os.O_WRONLY | os.O_APPEND, "a+": os.O_RDWR | os.O_APPEND}[mode]
    return cast(TextIO, open(os.open(path, flags | os.O_CREAT, PRIVATE_FILE_MODE), mode))  # noqa: SIM115


def readable_by_others(path: str | Path) -> list[str]:
    """The store file and its -wal/-shm that users other than the owner may read (group/other bits)."""
    found = []
    for name in (os.fspath(path), *(os.fspath(path) + s for s in JOURNAL_SUFFIXES)):
        try:
            mode = os.stat(name).st_mode
        except OSError:
            continue
        if mode & 0o044:
            found.append(f"{name} ({mode & 0o777:o})")
    return found


PRECHECK_RETRY_WAITS_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # 1.55 s in all before a file is refused


def precheck(path: str | Path) -> None:
    """`check_is_store` and the newer-version refusal on the file's own bytes, touching nothing.

    SQLite's immutable mode takes no lock, writes nothing and ignores any -wal/-shm beside the
    file (which may be another file's, or in use by another process): a refused file is left
    exactly as it was found.

    Raises:
        StoreError: the file is not SQLite, not a runhealth store, or newer than this code.
    """
    if not os.path.exists(path):
        return  # nothing there yet: a new store
    # No lock also means no protection from a writer: another connection checkpointing its log into
    # the file (or creating a new store's first tables) that instant can leave pages read torn, which
    # reads as "damaged" (seen once in 1,500 new stores opened by 4 threads at once). Such a file is
    # whole again a moment later: while it is in use (a log beside it) or changed during the read, a
    # refusal stands only when it holds over a few reads. A file nobody writes is refused at once.
    for wait_s in (*PRECHECK_RETRY_WAITS_S, None):
        before = _signature(path)
        db = sqlite3.connect(f"file:{urllib.parse.quote(os.fspath(path))}?immutable=1", uri=True)
        try:
            check_is_store(db, path)
            refuse_newer(db, path)
            return
        except StoreError:
            in_use = _signature(path) != before or any(os.path.exists(f"{path}{s}") for s in ("-wal", "-journal"))
            if wait_s is None or not in_use:
                raise
        finally:
            db.close()
        threading.Event().wait(wait_s)  # not time.sleep: libfaketime's sleep fails with EINVAL


def _signature(path: str | Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of `path`: what a write to it changes (None: gone)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def check_is_store(db: sqlite3.Connection, path: str | Path) -> None:
    """Refuse a file that is not empty and not a runhealth store; reads only.

    Raises:
        StoreError: the file is not an SQLite database, or holds another program's tables (or it
            cannot be read: a full disk, an I/O error, permissions; runhealth.store.fileproblems).
    """
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:  # a foreign or damaged file, or a full disk, an I/O error: told apart
        raise fileproblems.refusal(path, exc) from None
    if (version == 0 and not tables) or _CORE_TABLES <= tables:
        return  # an empty file, or a runhealth store of any version (migrate refuses a newer one)
    found = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    what = f"the tables {found}" if tables else f"no tables but user_version {version}"
    raise StoreError(
        f"history store {path} is an SQLite database but not a runhealth store (it has {what}): "
        "runhealth does not write into it. Set [run] store_path to another file, or move this one away"
    )
