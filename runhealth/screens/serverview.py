"""The inference servers' own view of the run beside the shards' (#33 item 4), for Output lengths.

The servers count requests, the shards count lines, so two independent witnesses of the same
cut: vLLM's `vllm:request_success_total{finished_reason}` (stop, length, abort, and repetition
where the server detects loops) gives "finished by length" per request; the generated-tokens
histograms (vLLM's `vllm:request_generation_tokens`, SGLang's
`sglang:generation_tokens_histogram`) give the share at the ceiling exactly when a bucket edge
sits at ceiling − 1 (a request at the ceiling has exactly that many tokens, never more), and
otherwise only bounds between the nearest edges; `vllm:request_max_num_generation_tokens` says
which max_tokens the requests asked for. Values are each node's latest, summed over nodes
(counters since each server started). `server_view(metrics, summary)` reads them from the
store's latest metrics (analysis/servermetrics.py parsed them); the words are words.py's.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable

from runhealth.analysis import servermetrics as sm
from runhealth.analysis.stats import Summary
from runhealth.records import MetricRow
from runhealth.screens.words import fmt_count, fmt_share

_BUCKET = re.compile(r'^(?P<h>.+)_bucket\{le="(?P<le>[^"]+)"\}$')
_REASON = re.compile(r'^vllm:request_success_total\{finished_reason="(?P<r>[^"]*)"\}$')
SGLANG_FLAGS = "--enable-metrics --collect-tokens-histogram --generation-tokens-buckets custom"


@dataclasses.dataclass(frozen=True)
class TokenHistogram:
    """One generated-tokens histogram, summed over nodes: cumulative counts per edge."""

    name: str
    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending, +Inf last
    count: float

    def at_least(self, ceiling: int) -> tuple[float, float] | None:
        """(low, high) share of requests with ≥ `ceiling` tokens; low == high when an edge sits
        at ceiling − 1 (exact); None without requests."""
        if not self.count:
            return None
        below = [c for le, c in self.buckets if le <= ceiling - 1]  # surely < ceiling
        above = [c for le, c in self.buckets if le >= ceiling - 1]  # ≤ le includes the unknown part
        high = 1 - (below[-1] if below else 0.0) / self.count
        low = 1 - (above[0] if above else self.count) / self.count
        return max(0.0, low), max(0.0, high)

    def edges_for(self, ceiling: int) -> bool:
        return any(le == ceiling - 1 for le, _c in self.buckets)


@dataclasses.dataclass(frozen=True)
class ServerView:
    """What the servers say, beside what the shards say."""

    server: str  # "vLLM", "SGLang", or both
    finished: dict[str, float]  # vLLM finished_reason -> requests
    gen_tokens: TokenHistogram | None
    max_tokens: TokenHistogram | None
    ceiling: int | None
    shards_length_share: float | None  # finish_reason "length" among the shards' completions
    shards_at_ceiling_share: float | None

    @property
    def length_share(self) -> float | None:
        total = sum(self.finished.values())
        return self.finished.get("length", 0.0) / total if total else None

    def lines(self) -> list[str]:
        """The panel's sentences: server beside shards, and how to make the ceiling visible."""
        out = []
        if self.length_share is not None:
            total = sum(self.finished.values())
            shards = fmt_share(self.shards_length_share) if self.shards_length_share is not None else "N/A"
            out.append(
                f"{self.server} server: {fmt_share(self.length_share)} of {fmt_count(total)} requests finished "
                f"by length; shards: {shards}."
            )
            rep = self.finished.get("repetition")
            if rep is not None:
                out.append(f"The server stopped {fmt_count(rep)} requests for repetition ({fmt_share(rep / total)}).")
        g, c = self.gen_tokens, self.ceiling
        if g is not None and c:
            share = g.at_least(c)
            shards = fmt_share(self.shards_at_ceiling_share) if self.shards_at_ceiling_share is not None else "N/A"
            if share is not None and g.edges_for(c):
                out.append(
                    f"Server's generated-tokens histogram: {fmt_share(share[1])} of {fmt_count(g.count)} requests "
                    f"reached {c:,} tokens; shards: {shards} cut at the ceiling."
                )
            elif share is not None:
                out.append(
                    f"Server's generated-tokens histogram: between {fmt_share(share[0])} and {fmt_share(share[1])} "
                    f"reached {c:,} tokens (no bucket edge at {c - 1:,}; shards: {shards}). {self.edge_advice()}"
                )
        m = self.max_tokens
        if m is not None and m.count:
            top = next((le for le, cum in m.buckets if cum >= m.count), math.inf)
            asked = "any size" if math.isinf(top) else f"at most {top:,.0f}"
            out.append(f"Requests asked for max_tokens of {asked} (vllm:request_max_num_generation_tokens).")
        return out

    def edge_advice(self) -> str:
        c = self.ceiling or 4096
        return (
            f"To see the ceiling exactly, SGLang users start the server with "
            f"`{SGLANG_FLAGS} ... {c - 1} {c}` (bucket edges at ceiling − 1 and the ceiling)."
        )


def _histogram(rows: Iterable[MetricRow], name: str) -> TokenHistogram | None:
    edges: dict[float, float] = {}
    count = None
    for r in rows:
        m = _BUCKET.match(r["name"])
        if m and m.group("h") == name:
            le = math.inf if m.group("le") == "+Inf" else float(m.group("le"))
            edges[le] = edges.get(le, 0.0) + r["value"]
        elif r["name"] == f"{name}_count":
            count = (count or 0.0) + r["value"]
    if not edges:
        return None
    total = count if count is not None else edges.get(math.inf, 0.0)
    return TokenHistogram(name, tuple(sorted(edges.items())), total)


def server_view(metrics: Iterable[MetricRow], summary: Summary) -> ServerView | None:
    """The servers' view from the latest metrics of every node; None when no server reports
    finish reasons or a token histogram."""
    rows = list(metrics)
    finished: dict[str, float] = {}
    for r in rows:
        m = _REASON.match(r["name"])
        if m:
            finished[m.group("r")] = finished.get(m.group("r"), 0.0) + r["value"]
    found = [h for h in (_histogram(rows, n) for n in sm.GEN_TOKENS) if h is not None]
    ceiling = summary.ceiling_tokens
    # A fleet of both servers: the histogram that shows the ceiling exactly, else vLLM's.
    gen = next((h for h in found if ceiling and h.edges_for(ceiling)), found[0] if found else None)
    max_t = _histogram(rows, sm.MAX_TOKENS)
    if not finished and gen is None and max_t is None:
        return None
    kinds = sorted({"vLLM" if r["name"].startswith("vllm:") else "SGLang" for r in rows if ":" in r["name"]})
    n = summary.completions
    return ServerView(
        server=" and ".join(kinds) or "inference",
        finished=finished,
        gen_tokens=gen,
        max_tokens=max_t,
        ceiling=ceiling,
        shards_length_share=summary.finish_reasons.get("length", 0) / n if n else None,
        shards_at_ceiling_share=summary.at_ceiling_fraction if summary.length_count else None,
    )
