"""Fleet scale: what one collector process costs at 64, 256 and 512 nodes x 8 GPUs.

Nodes are SIMULATED IN-PROCESS: each node's transport answers the real poll request with a
reply in the agent's wire shape (8 GPUs, 2 shards growing by a few hundred completions a
minute, an SGLang metric) after a fixed network wait (`--rtt-ms`, a sleep that holds a worker
thread like a real round trip). So this measures the collector's side only (scheduling,
folding replies into the store, store writes, page and /metrics reads); the agent's scan runs
on each node in a real fleet, in parallel, and `bench/poll.py` measures it over real sshd.

Per node count it reports: one full poll round (burst, `poll_once`), store write time per
round, steady-state collector CPU share and RSS while polling every `--interval` seconds with
the bounded pool, threads in use, a /metrics scrape, and cold page renders (AppTest). The
baseline, measured in the same run, is the smallest node count: per-node costs are given as
ratios to it, so growth is visible (1.0 = linear).

With `--history 24h` the store first gets that much past history (bulk-written, as a collector
running that long leaves it), and the steady window reports the collector's CPU share split into
polls + store writes (of it the alert history's evaluation every interval), page data (the
Refresher's thread) and /metrics (a scrape every 15 s, as exporter.scrape_text serves it).

The steady window starts once the collector's staggered first round is dispatched (`--warmup`,
default nodes / 32 s: 32 s at 1,024 nodes): a round longer than the interval leaves the nodes
polled last in it short of polls for that round only, which is no steady state (#42 item 3).

With `--runs 2` it measures instead two runs of the first --nodes count side by side (#42 item 5),
in the two layouts back to back in the same run: both collectors in one process (as one `runhealth
collect` ran every run before) and one process per run (as runhealth/collect/runprocs.py runs them
now), each run's polls done / scheduled and the CPU it took.

    python bench/fleet.py [--nodes 64,256,512] [--steady 20] [--interval 10] [--rtt-ms 20] [--pages]
                          [--history 24h] [--warmup S] [--runs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from runhealth import ingest  # noqa: E402
from runhealth.alerting import exporter  # noqa: E402
from runhealth.analysis.servermetrics import merge_endpoints  # noqa: E402
from runhealth.collect import collector as collector_mod  # noqa: E402
from runhealth.collect import scheduler  # noqa: E402
from runhealth.collect.collector import Collector  # noqa: E402
from runhealth.payloads import pagedata  # noqa: E402
from runhealth.settings.config import parse_config  # noqa: E402
from runhealth.store import Store  # noqa: E402


def draw_tokens(rng: random.Random) -> int:
    """One simulated completion's length: 5% cut at the 4,096 ceiling, the rest log-normal below it."""
    return 4096 if rng.random() < 0.05 else min(4095, int(rng.lognormvariate(6.8, 0.6)) + 1)


