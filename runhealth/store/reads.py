"""The store's named reads: what pages, components, the exporter and the alerts read.

Aggregation and downsampling happen in SQL; each read returns plain lists of dicts typed by
runhealth/records.py (one TypedDict per read shape), so components can build DataFrames.
Totals leave out superseded nodes (`counted_where`); run-level series sum each bucket's live
polls (`live_sums`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runhealth.node.wire import ShardCursor
from runhealth.records import (
    LENGTH,
    AlertEpisodeRow,
    EnergyRow,
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
from runhealth.settings.runsettings import RunSettings
from runhealth.store import lengthgroups
from runhealth.store.lifecycle import StoreFile

GPU_FIELDS = ("util_pct", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w", "temp_c", "sm_clock_mhz")
# A shard row as ShardRow names it: the column `lines` counts completions (every line is the wire's `lines`).
SHARD_COLUMNS = (
    "node, path, inode, offset, size, lines AS completions, malformed, tokens, resets, error, updated_unix,"
    " blank_lines, mark, replaced_unix"
)
# The raw GPU samples as `gpu_buckets` reads them (a rolled-up row has the same columns, n its samples).
RAW_GPU_ROWS = f"SELECT ts_unix, node, gpu, 1 AS n, {', '.join(GPU_FIELDS)}, throttled FROM gpu_samples"


class StoreReads(StoreFile):
    """The named reads (pages and components use these, never raw SQL of their own)."""

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
                " SUM(lines) AS completions, SUM(malformed) AS malformed, SUM(blank_lines) AS blank_lines,"
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
            for key in (
                "shards",
                "bytes_indexed",
                "bytes_total",
                "completions",
                "malformed",
                "blank_lines",
                "shard_errors",
            ):
                r[key] = t.get(key) or 0
        return rows_as(NodeRow, rows)

    def counted_nodes(self) -> list[NodeRow]:
        """`nodes()` less the superseded ones: the rows whose completions and malformed lines the run's totals add."""
        gone = self.superseded_nodes()
        return [n for n in self.nodes() if n["name"] not in gone]

    def shards(self, node: str | None = None) -> list[ShardRow]:
        sql = f"SELECT {SHARD_COLUMNS} FROM shards" + (" WHERE node = ?" if node else "") + " ORDER BY node, path"
        return rows_as(ShardRow, self.query(sql, (node,) if node else ()))

    def length_counts(self, by: str = "run", finish_reason: str | None = None) -> list[LengthCountRow]:
        """Completions counted by exact length and finish reason, grouped by run, node or shard.

        Rows: {[node], [path], tokens, finish_reason (None if absent), estimated, count};
        `finish_reason` keeps only that reason's rows (e.g. "length": the few that matter for
        ceilings, instead of every length of every shard).
        """
        table = "length_counts" if by == "shard" else "node_length_counts"
        where, params = self.counted_where()
        if by == "run" and not params:  # no node left out: the run's own rows (a few thousand), in key order
            where = " WHERE finish_reason = ?" if finish_reason else ""
            sql = f"SELECT tokens, finish_reason, estimated, count FROM run_length_counts{where}"
            return _reasons_named(self.query(sql, (finish_reason,) if finish_reason else ()))
        if by == "run":
            return _reasons_named(self.query(*_run_less(params, finish_reason)))
        keys = "node, " if by == "node" else "node, path, "  # one row per key already: the table's primary key
        if finish_reason == LENGTH:  # the few rows the length stops' partial index (migration 15) finds (a
            # literal, so it serves), in the order they were written, as the whole table's scan gave them
            # before the index (the group tables' ties go by it)
            sql = f"SELECT {keys}tokens, finish_reason, estimated, count FROM {table} INDEXED BY {table}_length"
            return _reasons_named(self.query(f"{sql}{where} AND finish_reason = '{LENGTH}' ORDER BY rowid", params))
        if finish_reason:
            where, params = where + " AND finish_reason = ?", (*params, finish_reason)
        return _reasons_named(
            self.query(f"SELECT {keys}tokens, finish_reason, estimated, count FROM {table}{where}", params)
        )

    def run_length_rows(self) -> list[tuple[int, str | None, int, int]]:
        """`length_counts(by="run")` as (tokens, finish_reason or None, estimated, count) tuples,
        in the same order: stats.LengthHist.from_rows's input, without a dict per row (a run's
        few thousand rows, read on every live page's rerun: #42 item 2)."""
        _where_clause, gone = self.counted_where()
        if gone:
            sql, params = _run_less(gone, None)
        else:
            sql, params = "SELECT tokens, finish_reason, estimated, count FROM run_length_counts", ()
        return [(t, r or None, e, n) for t, r, e, n in self.cursor(sql, params)]

    def group_totals(self, by: str) -> list[GroupTotalRow]:
        """Per node or shard: completions counted, and how many of them have exact token counts.

        Summed from the aggregates the store's triggers keep (migration 15: node_length_groups,
        a few rows a node; shard_length_totals, one or two a shard), not from every length."""
        keys = {"node": "node", "shard": "node, path"}[by]
        table = "shard_length_totals" if by == "shard" else "node_length_groups"
        where, params = self.counted_where()
        return rows_as(
            GroupTotalRow,
            self.query(
                f"SELECT {keys}, SUM(count) AS completions, SUM(CASE WHEN estimated = 0 THEN count ELSE 0 END)"
                f" AS exact FROM {table}{where} GROUP BY {keys} ORDER BY {keys}",
                params,
            ),
        )

    def length_groups(self) -> tuple[list[int], list[tuple[str, str, int, int, int, int]]]:
        """The counted nodes' length counts in groups, as the store's triggers keep them
        (runhealth/store/lengthgroups.py), and the bounds they are bucketed by, read at one
        instant: (ascending bounds, [(node, finish_reason, estimated, bucket, completions,
        tokens x completions)]), a group's bucket being how many bounds are below its lengths."""
        with self.snapshot():
            where, gone = self.counted_where()
            splits = [r[0] for r in self.cursor(lengthgroups.SPLITS_SQL)]
            sql = f"SELECT node, finish_reason, estimated, bucket, count, tokens FROM node_length_groups{where}"
            rows = [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in self.cursor(sql, gone)]
        return splits, rows

    def run_settings(self) -> RunSettings:
        """The run's settings as its collector saved them (meta "run"); defaults for what it lacks."""
        return RunSettings.from_meta(self.meta("run"))

    def superseded_nodes(self) -> dict[str, str]:
        """Nodes no longer in the config whose files a current node reads again -> that node.

        The config's nodes are the run's meta `nodes` (the collector writes them). A removed
        node is superseded by a current one on the same host (and port) that has a shard path in
        common with it: a renamed node, whose new name counts the same files from byte 0. Its
        counts leave every total (they stay in the store: naming it back brings them back); a
        removed node whose files no current node reads keeps its counts, the run's history.
        """
        current = self.run_settings().node_names
        if current is None:
            return {}
        if all(r[0] in current for r in self.cursor("SELECT name FROM nodes")):
            return {}  # no node was removed (the usual case): no config is parsed (512 a read at 512 nodes)
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
        the collector's clock does not reorder: runhealth.rules.activity's rates)."""
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

    def alert_episodes(self, since_unix: float | None = None, open_only: bool = False) -> list[AlertEpisodeRow]:
        """Alert episodes that held at or after `since_unix` (still open, or resolved since then),
        newest start first; `open_only`: those not resolved (what a restarted collector holds)."""
        where = "resolved_unix IS NULL" if open_only else "1"
        params: tuple[float, ...] = ()
        if since_unix is not None:
            where += " AND (resolved_unix IS NULL OR resolved_unix >= ? OR last_seen_unix >= ?)"
            params = (since_unix, since_unix)
        return rows_as(
            AlertEpisodeRow,
            self.query(
                "SELECT id, name, severity, node, gpu, started_unix, resolved_unix, last_seen_unix, absent_unix,"
                f" summary_start, summary_end, value_start, value_end FROM alert_history WHERE {where} ORDER BY started_unix DESC, id DESC",
                params,
            ),
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
        for r in rows:  # most GPUs have neither: "[]" is not parsed 8,192 times a read at 512 nodes
            r["throttle_reasons"] = _json_list(r["throttle_reasons"])
            r["processes"] = _json_list(r["processes"])
        return rows_as(GpuRow, rows)

    def gpu_series(self, since_unix: float | None = None, max_points: int = 2000) -> list[GpuSeriesPoint]:
        """GPU time series from the raw samples, averaged in SQL into at most `max_points` buckets
        per GPU (`gpu_buckets`). `rollup.gpu_history` is the same over raw and rolled-up rows; it
        calls this while there are no rollups (bench/gpuread.py: the union is ~1.5x slower)."""
        where, params = _where(since_unix, None)
        return self.gpu_buckets(RAW_GPU_ROWS + where, params, max_points, weighted=False)

    def gpu_buckets(
        self, rows: str, params: Sequence[Any], max_points: int, weighted: bool = True
    ) -> list[GpuSeriesPoint]:
        """The GPU series' one downsampling: `rows` (SQL yielding RAW_GPU_ROWS' columns, `n` being
        how many samples a row stands for; `params` its parameters) bucketed per GPU into at most
        `max_points` equal spans from the first row to the last, each reading averaged weighted by
        `n` (a missing reading left out), `throttled` the bucket's maximum. `weighted=False` says
        every row is one sample (n = 1): the same mean as SQL's AVG, ~15% faster on a day of
        64 GPUs than the weighted sum (bench/gpuread.py)."""
        span = self.cursor(f"SELECT MIN(ts_unix), MAX(ts_unix) FROM ({rows})", params).fetchone()
        if span[0] is None:
            return []
        width = max((span[1] - span[0]) / max(max_points - 1, 1), 1e-9)
        mean = "SUM({f} * n) / NULLIF(SUM(CASE WHEN {f} IS NULL THEN 0 ELSE n END), 0)" if weighted else "AVG({f})"
        means = ", ".join(f"{mean.format(f=f)} AS {f}" for f in GPU_FIELDS)
        return rows_as(
            GpuSeriesPoint,
            self.query(
                f"SELECT node, gpu, MIN(ts_unix) AS ts_unix, {means}, MAX(throttled) AS throttled FROM ({rows})"
                " GROUP BY node, gpu, CAST((ts_unix - ?) / ? AS INTEGER) ORDER BY node, gpu, ts_unix",
                (*params, span[0], width),
            ),
        )

    def metric_latest(self) -> list[MetricRow]:
        return rows_as(
            MetricRow, self.query("SELECT node, name, value, ts_unix FROM metric_latest ORDER BY node, name")
        )

    def node_energy(self) -> list[EnergyRow]:
        """Per node with GPU energy rows: the joules and the tokens of the same polls (EnergyRow)."""
        return rows_as(
            EnergyRow,
            self.query(
                "SELECT g.node AS node, COUNT(*) AS gpus, SUM(g.joules) AS joules, SUM(g.integrated_j) AS integrated_j,"
                " SUM(g.gpu_s) AS gpu_s, SUM(g.resets) AS resets, SUM(g.counter_mj IS NOT NULL) AS counter_gpus,"
                " e.since_unix AS since_unix, e.last_unix AS last_unix, COALESCE(e.tokens, 0) AS tokens,"
                " COALESCE(e.usable_tokens, 0) AS usable_tokens, COALESCE(e.usable_completions, 0) AS usable_completions,"
                " COALESCE(e.dropped_steps, 0) AS dropped_steps"
                " FROM gpu_energy g LEFT JOIN node_energy e ON e.node = g.node GROUP BY g.node ORDER BY g.node"
            ),
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

    def latest_loop_sample(self) -> tuple[int, int]:
        """(loops, sampled) among the newest finished batch's truncated samples, in one statement:
        loops.loop_sample(latest_sample_batch()) without reading the samples' text."""
        row = self.query(
            "SELECT COALESCE(SUM(is_loop = 1), 0) AS loops, COUNT(*) AS n FROM samples WHERE finish_reason = 'length'"
            " AND batch = (SELECT MAX(batch) FROM sample_batches WHERE done_unix IS NOT NULL)"
        )[0]
        return int(row["loops"]), int(row["n"])

    def pending_sample_batch(self) -> PendingSampleBatch | None:
        rows = self.query("SELECT * FROM sample_batches WHERE done_unix IS NULL ORDER BY batch DESC LIMIT 1")
        return rows_as(PendingSampleBatch, rows)[0] if rows else None

    def last_collection_unix(self) -> float | None:
        row = self.cursor("SELECT MAX(last_ok_unix) FROM nodes").fetchone()
        return row[0]


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


