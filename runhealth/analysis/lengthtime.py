"""Completion lengths per hour for the whole run: percentiles and the share at the ceiling over time.

The store's length counts cover the whole run with no time axis. Here every poll's new counts
are also added to one row per (hour, length, finish by length or not, estimated, backfill):
lengths of completions that stopped by length are kept exactly (they are few distinct values,
and the share at the ceiling must be exact), other lengths are binned on a log scale with 16
bins per doubling (a bin is at most 4.4% wide). So percentiles over time are bin upper edges,
at most 4.4% above the exact value, while the share at the ceiling is exact. An hour
holds at most ~200 rows (about 5,000 a day), whatever the fleet size. Counts from first scans and
catch-up polls (`backfill`) are kept apart: they were written before the hour they land in.
"""

from __future__ import annotations

import math
from typing import Any

from runhealth.analysis import stats
from runhealth.node.wire import count_rows
from runhealth.store import Store

HOUR = 3600
BINS_PER_DOUBLING = 16
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS length_hourly (bucket_unix INTEGER NOT NULL, tokens INTEGER NOT NULL,"
    " by_length INTEGER NOT NULL, estimated INTEGER NOT NULL, backfill INTEGER NOT NULL, count INTEGER NOT NULL,"
    " PRIMARY KEY (bucket_unix, tokens, by_length, estimated, backfill)) WITHOUT ROWID"
)


def bin_upper(tokens: int) -> int:
    """The upper edge of the log bin holding `tokens` (exact below 16 tokens)."""
    if tokens < 16:
        return int(tokens)
    return math.ceil(2 ** (math.ceil(math.log2(tokens) * BINS_PER_DOUBLING) / BINS_PER_DOUBLING))


def ensure_schema(store: Store) -> None:
    with store.transaction() as db:  # the table belongs to this module; the store only hosts it
        db.execute(_SCHEMA)


def record(store: Store, node: str, reply: dict[str, Any], ts_unix: float) -> None:
    """Add a poll reply's new counts to its hour (call after `Store.record_poll` applied it)."""
    rows: dict[tuple, int] = {}
    for entry in ((reply.get("shards") or {}).get("files") or {}).values():
        for r in count_rows(entry.get("counts") or []):
            by_length = int(r.finish_reason == stats.LENGTH)
            key = (int(r.tokens) if by_length else bin_upper(int(r.tokens)), by_length, int(bool(r.estimated)))
            rows[key] = rows.get(key, 0) + int(r.count)
    if not rows:
        return
    last = store.query("SELECT backfill FROM polls WHERE node = ? ORDER BY ts_unix DESC LIMIT 1", (node,))
    backfill = int(bool(last and last[0]["backfill"]))
    bucket = int(ts_unix // HOUR * HOUR)
    with store.transaction() as db:
        db.execute(_SCHEMA)
        db.executemany(
            "INSERT INTO length_hourly VALUES (?,?,?,?,?,?) ON CONFLICT (bucket_unix, tokens, by_length, estimated,"
            " backfill) DO UPDATE SET count = count + excluded.count",
            [(bucket, t, b, e, backfill, n) for (t, b, e), n in rows.items()],
        )


def hourly(store: Store, ceiling: int | None) -> list[dict[str, Any]]:
    """Per hour: n, p50/p90/p99 (bin upper edges) and the exact share stopped at `ceiling`.

    Uses exact token counts when the run has any (as `stats.summarize` does); backfill hours
    are flagged, not merged into the hours after them.
    """
    if not store.query("SELECT 1 FROM sqlite_master WHERE name = 'length_hourly'"):
        return []
    estimated = 0 if store.query("SELECT 1 FROM length_hourly WHERE estimated = 0 LIMIT 1") else 1
    by_hour: dict[int, dict[str, Any]] = {}
    for r in store.query(
        "SELECT bucket_unix, tokens, by_length, MAX(backfill) AS backfill, SUM(count) AS n"
        " FROM length_hourly WHERE estimated = ? GROUP BY bucket_unix, tokens, by_length"
        " ORDER BY bucket_unix, tokens",
        (estimated,),
    ):
        h = by_hour.setdefault(r["bucket_unix"], {"pairs": {}, "at": 0, "backfill": 0})
        h["pairs"][r["tokens"]] = h["pairs"].get(r["tokens"], 0) + r["n"]
        h["backfill"] |= r["backfill"]
        if r["by_length"] and ceiling is not None and r["tokens"] >= ceiling:
            h["at"] += r["n"]
    out = []
    for bucket, h in sorted(by_hour.items()):
        pairs = sorted(h["pairs"].items())
        n = sum(c for _t, c in pairs)
        row = {
            "bucket_unix": bucket,
            "completions": n,
            "at_ceiling": h["at"],
            "backfill": h["backfill"],
            "at_ceiling_fraction": h["at"] / n if n else 0.0,
        }
        for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
            row[name] = stats.percentile_nearest_rank(pairs, q)
        out.append(row)
    return out
