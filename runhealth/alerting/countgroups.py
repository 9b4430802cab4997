"""A /metrics scrape's count figures, summed from the store's groups of the length counts.

The exporter's count figures (completions by node and finish reason, the length histogram, the
completions and tokens at the ceiling, the usable tokens, whether the truncation is known) are
sums over groups of `node_length_counts` rows by (node, finish reason, estimated, histogram
bucket, cut at the ceiling), with the same rules as ever: the buckets are
`exporter.length_buckets`' bounds, the cut is `stats.cut_sql`/`is_cut` (the one truncation rule)
and the natural stops `reasonnames.NATURAL`. Every sum is over integers, so each figure is the one
the separate statements gave, exactly.

`read` takes the groups from the aggregate the store's triggers keep (store migration 15,
runhealth/store/lengthgroups.py: a few thousand rows at 1,024 nodes, where the one scan of every
distinct length of every node it replaces cost ~4 CPU s a scrape, #42 item 3), after making its
bounds cover this scrape's bounds and the ceiling - 1. A store it cannot write to (read-only,
locked past the busy timeout) is read the old way, with one scan grouped in SQL.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from collections.abc import Sequence

from runhealth.analysis import reasons, stats
from runhealth.errors import StoreError
from runhealth.store import Store, lengthgroups, reasonnames

log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # the stores whose groups could not be bucketed, said once each


@dataclasses.dataclass(frozen=True)
class Group:
    """Rows of node_length_counts with one (node, finish_reason, estimated, bucket, cut)."""

    node: str
    finish_reason: str | None  # None: the reasons no label shows, summed (regroup); labelled OTHER
    estimated: int
    bucket: int  # index of the first bound the lengths are <= (len(bounds): above every bound)
    cut: bool  # stopped by length at the ceiling (stats.cut_sql)
    count: int
    tokens: int  # sum of tokens x count


def read(store: Store, bounds: Sequence[float], ceiling: int | None) -> list[Group]:
    """The counted nodes' length counts in groups, in (node, finish_reason, estimated, bucket,
    cut) order (a renamed node's old name left out, as store.counted_where says)."""
    needed = splits_for(bounds, ceiling)
    try:
        lengthgroups.cover(store, needed)
    except (sqlite3.Error, StoreError) as exc:
        level = logging.DEBUG if str(store.path) in _WARNED else logging.WARNING  # once a store, not every 15 s
        _WARNED.add(str(store.path))
        log.log(level, "metrics: %s: the length groups could not be bucketed (%s): every count read", store.path, exc)
        return scan(store, bounds, ceiling)
    splits, rows = store.length_groups()
    if not set(needed) <= set(splits):  # another process bucketed them for another ceiling since
        return scan(store, bounds, ceiling)
    return regroup(rows, splits, bounds, ceiling)


def splits_for(bounds: Sequence[float], ceiling: int | None) -> list[int]:
    """The bounds the stored groups need for these histogram bounds and this cut: the bounds, and
    the ceiling - 1 (lengths are whole tokens: above it is at or above the ceiling)."""
    return sorted({int(b) for b in bounds} | ({int(ceiling) - 1} if ceiling is not None else set()))


def regroup(
    rows: Sequence[tuple[str, str, int, int, int, int]],
    splits: Sequence[int],
    bounds: Sequence[float],
    ceiling: int | None,
) -> list[Group]:
    """The store's groups (node, finish_reason, estimated, bucket over `splits`, completions,
    tokens) summed into this scrape's groups. A stored bucket j holds the lengths in
    (splits[j-1], splits[j]]; `splits` include every bound and the ceiling - 1, so all of its
    lengths fall in one histogram bucket (the first bound at or above splits[j]) and are all
    cut or none (stats.is_cut of its shortest length, splits[j-1] + 1; none in bucket 0, whose
    lengths are at most the ceiling - 1). The reasons no label shows (reasons.shown_names over the
    run's totals: not known, not among the most frequent others) are summed under None, which
    `reason_counts` labels OTHER as it labelled each of them: every figure is the same, in groups a
    store of 100,000 distinct reasons no longer multiplies (its scrape ~2 CPU s under load, #42)."""
    ints = [int(b) for b in bounds]
    buckets = [next((i for i, b in enumerate(ints) if b >= s), len(ints)) for s in splits] + [len(ints)]
    shortest = [None] + [s + 1 for s in splits]
    totals: dict[str, int] = {}
    for _node, reason, _estimated, _j, count, _tokens in rows:
        totals[reason] = totals.get(reason, 0) + count
    shown = reasons.shown_names(totals)
    sums: dict[tuple[str, str | None, int, int, bool], list[int]] = {}
    for node, reason, estimated, j, count, tokens in rows:
        low = shortest[j]
        cut = low is not None and stats.is_cut(low, reason, ceiling)  # the reason's own, before it is summed
        key = (node, reason if reason in shown else None, estimated, buckets[j], cut)
        got = sums.get(key)
        if got is None:
            sums[key] = [count, tokens]
        else:
            got[0] += count
            got[1] += tokens
    order = sorted(sums, key=lambda k: (k[0], k[1] is not None, k[1] or "", *k[2:]))  # the summed ones first
    return [Group(*key, *sums[key]) for key in order]


def scan(store: Store, bounds: Sequence[float], ceiling: int | None) -> list[Group]:
    """`read` from every row of node_length_counts (one scan, grouped in SQL): what a scrape did
    before the store kept the groups, for a store whose groups cannot be bucketed now."""
    where, gone = store.counted_where()
    bucket = lengthgroups.bucket_sql([int(b) for b in bounds])
    # NOT INDEXED: the table in order and one sort of the groups' keys is ~1.5x faster here than
    # an index's order and a lookup of each row's length and reason.
    sql = (
        f"SELECT node, finish_reason, estimated, {bucket}, {stats.cut_sql(ceiling)}, SUM(count), SUM(tokens * count)"
        f" FROM node_length_counts NOT INDEXED{where} GROUP BY 1, 2, 3, 4, 5"
    )
    return [Group(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6]) for r in store.cursor(sql, gone)]


