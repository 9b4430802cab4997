"""Pure plotly figure builders for runhealth's screens.

Every `make_*_figure` takes a non-empty pandas DataFrame (the page decides what to say when
there is nothing to draw) and returns a plotly Figure in the dark template. No Streamlit here,
so these are tested directly (tests/test_figures.py). Colours carry meaning across screens:
blue = normal stops, amber = at the ceiling / warning, red = alert or a drifting group.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from numpy.typing import ArrayLike
from plotly.basedatatypes import BaseTraceType

from components.markers import add_event_markers, events_of
from runhealth.screens.lengths import level

DARK = "runhealth_dark"
# plotly_dark with fixed margins: its axes' automargin makes plotly.js draw a chart, measure every
# tick label and draw it again when they overflow: 1.6x the browser's drawing time on the
# dashboard's 14 charts (bench/browser.py, #42). Each figure sets margins that fit its labels.
pio.templates[DARK] = go.layout.Template(pio.templates["plotly_dark"])
pio.templates[DARK].layout.xaxis.automargin = False
pio.templates[DARK].layout.yaxis.automargin = False
# ... and in each figure's own layout: st.plotly_chart's theme (theme="streamlit", the default)
# lays Streamlit's template over the figure's, and that one turns automargin on for every axis.
# A layout's own value wins over any template (a second axis sets it where it is made).
# An axis whose tick labels are names from the nodes or the data (nodes, GPUs, shards, groups,
# alert rules: any length) keeps automargin on (NAMES_AXIS): one more draw of that chart.
FIXED_AXES = {"xaxis": {"automargin": False}, "yaxis": {"automargin": False}}
NAMES_AXIS = {"automargin": True}
STOP_COLOUR = "#4C9AFF"
CEILING_COLOUR = "#FFB000"  # the highlight of the ceiling spike
ALERT_COLOUR = "#FF4B4B"
OTHER_COLOUR = "#8A8F98"
BACKFILL_COLOUR = "#555A63"
FONT_SIZE = 16


def new_figure(*data: BaseTraceType) -> go.Figure:
    """A new Figure in plotly's dark template.

    plotly copies its default template into a new Figure without validating it again (0.5 ms);
    setting a template on a figure validates it (20-30 ms a figure, five on a page). Streamlit
    makes its own template the default when its plotly module loads, so ours is re-asserted
    here (setting it costs ~18 ms: only when it changed). Every figure of the dashboard is
    built in this module.
    """
    if pio.templates.default != DARK:
        pio.templates.default = DARK
    return go.Figure(list(data), layout=FIXED_AXES)


def new_figure_from(data: list[dict], layout: dict) -> go.Figure:
    """A Figure in the dark template from trace and layout dicts, validated once (each
    update_layout / add_shape on a built figure validates again)."""
    if pio.templates.default != DARK:
        pio.templates.default = DARK
    axes = {k: {"automargin": False, **(v or {})} for k, v in layout.items() if k[1:5] == "axis" and k[0] in "xy"}
    return go.Figure(data=data, layout={**FIXED_AXES, **layout, **axes})


def _layout(title: str, height: int = 380) -> dict:
    return dict(
        title=dict(text=title, font=dict(size=FONT_SIZE + 4)),
        height=height,
        font=dict(size=FONT_SIZE),
        margin=dict(l=60, r=30, t=60, b=50),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
    )


def pct_axis(top: float) -> dict:
    """A share axis (0 to about `top`, a fraction) whose tick labels differ: the step is the
    1-2-5 multiple nearest top/5 and the labels carry the decimals that step needs (".0%" on a
    0-2.3% axis read "0%, 0%, 1%, 1%, 2%"; here "0.0%, 0.5%, 1.0%, ...")."""
    top = float(top)
    raw = (top if math.isfinite(top) and top > 1e-4 else 0.01) / 5  # nothing drawn yet: 0-1%
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10)), key=lambda c: abs(math.log(c / raw)))  # 3-8 ticks
    decimals = max(0, -math.floor(math.log10(step * 100) + 1e-9))
    return dict(tickformat=f".{decimals}%", tick0=0, dtick=step, rangemode="tozero")


# Under the plot, left-aligned: clear of a long title at the top left (a legend at the top right
# ran into it on the half-width GPU charts). `y` is below the x axis' tick labels.
LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0)


def apply_layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(**_layout(title, height))
    return fig


# plotly's add_vline / add_hline look the subplot up on every call (6-10 ms each, up to three a
# figure); these add the same shape and annotation directly (tests/test_figures.py compares).
_VLINE_TEXT = {"top right": (1, "top", "left"), "top left": (1, "top", "right"), "bottom right": (0, "bottom", "left")}


def _vline_shape(x: float, **line: str | float) -> dict:
    return dict(type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="y domain", line=line)


def _vline_text(x: float, text: str, position: str = "top right") -> dict:
    y, yanchor, xanchor = _VLINE_TEXT[position]
    return dict(text=text, showarrow=False, x=x, xref="x", xanchor=xanchor, y=y, yref="y domain", yanchor=yanchor)


def vline(fig: go.Figure, x: float, text: str | None = None, position: str = "top right", **line: str | float) -> None:
    """A vertical rule at data x across the plot; `line` holds shape line keys (dash, color, width)."""
    fig.add_shape(**_vline_shape(x, **line))
    if text is not None:
        fig.add_annotation(**_vline_text(x, text, position))


def _hline_shape(y: float, **line: str | float) -> dict:
    return dict(type="line", x0=0, x1=1, xref="x domain", y0=y, y1=y, yref="y", line=line)


def _hline_text(y: float, text: str) -> dict:
    return dict(text=text, showarrow=False, x=1, xref="x domain", xanchor="right", y=y, yref="y", yanchor="bottom")


def _figure(data: list[dict], layout: dict, shapes: list[dict], notes: list[dict]) -> go.Figure:
    """`new_figure_from` with the rules (shapes) and labels (annotations) in the layout, when any."""
    if shapes:
        layout["shapes"] = shapes
    if notes:
        layout["annotations"] = notes
    return new_figure_from(data, layout)


def hline(fig: go.Figure, y: float, text: str | None = None, **line: str | float) -> None:
    """A horizontal rule at data y across the plot, its label at the top right (plotly's default)."""
    fig.add_shape(**_hline_shape(y, **line))
    if text is not None:
        fig.add_annotation(**_hline_text(y, text))


def make_length_histogram_figure(df: pd.DataFrame, ceiling: int | None, at_ceiling_fraction: float | None) -> go.Figure:
    """Stacked length histogram; the ceiling spike in amber, annotated with its share.

    `df` columns: bin_start, bin_end, stop, at_ceiling, other (completion counts per bin).
    """
    # Traces and layout as dicts, validated once (each add_* / update_* validates again: the
    # length figures took 20-30 ms each, five on the page; tests/test_figures.py compares).
    width = (df["bin_end"] - df["bin_start"]).clip(lower=1)
    centre = df["bin_start"] + width / 2
    data = [dict(type="bar", x=centre, y=df["stop"], width=width, name="stop", marker=dict(color=STOP_COLOUR))]
    if df["other"].sum() > 0:
        data.append(
            dict(
                type="bar",
                x=centre,
                y=df["other"],
                width=width,
                name="other (incl. length below the ceiling)",
                marker=dict(color=OTHER_COLOUR),
            )
        )
    spike = df[df["at_ceiling"] > 0]
    if len(spike):
        # An exact ceiling bin can be 1 token wide on a 4096-token axis: give it a visible width.
        span = float(df["bin_end"].max() - df["bin_start"].min()) or 1.0
        vis = (spike["bin_end"] - spike["bin_start"]).clip(lower=span / 80)
        data.append(
            dict(
                type="bar",
                x=spike["bin_start"] + vis / 2,
                y=spike["at_ceiling"],
                width=vis,
                name="stopped at the ceiling",
                marker=dict(color=CEILING_COLOUR),
            )
        )
    shapes, notes = [], []
    if ceiling:
        shapes.append(_vline_shape(ceiling, dash="dash", color=CEILING_COLOUR, width=2))
        if at_ceiling_fraction is not None and len(spike):
            notes.append(
                dict(
                    x=ceiling,
                    y=float(spike["at_ceiling"].max()),
                    xanchor="right",
                    ax=-80,
                    ay=-10,
                    text=f"<b>{at_ceiling_fraction:.1%} stopped at the {ceiling:,}-token ceiling</b>",
                    font=dict(size=FONT_SIZE + 2, color=CEILING_COLOUR),
                    arrowcolor=CEILING_COLOUR,
                    showarrow=True,
                    bgcolor="rgba(0,0,0,0.6)",
                )
            )
    layout = _layout("Output length distribution")
    layout.update(
        barmode="stack",
        bargap=0,
        xaxis=dict(title=dict(text="completion tokens"), range=[0, float(df["bin_end"].max()) * 1.03]),
        yaxis=dict(title=dict(text="completions")),
    )
    return _figure(data, layout, shapes, notes)


def make_cdf_figure(df: pd.DataFrame, ceiling: int | None = None) -> go.Figure:
    """Cumulative share of completions by length. `df` columns: tokens, cum_fraction."""
    line = dict(
        type="scatter",
        x=df["tokens"],
        y=df["cum_fraction"],
        mode="lines",
        line=dict(color=STOP_COLOUR, width=3, shape="hv"),
        name="share ≤ length",
    )
    shapes, notes = [], []
    if ceiling:
        shapes.append(_vline_shape(ceiling, dash="dash", color=CEILING_COLOUR, width=2))
        notes.append(_vline_text(ceiling, f"ceiling {ceiling:,}", "top left"))
    layout = _layout("Cumulative distribution")
    layout.update(
        xaxis=dict(title=dict(text="completion tokens")),
        yaxis=dict(title=dict(text="share of completions ≤ length"), tickformat=".0%", range=[0, 1.02]),
    )
    return _figure([line], layout, shapes, notes)


def make_truncation_by_group_figure(df: pd.DataFrame, warn: float, alert: float) -> go.Figure:
    """Share at the ceiling per node or shard, with its 95% interval.

    `df` columns: group, fraction, lo, hi, ceiling, drift (bool: this group's ceiling differs);
    optional label (a short name for the axis; the full one is on hover).
    """
    by_level = {"alert": ALERT_COLOUR, "warn": CEILING_COLOUR, "ok": STOP_COLOUR}
    colours = [
        ALERT_COLOUR if d else by_level[level(f, warn, alert)]
        for f, d in zip(df["fraction"], df["drift"], strict=False)
    ]
    labels = [
        f"{f:.1%}" + (f" · ceiling {int(c):,} differs" if d else "")
        for f, c, d in zip(df["fraction"], df["ceiling"].fillna(0), df["drift"], strict=False)
    ]
    short = (df["label"] if "label" in df else df["group"]).astype(str)  # names, never numbers
    bar = dict(
        type="bar",
        x=short,
        y=df["fraction"],
        marker=dict(color=colours),
        showlegend=False,  # the colours are levels, told by the warn / alert rules
        customdata=df[["group"]].assign(n=df.get("completions", 0)),
        hovertemplate="%{customdata[0]}<br>%{y:.1%} of %{customdata[1]:,}<extra></extra>",
        error_y=dict(
            type="data",
            symmetric=False,
            array=df["hi"] - df["fraction"],
            arrayminus=df["fraction"] - df["lo"],
            color="#CCCCCC",
        ),
    )
    # The value labels sit above each interval's top, not on the bar's top (the error bar ran through them).
    values = dict(
        type="scatter",
        x=short,
        y=df["hi"],
        mode="text",
        text=labels,
        textposition="top center",
        showlegend=False,
        hoverinfo="skip",
    )
    shapes = [_hline_shape(warn, dash="dot", color=CEILING_COLOUR), _hline_shape(alert, dash="dot", color=ALERT_COLOUR)]
    notes = [_hline_text(warn, "warn"), _hline_text(alert, "alert")]
    top = float(np.nanmax([*df["hi"], alert]))
    layout = _layout("Truncation by group", height=360)
    layout.update(
        yaxis=dict(title=dict(text="share at the ceiling"), range=[0, top * 1.2], **pct_axis(top)),
        xaxis=dict(type="category", tickangle=0 if len(df) <= 8 else -35, **NAMES_AXIS),
    )
    return _figure([bar, values], layout, shapes, notes)


def make_truncation_over_time_figure(
    df: pd.DataFrame, warn: float, alert: float, events: Sequence[Any] | None = None
) -> go.Figure:
    """Share of new completions truncated (length stop at the ceiling) per time bucket, with
    length stops below the ceiling (context window) stacked above under their own name.

    `df` columns: bucket_unix, completions, at_ceiling, below_ceiling, unsplit, backfill (first
    scan buckets are grey: they hold everything written before monitoring began).
    """
    t = pd.to_datetime(df["bucket_unix"], unit="s")
    n = df["completions"].where(df["completions"] > 0)
    share = df["at_ceiling"] / n
    first = df["backfill"].astype(bool)
    # One colour per trace: a legend swatch takes its trace's first colour, so first-scan grey
    # inside the amber trace made the "truncated" swatch grey. The first scan is its own trace.
    data = [
        dict(
            type="bar",
            x=t,
            y=share.where(~first),
            marker=dict(color=CEILING_COLOUR),
            name="truncated (at the ceiling)",
            customdata=df["completions"],
            hovertemplate="truncated %{y:.1%} of %{customdata} new<extra></extra>",
        ),
        dict(
            type="bar",
            x=t,
            y=df["below_ceiling"] / n,
            marker=dict(color=OTHER_COLOUR),
            name="length stop below the ceiling",
            customdata=df["completions"],
            hovertemplate="below the ceiling %{y:.1%} of %{customdata} new<extra></extra>",
        ),
    ]
    if first.any():
        data.insert(
            1,
            dict(
                type="bar",
                x=t,
                y=share.where(first),
                marker=dict(color=BACKFILL_COLOUR),
                name="truncated, first scan",
                customdata=df["completions"],
                hovertemplate="first scan: truncated %{y:.1%} of %{customdata}<extra></extra>",
            ),
        )
    if df["unsplit"].sum() > 0:
        data.append(
            dict(
                type="bar",
                x=t,
                y=df["unsplit"] / n,
                marker=dict(color="#5A5F6A"),
                name="length stop, length unknown (estimate)",
            )
        )
    shapes = [_hline_shape(warn, dash="dot", color=CEILING_COLOUR), _hline_shape(alert, dash="dot", color=ALERT_COLOUR)]
    notes = [_hline_text(warn, "warn"), _hline_text(alert, "alert")]
    top = max(float(((df["at_ceiling"] + df["below_ceiling"] + df["unsplit"]) / n).max(skipna=True) or 0), alert)
    layout = _layout("Truncated over time (grey = first scan)", height=320)
    layout.update(barmode="stack", yaxis=dict(title=dict(text="share of new completions"), **pct_axis(top)))
    return add_event_markers(_figure(data, layout, shapes, notes), events_of(df, events))


HOUR_MS = 3_600_000  # a date axis measures bar widths and offsets in milliseconds
# p50 / p90 / p99: each its own colour, dash and marker, drawn over the ceiling rule, so a
# percentile that sits at the ceiling (p90 = p99 = 4,096 in a truncating run) still shows.
PERCENTILE_STYLE = (
    ("p50", "#4C9AFF", "solid", "circle"),
    ("p90", "#2EC4B6", "dash", "square"),
    ("p99", "#C77DFF", "dot", "diamond"),
)


def share_axis_covering(top: float) -> dict:
    """`pct_axis(top)` with its range ending on the first tick at or above `top`: the top tick
    label is at least the highest bar (autorange stopped the labels at 14% under a 15% bar)."""
    axis = pct_axis(top)
    top = float(top) if math.isfinite(float(top)) and top > 0 else 0.0
    ticks = max(1, math.ceil(top / axis["dtick"] - 1e-9))
    return dict(axis, range=[0, ticks * axis["dtick"]], autorange=False)


def make_lengths_over_time_figure(
    df: pd.DataFrame, ceiling: int | None, events: Sequence[Any] | None = None
) -> go.Figure:
    """Per hour: p50 / p90 / p99 completion length (left axis) and the share at the ceiling (bars, right).

    `df` columns: bucket_unix (the hour's start), p50, p90, p99, at_ceiling_fraction,
    completions, backfill. Each bar spans its hour from its start (a centred bar drew 14:00-15:00's
    data from 13:37 to 14:24); the percentile points sit at the middle of their hour.
    """
    start = pd.to_datetime(df["bucket_unix"], unit="s")
    middle = start + pd.Timedelta(minutes=30)
    hours = start.dt.strftime("%H:%M") + "–" + (start + pd.Timedelta(hours=1)).dt.strftime("%H:%M")
    first = df["backfill"].astype(bool)
    data: list[dict] = []
    # One colour per bar trace, so each legend swatch is the colour of its bars.
    for name, rows, colour in (
        ("share at ceiling", ~first, CEILING_COLOUR),
        ("share at ceiling, first scan", first, BACKFILL_COLOUR),
    ):
        if rows.any():
            data.append(
                dict(
                    type="bar",
                    x=start,
                    y=df["at_ceiling_fraction"].where(rows),
                    offset=0.04 * HOUR_MS,
                    width=0.92 * HOUR_MS,
                    marker=dict(color=colour),
                    opacity=0.45,
                    yaxis="y2",
                    name=name,
                    customdata=np.column_stack([df["completions"], hours]),
                    hovertemplate="%{customdata[1]}: %{y:.1%} of %{customdata[0]} at the ceiling<extra></extra>",
                )
            )
    for name, colour, dash, symbol in PERCENTILE_STYLE:
        data.append(
            dict(
                type="scatter",
                x=middle,
                y=df[name],
                mode="lines+markers",
                name=name,
                line=dict(color=colour, dash=dash, width=3),
                marker=dict(symbol=symbol, size=9, color=colour),
                customdata=hours,
                hovertemplate=f"%{{customdata}}: {name} %{{y:,}} tokens<extra></extra>",
            )
        )
    shapes, notes = [], []
    if ceiling:
        # Under the traces, thin and grey-red: a percentile at the ceiling is drawn over it, and said.
        shapes.append(dict(_hline_shape(ceiling, dash="dot", color=ALERT_COLOUR, width=1.5), layer="below"))
        reach = [name for name, *_ in PERCENTILE_STYLE if (df[name] >= ceiling).any()]
        notes.append(
            _hline_text(ceiling, f"ceiling {ceiling:,}" + (f" ({', '.join(reach)} reach it)" if reach else ""))
        )
    top = float(df["at_ceiling_fraction"].max(skipna=True) or 0)
    layout = _layout("Lengths per hour, whole run (grey bars = first scan)", height=340)
    layout.update(
        barmode="overlay",
        yaxis=dict(title=dict(text="tokens"), rangemode="tozero"),
        yaxis2=dict(overlaying="y", side="right", showgrid=False, automargin=False, **share_axis_covering(top)),
    )
    covered = (float(df["bucket_unix"].min()), float(df["bucket_unix"].max()) + 3600)  # the bars cover whole hours
    return add_event_markers(_figure(data, layout, shapes, notes), events_of(df, events), covered)


def make_gpu_heatstrip_figure(df: pd.DataFrame) -> go.Figure:
    """One column per GPU, rows utilization / power % of limit / memory %.

    `df` columns: label (e.g. "node-1/0"), util_pct, power_pct, mem_pct (None = N/A).
    """
    if len(df) > HEATSTRIP_MAX_GPUS:
        return make_gpu_grid_figure(df)
    rows = [("util %", "util_pct"), ("power %", "power_pct"), ("mem %", "mem_pct")]
    z = [df[col].tolist() for _, col in rows]
    text = [["N/A" if pd.isna(v) else f"{v:.0f}" for v in r] for r in z]
    labels = df["label"].tolist()
    heat = dict(
        type="heatmap",
        z=z,
        x=labels,
        y=[name for name, _ in rows],
        zmin=0,
        zmax=100,
        text=np.array(text, dtype=object),  # an array is validated at once, a list cell by cell
        texttemplate="%{text}",
        colorscale="Viridis",
        xgap=2,
        ygap=2,
        colorbar=dict(title=dict(text="%"), thickness=12),
        hovertemplate="%{x} %{y}: %{text}<extra></extra>",
    )
    layout = _layout("GPUs now", height=260)
    # "node/gpu" on two lines keeps long node names from overlapping.
    layout["xaxis"] = dict(
        type="category",
        tickvals=labels,
        tickangle=-60 if len(df) > 16 else 0,
        ticktext=[lbl if len(df) > 16 else lbl.replace("/", "<br>GPU ", 1) for lbl in labels],
        **NAMES_AXIS,
    )
    layout["yaxis"] = dict(autorange="reversed")
    return new_figure_from([heat], layout)


HEATSTRIP_MAX_GPUS = 64


def make_gpu_grid_figure(df: pd.DataFrame) -> go.Figure:
    """A fleet at a glance: one row per node, one cell per GPU, coloured by utilization
    (hover: power and memory). `df` columns: label ("node/gpu"), util_pct, power_pct, mem_pct."""
    parts = df["label"].str.rsplit("/", n=1, expand=True)
    grid = df.assign(node=parts[0], gpu=parts[1].astype(int))
    util = grid.pivot(index="node", columns="gpu", values="util_pct")
    util = util.reindex(natural_order(util.index))
    power = grid.pivot(index="node", columns="gpu", values="power_pct").reindex_like(util)
    mem = grid.pivot(index="node", columns="gpu", values="mem_pct").reindex_like(util)
    text = [[("N/A" if pd.isna(u) else f"{u:.0f}") for u in row] for row in util.to_numpy()]

    def pct(v: float | None) -> str:
        return "N/A" if v is None or pd.isna(v) else f"{v:.0f}%"

    hover = [
        [f"util {pct(u)} · power {pct(p)} · mem {pct(m)}" for u, p, m in zip(ur, pr, mr, strict=False)]
        for ur, pr, mr in zip(util.to_numpy(), power.to_numpy(), mem.to_numpy(), strict=False)
    ]
    fig = new_figure(
        go.Heatmap(
            z=util.to_numpy(),
            x=[f"GPU {g}" for g in util.columns],
            y=list(util.index),
            zmin=0,
            zmax=100,
            colorscale="Viridis",
            xgap=1,
            ygap=1,
            text=np.array(text, dtype=object),
            texttemplate="%{text}" if util.size <= 600 else None,
            customdata=np.array(hover, dtype=object),  # arrays: validated at once, not per cell
            colorbar=dict(title="util %", thickness=12),
            hovertemplate="%{y} %{x}: %{customdata}<extra></extra>",
        )
    )
    fig.update_layout(yaxis=dict(autorange="reversed", **NAMES_AXIS))
    return apply_layout(
        fig,
        f"GPUs now: utilization, {len(df)} GPUs on {util.shape[0]} nodes",
        height=min(1400, 120 + 18 * util.shape[0]),
    )


def make_gpu_timeseries_figure(
    df: pd.DataFrame,
    value: str,
    title: str,
    unit: str,
    limit_col: str | None = None,
    events: Sequence[Any] | None = None,
) -> go.Figure:
    """One line per GPU over time. `df` columns: ts_unix, label, `value` [, `limit_col`]."""
    fig = new_figure()
    for label, g in df.groupby("label", sort=True):
        at = gaps(g["ts_unix"].to_numpy(float), GPU_GAP_STEPS)
        ts, ys = broken(g["ts_unix"].to_numpy(float), at, times=True), broken(g[value].to_numpy(float), at)
        fig.add_scatter(x=pd.to_datetime(ts, unit="s"), y=ys, mode="lines", name=str(label))
    if limit_col and limit_col in df and df[limit_col].notna().any():
        hline(
            fig, float(df[limit_col].max()), f"limit {df[limit_col].max():.0f} {unit}", dash="dash", color=ALERT_COLOUR
        )
    fig.update_yaxes(title_text=unit, rangemode="tozero")
    fig = apply_layout(fig, title, height=360)
    # Dozens of GPUs: hover names them instead. The legend under the plot, clear of the title.
    fig.update_layout(showlegend=len(fig.data) <= 8, legend=LEGEND_BELOW, margin=dict(b=90))
    return add_event_markers(fig, events_of(df, events))


def natural_order(names: Iterable[str]) -> list[str]:
    """node-2 before node-10 (people number their nodes)."""
    return sorted(names, key=lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(n))])


