"""The Overview's throughput chart on the rates' terms (runhealth/rules/activity.py
`throughput_buckets`): each poll's tokens over the seconds it covers, so the chart and the tiles
tell one story through a collector restart, a stop mid-bucket and a stretch no poll covers."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
import pytest

from components import figures
from runhealth.rules import activity
from runhealth.screens import overview
from runhealth.store import Store

INTERVAL_S = 10.0
RATES = {"a": 1000.0, "b": 500.0}  # tokens/s each node writes


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "s.sqlite3")
    yield s
    s.close()


def poll(store: Store, ts: float, node: str, covered_s: float, interval_s: float | None, backfill: int = 0) -> None:
    """One poll row as the collector writes it: the tokens the node wrote over `covered_s`;
    `interval_s` the collector's monotonic measure (None on its first poll of the node)."""
    with store.transaction() as db:
        db.execute(
            "INSERT INTO polls (ts_unix, node, node_ts_unix, completions, tokens, length_stops, malformed,"
            " backfill, rtt_ms, prompts, interval_s) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (ts, node, ts + 0.4, 3, int(RATES[node] * covered_s), 0, 0, backfill, 20.0, None, interval_s),
        )


def rounds(store: Store, start: float, n: int) -> float:
    """`n` rounds of polls every INTERVAL_S from `start`; returns the last round's time."""
    t = start
    for _ in range(n):
        t += INTERVAL_S
        for i, node in enumerate(RATES):
            poll(store, t + i, node, INTERVAL_S, INTERVAL_S)
    return t


def chart(store: Store, now: float) -> list[tuple[float, float]]:
    return [(p.bucket_unix, p.tokens_per_s) for p in overview.throughput_series(store, now, INTERVAL_S)]


def test_the_first_poll_after_a_collector_restart_is_no_spike(store):
    """A collector stopped for 20 min: its first poll on restart carries 20 min of tokens. Summed
    into the bucket it landed in, that bucket read 41x the run's rate (and the buckets the
    collector stopped and started in, a third and two thirds of it) while every tile said 1,500
    tok/s; now every bucket of the hour reads the tiles' rate."""
    now = time.time()
    start = (now - 3000) // 30 * 30 + 5  # the stop and the restart fall mid-bucket
    stopped = rounds(store, start, 60)
    back = stopped + 1200
    for i, node in enumerate(RATES):
        poll(store, back + i, node, 1200, None)  # the collector's first poll: no monotonic measure
    last = rounds(store, back, 100)
    got = chart(store, last + 5)
    rate = activity.read_rates(store, last + 5, interval_s=INTERVAL_S).tokens_per_s_1m
    assert rate == pytest.approx(sum(RATES.values()))
    assert len(got) >= 90
    assert all(tps == pytest.approx(rate, rel=1e-6) for _, tps in got), [round(t) for _, t in got]


def test_a_stretch_no_poll_covers_is_a_gap_in_the_line(store):
    """After 20 min without polls, the nodes' first polls are catch-up (backfill: counted bytes
    already on disk), which no rate counts: nothing covers those 20 min. The chart has no bucket
    there and its line breaks, instead of a straight line drawn across no data."""
    now = time.time()
    start = (now - 3000) // 30 * 30
    stopped = rounds(store, start, 60)
    back = stopped + 1200
    for i, node in enumerate(RATES):
        poll(store, back + i, node, 1200, None, backfill=1)
    last = rounds(store, back, 100)
    got = chart(store, last + 5)
    times = [b for b, _ in got]
    holes = [(a, b) for a, b in zip(times, times[1:], strict=False) if b - a > 30]
    assert len(holes) == 1 and holes[0][1] - holes[0][0] >= 1170, holes
    assert all(tps == pytest.approx(1500.0, rel=1e-6) for _, tps in got), [round(v) for _, v in got]
    y = list(figures.make_throughput_figure(pd.DataFrame(got, columns=["bucket_unix", "tokens_per_s"])).data[0].y)
    assert len(y) == len(got) + 1 and sum(1 for v in y if v is None or math.isnan(v)) == 1
    gap = next(i for i, v in enumerate(y) if v is None or math.isnan(v))
    assert 0 < gap < len(y) - 1  # between the two stretches, not at an end


def test_a_node_back_from_an_unreachable_stretch_counts_at_its_average(store):
    """Node b unreachable for 5 min while a is polled: its first poll back covers the 5 min. The
    chart reads a + b throughout (b's tokens over the time they were written), not a dip to a's
    rate and then a spike of b's 5 minutes in one bucket."""
    now = time.time()
    start = (now - 3000) // 30 * 30
    t = start
    for k in range(150):
        t += INTERVAL_S
        poll(store, t, "a", INTERVAL_S, INTERVAL_S)
        if not 60 <= k < 90:
            poll(store, t + 1, "b", 310 if k == 90 else INTERVAL_S, 310 if k == 90 else INTERVAL_S)
    got = chart(store, t + 5)
    assert all(tps == pytest.approx(1500.0, rel=1e-6) for _, tps in got), [round(v) for _, v in got]
