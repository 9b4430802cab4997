"""Reads of the page payloads the collector precomputes (runhealth/payloads/pagedata.py), for the loaders.

`payload(store, name, Type)` is one indexed row read, decoded once per computation and read back
as its type (runhealth/payloads/pagetypes.py) (the cache key
holds the row's timestamp, so a new computation is picked up at the next read and the old one
is dropped). It returns None when there is no payload yet (the first seconds after start, or a
viewer over a store whose collector predates page data): the loader then computes on demand,
as it always did. `render_age` says on the page when a precomputed number was computed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from components import livewatch
from runhealth.ages import fmt_ago
from runhealth.payloads import pagedata
from runhealth.payloads.pagetypes import GpuWindow, Table
from runhealth.store import Store

_HASH: dict[str | type[Any], Any] = {Store: lambda s: str(s.path)}
# computed_at's key: the path and the page payloads' stamp the live watcher last saw (a redraw
# pushed for a payload reads it; the Overview's publication leaves it cached)
_FRESH: dict[str | type[Any], Any] = {Store: livewatch.keyed_on(livewatch.PAYLOADS)}
T = TypeVar("T")


@st.cache_data(ttl=2, max_entries=64, hash_funcs=_FRESH, show_spinner=False)
def computed_at(store: Store, name: str) -> float | None:
    """When payload `name` was computed (None: there is none); cached for 2 s."""
    return pagedata.computed_at(store, name)


# cache_resource, not cache_data: a fleet's GPU bands are ~10^5 numbers, and cache_data would
# unpickle a fresh copy on every read. The payload is only ever read, never changed.
@st.cache_resource(ttl=600, max_entries=32, hash_funcs=_HASH, show_spinner=False)
def _decoded(store: Store, name: str, ts_unix: float, _tp: type[Any]) -> tuple[float, Any] | None:
    return pagedata.get(store, name, _tp)  # `name` decides the type: _tp is left out of the key


def payload(store: Store, name: str, tp: type[T]) -> tuple[float, T] | None:
    """(computed at, payload of type `tp`) or None (none yet, or a row that does not fit `tp`);
    the decode is cached per computation."""
    ts = computed_at(store, name)
    return None if ts is None else _decoded(store, name, ts, tp)


def frame(table: Table) -> pd.DataFrame:
    """A column-wise payload table as a DataFrame."""
    return pd.DataFrame(dict(table.data), columns=table.columns)


def age_text(ts_unix: float | None, now: float | None = None) -> str:
    if ts_unix is None:
        return "computed just now for this page (no precomputed copy yet)"
    age = (time.time() if now is None else now) - ts_unix
    return f"computed by the collector at {time.strftime('%H:%M:%S', time.localtime(ts_unix))} ({fmt_ago(age)})"


def render_age(store: Store, name: str, what: str) -> None:
    """One caption: when `what` was computed (precomputed payloads are up to a minute behind)."""
    st.caption(f"{what}: {age_text(computed_at(store, name))}.")


@st.cache_resource(ttl=10, max_entries=8, hash_funcs=_HASH, show_spinner=False)
def _computed_now(store: Store, window: str, now: float) -> GpuWindow:
    """The window's payload computed here (no precomputed copy yet): the same bands, from scratch."""
    return pagedata.gpu_window(store, pagedata.GPU_WINDOWS_S[window], now)


@dataclasses.dataclass(frozen=True)
class GpuView:
    """What the GPU page draws for a window and its chosen GPUs: per-GPU series, or per-node
    bands per value with each limit's maximum over the chosen nodes (None: no reading)."""

    as_of: float | None  # when the collector computed it (None: computed here, no payload yet)
    series: pd.DataFrame | None
    bands: dict[str, pd.DataFrame] | None
    limits: dict[str, float | None]


def gpu_window(store: Store, window: str, labels: list[str]) -> GpuView | None:
    """The GPU page's series for `window` and the chosen GPUs, from the collector's payload
    (computed here when there is none yet; as_of None then). None: a small run without a
    payload, or a choice that needs per-GPU lines the payload does not hold (the page then
    reads the store itself)."""
    got = payload(store, f"gpu:{window}", GpuWindow)
    as_of, pre = got if got is not None else (None, _computed_now(store, window, time.time() // 10 * 10))
    if got is None and pre.series is not None:
        return None  # a small run: the page reads its lines from the store, as the payload would hold
    chosen = set(labels)
    if pre.series is not None:
        df = frame(pre.series)
        return GpuView(as_of, df[df["label"].isin(chosen)] if len(df) else df, None, {})
    if pre.bands is None or sum(label in chosen for label in pre.labels) <= pagedata.PER_GPU_LINES_UP_TO:
        return None
    nodes = {label.rsplit("/", 1)[0] for label in chosen}
    bands = {value: df[df["node"].isin(nodes)] for value, df in ((v, frame(t)) for v, t in pre.bands.items())}
    limits: dict[str, float | None] = {}
    for limit, per_node in pre.limits.items():
        found = [x for node, x in per_node.items() if node in nodes and x is not None]
        limits[limit] = max(found) if found else None
    return GpuView(as_of, None, bands, limits)