NODE_PALETTE = [
    "#4C9AFF",
    "#FFB000",
    "#3DD68C",
    "#FF6B6B",
    "#B48CFF",
    "#4DD0E1",
    "#FF8A3D",
    "#C0CA33",
    "#F06292",
    "#8D99AE",
]


def node_colour(nodes: list[str], node: str) -> str:
    """The same colour for a node on every chart (the shared legend)."""
    return NODE_PALETTE[natural_order(nodes).index(node) % len(NODE_PALETTE)]


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


BAND_MAX_NODES = 12  # more nodes than this: a node x time heatmap (bands would cover each other)


def _node_time_grids(bands: pd.DataFrame, values: tuple[str, ...]) -> tuple[list[str], np.ndarray, list[np.ndarray]]:
    """(nodes in natural order, sorted times, a node x time array per column in `values`, NaN
    where a node has no row): what `bands.pivot(index="node", columns="t_unix")` gives, filled
    by index in one pass (three pivots took ~20 ms a chart at 64 nodes x 240 steps)."""
    nodes = natural_order(pd.unique(bands["node"]))
    rows = pd.Index(nodes).get_indexer(bands["node"])
    times, cols = np.unique(bands["t_unix"].to_numpy(dtype=float), return_inverse=True)
    grids = []
    for value in values:
        grid = np.full((len(nodes), len(times)), np.nan)
        grid[rows, cols.reshape(-1)] = bands[value].to_numpy(dtype=float)
        grids.append(grid)
    return nodes, times, grids


