"""Output lengths: how long completions are, how many stop at the ceiling, what a higher limit buys.

Counts are exact (every completion counted once by the agent); lengths without
completion_tokens are chars/4 estimates and are labelled, never mixed in silently. The
what-if is a model extrapolation beyond the ceiling and says so.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from components import (
    cards,
    fieldcharts,
    figcache,
    figures,
    jobs,
    livewatch,
    loaders,
    page,
    precomputed,
    tables,
    whatif_view,
)
from components.context import PageRuntime
from components.format import fmt_clock, fmt_percentile_tokens, md_escape
from runhealth.screens.lengths import WHATIF_REFIT_S, Lengths, Summary, WhatIf, unknown_of

PREFIX = "lengths"
TITLE, ICON, URL_PATH = "Output lengths", ":material/straighten:", "Output_lengths"
CONTINUATION_N = 300
STATIC_GROUP_COLUMNS = {"at_ceiling": "cut", "fraction": "share cut"}  # the grid's column labels
GROUP_COLUMNS_HELP = "cut: stopped at the ceiling; ceiling: the group's max_tokens; drift: a ceiling unlike the rest."


def render_summary(rt: PageRuntime, s: Summary) -> None:
    tok, est = s.tokens, "" if s.length_source == "completion_tokens" else " (chars/4 estimate)"
    cards.render_tiles(
        [
            cards.truncation_tile(s, rt.config.truncation_warn_fraction, rt.config.truncation_alert_fraction),
            *[
                cards.tile(k, text, f"tokens{est}" + (" · at the ceiling: a lower bound" if text[0] == "≥" else ""))
                for k, v in (("P50", tok.p50), ("P90", tok.p90), ("P99", tok.p99))
                for text in [fmt_percentile_tokens(v, s.ceiling_tokens)]
            ],
            cards.tile("Mean / max", f"{tok.mean:,.0f}", f"max {tok.max:,} tokens{est}"),
        ]
    )
    unknown = unknown_of(s)
    if unknown is not None:  # never a silent 0%: which field is missing and what to set (#39)
        st.error(md_escape(f"Truncation unknown. {unknown.text}"))
    elif s.estimated_count:
        use = "are shown alone" if est else "are left out of the length statistics (still counted in finish reasons)"
        st.warning(
            f"{s.estimated_count:,} completions have no completion_tokens: their lengths are chars/4 estimates and {use}."
        )


def render_groups(rt: PageRuntime, ceiling: int | None) -> None:
    by = st.radio("Truncation by", ["node", "shard"], horizontal=True, key=f"{PREFIX}_group_radio")
    df = loaders.load_group_lengths(rt.store, by, ceiling)
    for _, g in df[df["drift"]].iterrows():
        st.warning(
            md_escape(f"Ceiling drift: {g['group']} stops at {int(g['ceiling']):,} tokens, unlike the rest of the run.")
        )
    if len(df):
        left, right = st.columns([3, 2])
        shown = tables.short_group_labels(df)
        if len(shown) < len(df):
            left.caption(
                f"The {len(shown) - 1} {by}s with the highest truncation; the other "
                f"{len(df) - len(shown) + 1:,} summed in one bar. Hover a bar for its full name."
            )
        left.plotly_chart(
            figcache.figure(
                figures.make_truncation_by_group_figure,
                shown,
                rt.config.truncation_warn_fraction,
                rt.config.truncation_alert_fraction,
            ),
            key=f"{PREFIX}_group_chart",
        )
        with right:
            render_group_table(tables.group_table(df), by)
        st.caption(f"Truncation by {by}: {precomputed.age_text(df.attrs.get('as_of'))}.")


def render_group_table(table: pd.DataFrame, by: str) -> None:
    """The by-group table beside its chart: a static table while it has a few rows (no data grid on
    the page, #42; the columns' meanings in a line under it), the grid (sorting, scrolling) past that."""
    if len(table) <= cards.STATIC_TABLE_ROWS:
        static = table.assign(drift=table["drift"].map({True: "yes", False: "no"}))
        st.table(static.rename(columns=STATIC_GROUP_COLUMNS | {"group": by}), hide_index=True)
        st.caption(GROUP_COLUMNS_HELP)
        return
    st.dataframe(
        table,
        hide_index=True,
        column_config={  # narrow columns: the table sits beside the chart, every column in view
            "group": st.column_config.TextColumn(by, width="medium"),
            "completions": st.column_config.TextColumn("completions", width="small"),
            "at_ceiling": st.column_config.TextColumn("cut", width="small", help="stopped at the ceiling"),
            "fraction": st.column_config.TextColumn(
                "share cut", width="small", help="share of this group's completions stopped at the ceiling"
            ),
            "ceiling": st.column_config.TextColumn("ceiling", width="small", help="this group's max_tokens"),
            "drift": st.column_config.CheckboxColumn("drift", width="small", help="ceiling unlike the rest"),
        },
        width="stretch",
    )


def render_whatif(rt: PageRuntime, m: Lengths) -> None:
    s, hist = m.summary, m.counts.hist
    ceiling = s.ceiling_tokens
    if ceiling is None:  # the page draws the what-if only under a ceiling
        return
    if page.kiosk():  # a wall has no keyboard: the what-if at twice the ceiling, said in the heading
        limit = 2 * ceiling
        st.subheader(f"What if max_tokens were raised to {limit:,}?")
    else:
        st.subheader("What if max_tokens were raised?")
        limit = int(
            st.number_input(
                "New max_tokens",
                min_value=1,
                max_value=16 * ceiling,
                value=2 * ceiling,
                step=256,
                key=f"{PREFIX}_whatif_limit",
            )
        )
    r, as_of = loaders.load_whatif_with_age(rt.store, hist, ceiling, limit, m.loop_sample)
    eta = m.eta_change(r)
    frac, (lo, hi) = r.truncated_fraction, r.interval
    cfg_warn, cfg_alert = rt.config.truncation_warn_fraction, rt.config.truncation_alert_fraction
    failed = whatif_view.failed_backtest(r) if r.band else ""
    cards.render_tiles(
        [
            cards.tile(
                f"Still truncated at {limit:,}",
                f"{frac:.1%}" if frac is not None else "?",
                " · ".join(
                    x
                    for x in (
                        failed,
                        f"95% {lo:.1%}–{hi:.1%}{whatif_view.interval_note(r)}",
                        # the share its counts had cut: as of the fit (refitted every minute),
                        # so said with its time, not as "now" beside the live part's newer one
                        f"{r.current_truncated_fraction:.1%} cut at {fmt_clock(fitted_at(as_of, m))}",
                    )
                    if x
                ),
                m.whatif_level(r, cfg_warn, cfg_alert, bool(failed)),
                help=f"the share of all completions that would still stop at max_tokens = {limit:,} (an extrapolation)",
            ),
            cards.tile(
                "Extra tokens / completion",
                f"{r.extra_tokens_per_completion:+,.0f}" if r.extra_tokens_per_completion is not None else "?",
                "{:,.0f}–{:,.0f}".format(*r.extra_tokens_interval),
            ),
            cards.tile(
                "ETA change",
                f"{eta.delta_s / 3600:+.1f} h" if eta.delta_s is not None else "—",
                "{:+.1f}–{:+.1f} h on the ETA at the 15-min average".format(*(x / 3600 for x in eta.delta_s_interval))
                if eta.delta_s is not None and eta.delta_s_interval is not None
                else "needs throughput and a target",
            ),
        ]
    )
    if r.band:
        st.markdown(whatif_view.backtest_line(r))
    if page.kiosk():
        render_kiosk_charts(rt, r, ceiling, limit, whatif_age(as_of, m))
        return
    fieldcharts.render_recovered(m.recovered(r))
    st.caption(f"This what-if: {whatif_age(as_of, m)}.")
    fine = (
        f"This is an extrapolation: nobody has seen lengths above {ceiling:,}. {r.note} "
        f"{whatif_view.model_line(r) if r.band else ''} Hard bounds: {r.hard_bounds[0]:.1%}–"
        f"{r.hard_bounds[1]:.1%}. {whatif_view.loops_line(r)}"
    )
    st.caption(fine)
    cards.render_terms(fine, whatif_view.backtest_line(r) if r.band else "")
    curve = tables.whatif_curve(r)
    if len(curve) > 1:
        st.plotly_chart(
            figcache.figure(figures.make_whatif_figure, curve, ceiling, limit, r.hard_bounds[1]),
            key=f"{PREFIX}_whatif_chart",
        )
    render_continuation(rt, limit, ceiling)


def fitted_at(as_of: float | None, m: Lengths) -> float:
    """The time of the counts the what-if was fitted on: the collector's pass (`as_of`), or, when
    the page fitted them itself, their last collection in the screen model's snapshot (the clock of
    the page's "Numbers as of")."""
    if as_of is not None:
        return as_of
    return max((n["last_ok_unix"] for n in m.nodes if n["last_ok_unix"] is not None), default=m.now)


def whatif_age(as_of: float | None, m: Lengths) -> str:
    """The what-if's caption: the collector's fit and its age, or the page's own fit and the time
    of its counts (a clock time: the panel is refitted once a minute, an age would not move)."""
    if as_of is not None:
        return precomputed.age_text(as_of)
    return (
        f"fitted for this page on the counts of {fmt_clock(fitted_at(as_of, m))}"
        " (the collector's fit is of other counts, or there is none yet)"
    )


def render_continuation(rt: PageRuntime, limit: int, ceiling: int) -> None:
    """A JSONL of continuation requests to measure the answer instead of modelling it."""
    key = f"{PREFIX}_continuation_job"
    if st.button(
        f"Prepare continuation batch ({CONTINUATION_N} truncated samples)",
        key=f"{PREFIX}_continuation_button",
        disabled=rt.collector is None or limit <= ceiling or jobs.running(key),
    ):
        jobs.start(key, whatif_view.continuation_job, rt.collector, rt.config, limit, ceiling, CONTINUATION_N)
    st.fragment(run_every=1 if jobs.running(key) else None)(page.guarded(render_continuation_result))(key)


def render_continuation_result(key: str) -> None:
    state, result, elapsed = jobs.status(key)
    if state == "running":
        st.info(
            f"Sampling {CONTINUATION_N} truncated completions with their full text from every node… "
            f"({elapsed:.0f} s; the page stays usable)"
        )
    elif state == "failed":
        st.error(md_escape(f"The continuation batch failed: {result}"))
    elif state == "done":
        st.download_button(
            f"Download {result['n']} continuation requests to {result['limit']:,} tokens (JSONL)",
            result["body"],
            file_name="continuation.jsonl",
            key=f"{PREFIX}_continuation_download",
            disabled=result["n"] == 0,
        )
        for text in [*(f"{node}: {err}" for node, err in result["errors"].items()), *result["problems"]]:
            st.warning(md_escape(text))
        st.caption(
            f"{result['n']} of {result['sampled']} sampled truncated completions; custom_id is node:path:line. "
            "Run the batch and compare lengths with the new limit."
        )


def render_server_note(rt: PageRuntime, summary: Summary) -> None:
    """Length stops below the ceiling, under their own name."""
    below, n = summary.length_below_ceiling, summary.length_count or 1
    if summary.ceiling_tokens:
        st.caption(
            f"Not counted as truncated: {below:,} length stops below the {summary.ceiling_tokens:,} ceiling "
            f"(context window) — {below / n:.1%} of {summary.length_count:,} completions."
        )


def render_server_view(m: Lengths) -> None:
    """The inference servers' own counts beside the shards' (runhealth.screens.serverview)."""
    if m.server is None:
        return
    st.markdown("**The servers' view** (their /metrics, since each server started; context-window stops included)")
    for line in m.server.lines():
        st.caption(md_escape(line))


def render_page(rt: PageRuntime) -> None:
    m = loaders.load_lengths_screen(rt.store, rt.config)
    nodes = list(m.nodes)
    cards.render_indexing(nodes)
    data = loaders.run_lengths(m.counts)
    summary = data.summary
    if not summary.completions:
        cards.render_nothing_yet(nodes)
        return
    render_summary(rt, summary)
    left, right = st.columns(2)
    if len(data.bins):
        left.plotly_chart(
            figcache.figure(
                figures.make_length_histogram_figure, data.bins, summary.ceiling_tokens, summary.at_ceiling_fraction
            ),
            key=f"{PREFIX}_hist_chart",
        )
        right.plotly_chart(
            figcache.figure(figures.make_cdf_figure, data.cdf, summary.ceiling_tokens), key=f"{PREFIX}_cdf_chart"
        )
    # A few rows of words: a static table mounts in about half the browser time of a data grid (#42).
    st.table(tables.finish_reason_table(summary).set_index("finish reason"))
    st.caption(f"Length statistics: {precomputed.age_text(data.as_of)}.")
    render_server_note(rt, summary)
    page.guarded(render_server_view)(m)
    page.guarded(render_groups)(rt, summary.ceiling_tokens)
    page.guarded(fieldcharts.render_panels)(m.fields)
    over_time = loaders.load_truncation_over_time(rt.store, rt.config.interval_s, summary.ceiling_tokens)
    if (over_time["completions"] > 0).sum() >= 2:
        st.plotly_chart(
            figcache.figure(
                figures.make_truncation_over_time_figure,
                over_time,
                rt.config.truncation_warn_fraction,
                rt.config.truncation_alert_fraction,
            ),
            key=f"{PREFIX}_time_chart",
        )
        st.caption(f"Truncation over time: {precomputed.age_text(over_time.attrs.get('as_of'))}.")
    else:
        st.caption("Truncation over time appears once there are two time buckets with new completions.")
    hourly = loaders.load_lengths_over_time(rt.store, summary.ceiling_tokens)
    if len(hourly) >= 2:
        st.plotly_chart(
            figcache.figure(figures.make_lengths_over_time_figure, hourly, summary.ceiling_tokens),
            key=f"{PREFIX}_hourly_chart",
        )
        st.caption(
            "Per hour of the whole run, by when the collector counted them. Percentiles are the upper edges"
            " of log bins (at most 4.4% above the exact value); the share at the ceiling is exact; "
            f"{precomputed.age_text(hourly.attrs.get('as_of'))}."
        )


def render_whatif_live(rt: PageRuntime) -> None:
    m = loaders.load_lengths_screen(rt.store, rt.config)
    if not m.summary.completions:
        return
    if m.summary.ceiling_tokens:
        page.guarded(render_whatif)(rt, m)
        st.caption(f"The what-if is refitted every {WHATIF_REFIT_S:g} s (a model fit, not a count).")
    else:
        st.info(
            "No max_tokens ceiling found in the data (none configured, no pile-up detected): nothing is cut at a limit."
        )


def render_kiosk_charts(rt: PageRuntime, r: WhatIf, ceiling: int, limit: int, age: str) -> None:
    """Kiosk part 2 under the what-if's tiles: its curve beside truncation over time."""
    left, right = st.columns(2)
    curve = tables.whatif_curve(r)
    if len(curve) > 1:
        fig = figcache.figure(figures.make_whatif_figure, curve, ceiling, limit, r.hard_bounds[1])
        left.plotly_chart(fig, key=f"{PREFIX}_whatif_chart", height=380)
    over_time = loaders.load_truncation_over_time(rt.store, rt.config.interval_s, ceiling)
    if (over_time["completions"] > 0).sum() >= 2:
        warn, alert = rt.config.truncation_warn_fraction, rt.config.truncation_alert_fraction
        fig = figcache.figure(figures.make_truncation_over_time_figure, over_time, warn, alert)
        right.plotly_chart(fig, key=f"{PREFIX}_time_chart", height=380)
    st.caption(f"An extrapolation: nobody has seen lengths above {ceiling:,}. This what-if: {age}.")


def render_kiosk(rt: PageRuntime) -> None:
    """The wall screen (?kiosk=1) in two parts, each within 1920x1080: 1 = tiles and the length
    distribution, 2 = the what-if at twice the ceiling and truncation over time."""
    m = loaders.load_lengths_screen(rt.store, rt.config)
    data = loaders.run_lengths(m.counts)
    summary = data.summary
    if not summary.completions:
        cards.render_nothing_yet(list(m.nodes))
        return
    if page.kiosk_part() == 1:
        render_summary(rt, summary)
        left, right = st.columns(2)
        if len(data.bins):
            hist = figcache.figure(
                figures.make_length_histogram_figure, data.bins, summary.ceiling_tokens, summary.at_ceiling_fraction
            )
            left.plotly_chart(hist, key=f"{PREFIX}_hist_chart", height=420)
            cdf = figcache.figure(figures.make_cdf_figure, data.cdf, summary.ceiling_tokens)
            right.plotly_chart(cdf, key=f"{PREFIX}_cdf_chart", height=420)
        left_out = "Next: the what-if and truncation over time. Finish reasons, by node, per hour: without ?kiosk=1."
    elif summary.ceiling_tokens:
        render_whatif(rt, m)
        left_out = "The what-if's model, its back-test details and the continuation batch: without ?kiosk=1."
    else:
        st.info("No max_tokens ceiling found in the data: nothing is cut at a limit, no what-if.")
        left_out = "Truncation over time, by node, per hour: without ?kiosk=1."
    page.kiosk_caption(PREFIX, page.kiosk_part(), left_out)


def render(rt: PageRuntime) -> None:
    """The Output lengths page for runtime `rt` (app.py has drawn the shared frame)."""
    st.title("Output lengths")
    if page.kiosk():  # the wall never scrolls: a layout that fits 1920x1080, in parts
        page.live(rt, render_kiosk, rt, follows=livewatch.PAYLOADS)
        return
    page.live(rt, render_page, rt, follows=livewatch.PAYLOADS)
    st.fragment(run_every=WHATIF_REFIT_S)(page.guarded(render_whatif_live))(rt)
    # Sidebar widgets cannot live in a fragment: the download holds the histogram as of page load.
    page.download_csv(
        loaders.run_lengths(loaders.load_lengths_screen(rt.store, rt.config).counts).bins,
        "length_histogram.csv",
        PREFIX,
    )