def reason_counts(groups: Sequence[Group]) -> dict[tuple[str, str], int]:
    """(node, label) -> completions, with the bounded finish_reason labels (reasons.shown_names
    over the run's totals; the rest as OTHER), in node order, unnamed reasons first per node."""
    totals: dict[str, int] = {}
    for g in groups:
        if g.finish_reason is not None:  # the summed ones: none of them is shown (regroup)
            totals[g.finish_reason] = totals.get(g.finish_reason, 0) + g.count
    names = reasons.shown_names(totals)
    per: dict[tuple[str, str | None], int] = {}
    for g in groups:
        key = (g.node, g.finish_reason if g.finish_reason in names else None)
        per[key] = per.get(key, 0) + g.count
    out: dict[tuple[str, str], int] = {}
    for (node, reason), n in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1] is not None, kv[0][1] or "")):
        label = reasons.OTHER if reason is None else names.get(reason, reasons.OTHER)
        out[(node, label)] = out.get((node, label), 0) + n
    return out


def unknown_parts(groups: Sequence[Group]) -> tuple[int, int, int]:
    """(completions, of them without a finish reason, of them with an estimated length): what
    analysis/unknowns.unknown_from decides on."""
    return (
        sum(g.count for g in groups),
        sum(g.count for g in groups if g.finish_reason == ""),
        sum(g.count for g in groups if g.estimated == 1),
    )


@dataclasses.dataclass
class NodeLengths:
    """One node's figures over the rows of one `estimated` flag."""

    count: int = 0
    tokens: int = 0
    cumulative: list[int] = dataclasses.field(default_factory=list)  # completions <= each bound
    at_ceiling: int = 0
    cut_tokens: int = 0
    usable_tokens: int = 0  # in completions that stopped naturally


def per_node(groups: Sequence[Group], n_bounds: int, estimated: int) -> dict[str, NodeLengths]:
    """Node -> its figures over the rows with `estimated`, in node order (nodes without such rows left out)."""
    out: dict[str, NodeLengths] = {}
    for g in sorted((g for g in groups if g.estimated == estimated), key=lambda g: g.node):
        n = out.get(g.node)
        if n is None:
            n = out[g.node] = NodeLengths(cumulative=[0] * (n_bounds + 1))
        n.count += g.count
        n.tokens += g.tokens
        n.cumulative[g.bucket] += g.count
        if g.cut:
            n.at_ceiling += g.count
            n.cut_tokens += g.tokens
        if g.finish_reason in reasonnames.NATURAL:
            n.usable_tokens += g.tokens
    for n in out.values():  # per bucket -> at or below each bound
        for i in range(1, n_bounds + 1):
            n.cumulative[i] += n.cumulative[i - 1]
        del n.cumulative[n_bounds]
    return out
