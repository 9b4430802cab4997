"""Truncation over time kept per bucket as polls arrive: the chart's data at the cost of a poll.

The Overview's truncation-over-time chart is poll deltas summed per time bucket
(`rollup.poll_history`) and the exact-length stops of each bucket split at the ceiling
(`length_stops_by_bucket`). Both used to be recomputed over the whole polls table on every page
refresh: at 512 nodes x 24 h that is 4.4M poll rows every 10 s. A `Truncation` cache keeps every
bucket it has computed and, on each call, recomputes only the buckets that rows written since
the last call fall in (found by rowid, as gpubands does, so a late row stamped in an old bucket
redoes that bucket). What rewrites old rows wholesale (the hourly rollup folding raw polls into
minutes, a store recreated under the dashboard) is noticed by a cheap signature and answered
with a full recomputation, so the cache always returns what a full read returns.
"""

from __future__ import annotations

from typing import Any

from runhealth.payloads.gpubands import SNAPSHOT_FORMAT, oldest_since, row_mark
from runhealth.records import LengthStopBucket, PollBucket
from runhealth.store import Store, rollup

_TIERS = f"({', '.join(str(t) for t in rollup.TIERS)})"


PIECE_S = 60.0  # what a refresh re-reads: the pieces (of this width) new rows fell in, and one before


def _poll_pieces(store: Store, bucket_s: float, since: float) -> list[tuple]:
    """Per (bucket, piece): each delta summed over live polls and over all, and MIN(backfill):
    `live_sums`'s parts, so pieces add up to exactly what it computes per bucket."""
    cols = ", ".join(rollup.POLL_FIELDS)
    rows = f"SELECT ts_unix, {cols}, backfill FROM polls WHERE ts_unix >= ?"
    args: tuple[float, ...] = (since,)
    if rollup.has_rollups(store):
        rows += f" UNION ALL SELECT bucket_unix, {cols}, backfill FROM poll_rollup WHERE res_s IN {_TIERS} AND bucket_unix >= ?"
        args += (since,)
    live = "COALESCE(backfill, 0) = 0"
    sums = ", ".join(f"SUM(CASE WHEN {live} THEN {f} END), SUM({f})" for f in rollup.POLL_FIELDS)
    sql = (
        f"SELECT CAST(ts_unix / ? AS INTEGER) * ?, CAST(ts_unix / {PIECE_S} AS INTEGER), {sums},"
        f" MIN(COALESCE(backfill, 0)) FROM ({rows}) GROUP BY 1, 2"
    )
    return store.cursor(sql, (bucket_s, bucket_s, *args)).fetchall()


def _stop_pieces(store: Store, bucket_s: float, ceiling: int | None, since: float) -> list[tuple]:
    """Per (bucket, piece): stops at or above the ceiling and below it, and the same over the
    stops of backfill polls (`Store.length_stops_by_bucket`'s parts, its backfill search bounded
    by `since` too: the store's finds them over every poll of the run)."""
    limit = ceiling if ceiling is not None else 1 << 62
    head = f"SELECT CAST(ts_unix / ? AS INTEGER) * ?, CAST(ts_unix / {PIECE_S} AS INTEGER),"
    head += " SUM(CASE WHEN tokens >= ? THEN count ELSE 0 END), SUM(CASE WHEN tokens < ? THEN count ELSE 0 END)"
    head += " FROM poll_length_stops WHERE ts_unix >= ?"
    args = (bucket_s, bucket_s, limit, limit, since)
    total: dict[tuple, tuple] = {(r[0], r[1]): (r[2], r[3], None) for r in store.cursor(f"{head} GROUP BY 1, 2", args)}
    ids = "SELECT s.rowid FROM poll_length_stops s JOIN polls p ON p.ts_unix = s.ts_unix AND p.node = s.node"
    ids += " WHERE s.ts_unix >= ? AND p.backfill = 1"
    id_args: tuple[float, ...] = (since,)
    if rollup.has_rollups(store):  # a rolled-up node-minute is backfill if any of its polls was
        ids += (
            " UNION SELECT s.rowid FROM poll_rollup r JOIN poll_length_stops s ON s.node = r.node"
            " AND s.ts_unix >= r.bucket_unix AND s.ts_unix < r.bucket_unix + r.res_s"
            f" WHERE r.res_s IN {_TIERS} AND r.bucket_unix >= ? AND r.backfill = 1 AND s.ts_unix >= ?"
        )
        id_args += (since - max(rollup.TIERS), since)
    for r in store.cursor(f"{head} AND rowid IN ({ids}) GROUP BY 1, 2", (*args, *id_args)):
        total[(r[0], r[1])] = (*total[(r[0], r[1])][:2], (r[2], r[3]))
    return [(b, k, *v) for (b, k), v in total.items()]


