"""The pure figure builders: what a viewer must see is really in the figure.

Builders get non-empty frames only (pages say why when there is nothing to draw), so these
tests feed them the smallest realistic frames and inspect the plotly objects, no browser.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from components import figures


def ceiling_bins() -> pd.DataFrame:
    # The founding incident in miniature: a spread of stops and a one-token ceiling bin.
    return pd.DataFrame(
        {
            "bin_start": [0, 1000, 2000, 3000, 4096],
            "bin_end": [1000, 2000, 3000, 4096, 4097],
            "stop": [300, 250, 120, 150, 0],
            "at_ceiling": [0, 0, 0, 0, 180],
            "other": [0, 0, 0, 0, 0],
        }
    )


def shapes_at(fig: go.Figure, x: float) -> list:
    return [s for s in fig.layout.shapes if s.x0 == x and s.x1 == x]


def test_histogram_draws_the_ceiling_line_and_annotates_the_share():
    fig = figures.make_length_histogram_figure(ceiling_bins(), 4096, 0.18)
    assert shapes_at(fig, 4096), "no vertical line at the ceiling"
    texts = [a.text for a in fig.layout.annotations]
    assert any("18.0%" in t and "4,096" in t for t in texts), texts
    assert fig.layout.template.layout.paper_bgcolor is not None  # dark template applied


def test_histogram_spike_is_highlighted_and_visible():
    fig = figures.make_length_histogram_figure(ceiling_bins(), 4096, 0.18)
    spike = [t for t in fig.data if t.name == "stopped at the ceiling"]
    assert len(spike) == 1
    assert spike[0].marker.color == figures.CEILING_COLOUR
    assert list(spike[0].y) == [180]
    # A 1-token bin on a ~4k axis would be invisible: it gets at least 1/80 of the span.
    assert spike[0].width[0] >= 4097 / 80
    assert all(t.marker.color != figures.CEILING_COLOUR for t in fig.data if t is not spike[0])


def test_histogram_without_ceiling_has_no_line():
    bins = ceiling_bins().assign(at_ceiling=0)
    fig = figures.make_length_histogram_figure(bins, None, None)
    assert not fig.layout.shapes and not fig.layout.annotations


def test_cdf_marks_the_ceiling():
    df = pd.DataFrame({"tokens": [10, 2000, 4095, 4096], "cum_fraction": [0.1, 0.6, 0.82, 1.0]})
    fig = figures.make_cdf_figure(df, 4096)
    assert shapes_at(fig, 4096)
    assert fig.layout.yaxis.tickformat == ".0%"


def test_truncation_by_group_makes_the_drifting_group_stand_out():
    df = pd.DataFrame(
        {
            "group": ["node-1", "node-2", "node-3"],
            "fraction": [0.01, 0.012, 0.011],
            "lo": [0.005, 0.006, 0.005],
            "hi": [0.02, 0.02, 0.02],
            "ceiling": [4096, 4096, 2048],
            "drift": [False, False, True],
        }
    )
    fig = figures.make_truncation_by_group_figure(df, warn=0.02, alert=0.05)
    colours = list(fig.data[0].marker.color)
    assert colours[2] == figures.ALERT_COLOUR and colours[0] != figures.ALERT_COLOUR
    assert "2,048" in fig.data[1].text[2]  # the value labels: a text trace at each interval's top
    assert list(fig.data[1].y) == [0.02, 0.02, 0.02]


def test_gpu_heatstrip_has_one_column_per_gpu_and_three_rows():
    labels = [f"node-{n}/{g}" for n in range(1, 9) for g in range(8)]
    df = pd.DataFrame({"label": labels, "util_pct": [95.0] * 64, "power_pct": [90.0] * 64, "mem_pct": [None] * 64})
    fig = figures.make_gpu_heatstrip_figure(df)
    heat = fig.data[0]
    assert len(heat.z) == 3 and all(len(row) == 64 for row in heat.z)
    assert list(heat.x) == labels
    assert heat.text[2][0] == "N/A"  # unsupported metric shows N/A, not 0


def test_gpu_timeseries_draws_one_line_per_gpu_and_the_power_limit():
    df = pd.DataFrame(
        {
            "ts_unix": [0, 10, 0, 10],
            "label": ["a/0", "a/0", "a/1", "a/1"],
            "power_w": [600, 650, 610, 640],
            "power_limit_w": [700] * 4,
        }
    )
    fig = figures.make_gpu_timeseries_figure(df, "power_w", "Power", "W", "power_limit_w")
    assert len(fig.data) == 2
    assert any(s.y0 == 700 for s in fig.layout.shapes)


def test_truncation_over_time_greys_the_backfill_bucket_and_keeps_context_stops_apart():
    df = pd.DataFrame(
        {
            "bucket_unix": [0, 30, 60],
            "completions": [5000, 100, 100],
            "at_ceiling": [880, 16, 20],
            "below_ceiling": [20, 2, 0],
            "unsplit": [0, 0, 0],
            "backfill": [1, 0, 0],
        }
    )
    fig = figures.make_truncation_over_time_figure(df, 0.02, 0.05)
    # The first scan is its own grey trace: one colour per trace, so each legend swatch is its bars' colour.
    live, first = fig.data[0], fig.data[1]
    assert live.marker.color == figures.CEILING_COLOUR and first.marker.color == figures.BACKFILL_COLOUR
    assert live.name == "truncated (at the ceiling)" and first.name == "truncated, first scan"
    assert pd.isna(live.y[0]) and abs(first.y[0] - 880 / 5000) < 1e-9 and pd.isna(first.y[1])
    assert abs(live.y[1] - 0.16) < 1e-9  # truncated = at the ceiling only
    assert fig.data[2].name == "length stop below the ceiling" and abs(fig.data[2].y[1] - 0.02) < 1e-9
    assert len(fig.data) == 3  # no "unknown" trace when every stop has an exact length


def test_whatif_figure_shows_band_interval_and_both_limits():
    df = pd.DataFrame(
        {
            "limit": [5120, 8192, 12288],
            "fraction": [0.15, 0.12, 0.09],
            "lo": [0.14, 0.1, 0.07],
            "hi": [0.16, 0.14, 0.11],
            "band_lo": [0.13, 0.1, 0.06],
            "band_hi": [0.17, 0.15, 0.12],
        }
    )
    fig = figures.make_whatif_figure(df, ceiling=4096, chosen=8192, hard_hi=0.18)
    names = {t.name for t in fig.data}
    assert {"95% interval", "spread across tail models", "projected share still truncated"} <= names
    assert shapes_at(fig, 4096) and shapes_at(fig, 8192)
    assert "extrapolation" in fig.layout.title.text


def test_throughput_figure():
    df = pd.DataFrame({"bucket_unix": [0, 30, 60], "tokens_per_s": [24000.0, 25000.0, 24500.0]})
    fig = figures.make_throughput_figure(df)
    assert list(fig.data[0].y) == [24000.0, 25000.0, 24500.0]


def test_rules_are_the_shapes_and_labels_plotlys_add_vline_and_add_hline_make():
    """_vline/_hline skip plotly's slow subplot lookup; what they add must be identical."""

    def base():
        return go.Figure(go.Scatter(x=[1, 2], y=[1, 2]))

    for position in ("top right", "top left", "bottom right"):
        ours, theirs = base(), base()
        figures.vline(ours, 5, "a", position, dash="dot", color="#FFFFFF", width=2)
        theirs.add_vline(
            x=5, line_dash="dot", line_color="#FFFFFF", line_width=2, annotation_text="a", annotation_position=position
        )
        assert ours.to_dict() == theirs.to_dict(), position
    ours, theirs = base(), base()
    figures.vline(ours, 7, dash="dash")
    theirs.add_vline(x=7, line_dash="dash")
    assert ours.to_dict() == theirs.to_dict()
    ours, theirs = base(), base()
    figures.hline(ours, 0.3, "warn", dash="dot", color="#FFB000")
    theirs.add_hline(y=0.3, line_dash="dot", line_color="#FFB000", annotation_text="warn")
    assert ours.to_dict() == theirs.to_dict()


