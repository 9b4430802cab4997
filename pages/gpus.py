"""GPUs: is every GPU busy, within its power limit, cool, and running the server?

Time series of utilization, power (with the limit), memory, temperature and SM clock, averaged
in SQL into at most a few hundred points per GPU over the chosen window: one line per GPU for a
small run, per-node median lines with min-max bands past 8 GPUs, node x time heatmaps for a fleet. Idle
(<10% util) and throttled GPUs are listed first; simulated telemetry (demo) is labelled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from pandas.io.formats.style import Styler

from components import cards, figcache, figures, livewatch, loaders, page, precomputed, tables
from components.context import PageRuntime
from components.format import md_escape
from runhealth.payloads import pagedata

PREFIX = "gpus"
TITLE, ICON, URL_PATH = "GPUs", ":material/memory:", "GPUs"
WINDOWS_S = pagedata.GPU_WINDOWS_S  # the collector precomputes each window's series
# More GPUs than this: per-node bands (a node x time heatmap past figures.BAND_MAX_NODES nodes),
# never one plotly trace per GPU (4,096 GPUs took 45 s a chart, bench/fleet.py).
PER_GPU_LINES_UP_TO = pagedata.PER_GPU_LINES_UP_TO
SERIES = [  # (column, title, unit, limit column)
    ("util_pct", "Utilization", "%", None),
    ("power_w", "Power", "W", "power_limit_w"),
    ("mem_used_gib", "Memory used", "GiB", None),
    ("temp_c", "Temperature", "°C", None),
    ("sm_clock_mhz", "SM clock", "MHz", None),
]


def render_now(gpus: pd.DataFrame, run_writing: bool) -> None:
    table = tables.gpu_table(gpus, run_writing)
    flagged = table[table["state"].str.startswith("⚠")]  # the one GPU rule's warnings; information is not
    if len(flagged):
        st.warning(
            md_escape(
                f"{len(flagged)} GPU(s) need a look: "
                + ", ".join(
                    f"{g} ({s.removeprefix('⚠ ')})" for g, s in zip(flagged["GPU"], flagged["state"], strict=False)
                )
            )
        )
    st.plotly_chart(
        figcache.figure(figures.make_gpu_heatstrip_figure, gpus[["label", "util_pct", "power_pct", "mem_pct"]]),
        key=f"{PREFIX}_heatstrip_chart",
    )
    if len(table) <= cards.STATIC_TABLE_ROWS:  # a few GPUs: a static table, no data grid (#42)
        st.table(static_gpu_table(table), hide_index=True)
        return
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "util %": st.column_config.ProgressColumn("util %", min_value=0, max_value=100, format="%.0f"),
            "mem GiB": st.column_config.NumberColumn(format="%.1f"),
            "of GiB": st.column_config.NumberColumn(format="%.0f"),
            "power W": st.column_config.NumberColumn(format="%.0f"),
        },
    )


GPU_TABLE_FORMATS = {
    **dict.fromkeys(["util %", "power W", "limit W", "of GiB", "temp °C", "SM MHz"], "{:.0f}"),
    "mem GiB": "{:.1f}",
}
UTIL_BAR = "rgba(31, 119, 180, 0.45)"  # legible in either theme
UTIL_BAR_WIDTH = 72  # % of the cell a full bar takes


def static_gpu_table(table: pd.DataFrame) -> Styler:
    """The GPU table as a static table: the grid's formats, utilization as a bar (0-100% over the
    cell's left UTIL_BAR_WIDTH %, clear of its right-aligned number), a reading the GPU did not give
    as "N/A" (never 0, never blank)."""
    styled = table.style.format(GPU_TABLE_FORMATS, na_rep="N/A")
    return styled.bar(subset=["util %"], vmin=0, vmax=100, color=UTIL_BAR, height=60, width=UTIL_BAR_WIDTH)


def render_series(
    rt: PageRuntime,
    window: str,
    labels: list[str],
    series: Sequence[tuple[str, str, str, str | None]] = SERIES,
    height: int | Literal["content"] = "content",
    events: tuple = (),
) -> None:
    # The collector's precomputed series (runhealth/payloads/pagedata.py); the store itself only for a
    # choice of a few GPUs the payload has no lines for, or before the first payload.
    pre = precomputed.gpu_window(rt.store, window, labels)
    if pre is None:
        span = WINDOWS_S[window]
        df = loaders.load_gpu_series(rt.store, (time.time() - span) // 10 * 10 if span else None)
        df = df[df["label"].isin(labels)] if len(df) else df
    else:
        df = pre.series if pre.series is not None else next(iter((pre.bands or {}).values()))
    if df.empty:
        st.info(f"No GPU samples in the last {window}.")
        return
    st.caption(f"Series over the last {window}: {precomputed.age_text(pre.as_of if pre else None)}.")
    cols = st.columns(2)
    frame = figcache.keyed(df) if pre is None or pre.bands is None else None  # hashed once for its charts
    for i, (col, title, unit, limit) in enumerate(series):
        if pre and pre.bands is not None:  # past PER_GPU_LINES_UP_TO GPUs, with or without a payload
            lim, band = pre.limits.get(limit) if limit else None, pre.bands[col]
            scale = (0, 100) if unit == "%" else (0, lim) if lim else None  # fixed: colours mean the same each refresh
            fig = figcache.figure(
                figures.make_gpu_band_figure, band, title, unit, lim, scale, show_legend=i == 0, events=events
            )
        else:
            fig = figcache.figure(series_figure, frame, col, title, unit, limit, events)
        cols[i % 2].plotly_chart(fig, key=f"{PREFIX}_{col}_chart", height=height)


def series_figure(
    df: pd.DataFrame, col: str, title: str, unit: str, limit: str | None, events: tuple = ()
) -> go.Figure:
    """One line per GPU; a percentage on a fixed 0-100 axis; the run's events as markers."""
    fig = figures.make_gpu_timeseries_figure(df, col, title, unit, limit, events)
    if unit == "%":
        fig.update_yaxes(range=[0, 100])
    return fig


