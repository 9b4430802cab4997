"""Issue #15 in real headless Chromium: pages stay live unattended, a stall is caught, kiosk mode.

Reuses the demo server and page helpers of tests/test_browser.py. The stall and config-typo
tests run their own dashboard over a local shard that a thread of this test writes.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import shardgen
import store_fixtures
from store_fixtures import write_reply
from test_browser import (
    ARTIFACTS,
    VIEWPORT,
    open_page,
    park,
    parse_number,
    streamlit_server,
    tile_value,
    wait_for_demo_data,
)

pytestmark = pytest.mark.browser
DEMO_INTERVAL_S = 5.0
ASOF = re.compile(r"Numbers as of (\d\d:\d\d:\d\d)")


def as_of(page) -> str:
    """The clock of the page's 'Numbers as of HH:MM:SS' line."""
    text = page.get_by_text(ASOF).first.inner_text(timeout=60_000)
    return ASOF.search(text).group(1)


def wait_until_changed(read, before: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    now = read()
    while now == before and time.monotonic() < deadline:
        time.sleep(1.0)
        now = read()
    return now


def test_every_page_refreshes_by_itself(server_url, browser_page):
    """Left open for two collection intervals, every page's numbers move as the demo writes. The
    pages are open side by side, one tab each, and waited on together (one after the other took
    four times the waiting, ~27 s of the browser worker's time)."""
    wait_for_demo_data(browser_page, server_url)
    park(browser_page)
    checks = {"overview": r"^Completions$", "lengths": r"^Truncated$", "gpus": None, "nodes": None}
    context = browser_page.context.browser.new_context(viewport=VIEWPORT)
    try:
        tabs = {name: context.new_page() for name in checks}
        for name, tab in tabs.items():
            open_page(tab, server_url, name)

        def tile(name: str) -> str | None:
            if checks[name] is None:
                return None
            label = tabs[name].locator(".rh-label", has_text=re.compile(checks[name]))
            return tabs[name].locator(".rh-tile", has=label).first.inner_text()

        first = {name: (as_of(tab), tile(name)) for name, tab in tabs.items()}
        # Polled, not a fixed wait: the clock moves with the next collection (an interval or two).
        # Page payloads are recomputed behind the polls (at most once an interval, in the
        # collector's background thread): on a busy machine a tile may trail the clock by one.
        deadline, moved = time.monotonic() + 6 * DEMO_INTERVAL_S + 5, set()
        while len(moved) < len(tabs) and time.monotonic() < deadline:
            browser_page.wait_for_timeout(1000)
            for name, tab in tabs.items():
                clock, value = first[name]
                if name not in moved and as_of(tab) != clock and (value is None or tile(name) != value):
                    moved.add(name)
        assert moved == set(tabs), {name: first[name] for name in tabs if name not in moved}
        for name, tab in tabs.items():
            assert tab.locator('[data-testid="stException"]').count() == 0, name
    finally:
        context.close()


def test_kiosk_mode_at_1920x1080(server_url, browser_page):
    """No sidebar, no chrome, sub-lines >= 20 px; screenshotted for a person to look at."""
    park(browser_page)  # the last test's live screen would redraw beside this one
    page = browser_page.context.browser.new_page(viewport={"width": 1920, "height": 1080})
    try:
        page.goto(f"{server_url}/?kiosk=1&rotate=0", wait_until="domcontentloaded")
        page.wait_for_selector("h1", timeout=60_000)
        tile_value(page, "Tokens / s")
        tile_value(page, r"^Truncated$")
        page.wait_for_timeout(1500)
        assert not page.locator('[data-testid="stSidebar"]').is_visible()
        assert not page.locator('header[data-testid="stHeader"]').is_visible()
        px = page.eval_on_selector(".rh-sub", "e => parseFloat(getComputedStyle(e).fontSize)")
        assert px >= 20, px
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "kiosk.png"))
        # Rotation: Overview -> Output lengths after rotate seconds, kiosk and the named run kept.
        page.goto(f"{server_url}/?kiosk=1&rotate=4&run=demo-4096", wait_until="domcontentloaded")
        page.wait_for_url(
            re.compile(r"Output_lengths\?(?=.*kiosk=1)(?=.*run=demo-4096)"), timeout=60_000
        )  # two parts of 4 s; slack for a loaded CI
        page.get_by_text("Run: demo-4096 · finished").first.wait_for(timeout=30_000)
        page.wait_for_url(re.compile(r"GPUs\?(?=.*kiosk=1)(?=.*run=demo-4096)"), timeout=30_000)
    finally:
        page.close()


