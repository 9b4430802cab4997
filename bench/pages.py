"""Page render time on a big store: 24 h of 10 s GPU samples for 64 GPUs and ~1.5M completions.

Measures each page's server-side render under Streamlit `AppTest` twice in the same run:
"before", every page computing its numbers itself (no page payloads in the store: what the
pages did before #16), and "after", pages reading the payloads the collector precomputes
(runhealth/payloads/pagedata.py; computed here once with `Refresher.run_now`, whose time is reported
too, as the collector's background cost per refresh). Cold = caches cleared before the run (a
new viewer); warm = the same page again with caches kept (a refresh). "script s" is the page
script alone; "AppTest s" adds AppTest's own per-run setup. Every figure is the median of
--runs, with min-max. Also: the process RSS, the raw-rows baseline (every raw GPU row into
pandas and plotly), and with --history the Overview on a 1 h store of the same fleet against
the full store (flat = ratio near 1). Ratios, not pass/fail; the machine's load is printed.

    python bench/pages.py [--runs 3] [--pages overview,lengths] [--keep DIR]
                          [--scenario big|fleet] [--history] [--after-only]

--scenario fleet: 64 nodes x 8 GPUs (512), 6 h of 30 s polls, instead of the default "big"
(8 nodes x 8 GPUs, 24 h of 10 s polls).

Then, on a copy of the same store (payloads and all, as its collector left it) configured as a
finished run beside the live one (`[[runs]]`, finished = true): the Compare page, the live
run's Overview with two runs configured, and every page of the finished run. The finished
run's figures are computed on its first read and kept in its store (runfigures.finished_life):
that first read is timed apart, after the stored figures are dropped. --no-finished skips it.

--keep DIR builds the store in DIR once and reuses it on later runs (the big store takes ~6 min
to build on a 2-core VM, 60 poll rounds to a transaction; the store's clock is its build time,
so rebuild it when its last hour no longer ends now).
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
from streamlit.runtime.scriptrunner import script_runner

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from runhealth.payloads import pagedata  # noqa: E402
from runhealth.settings.config import load_config  # noqa: E402
from runhealth.store import Store  # noqa: E402

PAGES = SCREENS


def quiet_streamlit() -> None:
    """AppTest outside a server logs two warnings per run; they are noise in a benchmark table."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("streamlit"):
            logging.getLogger(name).setLevel(logging.ERROR)


_SCRIPT_S: list[tuple[float, float]] = []


def _timed_exec(func, ctx):
    """The page script's own run: (wall s, CPU s of its thread). AppTest adds its setup around it;
    CPU seconds stay comparable on a shared machine where wall time depends on the load."""
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        return _exec(func, ctx)
    finally:
        _SCRIPT_S.append((time.perf_counter() - start, time.thread_time() - cpu))


_exec = script_runner.exec_func_with_error_handling
script_runner.exec_func_with_error_handling = _timed_exec


def render_s(page: str, cold: bool = True, run: str | None = None) -> tuple[float, float, float]:
    """(AppTest s, script s, script CPU s) of one run of `page`; cold: every cache cleared first;
    `run`: the run shown (the URL's ?run=), else the config's first live one."""
    if cold:
        st.cache_data.clear()
        st.cache_resource.clear()
    _SCRIPT_S.clear()
    start = time.perf_counter()
    at = open_page(page, timeout=120)
    if run is not None:
        at.query_params["run"] = run
    at.run()
    elapsed = time.perf_counter() - start
    if at.exception:
        raise SystemExit(f"{page} raised: {at.exception[0].message}")
    return elapsed, sum(w for w, _ in _SCRIPT_S), sum(c for _, c in _SCRIPT_S)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.2f}-{max(values):.2f})"


