"""The sidebar's run picker: which run this page shows, when the process holds several.

`select(rt, prefix)` draws a select box of every run (live first, finished ones marked) and
returns a per-session view of the runtime whose config, store and collector are the picked
run's; every page reads `rt.config`/`rt.store` as before. The pick lives in the URL (`?run=name`),
so a link or a wall screen (`?kiosk=1&run=name`) opens on that run, and in the session (`rh_run`),
so moving between pages keeps it. With one run nothing is drawn.
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from components import context
from components.format import md_escape

SESSION_KEY = "rh_run"
URL_KEY = "run"


def label(handle: context.RunHandle) -> str:
    return f"{handle.config.name} (finished)" if handle.finished else handle.config.name


def select(rt: context.Runtime, prefix: str) -> context.Runtime:
    """Draw the picker (call inside the sidebar) and return the runtime for the picked run."""
    if len(rt.runs) <= 1 or rt.config is None:
        return rt
    names = [h.config.name for h in rt.runs]
    by_name = {h.config.name: h for h in rt.runs}
    name = wanted(names, rt.config.name)
    key = f"{prefix}_run_picker"
    if st.session_state.get(key) != name:  # the URL or another page's pick moved it
        st.session_state[key] = name
    st.selectbox(
        "Run",
        names,
        key=key,
        format_func=lambda n: label(by_name[n]),
        help="Which run the pages show (kept in the URL as ?run=…, so the link opens this run)",
        on_change=_picked,
        args=(key,),
    )
    remember(name)
    return view(rt, by_name[name])


def wanted(names: list[str], default: str) -> str:
    """The run to show: the URL's ?run= when it names one, else this session's pick, else `default`."""
    asked = st.query_params.get(URL_KEY)
    if asked in names:
        return asked
    current = st.session_state.get(SESSION_KEY)
    name = current if current in names else default
    if asked is not None:  # the URL is then corrected to the run shown
        st.warning(md_escape(f"No run named {asked!r} here; showing {name}. Runs: {', '.join(names)}."))
    return name


def _picked(key: str) -> None:
    """The viewer chose a run: it goes to the URL and the session before the page runs again."""
    remember(st.session_state[key])


def remember(name: str) -> None:
    st.session_state[SESSION_KEY] = name
    if st.query_params.get(URL_KEY) != name:
        st.query_params[URL_KEY] = name


FINISHED_AGE_S = 10 * 365 * 86400.0


def view(rt: context.Runtime, handle: context.RunHandle) -> context.Runtime:
    """The runtime as one run's page sees it (the shared runtime itself is not changed).

    A finished run's numbers are final, not stale, and its nodes are not down, just no longer
    polled: its pages get stale/stall thresholds no age reaches, and say "finished" instead."""
    config = handle.config
    if handle.finished:
        config = dataclasses.replace(config, stale_after_s=FINISHED_AGE_S, stall_after_s=FINISHED_AGE_S)
    return dataclasses.replace(rt, config=config, store=handle.store, collector=handle.collector)


def is_finished(rt: context.PageRuntime) -> bool:
    """True when the run `rt` shows is a finished one (read from its store, not polled)."""
    handle = next((h for h in rt.runs if h.store is rt.store), None)
    return bool(handle and handle.finished)


def shown_line(rt: context.Runtime) -> str | None:
    """'Run: name' for the top of a page when there are several runs (None with one)."""
    if len(rt.runs) <= 1 or rt.config is None:
        return None
    handle = next((h for h in rt.runs if h.store is rt.store), None)
    finished = " · finished: read from its store, not polled" if handle and handle.finished else ""
    return f"Run: {rt.config.name}{finished}"