def test_every_figure_is_in_the_dark_template():
    import plotly.io as pio
    import streamlit.elements.plotly_chart  # noqa: F401  (loading it makes "streamlit" plotly's default)

    pio.templates.default = "streamlit"
    fig = figures.make_length_histogram_figure(ceiling_bins(), 4096, 0.18)
    assert fig.layout.template.layout.paper_bgcolor == "rgb(17,17,17)"  # plotly_dark's
    assert fig.layout.paper_bgcolor == "rgba(0,0,0,0)"  # ours on top, transparent for the app theme


def test_fleet_views_stay_readable_at_64_nodes_by_8_gpus():
    from components import tables

    rows = [
        {
            "node": f"node-{n:02d}",
            "gpu": g,
            "ts_unix": 1000.0 + 10 * t,
            "util_pct": 50.0 + g + (t % 3),
            "power_w": 600.0,
        }
        for n in range(64)
        for g in range(8)
        for t in range(30)
    ]
    df = pd.DataFrame(rows)
    bands = tables.gpu_bands(df, "util_pct")
    one = bands[(bands["node"] == "node-00")].iloc[0]
    assert (one["min"], one["max"], one["gpus"]) == (50.0, 57.0, 8) and one["median"] == 53.5
    fig = figures.make_gpu_band_figure(bands, "Utilization", "%", y_range=(0, 100))
    assert len(fig.data) == 1 and fig.data[0].z.shape == (64, 30)  # node x time, not 512 lines
    assert (fig.data[0].zmin, fig.data[0].zmax) == (0, 100)
    few = figures.make_gpu_band_figure(bands[bands["node"] < "node-04"], "Utilization", "%", y_range=(0, 100))
    assert len(fig.data) == 1 and len([t for t in few.data if t.showlegend is not False]) == 4  # a band + median each
    assert list(few.layout.yaxis.range) == [0, 100]
    latest = pd.DataFrame(
        {
            "label": [f"node-{n:02d}/{g}" for n in range(64) for g in range(8)],
            "util_pct": 90.0,
            "power_pct": 80.0,
            "mem_pct": 70.0,
        }
    )
    grid = figures.make_gpu_heatstrip_figure(latest)
    assert grid.data[0].z.shape == (64, 8)  # node rows x GPU columns


