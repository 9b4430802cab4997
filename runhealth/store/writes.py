"""The store's writes: one poll's record in one transaction, failures, samples, pruning.

`write_poll` applies one `ingest.PollRecord` (what a poll reply means, runhealth/ingest.py) in
one transaction: shard offsets with the length counts they produced (`node_length_counts` kept
equal to the sum of `length_counts`), the poll row and its length stops, the hourly length rows,
GPU readings and health, the node's status and its server metrics. A failure anywhere writes
none of it (docs/design.md section 2).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from runhealth import ingest, textsafe
from runhealth.ingest import PollRecord, ShardUpdate
from runhealth.store import energymeter, reasonnames, runevents
from runhealth.store.lifecycle import StoreFile
from runhealth.store.reads import GPU_FIELDS

log = textsafe.get_logger(__name__)
ALERT_HISTORY_KEEP_S = 30 * 24 * 3600  # resolved alert episodes are pruned after this


class StoreWrites(StoreFile):
    """What the collector writes (every write in one `transaction`)."""

    _reason_namer: tuple[int, reasonnames.Namer] | None = None  # (generation, namer)

    def write_poll(
        self, node: str, record: PollRecord, ts_unix: float, rtt_ms: float | None, interval_s: float | None = None
    ) -> dict[str, int]:
        """Write one successful poll in one transaction; returns the deltas it added.

        `interval_s`: the collector's monotonic seconds since its previous written poll of the
        node (None: its first, or no monotonic clock): the rates' interval whatever the wall
        clock did (runhealth/rules/activity.py).

        Everything the poll brings moves together: shard offsets with their length counts, the
        poll row and its length stops, the hourly length rows, GPU readings, node status and
        server metrics. A failure anywhere writes none of it.
        """
        with self.transaction() as db:
            delta = self.write_poll_in(db, node, record, ts_unix, rtt_ms, interval_s)
        self.write_failures.pop(node, None)  # written again: the store is healthy for this node
        return delta

    def write_poll_in(
        self,
        db: sqlite3.Connection,
        node: str,
        record: PollRecord,
        ts_unix: float,
        rtt_ms: float | None,
        interval_s: float | None = None,
    ) -> dict[str, int]:
        """`write_poll`'s statements inside the caller's open transaction on `db` (this thread's,
        from `transaction()`): runhealth/store/groupwrites.py writes several polls in one, each
        inside its own SAVEPOINT. Returns the deltas; the caller commits (or rolls back)."""
        record = _named(record, self._reasons(db))  # a bounded set of names
        prev = db.execute("SELECT pending_bytes, last_ok_unix FROM nodes WHERE name = ?", (node,)).fetchone()
        catching_up = bool(prev and prev[0])  # the previous poll left bytes for this one
        # The node's first poll counts history only if it read bytes that were already there.
        first_index = not (prev and prev[1] is not None) and record.scanned_bytes > 0
        delta = {"completions": 0, "tokens": 0, "length_stops": 0, "malformed": 0, "resets": 0, "prompts": 0}
        stops: dict[int, int] = {}
        applied = [u for u in record.shards if _apply_shard(db, node, u, ts_unix, delta, stops)]
        _write_failed(db, node, applied)
        db.executemany(
            "INSERT INTO poll_length_stops VALUES (?,?,?,?)", [(ts_unix, node, t, n) for t, n in stops.items()]
        )
        backfill = ingest.is_backfill(first_index, catching_up, delta["resets"], record.pending_bytes)
        db.execute(
            "INSERT INTO polls (ts_unix, node, node_ts_unix, completions, tokens, length_stops, malformed,"
            " backfill, rtt_ms, prompts, interval_s) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
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
                delta["prompts"],
                interval_s,
            ),
        )
        if interval_s is not None and prev and prev[1] is not None:
            _note_clock_step(db, ts_unix, ts_unix - prev[1] - interval_s, interval_s)
        _write_hourly(db, applied, ts_unix, backfill)
        if delta["resets"]:  # a relaunch rewrote or truncated shards: a marker on the time charts
            _write_reset_event(db, node, applied, delta["resets"], ts_unix)
        _write_gpus(db, node, record, ts_unix)
        _write_energy(db, node, record, applied, ts_unix, backfill, prev[1] if prev else None)
        _write_health(db, node, record, ts_unix)
        _write_node_ok(db, node, record, ts_unix, rtt_ms, known=prev is not None)
        _write_metrics(db, node, record.server_metrics, ts_unix)
        scanned = record.scanned_bytes
        if scanned and rtt_ms and (backfill or record.pending_bytes):
            # Indexing speed as the operator lives it (bytes per second of poll round trip).
            db.execute("UPDATE nodes SET index_bytes_per_s = ? WHERE name = ?", (scanned / (rtt_ms / 1000), node))
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
        """Drop time series older than `keep_s` (counts and offsets are never pruned), and the run
        events no chart can draw any more (all but the newest `runevents.MAX_READ`)."""
        cutoff = (now_unix or time.time()) - keep_s
        with self.transaction() as db:
            # metric_latest too: a metric (or node) that stopped reporting leaves with its samples.
            for table in ("gpu_samples", "metric_samples", "metric_latest"):
                db.execute(f"DELETE FROM {table} WHERE ts_unix < ?", (cutoff,))
            db.execute("DELETE FROM gpu_seen WHERE last_unix < ?", (cutoff,))  # no samples left behind it
            # Resolved alert episodes are kept longer (the Nodes page lists the last days'); open ones stay.
            old_alerts = (now_unix or time.time()) - max(keep_s, ALERT_HISTORY_KEEP_S)
            db.execute("DELETE FROM alert_history WHERE resolved_unix < ?", (old_alerts,))
            runevents.prune(db)

    def write_alert_episodes(
        self,
        now_unix: float,
        started: Sequence[Mapping[str, Any]] = (),
        held: Sequence[Mapping[str, Any]] = (),
        absent: Sequence[str] = (),
        resolved: Sequence[str] = (),
    ) -> None:
        """One evaluation of the alert history (runhealth/alerting/alerthistory.py) in one transaction.

        `started` and `held` are alerts that hold now, as dicts (key as JSON text, name, severity,
        node, gpu, summary, value): a started one opens an episode at `now_unix` (none when its
        key already has an open one: a restart never opens a second); a held one is seen again
        (its newest wording and value, its worst severity). `absent`: keys of open episodes not
        seen now (the first such evaluation is kept: when it stopped holding); `resolved`: keys
        whose open episode ends, at that first absence (or now, when none was recorded).
        """
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO alert_history (key, name, severity, node, gpu, started_unix, last_seen_unix,"
                " summary_start, summary_end, value_start, value_end) SELECT ?,?,?,?,?,?,?,?,?,?,?"
                " WHERE NOT EXISTS (SELECT 1 FROM alert_history WHERE key = ? AND resolved_unix IS NULL)",
                [
                    (a["key"], a["name"], a["severity"], a["node"], a["gpu"], now_unix, now_unix)
                    + (a["summary"], a["summary"], a["value"], a["value"], a["key"])
                    for a in started
                ],
            )
            db.executemany(
                "UPDATE alert_history SET last_seen_unix = ?, absent_unix = NULL, summary_end = ?, value_end = ?,"
                " severity = CASE WHEN ? = 'critical' THEN 'critical' ELSE severity END"
                " WHERE key = ? AND resolved_unix IS NULL",
                [(now_unix, a["summary"], a["value"], a["severity"], a["key"]) for a in held],
            )
            db.executemany(
                "UPDATE alert_history SET absent_unix = COALESCE(absent_unix, ?) WHERE key = ? AND resolved_unix IS NULL",
                [(now_unix, key) for key in absent],
            )
            db.executemany(
                "UPDATE alert_history SET resolved_unix = COALESCE(absent_unix, ?) WHERE key = ? AND resolved_unix IS NULL",
                [(now_unix, key) for key in resolved],
            )


def _named(record: PollRecord, namer: reasonnames.Namer) -> PollRecord:
    """`record` with the store's names for its finish reasons (ingest.with_reason_names), each
    distinct reason named once; the record itself when every name is its own (the usual poll:
    rebuilding its ~40 count rows was a tenth of the write's Python time, #42 item 3)."""
    names = {r.finish_reason: namer.name(r.finish_reason) for u in record.shards for r in u.counts}
    if all(k == v for k, v in names.items()):
        return record
    return ingest.with_reason_names(record, names.__getitem__)


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


def _write_reset_event(
    db: sqlite3.Connection, node: str, applied: list[ShardUpdate], resets: int, ts_unix: float
) -> None:
    """One event per poll that reset shards: how many, how many were rewritten in place, a few paths."""
    reset = [u for u in applied if u.reset]
    detail = {"shards": resets, "replaced": sum(1 for u in reset if u.replaced), "paths": [u.path for u in reset][:3]}
    runevents.insert(db, ts_unix, "shards_reset", detail, node)


def _apply_shard(
    db: sqlite3.Connection, node: str, update: ShardUpdate, ts_unix: float, delta: dict, stops: dict[int, int]
) -> bool:
    """Fold one file's scan result into the shard row and its length counts (False: not applied)."""
    path = update.path
    old = db.execute("SELECT offset, error FROM shards WHERE node = ? AND path = ?", (node, path)).fetchone()
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
        delta["prompts"] -= _reset_fields(db, node, path)
        _reset_failed(db, node, path)
        db.execute(
            "UPDATE shards SET lines = 0, malformed = 0, blank_lines = 0, tokens = 0, resets = resets + 1"
            " WHERE node = ? AND path = ?",
            (node, path),
        )
        delta["resets"] += 1
    if old is None:
        db.execute("INSERT INTO shards (node, path) VALUES (?, ?)", (node, path))
    _log_shard_error(node, update, None if old is None else old[1])
    completions = update.completions
    # In key order: each upsert's leaf page is then the one before's or the next (#42 item 3)
    rows = sorted((node, path, r.tokens, r.finish_reason or "", r.estimated, r.count) for r in update.counts)
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
    if update.fields is not None:
        delta["prompts"] += _write_fields(db, node, path, update.fields)
    delta["completions"] += completions
    delta["tokens"] += update.tokens
    delta["malformed"] += update.malformed
    delta["length_stops"] += update.length_stops
    for t, n in update.exact_length_stops().items():
        stops[t] = stops.get(t, 0) + n
    return True


MAX_STORED_GROUPS = 64  # distinct group labels a run keeps apart; later ones count as "(other)"
OTHER_GROUP = "(other)"


def _field_shard(db: sqlite3.Connection, node: str, path: str) -> int:
    db.execute("INSERT OR IGNORE INTO field_shards (node, path) VALUES (?, ?)", (node, path))
    return int(db.execute("SELECT id FROM field_shards WHERE node = ? AND path = ?", (node, path)).fetchone()[0])


def _reset_fields(db: sqlite3.Connection, node: str, path: str) -> int:
    """A reset shard's per-line fields forgotten: its prompt IDs leave the run's totals too.
    Returns the distinct prompts the run lost (held by no other shard)."""
    row = db.execute("SELECT id FROM field_shards WHERE node = ? AND path = ?", (node, path)).fetchone()
    if row is None:
        return 0
    shard = row[0]
    gone, untwice = db.execute(
        "SELECT COALESCE(SUM(h.count <= p.count), 0), COALESCE(SUM(h.count >= 2 AND h.count - p.count < 2), 0)"
        " FROM prompt_ids p JOIN prompt_hashes h ON h.hash = p.hash WHERE p.shard = ?",
        (shard,),
    ).fetchone()
    db.execute(
        "UPDATE prompt_summary SET distinct_prompts = distinct_prompts - ?, answered_twice = answered_twice - ?",
        (gone, untwice),
    )
    db.execute(
        "UPDATE prompt_hashes SET count = count - (SELECT p.count FROM prompt_ids p WHERE p.shard = ?"
        " AND p.hash = prompt_hashes.hash) WHERE hash IN (SELECT hash FROM prompt_ids WHERE shard = ?)",
        (shard, shard),
    )
    db.execute("DELETE FROM prompt_hashes WHERE count <= 0")
    db.execute("DELETE FROM prompt_ids WHERE shard = ?", (shard,))
    db.execute("DELETE FROM field_counts WHERE shard = ?", (shard,))
    db.execute("UPDATE field_shards SET id_lines = 0, prompt_token_lines = 0, id_fields = NULL WHERE id = ?", (shard,))
    return int(gone)


def _count_new_prompts(db: sqlite3.Connection, per_hash: dict[int, int]) -> int:
    """prompt_summary moved by this poll's hashes (before they are added): prompts not seen
    before, and prompts that now came twice or more for the first time. Returns the new ones."""
    db.execute("CREATE TEMP TABLE IF NOT EXISTS poll_hashes (hash INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
    db.execute("DELETE FROM poll_hashes")
    db.executemany("INSERT INTO poll_hashes VALUES (?,?)", per_hash.items())
    new, twice = db.execute(
        "SELECT COALESCE(SUM(h.count IS NULL), 0), COALESCE(SUM(COALESCE(h.count, 0) <= 1"
        " AND COALESCE(h.count, 0) + t.n >= 2), 0) FROM poll_hashes t LEFT JOIN prompt_hashes h ON h.hash = t.hash"
    ).fetchone()
    db.execute(
        "UPDATE prompt_summary SET distinct_prompts = distinct_prompts + ?, answered_twice = answered_twice + ?",
        (new, twice),
    )
    db.execute("DELETE FROM poll_hashes")
    return int(new)


def _write_fields(db: sqlite3.Connection, node: str, path: str, f: ingest.FieldUpdate) -> int:
    """Add one scan's per-line fields to the shard's and the run's (same transaction as its counts);
    returns the distinct prompts new to the run (the poll row's `prompts`, the prompts ETA's rate)."""
    shard = _field_shard(db, node, path)
    per_hash: dict[int, int] = {}
    for h in f.id_hashes:
        per_hash[h] = per_hash.get(h, 0) + 1
    db.executemany(
        "INSERT INTO prompt_ids VALUES (?,?,?) ON CONFLICT (shard, hash) DO UPDATE SET count = count + excluded.count",
        [(shard, h, n) for h, n in per_hash.items()],
    )
    new = _count_new_prompts(db, per_hash) if per_hash else 0
    db.executemany(
        "INSERT INTO prompt_hashes VALUES (?,?) ON CONFLICT (hash) DO UPDATE SET count = count + excluded.count",
        per_hash.items(),
    )
    old = db.execute("SELECT id_fields FROM field_shards WHERE id = ?", (shard,)).fetchone()[0]
    id_fields = sorted(set(json.loads(old) if old else []) | set(f.id_fields))
    db.execute(
        "UPDATE field_shards SET id_lines = id_lines + ?, prompt_token_lines = prompt_token_lines + ?,"
        " group_field = COALESCE(?, group_field), id_fields = ? WHERE id = ?",
        (len(f.id_hashes), f.prompt_token_lines, f.group_field, json.dumps(id_fields) if id_fields else None, shard),
    )
    known = {r[0] for r in db.execute("SELECT DISTINCT key FROM field_counts WHERE kind = 'group'")}
    rows: list[tuple[str, str, int, int, int]] = []
    for label, n, stops, by_tokens in f.groups:
        if label not in known and len(known) >= MAX_STORED_GROUPS:
            label = OTHER_GROUP
        known.add(label)
        rows += [("group", label, 0, 0, n), ("group_length", label, 0, 0, stops)]
        # the stops by token count (#41; None from an older agent: the group's split stays unknown)
        rows += [("group_length_tokens", label, t, 0, k) for t, k in by_tokens or ()]
    rows += [("length_prompt_tokens", "", t, p, n) for t, p, n in f.length_prompt_tokens]
    rows += [("no_answer", "", t, 0, n) for t, n in f.no_answer]
    rows += [("reasoned", "", t, 0, n) for t, n in f.reasoned]
    db.executemany(
        "INSERT INTO field_counts VALUES (?,?,?,?,?,?) ON CONFLICT (shard, kind, key, tokens, prompt_tokens)"
        " DO UPDATE SET count = count + excluded.count",
        [(shard, *r) for r in rows],
    )
    return new


def _reset_failed(db: sqlite3.Connection, node: str, path: str) -> None:
    """A reset shard's failed requests forgotten with its other counts (#39)."""
    db.execute("DELETE FROM failed_counts WHERE node = ? AND path = ?", (node, path))
    db.execute(
        "DELETE FROM failed_ids WHERE shard IN (SELECT id FROM field_shards WHERE node = ? AND path = ?)", (node, path)
    )


def _write_failed(db: sqlite3.Connection, node: str, applied: Sequence[ShardUpdate]) -> None:
    """The applied updates' failed requests (#39): counts by the store's bounded reason names
    (reasonnames.Namer over failed_counts' own names) and the failed prompt-ID hashes."""
    updates = [u for u in applied if u.failed or u.failed_ids]
    if not updates:
        return
    namer = reasonnames.Namer(r[0] for r in db.execute("SELECT DISTINCT reason FROM failed_counts"))
    for u in updates:
        rows: dict[str, int] = {}
        for reason, n in u.failed:
            name = namer.name(reason) or reasonnames.OTHER
            rows[name] = rows.get(name, 0) + n
        db.executemany(
            "INSERT INTO failed_counts VALUES (?,?,?,?) ON CONFLICT (node, path, reason)"
            " DO UPDATE SET count = count + excluded.count",
            [(node, u.path, r, n) for r, n in rows.items()],
        )
        if u.failed_ids:
            shard = _field_shard(db, node, u.path)
            per_hash: dict[int, int] = {}
            for h in u.failed_ids:
                per_hash[h] = per_hash.get(h, 0) + 1
            db.executemany(
                "INSERT INTO failed_ids VALUES (?,?,?) ON CONFLICT (shard, hash)"
                " DO UPDATE SET count = count + excluded.count",
                [(shard, h, n) for h, n in per_hash.items()],
            )


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
    """The latest value of every metric; a time series of each but histogram buckets (a server's
    token histograms are read as they stand now: their ~20 buckets per poll and node as samples
    would outgrow every other table)."""
    rows = [(ts_unix, node, name, value) for name, value in values.items() if value is not None]
    db.executemany("INSERT INTO metric_samples VALUES (?,?,?,?)", [r for r in rows if "_bucket{le=" not in r[2]])
    db.executemany(
        "INSERT INTO metric_latest VALUES (?,?,?,?) ON CONFLICT (node, name) DO UPDATE SET"
        " value = excluded.value, ts_unix = excluded.ts_unix WHERE excluded.ts_unix >= ts_unix",
        [(node, name, value, ts) for ts, node, name, value in rows],
    )


def _log_shard_error(node: str, update: ShardUpdate, stored: str | None) -> None:
    """Log a shard's error or problem when it appears or changes from the `stored` one (the screen
    shows it every poll)."""
    text = update.shown_error
    if text is not None and stored != text:
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
    """Each GPU's sample (not an erring one's), last-seen time and latest reading: one statement a
    table for all of the node's GPUs, in the reply's order (#42 item 3: 8 GPUs were 24 statements)."""
    db.execute("DELETE FROM gpu_latest WHERE node = ?", (node,))
    samples, seen, latest = [], [], []
    for d in record.gpus:
        values = [d.get(f) for f in GPU_FIELDS]
        if d.get("error") is None:
            samples.append((ts_unix, node, d.get("index"), *values, int(bool(d.get("throttle_reasons")))))
            seen.append((node, d.get("index"), ts_unix))
        latest.append(
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
            )
        )
    db.executemany("INSERT INTO gpu_samples VALUES (?,?,?,?,?,?,?,?,?,?,?)", samples)
    db.executemany(
        "INSERT INTO gpu_seen VALUES (?,?,?) ON CONFLICT (node, gpu) DO UPDATE SET last_unix = MAX(last_unix, excluded.last_unix)",
        seen,
    )
    db.executemany("INSERT OR REPLACE INTO gpu_latest VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", latest)


CLOCK_STEPS_KEPT = 16
CLOCK_STEP_MIN_S = 5.0  # the rates' tolerance (rules/activity.STEP_TOLERANCE_S): less is round-trip jitter


def _note_clock_step(db: sqlite3.Connection, ts_unix: float, step_s: float, interval_s: float) -> None:
    """Remember a step of the collector's wall clock (its wall interval less its monotonic one):
    meta 'clock_steps', [ts_unix after the step, seconds] newest last, one per step (the first
    node's poll to see it), so the rates read the polls from before a forward step too."""
    if abs(step_s) < max(CLOCK_STEP_MIN_S, 0.5 * interval_s):
        return
    row = db.execute("SELECT value FROM meta WHERE key = 'clock_steps'").fetchone()
    steps = json.loads(row[0]) if row else []
    # Every node's next poll sees the same step: kept once (within a minute of the first, ±20%).
    if any(abs(t - ts_unix) < 60 and abs(s - step_s) <= 0.2 * abs(step_s) for t, s in steps):
        return
    steps = [*steps, [ts_unix, step_s]][-CLOCK_STEPS_KEPT:]
    db.execute("INSERT OR REPLACE INTO meta VALUES ('clock_steps', ?)", (json.dumps(steps),))


def _write_energy(
    db: sqlite3.Connection,
    node: str,
    record: PollRecord,
    applied: Sequence[ShardUpdate],
    ts_unix: float,
    backfill: bool,
    prev_unix: float | None,
) -> None:
    """Each GPU's energy since its last reading (runhealth/store/energymeter.py) and the tokens the
    shards gained, summed together only over throughput polls: a backfill poll's tokens were
    written before it, so it (and its energy) only moves the baseline.

    Energy and tokens cover the same intervals (#40 item 5): the node's interval is dropped whole
    (no GPU's joules, none of its tokens; counted in dropped_steps) when a GPU's step is
    implausible or has no energy or power reading where it had one (the reading is then not kept
    as a baseline), a GPU of the node's previous poll
    is missing now, a known GPU errs, or a GPU is back after missing polls (its baseline is older than the
    node's previous poll: the energy across the gap has no tokens beside it). `prev_unix`: the node's
    previous written poll (nodes.last_ok_unix, read by write_poll_in before this poll's rows)."""
    last = {
        r[0]: energymeter.Reading(*r[1:])
        for r in db.execute("SELECT gpu, ts_unix, uuid, counter_mj, power_w FROM gpu_energy WHERE node = ?", (node,))
    }
    read = {d["index"]: d for d in record.gpus if d.get("error") is None and d.get("index") is not None}
    errs = {d.get("index") for d in record.gpus if d.get("error") is not None}
    # A GPU of the previous poll missing now, or a known GPU that errs: this interval's energy is not all there.
    dropped = any((r.ts_unix == prev_unix and gpu not in read) or gpu in errs for gpu, r in last.items())
    steps: dict[int, tuple[energymeter.Reading, energymeter.Step]] = {}
    for gpu, d in read.items():
        now, before = energymeter.reading_of(d, ts_unix), last.get(gpu)
        got = energymeter.step(before, now)
        if before is not None and now.counter_mj is None and now.power_w is None:
            if before.counter_mj is not None or before.power_w is not None:  # read before, not now
                got = energymeter.Step(0.0, 0.0, None, dropped=True)
        if before is not None and prev_unix is not None and before.ts_unix != prev_unix:
            got = energymeter.Step(0.0, 0.0, None)  # back after a gap: a baseline, and the interval goes
            dropped = True
        dropped = dropped or got.dropped
        steps[gpu] = (now, got)
    take = not backfill and not dropped
    db.executemany(  # an implausible reading is no baseline; one statement for the node's GPUs
        GPU_ENERGY_SQL,
        [
            _gpu_energy_row(node, gpu, now, got if take else None)
            for gpu, (now, got) in steps.items()
            if not got.dropped
        ],
    )
    if backfill or not (dropped or any(got.source for _, got in steps.values())):
        return
    tokens = usable = usable_n = 0
    for update in applied if take else ():
        for r in update.counts:
            if not r.estimated:
                tokens += r.tokens * r.count
                if r.finish_reason in reasonnames.NATURAL:
                    usable += r.tokens * r.count
                    usable_n += r.count
    db.execute(
        "INSERT INTO node_energy (node, since_unix, last_unix, tokens, usable_tokens, usable_completions,"
        " dropped_steps) VALUES (?,?,?,?,?,?,?) ON CONFLICT (node) DO UPDATE SET"
        " since_unix = COALESCE(since_unix, excluded.since_unix), last_unix = COALESCE(excluded.last_unix, last_unix),"
        " tokens = tokens + excluded.tokens, usable_tokens = usable_tokens + excluded.usable_tokens,"
        " usable_completions = usable_completions + excluded.usable_completions,"
        " dropped_steps = dropped_steps + excluded.dropped_steps",
        (node, ts_unix if take else None, ts_unix if take else None, tokens, usable, usable_n, int(dropped)),
    )


GPU_ENERGY_SQL = (
    "INSERT INTO gpu_energy (node, gpu, uuid, ts_unix, counter_mj, power_w) VALUES (?,?,?,?,?,?)"
    " ON CONFLICT (node, gpu) DO UPDATE SET uuid = excluded.uuid, ts_unix = excluded.ts_unix,"
    " counter_mj = excluded.counter_mj, power_w = excluded.power_w, joules = joules + ?,"
    " integrated_j = integrated_j + ?, gpu_s = gpu_s + ?, resets = resets + ?"
)


def _gpu_energy_row(node: str, gpu: int, now: energymeter.Reading, got: energymeter.Step | None) -> tuple:
    """GPU_ENERGY_SQL's parameters: one GPU's new baseline, with `got` added to its sums (None:
    nothing counted this poll)."""
    counted = got if got is not None and got.source is not None else energymeter.Step(0.0, 0.0, None)
    return (
        node,
        gpu,
        now.uuid,
        now.ts_unix,
        now.counter_mj,
        now.power_w,
        counted.joules,
        counted.joules if counted.source == energymeter.POWER_X_TIME else 0.0,
        counted.gpu_s,
        int(counted.reset),
    )


def _write_node_ok(
    db: sqlite3.Connection, node: str, record: PollRecord, ts_unix: float, rtt_ms: float | None, known: bool = False
) -> None:
    """The node's status row after a poll (`known`: the row exists, read earlier in the transaction)."""
    s = record.status
    node_time = s.node_time_unix
    if not known:
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
