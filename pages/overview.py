"""Overview: the standup screen. Is the run healthy, fast AND producing good data?

The screen at the root URL (app.py routes here). Everything below the title refreshes itself
every collection interval inside one fragment (page.live), so the screen on the wall stays
current without a full-page rerun; `?kiosk=1` is the wall-screen mode. Node states: up = polled
within stale_after; stale = older; down = never reached, or nothing for 5 x stale_after.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from components import alerts, cards, figures, loaders, page, runpicker, tables
from components.context import PageRuntime
from runhealth import hardware

PREFIX = "overview"
TITLE, ICON, URL_PATH = "Overview", ":material/monitor_heart:", "Overview"  # served at / (the default page)
TITLE_IS_RUN = True  # the title is the run's name: no "Run: <name>" line above it (unless finished)
HEAT_COLUMNS = ["label", "util_pct", "power_pct", "mem_pct"]


def make_heatstrip_figure(gpus: pd.DataFrame, now: float, stale_after: float):
    """GPUs whose last reading is older than stale_after are marked: old numbers must not look live;
    so are hardware-throttled ones, which the colour scale would otherwise show as busy and well."""
    old = (now - gpus["ts_unix"]) > stale_after
    slow = gpus["throttle_reasons"].map(lambda r: any(x in hardware.HW_THROTTLE for x in r or []))
    label = gpus["label"].where(~slow, gpus["label"] + " ⚠ throttled").where(~old, gpus["label"] + " (old)")
    return figures.make_gpu_heatstrip_figure(gpus[HEAT_COLUMNS].assign(label=label))


def render_live(rt: PageRuntime) -> None:
    """The live tiles; one fragment so a refresh redraws in place, no flicker of the page."""
    cfg, now = rt.config, time.time()
    nodes = loaders.load_nodes(rt.store)
    summary = loaders.load_run_lengths(rt.store, cfg.max_output_tokens).summary
    thr = loaders.load_throughput(rt.store, cfg.interval_s)
    health = loaders.load_health(rt.store)
    gpus = loaders.load_gpu_latest(rt.store)
    last = loaders.load_last_collection(rt.store)
    found = alerts.current(rt.store, cfg)  # the core's alerts, nothing added or left out
    cards.render_alerts(alerts.lines(found))
    finished = runpicker.is_finished(rt)
    if finished:  # its final figures, not live placeholders ("waiting for two polls", "2/2 up")
        tiles = cards.final_tiles(loaders.load_final(rt.store, summary.completions), summary, cfg, len(nodes))
    else:
        tiles = cards.overview_tiles(summary, thr, nodes, gpus, cfg.target_completions, last, cfg, now, health)
    if any(a.name == "run_stalled" for a in found):  # a rate over the last minute still shows the past
        tiles[1] = {**tiles[1], "level": "alert", "sub": "run stalled: no new completions · " + tiles[1]["sub"]}
    cards.render_tiles(tiles[:3])
    cards.render_tiles(tiles[3:])
    if cfg.target_completions:
        share = min(1.0, summary.completions / cfg.target_completions)
        st.progress(share, text=f"{summary.completions:,} of {cfg.target_completions:,} completions")
    cards.render_indexing(nodes)
    left, right = st.columns([3, 2])
    with left:
        if gpus.empty:
            st.info(
                "No GPU telemetry yet: "
                + ("waiting for first poll" if last is None else "no node reported a GPU (see the Nodes page)")
            )
        else:
            st.plotly_chart(make_heatstrip_figure(gpus, now, cfg.stale_after), key=f"{PREFIX}_heatstrip_chart")
            if rt.demo or any(n.get("gpu_simulated") for n in nodes):
                st.caption("GPU telemetry is simulated (demo).")
        # GPU and host problems are alerts (above); here only what is worth knowing and no problem.
        cards.render_problems(loaders.load_gpu_notes(rt.store, bool(health.tokens_per_s_1m)), "GPUs")
    with right:
        cards.render_node_table(
            nodes, cfg.stale_after, compact=True, per_node=None if finished else health.per_node, finished=finished
        )
        series = thr.series
        if len(series) >= 2:
            st.plotly_chart(figures.make_throughput_figure(series), key=f"{PREFIX}_throughput_chart")
        else:
            st.caption(
                "The throughput chart appears once a few minutes of polls are in (the first scan is not counted)."
            )


def render(rt: PageRuntime) -> None:
    """The Overview for runtime `rt` (app.py has drawn the shared frame)."""
    st.markdown(page.BIG_ALERTS_CSS, unsafe_allow_html=True)
    if rt.demo:
        st.markdown(f'<div class="rh-demo">{page.DEMO_TEXT}</div>', unsafe_allow_html=True)
    st.title(f"{rt.config.name}")
    page.live(rt, render_live, rt)
    page.download_headline(rt, PREFIX)
    page.download_csv(
        tables.node_table(loaders.load_nodes(rt.store), rt.config.stale_after),
        "nodes.csv",
        PREFIX,
        label="Download node table (CSV)",
    )
