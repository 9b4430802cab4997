"""Realistic history stores for page tests, built the way the collector builds them.

Every store here is written through `Store.write_poll` (store_fixtures.write_reply: ingest.read_poll, then write_poll) with synthetic agent replies in the wire
shape of docs/design.md (§1 op "poll"), so pages are tested against what the collector really
stores, not against hand-made rows. Scenarios are named after the situation they reproduce:

- `healthy`: 4 nodes x 8 H200s, 1% of completions at the 4096-token ceiling.
- `ceiling_18`: the founding incident: exactly 18% stop at max_tokens=4096 (P90 = P99 = 4096).
- `node_down`: node-3 refused connections for 10 minutes, node-2 is stale (timeouts), node-4 has
  a glob that matches no file and a lost GPU.
- `drift`: node-4 runs with max_tokens=2048 while the rest use 4096 (ceiling drift).
- `empty`: nodes registered, nothing polled yet ("waiting for first poll").
- `big`: 24 h of 10 s GPU samples for 64 GPUs and ~1.5M completions, 18.2% at the ceiling (page-speed bench).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from runhealth import ingest
from runhealth.analysis import loops
from runhealth.node.wire import PollReply
from runhealth.store import Store

CEILING = 4096
RUN_NAME = "gen-run-42"
SCRIPT_TEXT = "<script>alert('pwned')</script> see [link](javascript:alert(1)) **bold**"


def write_config(
    tmp: Path,
    store_path: Path,
    *,
    nodes: int = 4,
    target: int = 50_000,
    interval_s: float = 10,
    max_output_tokens: int | None = CEILING,
) -> Path:
    """A runhealth.toml for the scenario (local hosts; the collector stays off in tests)."""
    lines = [
        "[run]",
        f'name = "{RUN_NAME}"',
        f"target_completions = {target}",
        f"interval_s = {interval_s}",
        f'store_path = "{store_path}"',
    ]
    if max_output_tokens:
        lines.append(f"max_output_tokens = {max_output_tokens}")
    for i in range(1, nodes + 1):
        lines += ["", "[[nodes]]", f'name = "node-{i}"', 'host = "local"', 'shards = ["/data/out/*.jsonl"]']
    path = tmp / "runhealth.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_reply(
    store: Store,
    node: str,
    reply: dict[str, Any],
    ts_unix: float,
    rtt_ms: float | None = None,
    server_metrics: dict[str, float] | None = None,
) -> dict[str, int]:
    """Write an agent's poll reply the collector's way (runhealth/collect/collector.py): read into
    one PollRecord by `ingest.read_poll` (with the server metrics the collector parsed, if any),
    then `Store.write_poll`; returns the deltas it added."""
    return store.write_poll(node, ingest.read_poll(cast(PollReply, reply), server_metrics), ts_unix, rtt_ms)


def gpu_device(
    index: int,
    util: float,
    *,
    power_w: float = 650.0,
    throttle: tuple[str, ...] = (),
    mem_used_mib: float = 120_000,
    temp_c: float = 61,
) -> dict[str, Any]:
    return {
        "index": index,
        "name": "NVIDIA H200",
        "uuid": f"GPU-{index:04d}",
        "util_pct": util,
        "mem_used_mib": mem_used_mib,
        "mem_total_mib": 143_771,
        "power_w": power_w,
        "power_limit_w": 700.0,
        "temp_c": temp_c,
        "sm_clock_mhz": 1980 if not throttle else 1410,
        "throttle_reasons": list(throttle),
        "processes": [
            {"pid": 4100 + index, "name": "python3 -m sglang.launch_server", "mem_used_mib": mem_used_mib - 500}
        ],
        "error": None,
    }


def lengths(rng: random.Random, n: int, trunc_frac: float, ceiling: int = CEILING) -> list[list]:
    """`n` completions as agent count rows: exactly round(n*trunc_frac) at the ceiling,
    ~1 in 100 stopped by the context window below it, the rest lognormal stops."""
    at_ceiling = round(n * trunc_frac)
    c: Counter = Counter()
    c[(ceiling, "length")] += at_ceiling
    for _i in range(n - at_ceiling):
        if rng.random() < 0.01:
            c[(rng.randint(ceiling // 2, ceiling - 1), "length")] += 1
        else:
            c[(min(int(rng.lognormvariate(math.log(900), 0.6)) + 1, ceiling - 1), "stop")] += 1
    return [[t, f, 0, k] for (t, f), k in sorted(c.items())]


def poll_reply(
    node_ts: float,
    devices: list[dict],
    files: dict[str, dict],
    *,
    unmatched: list[str] | None = None,
    pending_bytes: int = 0,
    simulated: bool = False,
    metrics: dict | None = None,
) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "ok": True,
        "time_unix": node_ts,
        "agent_ms": 3.2,
        "hostname": "gpu-host",
        "loadavg": [1.0, 1.1, 1.2],
        "gpus": {"source": "demo" if simulated else "nvml", "error": None, "simulated": simulated, "devices": devices},
        "shards": {
            "matched": len(files),
            "unmatched_globs": unmatched or [],
            "pending_bytes": pending_bytes,
            "files": files,
        },
        "disk": {"/data/out": {"free_bytes": 2.1e12, "total_bytes": 4e12}},
        "metrics": metrics or {},
    }


ROUNDS_PER_COMMIT = 60  # poll rounds written in one transaction while a store is built


@contextlib.contextmanager
def one_transaction(store: Store) -> Iterator[None]:
    """Every write inside goes into one transaction: the same statements in the same order as the
    collector's, one commit instead of one per poll (the bench's 24 h store has 69,120 polls).
    Store.transaction is what every write goes through; inside, it hands out the open one."""
    with store.transaction() as db:
        store.transaction = lambda: contextlib.nullcontext(db)  # type: ignore[method-assign]
        try:
            yield
        finally:
            del store.transaction  # the class's own again


def build_run(
    store: Store,
    *,
    now: float,
    trunc_frac: float,
    nodes: int = 4,
    gpus: int = 8,
    polls: int = 30,
    per_shard: int = 50,
    interval_s: float = 10,
    down: dict[str, float] | None = None,
    unmatched: dict[str, list[str]] | None = None,
    ceilings: dict[str, int] | None = None,
    lost_gpu: str | None = None,
    seed: int = 0,
    failed: dict[str, list[list]] | None = None,
    no_reason: bool = False,
) -> None:
    """`polls` polls per node ending at `now`; `down` maps node -> seconds since its last success;
    `failed`: node -> each shard's failed requests per poll ([[reason, count], ...], #39);
    `no_reason`: the lines carry no finish reason at all (a format the agent cannot read)."""
    rng = random.Random(seed)
    down = down or {}
    state: dict[tuple[str, str], dict] = {}
    for i in range(1, nodes + 1):
        store.register_node(
            f"node-{i}",
            {
                "name": f"node-{i}",
                "host": "local",
                "shards": ["/data/out/*.jsonl"],
                "passphrase_set": True,
                "password_set": False,
            },
        )
    with contextlib.ExitStack() as batch:
        for p in range(polls):
            if p % ROUNDS_PER_COMMIT == 0:
                batch.close()  # commit the rounds so far
                batch.enter_context(one_transaction(store))
            ts = now - (polls - 1 - p) * interval_s - 2
            for i in range(1, nodes + 1):
                node = f"node-{i}"
                if node in down and ts > now - down[node]:
                    store.record_failure(node, _failure(node), ts)
                    continue
                files = {}
                for s in range(2):
                    path = f"/data/out/shard-{i:02d}-{s}.jsonl"
                    st = state.setdefault((node, path), {"inode": 1000 * i + s, "offset": 0})
                    counts = lengths(rng, per_shard, trunc_frac, (ceilings or {}).get(node, CEILING))
                    if no_reason:
                        counts = [[t, None, est, k] for t, _f, est, k in counts]
                    tokens = sum(t * k for t, _, _, k in counts)
                    start, st["offset"] = st["offset"], st["offset"] + tokens * 4 + per_shard * 600
                    files[path] = {
                        "inode": st["inode"],
                        "size": st["offset"],
                        "offset_from": start,
                        "offset": st["offset"],
                        "reset": False,
                        "lines": per_shard,
                        "malformed": 0,
                        "tokens": tokens,
                        "counts": counts,
                        "error": None,
                    }
                    if failed and node in failed:
                        files[path]["failed"] = failed[node]
                devices = [gpu_device(g, 96 - rng.random() * 4) for g in range(gpus)]
                if i == 2:  # one idle and one power-throttled GPU, as on a real node
                    devices[5] = gpu_device(5, 3.0, power_w=90.0)
                    devices[6] = gpu_device(6, 88.0, power_w=699.0, throttle=("sw_power_cap",), temp_c=84)
                if node == lost_gpu:  # gpustat's "GPU is lost": an error entry, no numbers
                    devices[3] = {
                        "index": 3,
                        "name": None,
                        "uuid": None,
                        "error": "GPU is lost",
                        **dict.fromkeys(
                            (
                                "util_pct",
                                "mem_used_mib",
                                "mem_total_mib",
                                "power_w",
                                "power_limit_w",
                                "temp_c",
                                "sm_clock_mhz",
                            )
                        ),
                        "throttle_reasons": [],
                        "processes": [],
                    }
                reply = poll_reply(ts + 0.4, devices, files, unmatched=(unmatched or {}).get(node))
                write_reply(store, node, reply, ts, rtt_ms=12.5)
                made = sum(f["tokens"] for f in files.values())
                store.record_metrics(
                    node, {"sglang:gen_throughput": made / interval_s * (0.97 + rng.random() * 0.06)}, ts
                )


def _failure(node: str) -> str:
    return {"node-3": "connection refused by 10.0.0.3:22"}.get(node, "agent did not answer within 30 s")


def add_samples(store: Store, ceiling: int = CEILING, now: float | None = None) -> int:
    """A finished sample batch: some truncated loops, a truncated non-loop, a hostile text."""
    now = now or time.time()
    batch = store.new_sample_batch(8, now - 30)
    loop = "The answer is 42. " * 200
    rng = random.Random(7)
    words = ["lemma", "bound", "integral", "prime", "graph", "vertex", "thus", "sum", "odd", "field", "ring", "map"]
    samples = []
    for k in range(8):
        truncated = k < 4
        prose = " ".join(rng.choice(words) + str(rng.randint(0, 999)) for _ in range(400))
        text = loop if k in (0, 1) else (SCRIPT_TEXT if k == 2 else prose)
        samples.append(
            {
                "node": f"node-{1 + k % 4}",
                "path": f"/data/out/shard-{1 + k % 4:02d}-0.jsonl",
                "line_no": 10 + k,
                "offset": 1000 * k,
                "tokens": ceiling if truncated else 700 + k,
                "estimated": 0,
                "finish_reason": "length" if truncated else "stop",
                "prompt_head": f"Solve problem #{k}: ...",
                "text_head": text[:400],
                "text_tail": text[-4000:],
                "text_chars": len(text),
                "is_loop": int(loops.loop_score(text)["is_loop"]),
            }
        )
    store.finish_sample_batch(batch, samples, population=12_000, errors={}, ts_unix=now - 20)
    return batch


def make_store(tmp: Path, scenario: str, now: float | None = None) -> tuple[Store, Path]:
    """Build scenario `scenario` under `tmp`; returns (store, config path)."""
    now = now or time.time()
    store_path = tmp / "x.sqlite3"
    store = Store(store_path)
    if scenario == "healthy":
        build_run(store, now=now, trunc_frac=0.01, per_shard=100)
        add_samples(store, now=now)
    elif scenario == "ceiling_18":
        build_run(store, now=now, trunc_frac=0.18)
        add_samples(store, now=now)
    elif scenario == "node_down":
        build_run(
            store,
            now=now,
            trunc_frac=0.01,
            per_shard=100,
            down={"node-3": 600, "node-2": 60},
            unmatched={"node-4": ["/data/extra/*.jsonl"]},
            lost_gpu="node-4",
            polls=80,
        )
    elif scenario == "drift":  # node-4 was launched with max_tokens=2048 by mistake
        build_run(store, now=now, trunc_frac=0.18, ceilings={"node-4": 2048})
    elif scenario == "empty":
        for i in range(1, 5):
            store.register_node(f"node-{i}", {"name": f"node-{i}", "host": "local", "shards": ["/data/out/*.jsonl"]})
    elif scenario == "fleet":  # 64 nodes x 8 GPUs, 6 h of 30 s polls: the fleet-scale views
        build_run(store, now=now, trunc_frac=0.18, nodes=64, gpus=8, polls=720, per_shard=4, interval_s=30)
    elif scenario == "big":
        build_run(store, now=now, trunc_frac=0.18, nodes=8, gpus=8, polls=8640, per_shard=11)
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    return store, write_config(tmp, store_path)
