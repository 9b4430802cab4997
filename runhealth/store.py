"""The history store: an embedded SQLite database the collector writes and pages read.

Pages never talk to nodes; they read aggregates from here, so any number of viewers costs no
SSH traffic. The database runs in WAL mode and every poll result is applied in one
transaction (shard offsets move together with the counts they produced), so a process killed
mid-write leaves either the old state or the new one: counts are never lost or doubled.
Aggregation and downsampling happen in SQL; reads return plain lists of dicts, typed by
runhealth/records.py (one TypedDict per read shape). What a poll
reply means (shard updates, node status, backfill) is runhealth/ingest.py's; this module writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from runhealth import ingest, reasonnames, storefile, textsafe
from runhealth.errors import StoreError
from runhealth.ingest import PollRecord, ShardUpdate
from runhealth.migrations import migrate, refuse_newer
from runhealth.node.wire import PollReply, ShardCursor
from runhealth.records import (
    GpuEventRow,
    GpuHealthReading,
    GpuRow,
    GpuSeriesPoint,
    GroupTotalRow,
    HostReading,
    LengthCountRow,
    LengthStopBucket,
    MetricPoint,
    MetricRow,
    NodeRow,
    PendingSampleBatch,
    PollBucket,
    PollRow,
    SampleBatch,
    ShardRow,
    rows_as,
)

log = textsafe.get_logger(__name__)


_GPU_FIELDS = ("util_pct", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w", "temp_c", "sm_clock_mhz")


class Store:
    """SQLite-backed history. Safe to share between threads (one connection per thread)."""

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
        self._reason_namer: tuple[int, reasonnames.Namer] | None = None  # (generation, namer)
        try:
            storefile.create_private(self.path)
            with self._write_lock:
                db = self._open_file()
            self._local.db, self._local.generation = db, self._generation
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open history store {self.path}: {exc}") from None

    # -- plumbing ------------------------------------------------------------------------
    def _connect(self, check: bool = False) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            if check:  # before the WAL switch writes the file's header
                storefile.check_is_store(db, self.path)
                refuse_newer(db, self.path)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
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
        storefile.precheck(self.path)
        db = self._connect(check=True)
        try:
            _create(db, self.path)
        except BaseException:
            db.close()
            raise
        self._file_id = storefile.file_id(self.path)
        self._retired_ids.discard(self._file_id)  # ours again (no stale connection was left on it)
        self._journal_ids = storefile.journal_ids(self.path)  # the -wal/-shm this file uses now
        return db

    def _db(self) -> sqlite3.Connection:
        if self._file_changed() is not None:
            self._recreate()
        db = getattr(self._local, "db", None)
        if db is not None and getattr(self._local, "generation", 0) != self._generation:
            storefile.retire(db)  # this thread's connection still points at the old file
            db = None
        if db is None:
            db = self._connect()
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
        cause = str(exc) if isinstance(exc, StoreError) else f"cannot open history store {self.path}: {exc}"
        text = f"The history store {self.path} was {reason} while runhealth ran; nothing is written to it: {cause}"
        ident = storefile.file_id(self.path)
        if self._refused != (ident, text):
            self._refused = (ident, text)
            self.incident = (text, time.time())
            log.error("%s", text)
        return StoreError(cause)

    # -- raw access ------------------------------------------------------------------------
    # Public because some tables live in this database but belong to other modules (rollup.py's
    # *_rollup, notify.py's webhook_deliveries, pagedata.py's page_data, analysis/lengthtime.py's
    # length_hourly) and some reads have no method here (exporter.py, health.py): those modules
    # keep their SQL next to the code that gives it meaning. Pages and components read through
    # the named methods below or through those modules, never through raw SQL of their own.
    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """`with store.transaction() as db:` a write transaction on this thread's connection.

        BEGIN IMMEDIATE under the process's write lock; COMMIT on leaving, ROLLBACK on an
        exception. Every write goes through here, so writers never interleave.
        """
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

    # -- run metadata ----------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._remembered[("meta", key)] = value
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def meta(self, key: str, default: Any = None) -> Any:
        row = self.cursor("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # -- writes (collector) ----------------------------------------------------------------
    def register_node(self, name: str, public_config: dict[str, Any]) -> None:
        """Make a node known (status "pending" until its first poll) with its safe config."""
        self._remembered[("node", name)] = public_config
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO nodes (name) VALUES (?)", (name,))
            db.execute("UPDATE nodes SET config = ? WHERE name = ?", (json.dumps(public_config), name))

    def shard_state(self, node: str) -> dict[str, ShardCursor]:
        """Per shard path, the inode and byte offset already counted (what the agent resumes from)
        and the content mark there (left out where the store has none)."""
        rows = self.query("SELECT path, inode, offset, mark FROM shards WHERE node = ?", (node,))
        out: dict[str, ShardCursor] = {}
        for r in rows:
            out[r["path"]] = {"inode": r["inode"], "offset": r["offset"]}
            if r["mark"] is not None:
                out[r["path"]]["mark"] = r["mark"]
        return out

    def record_poll(self, node: str, reply: dict[str, Any], ts_unix: float, rtt_ms: float | None) -> dict[str, int]:
        """`write_poll` of a raw poll reply (a wire.PollReply) as `ingest.read_poll` reads it, with
        no server metrics parsed (the collector passes them in its record); returns the deltas."""
        return self.write_poll(node, ingest.read_poll(cast(PollReply, reply)), ts_unix, rtt_ms)

    def write_poll(self, node: str, record: PollRecord, ts_unix: float, rtt_ms: float | None) -> dict[str, int]:
        """Write one successful poll in one transaction; returns the deltas it added.

        Everything the poll brings moves together: shard offsets with their length counts, the
        poll row and its length stops, the hourly length rows, GPU readings, node status and
        server metrics. A failure anywhere writes none of it.
        """
        with self.transaction() as db:
            record = ingest.with_reason_names(record, self._reasons(db).name)  # a bounded set of names
            prev = db.execute("SELECT pending_bytes, last_ok_unix FROM nodes WHERE name = ?", (node,)).fetchone()
            catching_up = bool(prev and prev[0])  # the previous poll left bytes for this one
            # The node's first poll counts history only if it read bytes that were already there.
            first_index = not (prev and prev[1] is not None) and record.scanned_bytes > 0
            delta = {"completions": 0, "tokens": 0, "length_stops": 0, "malformed": 0, "resets": 0}
            stops: dict[int, int] = {}
            applied = [u for u in record.shards if _apply_shard(db, node, u, ts_unix, delta, stops)]
            db.executemany(
                "INSERT INTO poll_length_stops VALUES (?,?,?,?)", [(ts_unix, node, t, n) for t, n in stops.items()]
            )
            backfill = ingest.is_backfill(first_index, catching_up, delta["resets"], record.pending_bytes)
            db.execute(
                "INSERT INTO polls VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    ts_unix,
                    node,
                    record.status.node_time_unix,
                    delta["completions"],
                    delta["tokens"],
                    delta["length_stops"],
                    delta["malformed"],
                    int(backfill),
                    rtt_ms,
                ),
            )
            _write_hourly(db, applied, ts_unix, backfill)
            _write_gpus(db, node, record, ts_unix)
            _write_health(db, node, record, ts_unix)
            _write_node_ok(db, node, record, ts_unix, rtt_ms)
            _write_metrics(db, node, record.server_metrics, ts_unix)
            scanned = record.scanned_bytes
            if scanned and rtt_ms and (backfill or record.pending_bytes):
                # Indexing speed as the operator lives it (bytes per second of poll round trip).
                db.execute("UPDATE nodes SET index_bytes_per_s = ? WHERE name = ?", (scanned / (rtt_ms / 1000), node))
        self.write_failures.pop(node, None)  # written again: the store is healthy for this node
        return delta

    def _reasons(self, db: sqlite3.Connection) -> reasonnames.Namer:
        """The finish-reason namer, seeded once per file with the names the store holds."""
        if self._reason_namer is None or self._reason_namer[0] != self._generation:
            stored = [r[0] for r in db.execute("SELECT DISTINCT finish_reason FROM node_length_counts")]
            self._reason_namer = (self._generation, reasonnames.Namer(stored))
        return self._reason_namer[1]

    def record_metrics(self, node: str, values: Mapping[str, float | None], ts_unix: float) -> None:
        """Server metrics on their own (tests, fixtures); a poll's are written by `write_poll`."""
        with self.transaction() as db:
            _write_metrics(db, node, values, ts_unix)

    def record_failure(self, node: str, error: str, ts_unix: float) -> None:
        """Note a failed poll; the node's counts and offsets stay as they were."""
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO nodes (name) VALUES (?)", (node,))
            db.execute(
                "UPDATE nodes SET last_error = ?, last_error_unix = ?, last_attempt_unix = ?,"
                " failing_since_unix = COALESCE(failing_since_unix, ?) WHERE name = ?",
                (error, ts_unix, ts_unix, ts_unix, node),
            )

    def note_write_failure(self, node: str, exc: BaseException, ts_unix: float) -> str:
        """Remember that `node`'s poll could not be written; returns the plain message."""
        message = write_error_text(exc)
        first = self.write_failures.get(node, (None, ts_unix))[1]
        self.write_failures[node] = (message, first, ts_unix)
        try:  # kept in the file too when the failure allows (a viewer process reads it there)
            self.record_failure(node, message, ts_unix)
        except Exception:
            log.debug("could not record the write failure either", exc_info=True)
        return message

    def new_sample_batch(self, requested_n: int, ts_unix: float | None = None) -> int:
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO sample_batches (requested_unix, requested_n) VALUES (?, ?)",
                (ts_unix or time.time(), requested_n),
            )
            assert cur.lastrowid is not None  # set by every INSERT
            return int(cur.lastrowid)

    def finish_sample_batch(
        self,
        batch: int,
        samples: list[dict[str, Any]],
        population: int,
        errors: dict[str, str],
        ts_unix: float | None = None,
    ) -> None:
        cols = (
            "node",
            "path",
            "line_no",
            "offset",
            "tokens",
            "estimated",
            "finish_reason",
            "prompt_head",
            "text_head",
            "text_tail",
            "text_chars",
            "is_loop",
        )
        with self.transaction() as db:
            db.executemany(
                f"INSERT INTO samples (batch, {', '.join(cols)}) VALUES (?{', ?' * len(cols)})",
                [(batch, *(s.get(c) for c in cols)) for s in samples],
            )
            db.execute(
                "UPDATE sample_batches SET done_unix = ?, population = ?, errors = ? WHERE batch = ?",
                (ts_unix or time.time(), population, json.dumps(errors), batch),
            )

    def prune(self, keep_s: float, now_unix: float | None = None) -> None:
        """Drop time series older than `keep_s` (counts and offsets are never pruned)."""
        cutoff = (now_unix or time.time()) - keep_s
        with self.transaction() as db:
            # metric_latest too: a metric (or node) that stopped reporting leaves with its samples.
            for table in ("gpu_samples", "metric_samples", "metric_latest"):
                db.execute(f"DELETE FROM {table} WHERE ts_unix < ?", (cutoff,))
            db.execute("DELETE FROM gpu_seen WHERE last_unix < ?", (cutoff,))  # no samples left behind it

    # -- reads (pages) ---------------------------------------------------------------------
    def nodes(self) -> list[NodeRow]:
        """Every node with its status fields; JSON columns decoded."""
        rows = self.query("SELECT * FROM nodes ORDER BY name")
        for r in rows:
            for key in ("loadavg", "unmatched_globs", "disk", "metrics_errors", "config"):
                r[key] = json.loads(r[key]) if r[key] else None
        totals = {
            r["node"]: r
            for r in self.query(
                "SELECT node, COUNT(*) AS shards, SUM(offset) AS bytes_indexed, SUM(size) AS bytes_total,"
                " SUM(lines) AS lines, SUM(malformed) AS malformed, SUM(blank_lines) AS blank_lines,"
                " SUM(error IS NOT NULL) AS shard_errors"
                " FROM shards GROUP BY node"
            )
        }
        for r in rows:
            failure = self.write_failures.get(r["name"])
            if failure is not None:
                r.update(
                    last_error=failure[0],
                    last_error_unix=failure[2],
                    store_error=failure[0],
                    failing_since_unix=r.get("failing_since_unix") or failure[1],
                )
            t = totals.get(r["name"], {})
            for key in ("shards", "bytes_indexed", "bytes_total", "lines", "malformed", "blank_lines", "shard_errors"):
                r[key] = t.get(key) or 0
        return rows_as(NodeRow, rows)

    def counted_nodes(self) -> list[NodeRow]:
        """`nodes()` less the superseded ones: the rows whose lines and malformed the run's totals add."""
        gone = self.superseded_nodes()
        return [n for n in self.nodes() if n["name"] not in gone]

    def shards(self, node: str | None = None) -> list[ShardRow]:
        sql = "SELECT * FROM shards" + (" WHERE node = ?" if node else "") + " ORDER BY node, path"
        return rows_as(ShardRow, self.query(sql, (node,) if node else ()))

    def length_counts(self, by: str = "run", finish_reason: str | None = None) -> list[LengthCountRow]:
        """Completions counted by exact length and finish reason, grouped by run, node or shard.

        Rows: {[node], [path], tokens, finish_reason (None if absent), estimated, count};
        `finish_reason` keeps only that reason's rows (e.g. "length": the few that matter for
        ceilings, instead of every length of every shard).
        """
        table = "length_counts" if by == "shard" else "node_length_counts"
        where, params = self.counted_where()
        if finish_reason:
            where, params = where + " AND finish_reason = ?", (*params, finish_reason)
        if by == "run":
            sql = (
                f"SELECT tokens, finish_reason, estimated, SUM(count) AS count FROM {table}{where}"
                " GROUP BY tokens, finish_reason, estimated"
            )
        else:  # one row per key already: the table's primary key
            keys = "node, " if by == "node" else "node, path, "
            sql = f"SELECT {keys}tokens, finish_reason, estimated, count FROM {table}{where}"
        rows = self.query(sql, params)
        for r in rows:
            r["finish_reason"] = r["finish_reason"] or None
        return rows_as(LengthCountRow, rows)

    def group_totals(self, by: str) -> list[GroupTotalRow]:
        """Per node or shard: completions counted, and how many of them have exact token counts."""
        keys = {"node": "node", "shard": "node, path"}[by]
        table = "length_counts" if by == "shard" else "node_length_counts"
        where, params = self.counted_where()
        return rows_as(
            GroupTotalRow,
            self.query(
                f"SELECT {keys}, SUM(count) AS completions, SUM(CASE WHEN estimated = 0 THEN count ELSE 0 END)"
                f" AS exact FROM {table}{where} GROUP BY {keys} ORDER BY {keys}",
                params,
            ),
        )

    def superseded_nodes(self) -> dict[str, str]:
        """Nodes no longer in the config whose files a current node reads again -> that node.

        The config's nodes are the run's meta `nodes` (the collector writes them). A removed
        node is superseded by a current one on the same host (and port) that has a shard path in
        common with it: a renamed node, whose new name counts the same files from byte 0. Its
        counts leave every total (they stay in the store: naming it back brings them back); a
        removed node whose files no current node reads keeps its counts, the run's history.
        """
        names = (self.meta("run") or {}).get("nodes")
        if not isinstance(names, list):
            return {}
        current = {str(n) for n in names}
        rows = self.query("SELECT name, config FROM nodes")
        where = {r["name"]: _host_key(r["config"]) for r in rows}
        out: dict[str, str] = {}
        for old in sorted(set(where) - current):
            for new in sorted(current & set(where)):
                if where[old] == where[new] and where[old] is not None and self._share_a_path(old, new):
                    out[old] = new
                    break
        return out

    def _share_a_path(self, a: str, b: str) -> bool:
        sql = "SELECT 1 FROM shards x JOIN shards y ON y.node = ? AND y.path = x.path WHERE x.node = ? LIMIT 1"
        return bool(self.query(sql, (b, a)))

    def counted_where(self) -> tuple[str, tuple[str, ...]]:
        """A WHERE clause on `node` that leaves out superseded nodes (always a WHERE, so a
        caller can add AND ...): every count a page, /metrics or an alert totals reads it."""
        gone = tuple(self.superseded_nodes())
        return f" WHERE node NOT IN ({','.join('?' * len(gone))})", gone

    def polls(
        self, since_unix: float | None = None, node: str | None = None, in_poll_order: bool = False
    ) -> list[PollRow]:
        """Poll rows by time; `in_poll_order`: in the order they were written (which a step of
        the collector's clock does not reorder: runhealth.activity's rates)."""
        where, params = _where(since_unix, node)
        order = "rowid" if in_poll_order else "ts_unix"
        return rows_as(PollRow, self.query(f"SELECT * FROM polls{where} ORDER BY {order}", params))

    def polls_by_bucket(self, bucket_s: float, since_unix: float | None = None) -> list[PollBucket]:
        """Poll deltas summed per time bucket (for truncation and throughput over time): over the
        bucket's live polls, or over its backfill polls when it has no live one (`live_sums`)."""
        where, params = _where(since_unix, None)
        return rows_as(
            PollBucket,
            self.query(
                f"SELECT CAST(ts_unix / ? AS INTEGER) * ? AS bucket_unix, {live_sums(POLL_DELTAS)}"
                f" FROM polls{where} GROUP BY 1 ORDER BY 1",
                (bucket_s, bucket_s, *params),
            ),
        )

    def length_stops_by_bucket(
        self, bucket_s: float, ceiling: int | None, since_unix: float | None = None
    ) -> list[LengthStopBucket]:
        """Exact-length stops per time bucket, split at `ceiling`: at_ceiling (tokens >= ceiling)
        and below_ceiling (context window and other limits below it), in a live row and, where
        backfill polls counted some, a backfill row. The page takes the row that matches
        `polls_by_bucket`'s (`live_sums`), so one node's catch-up never colours another's output."""
        where, params = _where(since_unix, None)
        limit = ceiling if ceiling is not None else 1 << 62
        head = "SELECT CAST(ts_unix / ? AS INTEGER) * ? AS b, SUM(CASE WHEN tokens >= ? THEN count ELSE 0 END),"
        head += " SUM(CASE WHEN tokens < ? THEN count ELSE 0 END) FROM poll_length_stops"
        args = (bucket_s, bucket_s, limit, limit, *params)
        total = self.query(f"{head}{where} GROUP BY 1 ORDER BY 1", args)
        # Backfill polls are few: find their stop rows (a rolled-up node-minute is backfill if any poll was).
        ids = "SELECT s.rowid FROM polls p JOIN poll_length_stops s ON s.ts_unix = p.ts_unix AND s.node = p.node"
        ids += " WHERE p.backfill = 1"
        ids += (  # polls folded by rollup.py
            " UNION SELECT s.rowid FROM poll_rollup r JOIN poll_length_stops s ON s.node = r.node"
            " AND s.ts_unix >= r.bucket_unix AND s.ts_unix < r.bucket_unix + r.res_s WHERE r.backfill = 1"
        )
        and_since = " AND ts_unix >= ?" if since_unix is not None else ""
        first = {
            r["b"]: list(r.values())[1:]
            for r in self.query(f"{head} WHERE rowid IN ({ids}){and_since} GROUP BY 1", args)
        }
        out = []
        for r in total:  # a row per (bucket, backfill) that holds stops; the live part is the rest
            at, below = list(r.values())[1:]
            back = first.get(r["b"])
            if back is not None:
                out.append({"bucket_unix": r["b"], "backfill": 1, "at_ceiling": back[0], "below_ceiling": back[1]})
                at, below = at - back[0], below - back[1]
            if back is None or at or below:
                out.append({"bucket_unix": r["b"], "backfill": 0, "at_ceiling": at, "below_ceiling": below})
        return rows_as(LengthStopBucket, out)

    def gpu_health(self) -> list[GpuHealthReading]:
        """Latest health readings per GPU (the agent's dict, decoded)."""
        rows = self.query("SELECT * FROM gpu_health ORDER BY node, gpu")
        for r in rows:
            r["health"] = json.loads(r["health"]) if r["health"] else {}
        return rows_as(GpuHealthReading, rows)

    def gpus_seen(self, since_unix: float) -> dict[str, set[int]]:
        """Per node, the GPU indexes that reported readings since `since_unix` (a GPU sample at
        or after it); read from gpu_seen, one row per GPU, kept with the samples."""
        out: dict[str, set[int]] = {}
        for r in self.query("SELECT node, gpu FROM gpu_seen WHERE last_unix >= ?", (since_unix,)):
            out.setdefault(r["node"], set()).add(r["gpu"])
        return out

    def gpu_events(self, since_unix: float) -> list[GpuEventRow]:
        return rows_as(
            GpuEventRow, self.query("SELECT * FROM gpu_events WHERE ts_unix >= ? ORDER BY ts_unix", (since_unix,))
        )

    def host_latest(self) -> dict[str, HostReading]:
        """Per node, its latest host reading (cpus, RAM and swap bytes) with ts_unix."""
        rows = self.query("SELECT * FROM host_latest")
        readings = rows_as(HostReading, [{**json.loads(r["host"]), "ts_unix": r["ts_unix"]} for r in rows])
        return {r["node"]: reading for r, reading in zip(rows, readings, strict=True)}

    def last_growth_unix(self) -> dict[str, float]:
        """Per node, the last poll (dashboard clock) that brought new completions, over all history."""
        sql = "SELECT node, MAX(ts_unix) AS ts FROM polls WHERE completions > 0 GROUP BY node"
        sql += " UNION ALL SELECT node, MAX(bucket_unix) FROM poll_rollup WHERE completions > 0 GROUP BY node"
        out: dict[str, float] = {}
        for r in self.query(sql):  # a node that wrote a day ago wrote: never "waiting for its first"
            out[r["node"]] = max(out.get(r["node"], r["ts"]), r["ts"])
        return out

    def gpu_latest(self) -> list[GpuRow]:
        rows = self.query("SELECT * FROM gpu_latest ORDER BY node, gpu")
        for r in rows:
            r["throttle_reasons"] = json.loads(r["throttle_reasons"] or "[]")
            r["processes"] = json.loads(r["processes"] or "[]")
        return rows_as(GpuRow, rows)

    def gpu_series(self, since_unix: float | None = None, max_points: int = 2000) -> list[GpuSeriesPoint]:
        """GPU time series averaged in SQL into at most `max_points` buckets per GPU."""
        where, params = _where(since_unix, None)
        span = self.cursor(f"SELECT MIN(ts_unix), MAX(ts_unix) FROM gpu_samples{where}", params).fetchone()
        if span[0] is None:
            return []
        width = max((span[1] - span[0]) / max(max_points - 1, 1), 1e-9)
        avgs = ", ".join(f"AVG({f}) AS {f}" for f in _GPU_FIELDS)
        return rows_as(
            GpuSeriesPoint,
            self.query(
                f"SELECT node, gpu, MIN(ts_unix) AS ts_unix, {avgs}, MAX(throttled) AS throttled"
                f" FROM gpu_samples{where} GROUP BY node, gpu, CAST((ts_unix - ?) / ? AS INTEGER)"
                f" ORDER BY node, gpu, ts_unix",
                (*params, span[0], width),
            ),
        )

    def metric_latest(self) -> list[MetricRow]:
        return rows_as(
            MetricRow, self.query("SELECT node, name, value, ts_unix FROM metric_latest ORDER BY node, name")
        )

    def metric_series(self, name: str, since_unix: float | None = None) -> list[MetricPoint]:
        where, params = _where(since_unix, None)
        clause = (where + " AND" if where else " WHERE") + " name = ?"
        sql = f"SELECT ts_unix, node, value FROM metric_samples{clause} ORDER BY ts_unix"
        return rows_as(MetricPoint, self.query(sql, (*params, name)))

    def latest_sample_batch(self) -> SampleBatch | None:
        """The newest finished sample batch with its samples, or None."""
        rows = self.query("SELECT * FROM sample_batches WHERE done_unix IS NOT NULL ORDER BY batch DESC LIMIT 1")
        if not rows:
            return None
        batch = rows[0]
        batch["errors"] = json.loads(batch["errors"] or "{}")
        batch["samples"] = self.query(
            "SELECT * FROM samples WHERE batch = ? ORDER BY node, path, line_no", (batch["batch"],)
        )
        return rows_as(SampleBatch, rows)[0]

    def pending_sample_batch(self) -> PendingSampleBatch | None:
        rows = self.query("SELECT * FROM sample_batches WHERE done_unix IS NULL ORDER BY batch DESC LIMIT 1")
        return rows_as(PendingSampleBatch, rows)[0] if rows else None

    def last_collection_unix(self) -> float | None:
        row = self.cursor("SELECT MAX(last_ok_unix) FROM nodes").fetchone()
        return row[0]


