"""Samples: read what the model actually wrote, especially where truncated completions were cut.

"Re-sample" asks the collector for a fresh uniform sample (it runs in the background; two tabs
clicking at once share one batch). Sample text is shown with st.code / st.text only, never as
markdown or HTML, so whatever a completion contains is shown literally.
"""

from __future__ import annotations

import streamlit as st

from components import cards, loaders, page, tables
from components.context import PageRuntime
from components.format import fmt_clock, fmt_count, fmt_share, md_escape
from runhealth.records import StoredSample
from runhealth.screens.samples import NEVER_ANSWERED_RULE as RULE
from runhealth.screens.samples import Samples, sample_key

PREFIX = "samples"
TITLE, ICON, URL_PATH = "Samples", ":material/search:", "Samples"
REASONS = {"all completions": None, "truncated only (finish_reason = length)": "length"}


def render_controls(rt: PageRuntime) -> None:
    c1, c2, c3 = st.columns([1, 2, 2], vertical_alignment="bottom")
    n = int(c1.number_input("Sample size", min_value=1, max_value=2000, value=50, key=f"{PREFIX}_n_input"))
    reason = REASONS[c2.selectbox("Draw from", list(REASONS), key=f"{PREFIX}_reason_select")]
    collector = rt.collector
    if (
        c3.button(
            "Re-sample",
            key=f"{PREFIX}_resample_button",
            type="primary",
            disabled=collector is None,
            help="Draw a fresh uniform sample from every node's shards" if collector else "The collector is off",
        )
        and collector is not None
    ):
        batch = collector.request_sample(n, reason)
        st.session_state.setdefault(f"{PREFIX}_filters", {})[batch] = reason
        st.session_state[f"{PREFIX}_waiting"] = batch
        loaders.load_samples.clear()
        loaders.load_samples_screen.clear()


def render_pending(rt: PageRuntime) -> None:
    """'sampling…' until the batch lands; then one full rerun to show it."""
    got = loaders.load_samples(rt.store)
    if got["pending"]:
        st.info(f"Sampling… (batch {got['pending']['batch']}, {got['pending']['requested_n']} completions requested)")
    elif st.session_state.pop(f"{PREFIX}_waiting", None) is not None:
        # The page's model was read while the batch was pending and is cached for its ttl: read
        # after the batch landed, or the full run shows the batch before (or "No sample yet")
        # and, with nothing pending, never looks again.
        loaders.load_samples_screen.clear()
        st.rerun(scope="app")


def render_rates(rt: PageRuntime, batch: int) -> None:
    """The sample's shares beside the exact counts: one model, re-read every refresh."""
    m = loaders.load_samples_screen(rt.store, rt.config)
    if m.batch is None or m.batch["batch"] != batch:
        st.rerun(scope="app")  # a newer batch landed (another viewer's): show it, table and all
    summary, ceiling = m.summary, m.summary.ceiling_tokens
    filtered = st.session_state.get(f"{PREFIX}_filters", {}).get(batch) == "length" or all(
        s["finish_reason"] == "length" for s in m.samples
    )
    tiles = []
    sampled = m.truncated_in_sample
    if ceiling and sampled is not None and not filtered:
        tiles.append(
            cards.tile(
                "Truncated · this sample",
                f"{sampled.fraction:.1%}",
                f"n = {sampled.n} · 95% {sampled.lo:.1%}–{sampled.hi:.1%} · {sampled.k} at the {ceiling:,} ceiling",
            )
        )
        tiles.append(
            cards.tile(
                "Truncated · all completions",
                f"{summary.at_ceiling_fraction:.1%}",
                f"{summary.at_ceiling:,} of {summary.length_count:,} · exact count",
            )
        )
    cut = m.truncated
    share = m.loop_share
    if share.n:
        few = share.n < cards.MIN_SAMPLE_N  # a share from a handful of samples is no alarm
        tiles.append(
            cards.tile(
                "Truncated that loop",
                f"{share.fraction:.0%}",
                f"{share.loops} of n = {share.n} cut ones repeat themselves · 95% {share.lo:.0%}–{share.hi:.0%}"
                + (f" · too few to judge (n < {cards.MIN_SAMPLE_N})" if few else ""),
                "muted" if few else "warn" if (share.fraction or 0.0) >= 0.1 else "ok",
            )
        )
    never_tiles = never_answered_tiles(m)
    tiles += never_tiles
    if tiles:
        cards.render_tiles(tiles)
    if never_tiles:
        st.caption(md_escape("Never answered in this sample: " + RULE))
    examples = [
        ("A truncated loop", [s for s in cut if s.get("is_loop")]),
        ("A truncated completion that is not a loop", [s for s in cut if not s.get("is_loop")]),
        ("A cut that never answered", m.never_answered),
    ]
    cols = st.columns(3)
    for col, (title, found) in zip(cols, examples, strict=False):
        with col, st.expander(title, expanded=False):
            if found:
                cards.render_sample(found[0])
            else:
                st.text("None in this sample.")