def _tuples(x: Any) -> Any:
    """JSON lists back to the tuples a snapshot held (a signature compares equal again)."""
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def _sum(values: list) -> Any:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _poll_bucket(bucket: float, pieces: list[tuple]) -> PollBucket:
    row: dict[str, Any] = {"bucket_unix": bucket}
    for i, f in enumerate(rollup.POLL_FIELDS):
        live = _sum([p[2 + 2 * i] for p in pieces])
        row[f] = live if live is not None else _sum([p[3 + 2 * i] for p in pieces])
    row["backfill"] = min(p[-1] for p in pieces)
    return row  # type: ignore[return-value]


def _stop_rows(bucket: float, pieces: list[tuple]) -> list[LengthStopBucket]:
    at, below = sum(p[2] for p in pieces), sum(p[3] for p in pieces)
    backs = [p[4] for p in pieces if p[4] is not None]
    out: list[dict[str, Any]] = []
    if backs:
        back = (sum(b[0] for b in backs), sum(b[1] for b in backs))
        out.append({"bucket_unix": bucket, "backfill": 1, "at_ceiling": back[0], "below_ceiling": back[1]})
        at, below = at - back[0], below - back[1]
    if not backs or at or below:
        out.append({"bucket_unix": bucket, "backfill": 0, "at_ceiling": at, "below_ceiling": below})
    return out  # type: ignore[return-value]


def span_s(store: Store, bucket_s: float) -> float:
    """From the first bucket of `bucket_s` holding a poll (raw or rolled up) to the last: what
    `poll_history(store, bucket_s)`'s last bucket_unix minus its first is, read in four index seeks."""
    ends = [_ends(store, "ts_unix", "polls", "")]
    if rollup.has_rollups(store):
        ends += [_ends(store, "bucket_unix", "poll_rollup", f" WHERE res_s = {res}") for res in rollup.TIERS]
    lows = [e[0] for e in ends if e[0] is not None]
    highs = [e[1] for e in ends if e[1] is not None]
    if not lows or not highs:
        return 0.0
    return int(max(highs) / bucket_s) * bucket_s - int(min(lows) / bucket_s) * bucket_s


def _signature(store: Store) -> tuple:
    """What changes when old poll rows are rewritten rather than added to: the oldest raw poll
    (the rollup deleted what it folded) and the rollup tiers' extent."""
    sig: list = [store.cursor("SELECT MIN(ts_unix) FROM polls").fetchone()[0]]
    if rollup.has_rollups(store):
        sig += [_ends(store, "bucket_unix", "poll_rollup", f" WHERE res_s = {res}") for res in rollup.TIERS]
    return tuple(sig)


def _ends(store: Store, column: str, table: str, where: str) -> tuple[float | None, float | None]:
    """(MIN, MAX) of an indexed column, as two queries: SQLite answers MIN or MAX alone from the
    index, but both in one SELECT by scanning the table (the whole history)."""
    low = store.cursor(f"SELECT MIN({column}) FROM {table}{where}").fetchone()[0]
    return low, store.cursor(f"SELECT MAX({column}) FROM {table}{where}").fetchone()[0]


def _shrank(seen: int | None, top: int | None) -> bool:
    """The table lost rows it had (emptied, or a store recreated: rowids start again)."""
    return seen is not None and (top is None or top < seen)


def _top(store: Store, table: str) -> int | None:
    return store.cursor(f"SELECT MAX(rowid) FROM {table}").fetchone()[0]