def _create(db: sqlite3.Connection, path: Path) -> None:
    """Create a new store or upgrade an older one (runhealth.migrations; a newer one is refused)."""
    migrate(db, path)


def _remembered_sql(kind: str, key: str, value: Any) -> tuple[str, tuple]:
    """The statement that writes a remembered set_meta / register_node again into a new store."""
    if kind == "meta":
        return "INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value))
    return (
        "INSERT INTO nodes (name, config) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET config = excluded.config",
        (key, json.dumps(value)),
    )


def write_error_text(exc: BaseException) -> str:
    """ "cannot write the history store: <cause>", the cause in plain words."""
    text = str(exc)
    causes = (
        ("disk is full", "disk full"),
        ("disk I/O error", "disk I/O error"),
        ("database is locked", "locked by another process (sqlite3 shell, backup, VACUUM?)"),
        ("readonly", "the file is read-only"),
        ("integer overflow", "a count too large for SQLite"),
        ("too large to convert", "a count too large for SQLite"),
        ("malformed", "the file is corrupt"),
        ("no such table", "the file was replaced or emptied"),
    )
    cause = next((plain for key, plain in causes if key in text), f"{type(exc).__name__}: {text}")
    return f"cannot write the history store: {cause}"


POLL_DELTAS = ("completions", "tokens", "length_stops", "malformed")


