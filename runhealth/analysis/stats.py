"""Exact completion-length statistics computed from count tables.

The agent never ships raw lengths; it ships rows ``(tokens, finish_reason, estimated, count)``.
``LengthHist`` holds those counts and every statistic here (nearest-rank percentiles, the
max_tokens ceiling, the share stopped at it, histogram and CDF points for plotting) is exact
over them.  Lengths flagged ``estimated=1`` are ``ceil(chars / 4)`` guesses: they are kept apart
and never silently mixed with real ``completion_tokens``.  Pure Python, no numeric libraries:
this runs in the dashboard process on small aggregated data.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from runhealth.analysis import reasons as reason_names
from runhealth.records import LENGTH  # one spelling: ingest counts with it too
from runhealth.store.reasonnames import NATURAL

MISSING = "missing"
EXACT_SOURCE = "completion_tokens"
ESTIMATE_SOURCE = "chars/4 estimate"
# A ceiling is a pile-up: its mode must hold this share of all length stops ...
CEILING_MIN_SHARE = 0.20
# ... and at least this many completions (three identical lengths are no accident).
CEILING_MIN_COUNT = 3

Key = tuple  # (tokens, finish_reason, estimated)


class LengthHist:
    """Completion counts keyed by ``(tokens, finish_reason, estimated)``."""

    def __init__(self) -> None:
        self._counts: Counter = Counter()
        self._sorted: list[tuple] | None = None  # rows() memo: summaries call it a dozen times

    def __getstate__(self) -> dict:
        return {"_counts": self._counts, "_sorted": None}  # caches pickle the counts, not the memo

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence]) -> LengthHist:
        """Build from agent rows ``(tokens, finish_reason, estimated, count)``."""
        hist = cls()
        counts = hist._counts  # add() inlined: a page rebuilds a run's thousands of rows cold
        for tokens, finish_reason, estimated, count in rows:
            if count > 0:
                counts[(int(tokens), finish_reason, 1 if estimated else 0)] += int(count)
        return hist

    def to_json(self) -> list[list[Any]]:
        """The rows as JSON lists (a screen model's payload: runhealth.typedjson)."""
        return [list(r) for r in self.rows()]

    @classmethod
    def from_json(cls, data: Iterable[Sequence]) -> LengthHist:
        return cls.from_rows(data)

    def add(self, tokens: int, finish_reason: str | None, estimated: int = 0, count: int = 1) -> None:
        """Add ``count`` completions of length ``tokens`` (zero/negative counts are ignored)."""
        if count > 0:
            self._counts[(int(tokens), finish_reason, 1 if estimated else 0)] += int(count)
            self._sorted = None

    def merge(self, other: LengthHist) -> LengthHist:
        """Return a new histogram holding the counts of both."""
        merged = LengthHist()
        merged._counts = self._counts + other._counts
        return merged

    @property
    def total(self) -> int:
        """Number of completions."""
        return sum(self._counts.values())

    def rows(self) -> list[tuple]:
        """Rows ``(tokens, finish_reason, estimated, count)`` sorted by tokens."""
        if self._sorted is None:
            items = sorted(self._counts.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2]))
            self._sorted = [(t, fr, est, n) for (t, fr, est), n in items]
        return list(self._sorted)

    def _filtered(self, estimated: int) -> LengthHist:
        out = LengthHist()
        out._counts = Counter({k: n for k, n in self._counts.items() if k[2] == estimated})
        return out

    def exact_only(self) -> LengthHist:
        """Completions whose length is a real ``completion_tokens`` value."""
        return self._filtered(0)

    def estimated_only(self) -> LengthHist:
        """Completions whose length is a chars/4 estimate."""
        return self._filtered(1)

    def length_pairs(self) -> list[tuple[int, int]]:
        """Sorted ``(tokens, count)`` pairs over all finish reasons."""
        acc: Counter = Counter()
        for (tokens, _fr, _est), n in self._counts.items():
            acc[tokens] += n
        return sorted(acc.items())

    def __len__(self) -> int:
        return len(self._counts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LengthHist) and +self._counts == +other._counts

    def __repr__(self) -> str:
        return f"LengthHist(total={self.total}, distinct={len(self._counts)})"


def length_source(hist: LengthHist) -> tuple[LengthHist, int, str]:
    """Pick the rows whose lengths a summary may use.

    Returns:
        ``(hist_used, estimated_count, source_label)``: exact rows when there are any, else the
        estimated rows labelled ``"chars/4 estimate"``.
    """
    exact = hist.exact_only()
    estimated_count = hist.total - exact.total
    if exact.total == 0 and estimated_count > 0:
        return hist.estimated_only(), estimated_count, ESTIMATE_SOURCE
    return exact, estimated_count, EXACT_SOURCE


