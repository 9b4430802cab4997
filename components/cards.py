"""render_* pieces the screens are made of: big tiles, one-sentence alerts, node cards, samples.

Tiles are built in the core (runhealth.screens.overview: the Overview's model) and drawn here;
tables come from components/tables.py, words from components/format.py.

Text that comes from the nodes (errors, completions, prompts) is never rendered as markdown or
HTML: tiles escape everything they interpolate, alerts are markdown-escaped, and sample text
goes through `st.code` / `st.text` only, so a completion holding `<script>` or a
`[link](javascript:...)` shows literally.
"""

from __future__ import annotations

import dataclasses
import html
import time
from collections.abc import Collection, Mapping

import streamlit as st

from components.format import fmt_count, md_escape
from components.tables import finished_line, last_error_line, node_table, why_empty
from runhealth.records import NodeRow, StoredSample
from runhealth.screens import overview as overview_model
from runhealth.screens.lengths import Summary, unknown_of
from runhealth.screens.nodestates import NodeRate, indexing_progress, state_at
from runhealth.screens.words import explain
from runhealth.screens.words import tile_help as words_tile_help
from runhealth.settings.windows import NOTICE_S
from runhealth.store import Store, storefile

STATE_COLOUR = {
    "UP": "#1B5E20",
    "DONE": "#0D47A1",
    "STALE": "#8A5A00",
    "DOWN": "#8B1A1A",
    "PENDING": "#3A3F4B",
    "FINISHED": "#3A3F4B",
}
STATE_MD = {
    "up": ":green[UP]",
    "done": ":blue[DONE]",
    "stale": ":orange[STALE]",
    "down": ":red[DOWN]",
    "pending": ":gray[PENDING]",
    "finished": ":gray[FINISHED]",
}
# A table of at most this many rows may be a static table (#42): it mounts without the data grid's
# chunk and canvas (a page with no grid left never loads them); past it, the grid sorts and scrolls.
STATIC_TABLE_ROWS = 16
STATE_TABLE_UUID = "rhstate"  # the node table's cells are T_rhstate_row<i>_col<j>; status is column 1
MIN_SAMPLE_N = 20  # below this many samples a share is shown, never coloured as an alarm


def tile(label: str, value: str, sub: str = "", level: str = "ok", help: str = "") -> dict[str, str]:
    """One tile; `help` says in plain words what its figure is (its hover tooltip)."""
    return {"label": label, "value": value, "sub": sub, "level": level, "help": help}


def tile_help(t: dict[str, str]) -> str:
    """A tile's tooltip: its own help, then the plain words for any jargon it shows (words.explain)."""
    terms = explain(" ".join((t["label"], t["value"], t["sub"])))
    return " · ".join([h for h in [t.get("help") or words_tile_help(t["label"])] if h] + terms)


def tile_html(t: dict[str, str]) -> str:
    """One tile's HTML; with help (or jargon, words.GLOSSARY) it carries it as its tooltip."""
    helps = tile_help(t)
    body = (
        f'<div class="rh-tile {html.escape(t["level"])}"><div class="rh-label">{html.escape(t["label"])}</div>'
        f'<div class="rh-value">{html.escape(t["value"])}</div><div class="rh-sub">{html.escape(t["sub"])}</div></div>'
    )
    return f'<div class="rh-help" title="{html.escape(helps)}">{body}</div>' if helps else body


def render_tiles(tiles: list[dict[str, str]]) -> None:
    """A row of big-number tiles (readable across a room); level ok / warn / alert / muted. A tile
    with help (or jargon, words.GLOSSARY) carries it as its tooltip (the tile's title).

    The row is one markdown element (a flex row, page.CSS `.rh-tiles`), not st.columns with a
    markdown in each: a row of n tiles was 2n + 1 websocket messages and React elements (#42)."""
    if tiles:
        st.markdown(f'<div class="rh-tiles">{"".join(tile_html(t) for t in tiles)}</div>', unsafe_allow_html=True)


def render_terms(*texts: str) -> None:
    """A caption with the plain words for the jargon in `texts` (nothing when there is none)."""
    terms = explain(" ".join(texts))
    if terms:
        st.caption(md_escape("In plain words — " + "; ".join(terms) + "."))


ALL_CLEAR = "All nodes reporting and writing, truncation below the warning threshold."
ALL_CLEAR_FINISHED = "Finished run: no alert held at its end, truncation below the warning threshold."


