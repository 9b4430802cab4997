"""Per-node GPU bands kept as the samples arrive: the GPU page's fleet view at the cost of a poll.

Past a few GPUs the GPU page draws, per node and time step, the median, min and max of a reading
across the node's GPUs (a line with a band, or a node x time heatmap of the median). Each GPU's
readings are first averaged over the step (raw rows weight 1, rolled-up rows their count), then
the node's GPUs are compared: so a step is one value per GPU, whatever the poll interval.

Steps are aligned to whole multiples of their width (`step_for`: about BAND_POINTS steps over
the window), so a finished step never changes. A `Bands` cache keeps every step it has computed,
per width, and on each `update` recomputes only the steps that rows added since the last update
fall in (found by rowid, so a slow poll's row stamped earlier than a faster one's is not missed).
At 512 nodes x 8 GPUs a day's window used to re-read and re-sort its 35M samples every few
minutes; now each sample is read about once per width (bench/fleet.py --history).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from runhealth.payloads.pagetypes import Table
from runhealth.store import Store, rollup

BAND_POINTS = 240
SNAPSHOT_FORMAT = 1  # Bands.snapshot's shape; another value is ignored (computed again)
# Widths (each at most twice the last): a window uses the first that covers its span in
# BAND_POINTS steps, so 120 to 240 of them. 15 min, 1 h, 6 h and 24 h windows get 3.75, 15, 90
# and 360 s; past a day (rolled-up minutes) widths are whole minutes, past 7 days whole 10 minutes.
STEPS_S: tuple[float, ...] = (3.75, 7.5, 15.0, 30.0, 45.0, 90.0, 180.0, 360.0, 600.0, 1200.0, 1800.0, 3600.0)
STEPS_S += (7200.0, 14400.0, 21600.0, 43200.0, 86400.0)
# What a band is computed from: the page's values, then each limit (its per-node maximum).
VALUES = ("util_pct", "power_w", "mem_used_gib", "temp_c", "sm_clock_mhz")
LIMITS = ("power_limit_w",)
_SQL = ("util_pct", "power_w", "mem_used_mib", "temp_c", "sm_clock_mhz", "power_limit_w")
COLUMNS = ["node", "t_unix", "median", "min", "max", "gpus"]


def step_for(span_s: float) -> float:
    """The step width for a window spanning `span_s`: at most BAND_POINTS steps."""
    for step in STEPS_S:
        if step * BAND_POINTS >= span_s:
            return step
    return math.ceil(span_s / BAND_POINTS / STEPS_S[-1]) * STEPS_S[-1]


def gpu_means(store: Store, step: float, first: int) -> list[tuple]:
    """(node, gpu, step index, mean of each of _SQL) for every step index >= `first`: each GPU's
    readings averaged over the step, raw and rolled-up rows together (rolled-up ones weighted by
    their sample count, NULLs left out), ordered by node, step, GPU."""
    cols = ", ".join(_SQL)
    rows = f"SELECT ts_unix, node, gpu, 1 AS n, {cols} FROM gpu_samples WHERE ts_unix >= ?"
    params: list[float] = [(first - 1) * step]  # one step early: the SQL division decides the step
    if rollup.has_rollups(store):
        rows += f" UNION ALL SELECT bucket_unix, node, gpu, n, {cols} FROM gpu_rollup"
        rows += f" WHERE res_s IN {rollup.TIERS} AND bucket_unix >= ?"
        params.append((first - 1) * step)
    means = ", ".join(f"SUM({f} * n) / NULLIF(SUM(CASE WHEN {f} IS NULL THEN 0 ELSE n END), 0)" for f in _SQL)
    sql = (
        f"SELECT node, gpu, CAST(ts_unix / ? AS INTEGER) AS k, {means} FROM ({rows})"
        " GROUP BY node, gpu, k HAVING k >= ? ORDER BY node, k, gpu"
    )
    return store.cursor(sql, (step, *params, first)).fetchall()


def node_steps(means: list[tuple]) -> dict[int, tuple[list[str], np.ndarray]]:
    """Per step index: its nodes and, per node, a row of gpus, then (median, min, max) of each of
    VALUES across the node's GPU means, then each limit's maximum (NaN: no reading)."""
    if not means:
        return {}
    nodes = [r[0] for r in means]
    ks = np.fromiter((r[2] for r in means), dtype=np.int64, count=len(means))
    values = np.array([r[3:] for r in means], dtype=float)  # None -> NaN
    values[:, 2] /= 1024  # MiB -> GiB, as the page draws memory
    new_group = np.ones(len(means), dtype=bool)
    new_group[1:] = (ks[1:] != ks[:-1]) | np.array([a != b for a, b in zip(nodes[1:], nodes[:-1], strict=True)])
    starts = np.flatnonzero(new_group)
    sizes = np.diff(np.append(starts, len(means)))
    group = np.cumsum(new_group) - 1
    grid = np.full((len(starts), int(sizes.max()), len(_SQL)), np.nan)
    grid[group, np.arange(len(means)) - starts[group]] = values
    with warnings.catch_warnings():  # a node whose GPUs all lack a reading: NaN, as intended
        warnings.simplefilter("ignore", RuntimeWarning)
        stats = [f(grid[:, :, : len(VALUES)], axis=1) for f in (np.nanmedian, np.nanmin, np.nanmax)]
        limits = np.nanmax(grid[:, :, len(VALUES) :], axis=1)
    table = np.column_stack([sizes, *(s[:, i] for i in range(len(VALUES)) for s in stats), limits])
    out: dict[int, tuple[list[str], np.ndarray]] = {}
    for k in np.unique(ks[starts]):
        chosen = np.flatnonzero(ks[starts] == k)
        out[int(k)] = ([nodes[starts[i]] for i in chosen], table[chosen])
    return out


class BandTable(Table):
    """One value's bands as a column-wise Table, held as the JSON text of each step: a window's
    table is joined from steps serialised once (pagedata.encode writes `json_text()` as it is),
    and its lists are only built when read (tests, a page computing on demand)."""

    def __init__(self, parts: dict[str, list[str]]):
        super().__init__(COLUMNS, {})
        self.parts = parts
        self._lists: dict[str, list[Any]] | None = None

    def json_text(self) -> str:
        cols = ",".join(f'"{c}":[{",".join(p for p in self.parts[c] if p)}]' for c in COLUMNS)
        return f'{{"columns":{json.dumps(COLUMNS)},"data":{{{cols}}}}}'

    @property
    def data(self) -> Mapping[str, list[Any]]:
        if self._lists is None:
            self._lists = {c: json.loads(f"[{','.join(p for p in self.parts[c] if p)}]") for c in COLUMNS}
        return self._lists


class _Step(NamedTuple):
    """One step's bands, serialised: node, t_unix and gpus, then per value (median, min, max)."""

    common: tuple[str, str, str]
    values: dict[str, tuple[str, str, str]]
    limits: dict[str, dict[str, float]]


