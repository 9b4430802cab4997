"""GPU bands kept as rows arrive (runhealth/payloads/gpubands.py, issue #34 item 1).

The collector's bands must be what the old builder computed (pagedata.gpu_bands, kept below as
the reference, rows in a Python loop, statistics.median per step) over the same per-GPU step
means, on the fleet store; and bands kept between refreshes, as rows arrive (a slow poll's rows
stamped before a faster one's included), must equal bands computed from scratch, while each
refresh reads only the steps the new rows fall in.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import store_fixtures
from store_fixtures import write_reply

from runhealth.payloads import gpubands, pagedata
from runhealth.payloads.pagetypes import GpuWindow, Table
from runhealth.store import Store

FIELDS = ("util_pct", "power_w", "mem_used_mib", "temp_c", "sm_clock_mhz", "power_limit_w")


def reference_bands(rows: Sequence[Mapping[str, Any]], value: str, step: float) -> list[dict[str, Any]]:
    """pagedata.gpu_bands as it was (main 99902c0), the step passed in instead of span / 240."""
    cells: dict[tuple[str, float], tuple[list[float], set[int]]] = {}
    for r in rows:
        cell = cells.setdefault((r["node"], r["t_unix"]), ([], set()))
        if r[value] is not None:
            cell[0].append(r[value])
        cell[1].add(r["gpu"])
    out = []
    for (node, t), (values, gpus) in sorted(cells.items()):
        out.append(
            {
                "node": node,
                "t_unix": t,
                "median": statistics.median(values) if values else None,
                "min": min(values) if values else None,
                "max": max(values) if values else None,
                "gpus": len(gpus),
            }
        )
    return out


def reference_window(store: Store, step: float, first: int) -> dict[str, Any]:
    """Each GPU's mean per step from every raw row, in Python, then the reference bands."""
    sums: dict[tuple[str, int, int], list[list[float]]] = {}
    for r in store.query("SELECT * FROM gpu_samples WHERE ts_unix >= ?", ((first - 1) * step,)):
        k = int(r["ts_unix"] / step)  # what SQL's CAST(ts / step AS INTEGER) gives
        if k >= first:
            got = sums.setdefault((r["node"], r["gpu"], k), [[] for _ in FIELDS])
            for values, f in zip(got, FIELDS, strict=True):
                if r[f] is not None:
                    values.append(r[f])
    rows = []
    for (node, gpu, k), got in sums.items():
        means = {f: sum(v) / len(v) if v else None for f, v in zip(FIELDS, got, strict=True)}
        if means["mem_used_mib"] is not None:
            means["mem_used_gib"] = means["mem_used_mib"] / 1024
        else:
            means["mem_used_gib"] = None
        rows.append({"node": node, "gpu": gpu, "t_unix": k * step, **means})
    limits: dict[str, float] = {}
    for r in rows:
        if (x := r["power_limit_w"]) is not None:
            limits[r["node"]] = max(limits.get(r["node"], x), x)
    return {"bands": {v: reference_bands(rows, v, step) for v in pagedata.GPU_VALUES}, "limits": limits}


def rows_of(table: Table) -> list[dict[str, Any]]:
    """A column-wise band table as rows sorted by node and time (the reference's order)."""
    data = table.data
    return sorted(
        (dict(zip(table.columns, r, strict=True)) for r in zip(*(data[c] for c in table.columns), strict=True)),
        key=lambda r: (r["node"], r["t_unix"]),
    )


