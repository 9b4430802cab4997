"""The frame every screen shares: layout, access check, kiosk mode and the sidebar.

app.py calls `setup()` after `st.navigation` and before the chosen page's `render(rt)`. It
stops the page with a plain `st.error` when the config is wrong (the message names file, node
and field), keeps only the runs this viewer may see (components/access.py), and draws the sidebar every screen shares under
Streamlit's navigation: run name, DEMO badge, how old the data is (red once it is older than
stale_after: a frozen screen must never look healthy) and "Refresh now".
"""

from __future__ import annotations

import functools
import html
import math
import sqlite3
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, TypeVarTuple

import pandas as pd
import streamlit as st
from streamlit.navigation.page import StreamlitPage

from components import access, cards, context, livewatch, loaders, runpicker
from components import outbound as outbound_view
from components.format import fmt_clock, fmt_plural, md_escape
from runhealth import heartbeat
from runhealth.ages import FUTURE_TOLERANCE_S, fmt_age, fmt_ago
from runhealth.screens.nodestates import any_down
from runhealth.serve import exposure
from runhealth.settings.config import fix_hint
from runhealth.settings.windows import FRESHNESS_TICK_S
from runhealth.store import fileproblems

CSS = """
<style>
[data-testid="stMainBlockContainer"] {padding-top: 2.2rem}
/* A row of tiles in one element (cards.render_tiles): equal widths, st.columns' 1rem gap, stacked
   below 640 px as st.columns are. */
.rh-tiles {display: flex; gap: 1rem; width: 100%}
.rh-tiles > * {flex: 1 1 0; min-width: 0}
.rh-tiles > .rh-help {display: flex}
.rh-tiles > .rh-help > .rh-tile {flex: 1 1 auto; min-width: 0}
@media (max-width: 640px) {.rh-tiles {flex-direction: column; gap: 0}}
.rh-tile {border-radius: 10px; padding: 12px 18px; background: #1C2029; border-left: 10px solid #4C9AFF;
          margin-bottom: 8px; min-height: 150px}
.rh-tile.warn {border-left-color: #FFB000; background: #3A2E0F}
.rh-tile.alert {border-left-color: #FF4B4B; background: #401417}
.rh-tile.muted {border-left-color: #6B7080}
.rh-label {font-size: 1.15rem; color: #C3C7D0; text-transform: uppercase; letter-spacing: .05em}
.rh-value {font-size: 3.3rem; font-weight: 750; line-height: 1.15; color: #FFFFFF; white-space: nowrap}
.rh-tile.warn .rh-value {color: #FFC940}
.rh-tile.alert .rh-value {color: #FF6B6B}
.rh-sub {font-size: 1.05rem; color: #D0D4DC}
.rh-demo {background: #5B3FD0; color: #fff; padding: 8px 16px; border-radius: 8px; font-size: 1.2rem;
          font-weight: 600; margin-bottom: 8px}
.rh-age-old {color: #FF6B6B; font-weight: 700}
.rh-config-banner {background: #5C1018; border: 3px solid #FF4B4B; color: #FFFFFF; border-radius: 10px;
                   padding: 14px 20px; margin-bottom: 12px; font-size: 1.35rem; line-height: 1.35}
.rh-config-banner code {color: #FFD0D0; background: transparent; font-size: 1.2rem; white-space: pre-wrap}
/* A node's state in the static node table (cards.render_node_table, cells T_rhstate_row<i>_col<j>,
   status the second column): white on its state's colour, in the light theme too (whose dark text
   for every markdown paragraph would reach into the cell). */
[data-testid="stApp"] [data-testid="stTable"] td[id^="T_rhstate_"][id$="_col1"] p {color: #FFFFFF}
/* Dark text on the primary blue: white on #4C9AFF is 2.9:1, #0E1117 on it 6.6:1 (WCAG AA 4.5:1). */
[data-testid="stApp"] button[kind^="primary"], [data-testid="stApp"] button[kind^="primary"] * {color: #0E1117}
</style>
"""
# The standup screen is read from across the room: bigger alert sentences there.
BIG_ALERTS_CSS = """
<style>
[data-testid="stMainBlockContainer"] {padding-top: 2.2rem}
[data-testid="stAlertContainer"] p {font-size: 1.45rem; font-weight: 600}
</style>
"""
# Kiosk mode (?kiosk=1) for a wall screen: no sidebar, no Streamlit chrome, type readable from
# across a room at 1920x1080 (tile sub-lines 1.6rem = 25.6 px).
KIOSK_CSS = """
<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"], [data-testid="stToolbar"], [data-testid="stDecoration"],
[data-testid="stStatusWidget"] {display: none !important}
[data-testid="stMainBlockContainer"] {padding: .6rem 2rem .4rem 2rem !important; max-width: 100%}
/* The wall never scrolls: no empty slot for a style-only element, a title without its padding. */
[data-testid="stElementContainer"]:has([data-testid="stMarkdownContainer"] > style:only-child) {display: none}
h1 {font-size: 3rem !important; padding: .2rem 0 .4rem 0 !important}
.rh-tile {min-height: 190px}
.rh-label {font-size: 1.6rem}
.rh-value {font-size: 4.4rem}
.rh-sub {font-size: 1.6rem; line-height: 1.3}
.rh-asof {font-size: 1.5rem}
[data-testid="stMarkdownContainer"] > p {font-size: 1.3rem}  /* a line under the tiles (failed requests) */
[data-testid="stAlertContainer"] p {font-size: 1.7rem; font-weight: 600}
[data-testid="stCaptionContainer"] {font-size: 1.3rem}
[data-testid="stProgress"] p {font-size: 1.3rem}
.rh-config-banner {font-size: 2rem}
.rh-config-banner code {font-size: 1.6rem}
.rh-kiosk-left-out {font-size: 1.3rem; color: #9AA0AA; margin-top: -.4rem}
</style>
"""
# ?theme=light: light page, tiles and alerts for projectors. Chart text is darkened; tables (drawn
# on a canvas) keep their dark styling. The sidebar's text, the run picker and the buttons are
# set too: Streamlit's dark theme left them white on the white page and dark buttons under dark
# text (tests/test_browser.py measures the contrast).
LIGHT_CSS = """
<style>
[data-testid="stApp"], [data-testid="stSidebar"] {background: #FFFFFF; color: #111418}
[data-testid="stApp"] h1, [data-testid="stApp"] h2, [data-testid="stApp"] h3, .rh-asof {color: #111418 !important}
.rh-tile {background: #EEF1F5}
.rh-tile.warn {background: #FFF1CC}
.rh-tile.alert {background: #FFE0E0}
.rh-label, .rh-sub {color: #30343C}
.rh-value {color: #000000}
.rh-tile.warn .rh-value {color: #8A5A00}
.rh-tile.alert .rh-value {color: #B00020}
[data-testid="stAlertContainer"]:has([data-testid="stAlertContentError"]) {background: #FDE2E2}
[data-testid="stAlertContainer"]:has([data-testid="stAlertContentError"]) p {color: #7A0010}
[data-testid="stAlertContainer"]:has([data-testid="stAlertContentWarning"]) {background: #FFF3CD}
[data-testid="stAlertContainer"]:has([data-testid="stAlertContentWarning"]) p {color: #5C4200}
[data-testid="stAlertContainer"]:has([data-testid="stAlertContentInfo"]) {background: #E3EEFF}
[data-testid="stAlertContainer"]:has([data-testid="stAlertContentInfo"]) p {color: #0B3A75}
[data-testid="stAlertContainer"]:has([data-testid="stAlertContentSuccess"]) {background: #E2F5E9}
[data-testid="stAlertContainer"]:has([data-testid="stAlertContentSuccess"]) p {color: #0F5130}
[data-testid="stCaptionContainer"], [data-testid="stProgress"] p, [data-testid="stApp"] .rh-kiosk-left-out {color: #30343C}
[data-testid="stProgressBarTrack"] {background-color: #DDE2E8}
[data-testid="stApp"] .js-plotly-plot text {fill: #1A1D23 !important}
[data-testid="stSidebar"] {background: #F3F5F8}
[data-testid="stSidebar"] :is(p, span, label, h1, h2, h3, li, a, small) {color: #111418}
[data-testid="stSidebar"] [data-testid="stCaptionContainer"] :is(p, span) {color: #30343C}
[data-testid="stSidebar"] .rh-demo {color: #FFFFFF}
.rh-age-old {color: #B00020 !important}
[data-testid="stSidebar"] [data-testid="stSelectbox"] div:has(> input) {background-color: #FFFFFF !important;
  border: 1px solid #8A909A}
[data-testid="stSidebar"] [data-testid="stSelectbox"] :is(input, button, svg) {color: #111418 !important;
  -webkit-text-fill-color: #111418}
[data-testid="stSidebar"] [data-testid="stTooltipIcon"] svg {color: #30343C !important; opacity: 1}
[data-testid="stApp"] button:is([kind="secondary"], [kind="secondaryFormSubmit"]) {
  background: #FFFFFF; color: #111418; border: 1px solid #8A909A}
[data-testid="stApp"] button:is([kind="secondary"], [kind="secondaryFormSubmit"]):hover {
  background: #E3EEFF; color: #0B3A75; border-color: #0B5FD0}
[data-testid="stApp"] button:is([kind="secondary"], [kind="secondaryFormSubmit"]) * {color: inherit}
[data-testid="stApp"] :is([data-testid="stWidgetLabel"], [data-testid="stRadio"], [data-testid="stCheckbox"],
  [data-testid="stMetric"], [data-testid="stExpander"] summary, [data-testid="stMarkdownContainer"])
  :is(p, span, label, li, div, strong, em, td, th) {color: #111418}
[data-testid="stApp"] :is([data-testid="stCaptionContainer"], [data-testid="stMetricLabel"]) :is(p, span, div) {
  color: #30343C}
[data-testid="stApp"] [data-testid="stTooltipIcon"] svg {color: #30343C !important; opacity: 1}
[data-testid="stApp"] :is([data-baseweb="select"] > div, [data-baseweb="input"], [data-baseweb="base-input"],
  [data-baseweb="textarea"]) {background-color: #FFFFFF !important; border-color: #8A909A !important}
[data-testid="stApp"] :is(input, textarea, [data-baseweb="select"] *, [data-testid="stNumberInputContainer"] button) {
  color: #111418 !important; -webkit-text-fill-color: #111418; background-color: transparent !important}
[data-testid="stApp"] :is([data-testid="stNumberInputContainer"], [data-baseweb="select"], [data-testid="stTextInputRootElement"],
  [data-testid="stNumberInputContainer"] div, [data-testid="stSelectbox"] div:has(input), [data-baseweb="select"] div,
  [data-testid="stTextInputRootElement"] div) {
  background-color: #FFFFFF !important}
[data-testid="stApp"] :is([data-testid="stNumberInputContainer"], [data-baseweb="select"] > div,
  [data-testid="stTextInputRootElement"]) {border: 1px solid #8A909A !important}
[data-testid="stApp"] [data-testid="stNumberInputContainer"] button:hover {background-color: #E3EEFF}
/* The GPUs page's node selector (a multiselect): its box is not the select's own div in every
   Streamlit version, and was drawn dark under dark text (#41). Every box in it light. */
[data-testid="stApp"] [data-testid="stMultiSelect"] div {background-color: #FFFFFF !important}
[data-testid="stApp"] [data-testid="stExpander"] details {background: #FFFFFF; border-color: #C5CAD3}
[data-testid="stApp"] :is([data-testid="stCode"], [data-testid="stCode"] pre, [data-testid="stJson"]) {
  background-color: #F3F5F8 !important}
[data-testid="stApp"] [data-testid="stCode"] :is(code, span) {color: #111418 !important}
[data-testid="stApp"] [data-testid="stJson"] * {background-color: transparent !important}
[data-testid="stApp"] [data-testid="stJson"] * {color: #111418 !important}
[data-testid="stApp"] [data-testid="stText"] :is(div, span) {color: #111418}
[data-testid="stApp"] .stMarkdownColoredText {color: #111418 !important}
[data-testid="stApp"] .stMarkdownColoredText[style*="126, 213, 176"] {color: #0F6B3A !important}
[data-testid="stApp"] .rh-demo, [data-testid="stApp"] .rh-demo * {color: #FFFFFF !important}
[data-testid="stApp"] [data-testid="stJson"] .string-value {color: #0F5130 !important}
[data-testid="stApp"] .js-plotly-plot .annotation rect.bg {fill: #FFFFFF !important; fill-opacity: .85 !important}
/* st.dataframe draws its cells on a canvas in the server's (dark) theme colours, which no CSS
   reaches: inverted (hue turned back), the dark grid is a light one, its contrast kept. */
[data-testid="stApp"] [data-testid="stDataFrame"] {filter: invert(1) hue-rotate(180deg)}
</style>
"""
FAVICON = "🩺"  # an emoji: Streamlit draws it as a data: URL, nothing fetched from anywhere
KIOSK_ROTATION = ("overview", "lengths", "gpus")  # Nodes joins only while a node is down
# A page too tall for one wall screen is shown in parts (?kiosk=1&part=2), each its own screen.
KIOSK_PARTS = {"overview": 2, "lengths": 2}
KIOSK_MAX_ALERTS = 3  # alert sentences on a wall screen; the rest are counted in one line
P = ParamSpec("P")
R = TypeVar("R")
Ts = TypeVarTuple("Ts")