def never_answered_tiles(m: Samples) -> list[dict[str, str]]:
    """Cuts that never answered: in this sample (judged from its text) beside the scan's exact count."""
    split, sampled = m.cut_split, m.never_answered_in_sample
    if split is None or split.never_answered is None or sampled is None:
        return []
    exact = split.never_answered
    return [
        cards.tile(
            "Never answered · this sample",
            fmt_share(sampled.fraction),
            f"{sampled.k} of n = {sampled.n} cut at the ceiling · 95% {fmt_share(sampled.lo)}–{fmt_share(sampled.hi)}"
            " · from the sample's text",
            "muted" if sampled.n < cards.MIN_SAMPLE_N else "ok",
        ),
        cards.tile(
            "Never answered · all cuts",
            fmt_share(exact.share),
            f"{fmt_count(exact.k)} of {fmt_count(exact.n)} · exact count",
        ),
    ]


def label(s: StoredSample) -> str:
    loop = " · loop" if s.get("is_loop") else ""
    return f"{s['node']} · {(s['path'] or '').rsplit('/', 1)[-1]}:{s['line_no']} · {s['tokens']} tok · {s['finish_reason']}{loop}"


def render(rt: PageRuntime) -> None:
    """The Samples page for runtime `rt` (app.py has drawn the shared frame)."""
    st.title("Samples")
    page.guarded(render_controls)(rt)
    waiting = st.session_state.get(f"{PREFIX}_waiting") is not None or loaders.load_samples(rt.store)["pending"]
    st.fragment(run_every=2 if waiting else None)(page.guarded(render_pending))(rt)
    m = loaders.load_samples_screen(rt.store, rt.config)
    latest = m.batch
    if not latest:
        st.info(
            "No sample yet: press Re-sample to draw completions uniformly from the shards."
            if rt.collector
            else "No sample yet, and the collector is off in this process."
        )
        return
    for node, err in (latest.get("errors") or {}).items():
        st.warning(md_escape(f"{node}: could not sample: {err}"))
    samples = latest["samples"]
    drawn = latest.get("done_unix")
    st.caption(
        f"Batch {latest['batch']}: {len(samples)} of {latest['population'] or 0:,} completions, drawn uniformly"
        + (f" at {fmt_clock(drawn)}." if drawn else ".")
    )
    if not samples:
        st.info("The last sample came back empty (see the errors above, or the shards hold no complete lines).")
        return
    page.live(rt, render_rates, rt, latest["batch"])
    render_table(samples, m.never_answered)


def render_table(samples: list[StoredSample], never: list[StoredSample]) -> None:
    """The sample as a table, one picked sample in full below it, and the CSV download."""
    left, right = st.columns(2)
    only_cut = left.toggle("Truncated only", key=f"{PREFIX}_truncated_only")
    only_never = right.toggle(
        "Never answered only", key=f"{PREFIX}_never_answered_only", help="cut at the ceiling, answer empty: " + RULE
    )
    shown = [s for s in samples if s["finish_reason"] == "length"] if only_cut else samples
    keys = {sample_key(s) for s in never}
    if only_never:
        shown = [s for s in shown if sample_key(s) in keys]
    table = [
        {
            "node": s["node"],
            "shard": (s["path"] or "").rsplit("/", 1)[-1],
            "line": fmt_count(s["line_no"]),
            "tokens": fmt_count(s["tokens"]),
            "finish reason": s["finish_reason"],
            "loop?": "loop" if s.get("is_loop") else "",
            "answer": "never answered" if sample_key(s) in keys else "",
        }
        for s in shown
    ]
    st.dataframe(table, hide_index=True, width="stretch", height=300)
    if shown:
        first_cut = next((i for i, s in enumerate(shown) if s["finish_reason"] == "length"), 0)
        pick = st.selectbox(
            "Read one",
            range(len(shown)),
            index=first_cut,
            format_func=lambda i: label(shown[i]),
            key=f"{PREFIX}_pick_select",
        )
        cards.render_sample(shown[pick])
    page.download_csv(tables.samples_export(shown), "samples.csv", PREFIX)