def render_alerts(alerts: list[tuple[str, str]], limit: int = 8, all_clear: str = ALL_CLEAR) -> None:
    """The alert sentences, worst first; past `limit` a line counts the rest (a wall screen shows
    fewer); none: `all_clear` (a finished run's nodes are not writing, and it must not say so)."""
    if not alerts:
        st.success(all_clear)
    for kind, text in alerts[:limit]:
        (st.error if kind == "error" else st.warning)(md_escape(text))
    if len(alerts) > limit:
        st.caption(f"… and {len(alerts) - limit} more on the Nodes page.")


def render_problems(problems: list[tuple[str, str]], title: str = "GPUs and hosts", limit: int | None = None) -> None:
    """GPU and host problems named in words (errors, warnings, then information); past `limit`
    (a wall screen) a line counts the rest."""
    if not problems:
        return
    st.markdown(f"**{html.escape(title)}**")
    show = {"error": st.error, "warning": st.warning, "info": st.info}
    for kind, text in problems[:limit]:
        show.get(kind, st.info)(md_escape(text))
    render_terms(*(text for _, text in problems[:limit]))
    if limit is not None and len(problems) > limit:
        st.caption(f"… and {len(problems) - limit} more (open the page without ?kiosk=1).")


def truncation_tile(summary: Summary, warn: float, alert: float) -> dict[str, str]:
    """The Truncated tile as the Overview's model words it (runhealth.screens.overview), "unknown"
    by the one rule when the finish reason or token count is missing (analysis/unknowns.py)."""
    return dataclasses.asdict(overview_model.truncation_tile(summary, warn, alert, unknown_of(summary)))


def render_node_table(
    nodes: list[NodeRow],
    stale_after: float,
    compact: bool = False,
    per_node: Mapping[str, NodeRate] | None = None,
    finished: bool = False,
    eta: Mapping[str, str] | None = None,
    now: float | None = None,
    done: Collection[str] = (),
    static: bool = False,
) -> None:
    """The node table; `now`: the instant of the model the nodes come from (their states at it);
    `done`: the model's done_nodes (they wrote their share); `static`: a static table while it has
    at most STATIC_TABLE_ROWS rows (no sorting, nothing to scroll), the data grid past that."""
    if not nodes:
        st.info("No nodes configured.")
        return
    table = node_table(nodes, stale_after, now, per_node=per_node, finished=finished, eta=eta, done=done)
    if compact:
        extra = ["tok/s (1 min)", "last new"] if per_node is not None else ["GPUs"]
        table = table[["node", "status", "last seen", *extra, "disk free", "SSH RTT"]]
    styled = table.style.map(
        lambda v: (
            f"background-color: {STATE_COLOUR.get(v, '')}; color: white; font-weight: bold" if v in STATE_COLOUR else ""
        ),
        subset=["status"],
    )
    styled.set_uuid(STATE_TABLE_UUID)  # page.CSS finds the status cells by their ids: white text on the colour
    if static and len(table) <= STATIC_TABLE_ROWS:
        st.table(styled, hide_index=True)
    else:
        st.dataframe(styled, hide_index=True, width="stretch")


def render_indexing(nodes: list[NodeRow]) -> None:
    """A progress bar while a backlog (first scan, rescan, a burst of output) is being indexed."""
    progress = indexing_progress(nodes)
    if progress is not None:
        st.progress(*progress)


def render_store_incident(store: Store) -> None:
    """Say so when the history store file was deleted, truncated or replaced under this dashboard."""
    incident = store.check_file()  # page reads are cached: look at the file itself
    if incident is not None and time.time() - incident[1] < NOTICE_S:
        st.warning(md_escape(incident[0]))


def render_store_privacy(store: Store) -> None:
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
        f"{fmt_count(sample.get('tokens'))} tokens{est} · finish_reason={sample.get('finish_reason')} · "
        f"{fmt_count(sample.get('text_chars'))} chars"
    )
    st.caption("Prompt (start)")
    st.code(sample.get("prompt_head") or "(no prompt in this line)", language=None, wrap_lines=True)
    st.caption("Completion — last characters (where a truncated one was cut)")
    st.code(sample.get("text_tail") or "(empty completion)", language=None, wrap_lines=True, height=320)


def render_node_card(
    node: NodeRow, stale_after: float, now: float, finished: bool = False, done: Collection[str] = ()
) -> None:
    state, why = state_at(node, now, stale_after, done)
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


def render_nothing_yet(nodes: list[NodeRow], what: str = "completions") -> None:
    st.info(md_escape(why_empty(nodes, what)))
