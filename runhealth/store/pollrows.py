"""Each node's recent poll rows, kept in memory and read on from the last rowid (#42 item 3).

The rates (runhealth/rules/activity.py) read every node's polls of the last hour: the Overview's
build, each /metrics scrape, the alert history and the late rule each read them again, 368,000
rows at 1,024 nodes every few seconds, and turning them into Python tuples was most of their
cost. `PollRows` keeps the rows it read, per store object, and on the next read fetches only the
polls written since (rowid above the last it saw); the answer is the rows the one SELECT of
`activity.poll_rows` gives, in the same order, the same tuples:

- poll rows are never updated (write_poll inserts them; rollup.py deletes the old ones): the rows
  kept are the rows in the file, as long as none was deleted;
- rowids grow with every insert and writers are serialised, so once a rowid is visible every lower
  one is committed: rows above the last rowid read are exactly the new ones;
- each read counts, in SQL, the rows its answer should hold (`ts_unix >= since`, rowid up to the
  newest the reader's snapshot sees) and reads everything again from SQL when that differs from the
  rows kept (a fold deleted rows in the window, a file emptied) or when the store's file changed
  (`Store.generation`), or when a read reaches further back than the rows kept, or when the row of the
  last rowid read is another poll now (its rowid used again after the newest rows were deleted);
- a reader inside an older snapshot (store.snapshot()) gets the rows up to its own newest rowid.

Rows older than every read of the last TRIM_KEEP_S are let go of, at most once a TRIM_EVERY_S.
"""

from __future__ import annotations

import bisect
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from runhealth.store import Store

COLUMNS = "ts_unix, node_ts_unix, completions, tokens, backfill, prompts, interval_s"
TRIM_EVERY_S = 60.0
TRIM_KEEP_S = 600.0  # the oldest `since` asked for within this long is kept


class _Node:
    """One node's kept rows in rowid order, with their rowids and times (for the slices)."""

    __slots__ = ("rows", "rowids", "times", "ordered")

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.rowids: list[int] = []
        self.times: list[float] = []
        self.ordered = True  # times never decrease (a wall clock stepped back breaks it: then filtered)

    def append(self, rowid: int, row: tuple) -> None:
        if self.times and row[0] < self.times[-1]:
            self.ordered = False
        self.rows.append(row)
        self.rowids.append(rowid)
        self.times.append(row[0])

    def since(self, since: float, upto_rowid: int) -> tuple[list[tuple], int]:
        """(rows with ts_unix >= since and rowid <= upto_rowid, the first one's rowid; -1: none)."""
        end = len(self.rowids) if self.rowids[-1] <= upto_rowid else bisect.bisect_right(self.rowids, upto_rowid)
        if self.ordered:
            start = bisect.bisect_left(self.times, since, 0, end)
            return self.rows[start:end], self.rowids[start] if start < end else -1
        picked = [i for i in range(end) if self.times[i] >= since]
        return [self.rows[i] for i in picked], self.rowids[picked[0]] if picked else -1

    def count_since(self, since: float) -> int:
        if self.ordered:
            return len(self.times) - bisect.bisect_left(self.times, since)
        return sum(1 for t in self.times if t >= since)

    def rows_from(self, since: float) -> Iterator[tuple]:
        """The rows with ts_unix >= since (ordered: from the first such one on, in time order)."""
        if self.ordered:
            for i in range(bisect.bisect_left(self.times, since), len(self.rows)):
                yield self.rows[i]
        else:
            yield from (row for row in self.rows if row[0] >= since)

    def cut_above(self, rowid: int) -> None:
        """Let go of the rows above `rowid` (deleted, or not in the reader's snapshot yet)."""
        end = bisect.bisect_right(self.rowids, rowid)
        del self.rows[end:], self.rowids[end:], self.times[end:]

    def trim(self, since: float) -> None:
        keep = (
            range(bisect.bisect_left(self.times, since), len(self.times))
            if self.ordered
            else [i for i, t in enumerate(self.times) if t >= since]
        )
        self.rows = [self.rows[i] for i in keep]
        self.rowids = [self.rowids[i] for i in keep]
        self.times = [self.times[i] for i in keep]