def live_sums(fields: Sequence[str]) -> str:
    """SQL aggregates of poll rows per time bucket, one node's catch-up never hiding another's
    output: `backfill` is 1 only when every poll in the bucket was a backfill, and each field is
    summed over the bucket's live polls (over all of them when it has none). A bucket where one
    node indexes its backlog while another writes is that writer's live output."""
    live = "COALESCE(backfill, 0) = 0"
    sums = ", ".join(f"COALESCE(SUM(CASE WHEN {live} THEN {f} END), SUM({f})) AS {f}" for f in fields)
    return f"{sums}, MIN(COALESCE(backfill, 0)) AS backfill"


def _host_key(config: str | None) -> tuple[str, Any] | None:
    """(host, port) of a node's stored public config: two nodes with the same read the same files."""
    found = json.loads(config) if config else None
    return (str(found.get("host")), found.get("port")) if isinstance(found, dict) and found.get("host") else None


def _where(since_unix: float | None, node: str | None) -> tuple[str, tuple]:
    clauses, params = [], []  # type: list[str], list[float | str]
    if since_unix is not None:
        clauses.append("ts_unix >= ?")
        params.append(since_unix)
    if node is not None:
        clauses.append("node = ?")
        params.append(node)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def _apply_shard(
    db: sqlite3.Connection, node: str, update: ShardUpdate, ts_unix: float, delta: dict, stops: dict[int, int]
) -> bool:
    """Fold one file's scan result into the shard row and its length counts (False: not applied)."""
    path = update.path
    old = db.execute("SELECT offset FROM shards WHERE node = ? AND path = ?", (node, path)).fetchone()
    stored_offset = old[0] if old is not None else 0
    if not update.reset and update.offset_from is not None and update.offset_from != stored_offset:
        # The scan did not start where our counts end (a stale or duplicate reply, e.g. from a
        # second collector on the same store): applying it would double or skip lines.
        log.warning(
            "%s:%s: ignored a scan from offset %s; counted up to %s", node, path, update.offset_from, stored_offset
        )
        return False
    if update.reset and old is not None:
        # Rotated or truncated: forget what this shard counted before, then count it afresh.
        db.execute(
            "UPDATE node_length_counts SET count = count - (SELECT l.count FROM length_counts l WHERE l.node = ?"
            " AND l.path = ? AND l.tokens = node_length_counts.tokens AND l.finish_reason ="
            " node_length_counts.finish_reason AND l.estimated = node_length_counts.estimated)"
            " WHERE node = ? AND EXISTS (SELECT 1 FROM length_counts l WHERE l.node = ? AND l.path = ?"
            " AND l.tokens = node_length_counts.tokens AND l.finish_reason = node_length_counts.finish_reason"
            " AND l.estimated = node_length_counts.estimated)",
            (node, path, node, node, path),
        )
        db.execute("DELETE FROM node_length_counts WHERE node = ? AND count <= 0", (node,))
        db.execute("DELETE FROM length_counts WHERE node = ? AND path = ?", (node, path))
        db.execute(
            "UPDATE shards SET lines = 0, malformed = 0, blank_lines = 0, tokens = 0, resets = resets + 1"
            " WHERE node = ? AND path = ?",
            (node, path),
        )
        delta["resets"] += 1
    db.execute("INSERT OR IGNORE INTO shards (node, path) VALUES (?, ?)", (node, path))
    _log_shard_error(db, node, update)
    completions = update.completions
    rows = [(node, path, r.tokens, r.finish_reason or "", r.estimated, r.count) for r in update.counts]
    db.executemany(
        "INSERT INTO length_counts VALUES (?,?,?,?,?,?) ON CONFLICT (node, path, tokens, finish_reason, estimated)"
        " DO UPDATE SET count = count + excluded.count",
        rows,
    )
    db.executemany(
        "INSERT INTO node_length_counts VALUES (?,?,?,?,?) ON CONFLICT (node, tokens, finish_reason, estimated)"
        " DO UPDATE SET count = count + excluded.count",
        [(r[0], *r[2:]) for r in rows],
    )
    db.execute(
        # An unreadable shard has no inode or size to report: the last known ones stay.
        "UPDATE shards SET inode = COALESCE(?, inode), offset = ?, size = COALESCE(?, size), lines = lines + ?,"
        " malformed = malformed + ?, blank_lines = blank_lines + ?, tokens = tokens + ?, error = ?, updated_unix = ?,"
        # an entry that counted nothing new may leave its mark out (the stored one stands);
        # a replaced shard notes when (the right-hand side reads the row before this update)
        " mark = CASE WHEN offset = ? AND NOT ? THEN COALESCE(?, mark) ELSE ? END,"
        " replaced_unix = CASE WHEN ? THEN ? ELSE replaced_unix END"
        " WHERE node = ? AND path = ?",
        (
            update.inode,
            update.offset,
            update.size,
            completions,
            update.malformed,
            update.blank_lines,
            update.tokens,
            update.shown_error,
            ts_unix,
            update.offset,
            update.reset,
            update.mark,
            update.mark,
            update.replaced,
            ts_unix,
            node,
            path,
        ),
    )
    delta["completions"] += completions
    delta["tokens"] += update.tokens
    delta["malformed"] += update.malformed
    delta["length_stops"] += update.length_stops
    for t, n in update.exact_length_stops().items():
        stops[t] = stops.get(t, 0) + n
    return True


