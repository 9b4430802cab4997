"""A page left open shows a new publication within a fraction of a second (#42 item 2).

Each page's live part (components/page.py `live`) is a fragment. It used to redraw on a fixed tick
of its own (every collection interval), so a screen showed new numbers half a tick late on
average, up to a whole tick. Here a second fragment, which draws nothing, ticks every WATCH_S: it
reads the store's newest publication (components/precomputed.publication: one small read a tenth
of a second for every viewer of the process, never a page build, never a node) and, when it is not
the one the live part last drew, or when the live part has not redrawn for its interval (the
"N s ago" ages, a collector gone quiet), asks for a rerun of the live fragment: the request the
browser's own fragment timer sends, so only that fragment reruns, in place, and widgets keep their
state. A tick that finds nothing new returns at once: one rerun per publication, no more.

Streamlit (1.67) has no public call that reruns another fragment from a script body (`st.rerun`
with a fragment's key is refused outside widget callbacks; a full-app rerun would restart every
fragment timer, the kiosk rotation's among them). `_request` makes the timer's request itself
through Streamlit's script-run context; `supported()` checks that those internals are there, and
where they are not (or a request fails) the live fragment keeps its own fixed tick, as before.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVarTuple

import streamlit as st

from components import precomputed
from runhealth.screens import published
from runhealth.store import Store

log = logging.getLogger(__name__)
Ts = TypeVarTuple("Ts")

# Which publications a page's live part follows (precomputed.publication's only / besides): the
# Overview, published after polls (the Overview, and the Nodes page, which reads the polls), or the
# other page payloads (Output lengths, GPUs), computed after polls at most once an interval;
# ANY: every one. A page is not redrawn for a publication it does not read.
Follows = tuple[tuple[str, ...] | None, tuple[str, ...]]
ANY: Follows = (None, ())
OVERVIEW: Follows = ((published.NAME,), ())
PAYLOADS: Follows = (None, (published.NAME,))
WATCH_S = 0.25  # the watcher's tick: a publication shows after half of it on average, plus the redraw
KEY = "livewatch_drawn"  # session state: what this viewer's live part last drew (a Drawn's fields)
_broken: list[str] = []  # why a rerun request failed in this process (then: the fixed tick)


@dataclasses.dataclass(frozen=True)
class Drawn:
    """What a viewer's live part last drew: its fragment, the publication and when (monotonic).
    Kept in session state as a plain tuple (`astuple`): it survives a reload of this module."""

    fragment_id: str
    stamp: float | None
    at: float

    @classmethod
    def of(cls, kept: object) -> Drawn | None:
        return cls(*kept) if isinstance(kept, tuple) and len(kept) == 3 else None


def supported() -> bool:
    """Whether this Streamlit has what `_request` uses (else the live part ticks on its own)."""
    if _broken:
        return False
    try:
        from streamlit.runtime.scriptrunner_utils import script_run_context as run_context
        from streamlit.runtime.scriptrunner_utils.script_requests import RerunData

        fields = {f.name for f in dataclasses.fields(RerunData)}
    except (ImportError, TypeError):
        return False
    # The running fragment's id: ThreadState's (1.67), or the run context's before it.
    knows_id = hasattr(run_context, "ThreadState") or hasattr(run_context.ScriptRunContext, "current_fragment_id")
    return knows_id and {"fragment_id", "is_auto_rerun", "query_string", "page_script_hash"} <= fields


def live(store: Store, every_s: float, follows: Follows, body: Callable[[*Ts], object], *args: *Ts) -> None:
    """Draw `body(*args)` in a fragment that redraws within WATCH_S of each publication of `store`
    it `follows` and at least every `every_s` (`every_s` alone where the watcher is not supported)."""
    if not supported():
        st.fragment(run_every=every_s)(body)(*args)
        return

    def drawn(*a: *Ts) -> None:
        fragment_id = _running_fragment_id()
        if fragment_id is not None:  # the stamp before the reads: a later publication redraws again
            kept = Drawn(fragment_id, precomputed.publication(store, *follows), time.monotonic())
            st.session_state[KEY] = dataclasses.astuple(kept)
        body(*a)

    st.fragment(drawn)(*args)
    # After the live part: a full run draws it first. In the sidebar: each run of a fragment sends
    # its (here empty) container again, which in the main column would add a gap under the page.
    with st.sidebar:
        st.fragment(run_every=WATCH_S)(watch)(store, every_s, follows)


def watch(store: Store, every_s: float, follows: Follows = ANY) -> None:
    """One tick: ask for the live part's rerun when there is a newer publication (of those it
    `follows`) than it drew, or it is `every_s` old; draws nothing."""
    seen = Drawn.of(st.session_state.get(KEY))
    if seen is None:
        return
    try:
        stamp = precomputed.publication(store, *follows)
    except sqlite3.Error:  # a store that cannot be read: the live part says so at its interval redraw
        stamp = seen.stamp
    now = time.monotonic()
    if stamp == seen.stamp and now - seen.at < every_s:
        return
    # Noted as asked for, so the next ticks wait for this one (the redraw notes it again).
    st.session_state[KEY] = (seen.fragment_id, stamp, now)
    try:
        _request(seen.fragment_id)
    except Exception as exc:  # Streamlit's internals changed: the fixed tick from the next full run
        _broken.append(f"{type(exc).__name__}: {exc}")
        log.warning("live redraw on publication unavailable (%s): pages redraw every interval", _broken[-1])
        st.rerun()


def _running_fragment_id() -> str | None:
    """The id of the fragment running now (None: none, or a Streamlit that does not say)."""
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState

        return ThreadState.get().fragment_id
    except ImportError:  # before 1.67: the run's context held it
        from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

        return getattr(get_script_run_ctx(), "current_fragment_id", None)


def _request(fragment_id: str) -> None:
    """Queue a rerun of fragment `fragment_id`, as its run_every timer in the browser would: after
    this run ends, never cutting into a run of the page (a fragment rerun does not preempt one)."""
    from streamlit.runtime.scriptrunner_utils.script_requests import RerunData
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or ctx.script_requests is None:
        raise RuntimeError("no script run context")
    data: dict[str, Any] = {
        "query_string": ctx.query_string,
        "page_script_hash": ctx.page_script_hash,
        "fragment_id": fragment_id,
        "is_auto_rerun": True,  # a fragment gone by then (page left) is skipped without a warning
        "cached_message_hashes": getattr(ctx, "cached_message_hashes", None),
        "context_info": getattr(ctx, "context_info", None),
    }
    fields = {f.name for f in dataclasses.fields(RerunData)}
    ctx.script_requests.request_rerun(RerunData(**{k: v for k, v in data.items() if k in fields and v is not None}))
