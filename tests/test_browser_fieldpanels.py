"""Output lengths' per-line field panels (#33) in a real headless Chromium at 1920x1080.

A demo run is written by the simulator and collected into a store (tests/test_fieldpanels.py's
helpers); `runhealth dashboard --no-collect` shows it, and the panels are found on screen with
the simulator's exact counts, then photographed for a person to look at
(tests/artifacts/lengths_fields.png).
"""

from __future__ import annotations

import pytest
import test_browser as tb
from test_fieldpanels import CEILING, _collect, _config, _toml

from runhealth.demo import Simulator
from runhealth.screens.words import fmt_count

pytestmark = pytest.mark.browser
FULL_HD = {"width": 1920, "height": 1080}


def test_output_lengths_panels_at_1920x1080(tmp_path, browser_page):
    sim = Simulator(tmp_path / "run", seed=30, ceiling=CEILING)
    sim.shard_dir.mkdir(parents=True)
    sim.write_backlog(1500)
    config = _config("fields-run", tmp_path / "run", sim.fields.issued)
    _collect(config).close()
    (tmp_path / "runhealth.toml").write_text(_toml([config]), encoding="utf-8")
    truth = sim.fields
    env = {"RUNHEALTH_CONFIG": str(tmp_path / "runhealth.toml")}
    # The session's Chromium (conftest.py): a second sync_playwright() in one process fails.
    with tb.streamlit_server(tmp_path, extra_env=env, collect=False) as url:
        page = browser_page.context.browser.new_page(viewport=FULL_HD)
        try:
            tb.open_page(page, url, "lengths")
            heading = page.get_by_text("Beyond the ceiling").first
            heading.wait_for(timeout=60_000)
            page.locator(".js-plotly-plot").last.wait_for(timeout=30_000)
            assert tb.tile_value(page, "^Never answered$") == fmt_count(truth.never_answered)
            assert tb.tile_value(page, "^Mislabelled$") == fmt_count(truth.mislabelled)
            assert tb.tile_value(page, "^Context-window stops$") == fmt_count(truth.context_stops)
            assert page.get_by_text("Cut share by metadata.dataset").count() >= 1
            assert page.locator('[data-testid="stException"]').count() == 0
            heading.evaluate("e => e.scrollIntoView({block: 'start'})")  # the panels fill the screen
            page.wait_for_timeout(1500)  # the charts' own draw
            tb.ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(tb.ARTIFACTS / "lengths_fields.png"))
            recovered = page.get_by_text("never-answered cuts finish").first
            recovered.wait_for(timeout=60_000)  # the what-if's fragment
            recovered.evaluate("e => e.scrollIntoView({block: 'center'})")
            page.wait_for_timeout(1000)
            page.screenshot(path=str(tb.ARTIFACTS / "lengths_recovered.png"))
        finally:
            page.close()
