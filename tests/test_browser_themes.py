"""Every screen in both themes, plain and kiosk, in a real headless Chromium: readable and offline.

Reuses the demo server and Chromium of tests/test_browser.py (session fixtures in conftest.py).
Each screen is opened in four tabs at once (light and dark, each plain and with ?kiosk=1) to
keep the whole sweep short; the context aborts and records every request for a host other
than 127.0.0.1 (many clusters have no internet: a fetch from a public font host failed there).
Every visible text element of the page is measured against what it is drawn on (WCAG AA,
4.5:1, tests/test_browser.py's CONTRAST_JS), and every table's canvas (st.dataframe draws its
cells on a canvas, out of the DOM's reach) is read from a screenshot: light in the light theme,
dark in the dark one.
Screenshots at 1920x1080 go to tests/artifacts/.
"""

from __future__ import annotations

import io
from urllib.parse import urlparse

import pytest
from test_browser import ARTIFACTS, CONTRAST_JS, PAGES, wait_for_demo_data

pytestmark = pytest.mark.browser

WALL = {"width": 1920, "height": 1080}
# name -> query string: both themes (dark is the default), plain and kiosk (#32 item 2), each
# screen's four tabs opened at once to keep the sweep near a minute and a half on two cores.
MODES = {
    "light": "?theme=light",
    "light_kiosk": "?theme=light&kiosk=1&rotate=0",
    "dark": "",
    "dark_kiosk": "?kiosk=1&rotate=0",
}
AA = 4.5


def _open_all(context, url: str, name: str) -> dict:
    """One tab per mode on screen `name`, loading in parallel; returns them once each has drawn."""
    tabs = {}
    for mode, query in MODES.items():
        tab = context.new_page()
        tab.goto(f"{url}/{PAGES[name]}{query}", wait_until="commit")
        tabs[mode] = tab
    for tab in tabs.values():
        tab.wait_for_selector("h1", timeout=60_000)
        tab.wait_for_function("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0", timeout=60_000)
    tabs[next(iter(tabs))].wait_for_timeout(1500)  # fragments' first runs, grids' lazy chunk
    return tabs


def _table_background_luminance(tab) -> list[float]:
    """The commonest pixel colour's relative luminance of each st.dataframe on screen (its cells'
    background: the grid is a canvas, so read from a screenshot)."""
    from PIL import Image

    out = []
    for grid in tab.locator('[data-testid="stDataFrame"]').all():
        box = grid.bounding_box()
        if not box or box["width"] < 10 or box["height"] < 10 or box["y"] > WALL["height"]:
            continue
        image = Image.open(io.BytesIO(grid.screenshot())).convert("RGB")
        (_count, colour) = max(image.getcolors(maxcolors=1 << 20))
        lin = [(v / 255 / 12.92) if v <= 10 else ((v / 255 + 0.055) / 1.055) ** 2.4 for v in colour]
        out.append(0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2])
    return out


TRACKS_JS = """() => Array.from(document.querySelectorAll('[data-testid="stProgressBarTrack"]')).map(el => {
  const [r, g, b] = getComputedStyle(el).backgroundColor.match(/[\\d.]+/g).map(Number).map(v => v / 255)
    .map(v => v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
})"""


def test_every_screen_is_readable_in_both_themes_and_fetches_nothing_from_outside(server_url, browser_page):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    wait_for_demo_data(browser_page, server_url)  # the demo has numbers: every page draws its parts
    context = browser_page.context.browser.new_context(viewport=WALL)
    outside: list[str] = []

    def only_local(route) -> None:
        if urlparse(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_local)
    poor, grids = [], []
    try:
        for name in PAGES:
            tabs = _open_all(context, server_url, name)
            for mode, tab in tabs.items():
                where = f"{name} {mode}"
                assert tab.locator('[data-testid="stException"]').count() == 0, where
                tab.screenshot(path=str(ARTIFACTS / f"wall_{name}_{mode}.png"))
                texts = tab.evaluate(CONTRAST_JS, '[data-testid="stApp"] *')
                assert len(texts) >= 3, (where, texts)  # a kiosk part holds little text
                poor += [
                    f"{where}: {t['ratio']:.2f} {t['tag']} {t['text']!r}: {t['fg']} on {t['bg']}"
                    for t in texts
                    if t["ratio"] < AA
                ]
                grids += [f"{where}: table background luminance {y:.2f}" for y in _table_background_luminance(tab)]
                # A progress bar's empty track drawn near-black on the light page read as a full bar.
                tracks = tab.evaluate(TRACKS_JS)
                grids += [f"{where}: progress track luminance {y:.2f}" for y in tracks]
                tab.close()
    finally:
        context.close()
    assert not outside, f"requests leaving 127.0.0.1: {sorted(set(outside))}"
    assert not poor, f"{len(poor)} text elements under {AA}:1\n" + "\n".join(poor)

    def wrong(g: str) -> bool:  # a light table in the dark theme is as unreadable a wall as the reverse
        y = float(g.rsplit(" ", 1)[1])
        return y < 0.7 if " light" in g else y > 0.2

    assert grids and not [g for g in grids if wrong(g)], "\n".join(g for g in grids if wrong(g))


# Every element of the GPUs page's node selector whose own box is drawn: its background and text.
SELECT_STYLES_JS = """() => {
  const box = document.querySelector('[data-testid="stMultiSelect"]');
  if (!box) return null;
  return Array.from(box.querySelectorAll('*')).filter(e => e.getBoundingClientRect().height > 0).map(e => {
    const s = getComputedStyle(e);
    return {tag: e.tagName, id: e.getAttribute('data-baseweb') || e.getAttribute('data-testid') || '',
            bg: s.backgroundColor, color: s.color, fill: s.webkitTextFillColor,
            text: e.children.length ? '' : (e.innerText || '').slice(0, 30)};  // text drawn by this element
  });
}"""


def _luminance(css: str) -> float | None:
    """The relative luminance of a CSS rgb()/rgba() colour; None when fully transparent."""
    import re

    parts = [float(x) for x in re.findall(r"[\d.]+", css)]
    if len(parts) == 4 and parts[3] == 0:
        return None
    lin = [(v / 255 / 12.92) if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4 for v in parts[:3]]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_the_light_themes_gpu_node_selector_is_light_with_dark_text(server_url, browser_page):
    """#41: with ?theme=light the GPUs page's node selector was a black box with dark text.
    Chromium's computed style of every drawn part of it: no dark background anywhere in it, and
    its text dark on it."""
    wait_for_demo_data(browser_page, server_url)
    tab = browser_page
    tab.goto(f"{server_url}/{PAGES['gpus']}?theme=light", wait_until="commit")
    tab.wait_for_selector('[data-testid="stMultiSelect"]', timeout=60_000)
    tab.wait_for_timeout(1000)
    styles = tab.evaluate(SELECT_STYLES_JS)
    tab.locator('[data-testid="stMultiSelect"]').screenshot(path=str(ARTIFACTS / "light-gpus-node-select.png"))
    assert styles, "no node selector"
    dark = [s for s in styles if (lum := _luminance(s["bg"])) is not None and lum < 0.5]
    assert not dark, dark
    texts = [s for s in styles if s["text"].strip()]
    assert texts and all((_luminance(s["color"]) or 0) < 0.1 for s in texts), texts