def _write_hourly(db: sqlite3.Connection, applied: Sequence[ShardUpdate], ts_unix: float, backfill: bool) -> None:
    """The applied updates' completions added to their hour's length_hourly rows (ingest.HourlyLengthRow;
    backfill apart: first scans and catch-up were written before the hour they land in)."""
    bucket = int(ts_unix // ingest.HOUR_S * ingest.HOUR_S)
    db.executemany(
        "INSERT INTO length_hourly VALUES (?,?,?,?,?,?) ON CONFLICT (bucket_unix, tokens, by_length, estimated,"
        " backfill) DO UPDATE SET count = count + excluded.count",
        [
            (bucket, r.tokens, r.by_length, r.estimated, int(backfill), r.completions)
            for r in ingest.hourly_length_rows(applied)
        ],
    )


def _write_metrics(db: sqlite3.Connection, node: str, values: Mapping[str, float | None], ts_unix: float) -> None:
    rows = [(ts_unix, node, name, value) for name, value in values.items() if value is not None]
    db.executemany("INSERT INTO metric_samples VALUES (?,?,?,?)", rows)
    db.executemany(
        "INSERT INTO metric_latest VALUES (?,?,?,?) ON CONFLICT (node, name) DO UPDATE SET"
        " value = excluded.value, ts_unix = excluded.ts_unix WHERE excluded.ts_unix >= ts_unix",
        [(node, name, value, ts) for ts, node, name, value in rows],
    )


def _log_shard_error(db: sqlite3.Connection, node: str, update: ShardUpdate) -> None:
    """Log a shard's error or problem when it appears or changes (the screen shows it every poll)."""
    text = update.shown_error
    old = db.execute("SELECT error FROM shards WHERE node = ? AND path = ?", (node, update.path)).fetchone()
    if text is not None and (old is None or old[0] != text):
        log.warning("%s:%s: %s", node, update.path, text)


def _write_health(db: sqlite3.Connection, node: str, record: PollRecord, ts_unix: float) -> None:
    """GPU health, XID events and host memory of one poll (absent in older agents' replies)."""
    db.execute("DELETE FROM gpu_health WHERE node = ?", (node,))
    for h in record.health:
        for xid in h.xids:
            db.execute("INSERT INTO gpu_events VALUES (?,?,?,?)", (ts_unix, node, h.index, xid))
        if h.health:
            db.execute(
                "INSERT OR REPLACE INTO gpu_health VALUES (?,?,?,?)", (node, h.index, ts_unix, json.dumps(h.health))
            )
    if record.host:
        db.execute("INSERT OR REPLACE INTO host_latest VALUES (?,?,?)", (node, ts_unix, json.dumps(record.host)))


def _write_gpus(db: sqlite3.Connection, node: str, record: PollRecord, ts_unix: float) -> None:
    db.execute("DELETE FROM gpu_latest WHERE node = ?", (node,))
    for d in record.gpus:
        values = [d.get(f) for f in _GPU_FIELDS]
        throttled = int(bool(d.get("throttle_reasons")))
        if d.get("error") is None:
            db.execute(
                "INSERT INTO gpu_samples VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (ts_unix, node, d.get("index"), *values, throttled),
            )
            db.execute(
                "INSERT INTO gpu_seen VALUES (?,?,?) ON CONFLICT (node, gpu)"
                " DO UPDATE SET last_unix = MAX(last_unix, excluded.last_unix)",
                (node, d.get("index"), ts_unix),
            )
        db.execute(
            "INSERT OR REPLACE INTO gpu_latest VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                node,
                d.get("index"),
                ts_unix,
                d.get("name"),
                d.get("uuid"),
                *values,
                json.dumps(d.get("throttle_reasons") or []),
                json.dumps(d.get("processes") or []),
                d.get("error"),
            ),
        )


