"""How runhealth's costs grow: scan time vs shard size, page time vs history length.

    python bench/growth.py [--scan-gb 0.25,1,4] [--history-h 1,6,24]

Scan: a 64 MB block of realistic lines (bench/scan.py's generator) is repeated to each size,
read once to warm the page cache, and scanned by the agent in a fresh process; the table shows
seconds, GB/s and peak RSS, and each size's time relative to the smallest (linear growth is
the ideal for an exact count; RSS must stay flat). Pages: Overview and GPUs rendered
(AppTest, cold caches) over stores holding 1, 6 and 24 h of 10 s samples for 64 GPUs;
relative to the shortest history (flat is the goal: SQL aggregates, plotly gets <= 2,000
points per trace). Poll growth vs node count is `python bench/poll.py --nodes 1,8,32,64`.
Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

from scan import make_shard, run_scan, time_read

ROOT = Path(__file__).resolve().parent.parent

BLOCK_MB = 64


def build(path: Path, block: bytes, gb: float) -> int:
    """Repeat `block` (whole lines) up to `gb` GB; returns the number of lines written."""
    reps = max(1, round(gb * 1e9 / len(block)))
    with open(path, "wb") as f:
        for _ in range(reps):
            f.write(block)
    return reps * block.count(b"\n")


def scan_growth(sizes_gb: list[float], tmp: Path) -> None:
    block_path = tmp / "block.jsonl"
    make_shard(block_path, BLOCK_MB)
    block = block_path.read_bytes()
    print(f"{'shard GB':>9}{'scan s':>9}{'GB/s':>7}{'peak RSS MiB':>14}{'time vs first':>15}{'per-GB vs first':>17}")
    first = None
    for gb in sizes_gb:
        path = tmp / "shard.jsonl"
        lines = build(path, block, gb)
        time_read(path)  # warm cache
        result = min((run_scan(path) for _ in range(2)), key=lambda r: r["s"])
        assert result["lines"] == lines, (result, lines)
        size_gb = path.stat().st_size / 1e9
        first = first or (result["s"], size_gb)
        print(
            f"{size_gb:>9.2f}{result['s']:>9.2f}{size_gb / result['s']:>7.2f}{result['rss_mib']:>14.0f}"
            f"{result['s'] / first[0]:>15.1f}{(result['s'] / size_gb) / (first[0] / first[1]):>17.2f}"
        )
        path.unlink()


def page_growth(hours: list[float], tmp: Path) -> None:
    import streamlit as st
    from apppage import open_page
    from store_fixtures import build_run, write_config
    from streamlit.testing.v1 import AppTest

    from runhealth.store import Store

    print(f"\n{'history h':>10}{'GPU rows':>11}{'Overview s':>12}{'GPUs s':>9}{'Overview vs first':>19}")
    first = None
    for h in hours:
        folder = tmp / f"h{h}"
        folder.mkdir()
        store = Store(folder / "x.sqlite3")
        build_run(store, now=time.time(), trunc_frac=0.18, nodes=8, gpus=8, polls=int(h * 360), per_shard=8)
        rows = store.cursor("SELECT COUNT(*) FROM gpu_samples").fetchone()[0]
        os.environ["RUNHEALTH_CONFIG"] = str(write_config(folder, store.path, nodes=8))
        os.environ["RUNHEALTH_COLLECTOR"] = "off"
        times = []
        if first is None:  # the very first render pays the imports: not a page cost
            for name in list(logging.root.manager.loggerDict):  # AppTest's per-run warnings are noise here
                if name.startswith("streamlit"):
                    logging.getLogger(name).setLevel(logging.ERROR)
            AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
        for page in ("overview", "gpus"):
            st.cache_data.clear()
            st.cache_resource.clear()
            start = time.perf_counter()
            at = open_page(page, timeout=120).run()
            times.append(time.perf_counter() - start)
            assert not at.exception, at.exception
        first = first or times[0]
        print(f"{h:>10}{rows:>11,}{times[0]:>12.3f}{times[1]:>9.3f}{times[0] / first:>19.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scan-gb", default="0.25,1,4")
    parser.add_argument("--history-h", default="1,6,24")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="runhealth-growth-") as tmp:
        if args.scan_gb:
            scan_growth([float(x) for x in args.scan_gb.split(",")], Path(tmp))
        if args.history_h:
            page_growth([float(x) for x in args.history_h.split(",")], Path(tmp))


if __name__ == "__main__":
    main()
