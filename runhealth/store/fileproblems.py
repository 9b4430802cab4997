"""What an SQLite or OS error on the history store means, in words a user can act on.

A full filesystem, a failing disk, a damaged file, another program's file and a folder the
process may not write all surface as `sqlite3` errors whose text misleads ("disk I/O error" when
SQLite could not grow the `-shm` on a full disk). `problem` sorts them by SQLite's result code
(`sqlite_errorcode`, the extended code: its low byte is the primary one) and by `errno`, and
says what to do: free space (how much is free, in which folder), check the disk, move a damaged
or foreign file away, fix the permissions. `refusal` is that sentence as the `StoreError` the CLI
prints (exit 2) instead of a traceback. A leaf below the store: standard library only.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from runhealth.errors import StoreError, StoreLockedError

# SQLite's primary result codes (https://sqlite.org/rescode.html)
SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY = 3, 5, 6, 8
SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 10, 11, 13, 14, 26
# An I/O error on a filesystem with less than this free is taken for a full disk: SQLite reports
# a -shm or -wal it could not grow as SQLITE_IOERR_SHMSIZE / _WRITE, not SQLITE_FULL.
NEARLY_FULL_BYTES = 1 << 20

MOVE_AWAY = (
    "runhealth does not write into it. Move it away (runhealth then starts a new store there) "
    "or set [run] store_path to another file"
)


def primary_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of `exc` (None: not an SQLite error, or none recorded)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem holding `path` (None: unknown)."""
    folder = Path(path).parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def is_full_disk(path: str | Path, exc: BaseException) -> bool:
    """Whether `exc` is the filesystem under `path` running out of space (not a damaged store)."""
    if primary_code(exc) == SQLITE_FULL or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
        return True
    if primary_code(exc) == SQLITE_IOERR or (isinstance(exc, OSError) and exc.errno == errno.EIO):
        free = free_bytes(path)
        return free is not None and free < NEARLY_FULL_BYTES
    return False


def problem(path: str | Path, exc: BaseException) -> str:
    """One sentence: what `exc`, raised using the store at `path`, means and what to do about it."""
    folder, code, said = Path(path).parent, primary_code(exc), str(exc)
    free = free_bytes(path)
    room = f"{_size(free)} free in {folder}" if free is not None else f"free space in {folder} unknown"
    if is_full_disk(path, exc):
        return (
            f"the disk holding history store {path} is full ({room}; SQLite said: {said}): free space there "
            "(runhealth goes on where it stopped), or set [run] store_path to a file on another disk. "
            "The store was left as it was (a full disk is no sign of a damaged one)"
        )
    if code == SQLITE_IOERR or (isinstance(exc, OSError) and exc.errno == errno.EIO):
        return (
            f"disk I/O error on history store {path} ({said}; {room}): check the disk and the filesystem "
            "(dmesg, mount options). The store was not judged damaged and was left as it was"
        )
    if code == SQLITE_NOTADB:
        return f"history store {path} is not an SQLite database ({said}): {MOVE_AWAY}"
    if code == SQLITE_CORRUPT:
        return (
            f"history store {path} is damaged ({said}): {MOVE_AWAY}. "
            f"`sqlite3 {path} .recover` may save what it still holds"
        )
    if code in (SQLITE_READONLY, SQLITE_PERM, SQLITE_CANTOPEN) or isinstance(exc, PermissionError):
        return (
            f"cannot write history store {path} ({said}): runhealth writes the file and creates its -wal, "
            f"-shm and .collector.lock beside it, so this user needs write access to {folder} and the "
            "files there (check their owner and mode), or set [run] store_path to another file"
        )
    if code in (SQLITE_BUSY, SQLITE_LOCKED):
        return f"history store {path} is locked by another process ({said}): try again, or stop that process"
    return f"cannot use history store {path}: {said}"


def refusal(path: str | Path, exc: BaseException) -> StoreError:
    """`problem` as the StoreError to raise (`raise refusal(path, exc) from None`); a lock another
    connection held past the busy timeout is a StoreLockedError (worth trying again)."""
    locked = primary_code(exc) in (SQLITE_BUSY, SQLITE_LOCKED)
    return (StoreLockedError if locked else StoreError)(problem(path, exc))
