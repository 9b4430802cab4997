"""The figures as Chromium draws them: what a viewer reads, measured on the rendered SVG.

tests/test_figures.py inspects the plotly objects; some faults only show once plotly.js lays
the figure out: tick labels that round to the same text, a legend swatch of another colour
than its bars, labels drawn over error bars, a legend over the title. Each figure is drawn by
the plotly.js that ships with plotly.py, in the shared headless Chromium (tests/conftest.py),
at the width the page gives it, and measured there (bounding boxes, computed fills, texts).
A screenshot of each lands in tests/artifacts/figures/ for a person to look at.
"""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go
import plotly.offline
import pytest
from test_browser import ARTIFACTS

from components import figures, tables

pytestmark = pytest.mark.browser
SHOTS = ARTIFACTS / "figures"

# Every measurement in one pass over the drawn SVG (#g is the figure's div).
MEASURE_JS = """() => {
  const g = document.getElementById('g');
  const box = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const all = sel => Array.from(g.querySelectorAll(sel));
  return {
    yticks: all('.yaxislayer-above .ytick text').map(t => t.textContent),
    y2ticks: all('.yaxislayer-above .y2tick text').map(t => t.textContent),
    xticks: all('.xaxislayer-above .xtick text').map(t => t.textContent),
    legend: all('.legend .traces').map(t => ({
      name: t.querySelector('.legendtext').textContent,
      fill: (p => p ? getComputedStyle(p).fill : null)(t.querySelector('.legendpoints path')),
    })),
    bars: all('.barlayer .trace').map(t => Array.from(t.querySelectorAll('.point path')).map(
      p => getComputedStyle(p).fill)),
    title: all('.gtitle').map(box),
    legendBox: all('.legend rect.bg').map(box),
    texts: all('text.bartext, .scatterlayer .textpoint text').map(box),
    errorbars: all('.errorbar path').map(box),
  };
}"""


@pytest.fixture(scope="module")
def draw(browser_page, request):
    """draw(fig, width, name) -> the measurements of `fig` drawn `width` px wide (screenshot: name.png)."""
    page = browser_page
    page.set_content(
        "<html><body style='margin:0;background:#0E1117'><div id='g'></div>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></body></html>"
    )
    SHOTS.mkdir(parents=True, exist_ok=True)

    def _draw(fig: go.Figure, width: int, name: str) -> dict:
        spec = json.loads(fig.to_json())
        spec["layout"]["width"] = width
        page.evaluate("s => Plotly.newPlot('g', s.data, s.layout)", spec)
        page.locator("#g .main-svg").first.screenshot(path=str(SHOTS / f"{name}.png"))
        return page.evaluate(MEASURE_JS)

    return _draw