class _TextArray(np.ndarray):
    """An object array of str that plotly deep-copies as a plain copy: its elements cannot be
    changed, so copying the array is a deep copy. plotly deep-copies every trace when the
    figure is built and again in to_dict; element by element that was ~9 ms each time for a
    64 x 240 hover-text array (per chart, five on the GPUs page)."""

    def __deepcopy__(self, memo: dict[int, Any] | None = None, /) -> _TextArray:
        return self.copy()


def _fmt0(values: np.ndarray) -> np.ndarray:
    """f"{v:.0f}" of every value (an object array of str), formatted once per distinct value
    after rounding: np.rint rounds half to even as format does, and the unique is taken over
    the bits, so -0 and 0 stay apart as format keeps them."""
    rounded = np.rint(values)
    bits, inverse = np.unique(rounded.view(np.int64), return_inverse=True)
    texts = np.array([f"{v:.0f}" for v in bits.view(np.float64)], dtype=object)
    return texts[inverse.reshape(rounded.shape)]


def make_gpu_node_heatmap_figure(
    bands: pd.DataFrame,
    title: str,
    unit: str,
    z_range: tuple[float, float] | None = None,
    events: Sequence[Any] | None = None,
) -> go.Figure:
    """Fleet scale: one row per node, time across, colour = the median of its GPUs (hover: min-max)."""
    nodes, times, (med, lo, hi) = _node_time_grids(bands, ("median", "min", "max"))
    at = gaps(times, GPU_GAP_STEPS)
    if len(at):  # no readings: two empty columns a step inside each edge, so no cell stretches across
        step = float(np.median(np.diff(times)))
        where = np.repeat(at, 2)
        edges = np.column_stack([times[at - 1] + step, times[at] - step]).ravel()
        times = np.insert(times, where, edges)
        med, lo, hi = (np.insert(a, where, np.nan, axis=1) for a in (med, lo, hi))
    # The hover text per cell, built array-wise (a string per cell in Python took ~30 ms a
    # chart); an object array, not nested lists: plotly validates a list cell by cell.
    custom = "min " + _fmt0(lo) + " · max " + _fmt0(hi)
    custom[np.isnan(lo)] = "no data"
    custom = custom.view(_TextArray)
    heat = dict(
        type="heatmap",
        z=med,
        x=pd.to_datetime(times, unit="s"),
        y=nodes,
        customdata=custom,
        colorscale="Viridis",
        colorbar=dict(title=dict(text=unit), thickness=12),
        hovertemplate="%{y} %{x}: median %{z:.0f} " + unit + " (%{customdata})<extra></extra>",
    )
    if z_range is not None:
        heat.update(zmin=z_range[0], zmax=z_range[1])
    # One validation of the whole figure (update_layout after the build validates again).
    layout = _layout(
        f"{title} · median of each node's GPUs ({len(nodes)} nodes)", height=min(1000, 140 + 12 * len(nodes))
    )
    layout["yaxis"] = dict(autorange="reversed", **NAMES_AXIS)
    return add_event_markers(new_figure_from([heat], layout), events_of(bands, events))


