"""The Samples page's model: the latest sample batch and what it says, beside the run's exact counts.

`samples(store, config, now)` reads the latest finished sample batch and the run's length counts
(`screens.lengths.counts`: the collector's payload of the ceiling asked for, else counted now) at
one instant, and derives the sample's share at the ceiling with its 95% Wilson interval
(`truncated_in_sample`) and the share of its truncated completions that loop (`loop_share`:
`loops.loop_share` of their tails), each beside the exact count over all completions, and the
truncated ones that never answered (`never_answered`, #33 item 3: judged from the stored text by
`answer_empty`, beside the scan's exact count in `cut_split`). The page
(pages/samples.py) lays this out; drawing a new batch is the collector's (components/context).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from runhealth.analysis import continuation as continuation  # the continuation job (components/whatif_view.py)
from runhealth.analysis import fieldfigures, loops, stats
from runhealth.analysis.stats import Summary
from runhealth.payloads import pagedata
from runhealth.payloads.pagetypes import RunLengths
from runhealth.records import SampleBatch, StoredSample
from runhealth.screens import fieldmodel, fieldpanels
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


NEVER_ANSWERED_RULE = (
    "judged from the text each sample keeps (its first 400 and last 4,000 characters): the answer after the"
    " reasoning is empty (the node joins reasoning and answer with a blank line, so the text ends in one), or a"
    " <think> is opened and never closed in the text kept. An answer that itself ends in a blank line, or a"
    " </think> in the part not kept, is misread; the exact count is the scan's, beside it."
)


def sample_key(s: StoredSample) -> tuple[Any, ...]:
    """Which line a sample is (node, shard, line)."""
    return s["node"], s["path"], s["line_no"], s["offset"]


def answer_empty(s: StoredSample) -> bool:
    """Whether a sample's stored text shows an empty answer part (NEVER_ANSWERED_RULE)."""
    head, tail = s["text_head"] or "", s["text_tail"] or ""
    if not (head or tail):
        return False
    if tail.endswith("\n\n"):
        return True
    opened = head.rfind("<think>") if "<think>" in head else -1
    return opened >= 0 and "</think>" not in head[opened:] and "</think>" not in tail


@dataclasses.dataclass(frozen=True)
class Samples:
    """The Samples page at `now` (see the module docstring)."""

    run: str
    now: float
    batch: SampleBatch | None  # the latest finished batch, with its samples
    summary: Summary  # the run's exact length counts
    loop_share: LoopShare  # among the batch's truncated completions
    cut_split: fieldpanels.CutSplit | None = None  # the scan's exact never-answered count (#33)

    @property
    def samples(self) -> list[StoredSample]:
        return self.batch["samples"] if self.batch else []

    @property
    def truncated(self) -> list[StoredSample]:
        """The batch's completions stopped by length."""
        return [s for s in self.samples if s["finish_reason"] == "length"]

    @property
    def never_answered(self) -> list[StoredSample]:
        """The batch's completions cut at the ceiling whose answer part is empty (answer_empty)."""
        ceiling = self.summary.ceiling_tokens
        return [s for s in self.truncated if (not ceiling or (s["tokens"] or 0) >= ceiling) and answer_empty(s)]

    @property
    def cut_at_ceiling(self) -> int:
        """The batch's `length` stops at the ceiling (the never-answered share's n)."""
        ceiling = self.summary.ceiling_tokens
        return sum(1 for s in self.truncated if not ceiling or (s["tokens"] or 0) >= ceiling)

    @property
    def never_answered_in_sample(self) -> Share | None:
        """Among the batch's cuts at the ceiling, the share that never answered (None: no cut)."""
        n = self.cut_at_ceiling
        if not n:
            return None
        k = len(self.never_answered)
        return Share(k, n, *stats.wilson_interval(k, n))

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
            "never_answered_in_sample": {"k": len(self.never_answered), "n": self.cut_at_ceiling},
            "never_answered_all": dataclasses.asdict(self.cut_split) if self.cut_split else None,
        }


def samples(store: Store, config: RunConfig, now: float | None = None) -> Samples:
    """The Samples page of `config`'s run (a RunConfig) at `now`, read from one snapshot of the
    store (the sample, the run's counts and the never-answered figure as of one commit: #41)."""
    now = time.time() if now is None else now
    with store.snapshot():
        return _samples(store, config, now)


def _samples(store: Store, config: RunConfig, now: float) -> Samples:
    batch = store.latest_sample_batch()
    cut = [s for s in (batch["samples"] if batch else []) if s["finish_reason"] == "length"]
    share = loops.loop_share([s["text_tail"] or "" for s in cut])
    summary = counts(store, config.max_output_tokens, pagedata.get(store, "run_lengths", RunLengths)).summary
    return Samples(
        run=config.name,
        now=now,
        batch=batch,
        summary=summary,
        loop_share=LoopShare(share["n"], share["loops"], share["fraction"], *share["interval"]),
        cut_split=fieldpanels.cut_split(never_answered_figure(store, summary)),
    )


def never_answered_figure(store: Store, summary: Summary) -> dict[str, Any]:
    """The scan's never-answered figure at the ceiling (fieldfigures.unanswered) from two reads."""
    totals = fieldmodel.unanswered_totals(store)
    return fieldfigures.unanswered(totals, summary.at_ceiling, summary.ceiling_tokens)
