"""What the cut cost: tokens spent in completions cut at the ceiling or in loops, and energy per
usable token (#33 item 2).

`waste(summary, loop_sample)` reads the exact token counts a `stats.Summary` holds (the
(completion_tokens, finish_reason) histogram: tokens of the completions cut at the ceiling, of
the usable ones, of all) and estimates the share of tokens spent in loops from the latest sample
batch: loops run to the ceiling, so that share is (looping share of the sampled truncated
completions, with its Wilson interval) x (exact share of tokens at the ceiling), said with its n.
`energy_cost(rows)` divides the joules NVML counted (runhealth/store/energymeter.py, summed in the
store per poll span) by the usable tokens the shards gained over the same polls: joules and
GPU-hours per 1M usable tokens, and how much of the energy is power x time instead of the
counter. A usable token is one of a completion that stopped naturally (reasonnames.NATURAL). Numbers
only: runhealth/screens/waste.py words them for every screen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from runhealth.analysis.stats import Summary, wilson_interval
from runhealth.records import EnergyRow

PER = 1_000_000  # "per 1M usable tokens"


@dataclasses.dataclass(frozen=True)
class LoopTokens:
    """Tokens in detected loops, estimated: `loops` of `n` sampled truncated completions loop."""

    loops: int
    n: int
    share: float  # of all generated tokens (estimate)
    low: float  # 95% interval of that estimate
    high: float


@dataclasses.dataclass(frozen=True)
class Waste:
    """Where a run's generated tokens went (exact, except `loops`)."""

    ceiling_tokens: int | None
    completions: int  # completions the lengths cover
    at_ceiling: int
    tokens_total: int
    at_ceiling_tokens: int
    usable_completions: int
    usable_tokens: int
    loops: LoopTokens | None  # None without a sample of truncated completions

    @property
    def completion_share(self) -> float:
        return self.at_ceiling / self.completions if self.completions else 0.0

    @property
    def token_share(self) -> float:
        return self.at_ceiling_tokens / self.tokens_total if self.tokens_total else 0.0

    @property
    def tokens_per_usable(self) -> float | None:
        """Every generated token (cut ones included) per usable completion."""
        return self.tokens_total / self.usable_completions if self.usable_completions else None

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(
            completion_share=self.completion_share,
            token_share=self.token_share,
            tokens_per_usable=self.tokens_per_usable,
        )
        return out


def waste(summary: Summary, loop_sample: tuple[int, int] | None = None) -> Waste:
    """The run's (or a node's) token waste from its Summary; `loop_sample` = (loops, sampled) among
    the latest batch's truncated completions (loops.loop_sample), or None."""
    loops = None
    if loop_sample is not None and loop_sample[1] > 0:
        k, n = loop_sample
        lo, hi = wilson_interval(k, n)
        cut = summary.at_ceiling_token_fraction
        loops = LoopTokens(k, n, cut * k / n, cut * lo, cut * hi)
    return Waste(
        ceiling_tokens=summary.ceiling_tokens,
        completions=summary.length_count,
        at_ceiling=summary.at_ceiling,
        tokens_total=summary.tokens_total,
        at_ceiling_tokens=summary.at_ceiling_tokens,
        usable_completions=summary.usable_completions,
        usable_tokens=summary.usable_tokens,
        loops=loops,
    )


@dataclasses.dataclass(frozen=True)
class EnergyCost:
    """GPU energy over the polls the collector measured, and the usable tokens they produced."""

    joules: float
    integrated_j: float  # of `joules`, from power x time (no energy counter)
    gpu_s: float
    usable_tokens: int
    tokens: int
    gpus: int
    counter_gpus: int  # GPUs whose last reading had NVML's counter
    resets: int
    since_unix: float | None
    dropped_steps: int = 0  # poll intervals dropped, energy and tokens, as implausible (#40 item 5)

    @property
    def joules_per_m(self) -> float | None:
        """Joules per 1M usable tokens."""
        return self.joules / self.usable_tokens * PER if self.usable_tokens and self.joules else None

    @property
    def gpu_hours_per_m(self) -> float | None:
        return self.gpu_s / 3600 / self.usable_tokens * PER if self.usable_tokens and self.gpu_s else None

    @property
    def integrated_share(self) -> float:
        return self.integrated_j / self.joules if self.joules else 0.0

    @property
    def source(self) -> str:
        """Where the joules come from: "counter", "power x time", "mixed", or "none"."""
        if not self.joules:
            return "none"
        if not self.integrated_j:
            return "counter"
        return "power x time" if self.integrated_j >= self.joules else "mixed"

    def to_json(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "joules_per_1m_usable_tokens": self.joules_per_m,
            "gpu_hours_per_1m_usable_tokens": self.gpu_hours_per_m,
            "energy_source": self.source,
        }


def energy_cost(rows: Iterable[EnergyRow]) -> EnergyCost | None:
    """The energy cost over `rows` (Store.node_energy(), one node's or all), None without GPUs."""
    rows = list(rows)
    if not rows:
        return None
    since = [r["since_unix"] for r in rows if r["since_unix"] is not None]
    return EnergyCost(
        joules=float(sum(r["joules"] or 0 for r in rows)),
        integrated_j=float(sum(r["integrated_j"] or 0 for r in rows)),
        gpu_s=float(sum(r["gpu_s"] or 0 for r in rows)),
        usable_tokens=int(sum(r["usable_tokens"] for r in rows)),
        tokens=int(sum(r["tokens"] for r in rows)),
        gpus=int(sum(r["gpus"] for r in rows)),
        counter_gpus=int(sum(r["counter_gpus"] or 0 for r in rows)),
        resets=int(sum(r["resets"] or 0 for r in rows)),
        since_unix=min(since) if since else None,
        dropped_steps=int(sum(r.get("dropped_steps") or 0 for r in rows)),
    )
