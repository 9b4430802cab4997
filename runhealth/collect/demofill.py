"""The demo's finished run filled as its live collector once collected it (issue #41: demo.py
writes shards and names the runs, below collect/; filling a store through the real collector is
collect/'s side, so the two packages no longer import each other).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from runhealth.collect.collector import Collector
from runhealth.demo import (
    CEILING,
    DEMO_CONTEXT,
    FINISHED_COMPLETIONS,
    FINISHED_POLLS,
    TOKENS_PER_S_PER_WORKER,
    Simulator,
)
from runhealth.settings.config import RunConfig
from runhealth.store import Store


def fill_finished(
    config: RunConfig,
    store: Store,
    seed: int | None = None,
    end_unix: float | None = None,
    *,
    ceiling: int = CEILING,
    tokens_per_s: float = TOKENS_PER_S_PER_WORKER,
    completions: int = FINISHED_COMPLETIONS,
    polls: int = FINISHED_POLLS,
    ended_s_ago: float = 600,
) -> bool:
    """Write run A's shards and collect them as its live collector once did, poll by poll.

    The shards are written in FINISHED_POLLS steps; after each step every node is polled
    through the real agent, with the collector's clock set to when that step would have
    happened at the simulator's rate (the last one `ended_s_ago` before `end_unix`), so the
    store holds the finished run's lengths, GPUs and rate history. False when the store
    already holds the run (nothing done).
    """
    if any(n.get("last_ok_unix") for n in store.nodes()):
        return False
    sim = Simulator(
        Path(config.nodes[0].shards[0]).parent.parent, seed=seed, ceiling=ceiling, tokens_per_s=tokens_per_s
    )
    sim.shard_dir.mkdir(parents=True, exist_ok=True)
    for old in sim.shard_dir.glob("*.jsonl"):  # a half-written earlier attempt
        old.unlink()
    step = completions // polls
    span = step / sim.completions_per_s()
    t = (end_unix or time.time()) - ended_s_ago - span * (polls - 1)
    # Its clock at the first poll: the run's "new run" event (a marker on its charts) is when it began.
    collector = Collector(config, store, context=DEMO_CONTEXT, clock=_fixed_clock(t))
    collector.claim()  # the finished run's settings and nodes, written under its store's lock
    try:
        for _ in range(polls):
            sim.write_backlog(step)
            for poller in collector.pollers.values():
                poller.clock = _fixed_clock(t)
                poller.poll_until_indexed()
            t += span
    finally:
        collector.stop()  # closes the transports, releases the lock
    return True


def _fixed_clock(t: float) -> Callable[[], float]:
    return lambda: t
