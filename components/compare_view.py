"""The Compare page's figures and blocks: two runs' lengths on one axis, the side-by-side table,
and A's forecast against B's measurement.

`make_*_figure` functions are pure (plotly only; tested in tests/test_compare_page.py); the
`render_*` functions draw with Streamlit. The numbers come from runhealth.screens.runfigures.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from components import cards, livewatch
from components.figures import ALERT_COLOUR, CEILING_COLOUR, STOP_COLOUR, apply_layout, new_figure, vline
from components.format import fmt_window, md_escape
from runhealth.screens import compare as compare_model
from runhealth.screens import runfigures
from runhealth.settings.windows import RATE_WINDOW_S
from runhealth.store import Store


@st.cache_data(ttl=5, max_entries=8, hash_funcs={Store: livewatch.keyed_on(livewatch.OVERVIEW)}, show_spinner=False)
def load_run_numbers(
    store: Store, name: str, ceiling: int | None, target: int | None, finished: bool
) -> runfigures.RunNumbers:
    """One run's Compare figures (runhealth.screens.runfigures.run_numbers), cached for 5 s or
    until the run's next Overview publication (the round of polls Compare is pushed for)."""
    return runfigures.run_numbers(store, name, ceiling, target, finished)


@st.cache_data(ttl=10, max_entries=4, show_spinner="Checking A's forecast against B…")
def load_comparison(_a: runfigures.RunNumbers, _b: runfigures.RunNumbers, key: tuple) -> runfigures.Comparison:
    """`key` (names and as-of times) decides reuse: the numbers themselves are not hashed."""
    return runfigures.compare_runs(_a, _b)


@st.cache_data(ttl=10, max_entries=4, hash_funcs={Store: lambda s: str(s.path)}, show_spinner=False)
def load_prompt_overlap(a: Store, b: Store, a_name: str, b_name: str) -> compare_model.PromptOverlap:
    """B's answers against A's prompts (runhealth.screens.compare.prompt_overlap), cached for 10 s."""
    return compare_model.prompt_overlap(a, b, a_name, b_name)


def load_compare(
    a: runfigures.RunNumbers,
    b: runfigures.RunNumbers,
    stale_after: tuple[float, float],
    now: float,
    prompts: compare_model.PromptOverlap | None = None,
) -> compare_model.Compare:
    """The Compare page's model at `now` (runhealth.screens.compare), the comparison itself
    reused while both runs' numbers are the same (load_comparison)."""
    both = a.summary.completions and b.summary.completions
    cmp = load_comparison(a, b, (a.name, a.as_of, b.name, b.as_of)) if both else None
    return compare_model.compare(a, b, stale_after, now, cmp, prompts=prompts)


RUN_COLOURS = {"A": "#8A8F98", "B": STOP_COLOUR}  # the earlier run grey, the one it is judged against blue


def make_overlay_figure(a: runfigures.RunNumbers, b: runfigures.RunNumbers) -> go.Figure:
    """Both runs' length histograms (share per bin, bars) and CDFs (lines, right axis) on one
    token axis, each run's ceiling marked."""
    top = max(max((t for t, _c in r.hist.length_pairs()), default=0) for r in (a, b))
    width = runfigures.overlay_width(top)
    fig = new_figure()
    for key, run in (("A", a), ("B", b)):
        colour, name = RUN_COLOURS[key], f"{key}: {run.name}"
        bins = runfigures.overlay_bins(run.hist, width, top)
        fig.add_bar(
            x=[s + width / 2 for s, _ in bins],
            y=[100 * v for _s, v in bins],
            width=width,
            name=f"{name} (share per {width}-token bin)",
            marker_color=colour,
            opacity=0.55,
        )
        cdf = runfigures.cdf_points(run.hist)
        fig.add_scatter(
            x=[t for t, _ in cdf],
            y=[round(100 * f, 4) for _t, f in cdf],  # to 0.0001 points: 17 digits drew nothing more (#42)
            mode="lines",
            yaxis="y2",
            name=f"{name} (cumulative)",
            line=dict(color=colour, width=3),
        )
        ceiling = run.summary.ceiling_tokens
        if ceiling is not None:
            vline(
                fig,
                ceiling,
                f"{key} ceiling {ceiling:,}",
                "top left" if key == "A" else "top right",
                dash="dash",
                color=CEILING_COLOUR if key == "A" else ALERT_COLOUR,
                width=2,
            )
    fig.update_layout(
        barmode="overlay",
        xaxis_title="completion tokens",
        yaxis_title="% of run's completions",
        yaxis2=dict(
            title="cumulative %",
            overlaying="y",
            side="right",
            range=[0, 100.5],
            tickvals=[0, 25, 50, 75, 100],
            showgrid=False,
            automargin=False,  # figures.FIXED_AXES: Streamlit's chart theme would turn it on
        ),
    )
    apply_layout(fig, "Completion lengths, A and B on one axis", height=460)
    # Four legend entries: under the plot, clear of the title and the ceiling labels.
    fig.update_layout(
        margin=dict(l=60, r=70, t=60, b=110), legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0)
    )
    return fig


