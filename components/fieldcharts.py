"""The per-line field panels of Output lengths (#33): cuts before answering, label checks, and
which prompts get cut, with the what-if's recovered answers.

`make_group_cut_figure` is pure (plotly only; tests/test_fieldpanels.py builds it); the `render_*`
functions draw a runhealth.screens.fieldpanels record with Streamlit and decide nothing: the
words, counts and intervals are the model's. A panel whose field the shards lack shows the
model's message (which field, how to configure it) instead of a zero.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from components import cards
from components.figures import CEILING_COLOUR, NAMES_AXIS, STOP_COLOUR, apply_layout, new_figure_from, pct_axis
from components.format import md_escape
from runhealth.screens.fieldpanels import RECOVERED_ASSUMPTION, FieldPanels, GroupCuts, LabelChecks, Recovered
from runhealth.screens.words import fmt_count, fmt_share

PREFIX = "lengths"
CHART_GROUPS = 20  # the chart shows the most-cut groups; the table beside it has every one


def group_frame(g: GroupCuts) -> pd.DataFrame:
    """One row per group, most cut first: group, completions, cut, share, lo, hi."""
    cols = ["group", "completions", "cut", "share", "lo", "hi"]
    return pd.DataFrame([[r.group, r.completions, r.cut, r.share, r.lo, r.hi] for r in g.rows], columns=cols)


def make_group_cut_figure(df: pd.DataFrame, field: str, counts: str = "cut") -> go.Figure:
    """The share of each group's completions cut at the ceiling (`counts` "cut") or, where the
    stops cannot be split, stopped by `length` at all ("length stops"), with its 95% interval, the
    most cut on the left. `df`: group_frame's columns (non-empty)."""
    share = df["share"].fillna(0.0)
    names = [html.escape(str(g)) for g in df["group"]]  # shard data: plotly reads tags in its text, not entities
    bar = dict(
        type="bar",
        x=names,
        y=share,
        marker=dict(color=[CEILING_COLOUR if i == 0 else STOP_COLOUR for i in range(len(df))]),
        showlegend=False,
        customdata=df[["cut", "completions"]],
        hovertemplate="%{x}<br>%{y:.1%}: %{customdata[0]:,} of %{customdata[1]:,}<extra></extra>",
        error_y=dict(
            type="data", symmetric=False, array=df["hi"] - share, arrayminus=share - df["lo"], color="#CCCCCC"
        ),
    )
    labels = dict(
        type="scatter",
        x=names,
        y=df["hi"],
        mode="text",
        text=[f"{s:.1%}" for s in share],
        textposition="top center",
        showlegend=False,
        hoverinfo="skip",
    )
    top = float(df["hi"].max()) if len(df) else 0.01
    title = f"Cut share by {field}" if counts == "cut" else f"Length-stop share by {field}"
    fig = apply_layout(new_figure_from([bar, labels], {}), title, height=360)
    y_title = "share cut at the ceiling" if counts == "cut" else "share stopped by length"
    fig.update_layout(
        yaxis=dict(title=dict(text=y_title), range=[0, top * 1.2], **pct_axis(top)),
        xaxis=dict(type="category", tickangle=0 if len(df) <= 8 else -35, **NAMES_AXIS),
    )
    return fig


def render_cut_split(p: FieldPanels) -> None:
    """Among completions cut at the ceiling: never answered vs cut mid-answer."""
    st.markdown("**Cut before answering**")
    s = p.split
    if s.never_answered is None or s.mid_answer is None:
        st.info(md_escape(str(s.message)))
        return
    never, mid = s.never_answered, s.mid_answer
    cards.render_tiles(
        [
            cards.tile(
                "Never answered",
                fmt_count(never.k),
                f"{fmt_share(never.share)} of {fmt_count(s.cut)} cut · 95% {fmt_share(never.lo)}–{fmt_share(never.hi)}",
                "warn" if never.k else "ok",
                help="cut at the ceiling with an empty answer: the whole budget went to reasoning",
            ),
            cards.tile(
                "Cut mid-answer",
                fmt_count(mid.k),
                f"{fmt_share(mid.share)} of {fmt_count(s.cut)} cut · 95% {fmt_share(mid.lo)}–{fmt_share(mid.hi)}",
                help="cut at the ceiling after the answer had begun",
            ),
        ]
    )
    st.caption("Exact counts from every line; the intervals are Wilson 95% for the share.")