def overlaps(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return "rgb({}, {}, {})".format(*(int(h[i : i + 2], 16) for i in (0, 2, 4)))


def test_whatif_ticks_on_a_small_share_are_distinct(draw):
    """The what-if on a run with ~2% cut: "2%, 2%, 1%, 1%, 0%" said nothing; each tick differs."""
    df = pd.DataFrame(
        {
            "limit": [4096, 5120, 6144, 8192, 12288],
            "fraction": [0.023, 0.015, 0.010, 0.005, 0.002],
            "lo": [0.023, 0.012, 0.008, 0.003, 0.001],
            "hi": [0.023, 0.018, 0.013, 0.008, 0.004],
            "band_lo": [0.023, 0.011, 0.007, 0.003, 0.001],
            "band_hi": [0.023, 0.019, 0.014, 0.009, 0.005],
        }
    )
    got = draw(figures.make_whatif_figure(df, ceiling=4096, chosen=8192), 1100, "whatif_small_share")
    assert len(got["yticks"]) >= 3 and len(set(got["yticks"])) == len(got["yticks"]), got["yticks"]


def over_time() -> pd.DataFrame:
    # The first bucket is the first scan (grey), the rest live (amber): the legend must say amber.
    return pd.DataFrame(
        {
            "bucket_unix": [0, 600, 1200, 1800, 2400],
            "completions": [5000, 120, 130, 110, 125],
            "at_ceiling": [900, 20, 25, 18, 22],
            "below_ceiling": [20, 2, 1, 0, 3],
            "unsplit": [0, 0, 0, 0, 0],
            "backfill": [1, 0, 0, 0, 0],
        }
    )


def lengths_per_hour() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "bucket_unix": [0, 3600, 7200, 10800],
            "p50": [2300, 2310, 2290, 2305],
            "p90": [4000, 4096, 4096, 4096],
            "p99": [4096] * 4,
            "at_ceiling_fraction": [0.18, 0.17, 0.19, 0.18],
            "completions": [5000, 400, 420, 410],
            "backfill": [1, 0, 0, 0],
        }
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: figures.make_truncation_over_time_figure(over_time(), 0.02, 0.05),
        lambda: figures.make_lengths_over_time_figure(lengths_per_hour(), 4096),
    ],
    ids=["truncated_over_time", "lengths_per_hour"],
)
def test_each_legend_swatch_is_the_colour_of_its_bars(make, draw, request):
    fig = make()
    got = draw(fig, 1100, request.node.callspec.id)
    names = [t.name for t in fig.data if t.type == "bar"]
    swatch = {e["name"]: e["fill"] for e in got["legend"]}
    assert len(got["bars"]) == len(names)
    for name, fills in zip(names, got["bars"], strict=True):
        drawn = set(fills)
        assert len(drawn) == 1, (name, drawn)  # one colour per legend entry
        assert swatch[name] == drawn.pop(), (name, swatch)
    amber = [n for n in names if n.startswith(("truncated (", "share at ceiling"))]
    assert amber and swatch[amber[0]] == rgb(figures.CEILING_COLOUR)  # the live bars' swatch is amber


def test_truncation_by_node_names_the_nodes_and_keeps_labels_off_the_error_bars(draw):
    df = pd.DataFrame(
        {
            "group": ["node-1", "node-2"],
            "completions": [2400, 2300],
            "at_ceiling": [430, 40],
            "lo": [0.164, 0.013],
            "hi": [0.195, 0.024],
            "ceiling": [4096, 4096],
            "drift": [False, False],
        }
    )
    df["fraction"] = df["at_ceiling"] / df["completions"]
    got = draw(figures.make_truncation_by_group_figure(tables.short_group_labels(df), 0.02, 0.05), 1100, "by_node")
    assert len(got["texts"]) == 2 and got["errorbars"]
    hits = [(t, e) for t in got["texts"] for e in got["errorbars"] if overlaps(t, e)]
    assert not hits, hits
    assert got["xticks"] == ["node-1", "node-2"]


def gpu_bands(nodes: int) -> pd.DataFrame:
    rows = [
        {"node": f"node-{n}", "t_unix": t, "median": 90.0 + n, "min": 85.0, "max": 99.0, "gpus": 8}
        for n in range(1, nodes + 1)
        for t in range(0, 3600, 60)
    ]
    return pd.DataFrame(rows)


def gpu_lines(gpus: int) -> pd.DataFrame:
    rows = [
        {"ts_unix": t, "label": f"node-1/{g}", "power_w": 600.0 + g, "power_limit_w": 700.0}
        for g in range(gpus)
        for t in range(0, 600, 10)
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "make",
    [
        lambda: figures.make_gpu_band_figure(gpu_bands(4), "Utilization", "%", None, (0, 100)),
        lambda: figures.make_gpu_band_figure(gpu_bands(12), "Power", "W", 700.0, (0, 700)),
        lambda: figures.make_gpu_timeseries_figure(gpu_lines(8), "power_w", "Power", "W", "power_limit_w"),
    ],
    ids=["band_4_nodes", "band_12_nodes", "lines_8_gpus"],
)
def test_gpu_chart_titles_stay_clear_of_the_legend(make, draw, request):
    """The GPU page draws these two to a row (~700 px each)."""
    got = draw(make(), 700, request.node.callspec.id)
    assert got["title"] and got["legendBox"]
    assert not overlaps(got["title"][0], got["legendBox"][0]), (got["title"], got["legendBox"])
