"""Cached reads over the history store, shaped for the screens.

Each `load_*` is an `st.cache_data` function with a short ttl (the collector writes every few
seconds) and a `max_entries` bound; the store itself aggregates in SQL, so what comes back is
small (count tables, bucketed series), never raw rows. The Store argument is hashed by its
path, so two stores never share a cache entry. This module holds only cached reads: shaping
lives in components/tables.py, words in components/format.py and components/alerts.py, rules
in the core (runhealth.rules.health).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypedDict, TypeVar

import pandas as pd
import streamlit as st
from streamlit.runtime.caching.cache_utils import CachedFunc

from components import livewatch, precomputed
from runhealth.analysis import lengthtime, stats, whatif
from runhealth.payloads import pagedata, pagetypes
from runhealth.records import GpuRow, MetricRow, NodeRow, PendingSampleBatch, SampleBatch, ShardRow
from runhealth.rules.activity import RunRates as RunRates  # the pages name the rates type through here
from runhealth.screens import events as run_events
from runhealth.screens import gpus as gpus_model
from runhealth.screens import lengths as lengths_model
from runhealth.screens import nodes as nodes_model
from runhealth.screens import overview as overview_model
from runhealth.screens import published
from runhealth.screens import samples as samples_model
from runhealth.settings.config import RunConfig
from runhealth.settings.windows import WHATIF_REFIT_S
from runhealth.store import Store, rollup

P = ParamSpec("P")
R = TypeVar("R")

TTL_S = 3
_HASH: dict[str | type[Any], Callable[[Any], Any]] = {Store: lambda s: str(s.path), RunConfig: repr}


def _cache(
    ttl: float = TTL_S, max_entries: int = 16, follows: livewatch.Follows = ()
) -> Callable[[Callable[P, R]], CachedFunc[P, R]]:
    """A loader cached for `ttl` per store path; `follows`: what a live part pushed on a
    publication reads (components/livewatch.py), also keyed on those publications' stamps, so a
    push for one computes afresh. Only those: a key on every stamp emptied every tab's cache on
    every round of polls, whatever the loader read."""
    hash_funcs = _HASH if not follows else {**_HASH, Store: livewatch.keyed_on(follows)}
    return st.cache_data(ttl=ttl, max_entries=max_entries, hash_funcs=hash_funcs, show_spinner=False)


def clear_all() -> None:
    """Drop every cached read (after "Refresh now")."""
    for fn in (
        load_nodes,
        load_run_lengths,
        load_group_lengths,
        load_truncation_over_time,
        load_gpu_latest,
        load_gpu_series,
        load_samples,
        load_last_collection,
        load_lengths_over_time,
        _load_overview,
        load_nodes_screen,
        load_gpus_screen,
        load_lengths_screen,
        load_samples_screen,
    ):
        fn.clear()


# -- loaders ------------------------------------------------------------------------------
@_cache()
def load_nodes(store: Store) -> list[NodeRow]:
    """The nodes the run's config names now (a removed node is history: screens.nodes.removed_nodes)."""
    keep = store.run_settings().node_names
    return [n for n in store.nodes() if keep is None or n["name"] in keep]


@_cache(ttl=2, follows=livewatch.ANY)  # every page's "Numbers as of"
def load_last_collection(store: Store) -> float | None:
    return store.last_collection_unix()


@dataclasses.dataclass(frozen=True)
class RunLengths:
    """The run's length counts as every page reads them."""

    hist: stats.LengthHist
    summary: stats.Summary
    bins: pd.DataFrame  # bin_start, bin_end, stop, at_ceiling, other
    cdf: pd.DataFrame  # tokens, cum_fraction
    as_of: float | None  # when the collector computed them (None: computed now, no precomputed copy)


@_cache(ttl=5, max_entries=8, follows=livewatch.PAYLOADS)
def load_run_lengths(store: Store, ceiling: int | None) -> RunLengths:
    """The run's length counts: summary, histogram bins and CDF points (runhealth.payloads.pagedata.run_lengths)."""
    return run_lengths(
        lengths_model.counts(store, ceiling, precomputed.payload(store, "run_lengths", pagetypes.RunLengths))
    )


def run_lengths(c: lengths_model.Counts) -> RunLengths:
    """A screen model's length counts as the pages' frames."""
    bins = pd.DataFrame(list(c.bins), columns=["bin_start", "bin_end", "stop", "at_ceiling", "other"])
    cdf = pd.DataFrame(list(c.cdf), columns=["tokens", "cum_fraction"])
    return RunLengths(c.hist, c.summary, bins, cdf, c.as_of)


@_cache(ttl=5, max_entries=8, follows=livewatch.PAYLOADS)
def load_lengths_screen(store: Store, config: RunConfig) -> lengths_model.Lengths:
    """The Output lengths page's model at now (runhealth.screens.lengths): the length counts, the
    nodes, the ETA at the 15-min average and the what-if's loop sample."""
    return lengths_model.lengths(store, config, time.time())