class ShardWriter:
    """A generation script stand-in: appends completions to one local shard until stopped."""

    def __init__(self, path: Path):
        self.path, self._stop = path, threading.Event()
        shardgen.write_shard(path, shardgen.truth_rows(200, seed=1))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seed = 2
        while not self._stop.wait(0.3):
            shardgen.write_shard(self.path, shardgen.truth_rows(5, seed=seed), mode="a")
            seed += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_stopping_the_writer_raises_no_new_completions(browser_page):
    with tempfile.TemporaryDirectory(prefix="runhealth-stall-") as tmp:
        tmp_path = Path(tmp)
        writer = ShardWriter(tmp_path / "out-0.jsonl")
        config = tmp_path / "runhealth.toml"
        config.write_text(
            f'[run]\nname = "stall-test"\ninterval_s = 1\nstall_after_s = 6\nstore_path = "{tmp_path / "s.sqlite3"}"\n\n'
            f'[[nodes]]\nname = "node-1"\nhost = "local"\nshards = ["{tmp_path}/out-*.jsonl"]\n'
            f'python = "{sys.executable}"\ngpu = "off"\n',
            encoding="utf-8",
        )
        try:
            with streamlit_server(tmp_path, extra_env={"RUNHEALTH_CONFIG": str(config)}) as url:
                page = browser_page.context.browser.new_page(viewport={"width": 1600, "height": 1000})
                open_page(page, url, "overview")
                assert parse_number(tile_value(page, "Tokens / s", ready=lambda v: v not in ("—", "", "0"))) > 0
                assert page.get_by_text("no new completions").count() == 0
                writer.stop()
                stopped = time.time()
                page.get_by_text(re.compile("no new completions from any node since")).first.wait_for(timeout=40_000)
                waited = time.time() - stopped
                assert waited >= 5, waited  # not before stall_after_s
                page.screenshot(path=str(ARTIFACTS / "stall.png"))
                page.close()
        finally:
            writer.stop()


def config_text(tmp_path: Path, extra: str = "") -> str:
    return (
        f'[run]\nname = "typo-test"\ninterval_s = 1\nstore_path = "{tmp_path / "t.sqlite3"}"\n{extra}\n'
        f'[[nodes]]\nname = "node-1"\nhost = "local"\nshards = ["{tmp_path}/out-*.jsonl"]\n'
        f'python = "{sys.executable}"\ngpu = "off"\n'
    )


def rewrite(path: Path, text: str) -> None:
    """Write and move the mtime on by a second (a coarse-mtime file system sees the change too)."""
    stamp = path.stat().st_mtime_ns + 10**9
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(stamp, stamp))


def completions(page) -> int:
    return int(parse_number(tile_value(page, r"^Completions$", ready=lambda v: v not in ("—", "", "0"))))


def wait_for_more(page, before: int, timeout_s: float = 30) -> int:
    deadline, now = time.monotonic() + timeout_s, before
    while now <= before and time.monotonic() < deadline:
        page.wait_for_timeout(500)
        now = completions(page)
    return now


def test_a_config_typo_shows_a_banner_while_numbers_keep_advancing(browser_page):
    """Issue 24 item 1: typo -> banner on the page (kiosk too, large) and in the log, the last
    good config keeps collecting; fix -> banner gone."""
    with tempfile.TemporaryDirectory(prefix="runhealth-typo-") as tmp:
        tmp_path = Path(tmp)
        writer = ShardWriter(tmp_path / "out-0.jsonl")
        config = tmp_path / "runhealth.toml"
        config.write_text(config_text(tmp_path), encoding="utf-8")
        try:
            with streamlit_server(tmp_path, extra_env={"RUNHEALTH_CONFIG": str(config)}) as url:
                page = browser_page.context.browser.new_page(viewport={"width": 1600, "height": 1000})
                open_page(page, url, "overview")
                before = completions(page)
                rewrite(config, config_text(tmp_path, 'colour = "red"'))  # an unknown key
                banner = page.locator(".rh-config-banner")
                banner.wait_for(timeout=30_000)  # the sidebar's 5 s check reruns the page
                assert "colour" in banner.inner_text() and str(config) in banner.inner_text()
                counted = wait_for_more(page, completions(page))
                assert counted > before, "numbers stopped advancing under the banner"
                kiosk = browser_page.context.browser.new_page(viewport={"width": 1920, "height": 1080})
                kiosk.goto(f"{url}/?kiosk=1&rotate=0", wait_until="domcontentloaded")
                kiosk.locator(".rh-config-banner").wait_for(timeout=60_000)
                px = kiosk.eval_on_selector(".rh-config-banner", "e => parseFloat(getComputedStyle(e).fontSize)")
                assert px >= 28, px  # read from across the room
                kiosk.screenshot(path=str(ARTIFACTS / "config-typo-kiosk.png"))
                kiosk.close()
                rewrite(config, config_text(tmp_path))
                banner.wait_for(state="detached", timeout=30_000)
                assert wait_for_more(page, completions(page)) > counted
                page.close()
            log = (tmp_path / "streamlit.log").read_text(errors="replace")
            assert "does not load, still collecting with the previous one" in log and "colour" in log, log
        finally:
            writer.stop()