ERROR_PREFIX = "Could not draw this part of the page"
STORE_PATH_KEY = "rh_shown_stores"  # session state: the stores this page reads (store_failure names them)
DEMO_TEXT = "DEMO — simulated run; add runhealth.toml to monitor real nodes"


def setup(
    rt: context.Runtime,
    title: str,
    prefix: str,
    pages: dict[str, StreamlitPage],
    one_run: bool = True,
    title_is_run: bool = False,
) -> context.Runtime:
    """Configure the page for screen `prefix` (`pages`: every screen by prefix, for the kiosk
    rotation) and return the runtime of the run it shows (the sidebar's run picker); stops the
    page on a config or access error. `one_run`: False for a screen that shows several runs;
    `title_is_run`: the screen's title is the run's name (no "Run: <name>" line unless finished)."""
    st.set_page_config(page_title=f"{title} · runhealth", page_icon=FAVICON, layout="wide")
    st.markdown(CSS, unsafe_allow_html=True)
    if rt.config is None or rt.store is None:  # nothing ever loaded: the error is the page
        st.error(f"runhealth cannot start: {rt.config_error or 'no run configured'}")
        st.info(
            md_escape(fix_hint(rt.config_error or "", rt.config_path))
            + " and reload the page: the dashboard reloads the file when it changes, no restart needed."
        )
        st.fragment(run_every=FRESHNESS_TICK_S)(_rerun_when_stale)(rt)  # an open error page clears by itself
        st.stop()
    if rt.config_error:  # a refused edit: the last good config goes on, said on every page
        render_config_banner(rt)
    render_open_banner(rt)
    rt = access.restrict(rt)  # only the runs this viewer may see, before the picker and ?run=
    view = context.ready(rt)
    st.session_state[STORE_PATH_KEY] = [str(view.store.path)] if one_run else [str(r.store.path) for r in rt.runs]
    if query_flag("theme", "light"):
        st.markdown(LIGHT_CSS, unsafe_allow_html=True)
    with st.sidebar:
        if one_run:
            rt = runpicker.select(rt, prefix)
            view = context.ready(rt)
            st.session_state[STORE_PATH_KEY] = [str(view.store.path)]
        st.markdown(f"### {view.config.name}" if one_run else f"### {fmt_plural(len(rt.runs), 'run')}")
        if rt.notice:
            st.info(rt.notice)
        if rt.demo:
            st.markdown('<div class="rh-demo">DEMO</div>', unsafe_allow_html=True)
        st.caption(
            md_escape(
                f"Config: {rt.config_path}"
                if rt.config_path
                else "Config: none found (--config, RUNHEALTH_CONFIG, ./runhealth.toml)"
            )
        )
        st.fragment(run_every=FRESHNESS_TICK_S)(guarded(freshness))(rt, compact=True)
        collector = rt.collector
        why_not = refresh_blocked(rt, view)
        if (
            st.button(
                "Refresh now",
                key=f"{prefix}_refresh_button",
                disabled=why_not is not None,
                help=why_not or "Poll every node now",
            )
            and collector is not None
            and why_not is None
        ):
            collector.request_refresh()
            loaders.clear_all()
            st.rerun()
    if kiosk():  # after the pick: the wall screen follows the run in its URL (?run=)
        st.markdown(KIOSK_CSS, unsafe_allow_html=True)
        rotate_s, note = kiosk_rotate_s(view.config.kiosk_rotate_s)
        if note:
            st.caption(md_escape(note))
        if rotate_s:
            st.fragment(run_every=rotate_s)(_kiosk_rotate)(view, prefix, rotate_s, pages)
    line = runpicker.shown_line(rt) if one_run else None  # several runs: every page says which one it shows
    if line and not (title_is_run and not runpicker.is_finished(context.ready(rt))):
        st.caption(md_escape(line))
    return rt


