"""Many shards, live shards, a stalled tail: the collector's poll budget and schedule measured.

    python bench/shards.py                                   # every case, default sizes
    python bench/shards.py --cases many --files 2000         # a quick look
    python bench/shards.py --cases many,oneline,live,stalled --files 10000 --lines 10 \
        --oneline-files 100000 --interval 2 --max-s 180

Each case runs a real collector (LocalTransport: the agent as a subprocess) into a fresh store:

- many:    --files shards x --lines lines, indexed from nothing. Baseline in the same run:
           `runhealth scan` (a subprocess) over the same files. Prints both times, their ratio
           and the collector's time against "scan time + two poll intervals" (the goal).
- oneline: --oneline-files one-line shards, indexed from nothing (goal: within 2 minutes).
- live:    300 finished shards + 8 live ones written to all the time; after the first index,
           polls per interval in steady state (goal: exactly one) and how many were backfill
           (a backfill poll is not throughput: tok/s and the ETA need polls that are not).
- stalled: one shard whose last line (58 bytes) has no newline and never grows, beside a live
           shard: polls per interval (goal: one; the tail is not work the collector can do).

A case that does not finish within --max-s stops there and says how far it got. The machine's
load is printed before and after. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from runhealth.collect.collector import Collector
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store

ROOT = Path(__file__).resolve().parent.parent


def line(i: int) -> str:
    reason = "length" if i % 6 == 0 else "stop"
    tokens = 4096 if reason == "length" else 100 + i % 3000
    body = {
        "id": f"c{i}",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 60}, "finish_reason": reason}],
        "usage": {"prompt_tokens": 12, "completion_tokens": tokens},
    }
    return json.dumps(body) + "\n"


def write_shards(folder: Path, files: int, lines: int, start: int = 0) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(files):
        with open(folder / f"shard-{start + k:06d}.jsonl", "w") as f:
            f.writelines(line(k * lines + j) for j in range(lines))
    return files * lines


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def node(glob: str, timeout_s: float) -> NodeConfig:
    return NodeConfig(
        name="n1", host="local", shards=[glob], python=sys.executable, gpu="off", command_timeout_s=timeout_s
    )


def counted(store: Store) -> int:
    return sum(r["completions"] for r in store.nodes())


def collect_until(glob: str, want: int, store_path: Path, interval_s: float, max_s: float, timeout_s: float):
    """Run a collector until the store holds `want` lines (or max_s): (seconds, lines, polls)."""
    config = RunConfig(name="bench", nodes=[node(glob, timeout_s)], interval_s=interval_s)
    store = Store(store_path)
    collector = Collector(config, store)
    t0 = time.monotonic()
    collector.start()
    try:
        while time.monotonic() - t0 < max_s and counted(store) < want:
            time.sleep(0.05)
        took = time.monotonic() - t0
    finally:
        collector.stop()
    return took, counted(store), len(store.polls(node="n1"))


def scan_baseline(glob: str) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "runhealth", "scan", glob], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.monotonic() - t0


def case_many(tmp: Path, args: argparse.Namespace) -> None:
    want = write_shards(tmp / "many", args.files, args.lines)
    glob = str(tmp / "many" / "*.jsonl")
    scan_s = scan_baseline(glob)
    took, got, polls = collect_until(glob, want, tmp / "many.sqlite3", args.interval, args.max_s, args.timeout)
    goal = scan_s + 2 * args.interval
    print(
        f"many     {args.files} x {args.lines} lines: runhealth scan {scan_s:.2f} s; collector {took:.2f} s"
        f" ({got:,}/{want:,} counted, {polls} polls); collector/scan {took / scan_s:.1f}x;"
        f" goal scan + 2 intervals = {goal:.2f} s: {'met' if got == want and took <= goal else 'NOT met'}"
    )


def case_oneline(tmp: Path, args: argparse.Namespace) -> None:
    want = write_shards(tmp / "one", args.oneline_files, 1)
    glob = str(tmp / "one" / "*.jsonl")
    scan_s = scan_baseline(glob)
    took, got, polls = collect_until(glob, want, tmp / "one.sqlite3", args.interval, args.max_s, args.timeout)
    print(
        f"oneline  {args.oneline_files} x 1 line: runhealth scan {scan_s:.2f} s; collector {took:.2f} s"
        f" ({got:,}/{want:,} counted, {polls} polls); goal 120 s: {'met' if got == want and took <= 120 else 'NOT met'}"
    )


def steady_polls(glob: str, store_path: Path, args: argparse.Namespace, writers: list[Path], warm_lines: int):
    """Polls in a window of steady state while `writers` get a line every 0.05 s each."""
    config = RunConfig(name="bench", nodes=[node(glob, args.timeout)], interval_s=args.interval)
    store = Store(store_path)
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            for p in writers:
                with open(p, "a") as f:
                    f.write(line(i))
            i += 1
            stop.wait(0.05)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    collector = Collector(config, store)
    collector.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.max_s and counted(store) < warm_lines:
            time.sleep(0.05)
        time.sleep(2 * args.interval)  # past the first index and any catch-up
        before = time.time()
        time.sleep(args.window)
        polls = [p for p in store.polls(node="n1") if p["ts_unix"] >= before]
    finally:
        collector.stop()
        stop.set()
        writer.join()
    intervals = args.window / args.interval
    backfill = sum(1 for p in polls if p["backfill"])
    return len(polls) / intervals, backfill, len(polls)


def case_live(tmp: Path, args: argparse.Namespace) -> None:
    folder = tmp / "live"
    finished = write_shards(folder, 300, args.lines)
    write_shards(folder, 8, 1, start=300)
    live = [folder / f"shard-{300 + k:06d}.jsonl" for k in range(8)]
    rate, backfill, n = steady_polls(str(folder / "*.jsonl"), tmp / "live.sqlite3", args, live, finished)
    print(
        f"live     300 finished + 8 live shards: {rate:.2f} polls per interval over {args.window:.0f} s"
        f" ({n} polls, {backfill} marked backfill); goal 1 poll per interval, none backfill"
    )


def case_stalled(tmp: Path, args: argparse.Namespace) -> None:
    folder = tmp / "stalled"
    write_shards(folder, 1, 20)
    with open(folder / "shard-000000.jsonl", "a") as f:
        f.write(line(99)[:58])  # a writer that crashed mid-line
    write_shards(folder, 1, 1, start=1)
    rate, backfill, n = steady_polls(
        str(folder / "*.jsonl"), tmp / "stalled.sqlite3", args, [folder / "shard-000001.jsonl"], 21
    )
    print(
        f"stalled  58-byte unterminated tail + 1 live shard: {rate:.2f} polls per interval over {args.window:.0f} s"
        f" ({n} polls, {backfill} marked backfill, {max(0.0, n - args.window / args.interval):.0f} extra);"
        " goal 1 poll per interval, no extra"
    )


CASES = {"many": case_many, "oneline": case_oneline, "live": case_live, "stalled": case_stalled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="many,oneline,live,stalled")
    parser.add_argument("--files", type=int, default=10_000, help="shards in the 'many' case")
    parser.add_argument("--lines", type=int, default=10, help="lines per shard ('many', finished 'live' shards)")
    parser.add_argument("--oneline-files", type=int, default=100_000, help="shards in the 'oneline' case")
    parser.add_argument("--interval", type=float, default=2.0, help="the collector's interval_s")
    parser.add_argument("--timeout", type=float, default=20.0, help="command_timeout_s (scan budget_s = 1/4, <= 5 s)")
    parser.add_argument("--window", type=float, default=10.0, help="steady-state window in seconds")
    parser.add_argument("--max-s", type=float, default=180.0, help="give a case up after this long")
    args = parser.parse_args()
    print(f"load before: {loadavg()}  (cpus: {os.cpu_count()})")
    with tempfile.TemporaryDirectory(prefix="runhealth-shards-") as tmp:
        for name in args.cases.split(","):
            CASES[name](Path(tmp), args)
            print(f"  load: {loadavg()}", flush=True)


if __name__ == "__main__":
    main()