class LiveDraws:
    """Each redraw of a page's live part as Chromium receives it: the "Numbers as of" line's
    delta, a markdown or, once stale, an alert (one per run of the live fragment: the Overview draws it in its fragment, the other
    pages' live parts above their numbers), with the monotonic time it arrived."""

    def __init__(self, page, needle: str = "Numbers as of"):
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        self.seen: list[tuple[float, str]] = []

        def frame(data) -> None:
            msg = ForwardMsg.FromString(bytes(data) if not isinstance(data, str) else data.encode())
            if msg.WhichOneof("type") != "delta" or not msg.delta.HasField("new_element"):
                return
            element = msg.delta.new_element  # markdown; an alert (st.error) once the numbers are stale
            body = getattr(getattr(element, element.WhichOneof("type") or "markdown"), "body", "")
            if isinstance(body, str) and needle in body:
                self.seen.append((time.monotonic(), body))

        page.on("websocket", lambda ws: ws.on("framereceived", frame))

    def since(self, t: float) -> list[str]:
        return [body for at, body in self.seen if at >= t]

    def first_with(self, text: str, t: float) -> float | None:
        return next((at for at, body in self.seen if at >= t and text in body), None)


# Tabs left open on one dashboard: two Overviews (two sessions of one page) and the Nodes page.
IDLE_TABS = ("overview", "overview", "nodes")
LIVE_INTERVAL_S = 15.0  # the run's interval: the live parts' own timer (long: most of it free of ticks)


