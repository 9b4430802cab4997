"""Backfill throughput of the real agent with 1, 2, ... worker processes (a node's first scan).

    python bench/backfill.py --mb 512 --workers 1,2

Writes --mb MB of bench/scan.py lines (--style, default mixed) as --shards shards, reads them
once to warm the page cache, then for each worker count starts the agent exactly as a node
does (`python -c protocol.BOOTSTRAP`, sources in the first frame), and sends polls with
`scan_workers` set until nothing is pending, as the collector's first index does. Prints the
time, MB/s, speed-up over 1 worker and scaling efficiency (speed-up / workers), and checks
every run counted the same lines. On a machine with fewer free cores than workers the
efficiency says so. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from scan import STYLES, make_shard, time_read  # noqa: E402

from runhealth.node import wire  # noqa: E402
from runhealth.remote import protocol  # noqa: E402


def frame(obj) -> bytes:
    data = json.dumps(obj).encode()
    return b"%d\n%s" % (len(data), data)


def read_reply(stream) -> dict:
    return wire.read_frame(stream, sync=True)


def backfill(paths: list[str], workers: int, budget: int) -> dict:
    """Index every shard with a fresh agent; seconds, CPU seconds (agent and workers), polls, lines."""
    cpu0 = _children_cpu()
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", protocol.BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        proc.stdin.write(protocol.program_frame(include_pynvml=False))
        state, polls, lines, used = {}, 0, 0, set()
        t0 = time.perf_counter()
        while True:
            proc.stdin.write(
                frame(
                    {
                        "op": "poll",
                        "gpu": "off",
                        "shards": {"globs": paths, "state": state, "budget_bytes": budget, "scan_workers": workers},
                    }
                )
            )
            proc.stdin.flush()
            reply = read_reply(proc.stdout)
            assert reply["ok"], reply
            polls += 1
            used.add(reply["shards"]["scan_workers"])
            for p, e in reply["shards"]["files"].items():
                state[p] = {"inode": e["inode"], "offset": e["offset"]}
                lines += e["lines"]
            if not reply["shards"]["pending_bytes"]:
                break
        secs = time.perf_counter() - t0
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    return {"s": secs, "cpu": _children_cpu() - cpu0, "polls": polls, "lines": lines, "used": sorted(used)}


def _children_cpu() -> float:
    """CPU seconds of reaped children: the agent and, through it, its workers."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512, help="total MB over all shards")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--style", choices=STYLES, default="mixed")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--budget-mb", type=int, default=256, help="budget_bytes per poll (per worker)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="runhealth-backfill-") as tmp:
        paths = []
        for i in range(args.shards):
            path = Path(tmp) / f"shard-{i}.jsonl"
            make_shard(path, max(1, args.mb // args.shards), args.style)
            time_read(path)
            paths.append(str(path))
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        runs = {
            w: min((backfill(paths, w, args.budget_mb << 20) for _ in range(args.repeat)), key=lambda r: r["s"])
            for w in counts
        }
    assert len({r["lines"] for r in runs.values()}) == 1, runs
    print(
        f"{args.style}: {mb:.0f} MB in {args.shards} shards, {runs[counts[0]]['lines']} lines; "
        f"{os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f}); best of {args.repeat}; Python {sys.version.split()[0]}"
    )
    print(
        f"{'workers':>8}{'s':>8}{'MB/s':>8}{'CPU s':>8}{'MB/CPU-s':>10}{'polls':>7}{'speed-up':>10}"
        f"{'efficiency':>12}  worker processes used"
    )
    base = runs[counts[0]]["s"] * counts[0]
    for w, r in runs.items():
        speedup = base / r["s"]
        print(
            f"{w:>8}{r['s']:>8.2f}{mb / r['s']:>8.0f}{r['cpu']:>8.2f}{mb / r['cpu']:>10.0f}{r['polls']:>7}"
            f"{speedup:>10.2f}{speedup / w:>12.0%}  {r['used']}"
        )
    print(
        "speed-up: wall time against the first row; efficiency = speed-up / workers. CPU s: the agent's "
        "and its workers' CPU time (the parallel overhead is the growth of this column)."
    )


if __name__ == "__main__":
    main()