@_cache(ttl=5, max_entries=8, follows=livewatch.PAYLOADS)
def load_group_lengths(store: Store, by: str, ceiling: int | None) -> pd.DataFrame:
    """Share at the ceiling per node or shard, with Wilson interval and ceiling drift
    (runhealth.payloads.pagedata.group_lengths); attrs["as_of"]: when the collector computed it."""
    got = precomputed.payload(store, f"groups:{by}", pagetypes.GroupTable)
    if got is not None and got[1].ceiling == ceiling:
        df = precomputed.frame(got[1].table)
    else:
        df = pd.DataFrame(pagedata.group_lengths(store, by, ceiling), columns=pagetypes.GROUP_COLUMNS)
    df.attrs["as_of"] = got[0] if got is not None and got[1].ceiling == ceiling else None
    return df


@_cache(ttl=5, max_entries=8, follows=livewatch.PAYLOADS)
def load_truncation_over_time(store: Store, interval_s: float, ceiling: int | None = None) -> pd.DataFrame:
    """Poll deltas per hour, or per a few polls while the run is short, with the length stops
    split at the ceiling: at_ceiling (truncated) and below_ceiling (context window)."""
    got = precomputed.payload(store, "truncation_over_time", pagetypes.TruncationOverTime)
    fits = got is not None and (got[1].interval_s, got[1].ceiling) == (interval_s, ceiling)
    data = got[1] if got is not None and fits else pagedata.truncation_over_time(store, interval_s, ceiling)
    df = pd.DataFrame(
        list(data.polls), columns=["bucket_unix", "completions", "tokens", "length_stops", "malformed", "backfill"]
    )
    split = pd.DataFrame(list(data.split), columns=["bucket_unix", "backfill", "at_ceiling", "below_ceiling"])
    # The stops of the polls each bucket's row sums: its live ones, or its backfill ones if it has no live poll.
    split = split.fillna({"backfill": 0}).astype({"backfill": int})
    df = df.merge(split, on=["bucket_unix", "backfill"], how="left").fillna({"at_ceiling": 0, "below_ceiling": 0})
    # Estimated-length stops (and polls stored before the split existed) cannot be placed.
    df = df.assign(unsplit=(df["length_stops"] - df["at_ceiling"] - df["below_ceiling"]).clip(lower=0))
    df.attrs["as_of"] = got[0] if got is not None and fits else None
    df.attrs["events"] = run_events.chart_events(store)  # the chart's markers (figures read them from the frame)
    return df


@_cache(ttl=30, max_entries=8, follows=livewatch.PAYLOADS)
def load_lengths_over_time(store: Store, ceiling: int | None) -> pd.DataFrame:
    """Per hour of the run: length percentiles (log-bin edges) and the exact share at the ceiling."""
    got = precomputed.payload(store, "lengths_over_time", pagetypes.LengthsOverTime)
    fits = got is not None and got[1].ceiling == ceiling
    df = pd.DataFrame(
        list(got[1].rows) if got is not None and fits else lengthtime.hourly(store, ceiling),
        columns=["bucket_unix", "completions", "at_ceiling", "backfill", "at_ceiling_fraction", "p50", "p90", "p99"],
    )
    df.attrs["as_of"] = got[0] if got is not None and fits else None
    df.attrs["events"] = run_events.chart_events(store)
    return df


def load_overview(store: Store, config: RunConfig, finished: bool = False) -> overview_model.Overview:
    """The Overview's model at now (runhealth.screens.overview): tiles, banner, progress, node
    states and the headline record, one instant: the collector's published one while it is still
    true (one read), else built from one snapshot of the store (runhealth.screens.published).
    Cached for TTL_S; its Data age tile is worded at this call, as the page's "Numbers as of"."""
    model = _load_overview(store, config, finished)
    return model if finished else published.aged(model, time.time(), config)


@_cache(ttl=TTL_S, max_entries=8, follows=livewatch.OVERVIEW)
def _load_overview(store: Store, config: RunConfig, finished: bool = False) -> overview_model.Overview:
    return published.shown(store, config, time.time(), finished)


@_cache(ttl=TTL_S, max_entries=8, follows=livewatch.OVERVIEW)
def load_nodes_screen(store: Store, config: RunConfig, finished: bool = False) -> nodes_model.Nodes:
    """The Nodes page's model at now (runhealth.screens.nodes): node states, shards, hosts, host
    alerts, the collector's fault and the servers' metrics from one reading of the store."""
    return nodes_model.nodes(store, config, time.time(), finished)


@_cache(ttl=TTL_S, max_entries=8, follows=livewatch.PAYLOADS)
def load_gpus_screen(store: Store, config: RunConfig) -> gpus_model.Gpus:
    """The GPUs page's model at now (runhealth.screens.gpus): the GPUs' latest readings, their
    alerts and notes, telemetry errors, from one reading of the store."""
    return gpus_model.gpus(store, config, time.time())