def test_open_pages_show_a_publication_before_their_tick_and_only_tick_while_idle(browser_page, tmp_path):
    """#42 item 2: a new publication (a round of polls, then the Overview the collector publishes
    after it) is pushed to every open tab, though the tabs' own timer ticks only every 15 s: a tab
    is judged on a publication made when its tick was not due within 5 s, and must show it at
    least 1 s before that tick could have. How soon is measured, not asserted per publication
    (bench/browser.py: 0.17-0.27 s median): here the median over every judged publication is
    under 1.5 s (a loaded CI machine gets margin; one publication took 2.1 s at load 7). Before
    that, each tab's browser has ticked its live part once (a tab is pushed only then:
    components/livewatch.py); while nothing is published the tabs redraw on their tick alone, as
    without the watcher; a tab redraws once for a publication, not once per watcher look or per
    tab; and the sidebar's "Last collection" line, whose own tick is every 5 s, names the
    publication's poll with the page's numbers (pushed with them, one request: the median of its
    lag behind them under 1 s)."""
    from runhealth.screens import published
    from runhealth.settings.config import load_config

    store, _ = store_fixtures.make_store(tmp_path, "healthy")
    config = store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3", interval_s=LIVE_INTERVAL_S)
    cfg = load_config(config)
    published.publish(store, cfg)  # what a running collector has written before a viewer opens the page
    env = {"RUNHEALTH_CONFIG": str(config)}
    with streamlit_server(tmp_path, extra_env=env, collect=False) as url:
        context = browser_page.context.browser.new_context(viewport={"width": 1600, "height": 1000})
        try:
            tabs = [context.new_page() for _ in IDLE_TABS]
            draws = [LiveDraws(tab) for tab in tabs]
            sidebars = [LiveDraws(tab, "Last collection") for tab in tabs]  # its own 5 s tick
            for tab, name in zip(tabs, IDLE_TABS, strict=True):
                open_page(tab, url, name)
            first = as_of(tabs[0])
            deadline = time.monotonic() + 4 * LIVE_INTERVAL_S  # each tab's first tick (late under load)
            while any(len(d.seen) < 2 for d in draws):
                assert time.monotonic() < deadline, [len(d.seen) for d in draws]
                tabs[0].wait_for_timeout(200)
            quiet = time.monotonic()
            tabs[0].wait_for_timeout(int(LIVE_INTERVAL_S * 1000))  # nothing published: ticks alone
            for d in draws:
                ats = [at for at, _ in d.seen if at >= quiet - LIVE_INTERVAL_S]
                gaps = [round(b - a, 2) for a, b in zip(ats, ats[1:], strict=False)]
                assert all(g > LIVE_INTERVAL_S - 2 for g in gaps), f"redrawn between ticks while idle: {gaps}"
            # Publications 3.7 s apart, three at least, more (eight at most) until every tab is judged
            # on one: a tab whose tick is due within 5 s of one (or just ticked) is not judged on it.
            judged: list[list[tuple[float, int, float]]] = [[] for _ in tabs]
            pushed: list[tuple[float, str]] = []  # each publication: when written (monotonic), its clock
            sidebar_lags: list[float] = []
            shown_clock = first
            for n in range(8):
                if n >= 3 and all(judged):
                    break
                while time.strftime("%H:%M:%S", time.localtime()) == shown_clock:  # a clock not shown yet
                    time.sleep(0.1)
                # Since each tab's last tick: its last redraw that is not the first to show an earlier
                # publication (a tick that showed one first is taken for its push: its tick is then
                # thought due sooner than it is, never later).
                firsts = [{d.first_with(f"Numbers as of {c}", w) for w, c in pushed} for d in draws]
                ticks = [[t for t, _ in d.seen if t not in first] for d, first in zip(draws, firsts, strict=True)]
                since = [time.monotonic() - t[-1] for t in ticks]
                now = time.time()
                for node in ("node-1", "node-2", "node-3", "node-4"):  # a round of polls, then its publication
                    write_reply(store, node, store_fixtures.poll_reply(now, [], {}), now, rtt_ms=5.0)
                published.publish(store, cfg, time.time())
                written, clock = time.monotonic(), time.strftime("%H:%M:%S", time.localtime(now))
                pushed.append((written, clock))
                for tab in tabs:
                    tab.get_by_text(f"Numbers as of {clock}").first.wait_for(timeout=20_000)
                tabs[0].wait_for_timeout(max(0, int((written + 3.7 - time.monotonic()) * 1000)))
                for d, side in zip(draws, sidebars, strict=True):  # the same poll, pushed with the page
                    at = d.first_with(f"Numbers as of {clock}", written)
                    line = side.first_with(f"Last collection {clock}", written)
                    sidebar_lags.append(round(line - at, 2) if at is not None and line is not None else 99.0)
                for i, d in enumerate(draws):
                    due = LIVE_INTERVAL_S - since[i]  # its own tick, this long after the publication
                    if since[i] >= 0.3 and due >= 5:  # no tick in flight, none due for 5 s
                        at = d.first_with(f"Numbers as of {clock}", written)
                        lag = round(at - written, 2) if at is not None else 99.0
                        redraws = [t for t, _ in d.seen if written <= t <= written + min(lag, due) + 1.0]
                        judged[i].append((lag, len(redraws), round(due, 1)))
                shown_clock = clock
            assert all(judged), f"a tab never judged (ticks due at every publication): {judged}"
            report = f"publication -> screen s (lag, redraws, its tick due) per tab: {judged}"
            assert all(lag < due - 1 for j in judged for lag, _, due in j), f"shown by its tick, not pushed: {report}"
            assert statistics.median(lag for j in judged for lag, _, _ in j) < 1.5, report
            assert all(n == 1 for j in judged for _, n, _ in j), f"one redraw per publication: {report}"
            # Every publication, every tab: asked in the live part's request, it runs just before
            # it (-0.2-0.0 s here; queued after it, it waited for the live part's whole run: 1.5-2.8 s
            # at load 9; asked at a later look once that run was over, 3.5 s after the publication).
            # By its own 5 s tick alone it comes 2.5 s after the page's numbers on average, under
            # 1 s 1 time in 5: a median of nine under 1 s, ~2%. The median, as for the page's lag:
            # one tab's line once came 2.0 s after its numbers (likely: the tab's own tick of its
            # live part drew them, and the line, asked alone, waited for the rest of that run; not
            # verified).
            assert statistics.median(sidebar_lags) < 1.0, (
                f"page's numbers -> sidebar's Last collection s: {sidebar_lags}"
            )
            print(report, f"; page's numbers -> sidebar s: {sidebar_lags}")
        finally:
            context.close()
            store.close()
