"""The demo dashboard in a real headless Chromium (Playwright), as a person at standup sees it.

A session fixture starts `runhealth dashboard` (`streamlit run app.py` underneath) with no config (the built-in demo, its data
isolated under a temporary XDG_CACHE_HOME), logging to a file rather than a pipe (a full pipe
would stall the server), and polls /_stcore/health; if it never gets healthy the log is
dumped into the failure. Chromium is the system one: never `playwright install`. The helpers
here are reused by scripts/screenshots.py to regenerate docs/overview.png and docs/lengths.png.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGES = {
    "overview": "",
    "lengths": "Output_lengths",
    "gpus": "GPUs",
    "samples": "Samples",
    "nodes": "Nodes",
    "compare": "Compare",
}
VIEWPORT = {"width": 1600, "height": 1000}

pytestmark = pytest.mark.browser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(
    workdir: Path, startup_s: float = 60, extra_env: dict[str, str] | None = None, collect: bool = True
):
    """Run the demo app (or, with RUNHEALTH_CONFIG in `extra_env`, that run); yields its base
    URL. collect=False: `--no-collect`, a viewer of the stores as they are. The server log is
    dumped if it does not start."""
    port, log_path = free_port(), workdir / "streamlit.log"
    env = {k: v for k, v in os.environ.items() if k not in ("RUNHEALTH_CONFIG", "RUNHEALTH_COLLECTOR")}
    # PYTHONPATH: `runhealth` importable even where the checkout is not installed.
    env.update(XDG_CACHE_HOME=str(workdir / "cache"), PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), **(extra_env or {}))
    with open(log_path, "wb") as log:
        # What a user runs, from a folder with no runhealth.toml in it: the demo.
        proc = subprocess.Popen(
            [sys.executable, "-m", "runhealth", "dashboard", "--port", str(port)]
            + ([] if collect else ["--no-collect"]),
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"streamlit did not start (exit {proc.poll()}); log:\n{log_path.read_text(errors='replace')}"
                )
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def launch_chromium(playwright):
    if not Path(CHROMIUM).exists():
        pytest.fail("install chromium: apt-get install -y chromium")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def open_page(page, url: str, name: str, timeout_ms: int = 60_000) -> None:
    """Go to a screen and wait until it has drawn: app container up, skeletons gone, title shown."""
    page.goto(f"{url}/{PAGES[name]}", wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stAppViewContainer"]', timeout=timeout_ms)
    page.wait_for_selector("h1", timeout=timeout_ms)
    page.wait_for_function("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0", timeout=timeout_ms)


def tile_value(page, label_regex: str, timeout_ms: int = 90_000, ready=lambda v: v not in ("—", "")) -> str:
    """The big number of the tile whose label matches, once it holds a real value."""
    deadline = time.monotonic() + timeout_ms / 1000
    loc = page.locator(".rh-tile", has=page.locator(".rh-label", has_text=re.compile(label_regex))).locator(".rh-value")
    value = ""
    while time.monotonic() < deadline:
        if loc.count():
            value = loc.first.inner_text().strip()
            if ready(value):
                return value
        page.wait_for_timeout(1000)
    raise AssertionError(f"tile {label_regex!r} never got a value (last: {value!r})")


def park(page) -> None:
    """Leave a live screen for a blank page: a screen left open keeps rerunning its live parts (the
    server's script runs, Chromium's redraws) while a test works in other tabs, on two cores."""
    page.goto("about:blank")


def tall_screenshot(page, path: Path, height: int = 3600) -> None:
    """Streamlit scrolls inside its own container, so full_page misses the bottom: grow the viewport."""
    page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
    page.wait_for_timeout(2500)
    page.screenshot(path=str(path))
    page.set_viewport_size(VIEWPORT)


def parse_number(text: str) -> float:
    m = re.search(r"([\d,.]+)\s*([KM]?)", text)
    assert m, text
    return float(m.group(1).replace(",", "")) * {"": 1, "K": 1e3, "M": 1e6}[m.group(2)]


def wait_for_demo_data(page, url: str) -> tuple[str, str]:
    """Open the Overview and wait until truncation and throughput have real numbers."""
    open_page(page, url, "overview")
    trunc = tile_value(page, r"^Truncated$")
    tps = tile_value(page, "Tokens / s")
    return trunc, tps


def test_every_screen_shows_sane_numbers(server_url, browser_page):
    page = browser_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    trunc, tps = wait_for_demo_data(page, server_url)
    assert 0.8 <= parse_number(trunc) <= 4.0, trunc  # the live demo run: the 8,192 relaunch, ~2.1% cut
    assert parse_number(tps) > 0, tps
    assert page.get_by_text("DEMO — simulated run").count() >= 1
    page.screenshot(path=str(ARTIFACTS / "overview.png"))
    for name, expect in [
        ("lengths", "What if max_tokens were raised?"),
        ("gpus", "simulated"),
        ("nodes", "Effective configuration (secrets never shown)"),
    ]:
        open_page(page, server_url, name)
        page.get_by_text(expect).first.wait_for(timeout=60_000)
        assert page.locator('[data-testid="stException"]').count() == 0, name
        tall_screenshot(page, ARTIFACTS / f"{name}.png")
    open_page(page, server_url, "lengths")
    assert 0.8 <= parse_number(tile_value(page, r"^Truncated$")) <= 4.0
    # A link that names the run opens it (the finished 4,096 run: ~18% cut), and keeps it in the URL.
    page.goto(f"{server_url}/Output_lengths?run=demo-4096", wait_until="domcontentloaded")
    page.get_by_text("Run: demo-4096 · finished").first.wait_for(timeout=60_000)
    assert 15.0 <= parse_number(tile_value(page, r"^Truncated$")) <= 21.0
    assert "run=demo-4096" in page.url


def compare_headline(page, url: str, timeout_ms: int = 120_000) -> str:
    """Open the Compare page and return its "B vs A" sentence once both runs have numbers."""
    open_page(page, url, "compare", timeout_ms)
    head = page.locator("h3", has_text=re.compile(r"^At 8,192: .*tok/s per GPU"))  # once B has a rate
    head.first.wait_for(timeout=timeout_ms)
    return head.first.inner_text().strip()


def test_compare_page_shows_the_relaunch_against_the_seed_run(server_url, browser_page):
    """The demo's finished 4,096 run against its live 8,192 relaunch, numbers within the
    simulator's truth (18.1% and 2.1% cut), the forecast check drawn, no exception."""
    page = browser_page
    headline = compare_headline(page, server_url)
    answered = page.get_by_text(re.compile(r"B answered [\d,]+ distinct prompts")).first.inner_text()
    n_b = int(re.search(r"B answered ([\d,]+) distinct prompts", answered).group(1).replace(",", ""))
    cut_b, cut_a = (float(x) for x in re.findall(r"(\d+\.\d)% ", headline)[:2])
    # B is live: a fresh server's B may hold a few hundred completions, where a fixed 0.8-4.0% band
    # fails by chance (~5% at n = 300), so its share is held to the truth within 5 binomial standard
    # errors of its n (distinct prompts: at most its completions, so the band is if anything wider).
    spread_b = 5 * 100 * (0.021 * 0.979 / n_b) ** 0.5 + 0.05
    assert 15.0 <= cut_a <= 21.0 and abs(cut_b - 2.1) <= spread_b, (headline, n_b)
    assert re.search(r"completions \d+% longer[^;]*; tok/s per GPU [+−]\d+% \([+−]\d+% to [+−]\d+%\)", headline), (
        headline
    )
    page.get_by_text("Forecast vs outcome").first.wait_for(timeout=30_000)
    page.get_by_text(re.compile(r"The measurement falls (inside|outside) the predicted interval")).first.wait_for(
        timeout=30_000
    )
    # The side-by-side table is a static table (#42): no data grid on the page.
    page.locator('[data-testid="stTable"]').first.wait_for(timeout=30_000)
    page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
    assert page.locator('[data-testid="stTable"]').count() == 1
    assert page.locator('[data-testid="stDataFrame"]').count() == 0
    heads = [head for head, _rows in page.evaluate(STATIC_TABLES)]
    assert heads == [["metric", "A: demo-4096", "B: demo-8192", "B − A", "95% interval"]], heads
    # Issue 33: B's answers against A's prompt set (was "cannot be checked").
    assert (
        page.get_by_text(re.compile(r"B answered \d+\.\d% of A's prompts; [\d,]+ of A's prompts are missing")).count()
        >= 1
    )
    assert page.get_by_text("cannot be checked").count() == 0
    assert page.locator('[data-testid="stException"]').count() == 0
    tall_screenshot(page, ARTIFACTS / "compare.png", height=2000)


