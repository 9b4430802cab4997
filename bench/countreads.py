"""The length counts' reads at fleet scale (#42 item 3): one /metrics scrape, one page-data
refresh's group tables, and a poll's store write, in this tree and in another (`--other DIR`, e.g.
a copy of main), alternating, each part in its own process on its own copy of one store.

Build the store once (bench/fleet.py's `build_history`: every distinct length of every node, an
hour of polls and GPU rows) with `--build N`, then time it:

    python bench/countreads.py --build 1024 --store /tmp/counts-store/fleet-1024.sqlite3
    python bench/countreads.py --store /tmp/counts-store/fleet-1024.sqlite3 --other /tmp/main --rounds 2

CPU seconds (`time.thread_time`, the reading thread only), best of `--repeat`; the first scrape of
a tree is reported apart (in this tree it buckets the stored groups for the ceiling once).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(tree: str, store_path: str, part: str, repeat: int) -> dict:
    """Runs in a subprocess with `tree` first on sys.path: times one part on the store."""
    sys.path[:0] = [tree, str(Path(tree) / "bench"), str(Path(tree) / "tests")]
    from runhealth.store import Store

    cpu = time.thread_time()
    store = Store(store_path)  # migrates a store older than the tree
    out: dict = {"open_cpu_s": time.thread_time() - cpu}
    times = []
    if part == "scrape":
        from runhealth.alerting import exporter

        for _ in range(repeat + 1):
            cpu = time.thread_time()
            text = exporter.scrape_text(store)
            times.append(time.thread_time() - cpu)
        out.update(first_s=times.pop(0), bytes=len(text))
    elif part == "groups":
        from runhealth.analysis import stats
        from runhealth.payloads import pagedata

        lengths = pagedata.run_lengths(store, 4096)  # as compute_all asks: the configured ceiling
        ceiling = stats.summarize(lengths.rows, ceiling=4096, unparseable=lengths.malformed).ceiling_tokens
        for _ in range(repeat):
            cpu = time.thread_time()
            for by in ("node", "shard"):
                pagedata.group_lengths(store, by, ceiling)
            times.append(time.thread_time() - cpu)
    elif part == "write":
        import fleet

        if (Path(tree) / "runhealth/store/lengthgroups.py").exists():  # bucketed as a scrape leaves them
            from runhealth.alerting import countgroups, exporter
            from runhealth.store import lengthgroups

            lengthgroups.cover(store, countgroups.splits_for(exporter.length_buckets(4096), 4096))
        config = fleet.fleet_config(len(store.nodes()), Path(store_path), 10)
        sims = {node.name: fleet.SimNode(i, 0.0) for i, node in enumerate(config.nodes)}
        for _ in range(repeat):
            _wall, cpu_s = fleet.serial_write_s(store, config, sims)
            times.append(cpu_s / len(config.nodes) * 1000)  # ms a poll
    out.update(best=min(times), all=times)
    return out


def _run(tree: Path, store: Path, part: str, repeat: int, scratch: Path) -> dict:
    copy = scratch / f"{part}.sqlite3"
    shutil.copyfile(store, copy)  # each tree its own copy: a write or a migration changes it
    code = f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import countreads;"
    code += f" print(json.dumps(countreads._child({str(tree)!r}, {str(copy)!r}, {part!r}, {repeat})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    copy.unlink()
    return json.loads(done.stdout.strip().splitlines()[-1])


def _build(n: int, store_path: Path) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]
    import fleet

    from runhealth.collect.collector import Collector
    from runhealth.store import Store

    store = Store(store_path)
    fleet.build_history(store, n, 3600, 10, time.time() - 1)
    config = fleet.fleet_config(n, store_path, 10)
    sims = {node.name: fleet.SimNode(i, 0.0) for i, node in enumerate(config.nodes)}
    with Collector(config, store, transports=sims) as collector:  # the run's settings, node rows, a poll
        collector.poll_once()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--build", type=int, help="build the store with this many nodes first")
    ap.add_argument("--other", type=Path, help="another tree (e.g. a copy of main) to time alternately")
    ap.add_argument("--parts", default="scrape,groups,write")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    if args.build:
        _build(args.build, args.store)
    trees = [("branch", ROOT)] + ([("other", args.other.resolve())] if args.other else [])
    scratch = args.store.parent
    for r in range(args.rounds):
        for part in args.parts.split(","):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                got = _run(tree, args.store, part, args.repeat, scratch)
                print(json.dumps({"round": r, "tree": name, "part": part, **got}), flush=True)


if __name__ == "__main__":
    main()
