"""Nodes: is every node reachable, reading its shards and its GPUs? If not, why, in plain words.

Status rule: pending = never polled; up = a successful poll within stale_after; stale = the
last success is older than that; down = never reached (and failing), or no success for
5 x stale_after. The effective configuration shown is the secret-free public view.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pandas as pd
import streamlit as st

from components import alerthistory, alerts, cards, loaders, page, runpicker, tables
from components.context import PageRuntime
from components.format import DOWN_AFTER_STALE, fmt_age, fmt_bytes, fmt_count, md_escape, node_status
from components.outbound import render_collector, render_outbound
from runhealth import derived
from runhealth.records import NodeRow

PREFIX = "nodes"
TITLE, ICON, URL_PATH = "Nodes", ":material/dns:", "Nodes"
MAX_NODE_CARDS = 8  # up to this many nodes, a card each; more: a problems table and one card


def render_node(rt: PageRuntime, node: NodeRow, now: float, shards) -> None:
    finished = runpicker.is_finished(rt)
    cards.render_node_card(node, rt.config.stale_after, now, finished)
    left, right = st.columns([3, 2])
    details = tables.node_details(node, now, loaders.load_hosts(rt.store).get(node["name"]), finished)
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
                    **{c: mine[c].map(fmt_count) for c in ("lines", "malformed", "blank_lines", "resets") if c in mine},
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
    now = time.time()
    page.guarded(render_collector)(rt)  # no collector process: say so before any number
    page.guarded(cards.render_store_privacy)(rt.store)
    nodes = loaders.load_nodes(rt.store)
    if not nodes:
        st.info("No nodes registered yet: waiting for first poll (is the collector running?).")
        return
    cards.render_indexing(nodes)
    cards.render_problems(alerts.lines(alerts.of_kind(alerts.current(rt.store, rt.config), "host")), "Hosts")
    finished, per_node = node_table_inputs(rt)
    cards.render_node_table(nodes, rt.config.stale_after, per_node=per_node, finished=finished)
    for name, lines, by in loaders.load_removed_nodes(rt.store):
        kept = f"read again by {by}, so counted there, not twice" if by else "kept in the run's totals"
        st.caption(md_escape(f"{name}: no longer in the config; its {lines:,} completions are {kept}."))
    shards = loaders.load_shards(rt.store)
    for node in shown_nodes(rt, nodes, shards, now):
        page.guarded(render_node)(rt, node, now, shards)
    server = loaders.load_server_metrics(rt.store)
    if not server.empty:
        st.subheader("Inference servers (latest /metrics values)")
        st.dataframe(tables.server_metrics_table(server), hide_index=True, width="stretch")
    page.guarded(alerthistory.render_history)(rt, PREFIX)
    page.guarded(render_outbound)(rt)


def node_table_inputs(rt: PageRuntime) -> tuple[bool, Mapping[str, tables.NodeRate] | None]:
    """Whether the run is finished, and its per-node rates (None when finished): the table on
    screen and its CSV are built from the same two, so they have the same columns."""
    finished = runpicker.is_finished(rt)
    return finished, None if finished else loaders.load_health(rt.store).per_node


def node_csv(rt: PageRuntime):
    """The node table as shown (tok/s and last new included while the run is live), for the CSV."""
    finished, per_node = node_table_inputs(rt)
    return tables.node_table(loaders.load_nodes(rt.store), rt.config.stale_after, per_node=per_node, finished=finished)


def shown_nodes(rt: PageRuntime, nodes: list[NodeRow], shards, now: float) -> list[NodeRow]:
    """Every node's card up to MAX_NODE_CARDS nodes. A fleet gets one table of every node's
    problems and the card of one node, picked (default: the worst): a card costs ~20 ms of
    table serialisation, so 32 troubled nodes' cards took 0.7 s (bench/pages.py --scenario fleet)."""
    if len(nodes) <= MAX_NODE_CARDS:
        return nodes
    problems, order = tables.node_problems(nodes, shards, rt.config.stale_after, now)
    states = {n["name"]: node_status(n, now, rt.config.stale_after)[0] for n in nodes}
    not_up = sum(s != "up" for s in states.values())
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
    nodes = loaders.load_nodes(rt.store)
    if not nodes:
        st.info("No nodes registered yet: waiting for first poll (is the collector running?).")
        return
    host = alerts.lines(alerts.of_kind(alerts.current(rt.store, rt.config), "host"))
    cards.render_problems(host, "Hosts", limit=page.KIOSK_MAX_ALERTS)
    finished, per_node = node_table_inputs(rt)
    cards.render_node_table(nodes, rt.config.stale_after, per_node=per_node, finished=finished)
    page.kiosk_caption(PREFIX, 1, "Each node's details, shards, servers and config: without ?kiosk=1.")


def render(rt: PageRuntime) -> None:
    """The Nodes page for runtime `rt` (app.py has drawn the shared frame)."""
    st.title("Nodes")
    if page.kiosk():  # the wall never scrolls: the node table, not every node's card
        page.live(rt, render_kiosk, rt)
        return
    if runpicker.is_finished(rt):
        st.caption("A finished run: its nodes are no longer polled; the table is their state at the run's end.")
    else:
        st.caption(
            f"up = polled within {fmt_age(rt.config.stale_after)}; stale = older; down = never reached, "
            f"or nothing for {fmt_age(DOWN_AFTER_STALE * rt.config.stale_after)}; "
            "pending = waiting for first poll."
        )
    page.live(rt, render_page, rt)
    page.download_csv(node_csv(rt), "nodes.csv", PREFIX)
    page.guarded(alerthistory.download)(rt, PREFIX)