def refresh_blocked(rt: context.Runtime, view: context.PageRuntime) -> str | None:
    """Why "Refresh now" cannot work here (None: it can): no collector in this process to ask,
    or the collecting process it would signal is gone, stopped or silent (its own words)."""
    if rt.collector is None:
        return "The collector is off in this process"
    if context.collecting() or runpicker.is_finished(view):
        return None  # this process collects (the request goes to its own thread), or nothing does
    found = heartbeat.fault(outbound_view.load_status(view.store), time.time(), view.config.stale_after)
    return None if found is None else found.text


def render_open_banner(rt: context.Runtime) -> None:
    """On every page of a dashboard served beyond this machine with a run no sign-in protects
    (`runhealth dashboard --public-without-auth`, or `streamlit run` with another address)."""
    address = served_address()
    if address is None:
        return
    # A run whose rule is unknown is shown to no one (components/access.py): not an open run.
    lists = [h.config.allowed_users for h in rt.runs if h.access_known]
    lists = lists or [rt.config.allowed_users if rt.config else []]
    if not exposure.is_loopback(address) and exposure.open_runs(lists, access.auth_configured()):
        st.error(md_escape("⚠ " + exposure.open_banner(address or "every address", st.get_option("server.port"))))


def served_address() -> str | None:
    """The address this Streamlit server was told to listen on; None when none was set (a test's
    AppTest; `runhealth dashboard` and the app's config.toml always set one)."""
    address = st.get_option("server.address")
    return None if address is None else str(address)


