"""Nodes: is every node reachable, reading its shards and its GPUs? If not, why, in plain words.

Status rule: pending = never polled; up = a successful poll within stale_after; stale = the
last success is older than that; down = never reached (and failing), or no success for
5 x stale_after; done = up and wrote its fixed share of the target (#41). The effective configuration shown is the secret-free public view.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from components import alerthistory_view, alerts, cards, livewatch, loaders, page, runpicker, tables
from components.context import PageRuntime
from components.format import DOWN_AFTER_STALE, fmt_age, fmt_bytes, fmt_count, md_escape
from components.outbound import render_collector, render_outbound
from runhealth.records import NodeRow
from runhealth.screens import derived
from runhealth.screens.nodes import Nodes

PREFIX = "nodes"
TITLE, ICON, URL_PATH = "Nodes", ":material/dns:", "Nodes"
MAX_NODE_CARDS = 8  # up to this many nodes, a card each; more: a problems table and one card


def render_node(m: Nodes, node: NodeRow, shards: pd.DataFrame) -> None:
    now, finished = m.now, m.finished
    cards.render_node_card(node, m.stale_after, now, finished, m.done_nodes)
    left, right = st.columns([3, 2])
    details = tables.node_details(node, now, m.hosts.get(node["name"]), finished)
    left.dataframe(details, hide_index=True, width="stretch", height=35 * (len(details) + 1) + 3)
    with right:
        st.caption("Effective configuration (secrets never shown)")
        st.json(derived.public_config(node.get("config")), expanded=True)
    mine = shards[shards["node"] == node["name"]].drop(columns="node")
    broken = mine[mine["error"].notna()]
    for _, row in broken.iterrows():
        st.error(md_escape(f"{node['name']}: cannot read {row['path']}: {row['error']}"))
    replaced = tables.replaced_notice(node["name"], mine, now)
    if replaced:
        st.warning(md_escape(replaced))
    if not mine.empty:
        with st.expander(f"{len(mine)} shard(s) on {node['name']}", expanded=not broken.empty):
            st.dataframe(
                mine.assign(
                    **{
                        c: mine[c].map(fmt_count)
                        for c in ("completions", "malformed", "blank_lines", "resets")
                        if c in mine
                    },
                    size=mine["size"].map(fmt_bytes),
                    offset=mine["offset"].map(fmt_bytes),
                    error=mine["error"].fillna("—"),
                    replaced_unix=[
                        "—" if pd.isna(ts) else tables.replaced_when(ts, now) for ts in mine["replaced_unix"]
                    ],
                ).rename(columns={"offset": "indexed", "replaced_unix": "replaced (recounted)"}),
                hide_index=True,
                width="stretch",
            )


def render_page(rt: PageRuntime) -> None:
    m = loaders.load_nodes_screen(rt.store, rt.config, runpicker.is_finished(rt))
    page.guarded(render_collector)(m.collector_fault)  # no collector process: say so before any number
    page.guarded(cards.render_store_privacy)(rt.store)
    nodes = list(m.nodes)
    if not nodes:
        st.info("No nodes registered yet: waiting for first poll (is the collector running?).")
        return
    cards.render_indexing(nodes)
    cards.render_problems(alerts.lines(list(m.host_alerts)), "Hosts")
    cards.render_node_table(
        nodes, m.stale_after, per_node=m.per_node, finished=m.finished, eta=m.eta_cells, now=m.now, done=m.done_nodes
    )
    if m.eta_caption:
        st.caption(md_escape(m.eta_caption))
    for gone in m.removed:
        st.caption(md_escape(gone.text))
    if m.costs:
        st.subheader("What the cut cost, per node")
        st.caption(m.costs_caption)
        st.dataframe([c.row() for c in m.costs], hide_index=True, width="stretch", key=f"{PREFIX}_costs_table")
    if m.fields:
        render_fields(m)
    if m.failed:
        st.subheader("Failed requests, per node")
        st.caption(m.failed_caption)
        st.dataframe(m.failed_rows(), hide_index=True, width="stretch", key=f"{PREFIX}_failed_table")
    shards = loaders.shard_frame(m.shards)
    for node in shown_nodes(m, shards):
        page.guarded(render_node)(m, node, shards)
    server = loaders.metrics_frame(m.server_metrics)
    if not server.empty:
        st.subheader("Inference servers (latest /metrics values)")
        st.dataframe(tables.server_metrics_table(server), hide_index=True, width="stretch")
    page.guarded(alerthistory_view.render_history)(rt, PREFIX)
    page.guarded(render_outbound)(rt)


def render_fields(m: Nodes) -> None:
    """Per node: prompts answered, cuts that never answered, labels that lie (#33), as one table."""
    st.subheader("Prompts and labels, per node")
    st.caption(m.fields_caption)
    st.dataframe([f.row() for f in m.fields], hide_index=True, width="stretch", key=f"{PREFIX}_fields_table")
    for line in m.fields_missing:
        st.caption(md_escape(line))


def fields_csv(rt: PageRuntime) -> pd.DataFrame:
    """The per-node field table as shown (the same model as the screen, so the same cells)."""
    m = loaders.load_nodes_screen(rt.store, rt.config, runpicker.is_finished(rt))
    return pd.DataFrame([f.row() for f in m.fields])


def node_csv(rt: PageRuntime) -> pd.DataFrame:
    """The node table as shown (tok/s and last new included while the run is live), for the CSV:
    the same model as the screen, so the same columns."""
    m = loaders.load_nodes_screen(rt.store, rt.config, runpicker.is_finished(rt))
    return tables.node_table(
        list(m.nodes),
        m.stale_after,
        m.now,
        per_node=m.per_node,
        finished=m.finished,
        eta=m.eta_cells,
        done=m.done_nodes,
    )


def shown_nodes(m: Nodes, shards: pd.DataFrame) -> list[NodeRow]:
    """Every node's card up to MAX_NODE_CARDS nodes. A fleet gets one table of every node's
    problems and the card of one node, picked (default: the worst): a card costs ~20 ms of
    table serialisation, so 32 troubled nodes' cards took 0.7 s (bench/pages.py --scenario fleet)."""
    nodes = list(m.nodes)
    if len(nodes) <= MAX_NODE_CARDS:
        return nodes
    problems, order = tables.node_problems(nodes, shards, m.stale_after, m.now)
    states = {s.name: s.state for s in m.states}
    not_up = sum(s not in ("up", "done") for s in states.values())
    troubled = problems["node"].nunique()
    st.subheader("Problems by node")
    st.caption(
        f"{len(nodes):,} nodes: {not_up:,} not up, {troubled - not_up:,} up with a problem; "
        "worst first (click a column to sort). Pick a node below for its details."
    )
    if problems.empty:
        st.success(f"No problems on any of the {len(nodes):,} nodes.")
    else:
        st.dataframe(problems, hide_index=True, width="stretch", height=min(35 * (len(problems) + 1) + 3, 400))
    picked = st.selectbox(
        "Details for",
        order,
        format_func=lambda name: f"{name} ({tables.STATE_BADGE[states[name]]})",
        key=f"{PREFIX}_node_select",
    )
    return [n for n in nodes if n["name"] == picked]


def render_kiosk(rt: PageRuntime) -> None:
    """The wall screen (?kiosk=1, in the rotation while a node is down), within 1920x1080: host
    problems (a few) and the node table."""
    m = loaders.load_nodes_screen(rt.store, rt.config, runpicker.is_finished(rt))
    if not m.nodes:
        st.info("No nodes registered yet: waiting for first poll (is the collector running?).")
        return
    cards.render_problems(alerts.lines(list(m.host_alerts)), "Hosts", limit=page.KIOSK_MAX_ALERTS)
    cards.render_node_table(
        list(m.nodes), m.stale_after, per_node=m.per_node, finished=m.finished, now=m.now, done=m.done_nodes
    )
    page.kiosk_caption(PREFIX, 1, "Each node's details, shards, servers and config: without ?kiosk=1.")


def render(rt: PageRuntime) -> None:
    """The Nodes page for runtime `rt` (app.py has drawn the shared frame)."""
    st.title("Nodes")
    if page.kiosk():  # the wall never scrolls: the node table, not every node's card
        page.live(rt, render_kiosk, rt, follows=livewatch.OVERVIEW)
        return
    if runpicker.is_finished(rt):
        st.caption("A finished run: its nodes are no longer polled; the table is their state at the run's end.")
    else:
        st.caption(
            f"up = polled within {fmt_age(rt.config.stale_after)}; stale = older; down = never reached, "
            f"or nothing for {fmt_age(DOWN_AFTER_STALE * rt.config.stale_after)}; "
            "pending = waiting for first poll; done = wrote its share of the target (fixed shares)."
        )
    page.live(rt, render_page, rt, follows=livewatch.OVERVIEW)
    page.download_csv(node_csv(rt), "nodes.csv", PREFIX)
    page.download_csv(
        fields_csv(rt), "nodes-fields.csv", f"{PREFIX}_fields", "Download per-node prompts and labels CSV"
    )
    page.guarded(alerthistory_view.download)(rt, PREFIX)
