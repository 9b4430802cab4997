"""Regenerate docs/overview.png, docs/lengths.png, docs/lengths_fields.png (1600x1000),
docs/kiosk.png (1920x1080) and docs/compare.png from the demo, and docs/fleet_gpus.png from a built 64-node store.

    python scripts/screenshots.py [--settle-s 75] [--only compare|fleet|fields|kiosk]

Starts the demo app and Chromium exactly as tests/test_browser.py does (same helpers), waits
until the Overview shows real truncation and throughput numbers, lets the demo run a little
longer so the throughput chart has history, then captures both screens.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import test_browser as tb  # the browser test's helpers are the single source
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle-s", type=float, default=150, help="demo run time before capturing (chart history)")
    parser.add_argument("--only", choices=["compare", "fleet", "fields", "kiosk"], help="retake this screen only")
    args = parser.parse_args()
    docs = ROOT / "docs"
    docs.mkdir(exist_ok=True)
    if args.only == "compare":
        compare_shot(docs, args.settle_s)
        print(f"wrote {docs / 'compare.png'}")
        return 0
    if args.only == "kiosk":
        with demo_browser() as (browser, url):
            tb.wait_for_demo_data(browser.new_page(viewport=tb.VIEWPORT), url)  # numbers in before the wall shot
            kiosk_shot(browser, url, docs)
        print(f"wrote {docs / 'kiosk.png'}")
        return 0
    if args.only == "fields":
        with demo_browser() as (browser, url):
            page = browser.new_page(viewport=tb.VIEWPORT)
            tb.wait_for_demo_data(page, url)
            fields_shot(page, url, docs)
        print(f"wrote {docs / 'lengths_fields.png'}")
        return 0
    if args.only == "fleet":
        fleet_gpus(docs)
        print(f"wrote {docs / 'fleet_gpus.png'}")
        return 0
    with demo_browser() as (browser, url):
        page = browser.new_page(viewport=tb.VIEWPORT)
        tb.wait_for_demo_data(page, url)
        page.wait_for_timeout(int(args.settle_s * 1000))
        tb.open_page(page, url, "overview")
        tb.tile_value(page, "Tokens / s")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(docs / "overview.png"))
        tb.open_page(page, url, "lengths")
        tb.tile_value(page, r"^Truncated$")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(docs / "lengths.png"))
        fields_shot(page, url, docs)
        kiosk_shot(browser, url, docs)
    compare_shot(docs, args.settle_s)
    fleet_gpus(docs)
    print(f"wrote {docs / 'overview.png'}, {docs / 'lengths.png'}, {docs / 'kiosk.png'} and {docs / 'fleet_gpus.png'}")
    return 0


@contextlib.contextmanager
def demo_browser() -> Iterator[tuple[Any, str]]:
    """The demo dashboard on a free port in a temp folder, and a Chromium to look at it."""
    with (
        tempfile.TemporaryDirectory(prefix="runhealth-shots-") as tmp,
        tb.streamlit_server(Path(tmp)) as url,
        sync_playwright() as p,
    ):
        browser = tb.launch_chromium(p)
        try:
            yield browser, url
        finally:
            browser.close()


def compare_shot(docs: Path, settle_s: float) -> None:
    """The Compare page: the demo's finished 4,096 run against its live 8,192 relaunch."""
    with demo_browser() as (browser, url):
        page = browser.new_page(viewport=tb.VIEWPORT)
        tb.compare_headline(page, url)
        page.wait_for_timeout(int(settle_s * 1000))  # B's rates over a few minutes, not the first polls
        tb.compare_headline(page, url)
        page.get_by_text("Forecast vs outcome").first.wait_for(timeout=60_000)
        page.wait_for_timeout(2000)
        tb.tall_screenshot(page, docs / "compare.png", height=1750)


def fields_shot(page, url: str, docs: Path) -> None:
    """Output lengths' "Beyond the ceiling" panels (#33): cut before answering, label checks,
    which prompts get cut, from the demo's per-line fields."""
    tb.open_page(page, url, "lengths")
    heading = page.get_by_role("heading", name="Beyond the ceiling")
    heading.wait_for(timeout=60_000)
    page.get_by_text("Cut share by").first.wait_for(timeout=60_000)
    heading.evaluate("e => e.scrollIntoView({block: 'start'})")  # the panels fill the screen
    page.wait_for_timeout(2000)
    page.screenshot(path=str(docs / "lengths_fields.png"))


def kiosk_shot(browser, url: str, docs: Path) -> None:
    """The Overview's first kiosk part (alerts and tiles) at 1920x1080, once its numbers are in."""
    kiosk = browser.new_page(viewport={"width": 1920, "height": 1080})
    kiosk.goto(f"{url}/?kiosk=1&rotate=0", wait_until="domcontentloaded")
    tb.tile_value(kiosk, "Tokens / s")
    kiosk.wait_for_function("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0", timeout=60_000)
    kiosk.wait_for_timeout(3000)
    kiosk.screenshot(path=str(docs / "kiosk.png"))
    kiosk.close()


def fleet_gpus(docs: Path) -> None:
    """The GPUs page of a 64-node x 8-GPU run (an hour of 30 s polls, built like tests build stores)."""
    import time

    import store_fixtures

    with tempfile.TemporaryDirectory(prefix="runhealth-fleet-") as tmp:
        store, config = store_fixtures.make_store(Path(tmp), "empty")
        store_fixtures.build_run(
            store, now=time.time(), trunc_frac=0.18, nodes=64, gpus=8, polls=120, per_shard=4, interval_s=30
        )
        store.close()
        config = store_fixtures.write_config(Path(tmp), Path(tmp) / "x.sqlite3", nodes=64, interval_s=120)
        env = {"RUNHEALTH_CONFIG": str(config)}
        # --no-collect: the built history as it is (a collector here would poll 64 nodes with no GPU).
        with tb.streamlit_server(Path(tmp), extra_env=env, collect=False) as url, sync_playwright() as p:
            browser = tb.launch_chromium(p)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            tb.open_page(page, url, "gpus")
            page.get_by_text("median of each node").first.wait_for(timeout=120_000)
            page.wait_for_timeout(5000)  # let the sidebar and the last charts settle
            tb.tall_screenshot(page, docs / "fleet_gpus.png", height=3000)
            browser.close()


if __name__ == "__main__":
    raise SystemExit(main())
