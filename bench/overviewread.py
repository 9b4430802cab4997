"""What one viewer's Overview costs: building it from the store vs reading the published one.

A fleet store (bench/fleet.py's simulated nodes and bulk history) is polled twice; then, per node
count, the CPU seconds of `overview.overview` (what every viewer's refresh did before #31: ~21
reads of every table the screen shows) against `published.shown` reading the row the collector
published (one read, decompress, typed load, the Data age tile worded again). The baseline is the
build, measured in the same run: the ratio is build / read. Best of `--repeat`.

    python bench/overviewread.py [--nodes 8,64,512] [--history 1h] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import fleet  # noqa: E402  (bench/fleet.py: the simulated fleet and its history)

from runhealth.collect.collector import Collector  # noqa: E402
from runhealth.screens import overview, published  # noqa: E402
from runhealth.store import Store  # noqa: E402


def best_cpu_s(fn: Callable[[], object], repeat: int) -> float:
    out = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        out = min(out, time.process_time() - start)
    return out


def measure(nodes: int, span_s: float, repeat: int, tmp: Path) -> tuple[float, float, int]:
    """(build CPU s, read CPU s, published row bytes) for a fleet of `nodes`."""
    path = tmp / f"f{nodes}.sqlite3"
    config = fleet.fleet_config(nodes, path, 10.0)
    store = Store(path)
    fleet.build_history(store, nodes, span_s, 10.0, time.time() - 1)
    sims = {node.name: fleet.SimNode(i, 0.0) for i, node in enumerate(config.nodes)}
    with Collector(config, store, transports=sims) as collector:
        collector.poll_once()
        collector.poll_once()
    now = time.time()
    build = best_cpu_s(lambda: overview.overview(store, config, now), max(1, repeat // 2))
    published.publish(store, config, now)
    size = len(store.cursor("SELECT payload FROM page_data WHERE name = ?", (published.NAME,)).fetchone()[0])
    read = best_cpu_s(lambda: published.shown(store, config, now + 1), repeat)
    store.close()
    return build, read, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,64,512")
    parser.add_argument("--history", default="1h", help="poll history before the measurement (e.g. 1h, 24h)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"history {args.history}, best of {args.repeat}; baseline = a build in the same run")
    print("| nodes | build (CPU) | read published (CPU) | build / read | published row |")
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.nodes.split(",")):
            build, read, size = measure(n, fleet.parse_span(args.history), args.repeat, Path(tmp))
            print(
                f"| {n} | {1000 * build:.0f} ms | {1000 * read:.1f} ms | {build / read:.1f} | {size / 1024:.0f} KiB |"
            )


if __name__ == "__main__":
    main()