class Truncation:
    """Every (bucket, piece) computed so far for one (bucket width, ceiling); `buckets` brings
    them up to date."""

    TABLES = ("polls", "poll_length_stops")

    def __init__(self, store: Store):
        self.store = store
        self._key: tuple[float, int | None] | None = None
        self._signature: tuple | None = None
        self._seen: dict[str, int | None] = {}  # table -> the last rowid read
        self._polls: dict[tuple[float, int], tuple] = {}  # (bucket, piece) -> its sums
        self._stops: dict[tuple[float, int], tuple] = {}
        self._done: dict[float, tuple[PollBucket | None, list[LengthStopBucket]]] = {}  # bucket -> its rows
        self.redone_from: float | None = None  # the first piece's start the last call read again (tests)

    def snapshot(self) -> dict[str, Any]:
        """The pieces read so far as JSON data, with the rows last seen (see gpubands.Bands.snapshot)."""
        marks = {t: row_mark(self.store, t, "node", self._seen.get(t)) for t in self.TABLES}
        return {
            "format": SNAPSHOT_FORMAT,
            "key": self._key,
            "signature": self._signature,
            "seen": self._seen,
            "marks": marks,
            "polls": [list(p) for p in self._polls.values()],
            "stops": [list(p) for p in self._stops.values()],
        }

    def restore(self, data: Any) -> bool:
        """Take a `snapshot` whose last rows are still the store's (False: ignored, computed again)."""
        if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT or data.get("key") is None:
            return False
        try:
            seen = {t: data["seen"][t] for t in self.TABLES}
            if any(row_mark(self.store, t, "node", seen[t]) != data["marks"][t] for t in self.TABLES):
                return False
            polls = {(p[0], p[1]): _tuples(p) for p in data["polls"]}
            stops = {(p[0], p[1]): _tuples(p) for p in data["stops"]}
            key = (float(data["key"][0]), data["key"][1])
            signature = _tuples(data["signature"])
        except (KeyError, TypeError, ValueError, IndexError):
            return False
        done: dict[float, tuple[list, list]] = {}
        for (b, _k), p in polls.items():
            done.setdefault(b, ([], []))[0].append(p)
        for (b, _k), p in stops.items():
            done.setdefault(b, ([], []))[1].append(p)
        self._done = {
            b: (_poll_bucket(b, ps) if ps else None, _stop_rows(b, ss) if ss else []) for b, (ps, ss) in done.items()
        }
        self._key, self._signature, self._seen, self._polls, self._stops = key, signature, seen, polls, stops
        return True

    def buckets(self, bucket_s: float, ceiling: int | None) -> tuple[list[PollBucket], list[LengthStopBucket]]:
        """(`rollup.poll_history(store, bucket_s)`, `Store.length_stops_by_bucket(bucket_s, ceiling)`),
        reading only the pieces rows were added to since the last call."""
        store = self.store
        signature = _signature(store)
        tops = {t: _top(store, t) for t in self.TABLES}
        seen = self._seen
        full = (bucket_s, ceiling) != self._key or signature != self._signature
        full = full or any(_shrank(seen.get(t), tops[t]) for t in self.TABLES)
        first: int | None = None  # the first piece read again
        if full:
            self._polls, self._stops, self._done = {}, {}, {}
            first = -(1 << 62)
        else:
            new = [oldest_since(store, t, seen[t] or 0) for t in self.TABLES if tops[t] != seen.get(t)]
            oldest = min((t for t in new if t is not None), default=None)
            first = None if oldest is None else int(oldest / PIECE_S)
        if first is not None:
            # From one piece early, its partial sums dropped: SQL's division decides a row's piece.
            since = -1e18 if full else (first - 1) * PIECE_S
            touched = {b for (b, k) in [*self._polls, *self._stops] if k >= first}
            self._polls = {key: v for key, v in self._polls.items() if key[1] < first}
            self._stops = {key: v for key, v in self._stops.items() if key[1] < first}
            for p in _poll_pieces(store, bucket_s, since):
                if p[1] >= first:
                    self._polls[(p[0], p[1])] = p
                    touched.add(p[0])
            for p in _stop_pieces(store, bucket_s, ceiling, since):
                if p[1] >= first:
                    self._stops[(p[0], p[1])] = p
                    touched.add(p[0])
            by_bucket: dict[float, tuple[list, list]] = {b: ([], []) for b in touched}
            for (b, _k), p in self._polls.items():
                if b in by_bucket:
                    by_bucket[b][0].append(p)
            for (b, _k), p in self._stops.items():
                if b in by_bucket:
                    by_bucket[b][1].append(p)
            for b, (polls, stops) in by_bucket.items():
                if polls or stops:
                    self._done[b] = (_poll_bucket(b, polls) if polls else None, _stop_rows(b, stops) if stops else [])
                else:
                    self._done.pop(b, None)
        self.redone_from = None if first is None else (-float("inf") if full else first * PIECE_S)
        self._key, self._signature, self._seen = (bucket_s, ceiling), signature, tops
        done = [self._done[b] for b in sorted(self._done)]
        return [p for p, _s in done if p is not None], [s for _p, stops in done for s in stops]