def render_label_checks(p: FieldPanels) -> None:
    """Completions labelled other than `length` at the ceiling, and context-window stops below it."""
    st.markdown("**Label checks**")
    c: LabelChecks = p.labels
    tiles = []
    if c.mislabelled is not None:
        how = ", ".join(f"{fmt_count(n)} {r}" for r, n in c.by_reason.items()) or "every one labelled length"
        tiles.append(
            cards.tile(
                "Mislabelled",
                fmt_count(c.mislabelled),
                f"at or above {fmt_count(c.ceiling)}, not labelled length: {how}",
                "warn" if c.mislabelled else "ok",
                help="completions at or above the ceiling whose finish_reason is not length (the server mislabels)",
            )
        )
    if c.context_stops is not None:
        tiles.append(
            cards.tile(
                "Context-window stops",
                fmt_count(c.context_stops),
                f"of {fmt_count(c.context_checked)} length stops below the ceiling · max_model_len"
                f" {fmt_count(c.max_model_len)}",
                help="length stops below the ceiling where prompt + completion filled the context window",
            )
        )
    if tiles:
        cards.render_tiles(tiles)
    if c.mislabelled is None:
        st.info(md_escape(str(c.mislabelled_message)))
    if c.context_stops is None:
        st.info(md_escape(str(c.context_message)))


def render_group_cuts(p: FieldPanels) -> None:
    """The cut share per group with its interval, most cut first: chart and table."""
    st.markdown("**Which prompts get cut**")
    g = p.groups
    if not g.rows:
        st.info(md_escape(str(g.message)))
        return
    df = group_frame(g)
    left, right = st.columns([3, 2])
    shown = df.head(CHART_GROUPS)
    left.plotly_chart(make_group_cut_figure(shown, g.label, g.counts), key=f"{PREFIX}_field_groups_chart")
    cols: dict[str, Any] = {g.label: df["group"], "completions": df["completions"].map(fmt_count)}
    if g.counts == "cut":
        cols["cut"] = df["cut"].map(fmt_count)
        cols["share cut"] = df["share"].map(fmt_share)
        cols["length stops below the ceiling"] = [fmt_count(r.below_ceiling) for r in g.rows]
    else:
        cols["length stops"] = df["cut"].map(fmt_count)
        cols["share stopped by length"] = df["share"].map(fmt_share)
    cols["95% interval"] = [f"{fmt_share(lo)}–{fmt_share(hi)}" for lo, hi in zip(df["lo"], df["hi"], strict=True)]
    table = pd.DataFrame(cols)
    if len(table) <= cards.STATIC_TABLE_ROWS:  # a few groups: a static table, no data grid (#42)
        right.table(table, hide_index=True)
    else:
        right.dataframe(table, hide_index=True, width="stretch")
    more = f" The chart shows the {CHART_GROUPS} most cut of {len(df):,}." if len(df) > CHART_GROUPS else ""
    what = (
        "Completions cut at the max_tokens ceiling (stopped by length at or above it, as the headline counts"
        f" them) per {g.label}; length stops below the ceiling (the context window's) are counted apart, not as cut."
        if g.counts == "cut"
        else f"Length stops (any: {g.note}) per {g.label}."
    )
    note = (
        f"{what} Exact counts; Wilson 95% intervals.{more}"
        " Dropping the cut ones removes these groups unevenly from the dataset."
    )
    st.caption(md_escape(note))


def render_panels(p: FieldPanels | None) -> None:
    """The three panels (nothing before the model has them)."""
    if p is None:
        return
    st.subheader("Beyond the ceiling")
    left, right = st.columns(2)
    with left:
        render_cut_split(p)
    with right:
        render_label_checks(p)
    render_group_cuts(p)
    if p.split.never_answered is not None or p.groups.rows:
        cards.render_terms("Wilson")  # the intervals' method, in plain words, once


def render_recovered(r: Recovered | None) -> None:
    """The what-if's answers recovered, with its assumption said plainly."""
    if r is None:
        return
    st.markdown(md_escape(r.line()))
    st.caption(RECOVERED_ASSUMPTION)
