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
from runhealth.analysis.stats import wilson_interval as wilson_interval  # the group table's "others" row
from runhealth.analysis.unknowns import unknown_of as unknown_of  # ... and the "truncation unknown" rule (#39)
from runhealth.analysis.whatif import MIN_LOOP_SAMPLES as MIN_LOOP_SAMPLES  # the what-if's words (components)
from runhealth.analysis.whatif import WhatIf as WhatIf  # ... and the what-if's
from runhealth.analysis.whatif import loop_note as loop_note
from runhealth.payloads import pagedata
from runhealth.payloads.pagetypes import RunLengths
from runhealth.records import NodeRow
from runhealth.rules import activity
from runhealth.rules.health import level as level  # the per-group bars' colours, as the tiles'
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
    """The length counts at `ceiling` as the store holds them now: `got` (the `run_lengths`
    payload, pagedata.get's (computed at, payload), None: there is none) lends its bins and CDF
    only when it is of that ceiling and of these very counts; a payload a poll behind (the
    collector computes it after the poll is written) is not mixed into a screen whose other
    tiles read the poll (#41: "4,966 of 30,410" beside "of 4,968 cut")."""
    hist = stats.LengthHist.from_rows(store.run_length_rows())
    malformed = sum(n["malformed"] or 0 for n in store.counted_nodes())
    current = got is not None and got[1].ceiling == ceiling and got[1].rows.rows() == hist.rows()
    if got is not None and current:
        as_of, bins, cdf = got[0], got[1].bins, got[1].cdf
    else:
        as_of, bins, cdf = None, tuple(map(tuple, stats.histogram(hist))), tuple(stats.cdf_points(hist))
    summary = stats.summarize(hist, ceiling=ceiling, unparseable=malformed)
    return Counts(hist, summary, bins, cdf, as_of)


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
    run_eta: runeta.RunEta | None = None  # the Overview's ETA as shown (None: withheld): its basis (#33 item 1)
    eta_withheld: str = ""  # why there is no ETA ("run stalled", ...), "" when there is one

    @property
    def summary(self) -> Summary:
        return self.counts.summary

    @property
    def eta_s(self) -> float | None:
        """The ETA the Overview shows now (screens/runeta.py store_eta: its basis, its run-state
        rule, the last node's share); None while it withholds one (`eta_withheld` says why)."""
        return self.run_eta.eta_s if self.run_eta is not None else None

    @staticmethod
    def whatif_level(r: WhatIf, warn: float, alert: float, failed_backtest: bool) -> str:
        """The what-if tile's level: the share still cut at the new limit under the one ok / warn /
        alert rule (health.level, as the Overview's tile), "muted" when the method missed its own
        back-test: an unreliable guess never alarms."""
        return "muted" if failed_backtest else level(r.truncated_fraction, warn, alert)

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
            "eta_withheld": self.eta_withheld,
            "loop_sample": list(self.loop_sample),
            "server_view": self.server.lines() if self.server else None,
            "fields": dataclasses.asdict(self.fields) if self.fields else None,
        }


def lengths(store: Store, config: RunConfig, now: float | None = None) -> Lengths:
    """The Output lengths page of `config`'s run (a RunConfig) at `now`, read from one snapshot
    of the store (every tile as of one commit, however many polls land meanwhile: #41)."""
    now = time.time() if now is None else now
    with store.snapshot():
        return _lengths(store, config, now)


def _lengths(store: Store, config: RunConfig, now: float) -> Lengths:
    keep = store.run_settings().node_names
    counted = counts(store, config.max_output_tokens, pagedata.get(store, "run_lengths", RunLengths))
    figures = fieldmodel.field_figures(store, config, counted.summary.ceiling_tokens)
    run_rates = activity.read_rates(store, now)
    eta, withheld = runeta.store_eta(store, counted.summary, config.target_completions, now)
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
        run_eta=eta,
        eta_withheld=withheld,
    )