def make_gpu_band_figure(
    bands: pd.DataFrame,
    title: str,
    unit: str,
    limit: float | None = None,
    y_range: tuple[float, float] | None = None,
    show_legend: bool = True,
    events: Sequence[Any] | None = None,
) -> go.Figure:
    """Per node: the median across its GPUs as a line, min-max as a shaded band.

    Readable at fleet scale (64 nodes x 8 GPUs is 64 lines, not 512). `bands` columns: node,
    t_unix, median, min, max, gpus. The legend names nodes in one colour across charts.
    """
    nodes = sorted(bands["node"].unique())
    if len(nodes) > BAND_MAX_NODES:
        return make_gpu_node_heatmap_figure(bands, title, unit, y_range, events)
    # Traces and layout as dicts, the figure built and validated once: add_scatter per trace
    # re-validates the figure each time (0.25 s for 8 nodes, five charts a page), and each later
    # update_* / add_shape call validates again (together ~60% of a 35 ms build, bench/pages.py).
    ordered = bands.sort_values("node", kind="stable")
    names, starts = np.unique(ordered["node"].to_numpy(), return_index=True)
    ends = [*starts[1:], len(ordered)]
    secs_all = ordered["t_unix"].to_numpy(float)
    lo_all, hi_all, med_all = (ordered[c].to_numpy(float) for c in ("min", "max", "median"))
    custom_all = ordered[["min", "max", "gpus"]].to_numpy(float)
    traces: list[dict] = []
    for node, i, j in zip(names, starts, ends, strict=True):
        at = gaps(secs_all[i:j], GPU_GAP_STEPS)  # no readings: the line and band break
        t = pd.to_datetime(broken(secs_all[i:j], at, times=True), unit="s").to_numpy()
        lo, hi, med, custom = (broken(a[i:j], at) for a in (lo_all, hi_all, med_all, custom_all))
        colour = node_colour(nodes, node)
        traces += _band(t, hi, lo, _rgba(colour, 0.18), legendgroup=node, hoverinfo="skip")
        traces.append(
            dict(
                type="scatter",
                x=t,
                y=med,
                mode="lines",
                line=dict(color=colour, width=2),
                name=str(node),
                legendgroup=node,
                showlegend=show_legend,
                customdata=custom,
                hovertemplate=f"{node}: median %{{y:.0f}} {unit} (min %{{customdata[0]:.0f}}, max "
                f"%{{customdata[1]:.0f}}, %{{customdata[2]}} GPUs)<extra></extra>",
            )
        )
    layout = _layout(title + " · median per node, band = min–max of its GPUs", height=380)
    layout.update(legend=LEGEND_BELOW, margin=dict(l=60, r=30, t=60, b=90))  # under the plot, clear of the title
    layout["yaxis"] = dict(
        title=dict(text=unit), rangemode="tozero", **({"range": list(y_range)} if y_range is not None else {})
    )
    if limit is not None:
        layout["shapes"] = [_hline_shape(limit, dash="dash", color=ALERT_COLOUR)]
        layout["annotations"] = [_hline_text(limit, f"limit {limit:.0f} {unit}")]
    return add_event_markers(new_figure_from(traces, layout), events_of(bands, events))