def percentile_nearest_rank(hist_or_sorted_pairs: LengthHist | Iterable[tuple[int, int]], q: float) -> int | None:
    """Nearest-rank percentile.

    Args:
        hist_or_sorted_pairs: a ``LengthHist`` (all its rows) or ``(tokens, count)`` pairs sorted
            by tokens.
        q: percentile in percent, 0 < q <= 100 (q <= 0 gives the minimum).

    Returns:
        The smallest length whose cumulative count reaches ``ceil(q/100 * N)``; None when empty.
    """
    pairs = _pairs(hist_or_sorted_pairs)
    n_total = sum(n for _t, n in pairs)
    if n_total == 0:
        return None
    return value_at_rank(pairs, max(1, math.ceil(q / 100.0 * n_total - 1e-9)))


def value_at_rank(pairs: list[tuple[int, int]], rank: int) -> int:
    """The length of the `rank`-th completion (1-based) in sorted (tokens, count) pairs."""
    cumulative = 0
    for tokens, n in pairs:
        cumulative += n
        if cumulative >= rank:
            return tokens
    return pairs[-1][0]


def _pairs(hist_or_pairs: LengthHist | Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    if isinstance(hist_or_pairs, LengthHist):
        return hist_or_pairs.length_pairs()
    return [(t, n) for t, n in hist_or_pairs if n > 0]


def wilson_interval(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial share ``k / n`` (95% by default).

    Returns:
        ``(lo, hi)``; ``(0.0, 1.0)`` when ``n == 0``.
    """
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def is_cut(tokens: int, finish_reason: str | None, ceiling: int | None) -> bool:
    """The one truncation rule: stopped by `length` at or above the ceiling (a `length` stop
    below it is the context window's, counted apart). `cut_sql` is this rule in SQL."""
    return finish_reason == LENGTH and ceiling is not None and tokens >= ceiling


def cut_sql(ceiling: int | None) -> str:
    """`is_cut` as an SQL condition over count rows (finish_reason, tokens): the exporter's sums."""
    return f"finish_reason = '{LENGTH}' AND tokens >= {int(ceiling)}" if ceiling is not None else "0"


def detect_ceiling(hist: LengthHist) -> int | None:
    """Find the max_tokens ceiling: the length where ``finish_reason == "length"`` piles up.

    Context-window length stops are scattered below the ceiling; the ceiling is the mode of
    the length-stop lengths when it holds a clear mass (>= 20% of length stops and >= 3).

    Returns:
        The ceiling in tokens, or None when no pile-up is visible.
    """
    used, _est, _src = length_source(hist)
    stops: Counter = Counter()
    for tokens, fr, _e, n in used.rows():
        if fr == LENGTH:
            stops[tokens] += n
    n_length = sum(stops.values())
    if n_length == 0:
        return None
    tokens, n_mode = max(stops.items(), key=lambda kv: (kv[1], kv[0]))
    if n_mode >= CEILING_MIN_COUNT and n_mode >= CEILING_MIN_SHARE * n_length:
        return tokens
    return None


def _resolve_ceiling(hist: LengthHist, ceiling: int | None) -> tuple[int | None, str | None]:
    if ceiling is not None:
        return int(ceiling), "given"
    detected = detect_ceiling(hist)
    return detected, ("detected" if detected is not None else None)


@dataclasses.dataclass(frozen=True)
class TokenStats:
    """Completion lengths in tokens over the rows a summary uses (None when there are none)."""

    mean: float | None
    p50: int | None  # nearest-rank percentiles
    p90: int | None
    p95: int | None
    p99: int | None
    max: int | None


@dataclasses.dataclass(frozen=True)
class Summary:
    """A run's (or a node's) completions in numbers: what `summarize` returns.

    Counts are completions; ``tokens`` and ``tokens_total`` are in tokens. `to_json()` gives
    the ``scan --json`` object (its keys predate this class: ``ceiling`` is ``ceiling_tokens``).
    """

    completions: int  # every completion counted, any finish reason
    unparseable: int  # malformed lines reported by the agent
    finish_reasons: dict[str, int]  # finish_reason -> completions ("missing" when absent)
    ceiling_tokens: int | None  # the max_tokens ceiling: given, or detected from a pile-up
    ceiling_source: str | None  # "given" | "detected" | None
    at_ceiling: int  # completions stopped by length at or above the ceiling (truncated)
    at_ceiling_fraction: float  # at_ceiling / length_count
    at_ceiling_interval: tuple[float, float]  # its 95% Wilson interval
    length_below_ceiling: int  # length stops below the ceiling (context window)
    tokens: TokenStats
    tokens_total: int  # tokens over the rows used for lengths
    length_count: int  # completions whose lengths the statistics use
    estimated_count: int  # completions left out because their length is a chars/4 estimate
    length_source: str  # "completion_tokens" | "chars/4 estimate"
    exact: bool = True  # statistics are exact over the counts (never sampled)
    # Tokens, not completions (#33), over the same rows as tokens_total: those of the completions
    # cut at the ceiling, and the usable ones (a natural stop, reasonnames.NATURAL).
    at_ceiling_tokens: int = 0
    usable_completions: int = 0
    usable_tokens: int = 0

    @property
    def at_ceiling_token_fraction(self) -> float:
        """The share of generated tokens spent in completions cut at the ceiling (0 with none)."""
        return self.at_ceiling_tokens / self.tokens_total if self.tokens_total else 0.0

    @property
    def tokens_per_usable(self) -> float | None:
        """Tokens generated per usable completion: every token counted, cut ones included."""
        return self.tokens_total / self.usable_completions if self.usable_completions else None

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``runhealth scan --json`` prints, key for key as before."""
        out = dataclasses.asdict(self)
        out["ceiling"] = out.pop("ceiling_tokens")
        return {key: out[key] for key in _JSON_KEYS}


_JSON_KEYS = (
    "completions",
    "unparseable",
    "finish_reasons",
    "ceiling",
    "ceiling_source",
    "at_ceiling",
    "at_ceiling_fraction",
    "at_ceiling_interval",
    "length_below_ceiling",
    "tokens",
    "tokens_total",
    "length_count",
    "estimated_count",
    "length_source",
    "exact",
)


def _token_stats(used: LengthHist) -> tuple[TokenStats, int]:
    pairs = used.length_pairs()
    n_total = sum(n for _t, n in pairs)
    tokens_total = sum(t * n for t, n in pairs)
    p50, p90, p95, p99 = (percentile_nearest_rank(pairs, q) for q in (50, 90, 95, 99))
    stats = TokenStats(
        mean=(tokens_total / n_total) if n_total else None,
        p50=p50,
        p90=p90,
        p95=p95,
        p99=p99,
        max=pairs[-1][0] if pairs else None,
    )
    return stats, tokens_total


def hist_digest(hist: LengthHist) -> str:
    """A digest of the histogram's content (every (tokens, finish_reason, estimated, count) row):
    the what-if's cache key. Its total alone is not enough: two runs, or one run before and after
    its lengths moved, can hold the same number of completions."""
    return hashlib.blake2b(repr(hist.rows()).encode(), digest_size=16).hexdigest()


def summarize(hist: LengthHist, ceiling: int | None = None, unparseable: int = 0) -> Summary:
    """Summarise a run's completions.

    ``completions`` and ``finish_reasons`` count every completion.  Length statistics
    (``tokens``, ``tokens_total``, ``at_ceiling``, ``length_below_ceiling``) use exact rows only
    (``length_count`` of them) unless every row is an estimate; ``estimated_count`` says how
    many rows were left out.  ``at_ceiling_fraction`` is ``at_ceiling / length_count``.

    Args:
        hist: the run's counts.
        ceiling: configured max_tokens; detected from the data when None.
        unparseable: malformed lines reported by the agent (passed through).

    Returns:
        The `Summary`; never raises on an empty histogram.
    """
    used, estimated_count, source = length_source(hist)
    ceil_tokens, ceil_source = _resolve_ceiling(hist, ceiling)
    reasons: Counter = Counter()
    for _t, fr, _e, n in hist.rows():
        reasons[MISSING if fr is None else str(fr)] += n
    at_ceiling = below = at_ceiling_tokens = usable = usable_tokens = 0
    for tokens, fr, _e, n in used.rows():
        if is_cut(tokens, fr, ceil_tokens):
            at_ceiling += n
            at_ceiling_tokens += tokens * n
        elif fr == LENGTH and ceil_tokens is not None:
            below += n
        elif fr in NATURAL:
            usable += n
            usable_tokens += tokens * n
    token_stats, tokens_total = _token_stats(used)
    length_count = used.total
    return Summary(
        completions=hist.total,
        unparseable=int(unparseable),
        finish_reasons=reason_names.bounded(reasons),  # a bounded set: each becomes a row or label
        ceiling_tokens=ceil_tokens,
        ceiling_source=ceil_source,
        at_ceiling=at_ceiling,
        at_ceiling_fraction=(at_ceiling / length_count) if length_count else 0.0,
        at_ceiling_interval=wilson_interval(at_ceiling, length_count),
        length_below_ceiling=below,
        tokens=token_stats,
        tokens_total=tokens_total,
        length_count=length_count,
        estimated_count=estimated_count,
        length_source=source,
        exact=True,
        at_ceiling_tokens=at_ceiling_tokens,
        usable_completions=usable,
        usable_tokens=usable_tokens,
    )


def ceiling_drift(groups: dict[str, LengthHist]) -> dict[str, int]:
    """Flag groups (nodes, shards) whose detected ceiling differs from the majority's.

    The majority is the ceiling detected on most groups (ties: the one covering more
    completions).  Groups with no detectable ceiling are not flagged.

    Returns:
        ``{group: its_ceiling}`` for every drifting group; empty when all agree.
    """
    ceilings = {name: detect_ceiling(h) for name, h in groups.items()}
    votes: Counter = Counter()
    weight: Counter = Counter()
    for name, c in ceilings.items():
        if c is not None:
            votes[c] += 1
            weight[c] += groups[name].total
    if not votes:
        return {}
    majority = max(votes, key=lambda c: (votes[c], weight[c]))
    return {name: c for name, c in ceilings.items() if c is not None and c != majority}


def _nice_width(span: int, target_bins: int) -> int:
    raw = max(1.0, span / max(1, target_bins))
    exp10 = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 5, 10):
        if mult * exp10 >= raw:
            return int(mult * exp10)
    return int(10 * exp10)


def _bin_edges(max_tokens: int, ceiling: int | None, width: int) -> list[int]:
    edges = list(range(0, max_tokens + width + 1, width))
    if ceiling is not None and 0 < ceiling <= max_tokens:
        # The ceiling gets a one-token bin of its own so the pile-up shows as a spike.
        edges = [e for e in edges if e < ceiling] + [ceiling, ceiling + 1]
        edges += list(range(ceiling + width, max_tokens + width + 1, width))
    return edges if len(edges) >= 2 else [0, 1]


def histogram(hist: LengthHist, bin_width: int | None = None, max_bins: int = 2000) -> list:
    """Bins for a length histogram plot, split by outcome.

    Args:
        hist: the counts (exact rows unless all are estimated).
        bin_width: bin width in tokens; a "nice" width giving about 100 bins when None.
        max_bins: the width is widened until no more than about this many bins remain.

    Returns:
        ``(bin_start, bin_end, count_stop, count_length_at_ceiling, count_other)`` per bin,
        ``bin_end`` exclusive; the detected ceiling has its own one-token bin.
    """
    used, _est, _src = length_source(hist)
    rows = used.rows()
    if not rows:
        return []
    max_tokens = rows[-1][0]
    ceiling = detect_ceiling(used)
    width = int(bin_width) if bin_width else _nice_width(max_tokens + 1, 100)
    width = max(width, _nice_width(max_tokens + 1, max(1, max_bins - 2)))
    edges = _bin_edges(max_tokens, ceiling, width)
    counts = [[0, 0, 0] for _ in range(len(edges) - 1)]
    for tokens, fr, _e, n in rows:
        i = min(max(bisect.bisect_right(edges, tokens) - 1, 0), len(counts) - 1)
        if fr == "stop":
            counts[i][0] += n
        elif is_cut(tokens, fr, ceiling):
            counts[i][1] += n
        else:
            counts[i][2] += n
    return [(edges[i], edges[i + 1], *counts[i]) for i in range(len(counts))]


# Points a CDF chart is sent: 800 (both sides of every jump of 1/800 or more kept) draw within 0.23%
# of the full curve (the demo's runs, 2-3K distinct lengths; simulated runs of 20K and 200K), under a
# pixel of a chart's y axis; 2,000 drew within 0.09% and sent ~2.5x the JSON: the Compare overlay's
# two curves were 62 of its 93 KiB, sent again each round (#42: data the screen does not show).
CDF_POINTS = 800


def cdf_points(hist: LengthHist, max_points: int = CDF_POINTS) -> list[tuple[int, float]]:
    """Empirical CDF ``(tokens, share of completions <= tokens)`` for a step plot.

    When there are more distinct lengths than ``max_points`` the points are thinned evenly,
    always keeping the last point and both sides of any jump of ``1/max_points`` or more
    (the ceiling spike).
    """
    used, _est, _src = length_source(hist)
    pairs = used.length_pairs()
    n_total = sum(n for _t, n in pairs)
    if n_total == 0:
        return []
    points, cumulative = [], 0
    for tokens, n in pairs:
        cumulative += n
        points.append((tokens, cumulative / n_total))
    if len(points) <= max_points:
        return points
    step = math.ceil(len(points) / max_points)
    keep = set(range(0, len(points), step)) | {len(points) - 1}
    for i, (_t, n) in enumerate(pairs):
        if n / n_total >= 1.0 / max_points:
            keep.update({max(0, i - 1), i})
    return [points[i] for i in sorted(keep)]