def _run_less(gone: Sequence[str], finish_reason: str | None) -> tuple[str, tuple]:
    """The run's length rows less those of the nodes `gone` (superseded): run_length_counts (a few
    thousand rows) less those nodes' own rows, read by their key, instead of a GROUP BY over every
    node's rows (~1-2 CPU s at 1,024 nodes, every scrape and page-data refresh while a renamed node's
    old name stays in the store). Rows in key order; a key the other nodes have no completion of
    is left out (the write path keeps no row at 0, so this is the GROUP BY's answer)."""
    reason = " AND finish_reason = ?" if finish_reason else ""
    sql = (
        "SELECT r.tokens, r.finish_reason, r.estimated, r.count - COALESCE(g.count, 0) AS count"
        " FROM run_length_counts r LEFT JOIN (SELECT tokens, finish_reason, estimated, SUM(count) AS count"
        f" FROM node_length_counts WHERE node IN ({','.join('?' * len(gone))}){reason} GROUP BY 1, 2, 3) g"
        " ON g.tokens = r.tokens AND g.finish_reason = r.finish_reason AND g.estimated = r.estimated"
        f" WHERE r.count - COALESCE(g.count, 0) <> 0{reason.replace('finish_reason', 'r.finish_reason')}"
        " ORDER BY r.tokens, r.finish_reason, r.estimated"
    )
    extra = (finish_reason,) if finish_reason else ()
    return sql, (*gone, *extra, *extra)


def _where(since_unix: float | None, node: str | None) -> tuple[str, tuple]:
    clauses, params = [], []  # type: list[str], list[float | str]
    if since_unix is not None:
        clauses.append("ts_unix >= ?")
        params.append(since_unix)
    if node is not None:
        clauses.append("node = ?")
        params.append(node)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def _reasons_named(rows: list[dict[str, Any]]) -> list[LengthCountRow]:
    """Count rows with the stored '' (no finish_reason) as None."""
    for r in rows:
        r["finish_reason"] = r["finish_reason"] or None
    return rows_as(LengthCountRow, rows)


def _json_list(text: str | None) -> list[Any]:
    """A stored JSON list; NULL and "[]" as a new empty list, without the parser."""
    return json.loads(text) if text and text != "[]" else []
