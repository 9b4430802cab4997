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
from collections.abc import Callable
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
        self.top_key: tuple | None = None  # (node, ts_unix) of rowid `top`: a rowid used again shows
        self.nodes: dict[str, _Node] = {}
        self.asked: list[tuple[float, float]] = []  # (monotonic, since) of the reads since the last trim
        self.trimmed_at = monotonic()
        self.reloads = 0  # full reads from SQL (tests, the bench)

    def read(self, since: float) -> dict[str, list[tuple]]:
        """Each node's polls with ts_unix >= `since` as (ts_unix, node_ts_unix, completions,
        tokens, backfill, prompts, interval_s), in rowid order; nodes in the order of their first
        such row (what `SELECT node, ... WHERE ts_unix >= since ORDER BY rowid` groups into)."""
        with self.lock:
            newest = self.store.cursor("SELECT MAX(rowid) FROM polls").fetchone()[0] or 0
            if self.store.generation != self.generation or since < self.low:
                self._reload(since, newest)
            elif newest < self.top:  # the top rows deleted, or a reader in an older snapshot
                for node in self.nodes.values():
                    node.cut_above(newest)
                self.top, self.top_key = newest, self._key(newest)
            elif self._key(self.top) != self.top_key:  # rowid `top` holds another poll now
                self._reload(since, newest)
            if newest > self.top:
                self._extend(newest)
            out, firsts, held = self._answer(since, newest)
            want = self.store.cursor(
                "SELECT COUNT(*) FROM polls WHERE ts_unix >= ? AND rowid <= ?", (since, newest)
            ).fetchone()[0]
            if want != held:  # rows deleted (a fold, a file emptied) or not seen: read them again
                self._reload(since, newest)
                out, firsts, _ = self._answer(since, newest)
            self._note(since)
        return {name: out[name] for name in sorted(out, key=firsts.__getitem__)}

    def _answer(self, since: float, upto: int) -> tuple[dict[str, list[tuple]], dict[str, int], int]:
        out: dict[str, list[tuple]] = {}
        firsts: dict[str, int] = {}
        held = 0
        for name, node in self.nodes.items():
            if not node.rowids:
                continue
            rows, first = node.since(since, upto)
            if rows:
                out[name], firsts[name] = rows, first
                held += len(rows)
        return out, firsts, held

    def _fetch(self, sql: str, params: tuple[Any, ...]) -> None:
        nodes = self.nodes
        for rowid, name, *row in self.store.cursor(sql, params):
            node = nodes.get(name)
            if node is None:
                node = nodes[name] = _Node()
            node.append(rowid, tuple(row))

    def _key(self, rowid: int) -> tuple | None:
        row = self.store.cursor("SELECT node, ts_unix FROM polls WHERE rowid = ?", (rowid,)).fetchone()
        return None if row is None else tuple(row)

    def _reload(self, since: float, newest: int) -> None:
        self.nodes, self.low, self.generation = {}, since, self.store.generation
        self._fetch(
            f"SELECT rowid, node, {COLUMNS} FROM polls WHERE ts_unix >= ? AND rowid <= ? ORDER BY rowid",
            (since, newest),
        )
        self.top, self.top_key = newest, self._key(newest)
        self.reloads += 1

    def _extend(self, newest: int) -> None:
        self._fetch(
            f"SELECT rowid, node, {COLUMNS} FROM polls WHERE rowid > ? AND rowid <= ? AND ts_unix >= ? ORDER BY rowid",
            (self.top, newest, self.low),
        )
        self.top, self.top_key = newest, self._key(newest)

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
            self.low = keep_from
        self.trimmed_at = now


_kept: weakref.WeakKeyDictionary[Store, PollRows] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


def of(store: Store) -> PollRows:
    """The store object's kept poll rows (one per Store object, made on first use)."""
    with _kept_lock:
        found = _kept.get(store)
        if found is None:
            found = _kept[store] = PollRows(store)
        return found
