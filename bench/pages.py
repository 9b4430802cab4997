"""Page render time on a big store: 24 h of 10 s GPU samples for 64 GPUs and ~1M completions.

Measures each page's server-side render (Streamlit `AppTest` run time, caches cleared before
every run, so this is the cold cost a new viewer pays) and, as the baseline measured in the
same run, what a dashboard that skips SQL aggregation pays: read every raw GPU row into pandas
and hand it to plotly. Prints a table with the ratio, and the process RSS. Not a pass/fail test.

    python bench/pages.py [--runs 3] [--pages overview,lengths] [--keep DIR] [--scenario fleet]

--scenario fleet: 64 nodes x 8 GPUs (512), 6 h of 30 s polls, instead of the default "big".

--keep DIR builds the store in DIR once and reuses it on later runs (it takes minutes to build).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st
from apppage import SCREENS, open_page

ROOT = Path(__file__).resolve().parent.parent

PAGES = SCREENS


def quiet_streamlit() -> None:
    """AppTest outside a server logs two warnings per run; they are noise in a benchmark table."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("streamlit"):
            logging.getLogger(name).setLevel(logging.ERROR)


def render_s(page: str) -> float:
    st.cache_data.clear()
    st.cache_resource.clear()
    start = time.perf_counter()
    at = open_page(page, timeout=120).run()
    elapsed = time.perf_counter() - start
    if at.exception:
        raise SystemExit(f"{page} raised: {at.exception[0].message}")
    return elapsed


def baseline_raw_gpu_s(db_path: Path) -> float:
    """The naive way: every raw row into pandas, one plotly trace per GPU, serialised."""
    start = time.perf_counter()
    with sqlite3.connect(db_path) as db:
        df = pd.read_sql_query("SELECT * FROM gpu_samples", db)
    df["gpu_key"] = df["node"] + "/" + df["gpu"].astype(str)
    px.line(df, x="ts_unix", y="util_pct", color="gpu_key").to_json()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pages", default=",".join(PAGES), help="comma-separated screens (pages/<name>.py)")
    parser.add_argument("--keep", type=Path, help="build the store here once and reuse it")
    parser.add_argument("--scenario", default="big", choices=["big", "fleet"],
                        help="big: 8 nodes x 8 GPUs, 24 h; fleet: 64 nodes x 8 GPUs, 6 h")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="runhealth-bench-") as scratch:
        tmp = args.keep or Path(scratch)
        db_path, config_path = tmp / "x.sqlite3", tmp / "runhealth.toml"
        t0 = time.perf_counter()
        if not (db_path.exists() and config_path.exists()):
            # Built in a child process, so this process's RSS is that of a dashboard reading a store.
            tmp.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-c", "import sys;"
                            " from store_fixtures import make_store; from pathlib import Path;"
                            " make_store(Path(sys.argv[1]), sys.argv[2])", str(tmp), args.scenario],
                           check=True)
        with sqlite3.connect(db_path) as db:
            gpu_rows = db.execute("SELECT COUNT(*) FROM gpu_samples").fetchone()[0]
            completions = db.execute("SELECT SUM(count) FROM length_counts").fetchone()[0]
        print(f"store: {gpu_rows:,} GPU samples, {completions:,} completions, "
              f"{db_path.stat().st_size / 1e6:.0f} MB (built in {time.perf_counter() - t0:.0f} s)")
        os.environ["RUNHEALTH_CONFIG"] = str(config_path)
        os.environ["RUNHEALTH_COLLECTOR"] = "off"
        quiet_streamlit()
        render_s(PAGES[0])  # first run pays the imports; not a page cost
        times = {page: [render_s(page) for _ in range(args.runs)] for page in args.pages.split(",")}
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        baseline = statistics.median(baseline_raw_gpu_s(db_path) for _ in range(args.runs))
        print(f"\n{'page':<28}{'median s':>10}{'max s':>10}{'vs raw-rows baseline':>24}")
        for page, page_times in times.items():
            print(f"{page:<28}{statistics.median(page_times):>10.3f}{max(page_times):>10.3f}"
                  f"{baseline / statistics.median(page_times):>23.1f}x")
        print(f"{'baseline: raw GPU rows -> plotly':<28}{baseline:>10.3f}")
        print(f"\npeak RSS after rendering every page {args.runs}x (before the baseline ran): {rss_mb:.0f} MB")


if __name__ == "__main__":
    main()
