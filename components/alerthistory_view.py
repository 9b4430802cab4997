"""The day's alerts: the alert history the collector keeps (runhealth/alerting/alerthistory.py) on screen.

`render_today` is the Overview's timeline of the last 24 h's episodes (one read: the Overview's
SQL budget), `render_history` the Nodes page's table of the last days' (newest first, with
durations), where `download` offers the whole history as a CSV. Every time says how old it is; an episode still open says when it was last seen to hold
(the collector that keeps it may be gone).
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import Any

import pandas as pd
import streamlit as st

from components import figures
from components.context import PageRuntime
from components.format import fmt_age, fmt_ago
from runhealth.alerting.notify import CLEAR_S
from runhealth.records import AlertEpisodeRow
from runhealth.screens.events import alert_window_s, alert_window_words
from runhealth.settings.windows import ALERT_TIMELINE_S
from runhealth.store.writes import ALERT_HISTORY_KEEP_S

TODAY_S = ALERT_TIMELINE_S
HISTORY_DAYS = 7  # the Nodes page's table (the store keeps 30 days: the CSV has them all)
KEEP_DAYS = round(ALERT_HISTORY_KEEP_S / 86400)  # what Store.prune keeps of resolved episodes
CSV_COLUMNS = [
    "alert",
    "severity",
    "node",
    "gpu",
    "started_unix",
    "resolved_unix",
    "last_seen_unix",
    "duration_s",
    "summary_start",
    "summary_end",
    "value_start",
    "value_end",
]


def _when(ts: float, now: float) -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({fmt_ago(now - ts)})"


def episodes_table(rows: list[AlertEpisodeRow], now: float) -> pd.DataFrame:
    """The episodes as the Nodes page shows them (newest first, as read)."""
    out = []
    for r in rows:
        end = r["resolved_unix"] if r["resolved_unix"] is not None else r.get("absent_unix")
        out.append(
            {
                "alert": r["name"],
                "severity": r["severity"],
                "node": r["node"] or "run",
                "started": _when(r["started_unix"], now),
                "ended": ended_words(r, now),
                "duration": fmt_age((end if end is not None else r["last_seen_unix"]) - r["started_unix"]),
                "at start": r["summary_start"],
                "at the end": r["summary_end"] or "",
            }
        )
    return pd.DataFrame(
        out, columns=["alert", "severity", "node", "started", "ended", "duration", "at start", "at the end"]
    )


def holding(r: AlertEpisodeRow) -> bool:
    """Whether the episode held at the last evaluation: open and not seen absent since (an open
    one the last check no longer saw is cleared, resolved once it stays clear CLEAR_S)."""
    return r["resolved_unix"] is None and r.get("absent_unix") is None


def ended_words(r: AlertEpisodeRow, now: float) -> str:
    if r["resolved_unix"] is not None:
        return _when(r["resolved_unix"], now)
    absent = r.get("absent_unix")
    if absent is not None:  # the Overview's alerts no longer show it: never "still holding" here
        return f"{_when(absent, now)}, cleared (closed once clear for {fmt_age(CLEAR_S)})"
    return f"still holding (last seen {fmt_ago(now - r['last_seen_unix'])})"


def history_csv(rows: list[AlertEpisodeRow]) -> pd.DataFrame:
    """The episodes for the CSV: raw unix times and values (the table's words are for people)."""
    return pd.DataFrame(
        [
            {
                "alert": r["name"],
                **{k: r[k] for k in ("severity", "node", "gpu", "started_unix", "resolved_unix", "last_seen_unix")},
                "duration_s": ((r["resolved_unix"] or r["last_seen_unix"]) - r["started_unix"]),
                **{k: r[k] for k in ("summary_start", "summary_end", "value_start", "value_end")},
            }
            for r in rows
        ],
        columns=CSV_COLUMNS,
    )


def timeline_frame(rows: list[AlertEpisodeRow], now: float) -> pd.DataFrame:
    """What the timeline draws: one bar per episode (an open one up to when it was last seen)."""
    return pd.DataFrame(
        [
            {
                "label": f"{r['name']} · {r['node'] or 'run'}" + (f"/{r['gpu']}" if r["gpu"] is not None else ""),
                "severity": r["severity"],
                "started_unix": r["started_unix"],
                "ended_unix": r["resolved_unix"] if r["resolved_unix"] is not None else r["last_seen_unix"],
                "hover": f"{html.escape(r['summary_start'])}<br>"
                f"{'still holding' if holding(r) else 'at the end'}: {html.escape(r['summary_end'] or '')}",
            }
            for r in rows
        ],
        columns=["label", "severity", "started_unix", "ended_unix", "hover"],
    )


def download(rt: PageRuntime, prefix: str) -> None:
    """The whole history the store keeps (30 days) as CSV, in the sidebar."""
    rows = rt.store.alert_episodes()
    with st.sidebar:
        st.download_button(
            "Download alert history (CSV)",
            history_csv(rows).to_csv(index=False).encode("utf-8"),
            file_name="alert_history.csv",
            mime="text/csv",
            key=f"{prefix}_alert_history_csv",
            disabled=not rows,
        )


def render_today(rt: PageRuntime, prefix: str, events: Sequence[Any] = ()) -> None:
    """The Overview's "Today's alerts": the last 24 h's episodes as a timeline, the run's `events`
    as markers (in the live fragment; the CSV is `download`, outside it: sidebar widgets cannot
    live in a fragment)."""
    now = time.time()
    rows = rt.store.alert_episodes(since_unix=now - TODAY_S)
    if not rows:
        st.caption("Today's alerts: none in the last 24 h.")
    else:
        frame = timeline_frame(rows, now)
        # The window fits the run so far (its earliest episode or event), a day at most (#41).
        seen = [r["started_unix"] for r in rows] + [t for e in events if (t := getattr(e, "ts_unix", None)) is not None]
        width = alert_window_s(now, min(seen) if seen else None)
        st.plotly_chart(
            figures.make_alert_timeline_figure(frame, now - width, now, events, alert_window_words(width)),
            key=f"{prefix}_alert_timeline",
        )
        still = sum(map(holding, rows))
        st.caption(
            f"Today's alerts: {len(rows):,} in the last 24 h, {still:,} still holding "
            "(the Nodes page lists them, with the CSV)."
        )


def render_history(rt: PageRuntime, prefix: str) -> None:
    """The Nodes page's alert history: every episode of the last HISTORY_DAYS days, newest first."""
    now = time.time()
    st.subheader(f"Alert history (last {HISTORY_DAYS} days)")
    rows = rt.store.alert_episodes(since_unix=now - HISTORY_DAYS * 86400)
    if not rows:
        st.caption(f"No alert in the last {HISTORY_DAYS} days (the collector keeps {KEEP_DAYS} days).")
    else:
        st.dataframe(episodes_table(rows, now), hide_index=True, width="stretch")
        st.caption(
            "started: the first check that saw it; ended: the first check it no longer held "
            f"(the collector checks every poll interval; the CSV has {KEEP_DAYS} days)."
        )
