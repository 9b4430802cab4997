"""Run events as vertical markers on the time charts (#33 item 7): why a line moved.

`add_event_markers(fig, events)` adds, for the events (runhealth.screens.events.Event) that fall
within the figure's time span, a thin dotted vertical rule and a short label at its top whose
hover is the event's sentence. Events closer together than MERGE_SHARE of the span share one
marker (a restart with its config changes, several nodes' relaunches in one poll round), their
sentences one under the other. Pure (plotly only): the figure builders in components/figures.py
call it with the events their screen model carries; a chart without events is unchanged.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

MARKER_COLOUR = "#C9CED6"
# The label sits inside the plot at its top (above it, it ran into legends drawn there), on a
# dark veil so it reads over bars and bands.
LABEL_BACKGROUND = "rgba(14,17,23,0.75)"
MERGE_SHARE = 0.015  # of the chart's span: nearer events are one marker
PAD_SHARE = 0.02  # an event this far outside the drawn span still belongs to it (the last bucket's end)


def time_span(fig: go.Figure) -> tuple[float, float] | None:
    """(first, last) x of the figure's traces in unix seconds; None when no trace has a time axis."""
    lo, hi = np.inf, -np.inf
    for trace in fig.data:
        x = getattr(trace, "x", None)
        if x is None or len(x) == 0:
            continue
        values = np.asarray(x)
        if not np.issubdtype(values.dtype, np.datetime64):
            values = pd.to_datetime(values, errors="coerce").to_numpy()
        stamps = values.astype("datetime64[ms]").astype("int64")[~np.isnat(values)] / 1000.0
        if len(stamps):
            lo, hi = min(lo, float(stamps.min())), max(hi, float(stamps.max()))
    return (lo, hi) if lo <= hi else None


def grouped(events: Sequence[Any], lo: float, hi: float) -> list[list[Any]]:
    """The events within [lo, hi] (padded), oldest first, those close together in one group."""
    span = max(hi - lo, 60.0)
    inside = sorted(
        (e for e in events if lo - PAD_SHARE * span <= e.ts_unix <= hi + PAD_SHARE * span), key=lambda e: e.ts_unix
    )
    groups: list[list[Any]] = []
    for e in inside:
        if groups and e.ts_unix - groups[-1][0].ts_unix <= MERGE_SHARE * span:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def _marker(group: list[Any], local_time: bool = False) -> tuple[dict, dict]:
    ts = group[0].ts_unix
    # The axes' datetimes: naive UTC (pd.to_datetime(unit="s")), or this host's local time (the alert timeline).
    x = (datetime.datetime.fromtimestamp(ts) if local_time else pd.Timestamp(ts, unit="s")).isoformat()
    labels = list(dict.fromkeys(e.label for e in group))
    shape = dict(
        type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="y domain", layer="above",
        line=dict(color=MARKER_COLOUR, dash="dot", width=1.5),
    )  # fmt: skip
    note = dict(
        text="⚑ " + " · ".join(labels), x=x, xref="x", y=1, yref="y domain", yanchor="top", xanchor="left",
        showarrow=False, font=dict(size=11, color=MARKER_COLOUR), bgcolor=LABEL_BACKGROUND,
        hovertext="<br>".join(e.text for e in group),
    )  # fmt: skip
    return shape, note


def events_of(df: pd.DataFrame, events: Sequence[Any] | None) -> Sequence[Any]:
    """The events a builder was given, else those its frame carries (`df.attrs["events"]`: the
    loaders put them there for pages that pass a frame only)."""
    return events if events is not None else df.attrs.get("events") or ()


def add_event_markers(
    fig: go.Figure, events: Sequence[Any] | None, span: tuple[float, float] | None = None, local_time: bool = False
) -> go.Figure:
    """`fig` with a marker per (group of) event(s) within its time span (default: its traces' x
    from first to last; a chart of bars a bucket wide passes the span its bars cover); returns `fig`.
    `local_time`: the x axis is in this host's local time (given with its `span`), not naive UTC."""
    span = (span or time_span(fig)) if events else None
    if span is None:
        return fig
    marks = [_marker(g, local_time) for g in grouped(events or (), *span)]
    if marks:
        fig.update_layout(
            shapes=[*fig.layout.shapes, *(s for s, _ in marks)],
            annotations=[*fig.layout.annotations, *(n for _, n in marks)],
        )
    return fig