CONFIG_BANNER = "The config file's latest edit was refused"
CONFIG_STORED_BANNER = "The config file does not load"
STORED_TAIL = (
    "Showing the runs it names from their stores, read-only: nothing is collected until the file loads "
    "(no restart needed)."
)


def render_config_banner(rt: context.Runtime) -> None:
    """The banner of a refused config edit: which file, why, and that the last good config is in use."""
    where = html.escape(str(rt.config_path or "the config file"))
    head, tail = (
        (CONFIG_STORED_BANNER, html.escape(fix_hint(rt.config_error or "", rt.config_path)) + ". " + STORED_TAIL)
        if rt.stored_only
        else (
            CONFIG_BANNER,
            "Still collecting and showing the last good config; this banner goes once the file loads again.",
        )
    )
    st.markdown(
        f'<div class="rh-config-banner" role="alert">⚠ <b>{head}</b> ({where}):<br>'
        f"<code>{html.escape(rt.config_error or '')}</code><br>{tail}</div>",
        unsafe_allow_html=True,
    )


def query_flag(name: str, value: str = "1") -> bool:
    return str(st.query_params.get(name, "")).lower() == value


def kiosk() -> bool:
    """?kiosk=1: the wall-screen mode."""
    return query_flag("kiosk")


# ?rotate= is anyone's to type: a tiny value made one tab switch pages (and burn a server core)
# many times a second, a huge or infinite one overflows the browser's timer (a busy loop, no switch).
KIOSK_ROTATE_MIN_S, KIOSK_ROTATE_MAX_S = 5.0, 3600.0


