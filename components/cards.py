"""render_* pieces the screens are made of: big tiles, one-sentence alerts, node cards, samples.

Tile builders (`tile`, `truncation_tile`, `overview_tiles`) are pure and sit beside the render
functions that draw them; tables come from components/tables.py, words from components/format.py.

Text that comes from the nodes (errors, completions, prompts) is never rendered as markdown or
HTML: tiles escape everything they interpolate, alerts are markdown-escaped, and sample text
goes through `st.code` / `st.text` only, so a completion holding `<script>` or a
`[link](javascript:...)` shows literally.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from components.format import fmt_bytes, fmt_rate, fmt_window, md_escape
from components.loaders import Throughput
from components.tables import finished_line, indexing_progress, last_error_line, node_table, why_empty
from runhealth import derived, storefile
from runhealth.activity import NodeRate, RunRates
from runhealth.analysis.stats import Summary
from runhealth.health import fmt_age, level, node_status
from runhealth.records import NodeRow, StoredSample

STATE_COLOUR = {"UP": "#1B5E20", "STALE": "#8A5A00", "DOWN": "#8B1A1A", "PENDING": "#3A3F4B", "FINISHED": "#3A3F4B"}
STATE_MD = {
    "up": ":green[UP]",
    "stale": ":orange[STALE]",
    "down": ":red[DOWN]",
    "pending": ":gray[PENDING]",
    "finished": ":gray[FINISHED]",
}
MIN_SAMPLE_N = 20  # below this many samples a share is shown, never coloured as an alarm


def tile(label: str, value: str, sub: str = "", level: str = "ok") -> dict[str, str]:
    return {"label": label, "value": value, "sub": sub, "level": level}


def render_tiles(tiles: list[dict[str, str]]) -> None:
    """A row of big-number tiles (readable across a room); level ok / warn / alert / muted."""
    for col, t in zip(st.columns(len(tiles)), tiles, strict=False):
        col.markdown(
            f'<div class="rh-tile {html.escape(t["level"])}"><div class="rh-label">{html.escape(t["label"])}</div>'
            f'<div class="rh-value">{html.escape(t["value"])}</div><div class="rh-sub">{html.escape(t["sub"])}</div></div>',
            unsafe_allow_html=True,
        )


def render_alerts(alerts: list[tuple[str, str]]) -> None:
    if not alerts:
        st.success("All nodes reporting and writing, truncation below the warning threshold.")
    for kind, text in alerts[:8]:
        (st.error if kind == "error" else st.warning)(md_escape(text))
    if len(alerts) > 8:
        st.caption(f"… and {len(alerts) - 8} more on the Nodes page.")


def render_problems(problems: list[tuple[str, str]], title: str = "GPUs and hosts") -> None:
    """GPU and host problems named in words (errors, warnings, then information)."""
    if not problems:
        return
    st.markdown(f"**{html.escape(title)}**")
    show = {"error": st.error, "warning": st.warning, "info": st.info}
    for kind, text in problems:
        show.get(kind, st.info)(md_escape(text))


def truncation_tile(summary: Summary, warn: float, alert: float) -> dict[str, str]:
    if not summary.completions:
        return tile("Truncated", "—", "no completions counted yet", "muted")
    if not summary.ceiling_tokens:
        return tile("Truncated", "none", "no max_tokens ceiling found in the data", "ok")
    frac = summary.at_ceiling_fraction
    lo, hi = summary.at_ceiling_interval
    src = "exact" if summary.length_source == "completion_tokens" else "chars/4 estimate"
    return tile(
        "Truncated",
        f"{frac:.1%}",
        f"at the {summary.ceiling_tokens:,} ceiling · 95% CI {lo:.1%}–{hi:.1%} · {src} · "
        f"{summary.at_ceiling:,} of {summary.length_count:,}",
        level(frac, warn, alert),
    )


def render_node_table(
    nodes: list[NodeRow],
    stale_after: float,
    compact: bool = False,
    per_node: Mapping[str, NodeRate] | None = None,
    finished: bool = False,
) -> None:
    if not nodes:
        st.info("No nodes configured.")
        return
    table = node_table(nodes, stale_after, per_node=per_node, finished=finished)
    if compact:
        extra = ["tok/s (1 min)", "last new"] if per_node is not None else ["GPUs"]
        table = table[["node", "status", "last seen", *extra, "disk free", "SSH RTT"]]
    styled = table.style.map(
        lambda v: (
            f"background-color: {STATE_COLOUR.get(v, '')}; color: white; font-weight: bold" if v in STATE_COLOUR else ""
        ),
        subset=["status"],
    )
    st.dataframe(styled, hide_index=True, width="stretch")


def render_indexing(nodes: list[NodeRow]) -> None:
    """A progress bar while a backlog (first scan, rescan, a burst of output) is being indexed."""
    progress = indexing_progress(nodes)
    if progress is not None:
        st.progress(*progress)


def render_store_incident(store: Any) -> None:
    """Say so when the history store file was deleted, truncated or replaced under this dashboard."""
    incident = store.check_file()  # page reads are cached: look at the file itself
    if incident is not None and time.time() - incident[1] < 24 * 3600:
        st.warning(md_escape(incident[0]))


def render_store_privacy(store: Any) -> None:
    """Warn when the store (it holds sampled prompts and completions) is readable by other users."""
    exposed = storefile.readable_by_others(store.path)
    if exposed:
        st.warning(
            md_escape(
                "The history store holds sampled prompts and completions and is readable by other users "
                f"on this machine: {', '.join(exposed)}. New stores are created owner-only (0600); "
                f"fix this one with `chmod 600 {store.path}*` (and `chmod 700` its folder)."
            )
        )


def render_sample(sample: StoredSample) -> None:
    """One sample: where it came from, its prompt head and the END of its text, all literal."""
    est = " (chars/4 estimate)" if sample.get("estimated") else ""
    st.text(
        f"{sample.get('node')} · {sample.get('path')} line {sample.get('line_no')} · "
        f"{sample.get('tokens')} tokens{est} · finish_reason={sample.get('finish_reason')} · "
        f"{sample.get('text_chars')} chars"
    )
    st.caption("Prompt (start)")
    st.code(sample.get("prompt_head") or "(no prompt in this line)", language=None, wrap_lines=True)
    st.caption("Completion — last characters (where a truncated one was cut)")
    st.code(sample.get("text_tail") or "(empty completion)", language=None, wrap_lines=True, height=320)


def render_node_card(node: NodeRow, stale_after: float, now: float, finished: bool = False) -> None:
    state, why = node_status(node, now, stale_after)
    if finished:  # not polled any more: no up / stale wording, when it was last polled
        state, why = "finished", finished_line(node)
    with st.container(border=True):
        st.markdown(f"#### {STATE_MD[state]} {md_escape(node['name'])}")
        st.text(why)
        if node.get("last_error"):
            st.text(last_error_line(node, now))
        for glob in node.get("unmatched_globs") or []:
            st.text(f"No shard matched {glob} on {node['name']}")
        if node.get("gpu_error"):
            st.text(f"GPU telemetry error: {node['gpu_error']}")
        for url, err in (node.get("metrics_errors") or {}).items():
            st.text(f"Server metrics {url}: {err}")


def overview_tiles(
    summary: Summary,
    thr: Throughput,
    nodes: list[NodeRow],
    gpus: pd.DataFrame,
    target: int | None,
    last: float | None,
    cfg: Any,
    now: float,
    health: RunRates | None = None,
) -> list[dict[str, str]]:
    """The six standup tiles: done, throughput (last minute, 15-min average beside it), ETA (from
    the 15-min average, stated), truncation, nodes, data age. The numbers: runhealth.derived.standup."""
    n = derived.standup(
        summary.completions,
        target,
        health,
        nodes,
        len(gpus) or sum(x.get("gpus_found") or 0 for x in nodes),
        float(gpus["power_w"].sum()) if len(gpus) else None,
        cfg.stale_after,
        now,
        last,
    )
    done, tps, eta, cps = n.completions, n.tokens_per_s_1m, n.eta_s, n.completions_per_s_15m
    done_sub = f"of {target:,} target ({n.share_done:.1%})" if n.share_done is not None else "no target_completions set"
    server = thr.server_tokens_per_s
    tps_sub = (
        (f"15-min avg {fmt_rate(n.tokens_per_s_15m)}" if n.tokens_per_s_15m is not None else "15-min avg —")
        + (f" · {fmt_rate(n.tokens_per_s_per_gpu)} per GPU" if n.tokens_per_s_per_gpu is not None else "")
        + (f" · {n.tokens_per_joule:.1f} tok/J" if n.tokens_per_joule else "")
        + (f" · server says {fmt_rate(server)}" if server is not None else "")
    )
    age = n.data_age_s
    return [
        tile("Completions", f"{done:,}", done_sub, "ok" if done else "muted"),
        tile(
            f"Tokens / s · last {fmt_window(n.rate_window_s)}",
            fmt_rate(tps) if tps is not None else "—",
            tps_sub if tps is not None else "waiting for two polls",
            "ok" if tps else "warn" if tps == 0 else "muted",
        ),
        tile(
            "ETA",
            "done" if eta == 0 else fmt_age(eta) if eta is not None else "—",
            "target reached"
            if eta == 0
            else "needs target_completions in the config"
            if not target
            else f"at the 15-min average, {cps:,.1f} completions/s"
            if cps
            else "needs a rate",
            "muted" if eta is None else "ok",
        ),
        truncation_tile(summary, cfg.truncation_warn_fraction, cfg.truncation_alert_fraction),
        tile(
            "Nodes up",
            f"{n.nodes_up} / {n.nodes}",
            f"{n.nodes_stale} stale · {n.nodes_down} down"
            + (f" · disk free ≥ {fmt_bytes(n.min_disk_free_bytes)}" if n.min_disk_free_bytes else ""),
            "alert" if n.nodes_down else "warn" if n.nodes_stale or not n.nodes_up else "ok",
        ),
        tile(
            "Data age",
            fmt_age(age) if age is not None else "—",
            "waiting for first poll" if age is None else f"stale after {fmt_age(cfg.stale_after)}",
            "muted" if age is None else "alert" if age > cfg.stale_after else "ok",
        ),
    ]


def final_tiles(f: derived.Final, summary: Summary, cfg: Any, nodes: int) -> list[dict[str, str]]:
    """A finished run's six tiles: its final figures, no live placeholders, no node states."""
    target = cfg.target_completions
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(f.completed_unix)) if f.completed_unix else "—"
    last = time.strftime("%Y-%m-%d %H:%M", time.localtime(f.last_poll_unix)) if f.last_poll_unix else "never"
    duration = f"over {fmt_age(f.duration_s)}" if f.duration_s is not None else "duration unknown"
    return [
        tile("Completions", f"{f.completions:,}", f"of {target:,} target" if target else "final count", "ok"),
        tile("Tokens / s · average over its life", fmt_rate(f.tokens_per_s_life), duration, "ok"),
        tile("Completed at", when, f"duration {fmt_age(f.duration_s)}" if f.duration_s is not None else "", "ok"),
        truncation_tile(summary, cfg.truncation_warn_fraction, cfg.truncation_alert_fraction),
        tile("Nodes", f"{nodes}", "finished: no longer polled", "muted"),
        tile("Numbers", "final", f"last poll {last}", "muted"),
    ]


def render_nothing_yet(nodes: list[NodeRow], what: str = "completions") -> None:
    st.info(md_escape(why_empty(nodes, what)))
