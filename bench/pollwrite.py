"""A poll's store write on its own: CPU per `Store.write_poll` at fleet scale (#42 item 3).

Builds (once, `--build`) a store of `--nodes` nodes x 8 GPUs with `--history` of past polls and
length counts (bench/fleet.py's build_history) and one poll of every node on it, then, on a copy
of it, writes `--rounds` rounds of every node's poll (bench/fleet.py's SimNode replies, read with
ingest.read_poll first, not timed) one after another in this thread, and reports the thread CPU
per poll (time.thread_time around write_poll alone), median over rounds. With `--profile` it
prints cProfile's top functions of one round instead.

Run it from two trees on the same built store (the copy is per run) to compare them:

    python bench/pollwrite.py --build /tmp/pw/base.sqlite3 --nodes 1024 --history 1h
    python bench/pollwrite.py --store /tmp/pw/base.sqlite3 --rounds 3
    (cd /tmp/other-tree && python /path/to/bench/pollwrite.py --store /tmp/pw/base.sqlite3 --rounds 3)
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.getcwd()) if (Path(os.getcwd()) / "runhealth").is_dir() else Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from fleet import SimNode, build_history, parse_span  # noqa: E402

from runhealth import ingest  # noqa: E402
from runhealth.analysis.servermetrics import merge_endpoints  # noqa: E402
from runhealth.store import Store  # noqa: E402

INTERVAL_S = 10.0
SAVEPOINTS = os.environ.get("POLLWRITE_SAVEPOINTS", "1") == "1"


def replies(store: Store, sims: dict[str, SimNode]) -> list[tuple[str, ingest.PollRecord]]:
    """One poll of every node, as the collector reads it before writing (not timed)."""
    out = []
    for name, sim in sims.items():
        reply = sim.request({"shards": {"state": store.shard_state(name)}})
        out.append((name, ingest.read_poll(reply, merge_endpoints(reply))))
    return out


def write_round(store: Store, polls: list[tuple[str, ingest.PollRecord]], now: float, group: int = 1) -> float:
    """Write each poll in turn (`group` > 1: that many polls a transaction, each in a SAVEPOINT,
    as runhealth/store/groupwrites.py does); returns the thread CPU seconds of the writes alone."""
    cpu = 0.0
    if group <= 1:
        for name, record in polls:
            start = time.thread_time()
            store.write_poll(name, record, now, 20.0, INTERVAL_S)
            cpu += time.thread_time() - start
        return cpu
    for i in range(0, len(polls), group):
        start = time.thread_time()
        with store.transaction() as db:
            for name, record in polls[i : i + group]:
                if SAVEPOINTS:
                    db.execute("SAVEPOINT poll")
                store.write_poll_in(db, name, record, now, 20.0, INTERVAL_S)
                if SAVEPOINTS:
                    db.execute("RELEASE poll")
        cpu += time.thread_time() - start
    return cpu


def paced(store: Store, sims: dict[str, SimNode], rounds: int, grouped: bool) -> None:
    """The collector's shape without its network: every node's poll once an interval (a poll
    every INTERVAL_S / nodes seconds) on a pool of 32 threads, each holding a 20 ms round trip
    (a sleep) before its write; the write `Store.write_poll` in the pool thread (`alone`, as main
    does) or handed to a GroupWriter (`grouped`). Process CPU per poll over the rounds (every
    thread's: the writer's too), the replies read beforehand."""
    from concurrent.futures import ThreadPoolExecutor

    from runhealth.collect.groupwriter import GroupWriter

    writer = GroupWriter(store)

    def one(name: str, record: ingest.PollRecord, now: float) -> None:
        with writer.polling():
            time.sleep(0.02)
            (writer.write_poll if grouped else store.write_poll)(name, record, now, 20.0, INTERVAL_S)

    step = INTERVAL_S / len(sims)
    polls = [replies(store, sims) for _ in range(1)][0]
    cpu, n = 0.0, 0
    with ThreadPoolExecutor(32) as pool:
        for k in range(rounds):
            if k:
                polls = replies(store, sims)
            start, began = time.process_time(), time.monotonic()
            futures = []
            for i, (name, record) in enumerate(polls):
                time.sleep(max(0.0, began + i * step - time.monotonic()))
                futures.append(pool.submit(one, name, record, time.time()))
            for f in futures:
                f.result()
            cpu += time.process_time() - start
            n += len(polls)
    writer.stop()
    groups = f"; {writer.polls / max(1, writer.groups):.1f} polls a group" if grouped else ""
    print(
        f"{ROOT.name} paced {'grouped' if grouped else 'alone'}: process CPU a poll {cpu / n * 1000:.3f} ms"
        f" ({rounds} rounds of {len(polls)}{groups}; load {os.getloadavg()[0]:.2f})"
    )


def overview_builds(store: Store, sims: dict[str, SimNode], builds: int) -> None:
    """The Overview as the collector's Publisher builds it (published.publish), `builds` times with
    150 polls written before each (what ~1.5 s of a 1,024-node fleet's polls write); thread CPU
    of each build, the first (every node's poll rows read from SQL) apart."""
    from fleet import fleet_config

    from runhealth.screens import published

    config = fleet_config(len(sims), store.path, INTERVAL_S)
    cpu = []
    for k in range(builds + 1):
        write_round(store, replies(store, dict(list(sims.items())[150 * k : 150 * (k + 1)])), time.time())
        start = time.thread_time()
        published.publish(store, config, time.time())
        cpu.append(time.thread_time() - start)
    print(
        f"{ROOT.name}: Overview build CPU {statistics.median(cpu[1:]):.3f} s (first {cpu[0]:.3f} s;"
        f" builds: {', '.join(f'{x:.3f}' for x in cpu[1:])}; {len(sims)} nodes; load {os.getloadavg()[0]:.2f})"
    )


def build(path: Path, nodes: int, history_s: float) -> None:
    store = Store(path)
    build_history(store, nodes, history_s, INTERVAL_S, time.time() - INTERVAL_S)
    sims = {f"node-{i:04d}": SimNode(i, 0.0) for i in range(nodes)}
    write_round(store, replies(store, sims), time.time())  # each node's first poll (backfill)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, help="build the store here and exit")
    ap.add_argument("--store", type=Path, help="a built store (copied per run)")
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--history", default="1h")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--pragma", action="append", default=[], help="e.g. cache_size=-65536 (this thread's connection)")
    ap.add_argument("--builds", type=int, default=0, help="instead: this many Overview builds, 150 polls apart")
    ap.add_argument(
        "--paced", choices=("alone", "grouped"), help="instead: the collector's shape (a pool, paced polls)"
    )
    ap.add_argument("--group", type=int, default=1, help="polls a transaction (1: write_poll's own)")
    args = ap.parse_args()
    if args.build:
        build(args.build, args.nodes, parse_span(args.history))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.sqlite3"
        shutil.copy(args.store, path)
        store = Store(path)
        for pragma in args.pragma:
            store.cursor(f"PRAGMA {pragma}").fetchall()
        names = [r[0] for r in store.cursor("SELECT name FROM nodes ORDER BY name")]
        sims = {name: SimNode(i + 7, 0.0) for i, name in enumerate(names)}  # other draws than the build's
        if args.paced:
            paced(store, sims, args.rounds, args.paced == "grouped")
            return
        if args.builds:
            overview_builds(store, sims, args.builds)
            return
        per_poll = []
        for k in range(args.rounds):
            polls = replies(store, sims)
            now = time.time() + k * INTERVAL_S
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                write_round(store, polls, now, args.group)
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                return
            per_poll.append(write_round(store, polls, now, args.group) / len(polls) * 1000)
        print(
            f"{ROOT.name} group {args.group} {' '.join(args.pragma)}: write_poll CPU a poll {statistics.median(per_poll):.3f} ms"
            f" (rounds: {', '.join(f'{x:.3f}' for x in per_poll)}; {len(names)} nodes; load {os.getloadavg()[0]:.2f})"
        )


if __name__ == "__main__":
    main()
