"""The GPU page's history read: raw rows only against raw + rollup rows (issue 31 item 4).

Fills a store with `--nodes` x 8 GPUs of 10 s samples over `--hours` (raw rows only, as a run
younger than the rollup's 24 h raw window has), then times, best of `--repeat`, the GPU page's
reads: `Store.gpu_series` (raw rows) and `rollup.gpu_history` (the one the pages call), for the
whole run and the last 15 min, at 400 points per GPU, and `gpu_history`'s union of raw and
rolled-up rows forced on the same raw rows (why it falls back to `gpu_series`). Then folds all but the newest hour into
rollups and times `gpu_history` again (its union of raw and rolled-up rows).

    python bench/gpuread.py [--nodes 16] [--hours 24] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from runhealth.store import Store, rollup  # noqa: E402

NOW = 1_700_000_000.0
GPUS = 8


def fill(store: Store, nodes: int, hours: float) -> int:
    """Raw GPU samples every 10 s for `hours`, straight into the table (the writes are not timed)."""
    rng = random.Random(7)
    steps = int(hours * 360)
    with store.transaction() as db:
        for n in range(nodes):
            rows = [
                (NOW - (steps - i) * 10.0, f"node-{n:04d}", g, rng.uniform(0, 100), 40000.0, 81920.0,
                 rng.uniform(100, 700), 700.0, rng.uniform(30, 80), 1980.0, int(rng.random() < 0.01))
                for i in range(steps)
                for g in range(GPUS)
            ]  # fmt: skip
            db.executemany("INSERT INTO gpu_samples VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
    return nodes * GPUS * steps


def best_ms(fn, repeat: int) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        n = len(fn())
        times.append((time.perf_counter() - t) * 1000)
    return min(times), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.sqlite3")
        rows = fill(store, args.nodes, args.hours)
        print(f"{rows:,} raw GPU rows ({args.nodes} nodes x {GPUS} GPUs, {args.hours:g} h at 10 s), 400 points per GPU")
        reads = {
            "gpu_series, whole run": lambda: store.gpu_series(max_points=400),
            "gpu_history, whole run": lambda: rollup.gpu_history(store, max_points=400),
            "gpu_series, last 15 min": lambda: store.gpu_series(since_unix=NOW - 900, max_points=400),
            "gpu_history, last 15 min": lambda: rollup.gpu_history(store, since_unix=NOW - 900, max_points=400),
        }
        for name, fn in reads.items():
            ms, n = best_ms(fn, args.repeat)
            print(f"  {name:40} {ms:8.1f} ms  {n:,} points")
        has_rollups, rollup.has_rollups = rollup.has_rollups, lambda s: True  # the union path on the same rows
        for name in ("gpu_history, whole run", "gpu_history, last 15 min"):
            ms, n = best_ms(reads[name], args.repeat)
            print(f"  {name + ' (union forced)':40} {ms:8.1f} ms  {n:,} points")
        rollup.has_rollups = has_rollups
        rollup.rollup(store, now=NOW, raw_keep_s=3600, pause_s=0.0)
        print("after folding all but the newest hour into 1-min rollups:")
        for name in ("gpu_history, whole run", "gpu_history, last 15 min"):
            ms, n = best_ms(reads[name], args.repeat)
            print(f"  {name:40} {ms:8.1f} ms  {n:,} points")


if __name__ == "__main__":
    main()