def test_by_shard_labels_are_short_and_the_tail_is_summarised():
    from components import tables

    df = pd.DataFrame(
        {
            "group": [f"node-1:/data/run-7/out/shard-{i:04d}.jsonl" for i in range(1000)],
            "completions": 100,
            "at_ceiling": [i % 40 for i in range(1000)],
            "lo": 0.0,
            "hi": 0.0,
            "ceiling": 4096,
            "drift": False,
        }
    )
    df["fraction"] = df["at_ceiling"] / df["completions"]
    shown = tables.short_group_labels(df, top_n=25)
    assert len(shown) == 26 and shown.iloc[-1]["label"] == "975 others"
    assert shown.iloc[0]["label"].startswith("shard-") and shown.iloc[0]["fraction"] == 0.39
    assert shown.iloc[-1]["completions"] == 97_500  # the rest is summed, not dropped
    fig = figures.make_truncation_by_group_figure(shown, 0.02, 0.05)
    assert fig.data[0].customdata[0][0] == shown.iloc[0]["group"]  # full path on hover


def _heatmap_by_pivot(bands: pd.DataFrame, title: str, unit: str) -> go.Figure:
    """The node heatmap as it was built before #16's fleet work: three pivots and a hover string
    per cell in Python. The fast builder must give the same figure."""
    import numpy as np

    med = bands.pivot(index="node", columns="t_unix", values="median")
    med = med.reindex(figures.natural_order(med.index))
    lo = bands.pivot(index="node", columns="t_unix", values="min").reindex_like(med)
    hi = bands.pivot(index="node", columns="t_unix", values="max").reindex_like(med)
    custom = np.array(
        [
            [f"min {a:.0f} · max {b:.0f}" if pd.notna(a) else "no data" for a, b in zip(ra, rb, strict=True)]
            for ra, rb in zip(lo.to_numpy(), hi.to_numpy(), strict=True)
        ],
        dtype=object,
    )
    heat = dict(
        type="heatmap",
        z=med.to_numpy(),
        x=pd.to_datetime(med.columns, unit="s"),
        y=list(med.index),
        customdata=custom,
        colorscale="Viridis",
        colorbar=dict(title=dict(text=unit), thickness=12),
        hovertemplate="%{y} %{x}: median %{z:.0f} " + unit + " (%{customdata})<extra></extra>",
    )
    layout = figures._layout(f"{title} · median of each node's GPUs ({len(med)} nodes)", min(1000, 140 + 12 * len(med)))
    layout["yaxis"] = dict(autorange="reversed", **figures.NAMES_AXIS)  # node names: automargin on
    return figures.new_figure_from([heat], layout)


