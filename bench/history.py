"""Store size per GPU-day and per node-day, raw and with rollups; the cost of a fold.

Writes `--days` of 10 s polls for one node with 8 GPUs through `Store.write_poll` (the
collector's own write: poll deltas, GPU samples, a server metric, new length counts and their
hourly rows, in one transaction), then measures each table's bytes with SQLite's `dbstat`:

- raw: every 10 s row kept (the baseline, measured in the same run);
- 1-min tier: after `rollup(raw_keep_s=0)`;
- 10-min tier: after `rollup(raw_keep_s=0, fine_keep_s=0)`.

From those per-day figures it projects a run of 7, 14 and 30 days under the default policy
(24 h raw, 1-min for 7 days, 10-min after) against keeping raw rows, per node and per 512-node
fleet, and times the fold per 10-minute chunk (how long the write lock is held) per node.

    python bench/history.py [--days 2]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from fleet import SimNode  # noqa: E402

from runhealth import ingest  # noqa: E402
from runhealth.store import Store, rollup  # noqa: E402

DAY = 86400.0
SERIES = ("gpu_samples", "polls", "metric_samples", "gpu_rollup", "poll_rollup", "metric_rollup")


def table_bytes(store: Store) -> dict[str, int]:
    rows = store.query("SELECT name, SUM(pgsize) AS b FROM dbstat GROUP BY name")
    return {r["name"]: r["b"] for r in rows}


def series_bytes(store: Store) -> int:
    """Bytes of the time-series tables and their indexes (counts and shards do not grow with time)."""
    sizes = table_bytes(store)
    return sum(
        b
        for name, b in sizes.items()
        if name.startswith(SERIES)
        or name.startswith("sqlite_autoindex_gpu_roll")
        or name.startswith(("sqlite_autoindex_poll_roll", "sqlite_autoindex_metric_roll"))
    )


def fill(store: Store, days: float, now: float) -> None:
    sim = SimNode(7, 0.0, per_poll=8)
    sim.rng = random.Random(7)
    t = now - days * DAY
    store.register_node("node-0007", {"name": "node-0007"})
    while t < now:
        reply = sim.request({"shards": {"state": store.shard_state("node-0007")}})
        metrics = {"sglang:gen_throughput": 1500.0 + random.random()}
        store.write_poll("node-0007", ingest.read_poll(reply, metrics), t, 5.0)
        t += 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=2.0)
    args = parser.parse_args()
    now = (time.time() // 600) * 600
    with tempfile.TemporaryDirectory(prefix="runhealth-history-") as tmp:
        store = Store(Path(tmp) / "h.sqlite3")
        start = time.perf_counter()
        fill(store, args.days, now)
        fill_s = time.perf_counter() - start
        raw = series_bytes(store) / args.days
        raw_gpu = sum(b for n, b in table_bytes(store).items() if n.startswith("gpu_samples")) / args.days / 8
        start = time.perf_counter()
        rollup.rollup(store, now=now, raw_keep_s=0, fine_keep_s=30 * DAY, pause_s=0.0)
        fold_s = time.perf_counter() - start
        chunks = args.days * DAY / rollup.CHUNK_S
        fine = series_bytes(store) / args.days
        fine_gpu = table_bytes(store).get("gpu_rollup", 0) / args.days / 8
        rollup.rollup(store, now=now, raw_keep_s=0, fine_keep_s=0, pause_s=0.0)
        coarse = series_bytes(store) / args.days
        coarse_gpu = table_bytes(store).get("gpu_rollup", 0) / args.days / 8
    kib = 1024
    print(f"1 node x 8 GPUs, {args.days:g} days of 10 s polls written through Store.write_poll in {fill_s:.0f} s")
    print("| tier | per node-day (all series) | per GPU-day (GPU samples) | × raw |")
    print("|---|---:|---:|---:|")
    for name, node_b, gpu_b in (
        ("raw 10 s (baseline)", raw, raw_gpu),
        ("1-min rollup", fine, fine_gpu),
        ("10-min rollup", coarse, coarse_gpu),
    ):
        print(f"| {name} | {node_b / kib:,.0f} KiB | {gpu_b / kib:,.0f} KiB | {node_b / raw:.3f} |")
    print("\n| run length | raw kept (per node) | rollups (per node) | 512 nodes, raw | 512 nodes, rollups |")
    print("|---:|---:|---:|---:|---:|")
    for days in (7, 14, 30):
        policy = raw * 1 + fine * min(6, days - 1) + coarse * max(0, days - 7)
        print(
            f"| {days} d | {raw * days / 2**20:,.0f} MiB | {policy / 2**20:,.1f} MiB |"
            f" {512 * raw * days / 2**30:,.1f} GiB | {512 * policy / 2**30:,.1f} GiB |"
        )
    per_chunk = fold_s / chunks
    print(
        f"\nfold raw -> 1 min: {1000 * per_chunk:.1f} ms per node per {rollup.CHUNK_S:.0f} s chunk;"
        f" at 512 nodes ~{512 * per_chunk:.1f} s of write lock per chunk (pollers wait that long once per chunk)"
    )


if __name__ == "__main__":
    main()