def kiosk_rotate_s(default_s: float, asked: str | None = None) -> tuple[float, str | None]:
    """Seconds per page in kiosk mode, and a note when ?rotate= was not taken as given.

    ?rotate=N overrides [run] kiosk_rotate_s within 5 s - 1 h (outside: clamped, and noted);
    ?rotate=0 pins the page; a value that is not a number keeps the configured one.
    """
    if asked is None:
        asked = st.query_params.get("rotate")
    if asked is None:
        return default_s, None
    try:
        value = float(asked)
    except ValueError:
        value = math.nan
    if value == 0:
        return 0.0, None
    shown = str(asked)[:20]
    if math.isnan(value):
        return default_s, f"?rotate={shown} is not a number of seconds: rotating every {default_s:g} s"
    clamped = min(KIOSK_ROTATE_MAX_S, max(KIOSK_ROTATE_MIN_S, value))
    if clamped != value:
        limits = f"{KIOSK_ROTATE_MIN_S:g} s - {KIOSK_ROTATE_MAX_S / 60:g} min"
        return clamped, f"?rotate={shown} is outside {limits}: rotating every {clamped:g} s"
    return value, None


def kiosk_part() -> int:
    """The part of a page a wall screen shows (?part=N, 1 when absent or not a part of it)."""
    try:
        return max(1, int(str(st.query_params.get("part", "1"))))
    except ValueError:
        return 1