def _serialised(k: int, step: float, nodes: list[str], table: np.ndarray) -> _Step:
    def text(xs: list[Any]) -> str:
        return json.dumps(xs, separators=(",", ":"))[1:-1]

    common = (text(nodes), text([k * step] * len(nodes)), text(table[:, 0].astype(int).tolist()))
    values = {v: tuple(text(_nullable(table[:, 1 + 3 * i + j])) for j in range(3)) for i, v in enumerate(VALUES)}
    limits = {}
    for j, limit in enumerate(LIMITS):
        col = table[:, 1 + 3 * len(VALUES) + j].tolist()
        limits[limit] = {n: x for n, x in zip(nodes, col, strict=True) if x == x}  # NaN: no reading
    return _Step(common, values, limits)  # type: ignore[arg-type]


class Bands:
    """Every step computed so far, per width; `update` adds what the rows since the last one changed."""

    def __init__(self, store: Store):
        self.store = store
        self._steps: dict[float, dict[int, _Step]] = {}  # width -> step index -> its bands
        self._rowid: dict[float, int | None] = {}  # width -> the last gpu_samples rowid it has seen
        self._from: dict[float, int] = {}  # width -> the first step index it holds

    def update(self, step: float, first: int) -> None:
        """Bring the steps of width `step` from index `first` up to date (and forget older ones)."""
        done, seen = self._steps.get(step, {}), self._rowid.get(step)
        top = self.store.cursor("SELECT MAX(rowid) FROM gpu_samples").fetchone()[0]
        redo: int | None = first
        if seen is not None and top is not None and top >= seen and first >= self._from[step]:
            new_min = oldest_since(self.store, "gpu_samples", seen)
            redo = None if new_min is None else max(first, int(new_min / step))
        else:
            done = {}  # first use, an earlier start, or the table emptied (rowids start again)
        done = {k: v for k, v in done.items() if first <= k and (redo is None or k < redo)}
        if redo is not None:
            for k, (nodes, table) in node_steps(gpu_means(self.store, step, redo)).items():
                done[k] = _serialised(k, step, nodes, table)
        self._steps[step], self._from[step] = done, first
        self._rowid[step] = top

    def snapshot(self) -> dict[str, Any]:
        """Every width's steps as JSON data, with the gpu_samples row last seen (`restore` checks
        it is still there): kept in the store, a restarted collector resumes from it (#42 item 4)."""
        widths = []
        for step, steps in self._steps.items():
            seen = self._rowid.get(step)
            mark = row_mark(self.store, "gpu_samples", "node, gpu", seen)
            rows = [[k, list(s.common), {v: list(t) for v, t in s.values.items()}, s.limits] for k, s in steps.items()]
            widths.append({"step": step, "rowid": seen, "mark": mark, "from": self._from[step], "steps": rows})
        return {"format": SNAPSHOT_FORMAT, "widths": widths}

    def restore(self, data: Any) -> int:
        """Take the widths of a `snapshot` whose last row is still in the store as it was (else
        they are computed again); returns how many were taken. Data that does not fit is ignored."""
        if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
            return 0
        taken = 0
        for width in data.get("widths", []):
            try:
                step, seen = float(width["step"]), width["rowid"]
                if seen is None or row_mark(self.store, "gpu_samples", "node, gpu", seen) != width["mark"]:
                    continue
                steps = {
                    int(k): _Step(tuple(c), {v: tuple(t) for v, t in vals.items()}, lim)
                    for k, c, vals, lim in width["steps"]
                }
            except (KeyError, TypeError, ValueError):
                continue
            self._steps[step], self._rowid[step], self._from[step] = steps, int(seen), int(width["from"])
            taken += 1
        return taken

    def forget(self, keep: Iterable[float]) -> None:
        """Drop the widths no window uses any more."""
        for step in set(self._steps) - set(keep):
            del self._steps[step], self._rowid[step], self._from[step]

    def window(self, step: float, first: int) -> tuple[dict[str, Table], dict[str, dict[str, float]]]:
        """(bands, limits): bands from step index `first` on, per value (rows by time, then
        node), and each limit's maximum per node."""
        found = [v for k, v in sorted(self._steps.get(step, {}).items()) if k >= first]
        bands: dict[str, Table] = {}
        for value in VALUES:
            parts = {c: [s.common[i] for s in found] for i, c in enumerate(("node", "t_unix", "gpus"))}
            parts.update({c: [s.values[value][j] for s in found] for j, c in enumerate(("median", "min", "max"))})
            bands[value] = BandTable(parts)
        limits: dict[str, dict[str, float]] = {}
        for limit in LIMITS:
            per_node = limits.setdefault(limit, {})
            for s in found:
                for node, x in s.limits[limit].items():
                    per_node[node] = max(per_node.get(node, x), x)
        return bands, limits


def row_mark(store: Store, table: str, columns: str, rowid: int | None) -> list[Any] | None:
    """The row `rowid` of `table` (its ts_unix and `columns`): a kept cache's proof that the rows
    it has read are still the store's (a store recreated or pruned under it does not match)."""
    if rowid is None:
        return None
    row = store.cursor(f"SELECT ts_unix, {columns} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
    return None if row is None else [rowid, *row]


def oldest_since(store: Store, table: str, rowid: int) -> float | None:
    """The oldest `ts_unix` among the rows of `table` written after `rowid` (None: none was).
    NOT INDEXED: with the ts_unix index SQLite walked it from the oldest row until it met a
    new one, reading the whole history (1.1 s at 512 nodes x 24 h); by rowid it reads the new rows."""
    return store.cursor(f"SELECT MIN(ts_unix) FROM {table} NOT INDEXED WHERE rowid > ?", (rowid,)).fetchone()[0]


def _nullable(col: np.ndarray) -> list[float | None]:
    """A column as a list, NaN as None (what the payload held before: JSON has no NaN)."""
    return [None if x != x else x for x in col.tolist()]
