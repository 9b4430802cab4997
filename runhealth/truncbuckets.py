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

from runhealth import rollup
from runhealth.gpubands import oldest_since
from runhealth.records import LengthStopBucket, PollBucket, rows_as
from runhealth.store import Store

_TIERS = f"({', '.join(str(t) for t in rollup.TIERS)})"


def length_stops_by_bucket(
    store: Store, bucket_s: float, ceiling: int | None, since_unix: float | None = None
) -> list[LengthStopBucket]:
    """`Store.length_stops_by_bucket`, with `since_unix` also bounding the search for backfill
    stops (the store's version finds them over every poll of the run, then keeps the recent)."""
    limit = ceiling if ceiling is not None else 1 << 62
    since = -1e18 if since_unix is None else since_unix
    head = "SELECT CAST(ts_unix / ? AS INTEGER) * ? AS b, SUM(CASE WHEN tokens >= ? THEN count ELSE 0 END),"
    head += " SUM(CASE WHEN tokens < ? THEN count ELSE 0 END) FROM poll_length_stops WHERE ts_unix >= ?"
    args = (bucket_s, bucket_s, limit, limit, since)
    total = store.cursor(f"{head} GROUP BY 1 ORDER BY 1", args).fetchall()
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
    first = {r[0]: (r[1], r[2]) for r in store.cursor(f"{head} AND rowid IN ({ids}) GROUP BY 1", (*args, *id_args))}
    out = []
    for b, at, below in total:  # a row per (bucket, backfill) that holds stops; the live part is the rest
        back = first.get(b)
        if back is not None:
            out.append({"bucket_unix": b, "backfill": 1, "at_ceiling": back[0], "below_ceiling": back[1]})
            at, below = at - back[0], below - back[1]
        if back is None or at or below:
            out.append({"bucket_unix": b, "backfill": 0, "at_ceiling": at, "below_ceiling": below})
    return rows_as(LengthStopBucket, out)


def span_s(store: Store, bucket_s: float) -> float:
    """From the first bucket of `bucket_s` holding a poll (raw or rolled up) to the last: what
    `poll_history(store, bucket_s)`'s last bucket_unix minus its first is, read in four index seeks."""
    ends = [store.cursor("SELECT MIN(ts_unix), MAX(ts_unix) FROM polls").fetchone()]
    if rollup.has_rollups(store):
        sql = "SELECT MIN(bucket_unix), MAX(bucket_unix) FROM poll_rollup WHERE res_s = ?"
        ends += [store.cursor(sql, (res,)).fetchone() for res in rollup.TIERS]
    lows = [e[0] for e in ends if e[0] is not None]
    highs = [e[1] for e in ends if e[1] is not None]
    if not lows:
        return 0.0
    return int(max(highs) / bucket_s) * bucket_s - int(min(lows) / bucket_s) * bucket_s


def _signature(store: Store) -> tuple:
    """What changes when old poll rows are rewritten rather than added to: the oldest raw poll
    (the rollup deleted what it folded) and the rollup tiers' extent."""
    sig: list = [store.cursor("SELECT MIN(ts_unix) FROM polls").fetchone()[0]]
    if rollup.has_rollups(store):
        sql = "SELECT MIN(bucket_unix), MAX(bucket_unix) FROM poll_rollup WHERE res_s = ?"
        sig += [tuple(store.cursor(sql, (res,)).fetchone()) for res in rollup.TIERS]
    return tuple(sig)


def _top(store: Store, table: str) -> int | None:
    return store.cursor(f"SELECT MAX(rowid) FROM {table}").fetchone()[0]


class Truncation:
    """Every bucket computed so far for one (bucket width, ceiling); `buckets` brings them up to date."""

    TABLES = ("polls", "poll_length_stops")

    def __init__(self, store: Store):
        self.store = store
        self._key: tuple[float, int | None] | None = None
        self._signature: tuple | None = None
        self._seen: dict[str, int | None] = {}  # table -> the last rowid read
        self._polls: dict[float, PollBucket] = {}
        self._split: dict[float, list[LengthStopBucket]] = {}
        self.redone_from: float | None = None  # the first bucket the last call recomputed (tests)

    def buckets(self, bucket_s: float, ceiling: int | None) -> tuple[list[PollBucket], list[LengthStopBucket]]:
        """(`rollup.poll_history(store, bucket_s)`, `length_stops_by_bucket(store, bucket_s, ceiling)`),
        recomputing only the buckets rows were added to since the last call."""
        store = self.store
        signature = _signature(store)
        tops = {t: _top(store, t) for t in self.TABLES}
        seen = self._seen
        full = (bucket_s, ceiling) != self._key or signature != self._signature
        full = full or any(seen.get(t) is not None and (tops[t] is None or tops[t] < seen[t]) for t in self.TABLES)
        if full:
            since = None
            self._polls, self._split = {}, {}
        else:
            new = [oldest_since(store, t, seen[t] or 0) for t in self.TABLES if tops[t] != seen.get(t)]
            oldest = min((t for t in new if t is not None), default=None)
            since = None if oldest is None else int(oldest / bucket_s) * bucket_s
        if full or since is not None:
            # One bucket early, its partial sums dropped: SQL's division decides a row's bucket.
            read_from = None if since is None else since - bucket_s
            keep = -1e300 if since is None else since
            self._polls = {b: r for b, r in self._polls.items() if b < keep}
            self._split = {b: r for b, r in self._split.items() if b < keep}
            for p in rollup.poll_history(store, bucket_s, since_unix=read_from):
                if p["bucket_unix"] >= keep:
                    self._polls[p["bucket_unix"]] = p
            for s in length_stops_by_bucket(store, bucket_s, ceiling, since_unix=read_from):
                if s["bucket_unix"] >= keep:
                    self._split.setdefault(s["bucket_unix"], []).append(s)
        self.redone_from = -float("inf") if full else since
        self._key, self._signature, self._seen = (bucket_s, ceiling), signature, tops
        polls = [self._polls[b] for b in sorted(self._polls)]
        split = [s for b in sorted(self._split) for s in self._split[b]]
        return polls, split
