"""Whole-run history at a bounded cost: raw samples for a window, then 1-minute and 10-minute rollups.

A generation run lasts days to weeks. Raw 10 s rows (GPU samples, poll deltas, server metrics)
are kept for `raw_keep_s` (default 24 h); older ones are folded into 1-minute rows, and 1-minute
rows older than `fine_keep_s` (default 7 days) into 10-minute rows, kept for the rest of the run.
Each fold runs in one transaction (insert the buckets, delete what they summarise), so a reader
sees either the raw rows or their rollup, never both or neither. Cutoffs are aligned to whole
buckets, so a bucket is only ever built from complete data; rows that arrive late for a bucket
already rolled up are merged into it (weighted means, sums, maxima).

The reads (`gpu_history`, `poll_history`) union raw and rolled-up rows in SQL and bucket them to
the width the chart asks for, so every chart can span the whole run.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from runhealth.records import GpuSeriesPoint, PollBucket, rows_as
from runhealth.settings.windows import FINE_KEEP_S, RAW_KEEP_S
from runhealth.store import Store, live_sums
from runhealth.store.reads import GPU_FIELDS, RAW_GPU_ROWS

CHUNK_S = 120.0  # data folded per transaction: at 512 nodes about 2 s of write lock (bench/history.py)
PAUSE_S = 0.05  # between chunks, so pollers waiting on the write lock get their turn
TIERS = (60, 600)
_GPU = GPU_FIELDS
_POLL = ("completions", "tokens", "length_stops", "malformed")
POLL_FIELDS = _POLL  # the deltas a poll row and a rolled-up one hold (truncbuckets sums them too)
# ... and the ones only folded: the distinct prompts each poll added (migration 12; NULL before it,
# and SUM keeps a bucket of only such polls NULL), which the charts do not draw.
_FOLDED = (*_POLL, "prompts")


def _mean_merge(col: str) -> str:
    """ON CONFLICT: the weighted mean of the stored and the new bucket (NULLs ignored)."""
    return (
        f"{col} = CASE WHEN {col} IS NULL THEN excluded.{col} WHEN excluded.{col} IS NULL THEN {col}"
        f" ELSE ({col} * n + excluded.{col} * excluded.n) / (n + excluded.n) END"
    )


def _fold_gpu(db: sqlite3.Connection, src: str, res: int, cutoff: float, src_res: int | None) -> None:
    where = "ts_unix < ?" if src_res is None else "res_s = ? AND bucket_unix < ?"
    ts = "ts_unix" if src_res is None else "bucket_unix"
    weight = "1" if src_res is None else "n"
    means = ", ".join(
        f"SUM({f} * {weight}) / NULLIF(SUM(CASE WHEN {f} IS NULL THEN 0 ELSE {weight} END), 0)" for f in _GPU
    )
    params = (cutoff,) if src_res is None else (src_res, cutoff)
    db.execute(
        f"INSERT INTO gpu_rollup SELECT {res}, CAST({ts} / {res} AS INTEGER) * {res}, node, gpu, SUM({weight}),"
        f" {means}, MAX(throttled) FROM {src} WHERE {where} GROUP BY 2, node, gpu"
        " ON CONFLICT (res_s, bucket_unix, node, gpu) DO UPDATE SET "
        + ", ".join(_mean_merge(f) for f in _GPU)
        + ", throttled = MAX(throttled, excluded.throttled),"
        " n = n + excluded.n",
        params,
    )
    db.execute(f"DELETE FROM {src} WHERE {where}", params)


def _fold_polls(db: sqlite3.Connection, src: str, res: int, cutoff: float, src_res: int | None) -> None:
    where = "ts_unix < ?" if src_res is None else "res_s = ? AND bucket_unix < ?"
    ts = "ts_unix" if src_res is None else "bucket_unix"
    polls = "COUNT(*)" if src_res is None else "SUM(polls)"
    params = (cutoff,) if src_res is None else (src_res, cutoff)
    sums = ", ".join(f"SUM({f})" for f in _FOLDED)
    cols = ", ".join(_FOLDED)
    db.execute(
        f"INSERT INTO poll_rollup (res_s, bucket_unix, node, polls, {cols}, backfill)"
        f" SELECT {res}, CAST({ts} / {res} AS INTEGER) * {res}, node, {polls}, {sums},"
        f" MAX(backfill) FROM {src} WHERE {where} GROUP BY 2, node"
        " ON CONFLICT (res_s, bucket_unix, node) DO UPDATE SET polls = polls + excluded.polls, "
        + ", ".join(f"{f} = {f} + excluded.{f}" for f in _POLL)
        + ", prompts = CASE WHEN prompts IS NULL THEN excluded.prompts"
        " WHEN excluded.prompts IS NULL THEN prompts ELSE prompts + excluded.prompts END"
        + ", backfill = MAX(backfill, excluded.backfill)",
        params,
    )
    db.execute(f"DELETE FROM {src} WHERE {where}", params)


def _fold_metrics(db: sqlite3.Connection, src: str, res: int, cutoff: float, src_res: int | None) -> None:
    where = "ts_unix < ?" if src_res is None else "res_s = ? AND bucket_unix < ?"
    ts = "ts_unix" if src_res is None else "bucket_unix"
    weight, top = ("1", "value") if src_res is None else ("n", "value_max")
    params = (cutoff,) if src_res is None else (src_res, cutoff)
    db.execute(
        f"INSERT INTO metric_rollup SELECT {res}, CAST({ts} / {res} AS INTEGER) * {res}, node, name, SUM({weight}),"
        f" SUM(value * {weight}) / SUM({weight}), MAX({top}) FROM {src} WHERE {where} GROUP BY 2, node, name"
        " ON CONFLICT (res_s, bucket_unix, node, name) DO UPDATE SET "
        + _mean_merge("value")
        + ", value_max = MAX(value_max, excluded.value_max), n = n + excluded.n",
        params,
    )
    db.execute(f"DELETE FROM {src} WHERE {where}", params)


def rollup(
    store: Store,
    now: float | None = None,
    raw_keep_s: float = RAW_KEEP_S,
    fine_keep_s: float = FINE_KEEP_S,
    chunk_s: float = CHUNK_S,
    pause_s: float = PAUSE_S,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Fold raw rows older than `raw_keep_s` into 1-min rows, 1-min rows older than `fine_keep_s` into 10-min.

    Work is done `chunk_s` of data per transaction, releasing the store's write lock (which the
    pollers wait on) in between; bench/history.py measures how long each chunk holds it.
    `should_stop()` is asked before each chunk: true ends the fold there (the rest waits for
    the next call; every chunk done is complete).
    """
    now = time.time() if now is None else now
    raw_cut = (now - raw_keep_s) // TIERS[0] * TIERS[0]
    fine_cut = (now - fine_keep_s) // TIERS[1] * TIERS[1]
    oldest = store.cursor(
        "SELECT MIN(t) FROM (SELECT MIN(ts_unix) AS t FROM gpu_samples UNION ALL"
        " SELECT MIN(ts_unix) FROM polls UNION ALL SELECT MIN(ts_unix) FROM metric_samples)"
    ).fetchone()[0]
    for cut in _steps(oldest, raw_cut, chunk_s, TIERS[0]):
        if should_stop():
            return
        time.sleep(pause_s)
        with store.transaction() as db:
            _fold_gpu(db, "gpu_samples", TIERS[0], cut, None)
            _fold_polls(db, "polls", TIERS[0], cut, None)
            _fold_metrics(db, "metric_samples", TIERS[0], cut, None)
    oldest = store.cursor("SELECT MIN(bucket_unix) FROM gpu_rollup WHERE res_s = ?", (TIERS[0],)).fetchone()[0]
    for cut in _steps(oldest, fine_cut, chunk_s * TIERS[1] / TIERS[0], TIERS[1]):
        if should_stop():
            return
        time.sleep(pause_s)
        with store.transaction() as db:
            _fold_gpu(db, "gpu_rollup", TIERS[1], cut, TIERS[0])
            _fold_polls(db, "poll_rollup", TIERS[1], cut, TIERS[0])
            _fold_metrics(db, "metric_rollup", TIERS[1], cut, TIERS[0])