class SimNode:
    """A node's transport: answers polls like the agent, after `rtt_s` of network wait."""

    def __init__(self, index: int, rtt_s: float, per_poll: int = 40):
        self.index, self.rtt_s, self.per_poll = index, rtt_s, per_poll
        self.rng = random.Random(index)

    def request(self, obj: dict, timeout_s: float | None = None) -> dict:
        time.sleep(self.rtt_s)
        state = obj["shards"]["state"]
        files = {}
        for s in range(2):
            path = f"/data/out/shard-{self.index:04d}-{s}.jsonl"
            start = (state.get(path) or {}).get("offset", 0)
            counts: dict[tuple, int] = {}
            for _ in range(self.per_poll // 2):
                tokens = draw_tokens(self.rng)
                key = (tokens, "length" if tokens == 4096 else "stop")
                counts[key] = counts.get(key, 0) + 1
            tokens_total = sum(t * n for (t, _f), n in counts.items())
            end = start + tokens_total * 4
            files[path] = {
                "inode": self.index * 10 + s,
                "size": end,
                "offset_from": start,
                "offset": end,
                "reset": False,
                "lines": self.per_poll // 2,
                "malformed": 0,
                "tokens": tokens_total,
                "counts": [[t, f, 0, n] for (t, f), n in counts.items()],
                "error": None,
            }
        devices = [
            {
                "index": g,
                "name": "NVIDIA H200",
                "uuid": f"GPU-{self.index:04d}-{g}",
                "util_pct": 90 + self.rng.random() * 9,
                "mem_used_mib": 120_000.0,
                "mem_total_mib": 143_771.0,
                "power_w": 600 + self.rng.random() * 90,
                "power_limit_w": 700.0,
                "temp_c": 60.0,
                "sm_clock_mhz": 1980.0,
                "throttle_reasons": [],
                "processes": [],
                "error": None,
            }
            for g in range(8)
        ]
        return {
            "schema_version": 1,
            "ok": True,
            "time_unix": time.time(),
            "agent_ms": 3.0,
            "hostname": "sim",
            "loadavg": [1.0, 1.0, 1.0],
            "gpus": {"source": "nvml", "error": None, "simulated": False, "devices": devices},
            "shards": {"matched": 2, "unmatched_globs": [], "pending_bytes": 0, "files": files},
            "disk": {},
            "metrics": {},
        }

    def close(self) -> None:
        pass


def fleet_config(n: int, store_path: Path, interval_s: float):
    return parse_config(
        {
            "run": {
                "name": "fleet",
                "interval_s": interval_s,
                "store_path": str(store_path),
                "max_output_tokens": 4096,
                "target_completions": 10**9,
            },
            "nodes": [{"name": f"node-{i:04d}", "host": "local", "shards": ["/data/out/*.jsonl"]} for i in range(n)],
        }
    )


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def serial_write_s(store: Store, config, sims: dict) -> tuple[float, float]:
    """One round of store writes done one after another (what the write lock serialises): (wall, CPU) s."""
    replies = []
    for node in config.nodes:
        sims[node.name].rtt_s = 0.0
        replies.append((node.name, sims[node.name].request({"shards": {"state": store.shard_state(node.name)}})))
    wall, cpu = time.perf_counter(), time.process_time()
    for name, reply in replies:  # the collector's one write per poll (counts, hourly lengths, GPUs, metrics)
        now = time.time()
        store.write_poll(name, ingest.read_poll(reply, merge_endpoints(reply)), now, 1.0)
    return time.perf_counter() - wall, time.process_time() - cpu


def parse_span(text: str) -> float:
    """'24h', '90m', '600s' or plain seconds -> seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)


def build_history(store: Store, nodes: int, span_s: float, interval_s: float, end_unix: float) -> float:
    """`span_s` of past polls every `interval_s` ending at `end_unix`, written in bulk SQL (GPU
    samples of 8 GPUs per node, poll deltas): what a collector running that long leaves in its
    store, without polling it. Returns the seconds it took."""
    start, polls = time.perf_counter(), int(span_s // interval_s)
    first = end_unix - polls * interval_s
    with store.transaction() as db:
        db.execute("CREATE TEMP TABLE bench_nodes (i INTEGER PRIMARY KEY, name TEXT)")
        db.executemany("INSERT INTO bench_nodes VALUES (?, ?)", [(i, f"node-{i:04d}") for i in range(nodes)])
        db.execute(
            "INSERT INTO gpu_samples WITH RECURSIVE p(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM p WHERE k < ?),"
            " g(gpu) AS (SELECT 0 UNION ALL SELECT gpu + 1 FROM g WHERE gpu < 7)"
            " SELECT ? + k * ? + i * 0.001, name, gpu, 90 + abs(random() % 900) / 100.0, 120000.0, 143771.0,"
            " 600 + abs(random() % 9000) / 100.0, 700.0, 60.0, 1980.0, 0 FROM p, bench_nodes, g",
            (polls - 1, first, interval_s),
        )
        db.execute(
            "INSERT INTO polls (ts_unix, node, node_ts_unix, completions, tokens, length_stops, malformed, backfill, rtt_ms) WITH RECURSIVE p(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM p WHERE k < ?)"
            " SELECT ? + k * ? + i * 0.001, name, NULL, 40, 40000, 2, 0, 0, 20.0 FROM p, bench_nodes",
            (polls - 1, first, interval_s),
        )
        db.execute(  # each poll's length stops (2 at the ceiling), as write_poll writes them
            "INSERT INTO poll_length_stops WITH RECURSIVE p(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM p WHERE k < ?)"
            " SELECT ? + k * ? + i * 0.001, name, 4096, 2 FROM p, bench_nodes",
            (polls - 1, first, interval_s),
        )
        _history_counts(db, polls, first, interval_s)
        db.execute(
            "INSERT OR REPLACE INTO gpu_seen SELECT name, gpu, ? FROM bench_nodes,"
            " (WITH RECURSIVE g(gpu) AS (SELECT 0 UNION ALL SELECT gpu + 1 FROM g WHERE gpu < 7) SELECT gpu FROM g)",
            (end_unix,),
        )
        db.execute("DROP TABLE bench_nodes")
    return time.perf_counter() - start


def length_pmf(per_poll: int = 40, draws: int = 200_000) -> dict[tuple[int, str], float]:
    """(tokens, finish_reason) -> share of a SimNode's completions: its draw (draw_tokens), sampled
    once (seeded), so the history's length counts look like the ones its polls add."""
    rng, counts = random.Random(0), {}
    for _ in range(draws):
        tokens = draw_tokens(rng)
        key = (tokens, "length" if tokens == 4096 else "stop")
        counts[key] = counts.get(key, 0) + 1
    return {k: n / draws for k, n in counts.items()}


def _history_counts(db: sqlite3.Connection, polls: int, first: float, interval_s: float) -> None:
    """The history's length counts (bench_nodes' nodes): each node's completions of `polls` polls
    of 40 as SimNode draws them, in node_length_counts (every distinct length a row: ~3,000-4,000 a
    node, what a scrape's and the alerts' GROUP BYs scan), in length_counts under the node's first
    shard (with its shards row: the first poll goes on from there) and in the hourly rows."""
    pmf = length_pmf()
    total = polls * 40
    rows = [(t, f, round(share * total)) for (t, f), share in pmf.items() if round(share * total) > 0]
    db.execute("CREATE TEMP TABLE bench_counts (tokens INTEGER, finish_reason TEXT, count INTEGER)")
    db.executemany("INSERT INTO bench_counts VALUES (?, ?, ?)", rows)
    db.execute(
        "INSERT INTO node_length_counts SELECT name, tokens, finish_reason, 0, count FROM bench_nodes, bench_counts"
    )
    db.execute(
        "INSERT INTO length_counts SELECT name, printf('/data/out/shard-%04d-0.jsonl', i), tokens, finish_reason, 0,"
        " count FROM bench_nodes, bench_counts"
    )
    lines, tokens = sum(n for _t, _f, n in rows), sum(t * n for t, _f, n in rows)
    db.execute(  # offset 0: SimNode's offsets start at 0 (its first reply reads on from the stored one)
        "INSERT INTO shards (node, path, inode, offset, size, lines, tokens, updated_unix)"
        " SELECT name, printf('/data/out/shard-%04d-0.jsonl', i), i * 10, 0, 0, ?, ?, ? FROM bench_nodes",
        (lines, tokens, first + polls * interval_s),
    )
    nodes = db.execute("SELECT COUNT(*) FROM bench_nodes").fetchone()[0]
    in_bucket: dict[int, int] = {}  # hour -> polls of a node in it
    for k in range(polls):
        bucket = int((first + k * interval_s) // ingest.HOUR_S * ingest.HOUR_S)
        in_bucket[bucket] = in_bucket.get(bucket, 0) + 1
    hourly: dict[tuple[int, int, int], float] = {}
    for bucket, n in in_bucket.items():
        for (t, f), share in pmf.items():
            key = (bucket, t if f == "length" else ingest.bin_upper(t), int(f == "length"))
            hourly[key] = hourly.get(key, 0.0) + share * 40 * n * nodes
    db.executemany(
        "INSERT INTO length_hourly VALUES (?, ?, ?, 0, 0, ?)", [(*k, round(n)) for k, n in hourly.items() if round(n)]
    )
    db.execute("DROP TABLE bench_counts")


class ThreadCpu:
    """CPU seconds spent inside a function, in whatever thread calls it (time.thread_time)."""

    instances: list[ThreadCpu] = []

    def __init__(self, fn):
        self.fn, self.cpu_s, self.calls, self.lock = fn, 0.0, 0, threading.Lock()
        self.first_s = math.nan  # the first call's
        ThreadCpu.instances.append(self)

    def reset(self) -> None:
        with self.lock:
            self.cpu_s, self.calls = 0.0, 0

    def __call__(self, *a, **kw):
        start = time.thread_time()
        try:
            return self.fn(*a, **kw)
        finally:
            with self.lock:
                self.cpu_s += time.thread_time() - start
                self.first_s = time.thread_time() - start if self.calls == 0 else self.first_s
                self.calls += 1


def measure(n: int, args, tmp: Path) -> dict:
    store_path = tmp / f"fleet-{n}.sqlite3"
    config = fleet_config(n, store_path, args.interval)
    store = Store(store_path)
    sims = {node.name: SimNode(i, args.rtt_ms / 1000) for i, node in enumerate(config.nodes)}
    # The simulated nodes' own CPU (building each reply) is the bench's, not the collector's: counted
    # apart and left out of the collector's figures (at 1,024 nodes ~0.2 ms a poll, ~2% of a core).
    sim_cpu = ThreadCpu(lambda sim, obj, timeout_s=None: SimNode.request(sim, obj, timeout_s))
    for sim in sims.values():
        sim.request = functools.partial(sim_cpu, sim)  # type: ignore[method-assign]
    out: dict = {"nodes": n}
    if args.history:
        out["history_build_s"] = build_history(store, n, parse_span(args.history), args.interval, time.time() - 1)
        # A collector running that long folded its raw rows at most an hour ago: the hourly
        # housekeeping (bench/history.py measures its chunks) is not due in the steady window.
        store.set_meta(collector_mod.HOUSEKEEPING_KEY, {"last_unix": time.time()})
        out["gpu_rows"] = store.cursor("SELECT COUNT(*) FROM gpu_samples").fetchone()[0]
        print(f"{n} nodes: {out['gpu_rows']:,} GPU rows in {out['history_build_s']:.0f} s", file=sys.stderr)
    with Collector(config, store, transports=sims) as collector:
        collector.poll_once()  # first index of every node (backfill)
        if args.history:  # the first page-data pass (every window from scratch), then the steady state
            collector.pagedata.wait_idle(600)
            cpu = time.process_time()
            collector.pagedata.run_now()
            out["first_pass_cpu_s"] = time.process_time() - cpu
            collector.pagedata.run_now = ThreadCpu(collector.pagedata.run_now)  # type: ignore[method-assign]
            collector.alert_history.check = ThreadCpu(collector.alert_history.check)  # type: ignore[method-assign]
            collector.publisher.publish_now = ThreadCpu(collector.publisher.publish_now)  # type: ignore[method-assign]
        # A running collector's /metrics was scraped before: the first scrape after a new ceiling
        # buckets the length counts once (runhealth/store/lengthgroups.py, ~4-5 CPU s at 1,024
        # nodes, polls' writes waiting on its transaction), a one-off that is not the steady state.
        exporter.scrape_text(store)
        rounds = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            collector.poll_once()
            rounds.append(time.perf_counter() - start)
        out["round_s"] = statistics.median(rounds)
        collector.start()
        # The first round is staggered at DEFAULT_CONNECTS_PER_S nodes a second (SSH handshakes):
        # at 1,024 nodes it takes 32 s, over three intervals, and the nodes polled last in it have
        # missed polls no steady state misses (a 60 s window then holds ~0.81 of the polls
        # scheduled in it). The steady window starts once that round is dispatched (--warmup).
        warmup = len(config.nodes) / scheduler.DEFAULT_CONNECTS_PER_S if args.warmup is None else args.warmup
        time.sleep(warmup)
        out["warmup_s"] = warmup
        for wrapped in ThreadCpu.instances:  # what ran during the warm-up is not the window's
            wrapped.reset()
        polls_before = store.query("SELECT COUNT(*) AS n FROM polls")[0]["n"]
        if args.history:  # the long windows come due after a steady window under 90 s: amortised below
            began = collector.pagedata.monotonic()
            collector.pagedata._gpu_done.update({w: began for names in LONG_WINDOWS.values() for w in names})
        cpu0, wall0 = time.process_time(), time.perf_counter()
        scrape = ThreadCpu(lambda: exporter.scrape_text(store))  # what /metrics serves
        while time.perf_counter() - wall0 < args.steady:  # Prometheus scraping /metrics every 15 s
            scrape()
            time.sleep(max(0.0, min(15.0, args.steady - (time.perf_counter() - wall0))))
        out["threads"] = threading.active_count()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        out["sim_share"] = sim_cpu.cpu_s / wall
        cpu -= sim_cpu.cpu_s  # the collector's CPU: the simulated nodes' replies left out
        # The polls the window held, over those it scheduled: its own length (the last scrape may
        # end it past --steady), counted now (the collector polls on until it is stopped).
        polls = store.query("SELECT COUNT(*) AS n FROM polls")[0]["n"] - polls_before
        out["on_time"] = polls / (n * wall / args.interval)
        if args.history:
            page_cpu = collector.pagedata.run_now.cpu_s  # type: ignore[attr-defined]
            out["share"] = {
                "polls + writes": (cpu - page_cpu - scrape.cpu_s) / wall,
                "page data": page_cpu / wall,
                "/metrics": scrape.cpu_s / wall,
            }
            out["alerts_share"] = collector.alert_history.check.cpu_s / wall  # type: ignore[attr-defined]
            out["publish_share"] = collector.publisher.publish_now.cpu_s / wall  # type: ignore[attr-defined]
            out["publish_runs"] = collector.publisher.publish_now.calls  # type: ignore[attr-defined]
            out["page_runs"] = collector.pagedata.run_now.calls  # type: ignore[attr-defined]
            collector.stop()  # no poll or refresh runs beside the forced ones
            collector.pagedata.wait_idle(600)
            out["amortized"] = long_windows(collector.pagedata)
            out["share"]["page data"] += sum(out["amortized"].values())
    out["write_s"], out["write_cpu_s"] = serial_write_s(store, config, sims)
    out["load"] = Path("/proc/loadavg").read_text().split()[0]  # the machine's, after the steady window
    if args.history:
        cpu += sum(out["amortized"].values()) * wall  # the long windows' refreshes the window could not hold
    out.update(
        cpu_share=cpu / wall,
        polls=polls,
        cpu_ms_per_poll=1000 * cpu / max(polls, 1),
        rss_mib=rss_mib(),
        store_mib=store_path.stat().st_size / 2**20,
    )
    start = time.perf_counter()
    exporter.scrape_text(store)
    out["scrape_s"] = time.perf_counter() - start
    if args.pages:
        out["pages"] = render_pages(store_path, config)
    store.close()
    return out


LONG_WINDOWS = {"6 h": ("6 h",), "24 h": ("24 h", "whole run")}  # due every 90 s and 360 s at 240 steps


def long_windows(refresher) -> dict[str, float]:
    """CPU share of the 6 h and 24 h GPU windows, amortised: a steady window shorter than their
    period (90 s, 360 s) holds none of their refreshes, so each is forced due once (the
    incremental bands since the last refresh, and the payload written) and its CPU beyond a
    refresh with none due is divided by its period."""
    out = {}
    for label, names in LONG_WINDOWS.items():
        costs = []
        for forced in ((), names):
            now = refresher.monotonic()
            refresher._gpu_done.update({w: now for w in pagedata.GPU_WINDOWS_S})
            refresher._whatif_done = now
            for w in forced:
                refresher._gpu_done[w] = -math.inf
            cpu = time.thread_time()
            refresher.run_now.fn()
            costs.append(time.thread_time() - cpu)
        period = max(refresher.min_interval_s, pagedata.GPU_WINDOWS_S[names[0]] / pagedata.BAND_POINTS)
        out[label] = max(0.0, costs[1] - costs[0]) / period
    return out


def render_pages(store_path: Path, config) -> dict[str, float]:
    import streamlit as st
    from apppage import open_page

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("streamlit"):
            logging.getLogger(name).setLevel(logging.ERROR)
    toml = store_path.with_suffix(".toml")
    lines = ["[run]", 'name = "fleet"', f'store_path = "{store_path}"', "max_output_tokens = 4096"]
    for node in config.nodes:
        lines += ["[[nodes]]", f'name = "{node.name}"', 'host = "local"', 'shards = ["/data/out/*.jsonl"]']
    toml.write_text("\n".join(lines) + "\n")
    os.environ.update(RUNHEALTH_CONFIG=str(toml), RUNHEALTH_COLLECTOR="off")
    out = {}
    for page in ("overview", "gpus", "nodes"):
        st.cache_data.clear()
        st.cache_resource.clear()
        start = time.perf_counter()
        at = open_page(page, timeout=600).run()
        out[page] = time.perf_counter() - start
        assert not at.exception, [e.value for e in at.exception]
    return out


def _one_run(store_path: str, n: int, args, ready, go, results) -> None:
    """One run's collector over its prepared store: first index and page-data pass, then (once
    `go` is set) `args.steady` s of scheduled polling; puts (run, polls, CPU s, wall s) on `results`."""
    logging.basicConfig(level=logging.WARNING)
    config = fleet_config(n, Path(store_path), args.interval)
    store = Store(store_path)
    sims = {node.name: SimNode(i, args.rtt_ms / 1000) for i, node in enumerate(config.nodes)}
    with Collector(config, store, transports=sims) as collector:
        collector.poll_once()
        collector.pagedata.wait_idle(600)
        collector.pagedata.run_now()
        before = store.query("SELECT COUNT(*) AS n FROM polls")[0]["n"]
        ready.set()
        go.wait()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        collector.start()
        time.sleep(args.steady)
        polls = store.query("SELECT COUNT(*) AS n FROM polls")[0]["n"] - before
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    store.close()
    results.put((Path(store_path).stem, polls, cpu, wall))


def side_by_side(args, tmp: Path) -> None:
    """Two runs of the first --nodes count: one process for both, then a process each (same run)."""
    import multiprocessing
    import queue

    n = int(args.nodes.split(",")[0])
    template = tmp / "template.sqlite3"
    store = Store(template)
    if args.history:
        build_history(store, n, parse_span(args.history), args.interval, time.time() - 1)
        store.set_meta(collector_mod.HOUSEKEEPING_KEY, {"last_unix": time.time()})
    store.close()
    ctx = multiprocessing.get_context("spawn")
    scheduled = n * args.steady / args.interval
    print(
        f"two runs of {n} nodes x 8 GPUs side by side, history {args.history or 'none'}, interval"
        f" {args.interval:g} s, steady window {args.steady:g} s, rtt {args.rtt_ms:g} ms"
    )
    print("| layout | run | polls done / scheduled | CPU share of a core | load |")
    print("|---|---|---:|---:|---:|")
    layouts = ["one process (before)", "a process per run (runprocs)"]
    for k, layout in enumerate(layouts[::-1] if args.per_run_first else layouts):
        paths = []
        for run in ("run-1", "run-2"):
            paths.append(tmp / str(k) / f"{run}.sqlite3")
            paths[-1].parent.mkdir(exist_ok=True)
            with (
                contextlib.closing(sqlite3.connect(template)) as src,
                contextlib.closing(sqlite3.connect(paths[-1])) as dst,
            ):
                src.backup(dst)  # the WAL's pages too (a file copy would leave them behind)
        if layout.startswith("one"):
            results: Any = queue.Queue()
            go = threading.Event()
            readies = [threading.Event() for _ in paths]
            workers: list = [
                threading.Thread(target=_one_run, args=(str(p), n, args, r, go, results))
                for p, r in zip(paths, readies, strict=True)
            ]
        else:
            results, go = ctx.Queue(), ctx.Event()
            readies = [ctx.Event() for _ in paths]
            workers = [
                ctx.Process(target=_one_run, args=(str(p), n, args, r, go, results))
                for p, r in zip(paths, readies, strict=True)
            ]
        for w in workers:
            w.start()
        for r in readies:
            r.wait()
        go.set()
        got = sorted(results.get(timeout=args.steady + 600) for _ in workers)
        for w in workers:
            w.join()
        load = Path("/proc/loadavg").read_text().split()[0]
        for run, polls, cpu, wall in got:
            share = f"{100 * cpu / wall:.1f}%" if not layout.startswith("one") else "(both: one process)"
            print(f"| {layout} | {run} | {polls / scheduled:.2f} | {share} | {load} |", flush=True)
        if layout.startswith("one"):
            print(
                f"| {layout} | both | | {100 * max(c for _r, _p, c, _w in got) / got[0][3]:.1f}% of the process |"
                f" {load} |"
            )


def restart(args, tmp: Path) -> None:
    """A collector restarted on the first --nodes count's store with --history (#42 item 4): from
    start() to the first Overview published and to every page payload written again, and the CPU
    of the first page-data pass after the restart (the one before it, from scratch, for scale)."""
    from runhealth.screens import published

    n = int(args.nodes.split(",")[0])
    store_path = tmp / "restart.sqlite3"
    config = fleet_config(n, store_path, args.interval)
    store = Store(store_path)
    rows = build_history(store, n, parse_span(args.history), args.interval, time.time() - 1)
    store.set_meta(collector_mod.HOUSEKEEPING_KEY, {"last_unix": time.time()})
    sims = {node.name: SimNode(i, args.rtt_ms / 1000) for i, node in enumerate(config.nodes)}
    first = Collector(config, store, transports=sims)
    first.poll_once()
    first.pagedata.wait_idle(600)
    cpu = time.process_time()
    first.pagedata.run_now()
    cold = time.process_time() - cpu
    first.stop()  # the restart: a new Collector, nothing kept in memory
    names = [published.NAME, "truncation_over_time", *(f"gpu:{w}" for w in pagedata.GPU_WINDOWS_S)]
    second = Collector(config, store, transports=sims)
    second.pagedata.run_now = ThreadCpu(second.pagedata.run_now)  # type: ignore[method-assign]
    began_unix, began = time.time(), time.perf_counter()
    second.start()
    seen: dict[str, float] = {}
    while len(seen) < len(names) and time.perf_counter() - began < 900:
        for name in names:
            at = pagedata.computed_at(store, name)
            if name not in seen and at is not None and at >= began_unix:
                seen[name] = time.perf_counter() - began
        time.sleep(0.2)
    second.pagedata.wait_idle(900)
    first_pass = second.pagedata.run_now.first_s  # type: ignore[attr-defined]
    second.stop()
    store.close()
    load = Path("/proc/loadavg").read_text().split()[0]
    gpu_rows = f"{n} nodes x 8 GPUs, {args.history} of history ({rows:.0f} s to build), interval {args.interval:g} s"
    print(gpu_rows)
    print(
        "| pass from scratch (CPU) | restart -> Overview published | -> every page payload | first pass after restart (CPU) | load |"
    )
    print("|---:|---:|---:|---:|---:|")
    every = max(seen.values()) if len(seen) == len(names) else float("nan")
    print(
        f"| {cold:.1f} s | {seen.get(published.NAME, float('nan')):.1f} s | {every:.1f} s | {first_pass:.1f} s | {load} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="64,256,512")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steady", type=float, default=20.0, help="seconds of scheduled polling per node count")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--pages", action="store_true", help="also time cold page renders (slow at 512)")
    parser.add_argument(
        "--history",
        default="",
        help="store history before measuring, e.g. 24h (of --interval polls; 24h x 512 nodes is 35M GPU rows)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds between the collector's start and the steady window (default: its staggered"
        " first round, nodes / 32 s; 0: the window starts with the collector, as before #42 item 3)",
    )
    parser.add_argument("--runs", type=int, default=1, help="2: two runs side by side, one process vs one each")
    parser.add_argument("--per-run-first", action="store_true", help="--runs 2: the per-run layout first")
    parser.add_argument("--restart", action="store_true", help="with --history: a collector restarted on the store")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.restart:
        with tempfile.TemporaryDirectory(prefix="runhealth-fleet-") as tmp:
            restart(args, Path(tmp))
        return
    if args.runs > 1:
        with tempfile.TemporaryDirectory(prefix="runhealth-fleet-") as tmp:
            side_by_side(args, Path(tmp))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="runhealth-fleet-") as tmp:
        for n in (int(x) for x in args.nodes.split(",")):
            results.append(measure(n, args, Path(tmp)))
            print(f"measured {n} nodes", file=sys.stderr, flush=True)
    report(results, args)


def report(results: list[dict], args) -> None:
    base = results[0]
    base_round, base_cpu = base["round_s"] / base["nodes"], base["cpu_ms_per_poll"]
    base_write = base["write_s"] / base["nodes"]
    print(
        f"simulated in-process nodes x 8 GPUs, rtt {args.rtt_ms:g} ms, interval {args.interval:g} s,"
        f" steady window {args.steady:g} s; baseline = {base['nodes']} nodes (same run)"
    )
    print(
        "| nodes | poll round (burst) | × base per node | store writes / round (CPU) | write / node | × base"
        " | CPU ms / poll (steady) | × base | CPU share @ interval | RSS MiB | threads | /metrics scrape |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        per, write = r["round_s"] / r["nodes"], r["write_s"] / r["nodes"]
        print(
            f"| {r['nodes']} | {r['round_s']:.2f} s | {per / base_round:.2f} | {r['write_s']:.2f} s"
            f" ({r['write_cpu_s']:.2f} s) | {1000 * write:.1f} ms | {write / base_write:.2f} |"
            f" {r['cpu_ms_per_poll']:.2f} | {r['cpu_ms_per_poll'] / base_cpu:.2f} | {100 * r['cpu_share']:.0f}% |"
            f" {r['rss_mib']:.0f} | {r['threads']} | {1000 * r['scrape_s']:.0f} ms |"
        )
    last = results[-1]
    write_ms = 1000 * last["write_s"] / last["nodes"]
    cpu_ms = last["cpu_ms_per_poll"]
    print(
        f"\ncapacity at {args.interval:g} s (from the largest run): store writes are serialised, "
        f"{write_ms:.1f} ms wall per node -> {args.interval * 1000 / write_ms:,.0f} nodes;"
        f" CPU {cpu_ms:.2f} ms per poll on one GIL-bound core -> {args.interval * 1000 / cpu_ms:,.0f} nodes;"
        f" the smaller, halved for headroom: {min(args.interval * 1000 / write_ms, args.interval * 1000 / cpu_ms) / 2:,.0f}"
        " nodes"
    )
    if args.history:
        print(f"\nwith {args.history} of history at {args.interval:g} s polls: the collector's CPU share, split")
        print(
            "| nodes | GPU rows | first page-data pass (CPU) | page-data runs | polls + writes (of it alerts;"
            " the Overview published, runs) | page data"
            " (of it 6 h + 24 h windows, amortised) | /metrics | whole collector | per node × base | polls done /"
            " scheduled | simulated nodes (the bench's, left out) | load |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        base_per = base["cpu_share"] / base["nodes"]
        for r in results:
            sh = r["share"]
            print(
                f"| {r['nodes']} | {r['gpu_rows']:,} | {r['first_pass_cpu_s']:.1f} s | {r['page_runs']} |"
                + f" {100 * sh['polls + writes']:.1f}% ({100 * r['alerts_share']:.1f}%;"
                + f" {100 * r['publish_share']:.1f}%, {r['publish_runs']}) | {100 * sh['page data']:.1f}%"
                + f" ({100 * sum(r['amortized'].values()):.1f}%) | {100 * sh['/metrics']:.1f}% |"
                + f" {100 * r['cpu_share']:.1f}% | {r['cpu_share'] / r['nodes'] / base_per:.2f} |"
                + f" {r['on_time']:.2f} | {100 * r['sim_share']:.1f}% | {r['load']} |"
            )
    if args.pages:
        print("\n| nodes | " + " | ".join(results[0]["pages"]) + " |")
        print("|---:|" + "---:|" * len(results[0]["pages"]))
        for r in results:
            print(f"| {r['nodes']} | " + " | ".join(f"{v:.2f} s" for v in r["pages"].values()) + " |")


if __name__ == "__main__":
    main()
