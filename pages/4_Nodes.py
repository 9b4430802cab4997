"""Nodes: is every node reachable, reading its shards and its GPUs? If not, why, in plain words.

Status rule: pending = never polled; up = a successful poll within stale_after; stale = the
last success is older than that; down = never reached (and failing), or no success for
5 x stale_after. The effective configuration shown is the secret-free public view.
"""

from __future__ import annotations

import time

import streamlit as st

from components import cards, loaders, page
from components.outbound import render_outbound

PREFIX = "nodes"
MAX_NODE_CARDS = 32


def render_node(node: dict, now: float, shards) -> None:
    cards.render_node_card(node, rt.config.stale_after, now)
    left, right = st.columns([3, 2])
    left.dataframe(cards.node_details(node, now), hide_index=True, width="stretch", height=35 * 18)
    with right:
        st.caption("Effective configuration (secrets never shown)")
        st.json(cards.safe_config(node.get("config")), expanded=True)
    mine = shards[shards["node"] == node["name"]].drop(columns="node")
    broken = mine[mine["error"].notna()]
    for _, row in broken.iterrows():
        st.error(cards.md_escape(f"{node['name']}: cannot read {row['path']}: {row['error']}"))
    if not mine.empty:
        with st.expander(f"{len(mine)} shard(s) on {node['name']}", expanded=not broken.empty):
            st.dataframe(mine.assign(size=mine["size"].map(loaders.fmt_bytes), offset=mine["offset"].map(loaders.fmt_bytes))
                         .rename(columns={"offset": "indexed"}), hide_index=True, width="stretch")


rt = page.setup("Nodes", PREFIX)
st.title("Nodes")
now = time.time()
nodes = loaders.load_nodes(rt.store)
st.caption(f"up = polled within {loaders.fmt_age(rt.config.stale_after)}; stale = older; down = never reached, "
           f"or nothing for {loaders.fmt_age(loaders.DOWN_AFTER_STALE * rt.config.stale_after)}; "
           "pending = waiting for first poll.")
if not nodes:
    st.info("No nodes registered yet: waiting for first poll (is the collector running?).")
    st.stop()
cards.render_indexing(nodes)
cards.render_node_table(nodes, rt.config.stale_after)
shards = loaders.load_shards(rt.store)
shown = nodes
if len(nodes) > MAX_NODE_CARDS:  # 512 cards took 16 s to render (bench/fleet.py): problems first, then picks
    troubled = [n for n in nodes if loaders.node_status(n, now, rt.config.stale_after)[0] != "up"]
    picked = st.multiselect("Show details for", [n["name"] for n in nodes], key=f"{PREFIX}_node_select",
                            placeholder="nodes that are not up are shown below")
    shown = troubled[:MAX_NODE_CARDS] + [n for n in nodes if n["name"] in picked and n not in troubled]
    st.caption(f"{len(nodes):,} nodes: details below for the {len(troubled):,} not up"
               f"{f' (first {MAX_NODE_CARDS})' if len(troubled) > MAX_NODE_CARDS else ''} and the ones picked.")
for node in shown:
    page.guarded(render_node)(node, now, shards)
server = loaders.load_server_metrics(rt.store)
if not server.empty:
    st.subheader("Inference servers (latest /metrics values)")
    st.dataframe(server, width="stretch")
page.guarded(render_outbound)(rt)
page.download_csv(cards.node_table(nodes, rt.config.stale_after, now), "nodes.csv", PREFIX)