GPU_GAP_STEPS = 3.0  # a GPU series breaks where no reading came for this many of its steps (stale)


def gaps(x: np.ndarray, steps: float) -> np.ndarray:
    """Where the sorted times `x` jump by more than `steps` times their median step: the
    positions (np.insert's) of the breaks a line needs there."""
    if len(x) < 3:
        return np.array([], dtype=np.int64)
    d = np.diff(x)
    return np.flatnonzero(d > steps * np.median(d)) + 1


def broken(a: np.ndarray, at: np.ndarray, times: bool = False) -> np.ndarray:
    """`a` with a point at each of `at` (`gaps`) that breaks a plotly line there: a NaN value,
    or for the `times`, the time halfway across the break."""
    if not len(at):
        return a
    return np.insert(a, at, (a[at - 1] + a[at]) / 2 if times else np.nan, axis=0)


def make_throughput_figure(df: pd.DataFrame, events: Sequence[Any] | None = None) -> go.Figure:
    """Output tokens per second over time, the run's `events` as markers; a stretch with no
    bucket (no poll covered it) is a gap. `df` columns: bucket_unix, tokens_per_s."""
    secs = df["bucket_unix"].to_numpy(float)
    at = gaps(secs, 1.5)  # buckets are evenly stepped where a poll covered them
    fig = new_figure(
        go.Scatter(
            x=pd.to_datetime(broken(secs, at, times=True), unit="s"),
            y=broken(df["tokens_per_s"].to_numpy(float), at),
            mode="lines",
            fill="tozeroy",
            line=dict(color=STOP_COLOUR, width=3),
        )
    )
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero")
    return add_event_markers(apply_layout(fig, "Throughput (from shard growth)", height=230), events_of(df, events))