def assert_same_bands(got: GpuWindow, want: dict[str, Any]) -> None:
    assert got.bands is not None
    for value in pagedata.GPU_VALUES:
        mine, ref = rows_of(got.bands[value]), want["bands"][value]
        assert len(mine) == len(ref), value
        for a, b in zip(mine, ref, strict=True):
            # Means are sums over 1-12 readings: SQLite and Python may add them in another
            # order, so equal to the last bits only up to 1e-12 relative. Medians, minima and
            # maxima over the node's GPUs are then the same choices of the same numbers.
            assert a["node"] == b["node"] and a["t_unix"] == b["t_unix"] and a["gpus"] == b["gpus"], (a, b)
            for key in ("median", "min", "max"):
                assert (a[key] is None) == (b[key] is None), (value, a, b)
                if a[key] is not None:
                    assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-12), (value, key, a, b)
    assert got.limits["power_limit_w"] == pytest.approx(want["limits"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Store:
    """A fleet in bands mode: 16 nodes x 8 GPUs, 6 h of 30 s polls (the fixtures' "fleet" scenario
    has 64 nodes; a quarter of it exercises every window and step the same, in a quarter of the time)."""
    store = Store(tmp_path_factory.mktemp("fleet") / "x.sqlite3")
    store_fixtures.build_run(
        store, now=time.time() - 60, trunc_frac=0.18, nodes=16, gpus=8, polls=720, per_shard=4, interval_s=30
    )
    return store


def test_every_window_equals_the_old_builder_on_the_fleet_store(fleet):
    now = time.time()
    oldest = pagedata.gpu_oldest(fleet)
    assert oldest is not None
    out = pagedata.gpu_windows(fleet, now)
    for name, span in pagedata.GPU_WINDOWS_S.items():
        step, first = pagedata.band_cells(span, now, oldest)
        assert 120 <= (now - max(first * step, oldest)) / step <= 245, name  # since is rounded to 10 s
        got = out[f"gpu:{name}"]
        assert got.series is None and len(got.labels) == 128
        assert_same_bands(got, reference_window(fleet, step, first))
    # Each window's steps: 15 min -> 3.75 s, 1 h -> 15 s, 6 h -> 90 s; the 24 h window reaches
    # past the 6 h of history, so it is the whole run's (its steps), computed once.
    steps = [pagedata.band_cells(s, now, oldest)[0] for s in pagedata.GPU_WINDOWS_S.values()]
    assert steps[:3] == [3.75, 15, 90] and steps[3] == steps[4] >= 90, steps
    assert out["gpu:24 h"].bands is out["gpu:whole run"].bands


def add_round(store: Store, ts: float, nodes: int, util: float) -> None:
    for i in range(1, nodes + 1):
        devices = [store_fixtures.gpu_device(g, util + g) for g in range(8)]
        write_reply(store, f"node-{i}", store_fixtures.poll_reply(ts + 0.4, devices, {}), ts, rtt_ms=12.5)


def test_kept_bands_equal_bands_from_scratch_as_rows_arrive(tmp_path, monkeypatch):
    store = Store(tmp_path / "x.sqlite3")
    now = 1_800_000_000.0
    store_fixtures.build_run(store, now=now, trunc_frac=0.01, nodes=12, polls=200, per_shard=2)
    kept = gpubands.Bands(store)
    reads: list[tuple[float, int]] = []
    real = gpubands.gpu_means
    monkeypatch.setattr(
        gpubands, "gpu_means", lambda s, step, first: reads.append((step, first)) or real(s, step, first)
    )
    pagedata.gpu_windows(store, now, bands=kept)
    for n, (ts, util) in enumerate([(now + 10, 50.0), (now + 20, 40.0), (now + 14, 10.0), (now + 300, 70.0)]):
        add_round(store, ts, 12 if n != 2 else 3, util)  # the third round: 3 slow nodes, stamped earlier
        reads.clear()
        later = now + 10 * (n + 1)
        kept_out = pagedata.gpu_windows(store, later, bands=kept)
        # Only the steps the new rows fall in were read again, not the windows' history.
        assert reads and all(first >= int((ts - 1) / step) for step, first in reads), (ts, reads)
        fresh_out = pagedata.gpu_windows(store, later)
        for name in kept_out:
            for value in pagedata.GPU_VALUES:
                assert rows_of(kept_out[name].bands[value]) == rows_of(fresh_out[name].bands[value]), name
            assert kept_out[name].limits == fresh_out[name].limits


def test_refresher_keeps_its_bands_and_a_poll_costs_its_own_rows(tmp_path, monkeypatch):
    store = Store(tmp_path / "x.sqlite3")
    now = [1_800_000_000.0]
    store_fixtures.build_run(store, now=now[0], trunc_frac=0.01, nodes=12, polls=100, per_shard=2)
    refresher = pagedata.Refresher(
        store, store_fixtures.CEILING, 10.0, min_interval_s=10, clock=lambda: now[0], monotonic=lambda: now[0]
    )
    read_rows: list[int] = []
    real = gpubands.gpu_means
    monkeypatch.setattr(gpubands, "gpu_means", lambda *a: read_rows.append(len(out := real(*a))) or out)
    refresher.run_now()
    first_pass = sum(read_rows)
    for _ in range(3):
        now[0] += 10
        add_round(store, now[0], 12, 60.0)
        read_rows.clear()
        refresher.run_now()
        # per width due, at most the open step's and the new poll's GPU means (96 GPUs a step)
        assert 0 < sum(read_rows) <= 4 * 2 * 96 < first_pass / 10, (read_rows, first_pass)
    now[0] += 20  # the 1 h window (15 s steps) is due again: its payload holds every row
    refresher.run_now()
    got = pagedata.get(store, "gpu:1 h", GpuWindow)
    assert got is not None
    step, first = pagedata.band_cells(3600, now[0], pagedata.gpu_oldest(store) or 0)
    assert_same_bands(got[1], reference_window(store, step, first))
