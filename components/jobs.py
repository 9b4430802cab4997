"""Background jobs of one viewer (a continuation batch): started by a click, never run in a render.

The work runs on a small process-wide thread pool; the viewer's session keeps the Future, and a
fragment shows "running for N s" until it is done, then the result. A job that raised shows its
error; nothing escapes into the page.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVarTuple

import streamlit as st

Ts = TypeVarTuple("Ts")


@st.cache_resource(show_spinner=False, max_entries=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="runhealth-job")


def start(key: str, fn: Callable[[*Ts], object], *args: *Ts) -> None:
    """Run fn(*args) in the background for this viewer under `key` (a running one is kept)."""
    if running(key):
        return
    st.session_state[key] = {"future": _pool().submit(fn, *args), "started": time.time()}


def running(key: str) -> bool:
    job = st.session_state.get(key)
    return job is not None and not job["future"].done()


def status(key: str) -> tuple[str, Any, float]:
    """("none" | "running" | "done" | "failed", result or error text, seconds since start)."""
    job = st.session_state.get(key)
    if not job:
        return "none", None, 0.0
    future: Future = job["future"]
    elapsed = time.time() - job["started"]
    if not future.done():
        return "running", None, elapsed
    exc = future.exception()
    if exc is not None:
        return "failed", f"{type(exc).__name__}: {exc}", elapsed
    return "done", future.result(), elapsed