class PollRows:
    """A store's poll rows from `low` on, up to rowid `top` (see the module docstring)."""

    def __init__(self, store: Store, monotonic: Callable[[], float] = time.monotonic):
        self.store, self.monotonic = store, monotonic
        self.lock = threading.Lock()
        self.generation = -1
        self.low = float("inf")  # every row with ts_unix >= low and rowid <= top is kept
        self.top = 0
        self.top_key: tuple = (None, None)  # (node, ts_unix) of rowid `top`: a rowid used again shows
        self.nodes: dict[str, _Node] = {}
        self.asked: list[tuple[float, float]] = []  # (monotonic, since) of the reads since the last trim
        self.trimmed_at = monotonic()
        self.reloads = 0  # full reads from SQL (tests, the bench)
        # (bucket_s, its type) -> bucket -> [live tokens, live rows with tokens, all tokens, rows with tokens,
        # MIN(backfill)] over every kept row (token_buckets); cleared when rows leave
        self.sums: dict[tuple[float, type], dict[Any, list]] = {}
        self.float_tokens = False  # a kept row's tokens is a float: sums are left to SQL

    def read(self, since_sql: str, params: tuple[Any, ...]) -> dict[str, list[tuple]]:
        """Each node's polls with ts_unix >= since (the SQL expression `since_sql` over `params`,
        evaluated in the check's statement) as (ts_unix, node_ts_unix, completions, tokens,
        backfill, prompts, interval_s), in rowid order; nodes in the order of their first such row
        (what `SELECT node, ... WHERE ts_unix >= since ORDER BY rowid` groups into)."""
        with self.lock:
            since, newest = self._sync(since_sql, params)
            out: dict[str, list[tuple]] = {}
            firsts: dict[str, int] = {}
            for name, node in self.nodes.items():
                rows, first = node.since(since, newest)
                if rows:
                    out[name], firsts[name] = rows, first
        return {name: out[name] for name in sorted(out, key=firsts.__getitem__)}

    def token_buckets(self, bucket_s: float, since: float) -> list[tuple[Any, Any, int]] | None:
        """(bucket_unix, tokens, backfill) per bucket of the polls with ts_unix >= `since`, as
        `Store.polls_by_bucket(bucket_s, since)` sums them (`live_sums`), in bucket order: each
        bucket's sums kept as rows come, the first (cut by `since`) summed from its rows.
        None when a kept token count is no integer (a float sum depends on its order: SQL's then)."""
        with self.lock:
            self._sync("?", (since,))
            if self.float_tokens:
                return None
            sums = self.sums.get((bucket_s, type(bucket_s)))  # 60 and 60.0 give buckets of other types
            if sums is None:
                sums = self.sums[(bucket_s, type(bucket_s))] = {}
                for node in self.nodes.values():
                    for row in node.rows:
                        _add(sums, bucket_s, row)
            first_key = _bucket(since, bucket_s)
            first: dict[Any, list] = {}
            for node in self.nodes.values():
                for row in node.rows_from(since):
                    if _bucket(row[0], bucket_s) == first_key:
                        _add(first, bucket_s, row)
                    elif node.ordered:
                        break
            keys = sorted(k for k in sums if k > first_key)
            return [_bucket_row(k, b) for k, b in (*first.items(), *((k, sums[k]) for k in keys))]

    def _sync(self, since_sql: str, params: tuple[Any, ...]) -> tuple[float, int]:
        """Bring the kept rows up to the newest rowid the reader sees, checked (module docstring);
        returns (since, that rowid). Under the lock. One statement reads what the checks need (a
        screen's statements are counted), a second the new rows when there are any."""
        since, newest, *keys, want = self.store.cursor(
            "SELECT w.since, m.top, (SELECT node FROM polls WHERE rowid = m.top),"
            " (SELECT ts_unix FROM polls WHERE rowid = m.top), (SELECT node FROM polls WHERE rowid = ?),"
            " (SELECT ts_unix FROM polls WHERE rowid = ?),"
            " (SELECT COUNT(*) FROM polls WHERE ts_unix >= w.since AND rowid <= m.top)"
            f" FROM (SELECT {since_sql} AS since) w, (SELECT COALESCE(MAX(rowid), 0) AS top FROM polls) m",
            (self.top, self.top, *params),
        ).fetchone()
        newest_key, top_key = (keys[0], keys[1]), (keys[2], keys[3])
        if self.store.generation != self.generation or since < self.low:
            self._reload(since, newest, newest_key)
        elif newest < self.top:  # the top rows deleted, or a reader in an older snapshot
            for node in self.nodes.values():
                node.cut_above(newest)
            self.sums.clear()
            self.top, self.top_key = newest, newest_key
        elif top_key != self.top_key:  # rowid `top` holds another poll now (or none)
            self._reload(since, newest, newest_key)
        elif newest > self.top:
            self._fetch(
                f"SELECT rowid, node, {COLUMNS} FROM polls WHERE rowid > ? AND rowid <= ? AND ts_unix >= ?"
                " ORDER BY rowid",
                (self.top, newest, self.low),
            )
            self.top, self.top_key = newest, newest_key
        if sum(node.count_since(since) for node in self.nodes.values()) != want:
            self._reload(since, newest, newest_key)  # rows deleted (a fold, a file emptied): read them again
        self._note(since)
        return since, newest

    def _fetch(self, sql: str, params: tuple[Any, ...]) -> None:
        nodes, sums = self.nodes, self.sums
        for rowid, name, *row in self.store.cursor(sql, params):
            node = nodes.get(name)
            if node is None:
                node = nodes[name] = _Node()
            kept = tuple(row)
            node.append(rowid, kept)
            if type(kept[3]) is float:
                self.float_tokens = True
            for (bucket_s, _type), by_bucket in sums.items():
                _add(by_bucket, bucket_s, kept)

    def _reload(self, since: float, newest: int, newest_key: tuple) -> None:
        self.nodes, self.low, self.generation = {}, since, self.store.generation
        self.sums.clear()
        self.float_tokens = False
        self._fetch(
            f"SELECT rowid, node, {COLUMNS} FROM polls WHERE ts_unix >= ? AND rowid <= ? ORDER BY rowid",
            (since, newest),
        )
        self.top, self.top_key = newest, newest_key
        self.reloads += 1

    def _note(self, since: float) -> None:
        """Remember the read; let go of rows older than every read of the last TRIM_KEEP_S."""
        now = self.monotonic()
        self.asked.append((now, since))
        if now - self.trimmed_at < TRIM_EVERY_S:
            return
        self.asked = [(t, s) for t, s in self.asked if now - t <= TRIM_KEEP_S]
        keep_from = min(s for _, s in self.asked)
        if keep_from > self.low:
            for node in self.nodes.values():
                node.trim(keep_from)
            self.sums.clear()
            self.low = keep_from
        self.trimmed_at = now


