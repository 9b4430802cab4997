"""The Nodes page's collector line and "Outbound" section: Prometheus /metrics and alert webhooks.

The dashboard is a viewer: /metrics and the webhooks belong to the collecting process
(`runhealth collect`, or `runhealth dashboard`'s child), which records where /metrics is served,
its notices and its webhook receivers in each live run's store, with its pid and host, and
rewrites that status every few seconds (runhealth/alerting/outputs.py). This module reads it from the
store, says how old it is and which process wrote it, and says plainly when no collector runs.
Webhook targets appear only as scheme://host/… (the path of a webhook URL is its secret); the
delivery figures come from the `webhook_deliveries` table the notifier writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from components import runpicker
from components.context import PageRuntime
from components.format import md_escape
from runhealth import heartbeat
from runhealth.ages import fmt_ago
from runhealth.alerting import notify
from runhealth.alerting import outputs as outbound
from runhealth.records import CollectorStatus
from runhealth.store import Store

WINDOW_S = 24 * 3600
_HASH: dict[str | type[Any], Callable[[Any], Any]] = {Store: lambda s: str(s.path)}
START = heartbeat.START


@st.cache_data(ttl=5, max_entries=4, hash_funcs=_HASH, show_spinner=False)
def load_deliveries(store: Store, since_unix: float) -> list[dict]:
    return notify.delivery_status(store, since_unix)


@st.cache_data(ttl=3, max_entries=8, hash_funcs=_HASH, show_spinner=False)
def load_status(store: Store) -> CollectorStatus | None:
    """The collecting process's status as it last wrote it (ttl below its HEARTBEAT_S)."""
    return outbound.read_status(store)


def collector_problem(rt: PageRuntime, now: float) -> str | None:
    """Why no collector writes the run `rt` shows, in words (None: one does, or it is finished):
    runhealth.heartbeat's sentence, the one the Overview's collector_down alert carries."""
    if runpicker.is_finished(rt):
        return None
    status = load_status(rt.store)
    if status is None:
        return f"No collector has written this run's status yet: {START}."
    found = heartbeat.fault(status, now, rt.config.stale_after)
    return None if found is None else md_escape(found.text).replace("\\`", "`")


def render_collector(fault: str | None) -> None:
    """A warning at the top of the Nodes page when no collector process writes this run (`fault`:
    the screen model's sentence; markdown: the commands in code spans, the host escaped)."""
    if fault is not None:
        st.warning(md_escape(fault).replace("\\`", "`"))


def render_status(status: CollectorStatus, has_deliveries: bool, now: float) -> None:
    """What the live collecting process serves, as it recorded it."""
    st.caption(
        f"Prometheus metrics: {status['metrics_url']}"
        if status["metrics_url"]
        else f"Prometheus metrics: off ({status['metrics_off'] or outbound.METRICS_UNSET})"
    )
    for notice in status["notices"]:
        st.warning(md_escape(notice))
    if status["webhook_receivers"]:
        st.caption(md_escape(f"Alert webhooks: {', '.join(status['webhook_targets'])}"))
    elif not has_deliveries:
        st.caption(
            "Alert webhooks: none configured (.streamlit/secrets.toml [alerts] webhook_urls or RUNHEALTH_WEBHOOK_URLS)"
        )
    st.caption(
        md_escape(
            f"As recorded by the collector, pid {status['pid']} on {status['host']}, "
            f"{fmt_ago(now - status['written_unix'])} (its outbound started "
            f"{fmt_ago(now - status['started_unix'])})"
        )
    )


def render_outbound(rt: PageRuntime) -> None:
    """Where /metrics is served, the webhooks and how their deliveries went in the last 24 h."""
    now = time.time()
    rows = load_deliveries(rt.store, int(now // 60) * 60 - WINDOW_S)  # minute-aligned: one cache entry
    status = load_status(rt.store)
    live = collector_problem(rt, now) is None and status is not None
    if not rows and not live:
        return  # the warning at the top of the page says why nothing is served
    st.subheader("Outbound: Prometheus and alert webhooks")
    if live and status is not None:
        render_status(status, bool(rows), now)
    render_deliveries(rows, now)


def render_deliveries(rows: list[dict], now: float) -> None:
    for r in rows:
        if r["failed"] and (r["last_ok_unix"] is None or r["last_failure_unix"] > r["last_ok_unix"]):
            st.error(
                md_escape(
                    f"Webhook {r['target']}: last delivery failed"
                    f" {fmt_ago(now - r['last_failure_unix'])}: {r['last_error']}"
                )
            )
    if rows:
        table = pd.DataFrame(rows).assign(
            last_ok=[fmt_ago(now - r["last_ok_unix"]) if r["last_ok_unix"] else "never" for r in rows],
            last_failure=[fmt_ago(now - r["last_failure_unix"]) if r["last_failure_unix"] else "—" for r in rows],
        )
        st.caption("Webhook deliveries in the last 24 h (each message retried with backoff before it counts as failed)")
        st.dataframe(
            table[["target", "delivered", "failed", "last_ok", "last_failure", "last_error"]],
            hide_index=True,
            width="stretch",
        )