def build(tmp: Path, scenario: str, polls: int | None = None) -> None:
    """The store, in a child process (so this process's RSS is a dashboard's); polls: a
    shorter history of the same fleet (the --history store)."""
    tmp.mkdir(parents=True, exist_ok=True)
    code = (
        "import sys; from pathlib import Path; import store_fixtures as f;"
        " tmp, scenario, polls = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]);"
        " f.make_store(tmp, scenario) if not polls else"
        " (f.build_run(f.Store(tmp / 'x.sqlite3'), now=__import__('time').time(), trunc_frac=0.18,"
        " **SHAPES[scenario], polls=polls), f.write_config(tmp, tmp / 'x.sqlite3'))"
    )
    subprocess.run(
        [sys.executable, "-c", f"SHAPES = {SHAPES!r}; {code}", str(tmp), scenario, str(polls or 0)],
        check=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"},
    )


# The fixture scenarios' shapes (tests/store_fixtures.py), for the 1 h store of --history.
SHAPES = {
    "big": {"nodes": 8, "gpus": 8, "per_shard": 11},
    "fleet": {"nodes": 64, "gpus": 8, "per_shard": 4, "interval_s": 30},
}
ONE_HOUR_POLLS = {"big": 360, "fleet": 120}


def set_payloads(db_path: Path, config_path: Path, present: bool) -> float:
    """Write every page payload (what the collector's Refresher does after a poll) or drop them;
    returns the CPU seconds the computation took."""
    store = Store(db_path)
    start = time.process_time()
    if present:
        config = load_config(config_path)
        pagedata.Refresher(store, config.max_output_tokens, config.interval_s).run_now()
    else:
        with store.transaction() as db:
            db.execute("DELETE FROM page_data")
    elapsed = time.process_time() - start
    store.close()
    return elapsed