def kiosk_screens(node_down: bool, has_gpu: bool) -> list[tuple[str, int]]:
    """The wall's screens in order, as (page, part): the pages of KIOSK_ROTATION, each in as many
    parts as it has in KIOSK_PARTS (each part fits 1920x1080); GPUs only while a node reports a
    GPU (else a whole screen said "no GPU"), Nodes only while a node is down."""
    pages = [p for p in KIOSK_ROTATION if has_gpu or p != "gpus"] + (["nodes"] if node_down else [])
    return [(p, part) for p in pages for part in range(1, KIOSK_PARTS.get(p, 1) + 1)]


def next_kiosk_screen(current: str, part: int, node_down: bool, has_gpu: bool = True) -> tuple[str, int]:
    """The screen after (current, part): Overview 1, 2 -> Output lengths 1, 2 -> GPUs (-> Nodes
    while a node is down) -> Overview 1; a screen outside the rotation (Samples, a part that does
    not exist) goes on from its page's first part, or back to the Overview."""
    order = kiosk_screens(node_down, has_gpu)
    if (current, part) in order:
        return order[(order.index((current, part)) + 1) % len(order)]
    same = [s for s in order if s[0] == current]
    return same[0] if same and part != 1 else order[0]


def next_kiosk_page(current: str, node_down: bool, has_gpu: bool = True) -> str:
    """The page after `current` in the rotation, whole pages only (its parts skipped)."""
    screen = next_kiosk_screen(current, KIOSK_PARTS.get(current, 1), node_down, has_gpu)
    return screen[0]