def _steps(oldest: float | None, cutoff: float, chunk_s: float, tier: int) -> list[float]:
    """Cutoffs from just past `oldest` up to `cutoff`, `chunk_s` apart (whole buckets of `tier`)."""
    if oldest is None or oldest >= cutoff:
        return []
    step = max(tier, chunk_s // tier * tier)
    first = (oldest // step + 1) * step
    return [*_frange(first, cutoff, step), cutoff]


def _frange(start: float, stop: float, step: float) -> list[float]:
    out = []
    while start < stop:
        out.append(start)
        start += step
    return out


def has_rollups(store: Store) -> bool:
    """Whether rows were folded into this store's rollup tables yet (until then, the raw rows
    are the whole history; the tables themselves come with the store, migrations.py step 6)."""
    sql = " OR ".join(f"EXISTS (SELECT 1 FROM {t}_rollup)" for t in ("gpu", "poll", "metric"))
    return bool(store.cursor(f"SELECT {sql}").fetchone()[0])


def gpu_history(store: Store, since_unix: float | None = None, max_points: int = 400) -> list[GpuSeriesPoint]:
    """`Store.gpu_series` over raw and rolled-up rows: the whole run in <= max_points per GPU.

    One downsampling (`Store.gpu_buckets`) for both; before the first fold the raw rows are the
    whole history and `gpu_series` reads them without the union (bench/gpuread.py: ~1.5x faster
    on a day of 64 GPUs, the same numbers, tests/test_rollup.py)."""
    if not has_rollups(store):
        return store.gpu_series(since_unix=since_unix, max_points=max_points)
    since = -1e18 if since_unix is None else since_unix
    rows = (
        f"{RAW_GPU_ROWS} WHERE ts_unix >= ?"
        f" UNION ALL SELECT bucket_unix, node, gpu, n, {', '.join(_GPU)}, throttled FROM gpu_rollup WHERE bucket_unix >= ?"
    )
    return store.gpu_buckets(rows, (since, since), max_points)


def poll_history(store: Store, bucket_s: float, since_unix: float | None = None) -> list[PollBucket]:
    """Like `Store.polls_by_bucket`, over raw and rolled-up poll deltas (buckets >= the rollup's
    width; a rolled-up row is one node's minute, backfill if any of its polls was)."""
    if not has_rollups(store):
        return store.polls_by_bucket(bucket_s, since_unix=since_unix)
    since = -1e18 if since_unix is None else since_unix
    cols = ", ".join(_POLL)
    rows = (
        f"SELECT ts_unix, {cols}, backfill FROM polls WHERE ts_unix >= ?"
        f" UNION ALL SELECT bucket_unix, {cols}, backfill FROM poll_rollup WHERE res_s IN {TIERS} AND bucket_unix >= ?"
    )
    return rows_as(
        PollBucket,
        store.query(
            f"SELECT CAST(ts_unix / ? AS INTEGER) * ? AS bucket_unix, {live_sums(_POLL)}"
            f" FROM ({rows}) GROUP BY 1 ORDER BY 1",
            (bucket_s, bucket_s, since, since),
        ),
    )