def measure(pages: list[str], runs: int) -> dict[str, dict[str, list[float]]]:
    out = {}
    for page in pages:
        cold = [render_s(page) for _ in range(runs)]
        warm = [render_s(page, cold=False) for _ in range(runs)]
        out[page] = {
            "cold_apptest": [c[0] for c in cold],
            "cold": [c[1] for c in cold],
            "warm": [w[1] for w in warm],
            "cold_cpu": [c[2] for c in cold],
            "warm_cpu": [w[2] for w in warm],
        }
    return out


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
    parser.add_argument(
        "--scenario",
        default="big",
        choices=["big", "fleet"],
        help="big: 8 nodes x 8 GPUs, 24 h; fleet: 64 nodes x 8 GPUs, 6 h",
    )
    parser.add_argument("--history", action="store_true", help="also time the Overview on a 1 h store")
    parser.add_argument(
        "--after-only", action="store_true", help="only pages reading payloads, cold and warm (no before, no raw-rows)"
    )
    parser.add_argument("--no-finished", action="store_true", help="skip Compare and the finished run's pages")
    args = parser.parse_args()
    pages = args.pages.split(",")
    with tempfile.TemporaryDirectory(prefix="runhealth-bench-") as scratch:
        tmp = args.keep or Path(scratch)
        db_path, config_path = tmp / "x.sqlite3", tmp / "runhealth.toml"
        t0 = time.perf_counter()
        if not (db_path.exists() and config_path.exists()):
            build(tmp, args.scenario)
        with sqlite3.connect(db_path) as db:
            gpu_rows = db.execute("SELECT COUNT(*) FROM gpu_samples").fetchone()[0]
            completions = db.execute("SELECT SUM(count) FROM length_counts").fetchone()[0]
            span_h = (lambda a, b: (b - a) / 3600)(
                *db.execute("SELECT MIN(ts_unix), MAX(ts_unix) FROM polls").fetchone()
            )
        print(
            f"store ({args.scenario}): {gpu_rows:,} GPU samples, {completions:,} completions, {span_h:.1f} h, "
            f"{db_path.stat().st_size / 1e6:.0f} MB (ready in {time.perf_counter() - t0:.0f} s)"
        )
        print(f"machine load (1/5/15 min): {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        os.environ["RUNHEALTH_CONFIG"] = str(config_path)
        os.environ["RUNHEALTH_COLLECTOR"] = "off"
        quiet_streamlit()
        render_s(PAGES[0])  # first run pays the imports; not a page cost
        if args.after_only:
            after_only(db_path, config_path, pages, args.runs)
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"peak RSS of this process after rendering every page cold and warm: {rss_mb:.0f} MB")
            if args.history:
                overview_history(tmp, args.scenario, args.runs, config_path)
            if not args.no_finished:
                finished_and_compare(tmp, db_path, config_path, args.runs)
            return
        set_payloads(db_path, config_path, present=False)
        before = measure(pages, args.runs)
        compute_s = set_payloads(db_path, config_path, present=True)
        after = measure(pages, args.runs)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        baseline = statistics.median(baseline_raw_gpu_s(db_path) for _ in range(args.runs))
        print(f"\nscript s, median (min-max) of {args.runs}; cold = caches cleared, warm = again with caches")
        print(
            f"{'page':<28}{'before cold':>20}{'after cold':>20}{'after warm':>20}{'before/after':>14}"
            f"{'AppTest s after':>18}{'raw-rows/after':>16}"
        )
        for page in pages:
            b, a = before[page], after[page]
            print(
                f"{page:<28}{spread(b['cold']):>20}{spread(a['cold']):>20}{spread(a['warm']):>20}"
                f"{statistics.median(b['cold']) / statistics.median(a['cold']):>13.1f}x"
                f"{statistics.median(a['cold_apptest']):>18.3f}{baseline / statistics.median(a['cold']):>15.1f}x"
            )
        print(f"{'baseline: raw GPU rows -> plotly':<28}{baseline:>20.3f}")
        print("\nthe same runs in CPU s of the page script's thread (what the load does not change)")
        print(f"{'page':<28}{'before cold':>20}{'after cold':>20}{'after warm':>20}{'before/after':>14}")
        for page in pages:
            b, a = before[page], after[page]
            print(
                f"{page:<28}{spread(b['cold_cpu']):>20}{spread(a['cold_cpu']):>20}{spread(a['warm_cpu']):>20}"
                f"{statistics.median(b['cold_cpu']) / statistics.median(a['cold_cpu']):>13.1f}x"
            )
        print(f"collector: computing every page payload once (Refresher.run_now) took {compute_s:.2f} CPU s")
        print(f"peak RSS after rendering every page {4 * args.runs}x (before the baseline ran): {rss_mb:.0f} MB")
        if args.history:
            overview_history(tmp, args.scenario, args.runs, config_path)
        if not args.no_finished:
            finished_and_compare(tmp, db_path, config_path, args.runs)


FINISHED_RUN, LIVE_RUN = "gen-run-41", "gen-run-42"