def _band(
    x: ArrayLike, upper: ArrayLike, lower: ArrayLike, fillcolor: str, name: str | None = None, **both: str
) -> list[dict]:
    """A shaded band between two lines: the upper edge unseen, the lower filled up to it; with
    `name` the band has a legend entry. `both`: trace keys for both edges (legendgroup, hoverinfo)."""
    hidden = dict(width=0)
    legend = dict(name=name) if name else dict(showlegend=False)
    return [
        dict(type="scatter", x=x, y=upper, mode="lines", line=hidden, showlegend=False, **both),
        dict(
            type="scatter",
            x=x,
            y=lower,
            mode="lines",
            line=hidden,
            fill="tonexty",
            fillcolor=fillcolor,
            **legend,
            **both,
        ),
    ]


def make_whatif_figure(df: pd.DataFrame, ceiling: int, chosen: int, hard_hi: float | None = None) -> go.Figure:
    """Projected share still truncated vs a new limit, with interval and method band.

    `df` columns: limit, fraction, lo, hi, band_lo, band_hi (one row per candidate limit).
    """
    x = df["limit"]
    data = [
        *_band(x, df["band_hi"], df["band_lo"], "rgba(138,143,152,0.25)", "spread across tail models"),
        *_band(x, df["hi"], df["lo"], "rgba(76,154,255,0.3)", "95% interval"),
        dict(
            type="scatter",
            x=x,
            y=df["fraction"],
            mode="lines+markers",
            line=dict(color=STOP_COLOUR, width=3),
            name="projected share still truncated",
        ),
    ]
    shapes = [
        _vline_shape(ceiling, dash="dash", color=CEILING_COLOUR),
        _vline_shape(chosen, dash="dot", color="#FFFFFF"),
    ]
    notes = [_vline_text(ceiling, f"now {ceiling:,}"), _vline_text(chosen, f"new {chosen:,}", "bottom right")]
    if hard_hi is not None:
        shapes.append(_hline_shape(hard_hi, dash="dot", color=OTHER_COLOUR))
        notes.append(_hline_text(hard_hi, "today's share (upper bound)"))
    top = max(float(df[["hi", "band_hi", "fraction"]].max().max()), hard_hi or 0.0)
    layout = _layout("What if max_tokens were raised? (extrapolation)", height=360)
    layout.update(
        xaxis=dict(title=dict(text="max_tokens")),
        yaxis=dict(title=dict(text="share still stopped at the limit"), **pct_axis(top)),
    )
    return _figure(data, layout, shapes, notes)


