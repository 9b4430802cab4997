"""Overview: the standup screen. Is the run healthy, fast AND producing good data?

The screen at the root URL (app.py routes here). Everything below the title refreshes itself
within a fraction of a second of each Overview the collector publishes (and at least every
collection interval) inside one fragment (page.live), so the screen on the wall stays current
without a full-page rerun; `?kiosk=1` is the wall-screen mode. Node states: up = polled
within stale_after; stale = older; down = never reached, or nothing for 5 x stale_after; done =
up and wrote its fixed share of the target.
The numbers are one model read at one instant (runhealth.screens.overview): this page only lays
it out, and the headline download and `runhealth status` print the same record.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import streamlit as st

from components import alerthistory_view, alerts, cards, figures, format, livewatch, loaders, page, runpicker, tables
from components.context import PageRuntime
from runhealth.screens.overview import Overview as OverviewModel

PREFIX = "overview"
TITLE, ICON, URL_PATH = "Overview", ":material/monitor_heart:", "Overview"  # served at / (the default page)
TITLE_IS_RUN = True  # the title is the run's name: no "Run: <name>" line above it (unless finished)


def render_data_lines(m: OverviewModel) -> None:
    """Below the tiles: the failed requests coloured by their alert's severity (#39 item 2). Why
    the share at the ceiling is unknown is the red banner's (the truncation_unknown alert)."""
    if m.failed_line:
        colour = {"alert": "red", "warn": "orange"}.get(m.failed_level)
        text = format.md_escape(m.failed_line)
        st.markdown(f":{colour}[**{text}**]" if colour else text)


def render_live(rt: PageRuntime) -> None:
    """The live tiles; one fragment so a refresh redraws in place, no flicker of the page."""
    finished = runpicker.is_finished(rt)
    m = loaders.load_overview(rt.store, rt.config, finished)
    page.data_header(rt, m.as_of)  # the instant of these numbers, not a later read
    cards.render_alerts(
        alerts.lines(list(m.alerts)), all_clear=cards.ALL_CLEAR_FINISHED if finished else cards.ALL_CLEAR
    )
    tiles = [dataclasses.asdict(t) for t in m.tiles]
    cards.render_tiles(tiles[:3])
    cards.render_tiles(tiles[3:])
    render_data_lines(m)
    if m.waste_line:
        st.markdown(f"**What the cut cost:** {format.md_escape(m.waste_line)}", help=m.waste_help)
        st.caption(m.energy_line)
    if m.progress is not None:
        st.progress(*m.progress)
    if m.straggler_line:  # a node finishes later than the run's ETA by more than the intervals (#33)
        st.markdown(f"**Stragglers:** {format.md_escape(m.straggler_line)}", help=m.straggler_help)
    if m.prompts is not None:  # prompts answered of expected, or which field to configure
        st.caption(m.prompts["line"])
    nodes = list(m.nodes)
    cards.render_indexing(nodes)
    left, right = st.columns([3, 2])
    with left:
        if not m.heat:
            st.info(
                "No GPU telemetry yet: "
                + ("waiting for first poll" if m.as_of is None else "no node reported a GPU (see the Nodes page)")
            )
        else:
            heat = pd.DataFrame([dataclasses.asdict(h) for h in m.heat])
            st.plotly_chart(figures.make_gpu_heatstrip_figure(heat), key=f"{PREFIX}_heatstrip_chart")
            if rt.demo or m.gpu_simulated:
                st.caption("GPU telemetry is simulated (demo).")
        # GPU and host problems are alerts (above); here only what is worth knowing and no problem.
        cards.render_problems(list(m.gpu_notes), "GPUs")
    with right:
        cards.render_node_table(
            nodes,
            rt.config.stale_after,
            compact=True,
            per_node=m.per_node,
            finished=finished,
            now=m.now,
            done=m.done_nodes,
            static=True,  # a handful of nodes: a static table, no data grid on the page (#42)
        )
        if len(m.throughput) >= 2:
            series = pd.DataFrame([dataclasses.asdict(p) for p in m.throughput])
            st.plotly_chart(figures.make_throughput_figure(series, m.events), key=f"{PREFIX}_throughput_chart")
        else:
            st.caption(
                "The throughput chart appears once a few minutes of polls are in (the first scan is not counted)."
            )
    page.guarded(alerthistory_view.render_today)(rt, PREFIX, m.events)


def render_kiosk(rt: PageRuntime) -> None:
    """The wall screen (?kiosk=1) in two parts, each within 1920x1080: 1 = alerts and tiles,
    2 = throughput, the node table and GPUs now."""
    m = loaders.load_overview(rt.store, rt.config, runpicker.is_finished(rt))
    page.data_header(rt, m.as_of)
    if page.kiosk_part() == 1:
        cards.render_alerts(alerts.lines(list(m.alerts)), limit=page.KIOSK_MAX_ALERTS)
        tiles = [dataclasses.asdict(t) for t in m.tiles]
        cards.render_tiles(tiles[:3])
        cards.render_tiles(tiles[3:])
        render_data_lines(m)
        if m.progress is not None:
            st.progress(*m.progress)
        page.kiosk_caption(PREFIX, 1, "Next: throughput, the node table and GPUs now.")
        return
    left, right = st.columns([3, 2])
    with left:
        if len(m.throughput) >= 2:
            series = pd.DataFrame([dataclasses.asdict(p) for p in m.throughput])
            fig = figures.make_throughput_figure(series, m.events)
            st.plotly_chart(fig, key=f"{PREFIX}_throughput_chart", height=400)
        else:
            st.caption("The throughput chart appears once a few minutes of polls are in.")
    with right:
        finished = runpicker.is_finished(rt)
        cards.render_node_table(
            list(m.nodes),
            rt.config.stale_after,
            compact=True,
            per_node=m.per_node,
            finished=finished,
            now=m.now,
            done=m.done_nodes,
        )
    if m.heat:
        heat = pd.DataFrame([dataclasses.asdict(h) for h in m.heat])
        st.plotly_chart(figures.make_gpu_heatstrip_figure(heat), key=f"{PREFIX}_heatstrip_chart", height=260)
    page.kiosk_caption(PREFIX, 2, "Alerts and tiles: part 1. GPU notes and the GPU series: the GPUs screen.")


def render(rt: PageRuntime) -> None:
    """The Overview for runtime `rt` (app.py has drawn the shared frame)."""
    st.markdown(page.BIG_ALERTS_CSS, unsafe_allow_html=True)
    if rt.demo:
        st.markdown(f'<div class="rh-demo">{page.DEMO_TEXT}</div>', unsafe_allow_html=True)
    st.title(f"{rt.config.name}")
    if page.kiosk():  # the wall never scrolls: a layout that fits 1920x1080, in parts
        page.live(rt, render_kiosk, rt, header=False, follows=livewatch.OVERVIEW)
        return
    page.live(rt, render_live, rt, header=False, follows=livewatch.OVERVIEW)
    page.download_headline(rt, PREFIX)
    model = loaders.load_overview(rt.store, rt.config, runpicker.is_finished(rt))  # cached: the same model
    page.download_csv(
        tables.node_table(list(model.nodes), rt.config.stale_after, model.now, done=model.done_nodes),
        "nodes.csv",
        PREFIX,
        label="Download node table (CSV)",
    )