def kiosk_caption(prefix: str, part: int, left_out: str) -> None:
    """The line under a kiosk screen: which part of how many, and what this screen leaves out
    (where to find it): the wall never scrolls, so what is not on it is said."""
    parts = KIOSK_PARTS.get(prefix, 1)
    where = f"Part {part} of {parts} · " if parts > 1 else ""
    st.markdown(
        f'<div class="rh-kiosk-left-out">{html.escape(where + left_out)}</div>',
        unsafe_allow_html=True,
    )


def _kiosk_rotate(rt: context.PageRuntime, prefix: str, rotate_s: float, pages: dict[str, StreamlitPage]) -> None:
    """Runs every rotate_s: the first run notes when this screen was shown, a later one moves on."""
    here = (prefix, kiosk_part())
    shown = st.session_state.get("kiosk_shown")
    now = time.time()
    if not shown or shown[0] != here:
        st.session_state["kiosk_shown"] = (here, now)
        return
    if now - shown[1] < rotate_s - 1.0:
        return
    nodes = loaders.load_nodes(rt.store)
    down = any_down(nodes, now, rt.config.stale_after)
    has_gpu = not loaders.load_gpu_latest(rt.store).empty
    st.session_state["kiosk_shown"] = None
    page_name, part = next_kiosk_screen(prefix, here[1], down, has_gpu)
    params = {k: v for k, v in st.query_params.items() if k != "part"}
    if part > 1:
        params["part"] = str(part)
    st.switch_page(pages[page_name], query_params=params)


def live(
    rt: context.PageRuntime,
    fn: Callable[[*Ts], object],
    *args: *Ts,
    header: bool = True,
    follows: livewatch.Follows = livewatch.ANY,
) -> None:
    """Draw `fn(*args)` in a fragment that redraws itself in place (no flicker, widgets inside keep
    their state) every collection interval and, where the process's watcher runs
    (components/livewatch.py), within a fraction of a second of each publication of the run's
    store that it `follows`; under a line saying when its numbers are from (`header=False`: `fn`
    draws that line itself, with its model's instant: `data_header(rt, as_of)`)."""

    def body(*a: *Ts) -> None:
        livewatch.drawing(rt.store, follows)  # the stamps before the reads: a later publication redraws again
        if header:
            guarded(data_header)(rt)
        guarded(fn)(*a)

    # The browser's timer stays at the interval: the ages on screen, a collector gone quiet, and
    # its first tick is what lets the watcher push this tab (livewatch: never before).
    st.fragment(run_every=max(rt.config.interval_s, 2.0))(body)(*args)


def data_header(rt: context.PageRuntime, as_of: float | None | bool = False) -> None:
    """ "Numbers as of HH:MM:SS"; a red sentence once the last collection is older than stale_after.
    `as_of`: the screen model's last collection (default: read it now)."""
    last = loaders.load_last_collection(rt.store) if as_of is False else as_of
    if last is None:
        st.caption("Waiting for the first poll: no numbers yet.")
        return
    age = time.time() - last
    text = f"Numbers as of {fmt_clock(last)} ({fmt_ago(age)})"
    if age > rt.config.stale_after:
        st.error(f"⚠ {text}: older than {fmt_age(rt.config.stale_after)}, these numbers are stale.")
    elif age < -FUTURE_TOLERANCE_S:  # stamped before a clock step back: flagged, never "0 s ago"
        st.warning(f"⚠ {text}.")
    else:
        st.markdown(
            f'<div class="rh-asof" style="color:#9AA0AA">{html.escape(text)} · refreshed every '
            f"{fmt_age(max(rt.config.interval_s, 2.0))}</div>",
            unsafe_allow_html=True,
        )