def test_resample_shows_samples(server_url, browser_page):
    page = browser_page
    wait_for_demo_data(page, server_url)
    open_page(page, server_url, "samples")
    # One click: the batch it asks for is shown once it lands. (The "lost clicks" this test used to
    # click again for were the page's: it drew the model cached while the batch was pending.)
    page.get_by_role("button", name="Re-sample").click()
    page.get_by_text(re.compile(r"Batch \d+: \d+ of")).first.wait_for(timeout=30_000)
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)
    page.get_by_text("Sampling…").first.wait_for(state="detached", timeout=30_000)
    page.get_by_text("Truncated only").first.wait_for(timeout=30_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    tall_screenshot(page, ARTIFACTS / "samples.png")


def test_a_deep_link_on_a_fresh_server_opens_without_page_not_found(tmp_path, browser_page):
    """The first session after a start that opens a screen by its URL gets that screen, with no
    "Page not found" (Streamlit's pages/ auto-discovery is off from the start: components/serve.py)."""
    with streamlit_server(tmp_path, collect=False) as url:
        page = browser_page.context.browser.new_page(viewport=VIEWPORT)
        try:
            open_page(page, url, "lengths")
            page.wait_for_timeout(2000)  # the toast comes with the first script run's messages
            assert page.locator("h1").first.inner_text() == "Output lengths"
            assert page.get_by_text("Page not found").count() == 0
        finally:
            page.close()


# The colours a reader gets: each element's text colour over the background it really sits on
# (its own and its ancestors' background colours composited from the page down), and their WCAG
# 2 contrast ratio (https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio).
CONTRAST_JS = """sel => {
  const parse = c => { const m = c.match(/[\\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
  const over = (top, base) => top.slice(0, 3).map((v, i) => v * top[3] + base[i] * (1 - top[3]));
  const lum = rgb => { const l = rgb.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
                       return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2]; };
  const out = [];
  for (const el of document.querySelectorAll(sel)) {
    const own = Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim())
                || (el.tagName === 'INPUT' && el.value);  // the run picker's current value
    const r = el.getBoundingClientRect();
    if (!own || r.width === 0 || r.height === 0 || el.closest('button:disabled, svg')) continue;
    if (r.right <= 0 || r.bottom <= 0) continue;  // parked off screen (the "Skip to main content" link)
    const seen = getComputedStyle(el);
    if (seen.visibility === 'hidden' || Number(seen.opacity) === 0) continue;
    const layers = [];
    for (let a = el; a; a = a.parentElement) layers.push(parse(getComputedStyle(a).backgroundColor));
    let bg = [255, 255, 255];
    for (const layer of layers.reverse()) bg = over(layer, bg);
    const style = getComputedStyle(el);
    const fg = over(parse(style.webkitTextFillColor || style.color), bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    out.push({tag: el.tagName, text: (el.value || el.textContent).trim().slice(0, 40), ratio: (hi + 0.05) / (lo + 0.05),
              fg: fg.map(Math.round), bg: bg.map(Math.round)});
  }
  return out;
}"""


def test_light_theme_sidebar_and_buttons_are_readable(server_url, browser_page):
    """?theme=light outside kiosk: every sidebar text and every button label has a WCAG contrast
    of at least 4.5:1 against what it is drawn on (it was white on white, dark on dark buttons)."""
    page = browser_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{server_url}/?theme=light", wait_until="domcontentloaded")
    page.get_by_role("button", name="Refresh now").wait_for(timeout=60_000)
    tile_value(page, "Tokens / s")
    page.wait_for_timeout(1000)
    page.screenshot(path=str(ARTIFACTS / "overview_light.png"))
    sidebar = page.evaluate(CONTRAST_JS, '[data-testid="stSidebar"] *')
    buttons = page.evaluate(CONTRAST_JS, "button, button *")
    names = {s["text"] for s in sidebar}
    assert {"Overview", "Compare runs", "Refresh now"} <= names, names  # the nav, a button
    assert [s["text"] for s in sidebar if s["tag"] == "INPUT"] == ["demo-8192"]  # the run picker's value
    assert any(b["text"] == "Refresh now" for b in buttons), buttons
    poor = [f"{s['ratio']:.2f} {s['text']!r}: {s['fg']} on {s['bg']}" for s in sidebar + buttons if s["ratio"] < 4.5]
    assert not poor, "\n".join(poor)


def test_a_tile_with_a_term_of_art_explains_it_on_hover(server_url, browser_page):
    """Issue 32: "tok/J", "server says", "incl. loops 0–100%" (#41: "assuming no loops") stood unexplained on the tiles. In the
    browser each such tile sits in an element whose tooltip (title) holds the term's plain words."""
    from runhealth.screens.words import GLOSSARY

    page = browser_page
    wait_for_demo_data(page, server_url)
    checked = []
    for url, label in (
        (f"{server_url}/", r"^Tokens / s"),
        (f"{server_url}/Output_lengths?run=demo-4096", r"^Still truncated"),
    ):
        page.goto(url, wait_until="domcontentloaded")
        tile_value(page, label)
        for tile in page.locator(".rh-tile").all():
            text = tile.inner_text()
            terms = [t for t in GLOSSARY if t.lower() in text.lower()]
            if terms:
                title = tile.evaluate("el => (el.closest('[title]') || {}).title || ''")
                assert all(GLOSSARY[t] in title for t in terms), (text, title)
                checked += terms
    assert {"assuming no loops"} <= set(checked), checked  # the what-if tile; the test proves something


# Every drawn chart's axes as plotly.js laid them out, and each row of tiles' boxes.
DRAWN_AXES = """() => [...document.querySelectorAll('.js-plotly-plot')].map(d => [
  ((d.layout || {}).title || {}).text || '',
  Object.keys(d._fullLayout || {}).filter(k => /^[xy]axis\\d*$/.test(k)).map(k => [k, d._fullLayout[k].type, d._fullLayout[k].automargin]),
])"""
TILE_ROWS = """() => [...document.querySelectorAll('.rh-tiles')].map(row =>
  [...row.children].map(c => { const r = c.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }))"""


@pytest.mark.parametrize("name", ["overview", "lengths", "gpus", "compare"])
def test_charts_are_drawn_with_fixed_margins_and_tiles_in_one_row(name, server_url, browser_page):
    """Issue 42: Streamlit's chart theme turned axis automargin back on over the figures'
    template, so plotly.js drew every chart, measured its labels and drew it again. Each chart's
    number and time axes are laid out without it (an axis of names keeps it: figures.NAMES_AXIS);
    a row of tiles is one element with its tiles side by side, equal widths, as tall as each other."""
    page = browser_page
    wait_for_demo_data(page, server_url)
    open_page(page, server_url, name)
    page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    drawn = page.evaluate(DRAWN_AXES)
    assert drawn, name  # the page drew charts: the test checks something
    numbers = [(title, k, auto) for title, axes in drawn for k, kind, auto in axes if kind in ("linear", "log", "date")]
    assert numbers, drawn  # number and time axes drawn: the test checks something
    assert all(auto is False for _t, _k, auto in numbers), (name, numbers)
    for row in page.evaluate(TILE_ROWS):
        lefts, tops = [b[0] for b in row], [b[1] for b in row]
        widths, heights = [b[2] for b in row], [b[3] for b in row]
        assert lefts == sorted(lefts) and max(tops) - min(tops) < 1, row  # one row, left to right
        assert max(widths) - min(widths) < 2 and max(heights) - min(heights) < 2 and min(widths) > 150, row
    assert page.locator('[data-testid="stException"]').count() == 0


# The static tables' header cells and body rows, as the browser shows them.
STATIC_TABLES = """() => [...document.querySelectorAll('[data-testid="stTable"] table')].map(t => [
  [...t.querySelectorAll('thead th')].map(c => c.innerText.trim()),
  [...t.querySelectorAll('tbody tr')].map(r => [...r.querySelectorAll('th, td')].map(c => c.innerText.trim())),
])"""


def test_finish_reasons_are_a_static_table_whose_shares_add_up(server_url, browser_page):
    """Issue 42: a data grid (canvas, its own script chunk) took about twice the browser time of a
    static table to mount; the finish reasons are a few rows of words, drawn as an HTML table now,
    every row and number kept: completions as the tiles write them, shares that add up to 100%."""
    page = browser_page
    wait_for_demo_data(page, server_url)
    open_page(page, server_url, "lengths")
    page.locator('[data-testid="stTable"]').first.wait_for(timeout=60_000)
    tables = [rows for head, rows in page.evaluate(STATIC_TABLES) if head[:1] == ["finish reason"]]
    assert len(tables) == 1, page.evaluate(STATIC_TABLES)
    rows = {r[0]: r[1:] for r in tables[0]}
    assert "stop" in rows and any(k.startswith("length at the ceiling") for k in rows), rows
    assert all(re.fullmatch(r"[\d,]+", n) and re.fullmatch(r"[\d.]+%", s) for n, s in rows.values()), rows
    assert abs(sum(float(s[:-1]) for _n, s in rows.values()) - 100) < 0.1 * len(rows), rows
    assert page.locator('[data-testid="stException"]').count() == 0


def test_overview_node_table_is_a_static_table_with_its_state_colours(server_url, browser_page):
    """Issue 42: the Overview's node table was its only data grid (the grid's chunk and canvas in
    every cold load); a handful of nodes is a static HTML table now, every node a row with its
    status in its state's colour, and no grid is drawn on the page."""
    page = browser_page
    wait_for_demo_data(page, server_url)
    page.locator('[data-testid="stTable"]').first.wait_for(timeout=60_000)
    tables = [rows for head, rows in page.evaluate(STATIC_TABLES) if head[:2] == ["node", "status"]]
    assert len(tables) == 1, page.evaluate(STATIC_TABLES)
    assert len(tables[0]) >= 2 and all(r[1] in ("UP", "DONE", "STALE", "DOWN", "PENDING") for r in tables[0]), tables
    colours = page.evaluate("""() => [...document.querySelectorAll('[data-testid="stTable"] tbody tr')]
      .map(r => getComputedStyle(r.querySelectorAll('th, td')[1]).backgroundColor)""")
    assert set(colours) <= {
        "rgb(27, 94, 32)",
        "rgb(13, 71, 161)",
        "rgb(138, 90, 0)",
        "rgb(139, 26, 26)",
        "rgb(58, 63, 75)",
    }
    assert colours, colours
    # A node name longer than the column leaves room for (a fleet's FQDNs, a laptop's width): the
    # table scrolls sideways to its last column (Streamlit's wrapper round the table), none clipped.
    page.set_viewport_size({"width": 1280, "height": 1000})
    try:
        reach = page.evaluate("""() => {
      const t = document.querySelector('[data-testid="stTable"] table'), td = t.querySelector('tbody td');
      (td.querySelector('p') || td).textContent = 'gpunode017clusterlocalexample';
      const box = t.parentElement;
      box.scrollLeft = box.scrollWidth;
      const last = t.querySelector('tbody tr').lastElementChild.getBoundingClientRect();
      return {wider: box.scrollWidth > box.clientWidth, lastRight: last.right, boxRight: box.getBoundingClientRect().right};
    }""")
    finally:
        page.set_viewport_size(VIEWPORT)  # the session's page, for the tests after this one
    assert reach["wider"] and reach["lastRight"] <= reach["boxRight"] + 1, reach
    assert page.locator('[data-testid="stMain"] [data-testid="stDataFrame"]').count() == 0
    assert page.locator('[data-testid="stException"]').count() == 0