def _write_node_ok(db: sqlite3.Connection, node: str, record: PollRecord, ts_unix: float, rtt_ms: float | None) -> None:
    s = record.status
    node_time = s.node_time_unix
    db.execute("INSERT OR IGNORE INTO nodes (name) VALUES (?)", (node,))
    db.execute(
        "UPDATE nodes SET last_ok_unix = ?, last_attempt_unix = ?, failing_since_unix = NULL, rtt_ms = ?,"
        " agent_ms = ?, skew_s = ?, hostname = ?, loadavg = ?, gpus_found = ?, gpu_source = ?, gpu_error = ?,"
        " gpu_simulated = ?, shards_matched = ?, unmatched_globs = ?, pending_bytes = ?, disk = ?,"
        " metrics_errors = ? WHERE name = ?",
        (
            ts_unix,
            ts_unix,
            rtt_ms,
            s.agent_ms,
            (node_time - ts_unix) if node_time is not None else None,
            s.hostname,
            json.dumps(s.loadavg),
            s.gpus_found,
            s.gpu_source,
            s.gpu_error,
            int(s.gpu_simulated),
            s.shards_matched,
            json.dumps(s.unmatched_globs),
            s.pending_bytes,
            json.dumps(s.disk),
            json.dumps(s.metrics_errors),
            node,
        ),
    )