def render_headline(cmp: runfigures.Comparison) -> None:
    st.subheader(md_escape(cmp.headline))


def render_prompts(p: compare_model.PromptOverlap | None) -> None:
    """Whether B answered A's prompts, in one line (or which run lacks prompt IDs)."""
    if p is None:
        return
    (st.markdown if p.share is not None else st.info)(md_escape(p.line))
    if p.share is not None:
        st.caption(
            "Distinct prompts by their hashed IDs in each run's store (64-bit hashes: a collision among 10M"
            " prompts has a chance of about 3 in a million); prompts B answered that A never had are not counted."
        )


def render_table(rows: list[dict[str, str]], a: runfigures.RunNumbers, b: runfigures.RunNumbers) -> None:
    """The side-by-side table, labelled with each run's n and how old its numbers are."""
    df = pd.DataFrame(rows).rename(columns={"A": f"A: {a.name}", "B": f"B: {b.name}"})
    # A few rows of words, read side by side, never sorted: a static table, no data grid on the page
    # (its chunk and canvas in every cold load, #42).
    st.table(df, hide_index=True)
    st.caption(
        f"A: n = {runfigures.sample_size(a.summary)}, B: n = {runfigures.sample_size(b.summary)}. "
        "Shares: Wilson 95% intervals per run, Newcombe's for the difference; mean: Welch; percentiles: "
        "order-statistic intervals (approximate). Rates are averages over each run's collected life "
        f"(A: {a.life.spans} poll spans, B: {b.life.spans}), the interval by batch means over "
        "consecutive polls (approximate); the Overview's tok/s is the last "
        f"{fmt_window(RATE_WINDOW_S)} instead. ≥: a percentile at its run's ceiling is only a lower bound, "
        "so the difference is a bound too (≤ or ≥), and not measurable when both are at their ceilings."
    )
    cards.render_terms("Newcombe Wilson Welch batch means")  # the methods named above, in plain words


def render_forecast(cmp: runfigures.Comparison, a: runfigures.RunNumbers, b: runfigures.RunNumbers) -> None:
    """A's what-if at B's ceiling beside what B measured there, and whether it falls inside."""
    st.subheader("Forecast vs outcome")
    f = cmp.forecast
    if f is None:
        st.info(md_escape(cmp.forecast_note))
        return
    verdict = "inside" if f["inside"] else "outside"
    cols = st.columns(2)
    with cols[0]:
        st.markdown(md_escape(f"A's what-if ({a.name}, {f['model']}) predicted at {f['limit']:,}:"))
        st.metric(
            "still cut (predicted)",
            f"{100 * f['predicted_fraction']:.1f}%",
            help="the what-if's estimate from A's lengths below its ceiling",
        )
        st.caption(
            f"95% interval {100 * f['interval'][0]:.1f}–{100 * f['interval'][1]:.1f}%{f['interval_note']};"
            " extra tokens per "
            f"completion {f['predicted_extra_tokens']:+,.0f} ({f['predicted_extra_tokens_interval'][0]:+,.0f} to "
            f"{f['predicted_extra_tokens_interval'][1]:+,.0f})"
        )
    with cols[1]:
        st.markdown(md_escape(f"B ({b.name}) measured at {f['limit']:,}:"))
        st.metric("still cut (measured)", f"{100 * f['measured_fraction']:.1f}%")
        extra = f["measured_extra_tokens"]
        st.caption(
            f"95% interval {100 * f['measured_interval'][0]:.1f}–{100 * f['measured_interval'][1]:.1f}% "
            f"(n = {runfigures.sample_size(b.summary)}); extra tokens per completion "
            + (f"{extra:+,.0f}" if extra is not None else "—")
        )
    text = (
        f"The measurement falls {verdict} the predicted interval "
        f"({100 * f['interval'][0]:.1f}–{100 * f['interval'][1]:.1f}%{f['interval_note']})."
    )
    (st.success if f["inside"] else st.warning)(text)
    st.caption(md_escape(cmp.forecast_note))
    cards.render_terms(
        f["model"] or "", f["interval_note"] or "", cmp.forecast_note
    )  # the what-if's terms, in plain words
