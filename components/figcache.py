"""Built plotly figures reused across reruns while their data and choices are unchanged.

A page rerun (a widget click, the live fragment's tick, a refresh) used to rebuild every
figure: on the GPUs page six charts, ~0.3 s CPU on a 64-GPU store. `figure(build, *args)`
returns `build(*args)` from a cache keyed by the *content* of the arguments (DataFrames by a
hash of every row, index and columns included; other arguments by value), so a new payload,
new samples or another widget choice builds a new figure, and an unchanged rerun reuses the
built one. The cached figure is shared and must not be changed after it is returned
(st.plotly_chart only reads it); its dict form is made once too (`FrozenFigure`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st


@dataclasses.dataclass(frozen=True)
class Keyed:
    """A figure argument with its content key worked out once (`keyed`)."""

    value: Any
    key: str | None  # None: a value pandas cannot hash (built each time, as `figure` does then)


def keyed(value: Any) -> Keyed:
    """`value` for several `figure` calls, hashed once: the GPUs page draws five charts from one
    frame, and hashing it for each was ~0.04 s of every rerun on the demo (#42 item 2)."""
    try:
        return Keyed(value, content_key(value))
    except TypeError:
        return Keyed(value, None)


def content_key(value: Any) -> str:
    """A key that changes whenever `value`'s content does (every row of a DataFrame hashed:
    Streamlit's own hashing samples frames past 50,000 rows)."""
    if isinstance(value, Keyed):
        if value.key is None:
            raise TypeError("unhashable")
        return value.key
    if isinstance(value, pd.DataFrame | pd.Series):
        digest = hashlib.blake2b(pd.util.hash_pandas_object(value, index=True).to_numpy().tobytes(), digest_size=16)
        names = list(value.columns) if isinstance(value, pd.DataFrame) else [value.name]
        marks = repr(value.attrs.get("events", ""))  # a chart's event markers ride on its frame (components/markers.py)
        return f"{type(value).__name__}{names!r}{[str(t) for t in getattr(value, 'dtypes', [])]}{digest.hexdigest()}{marks}"
    if isinstance(value, list | tuple):
        return f"{type(value).__name__}({','.join(content_key(v) for v in value)})"
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{k!r}:{content_key(v)}" for k, v in sorted(value.items(), key=lambda kv: repr(kv[0])))
            + "}"
        )
    return repr(value)


class FrozenFigure(go.Figure):
    """A built figure that is not changed again: its dict form is made once.

    st.plotly_chart calls `to_dict()` on every run (a deep copy of every trace plus base64 of
    each array: ~60% of a warm GPUs page's chart time), then serialises that dict without
    changing it, so the copy can be reused.
    """

    def to_dict(self) -> dict:
        if getattr(self, "_as_dict", None) is None:
            self._as_dict = super().to_dict()
        return self._as_dict


@st.cache_resource(ttl=600, max_entries=64, show_spinner=False)
def _built(name: str, key: str, _build: Callable[..., go.Figure], _args: tuple, _kwargs: dict) -> go.Figure:
    fig = _build(*_args, **_kwargs)
    if type(fig) is go.Figure:
        fig.__class__ = FrozenFigure  # the same object, not re-validated (go.Figure(fig) would be)
    return fig


def figure(build: Callable[..., go.Figure], *args: Any, **kwargs: Any) -> go.Figure:
    """`build(*args, **kwargs)`, reused while the arguments' content is the same (an argument
    given as `keyed(value)`: `value`, hashed once for all the figures it is given to)."""
    try:
        key: str | None = content_key((args, kwargs))
    except TypeError:  # a column pandas cannot hash (lists in cells): build it, as before
        key = None
    args = tuple(a.value if isinstance(a, Keyed) else a for a in args)
    kwargs = {k: v.value if isinstance(v, Keyed) else v for k, v in kwargs.items()}
    if key is None:
        return build(*args, **kwargs)
    return _built(f"{build.__module__}.{build.__qualname__}", key, build, args, kwargs)