def _bucket(ts: float, bucket_s: float) -> Any:
    """SQL's CAST(ts_unix / bucket_s AS INTEGER) * bucket_s (ts_unix is REAL: a float division,
    truncated toward zero; an int bucket for an int bucket_s, a float one for a float)."""
    return int(ts / bucket_s) * bucket_s


def _add(sums: dict[Any, list], bucket_s: float, row: tuple) -> None:
    """One poll row (ts_unix, ..., tokens at 3, backfill at 4) into its bucket's sums."""
    key = _bucket(row[0], bucket_s)
    b = sums.get(key)
    if b is None:
        b = sums[key] = [0, 0, 0, 0, None]
    tokens, backfill = row[3], row[4] or 0
    if tokens is not None:
        if not backfill:
            b[0] += tokens
            b[1] += 1
        b[2] += tokens
        b[3] += 1
    b[4] = backfill if b[4] is None else min(b[4], backfill)


def _bucket_row(key: Any, b: list) -> tuple[Any, Any, int]:
    """COALESCE(SUM(live tokens), SUM(tokens)) and MIN(COALESCE(backfill, 0)) of one bucket."""
    return key, b[0] if b[1] else (b[2] if b[3] else None), b[4]


_kept: weakref.WeakKeyDictionary[Store, PollRows] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


def of(store: Store) -> PollRows:
    """The store object's kept poll rows (one per Store object, made on first use)."""
    with _kept_lock:
        found = _kept.get(store)
        if found is None:
            found = _kept[store] = PollRows(store)
        return found
