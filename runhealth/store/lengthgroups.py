"""The length counts grouped by histogram bucket, kept by triggers: what a /metrics scrape reads.

A scrape's count figures (completions by node and finish reason, each node's length histogram,
the completions and tokens cut at the ceiling, the usable tokens) are sums over groups of
`node_length_counts` rows (runhealth/alerting/countgroups.py). Store migration 15 keeps those
groups in `node_length_groups`: per (node, finish reason, estimated, bucket) the raw rows in it,
their completions and their tokens x completions, where a row's bucket is the number of
`length_splits` bounds below its length. Triggers on node_length_counts keep it equal to that
GROUP BY over the raw rows through every write (a poll's upsert, a reset's subtract and DELETE,
a test's own rows), so a scrape reads a few thousand groups instead of every distinct length of
every node (2.8M rows at 1,024 nodes and an hour: ~4 CPU s a scrape).

The bounds a scrape needs depend on the ceiling (exporter.length_buckets and the ceiling - 1 for
the cut), which is configured or detected. `cover` makes the stored bounds include them,
rebuilding the groups in one transaction when they do not: one scan of the raw rows per ceiling
the run ever has. Bounds only grow (a detected ceiling that changes back finds its bounds still
there), up to MAX_SPLITS; past that they start again from the ones asked for.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from runhealth.store.lifecycle import StoreFile

MAX_SPLITS = 64  # a ceiling adds at most 11 bounds: a few ceilings' worth before the bounds start again


SPLITS_SQL = "SELECT bound FROM length_splits ORDER BY bound"  # the bounds the groups are bucketed by


def bucket_sql(splits: Sequence[int]) -> str:
    """The bucket of a row of node_length_counts as SQL: how many of the ascending `splits` are
    below its tokens (the triggers' `SELECT COUNT(*) FROM length_splits WHERE bound < tokens`)."""
    whens = " ".join(f"WHEN tokens <= {int(b)} THEN {i}" for i, b in enumerate(splits))
    return f"CASE {whens} ELSE {len(splits)} END" if splits else "0"


def rebuild(db: sqlite3.Connection, splits: Iterable[int]) -> None:
    """Bucket node_length_groups by `splits` (inside the caller's write transaction): one scan."""
    bounds = sorted({int(b) for b in splits})
    db.execute("DELETE FROM length_splits")
    db.executemany("INSERT INTO length_splits VALUES (?)", [(b,) for b in bounds])
    db.execute("DELETE FROM node_length_groups")
    db.execute(
        f"INSERT INTO node_length_groups SELECT node, finish_reason, estimated, {bucket_sql(bounds)}, COUNT(*),"
        " SUM(count), SUM(tokens * count) FROM node_length_counts NOT INDEXED GROUP BY 1, 2, 3, 4"
    )


def cover(store: StoreFile, needed: Iterable[int]) -> bool:
    """Make the stored bounds include `needed`; True when the groups were rebuilt for it.

    Raises whatever the store's write raises (sqlite3.Error, StoreError): a caller that cannot
    write the store reads the raw rows instead.
    """
    want = {int(b) for b in needed}
    if want <= {r[0] for r in store.cursor(SPLITS_SQL)}:
        return False
    with store.transaction() as db:
        have = {r[0] for r in db.execute(SPLITS_SQL)}  # another process may have covered them meanwhile
        if want <= have:
            return False
        merged = have | want
        rebuild(db, merged if len(merged) <= MAX_SPLITS else want)
    return True
