"""Every kiosk screen (?kiosk=1, each part) fits a 1920x1080 wall in a real headless Chromium,
readable and offline in the dark theme (a wall's default; the light one and the plain screens:
tests/test_browser_themes.py, whose checks these are).

A wall never scrolls, so what is below the fold is never seen: the Streamlit main container
(it scrolls, not the window) must be no taller than the screen, and each screen's key part (the
tiles, the throughput chart, GPUs now, the length histogram, the what-if, the node table) must
lie inside the viewport, drawn. One tab per screen, loading in parallel (the demo server and
Chromium of tests/test_browser.py, session fixtures in conftest.py). Screenshots go to
tests/artifacts/kiosk-<screen>.png to be looked at.
"""

from __future__ import annotations

import time

import pytest
from test_browser import ARTIFACTS, PAGES, park, wait_for_demo_data
from test_browser_themes import Outside, check_readable, readability

pytestmark = pytest.mark.browser

WALL = {"width": 1920, "height": 1080}
# screen -> (page, part, plotly titles that must be drawn inside the viewport, other selectors)
SCREENS = {
    "overview-1": ("overview", 1, [], [".rh-tile"]),
    "overview-2": ("overview", 2, ["Throughput", "GPUs now"], ['[data-testid="stDataFrame"]']),
    "lengths-1": ("lengths", 1, ["Output length", "Cumulative"], [".rh-tile"]),
    "lengths-2": ("lengths", 2, ["What if max_tokens were raised?", "Truncated over time"], [".rh-tile"]),
    "gpus": ("gpus", 1, ["GPUs now", "Utilization", "Power"], []),
    "nodes": ("nodes", 1, [], ['[data-testid="stDataFrame"]']),
    # Not in the rotation, but a wall can be pointed at it: 2,000 px tall on main (#41); its verdict
    # only, and it says where the rest is.
    "compare": ("compare", 1, [], []),
}
HEIGHTS_JS = """() => {
  const main = document.querySelector('[data-testid="stMain"]');
  let bottom = 0;
  for (const e of document.querySelectorAll('[data-testid="stMainBlockContainer"] [data-testid="stElementContainer"]')) {
    const r = e.getBoundingClientRect();
    if (r.height > 0) bottom = Math.max(bottom, r.bottom);
  }
  return {scroll: main.scrollHeight, client: main.clientHeight, content: bottom};
}"""
# A plotly chart whose title matches, once it has drawn its data (a heatmap's cells are an image).
DRAWN_JS = """(title) => {
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    const t = plot.querySelector('.gtitle');
    if (!t || !t.textContent.includes(title)) continue;
    const r = plot.getBoundingClientRect();
    const drawn = plot.querySelectorAll('.hm image, .scatterlayer path.js-line, .barlayer path, .scatterlayer path.js-fill').length;
    return {top: r.top, bottom: r.bottom, drawn};
  }
  return null;
}"""


def wait_drawn(tab, title: str, timeout_s: float) -> dict:
    deadline, got = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        got = tab.evaluate(DRAWN_JS, title)
        if got and got["drawn"]:
            return got
        tab.wait_for_timeout(500)
    raise AssertionError(f"chart {title!r} not drawn after {timeout_s:.0f} s: {got}")


def test_every_kiosk_screen_fits_1920x1080_with_its_key_part_in_view(server_url, browser_page):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    wait_for_demo_data(browser_page, server_url)  # the demo has numbers: every screen draws its parts
    # The throughput chart needs two complete 30 s buckets after the first scan: wait for the
    # demo's history here, once (a session server that ran other tests already has it).
    browser_page.goto(f"{server_url}/?kiosk=1&rotate=0&part=2", wait_until="domcontentloaded")
    wait_drawn(browser_page, "Throughput", 150)
    park(browser_page)  # a live screen left open redraws through the whole check
    context = browser_page.context.browser.new_context(viewport=WALL)
    outside = Outside(context)
    poor, grids = [], []
    try:
        tabs = {}
        for screen, (name, part, _charts, _parts) in SCREENS.items():
            tab = context.new_page()
            tab.goto(f"{server_url}/{PAGES[name]}?kiosk=1&rotate=0&part={part}", wait_until="commit")
            tabs[screen] = tab
        opened = time.monotonic()
        problems = []
        for screen, tab in tabs.items():
            _name, _part, charts, parts = SCREENS[screen]
            try:
                tab.wait_for_selector("h1", timeout=120_000)  # seven screens opened at once, on two cores
            except Exception as exc:  # which screen, and what it shows instead (seen in CI only)
                tab.screenshot(path=str(ARTIFACTS / f"kiosk-{screen}-no-heading.png"))
                shown = tab.evaluate("() => document.body ? document.body.innerText.slice(0, 400) : ''")
                raise AssertionError(
                    f"{screen}: no heading {time.monotonic() - opened:.0f} s after opening; shows {shown!r}"
                ) from exc
            tab.wait_for_function("!document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=60_000)
            # Bounded: a chart still blank 30 s after the tabs opened (seen once on the GPUs page,
            # blank for good) fails here; 30 s, not 15: every screen's tab, Compare's too, loads at
            # once beside the other pytest-xdist workers.
            for title in charts:
                box = wait_drawn(tab, title, max(1.0, 30 - (time.monotonic() - opened)))
                if box["top"] < 0 or box["bottom"] > WALL["height"]:
                    problems.append(f"{screen}: chart {title!r} outside the screen: {box}")
            for selector in parts:
                for el in tab.locator(selector).all():
                    b = el.bounding_box()
                    if not b or b["y"] < 0 or b["y"] + b["height"] > WALL["height"]:
                        problems.append(f"{screen}: {selector} outside the screen: {b}")
            assert tab.locator('[data-testid="stException"]').count() == 0, screen
            tab.locator(".rh-kiosk-left-out").wait_for(timeout=20_000)  # says what it leaves out, last
            heights = tab.evaluate(HEIGHTS_JS)
            if heights["scroll"] > WALL["height"] or heights["content"] > WALL["height"]:
                problems.append(f"{screen}: taller than the wall: {heights}")
            tab.screenshot(path=str(ARTIFACTS / f"kiosk-{screen}.png"))
            more_poor, more_grids = readability(tab, f"kiosk {screen} dark")
            poor += more_poor
            grids += more_grids
        main = tabs["gpus"].locator('[data-testid="stMain"]')  # (the hidden sidebar keeps its run picker)
        assert main.locator('[data-testid="stSelectbox"], [data-testid="stMultiSelect"]').count() == 0
        assert not problems, "\n".join(problems)
    finally:
        context.close()
    outside.check()
    assert grids, "no table or progress track on any kiosk screen"
    check_readable(poor, grids)
