"""The day's alerts in a real headless Chromium (#32 item 5): the Overview's timeline and the
Nodes page's history table, drawn from a store whose episodes are known.

The store is tests/test_alert_history.py's scenario (truncation warning then critical, n2 stale
then down, a collector restart, recovery); the dashboard runs on it with `--no-collect`, so what
the browser shows is exactly what the scenario stored. AppTest checks the charts' specs; this
checks that a browser really draws them: the timeline's bars and row labels in the plot's SVG, the
history table's rows in the grid, at 1920x1080 (screenshots to tests/artifacts/).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_alert_history import driven, scenario, write_config  # noqa: F401 (scenario: a fixture)
from test_browser import ARTIFACTS, open_page, streamlit_server

pytestmark = pytest.mark.browser

WALL = {"width": 1920, "height": 1080}
TIMELINE = "Alerts, last "  # its window is the run's age (at most 24 h): "Alerts, last 20.5 h"

# The timeline's bars (one <path> per episode) and its row labels, read from the plot's SVG.
TIMELINE_JS = """title => {
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    const t = plot.querySelector('.gtitle');
    if (!t || !t.textContent.includes(title)) continue;
    const bars = Array.from(plot.querySelectorAll('.barlayer .point path'))
      .filter(p => p.getBBox().width > 0);
    const rows = Array.from(plot.querySelectorAll('.ytick text')).map(t => t.textContent);
    return {bars: bars.length, rows};
  }
  return null;
}"""


def _timeline(page, timeout_s: float = 30) -> dict:
    for _ in range(int(timeout_s * 2)):
        got = page.evaluate(TIMELINE_JS, TIMELINE)
        if got and got["bars"]:
            return got
        page.wait_for_timeout(500)
    raise AssertionError(f"the {TIMELINE!r} chart has no bars after {timeout_s:.0f} s: {got}")


def test_the_days_alerts_are_drawn_in_a_browser(scenario, browser_page):  # noqa: F811
    tmp, config, store = scenario
    n_today = len(driven(store.alert_episodes()))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    env = {"RUNHEALTH_CONFIG": str(write_config(tmp, config, store))}
    with streamlit_server(tmp, extra_env=env, collect=False) as url:
        page = browser_page.context.browser.new_page(viewport=WALL)
        try:
            open_page(page, url, "overview")
            got = _timeline(page)
            rows = {r for r in got["rows"] if not r.startswith("host_")}
            assert rows == {"truncation_high · run", "node_stale · n2", "node_down · n2"}, got
            assert got["bars"] >= n_today, got  # one bar per episode (host_* ones come from this machine)
            assert page.get_by_text(f"Today's alerts: {len(store.alert_episodes()):,} in the last 24 h").count()
            page.locator(".js-plotly-plot", has_text=TIMELINE).scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "alerts_overview.png"))

            open_page(page, url, "nodes")
            heading = page.get_by_role("heading", name="Alert history (last 7 days)")
            heading.wait_for(timeout=30_000)
            heading.scroll_into_view_if_needed()
            # st.dataframe draws its cells on a canvas; its hidden accessible table holds the text.
            grid = page.locator('[data-testid="stDataFrame"] table[role="grid"]', has_text="node_down").first
            grid.wait_for(state="attached", timeout=30_000)
            text = grid.text_content()
            assert all(a in text for a in ("node_down", "node_stale", "truncation_high", "at start")), text[:400]
            assert int(grid.get_attribute("aria-rowcount")) == len(store.alert_episodes(since_unix=0)) + 1
            with page.expect_download() as download:
                page.get_by_role("button", name="Download alert history (CSV)").click()
            csv = Path(download.value.path()).read_text()
            alerts = [line.split(",")[0] for line in csv.splitlines()[1:] if not line.startswith("host_")]
            assert alerts == ["node_down", "node_stale", "truncation_high"], csv
            page.screenshot(path=str(ARTIFACTS / "alerts_nodes.png"))
            assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            page.close()
