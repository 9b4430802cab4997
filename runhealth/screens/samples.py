"""The Samples page's model: the latest sample batch and what it says, beside the run's exact counts.

`samples(store, config, now)` reads the latest finished sample batch and the run's length counts
(`screens.lengths.counts`: the collector's payload of the ceiling asked for, else counted now) at
one instant, and derives the sample's share at the ceiling with its 95% Wilson interval
(`truncated_in_sample`) and the share of its truncated completions that loop (`loop_share`:
`loops.loop_share` of their tails), each beside the exact count over all completions. The page
(pages/samples.py) lays this out; drawing a new batch is the collector's (components/context).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from runhealth.analysis import loops, stats
from runhealth.analysis.stats import Summary
from runhealth.payloads import pagedata
from runhealth.records import SampleBatch, StoredSample
from runhealth.screens.lengths import counts
from runhealth.settings.config import RunConfig
from runhealth.store import Store


@dataclasses.dataclass(frozen=True)
class Share:
    """k of n with its 95% Wilson interval (lo, hi)."""

    k: int
    n: int
    lo: float
    hi: float

    @property
    def fraction(self) -> float:
        return self.k / self.n


@dataclasses.dataclass(frozen=True)
class LoopShare:
    """How many of the sample's truncated completions loop (`loops.loop_share`)."""

    n: int
    loops: int
    fraction: float | None  # None when n == 0
    lo: float
    hi: float


@dataclasses.dataclass(frozen=True)
class Samples:
    """The Samples page at `now` (see the module docstring)."""

    run: str
    now: float
    batch: SampleBatch | None  # the latest finished batch, with its samples
    summary: Summary  # the run's exact length counts
    loop_share: LoopShare  # among the batch's truncated completions

    @property
    def samples(self) -> list[StoredSample]:
        return self.batch["samples"] if self.batch else []

    @property
    def truncated(self) -> list[StoredSample]:
        """The batch's completions stopped by length."""
        return [s for s in self.samples if s["finish_reason"] == "length"]

    @property
    def truncated_in_sample(self) -> Share | None:
        """The sample's share at the ceiling (None: no ceiling, or no sample)."""
        ceiling, n = self.summary.ceiling_tokens, len(self.samples)
        if not ceiling or not n:
            return None
        k = sum(s["finish_reason"] == "length" and (s["tokens"] or 0) >= ceiling for s in self.samples)
        return Share(k, n, *stats.wilson_interval(k, n))

    def to_json(self) -> dict[str, Any]:
        t = self.truncated_in_sample
        return {
            "run": self.run,
            "now_unix": self.now,
            "batch": self.batch["batch"] if self.batch else None,
            "sampled": len(self.samples),
            "truncated_in_sample": dataclasses.asdict(t) if t else None,
            "truncated_all": {"k": self.summary.at_ceiling, "n": self.summary.length_count},
            "loop_share": dataclasses.asdict(self.loop_share),
        }


def samples(store: Store, config: RunConfig, now: float | None = None) -> Samples:
    """The Samples page of `config`'s run (a RunConfig) at `now`."""
    now = time.time() if now is None else now
    batch = store.latest_sample_batch()
    cut = [s for s in (batch["samples"] if batch else []) if s["finish_reason"] == "length"]
    share = loops.loop_share([s["text_tail"] or "" for s in cut])
    return Samples(
        run=config.name,
        now=now,
        batch=batch,
        summary=counts(store, config.max_output_tokens, pagedata.get(store, "run_lengths")).summary,
        loop_share=LoopShare(share["n"], share["loops"], share["fraction"], *share["interval"]),
    )
