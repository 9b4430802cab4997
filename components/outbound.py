"""The Nodes page's "Outbound" section: Prometheus /metrics and alert-webhook delivery.

Webhook targets appear only as scheme://host/… (the path of a webhook URL is its secret); the
figures come from the `webhook_deliveries` table the notifier writes, so a read-only viewer
sees the collecting process's failures too.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from components.format import md_escape
from runhealth import notify
from runhealth.health import fmt_age
from runhealth.store import Store

WINDOW_S = 24 * 3600


@st.cache_data(ttl=5, max_entries=4, hash_funcs={Store: lambda s: str(s.path)}, show_spinner=False)
def load_deliveries(store: Store, since_unix: float) -> list[dict]:
    return notify.delivery_status(store, since_unix)


def render_outbound(rt) -> None:
    """Where /metrics is served and how webhook deliveries went in the last 24 h."""
    now = time.time()
    rows = load_deliveries(rt.store, int(now // 60) * 60 - WINDOW_S)  # minute-aligned: one cache entry
    outbound = getattr(rt, "outbound", None)
    if not rows and outbound is None:
        return
    st.subheader("Outbound: Prometheus and alert webhooks")
    if outbound is not None:
        st.caption(
            f"Prometheus metrics: {outbound.metrics_url}"
            if outbound.metrics_url
            else "Prometheus metrics: off (set [run] metrics_port or --metrics-port)"
        )
        for notice in outbound.notices:
            st.warning(md_escape(notice))
        if not outbound.notifiers and not rows:
            st.caption(
                "Alert webhooks: none configured (.streamlit/secrets.toml [alerts] webhook_urls"
                " or RUNHEALTH_WEBHOOK_URLS)"
            )
    for r in rows:
        if r["failed"] and (r["last_ok_unix"] is None or r["last_failure_unix"] > r["last_ok_unix"]):
            st.error(
                md_escape(
                    f"Webhook {r['target']}: last delivery failed"
                    f" {fmt_age(now - r['last_failure_unix'])} ago: {r['last_error']}"
                )
            )
    if rows:
        table = pd.DataFrame(rows).assign(
            last_ok=[fmt_age(now - r["last_ok_unix"]) + " ago" if r["last_ok_unix"] else "never" for r in rows],
            last_failure=[
                fmt_age(now - r["last_failure_unix"]) + " ago" if r["last_failure_unix"] else "—" for r in rows
            ],
        )
        st.caption("Webhook deliveries in the last 24 h (each message retried with backoff before it counts as failed)")
        st.dataframe(
            table[["target", "delivered", "failed", "last_ok", "last_failure", "last_error"]],
            hide_index=True,
            width="stretch",
        )