def test_the_node_heatmap_shows_what_the_pivoted_one_showed_hover_text_and_no_data_cells_included():
    import json
    import random

    import numpy as np
    import plotly.io as pio

    rng = random.Random(5)
    rows = []
    for n in range(1, 21):
        for t in range(40):
            if (n, t) in {(3, 0), (3, 1), (7, 39)} or rng.random() < 0.05:
                continue  # cells without data: "no data" on hover, a gap in the colours
            lo = rng.choice([rng.uniform(0, 700), 0.5, 1.5, 2.5, -0.4, 99.5])  # halves round to even, -0 stays
            hi = lo + rng.choice([0.0, 0.5, rng.uniform(0, 80)])
            rows.append(
                {
                    "node": f"node-{n}",
                    "t_unix": 1e9 + 30.5 * t,
                    "median": (lo + hi) / 2,
                    "min": lo,
                    "max": hi,
                    "gpus": 8,
                }
            )
    rows[5]["max"] = float("nan")  # a max the fold could not take
    bands = pd.DataFrame(rows).sample(frac=1, random_state=2)  # row order must not matter
    fig = figures.make_gpu_node_heatmap_figure(bands, "Power", "W")
    want = _heatmap_by_pivot(bands, "Power", "W")
    assert json.loads(pio.to_json(fig, validate=False)) == json.loads(pio.to_json(want, validate=False))
    custom = np.asarray(fig.data[0].customdata)
    assert fig.data[0].y[:3] == ("node-1", "node-2", "node-3")  # natural order, node-10 after node-9
    assert custom[2, 0] == custom[2, 1] == "no data" and custom[6, 39] == "no data"
    assert {"min -0 · max -0", "min 0 · max 0", "min 2 · max 2"} <= set(custom.ravel())


def test_share_axis_ticks_differ_at_every_scale():
    """pct_axis: the labels of consecutive ticks differ (d3's ".N%" is Python's "{:.N%}"), from a
    0.2% tail to a 90% share; an empty or NaN top still gives an axis."""
    for top in (0.0021, 0.023, 0.05, 0.15, 0.9, 0.0, float("nan")):
        axis = figures.pct_axis(top)
        decimals = int(axis["tickformat"][1:-1])
        ticks = [f"{k * axis['dtick']:.{decimals}%}" for k in range(7)]
        assert len(set(ticks)) == 7 and axis["tick0"] == 0, (top, ticks)
        assert 3 <= (top if top == top and top > 1e-4 else 0.01) / axis["dtick"] <= 8


def hours_with_a_truncating_tail() -> pd.DataFrame:
    # Three hours of a run at max_tokens=4,096: p90 and p99 sit on the ceiling, 15% cut at the end.
    start = 1_700_000_000 // 3600 * 3600
    return pd.DataFrame(
        {
            "bucket_unix": [start, start + 3600, start + 7200],
            "completions": [900, 1000, 1100],
            "at_ceiling": [90, 120, 165],
            "backfill": [1, 0, 0],
            "at_ceiling_fraction": [0.10, 0.12, 0.15],
            "p50": [1100, 1200, 1300],
            "p90": [3900, 4096, 4096],
            "p99": [4096, 4096, 4096],
        }
    )


def test_lengths_per_hour_bars_span_their_own_hour():
    """A bar holds its hour's data from the hour's start to its end (centred on the start, the
    14:00 bar was drawn from 13:37 to 14:24); each percentile point sits inside its hour."""
    df = hours_with_a_truncating_tail()
    fig = figures.make_lengths_over_time_figure(df, 4096)
    hour_ms = 3_600_000
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 2
    for bar in bars:
        for x, start in zip(bar.x, df["bucket_unix"], strict=True):
            x_ms = pd.Timestamp(x).value // 1_000_000
            left, right = x_ms + bar.offset, x_ms + bar.offset + bar.width
            assert start * 1000 <= left and right <= (start + 3600) * 1000, (x, bar.offset, bar.width)
            assert right - left >= 0.9 * hour_ms
    for line in (t for t in fig.data if t.type == "scatter"):
        for x, start in zip(line.x, df["bucket_unix"], strict=True):
            assert start * 1000 < pd.Timestamp(x).value // 1_000_000 < (start + 3600) * 1000


