"""The Output lengths page's model: the run's length counts and what the what-if needs, at one instant.

`lengths(store, config, now)` reads the run's length counts (the collector's `run_lengths`
payload when it is of the ceiling asked for, else counted from the store: `counts`), the nodes,
the run's rates and the latest sample batch, and derives from them the summary (percentiles,
the share at the ceiling, finish reasons), the ETA now at the 15-min average (the Overview's, on
its basis: screens/runeta.py) and the loop sample the what-if is fitted with
(`loops.loop_sample`); `Lengths.eta_change(what_if)` is what raising the limit does to that ETA. `fields` holds the per-line field panels (#33: cuts before answering,
label checks, which groups get cut; screens/fieldpanels.py) and `Lengths.recovered(what_if)` the
never-answered cuts a higher limit would let finish. The page (pages/lengths.py) lays this out; the heavy per-group,
per-time and what-if reads stay the collector's payloads (components/loaders.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from runhealth.analysis import loops, rates, stats
from runhealth.analysis.stats import Summary as Summary  # the pages name the summary type through here
from runhealth.analysis.whatif import WhatIf as WhatIf  # ... and the what-if's
from runhealth.payloads import pagedata
from runhealth.payloads.pagetypes import RunLengths
from runhealth.records import NodeRow
from runhealth.rules import activity
from runhealth.screens import fieldmodel, fieldpanels, runeta, serverview
from runhealth.settings.config import RunConfig
from runhealth.settings.windows import WHATIF_REFIT_S as WHATIF_REFIT_S  # ... and how often it is refitted
from runhealth.store import Store


@dataclasses.dataclass(frozen=True)
class Counts:
    """The run's length counts as the collector precomputes them (runhealth.payloads.pagedata.run_lengths)."""

    hist: stats.LengthHist
    summary: Summary
    bins: tuple[tuple[Any, ...], ...]  # bin_start, bin_end, stop, at_ceiling, other
    cdf: tuple[tuple[Any, ...], ...]  # tokens, cum_fraction
    as_of: float | None  # when the collector computed them (None: computed now, no precomputed copy)


def counts(store: Store, ceiling: int | None, got: tuple[float, RunLengths] | None) -> Counts:
    """The length counts at `ceiling`: `got` (the `run_lengths` payload, pagedata.get's (computed
    at, payload), None: there is none) when it is of that ceiling, else counted from the store now."""
    as_of, data = got if got is not None and got[1].ceiling == ceiling else (None, pagedata.run_lengths(store, ceiling))
    summary = stats.summarize(data.rows, ceiling=ceiling, unparseable=data.malformed)
    return Counts(data.rows, summary, data.bins, data.cdf, as_of)


@dataclasses.dataclass(frozen=True)
class Lengths:
    """The Output lengths page at `now` (see the module docstring)."""

    run: str
    now: float
    nodes: tuple[NodeRow, ...]  # the nodes the collector polls (indexing progress, "nothing yet")
    counts: Counts
    target: int | None
    completions_per_s_15m: float | None
    loop_sample: tuple[int, int]  # (loops, sampled) among the latest batch's truncated samples
    server: serverview.ServerView | None = None  # the inference servers' view beside the shards' (#33)
    fields: fieldpanels.FieldPanels | None = None  # the per-line field panels (#33 items 3, 4, 5)
    run_eta: runeta.RunEta | None = None  # the Overview's ETA basis: distinct prompts or completions (#33 item 1)

    @property
    def summary(self) -> Summary:
        return self.counts.summary

    @property
    def eta_s(self) -> float | None:
        """The ETA now at the 15-min average, on the Overview's basis (screens/runeta.py: distinct
        prompts when expected_prompts and prompt IDs are there); None without a goal or a rate."""
        if self.run_eta is not None:
            return self.run_eta.eta_s
        return rates.eta_seconds(self.summary.completions, self.target, self.completions_per_s_15m)

    def eta_change(self, r: WhatIf) -> rates.EtaChange:
        """What the what-if's extra tokens per completion do to the ETA at the 15-min average."""
        return rates.eta_change(
            self.eta_s, self.summary.tokens.mean, r.extra_tokens_per_completion, r.extra_tokens_interval
        )

    def recovered(self, r: WhatIf) -> fieldpanels.Recovered | None:
        """The never-answered cuts that raising the limit to the what-if's would let finish."""
        ceiling = self.summary.ceiling_tokens
        if self.fields is None or ceiling is None or r.limit_tokens <= ceiling:
            return None  # a limit at or below today's ceiling recovers nothing
        at = r.truncated_fraction
        interval = (r.interval[0], r.interval[1]) if len(r.interval) == 2 else (at or 0.0, at or 0.0)
        return fieldpanels.recovered(self.fields.split, r.limit_tokens, r.current_truncated_fraction, at, interval)

    def to_json(self) -> dict[str, Any]:
        s = self.summary
        return {
            "run": self.run,
            "now_unix": self.now,
            "as_of": self.counts.as_of,
            "completions": s.completions,
            "ceiling_tokens": s.ceiling_tokens,
            "at_ceiling": s.at_ceiling,
            "p50": s.tokens.p50,
            "p90": s.tokens.p90,
            "p99": s.tokens.p99,
            "eta_s": self.eta_s,
            "eta_basis": self.run_eta.basis if self.run_eta else "completions",
            "loop_sample": list(self.loop_sample),
            "server_view": self.server.lines() if self.server else None,
            "fields": dataclasses.asdict(self.fields) if self.fields else None,
        }


def lengths(store: Store, config: RunConfig, now: float | None = None) -> Lengths:
    """The Output lengths page of `config`'s run (a RunConfig) at `now`."""
    now = time.time() if now is None else now
    keep = store.run_settings().node_names
    counted = counts(store, config.max_output_tokens, pagedata.get(store, "run_lengths", RunLengths))
    figures = fieldmodel.field_figures(store, config, counted.summary.ceiling_tokens)
    run_rates = activity.read_rates(store, now)
    answered = figures["prompts"].get("answered")
    done = counted.summary.completions
    return Lengths(
        run=config.name,
        now=now,
        nodes=tuple(n for n in store.nodes() if keep is None or n["name"] in keep),
        counts=counted,
        target=config.target_completions,
        completions_per_s_15m=run_rates.completions_per_s_15m,
        loop_sample=loops.loop_sample(store.latest_sample_batch()),
        server=serverview.server_view(
            (m for m in store.metric_latest() if keep is None or m["node"] in keep), counted.summary
        ),
        fields=fieldpanels.panels(figures),
        run_eta=runeta.run_eta(
            done,
            config.target_completions,
            run_rates,
            answered,
            config.expected_prompts,
            figures["prompts"].get("counted_since_unix") is not None,
        ),
    )
