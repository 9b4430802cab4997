"""The GPU page's per-node bands: why there are two builders, measured.

runhealth/pagedata.py `gpu_bands` (plain rows, in the collector) and components/tables.py
`gpu_bands` (a DataFrame, on the page when no payload fits) compute the same table
(tests/test_pagedata.py asserts it). One builder could serve both only by converting: the page
turning its DataFrame into rows for the core's builder, or the collector building a DataFrame
for the pandas one (and importing pandas, which the headless collector does not). This prints
both conversions as ratios against each side's own builder, measured in the same run, on
synthetic 10 s samples downsampled the way the store returns them (`--points` per GPU).

    python bench/bands.py [--nodes 8] [--gpus 8] [--points 400] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import pandas as pd  # noqa: E402

from components import tables  # noqa: E402
from runhealth import pagedata  # noqa: E402


def series_rows(nodes: int, gpus: int, points: int, seed: int = 1) -> list[dict]:
    """Rows shaped like pagedata.gpu_series: one per GPU and time point."""
    rng = random.Random(seed)
    rows = []
    for n in range(nodes):
        for g in range(gpus):
            for i in range(points):
                rows.append(
                    {
                        "ts_unix": 1e9 + i * 216.0 + rng.random(),
                        "node": f"node-{n}",
                        "gpu": g,
                        "label": f"node-{n}/{g}",
                        "util_pct": rng.random() * 100,
                        "power_w": 300 + rng.random() * 400,
                        "mem_used_gib": 60 + rng.random() * 20,
                        "temp_c": 60 + rng.random() * 20,
                        "sm_clock_mhz": 1980.0,
                        "power_limit_w": 700.0,
                    }
                )
    return rows


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median wall seconds of `repeat` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--points", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = series_rows(args.nodes, args.gpus, args.points)
    df = pd.DataFrame(rows)
    values = pagedata.GPU_VALUES

    def page_today() -> object:
        return [tables.gpu_bands(df, v) for v in values]

    def page_with_core_builder() -> object:
        records = df.to_dict("records")
        return [pd.DataFrame(pagedata.gpu_bands(records, v)) for v in values]

    def collector_today() -> object:
        return [pagedata.gpu_bands(rows, v) for v in values]

    def collector_with_pandas_builder() -> object:
        frame, out = pd.DataFrame(rows), []
        for v in values:
            band = tables.gpu_bands(frame, v)
            out.append({"columns": list(band.columns), "data": {c: band[c].tolist() for c in band.columns}})
        return out

    page, page_alt = timed(page_today, args.repeat), timed(page_with_core_builder, args.repeat)
    coll, coll_alt = timed(collector_today, args.repeat), timed(collector_with_pandas_builder, args.repeat)
    print(f"{len(rows):,} samples ({args.nodes} nodes x {args.gpus} GPUs x {args.points} points), {len(values)} values")
    print("| side | builder | median ms | x baseline |")
    print("|---|---|---:|---:|")
    print(f"| page (on demand) | tables.gpu_bands on the DataFrame (baseline) | {1000 * page:.0f} | 1.00 |")
    print(
        f"| page (on demand) | DataFrame -> rows -> pagedata.gpu_bands | {1000 * page_alt:.0f} | {page_alt / page:.2f} |"
    )
    print(f"| collector | pagedata.gpu_bands on rows (baseline) | {1000 * coll:.0f} | 1.00 |")
    print(f"| collector | rows -> DataFrame -> tables.gpu_bands | {1000 * coll_alt:.0f} | {coll_alt / coll:.2f} |")


if __name__ == "__main__":
    main()