def test_lengths_per_hour_share_axis_reaches_the_highest_bar_with_a_tick():
    """The right axis' range ends on a tick at or above the highest bar (it stopped at 14% under 15%)."""
    fig = figures.make_lengths_over_time_figure(hours_with_a_truncating_tail(), 4096)
    axis = fig.layout.yaxis2
    low, high = axis.range
    assert low == 0 and high >= 0.15
    assert abs(high / axis.dtick - round(high / axis.dtick)) < 1e-9  # the top is a labelled tick
    assert high - 0.15 < axis.dtick  # and no more than one step above the bar


def test_percentile_lines_at_the_ceiling_stay_visible_and_are_named():
    """p90 and p99 at 4,096 lay on the dotted ceiling rule in the same blue: now each percentile
    has its own colour and marker, is drawn over the rule, and the rule's label names them."""
    fig = figures.make_lengths_over_time_figure(hours_with_a_truncating_tail(), 4096)
    lines = {t.name: t for t in fig.data if t.type == "scatter"}
    assert set(lines) == {"p50", "p90", "p99"}
    assert len({t.line.color for t in lines.values()}) == 3 and len({t.marker.symbol for t in lines.values()}) == 3
    (rule,) = [s for s in fig.layout.shapes if s.y0 == 4096]
    assert rule.layer == "below" and rule.line.color not in {t.line.color for t in lines.values()}
    assert all("markers" in t.mode for t in lines.values())
    (label,) = [a for a in fig.layout.annotations if a.y == 4096]
    assert label.text == "ceiling 4,096 (p90, p99 reach it)"
    healthy = hours_with_a_truncating_tail().assign(p90=3000, p99=3500)
    (label,) = figures.make_lengths_over_time_figure(healthy, 4096).layout.annotations
    assert label.text == "ceiling 4,096"


def _breaks(ys) -> list[int]:
    return [i for i, y in enumerate(ys) if y is None or y != y]


def test_gpu_lines_and_bands_break_where_no_reading_came():
    """A GPU series with 20 min of no readings (the collector down) drew a straight line across
    them; now the line (and a node's band) breaks there. One missing reading (two steps) is no
    break: a line breaks past three steps, as a node goes stale past three intervals."""
    t = [1000.0 + 10 * k for k in range(30)] + [1000.0 + 10 * k for k in range(150, 180)]
    t.remove(1100.0)  # one missing reading: joined
    df = pd.DataFrame({"ts_unix": t, "label": "n1/0", "util_pct": 90.0})
    (line,) = figures.make_gpu_timeseries_figure(df, "util_pct", "Utilization", "%").data
    assert len(line.y) == len(t) + 1 and _breaks(line.y) == [29]
    x = list(line.x)
    assert x[28] < x[29] < x[30]  # the break sits between the two stretches
    bands = pd.DataFrame({"node": "n1", "t_unix": t, "median": 90.0, "min": 80.0, "max": 95.0, "gpus": 8})
    fig = figures.make_gpu_band_figure(bands, "Utilization", "%", y_range=(0, 100))
    assert all(_breaks(tr.y) == [29] for tr in fig.data), [_breaks(tr.y) for tr in fig.data]
    steady = df[df["ts_unix"] < 1300]
    (line,) = figures.make_gpu_timeseries_figure(steady, "util_pct", "Utilization", "%").data
    assert _breaks(line.y) == []


def test_the_fleet_heatmap_leaves_a_stretch_with_no_reading_empty():
    """Past BAND_MAX_NODES nodes a chart is a node x time heatmap, whose cells reach halfway to the
    next time: across 20 min with no reading, the columns either side were stretched over it. Now
    two empty columns a step inside the edges hold the gap; the data columns keep their width."""
    t = [1000.0 + 10 * k for k in range(30)] + [1000.0 + 10 * k for k in range(150, 180)]
    bands = pd.DataFrame(
        [
            {"node": f"node-{n:02d}", "t_unix": x, "median": 90.0, "min": 80.0, "max": 95.0, "gpus": 8}
            for n in range(16)
            for x in t
        ]
    )
    (heat,) = figures.make_gpu_band_figure(bands, "Utilization", "%", y_range=(0, 100)).data
    x = [v.astype("datetime64[ms]").astype("int64") / 1000 for v in heat.x]
    z = heat.z
    assert z.shape == (16, 62)
    empty = [i for i in range(z.shape[1]) if np.isnan(z[:, i]).all()]
    assert empty == [30, 31] and x[30] - x[29] == 10 and x[32] - x[31] == 10
    assert all(heat.customdata[n][i] == "no data" for n in range(16) for i in empty)