SEVERITY_COLOUR = {"critical": ALERT_COLOUR, "warning": CEILING_COLOUR}


def make_alert_timeline_figure(
    df: pd.DataFrame, start_unix: float, end_unix: float, events: Sequence[Any] | None = None, window: str = "24 h"
) -> go.Figure:
    """Alert episodes as bars over [start_unix, end_unix] (local time), one row per alert and
    node, coloured by severity, the run's `events` as markers; `window` words its width in the title. `df` columns: label, severity,
    started_unix, ended_unix (an open episode ends at `end_unix`), hover (the words shown on hover)."""

    def local(ts: Any) -> list[datetime.datetime]:  # this host's local time, as the tables say it
        return [datetime.datetime.fromtimestamp(float(t)) for t in ts]

    data = []
    for severity in ("critical", "warning"):
        part = df[df["severity"] == severity]
        if part.empty:
            continue
        begin = part["started_unix"].clip(lower=start_unix)
        width_ms = (part["ended_unix"].clip(upper=end_unix) - begin).clip(lower=(end_unix - start_unix) / 400) * 1000
        data.append(
            go.Bar(
                base=local(begin),
                x=width_ms.to_numpy(),
                y=part["label"],
                orientation="h",
                name=severity,
                marker_color=SEVERITY_COLOUR[severity],
                hovertext=part["hover"],
                hoverinfo="text",
            )
        )
    fig = new_figure(*data)
    fig.update_xaxes(type="date", range=local([start_unix, end_unix]))
    fig.update_yaxes(
        autorange="reversed", categoryorder="array", categoryarray=list(dict.fromkeys(df["label"])), **NAMES_AXIS
    )
    rows = df["label"].nunique()
    fig = apply_layout(fig, f"Alerts, last {window}", height=min(420, 150 + 28 * rows))
    return add_event_markers(fig, events_of(df, events), (start_unix, end_unix), local_time=True)