def render_processes(gpus: pd.DataFrame) -> None:
    st.subheader("Processes holding GPU memory")
    procs = tables.gpu_processes(gpus)
    if procs.empty:
        st.info("No process holds GPU memory (or the driver does not report processes).")
    elif len(procs) > cards.STATIC_TABLE_ROWS:
        st.dataframe(
            procs,
            hide_index=True,
            width="stretch",
            column_config={"mem GiB": st.column_config.NumberColumn(format="%.1f")},
        )
    else:  # a few: a static table, no data grid (#42)
        st.table(procs.style.format({"mem GiB": "{:.1f}"}, na_rep="N/A"), hide_index=True)


def render_page(rt: PageRuntime, window: str, picked: list[str]) -> None:
    m = loaders.load_gpus_screen(rt.store, rt.config)
    for sentence in m.telemetry_errors:
        st.warning(md_escape(sentence))
    gpus = loaders.gpu_frame(m.gpus)
    if gpus.empty:
        if m.never_polled:
            cards.render_nothing_yet(list(m.nodes), "GPU telemetry")
        else:
            st.info(
                'No node reported a GPU (gpu = "off", or neither NVML nor nvidia-smi works there): '
                "see each node's GPU source on the Nodes page."
            )
        return
    if rt.demo or m.simulated:
        st.info("GPU telemetry on this page is simulated (demo mode): the numbers are made up.")
    cards.render_problems(m.problems, "Problems")
    render_now(gpus, m.writing)
    labels = gpus.loc[gpus["node"].isin(picked or gpus["node"].unique()), "label"].tolist()
    render_series(rt, window, labels, events=m.events)
    render_processes(gpus)


KIOSK_SERIES = SERIES[:2]  # utilization and power: the two a wall screen has room for


def render_kiosk(rt: PageRuntime) -> None:
    """The wall screen (?kiosk=1), within 1920x1080: problems (a few), GPUs now, utilization and
    power over the last hour; no select boxes (nobody at a wall picks)."""
    m = loaders.load_gpus_screen(rt.store, rt.config)
    gpus = loaders.gpu_frame(m.gpus)
    if gpus.empty:
        st.info("No node reports a GPU: the wall's rotation skips this page.")
        return
    notes = [("warning", text) for text in m.telemetry_errors]
    # One container: however many problem lines come and go between refreshes, the charts below
    # keep their place in the page (a shifted chart is a new one to the browser, drawn from blank).
    with st.container():
        cards.render_problems(notes + m.problems, "Problems", limit=1)
    heat = figcache.figure(figures.make_gpu_heatstrip_figure, gpus[["label", "util_pct", "power_pct", "mem_pct"]])
    st.plotly_chart(heat, key=f"{PREFIX}_heatstrip_chart", height=260)
    window = list(WINDOWS_S)[1]
    render_series(rt, window, gpus["label"].tolist(), KIOSK_SERIES, height=330, events=m.events)
    simulated = rt.demo or m.simulated
    page.kiosk_caption(
        PREFIX,
        1,
        ("Simulated telemetry (demo). " if simulated else "")
        + "The GPU table, memory, temperature, SM clock and processes: without ?kiosk=1.",
    )


def render(rt: PageRuntime) -> None:
    """The GPUs page for runtime `rt` (app.py has drawn the shared frame)."""
    st.title("GPUs")
    if page.kiosk():  # the wall never scrolls and has no keyboard: no select boxes, a layout that fits
        page.live(rt, render_kiosk, rt, follows=livewatch.PAYLOADS)
        return
    # The controls stay outside the live fragment: a refresh never resets what the viewer picked.
    c1, c2 = st.columns([1, 3])
    window = c1.selectbox("Window", list(WINDOWS_S), index=1, key=f"{PREFIX}_window_select")
    m = loaders.load_gpus_screen(rt.store, rt.config)
    picked = c2.multiselect(
        "Nodes",
        sorted(n["name"] for n in m.nodes),
        key=f"{PREFIX}_node_select",
        placeholder="all nodes",
    )
    page.live(rt, render_page, rt, window, picked, follows=livewatch.PAYLOADS)
    gpus_now = loaders.gpu_frame(loaders.load_gpus_screen(rt.store, rt.config).gpus)
    page.download_csv(tables.gpu_table(gpus_now) if len(gpus_now) else pd.DataFrame(), "gpus.csv", PREFIX)