def guarded(fn: Callable[P, R]) -> Callable[P, R | None]:
    """Run a render function so that no exception escapes the page: it becomes an st.error (a
    store that cannot be read says which and what to do: store_failure)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            st.error(md_escape(store_failure(exc) or f"{ERROR_PREFIX}: {type(exc).__name__}: {str(exc)[:300]}"))
            return None

    return wrapper


def store_failure(exc: BaseException) -> str | None:
    """What an SQLite error reading the run's history store means and what to do about it
    (fileproblems.problem: a damaged file, a full disk, an I/O error, permissions), naming the
    store this page shows; None for any other exception. A store damaged after the dashboard
    opened it fails every read: the page says this, not a traceback."""
    if not isinstance(exc, sqlite3.Error):
        return None
    paths = st.session_state.get(STORE_PATH_KEY) or []
    if len(paths) == 1:
        return f"The run's numbers cannot be read: {fileproblems.problem(paths[0], exc)}"
    return (  # a screen of several runs: which store failed is not known here
        f"One of the history stores of the runs shown cannot be read ({exc}): {', '.join(paths) or 'none known'}. "
        "`runhealth status --config FILE` names the one it refuses and says what to do"
    )


def _rerun_when_stale(rt: context.Runtime) -> None:
    if context.is_stale(rt):  # the config file changed: a full rerun rebuilds the runtime
        st.rerun()


def freshness(rt: context.Runtime, compact: bool = False) -> None:
    """When the last successful collection happened; red once it is older than stale_after.
    Redrawn on each publication with the page's live part (components/livewatch.py), so that it
    names the poll the page's numbers are from."""
    _rerun_when_stale(rt)
    view = context.ready(rt)
    livewatch.drawing(view.store, livewatch.ANY, livewatch.SIDEBAR)
    cards.render_store_incident(view.store)
    last = loaders.load_last_collection(view.store)
    if last is None:
        st.markdown("**Waiting for first poll** — no node has answered yet.")
        return
    age = time.time() - last
    clock = time.strftime("%H:%M:%S", time.localtime(last))
    text = f"Last collection {clock} ({fmt_ago(age)})"
    if age > view.config.stale_after:
        st.markdown(f'<span class="rh-age-old">⚠ {text} — data is stale</span>', unsafe_allow_html=True)
    elif age < -FUTURE_TOLERANCE_S:
        st.markdown(f'<span class="rh-age-old">⚠ {text}</span>', unsafe_allow_html=True)
    elif compact:
        st.caption(text)
    else:
        st.markdown(text)


def download_csv(df: pd.DataFrame, filename: str, prefix: str, label: str = "Download CSV") -> None:
    """The page's data as CSV, in the sidebar."""
    with st.sidebar:
        st.download_button(
            label,
            df.to_csv(index=False).encode("utf-8"),
            file_name=filename,
            mime="text/csv",
            key=f"{prefix}_csv_download",
            disabled=df.empty,
        )


def headline_files(record: dict[str, Any]) -> tuple[bytes, bytes]:
    """The headline record's two downloads: JSON (as `runhealth status --json`) and one CSV row
    (the alerts left out; a list cell as JSON)."""
    import json

    flat = {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in record.items() if k != "alerts"}
    return json.dumps(record, indent=2).encode("utf-8"), pd.DataFrame([flat]).to_csv(index=False).encode("utf-8")


def download_headline(rt: context.PageRuntime, prefix: str) -> None:
    """The Overview's headline record (its model's, as the tiles and `runhealth status --json`
    show it) as JSON and CSV (one row), in the sidebar."""
    record = loaders.load_overview(rt.store, rt.config, runpicker.is_finished(rt)).headline()
    as_json, as_csv = headline_files(record)
    with st.sidebar:
        st.download_button(
            "Download headline figures (JSON)",
            as_json,
            file_name="headline.json",
            mime="application/json",
            key=f"{prefix}_headline_json",
        )
        st.download_button(
            "Download headline figures (CSV)",
            as_csv,
            file_name="headline.csv",
            mime="text/csv",
            key=f"{prefix}_headline_csv",
        )