@_cache()
def load_gpu_latest(store: Store) -> pd.DataFrame:
    """The latest reading of each GPU of the nodes the config names now (as /metrics exports)."""
    keep = store.run_settings().node_names
    return gpu_frame([g for g in store.gpu_latest() if keep is None or g["node"] in keep])


def gpu_frame(rows: Sequence[GpuRow]) -> pd.DataFrame:
    """GPU readings (Store.gpu_latest(), or a screen model's) as the pages' table: labelled
    node/gpu, power and memory as percentages of their limits."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df
    df["label"] = df["node"] + "/" + df["gpu"].astype(str)
    df["power_pct"] = 100 * df["power_w"] / df["power_limit_w"]
    df["mem_pct"] = 100 * df["mem_used_mib"] / df["mem_total_mib"]
    return df


@_cache(ttl=5, max_entries=8)
def load_gpu_series(store: Store, since_unix: float | None, max_points: int = 400) -> pd.DataFrame:
    df = pd.DataFrame(rollup.gpu_history(store, since_unix=since_unix, max_points=max_points))
    if not df.empty:
        df["label"] = df["node"] + "/" + df["gpu"].astype(str)
        df["mem_used_gib"] = df["mem_used_mib"] / 1024
    return df


class SampleBatches(TypedDict):
    latest: SampleBatch | None  # the newest finished batch, with its samples
    pending: PendingSampleBatch | None  # one still being drawn


@_cache(ttl=2, max_entries=4)
def load_samples_screen(store: Store, config: RunConfig) -> samples_model.Samples:
    """The Samples page's model at now (runhealth.screens.samples): the latest batch, its share at
    the ceiling and its loops beside the run's exact counts."""
    return samples_model.samples(store, config, time.time())


@_cache(ttl=2, max_entries=4)
def load_samples(store: Store) -> SampleBatches:
    return {"latest": store.latest_sample_batch(), "pending": store.pending_sample_batch()}


def load_whatif(
    hist: stats.LengthHist,
    ceiling: int,
    new_limit: int,
    loop_sample: tuple[int, int] | None,
    bootstrap: int = whatif.BOOTSTRAP,
) -> whatif.WhatIf:
    """`what_if` is a model fit and a back-test: cached per (histogram content, limit, loop sample)
    for WHATIF_REFIT_S (a minute); the chart's curve comes from the same fits."""
    return _load_whatif(hist, stats.hist_digest(hist), ceiling, new_limit, loop_sample, bootstrap)


def load_whatif_with_age(
    store: Store, hist: stats.LengthHist, ceiling: int, new_limit: int, loop_sample: tuple[int, int] | None
) -> tuple[whatif.WhatIf, float | None]:
    """The page's what-if and when it was computed: the collector's precomputed fit (its
    `ts_unix`) when it is of this very histogram (content digest), limit and loop sample, else
    `load_whatif` here and now (None)."""
    got = precomputed.payload(store, "whatif", pagetypes.WhatIfDefault)
    if got is not None:
        pre, sample = got[1], (tuple(loop_sample) if loop_sample else None)
        if (pre.ceiling, pre.limit, pre.hist_key, pre.loop_sample) == (
            ceiling,
            new_limit,
            stats.hist_digest(hist),
            sample,
        ):
            return pre.what_if, got[0]
    return load_whatif(hist, ceiling, new_limit, loop_sample, whatif.BOOTSTRAP), None


@st.cache_data(ttl=WHATIF_REFIT_S, max_entries=32, show_spinner=False)
def _load_whatif(
    _hist: stats.LengthHist,
    content_key: str,
    ceiling: int,
    new_limit: int,
    loop_sample: tuple[int, int] | None,
    bootstrap: int,
) -> whatif.WhatIf:
    return whatif.for_run(_hist, ceiling, new_limit, loop_sample, bootstrap)


@_cache()
def load_shards(store: Store) -> pd.DataFrame:
    """Every shard of every node: how far it is indexed, what it held, its read error if any, and
    when it was last found rewritten under the same inode (replaced_unix; NaN: never)."""
    return shard_frame(store.shards())


def shard_frame(rows: Sequence[ShardRow]) -> pd.DataFrame:
    """Shard rows (Store.shards(), or a screen model's) as the table the pages show."""
    columns = [
        "node",
        "path",
        "size",
        "offset",
        "completions",
        "malformed",
        "blank_lines",
        "resets",
        "error",
        "replaced_unix",
    ]
    return pd.DataFrame(rows, columns=[*columns, "inode", "tokens", "updated_unix", "mark"])[columns]


def metrics_frame(rows: Sequence[MetricRow]) -> pd.DataFrame:
    """Latest-metric rows (Store.metric_latest(), or a screen model's) as metric x node."""
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(list(rows)).pivot(index="name", columns="node", values="value")
