"""Completion lengths per hour for the whole run: percentiles and the share at the ceiling over time.

The store's length counts cover the whole run with no time axis. With them, in the same
transaction, the store adds every poll's new counts to one row per (hour, length, finish by
length or not, estimated, backfill) of `length_hourly` (rows: runhealth.ingest.HourlyLengthRow):
lengths of completions that stopped by length are kept exactly (they are few distinct values,
and the share at the ceiling must be exact), other lengths are binned on a log scale with 16
bins per doubling (`ingest.bin_upper`: a bin is at most 4.4% wide). So percentiles over time are bin upper edges,
at most 4.4% above the exact value, while the share at the ceiling is exact. An hour
holds at most ~200 rows (about 5,000 a day), whatever the fleet size. Counts from first scans and
catch-up polls (`backfill`) are kept apart: they were written before the hour they land in.
"""

from __future__ import annotations

from typing import Any

from runhealth.analysis import stats
from runhealth.store import Store


def hourly(store: Store, ceiling: int | None) -> list[dict[str, Any]]:
    """Per hour: n, p50/p90/p99 (bin upper edges) and the exact share stopped at `ceiling`.

    Uses exact token counts when the run has any (as `stats.summarize` does); backfill hours
    are flagged, not merged into the hours after them.
    """
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
