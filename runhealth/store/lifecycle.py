"""The store's file and connections: opening, the replaced-file rules, migrations, transactions.

`StoreFile` opens the SQLite file (WAL) under `path`, checks it is a runhealth store and not a
newer one, and migrates it (runhealth/store/migrations.py); it watches the path (runhealth/store/storefile.py)
and reopens every thread's connection on a file deleted, truncated or replaced under a running
process, writing the run metadata and node registrations it remembers into the new one. It holds
the raw access every other part goes through (`transaction`, `query`, `cursor`). The writes
(runhealth/store/writes.py) and reads (runhealth/store/reads.py) build on it; `Store` joins them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from runhealth import textsafe
from runhealth.errors import StoreError
from runhealth.store import fileproblems, storefile
from runhealth.store.migrations import migrate, refuse_newer

log = textsafe.get_logger(__name__)
OPEN_TRIES = 5  # opens of a path whose file keeps being replaced as it is opened, before giving up


class _Moved(Exception):
    """The file under the store's path changed while a connection to it was being opened."""


class StoreFile:
    """The store's file and connections. Safe to share between threads (one connection per thread)."""

    def __init__(self, path: str | Path, busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s  # how long a write waits for another process's lock
        self._local = threading.local()
        self._write_lock = threading.Lock()
        # node -> (message, first_unix, last_unix) while polls cannot be written; in memory, since
        # the store itself may be what fails (disk full), and merged into nodes().
        self.write_failures: dict[str, tuple[str, float, float]] = {}
        # The file under the path is watched (deleted, truncated, replaced under a running
        # dashboard): then every thread's connection is reopened on a recreated store.
        self._file_id: storefile.FileId | None = None
        self._journal_ids: set[storefile.FileId] = set()  # its -wal/-shm when last connected to
        # Files this process used and let go of. SQLite shares one lock and WAL index per file
        # between a process's connections: while stale ones (other threads') are still open on
        # such a file (moved back under the path), it cannot be reopened safely.
        self._retired_ids: set[storefile.FileId] = set()
        self._refused: tuple[storefile.FileId | None, str] | None = None  # a file under the path we will not open
        self._generation = 0
        self._recreate_lock = threading.Lock()
        self._remembered: dict[tuple[str, str], Any] = {}  # what set_meta / register_node wrote
        self.incident: tuple[str, float] | None = None  # (plain words, when) after a recreation
        # Set by the process holding the store's collector lock (runhealth/collect/storelock.py):
        # called before every write and recreation, it raises StoreBusyError once that process
        # no longer holds the store (its lock file deleted and another process locked it).
        self.writer_check: Callable[[], None] | None = None
        try:
            storefile.create_private(self.path)
            with self._write_lock:
                db = self._open_file()
            self._local.db, self._local.generation = db, self._generation
        except (sqlite3.Error, OSError) as exc:
            raise fileproblems.refusal(self.path, exc) from None

    # -- plumbing ------------------------------------------------------------------------
    def _connect(self, expect: storefile.FileId | None, check: bool = False) -> sqlite3.Connection:
        """A connection to the file at the path, which must still be `expect` (the caller's look
        before) once it is open; else _Moved, before anything is written (the WAL switch writes)."""
        db = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            # SQLite opens the file by name: a file moved under the path in between (`mv`) would be
            # the one written to, unchecked, while the store goes on naming the one it expected.
            if expect is None or storefile.file_id(self.path) != expect:
                raise _Moved
            if check:  # before the WAL switch writes the file's header
                storefile.check_is_store(db, self.path)
                refuse_newer(db, self.path)
            db.row_factory = sqlite3.Row
            _enter_wal(db, self.busy_timeout_s)
            db.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            db.close()
            raise
        return db

    def _open_file(self) -> sqlite3.Connection:
        """A connection to the file now under the path, checked and migrated as at start.

        Raises:
            StoreError: the file is not a runhealth store, or one newer than this code (untouched).
        """
        for _ in range(OPEN_TRIES):
            storefile.create_private(self.path)  # (again, when it went meanwhile)
            storefile.precheck(self.path)
            ident = storefile.file_id(self.path)
            try:
                db = self._connect(ident, check=True)
            except _Moved:
                continue  # another file came under the path as it was opened: that one, checked
            try:
                _create(db, self.path)
            except BaseException:
                db.close()
                raise
            if storefile.file_id(self.path) != ident:  # moved while being set up: let go of it
                storefile.retire(db)
                continue
            self._file_id = ident  # the file this connection holds, not whatever the path names later
            self._retired_ids.discard(ident)  # ours again (no stale connection was left on it)
            self._journal_ids = storefile.journal_ids(self.path)  # the -wal/-shm this file uses now
            return db
        raise StoreError(
            f"history store {self.path} was replaced by another file each of the {OPEN_TRIES} times it was"
            " opened; it was left as it is"
        )

    def _db(self, tries: int = OPEN_TRIES) -> sqlite3.Connection:
        if self._file_changed() is not None:
            old = getattr(self._local, "db", None)
            if old is not None and self._file_id in self._retired_ids and not old.in_transaction:
                # Its file was set aside (names dropped) by another thread: this thread's connection
                # saves its log into it now, whether or not the file under the path is taken up. The
                # first thread's checkpoint stops at a snapshot this thread may have held then; when
                # the next file is refused, no new generation would retire this one. (Not inside
                # this thread's own snapshot: at its first access after it.)
                storefile.retire(old)
                self._local.db = None
            self._recreate()
        db = getattr(self._local, "db", None)
        if db is not None and getattr(self._local, "generation", 0) != self._generation:
            storefile.retire(db)  # this thread's connection still points at the old file
            db = None
        if db is None:
            try:
                db = self._connect(self._file_id)
            except _Moved:  # the path changed since the look above: the file under it is checked first
                if tries <= 1:
                    raise StoreError(f"history store {self.path} kept being replaced while it was opened") from None
                return self._db(tries - 1)
            self._local.db, self._local.generation = db, self._generation
            self._journal_ids = storefile.journal_ids(self.path)
        return db

    def check_file(self) -> tuple[str, float] | None:
        """Reopen a store deleted, truncated or replaced under us; returns `incident` (None if none).

        A file refused under the path is an incident too (its text says why), not an exception.
        """
        if self._file_changed() is not None:
            with contextlib.suppress(StoreError):
                self._recreate()
        return self.incident

    def _file_changed(self) -> str | None:
        """ "deleted", "truncated" or "replaced" when the path no longer holds the file we opened."""
        if self._file_id is None:
            return None  # still opening
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "deleted"
        except OSError:
            return None  # e.g. permissions: SQLite will say what is wrong
        if (st.st_dev, st.st_ino) != self._file_id or self._file_id in self._retired_ids:
            return "replaced"  # or moved back after a refusal: let go of, not ours to use again
        return "truncated" if st.st_size == 0 else None

    def _recreate(self) -> None:
        """Open the file now under the path as a store being opened (checks and migrations included).

        Raises:
            StoreError: that file is refused (not a runhealth store, or a newer one); it is left
                untouched and every later access retries, so a usable file put back is taken up.
        """
        with self._recreate_lock:
            reason = self._file_changed()
            if reason is None:
                return  # another thread got here first
            if self.writer_check is not None:
                self.writer_check()  # a process that lost the store's lock recreates nothing
            try:
                self._set_old_file_aside(reason)
                ident = storefile.file_id(self.path)
                if ident in self._retired_ids and ident in (storefile.held_open() or {ident}):
                    raise StoreError(
                        f"history store {self.path} is the file this process used before it was replaced: restart"
                        " runhealth to use it again (connections to it that other threads may still hold"
                        " cannot be reopened safely); it was left untouched"
                    )
                storefile.create_private(self.path)
                db = self._open_file()
            except (StoreError, sqlite3.Error, OSError) as exc:
                raise self._refuse(reason, exc) from None
            nodes_before = db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
            for (kind, key), value in self._remembered.items():
                db.execute(*_remembered_sql(kind, key, value))
            self._generation += 1
            self._refused = None
            self._local.db, self._local.generation = db, self._generation
            self._note_incident(reason, nodes_before)

    def _set_old_file_aside(self, reason: str) -> None:
        """Keep the old file's -wal/-shm (SQLite finds them by name) from the file opened next.

        Once per file let go of: while a file under the path is refused, the -wal/-shm there
        are that file's (or another process's), not ours.
        """
        if self._file_id in self._retired_ids:
            return
        if reason == "replaced":
            storefile.drop_replaced_journal(self.path, self._journal_ids)
        else:
            for suffix in ("-wal", "-shm", "") if reason == "truncated" else ("-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self.path}{suffix}")
        old = getattr(self._local, "db", None)
        if old is not None:  # after the names went: its descriptors still reach its own file
            storefile.retire(old)
            self._local.db = None
        if self._file_id is not None:
            self._retired_ids.add(self._file_id)

    def _note_incident(self, reason: str, nodes_before: int) -> None:
        when = time.strftime("%H:%M:%S", time.localtime())
        if reason == "replaced":
            text = (
                f"The history store {self.path} was replaced by another file at {when} while runhealth ran;"
                f" that file is in use now, opened as at start (it held {nodes_before} node(s)), and the replaced"
                " file's write-ahead log (-wal) was kept away from it. Each shard is counted on from the offset"
                " that file holds for it, from the start where it holds none."
            )
        else:
            text = (
                f"The history store {self.path} was {reason} at {when} while runhealth ran; a new one is in"
                " use and the counts are being rebuilt from the start of every shard."
            )
        self.incident = (text, time.time())
        log.warning("%s", text)

    def _refuse(self, reason: str, exc: BaseException) -> StoreError:
        """The error for a file under the path that cannot be opened (logged once per file)."""
        cause = str(exc) if isinstance(exc, StoreError) else fileproblems.problem(self.path, exc)
        text = f"The history store {self.path} was {reason} while runhealth ran; nothing is written to it: {cause}"
        ident = storefile.file_id(self.path)
        if self._refused != (ident, text):
            self._refused = (ident, text)
            self.incident = (text, time.time())
            log.error("%s", text)
        return StoreError(cause)

    @property
    def generation(self) -> int:
        """How many times the file under the path was opened again (deleted, truncated or
        replaced): what was read from the store before a change of it is not the file's now."""
        return self._generation

    # -- raw access ------------------------------------------------------------------------
    # Public because some tables live in this database but belong to other modules (rollup.py's
    # *_rollup, notify.py's webhook_deliveries, pagedata.py's page_data; analysis/lengthtime.py
    # reads length_hourly, which write_poll fills) and some reads have no method here
    # (exporter.py, health.py): those modules keep their SQL next to the code that gives it
    # meaning. Pages and components read through the named reads (reads.py) or those modules.
    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """`with store.transaction() as db:` a write transaction on this thread's connection.

        BEGIN IMMEDIATE under the process's write lock; COMMIT on leaving, ROLLBACK on an
        exception. Every write goes through here, so writers never interleave, and a collector
        that lost the store's lock (`writer_check`) writes nothing.
        """
        if self.writer_check is not None:
            self.writer_check()
        with self._write_lock:  # released however BEGIN, the body or COMMIT ends
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # SQLite may have rolled back already (disk full)
                    try:
                        db.execute("ROLLBACK")
                    except sqlite3.Error:
                        log.debug("rollback failed", exc_info=True)  # the first error is the one to report
                raise
            db.execute("COMMIT")

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """`with store.snapshot():` every read on this thread inside sees one commit.

        A deferred read transaction (WAL: writers go on; the reads see the database as of their
        first statement), for a screen built from many reads that must be one instant. Reads
        only: a write inside would fail. Nested, the outer snapshot holds.
        """
        db = self._db()
        if db.in_transaction:
            yield
            return
        db.execute("BEGIN")
        try:
            yield
        finally:
            if db.in_transaction:
                db.execute("COMMIT")  # nothing was written: ends the read, whatever happened inside

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """A read's rows, each a dict keyed by column name. Not for writes (see transaction)."""
        return [dict(r) for r in self.cursor(sql, params).fetchall()]

    def cursor(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        """A read's cursor (rows are sqlite3.Row: by index or name, fetched as iterated).

        For a single value (`.fetchone()[0]`) or wide rows read by position without copying each
        into a dict. Not for writes (see transaction).
        """
        return self._db().execute(sql, tuple(params))

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # -- run metadata and node registrations: remembered, written again into a recreated file --
    def set_meta(self, key: str, value: Any) -> None:
        self._remembered[("meta", key)] = value
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def meta(self, key: str, default: Any = None) -> Any:
        row = self.cursor("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def register_node(self, name: str, public_config: dict[str, Any]) -> None:
        """Make a node known (status "pending" until its first poll) with its safe config."""
        self._remembered[("node", name)] = public_config
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO nodes (name) VALUES (?)", (name,))
            db.execute("UPDATE nodes SET config = ? WHERE name = ?", (json.dumps(public_config), name))


def _enter_wal(db: sqlite3.Connection, timeout_s: float) -> None:
    """Switch `db`'s file to WAL, waiting up to `timeout_s` for another connection doing the same.

    Two connections opening a new file at once (the dashboard's reader and its in-process
    collector) both need the exclusive lock to leave rollback mode; SQLite answers the one that
    already holds a shared lock "database is locked" at once, without its busy handler (that
    wait could deadlock). Once the other switched the file, the pragma needs no lock.
    """
    deadline, pause, waited = time.monotonic() + timeout_s, 0.005, threading.Event()
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if fileproblems.primary_code(exc) not in (fileproblems.SQLITE_BUSY, fileproblems.SQLITE_LOCKED):
                raise
            if time.monotonic() >= deadline:
                raise
        waited.wait(pause)  # not time.sleep: under libfaketime's clock steps it may raise EINVAL
        pause = min(pause * 2, 0.1)


def _create(db: sqlite3.Connection, path: Path) -> None:
    """Create a new store or upgrade an older one (runhealth.store.migrations; a newer one is refused)."""
    migrate(db, path)


def _remembered_sql(kind: str, key: str, value: Any) -> tuple[str, tuple]:
    """The statement that writes a remembered set_meta / register_node again into a new store."""
    if kind == "meta":
        return "INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value))
    return (
        "INSERT INTO nodes (name, config) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET config = excluded.config",
        (key, json.dumps(value)),
    )
