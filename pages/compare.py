"""Compare runs: two runs side by side, e.g. the 4,096 run and its 8,192 relaunch.

Did the relaunch fix the truncation, how much longer are completions now, what did it cost in
tok/s and ETA, and was the what-if's forecast right? The "B vs A" sentence on top, both length
distributions on one axis with each ceiling marked, the side-by-side table with differences and
95% intervals, and A's what-if at B's limit beside what B measured (runhealth.screens.runfigures).

`render(rt)` draws the page for the runtime's runs (`rt.runs`, components.context.RunHandle);
`render_runs(runs)` for any list of them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import streamlit as st

from components import compare_view, context, livewatch, page
from components.compare_view import load_compare, load_prompt_overlap, load_run_numbers
from components.context import PageRuntime
from components.format import md_escape
from runhealth.screens import compare as compare_model
from runhealth.screens import runfigures

PREFIX = "compare"
TITLE, ICON, URL_PATH = "Compare runs", ":material/compare_arrows:", "Compare"
# Compare is not in the wall's rotation (components/page.py KIOSK_ROTATION); opened with ?kiosk=1
# it shows its verdict within 1920x1080 and says where the rest is.
KIOSK_LEFT_OUT = (
    "Compare is not a wall screen (not in the kiosk rotation): the length chart, the side-by-side "
    "table and the forecast check are on the page without ?kiosk=1."
)
ONE_RUN = False  # the page shows two runs: no "Run: <name>" line, no run picker effect


def default_pair(runs: list[context.RunHandle]) -> tuple[int, int]:
    """(A, B) the page opens with: A the older run, B the newer (runhealth.screens.runfigures.default_pair)."""
    return runfigures.default_pair([(h.finished, h.config.max_output_tokens) for h in runs])


def pick_runs(runs: list[context.RunHandle]) -> tuple[context.RunHandle, context.RunHandle]:
    names = [h.config.name for h in runs]
    a0, b0 = default_pair(runs)
    if page.kiosk():  # a wall has no keyboard: the pair the page opens with
        return runs[a0], runs[b0]
    left, right = st.columns(2)
    a = left.selectbox("Run A (before)", names, index=a0, key=f"{PREFIX}_run_a")
    b = right.selectbox("Run B (after)", names, index=b0, key=f"{PREFIX}_run_b")
    return runs[names.index(a)], runs[names.index(b)]


def numbers(h: context.RunHandle) -> runfigures.RunNumbers:
    return load_run_numbers(h.store, h.config.name, h.config.max_output_tokens, h.config.target_completions, h.finished)


def render_as_of(line: compare_model.AsOf) -> None:
    """How old one run's numbers are, as the model words it; in red when too old."""
    (st.error if line.level == "alert" else st.caption)(md_escape(line.text))


def follow(shown: Sequence[context.RunHandle]) -> None:
    """Have the process's watcher push this live part after each round of polls of the runs
    shown that are still live (their Overview publication: Compare's numbers are the runs' raw
    counts, read after the round), as the other pages' live parts are (components/livewatch.py)."""
    live = [h for h in shown if not h.finished]
    for role, h in zip((livewatch.LIVE, livewatch.SECOND), live, strict=False):
        livewatch.drawing(h.store, livewatch.OVERVIEW, role)
    for role in (livewatch.LIVE, livewatch.SECOND)[len(live) :]:
        livewatch.not_drawing(role)


def render(rt: PageRuntime) -> None:
    """The Compare page over every run of the runtime, redrawn in place after each round of polls
    of a live run it shows (components/livewatch.py) and every collection interval (at least 10 s:
    each redraw re-checks the forecast)."""
    st.title("Compare runs")
    if len(rt.runs) < 2:
        page.data_header(rt)
    every = max([h.config.interval_s for h in rt.runs if not h.finished] + [10.0])
    st.fragment(run_every=every)(page.guarded(render_runs))(rt.runs)


def render_runs(runs: list[context.RunHandle]) -> None:
    """Two of `runs` side by side (at least two to compare)."""
    if len(runs) < 2:
        name = runs[0].config.name if runs else "none"
        st.info(
            md_escape(
                f"Only one run ({name}): nothing to compare yet. Describe several runs with "
                "[[runs]] tables in the config (a finished one stays readable from its store)."
            )
        )
        return
    ha, hb = pick_runs(runs)
    follow([ha, hb] if ha is not hb else [ha])
    if ha is hb:
        st.warning("Pick two different runs.")
        return
    a, b = numbers(ha), numbers(hb)
    prompts = page.guarded(load_prompt_overlap)(ha.store, hb.store, ha.config.name, hb.config.name)
    m = load_compare(a, b, (ha.config.stale_after, hb.config.stale_after), time.time(), prompts)
    for line in m.as_of:
        render_as_of(line)
    if m.comparison is None:
        st.info(md_escape(m.empty))
        return
    compare_view.render_headline(m.comparison)
    compare_view.render_prompts(m.prompts)
    if page.kiosk():  # the wall never scrolls (#41: 2,000 px tall): the verdict only, the rest said
        page.kiosk_caption(PREFIX, 1, KIOSK_LEFT_OUT)
        return
    st.plotly_chart(compare_view.make_overlay_figure(a, b), key=f"{PREFIX}_overlay_chart")
    compare_view.render_table(list(m.rows), a, b)
    compare_view.render_forecast(m.comparison, a, b)