def two_runs_config(tmp: Path, db_path: Path, config_path: Path) -> Path:
    """A `[[runs]]` config: the store as the live run, its copy in tmp/finished as a finished run
    (its payloads copied too, as its collector left them)."""
    done = tmp / "finished" / "x.sqlite3"
    done.parent.mkdir(exist_ok=True)
    if not done.exists():
        with sqlite3.connect(db_path) as src, sqlite3.connect(done) as dst:
            src.backup(dst)
    import tomllib

    live = tomllib.loads(config_path.read_text(encoding="utf-8"))
    lines = ["[[runs]]", f'name = "{FINISHED_RUN}"', "finished = true", f'store_path = "{done}"']
    lines += [f"max_output_tokens = {live['run']['max_output_tokens']}", "", "[[runs]]", f'name = "{LIVE_RUN}"']
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in live["run"].items() if k != "name"]
    for node in live["nodes"]:
        lines += ["", "[[runs.nodes]]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in node.items()]
    path = tmp / "finished" / "runs.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def finished_and_compare(tmp: Path, db_path: Path, config_path: Path, runs: int) -> None:
    """Compare, the live Overview beside a finished run, and the finished run's every page, cold
    and warm; the finished run's first read (final figures not stored yet) apart."""
    path = two_runs_config(tmp, db_path, config_path)
    os.environ["RUNHEALTH_CONFIG"] = str(path)
    with sqlite3.connect(tmp / "finished" / "x.sqlite3") as db:  # runfigures.FINISHED_LIFE (older code has none)
        db.execute("DELETE FROM page_data WHERE name = 'finished_life'")
    render_s("compare")  # the new config's first run: its imports and stores, not a page cost
    quiet_streamlit()  # loggers the first Compare run created
    first = render_s(PAGES[0], run=FINISHED_RUN)  # computes the final figures and stores them
    cases = [("compare", None), (PAGES[0], None)] + [(p, FINISHED_RUN) for p in PAGES]
    print(f"\ntwo runs ({FINISHED_RUN} finished: a copy of the store; {LIVE_RUN} live), median (min-max) of {runs}")
    print(f"{'page':<28}{'cold CPU s':>20}{'warm CPU s':>20}{'cold wall s':>20}{'warm wall s':>20}")
    for page, run in cases:
        cold = [render_s(page, run=run) for _ in range(runs)]
        warm = [render_s(page, cold=False, run=run) for _ in range(runs)]
        label = f"{page} ({'finished run' if run else 'two runs'})" if page != "compare" else page
        print(
            f"{label:<28}{spread([c[2] for c in cold]):>20}{spread([w[2] for w in warm]):>20}"
            f"{spread([c[1] for c in cold]):>20}{spread([w[1] for w in warm]):>20}"
        )
    print(
        f"the finished run's first Overview (final figures computed and stored): {first[2]:.3f} CPU s, {first[1]:.3f} s"
    )
    print(f"machine load (1/5/15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    os.environ["RUNHEALTH_CONFIG"] = str(config_path)


def after_only(db_path: Path, config_path: Path, pages: list[str], runs: int) -> None:
    """--after-only: the pages reading payloads, cold and warm, in script CPU s and wall s."""
    compute_s = set_payloads(db_path, config_path, present=True)
    after = measure(pages, runs)
    print(f"\nmedian (min-max) of {runs}; cold = caches cleared, warm = again with caches")
    print(f"{'page':<28}{'cold CPU s':>20}{'warm CPU s':>20}{'cold wall s':>20}{'warm wall s':>20}")
    for page in pages:
        a = after[page]
        print(
            f"{page:<28}{spread(a['cold_cpu']):>20}{spread(a['warm_cpu']):>20}{spread(a['cold']):>20}"
            f"{spread(a['warm']):>20}"
        )
    print(f"collector: computing every page payload once (Refresher.run_now) took {compute_s:.2f} CPU s")
    print(f"machine load (1/5/15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def overview_history(tmp: Path, scenario: str, runs: int, full_config: Path) -> None:
    """The Overview cold on a 1 h store of the same fleet and on the full store (payloads in both)."""
    short = tmp / "1h"
    if not (short / "x.sqlite3").exists():
        build(short, scenario, ONE_HOUR_POLLS[scenario])
    times = {}
    for label, config in (("1 h", short / "runhealth.toml"), ("full", full_config)):
        set_payloads(config.parent / "x.sqlite3", config, present=True)
        os.environ["RUNHEALTH_CONFIG"] = str(config)
        render_s(PAGES[0])
        times[label] = [render_s(PAGES[0]) for _ in range(runs)]
    for unit, k in (("script s", 1), ("script CPU s", 2)):
        short_s, full_s = [t[k] for t in times["1 h"]], [t[k] for t in times["full"]]
        print(
            f"\nOverview cold, {unit}: 1 h of history {spread(short_s)}, full store {spread(full_s)};"
            f" full / 1 h = {statistics.median(full_s) / statistics.median(short_s):.2f} (1.0 = flat)"
        )


if __name__ == "__main__":
    main()
