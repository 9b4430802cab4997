"""Is the run writing? Its tokens/s, the stall rule and the rate drop, from poll rows.

One definition each (issue 24): the live tok/s is each node's mean rate over the last
`RATE_WINDOW_S` of its own clock, ending at *now* (the node's clock estimated from its latest
poll), summed over nodes; the 15-min average is the same over `AVERAGE_WINDOW_S` and is what
the ETA divides by. The Overview's tiles, the Nodes table, the Output lengths page's ETA change,
the headline download, /metrics and the alerts read `read_rates` or `node_rate`; nothing else
computes a live rate.

The stall rule (`stall_state`): a node is quiet when its shards have not grown for
``stall_after_s``. A node that never grew is not stalled but *waiting* for its first completion
(normal at launch, or a glob that matches nothing yet) once watched that long. The run is
stalled when no live node grew within the window and at least one has been watched that long;
it is stalled *since the last completion* (the latest growth of any node; if none ever grew,
since the first node was seen), not since a node was added. A single node is reported on its
own only while another node does write.

A poll row is ``(ts_unix, node_ts_unix, delta_completions, delta_tokens, backfill[, delta_prompts[,
interval_s]])``, rows in the order they were polled: the dashboard's clock says *when we saw it*,
and rates, the average's coverage and each node's first and last growth are taken on one
continuous clock (`bridged_times`) that ends at the collector's time of the latest poll: each
interval between two polls as the node measured it (skew cancels out), unless the collector's
measure of it disagrees by more than STEP_TOLERANCE_S (or STEP_TOLERANCE_SHARE of it): then one
of them stepped (NTP, a VM resumed). The collector's measure is its monotonic clock's
(`interval_s`, #40 item 7), which no wall-clock step moves: a step of either wall clock, in
either direction, then costs nothing. Where that is unknown (a collector's first poll of a node,
polls from before store migration 13) it is the difference of the wall times, and the interval
is the shorter non-negative of the two, so a step costs at most one interval.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import operator
import statistics
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from runhealth.analysis import rates
from runhealth.settings import windows
from runhealth.settings.windows import AVERAGE_WINDOW_S, DROP_BUCKET_S, DROP_LOOKBACK_S, RATE_WINDOW_S
from runhealth.store import Store, pollrows

DROP_FRACTION = 0.5
MIN_MINUTES_FOR_MEDIAN = 10  # a median over fewer minutes is noise, not a baseline
LOOKBACK_S = DROP_LOOKBACK_S  # the hour the rate-drop median is taken over (runhealth.settings.windows)
# Two clocks may disagree about one poll interval by this much (the scan time, round-trip
# jitter) before one of them counts as stepped.
STEP_TOLERANCE_S = 5.0
STEP_TOLERANCE_SHARE = 0.5


class TokenBucket(TypedDict):
    """One bucket of `token_buckets`: PollBucket's bucket_unix, tokens and backfill."""

    bucket_unix: float
    tokens: int | None
    backfill: int


@dataclasses.dataclass
class NodeRate:
    """One node's throughput and when its shards last grew (dashboard clock)."""

    tokens_per_s_1m: float | None
    tokens_per_s_15m: float | None
    completions_per_s_15m: float | None
    last_growth_unix: float | None
    first_seen_unix: float | None
    first_live_growth_unix: float | None = None  # its first live (not backfill) new completion in the rows read
    completions_var_15m: float | None = None  # variance of completions_per_s_15m (batch means; inf: too few polls)
    prompts_per_s_15m: float | None = None  # distinct prompts new to the run per s, over the average (#33)
    first_seen_bridged: float | None = None  # first_seen_unix on the rates' clock (bridged_times)
    first_live_bridged: float | None = None  # first_live_growth_unix on the rates' clock


@dataclasses.dataclass(frozen=True)
class RunRates:
    """The run's live rates at `now`: per node, summed, and the last hour's rate drop."""

    now: float
    per_node: Mapping[str, NodeRate]
    tokens_per_s_1m: float | None
    tokens_per_s_15m: float | None
    completions_per_s_15m: float | None
    drop_median_tps: float | None = None  # the hour's median per-minute rate, set when the 1-min rate fell below half
    window_s: float = RATE_WINDOW_S  # the live rate's window (windows.rate_window_s: a minute, or two polls)
    average_s: float = AVERAGE_WINDOW_S  # the average's window (windows.average_window_s)
    completions_var_15m: float | None = None  # the nodes' variances summed (None: none has a rate)
    prompts_per_s_15m: float | None = None  # new distinct prompts per s over the average (None: no prompt IDs)


def poll_interval_s(seen_s: float, node_s: float | None, mono_s: float | None = None) -> float:
    """One interval between two polls: as the node measured it (`node_s`), unless the
    collector's disagrees by more than the tolerance (a clock stepped). The collector's is its
    monotonic measure (`mono_s`) where known, and wins then; else its wall clocks' difference
    (`seen_s`), and the interval is the shorter non-negative of the two (a forward step
    lengthens one, a backward step makes it negative); 0 when both went back."""
    ref = seen_s if mono_s is None else max(0.0, mono_s)
    if node_s is None:
        return max(0.0, ref)
    if abs(node_s - ref) <= max(STEP_TOLERANCE_S, STEP_TOLERANCE_SHARE * abs(ref)):
        return node_s
    if mono_s is not None:
        return ref
    return min((d for d in (seen_s, node_s) if d >= 0), default=0.0)


def bridged_times(rows: Sequence[Sequence]) -> list[float]:
    """Each poll's time on one continuous clock that ends at the collector's time of the latest
    poll (rows in the order polled), its intervals from `poll_interval_s`."""
    if not rows:
        return []
    out = [float(rows[-1][0])]
    for prev, row in zip(reversed(rows[:-1]), reversed(rows[1:]), strict=True):
        node_s = None if row[1] is None or prev[1] is None else row[1] - prev[1]
        mono_s = row[6] if len(row) > 6 else None
        out.append(out[-1] - poll_interval_s(row[0] - prev[0], node_s, mono_s))
    return out[::-1]


def node_rate(
    rows: Sequence[Sequence], now: float, window_s: float = RATE_WINDOW_S, average_s: float = AVERAGE_WINDOW_S
) -> NodeRate:
    """Rates and last growth of one node from its poll rows, in the order they were polled: the
    live rate over `window_s` and the average over `average_s`, both ending at `now`."""
    if not rows:
        return NodeRate(None, None, None, None, None)
    times = bridged_times(rows)
    # The rates need only the polls from the one that opens the longer window's first span on:
    # the screens read an hour of polls (360 a node at 10 s), the windows hold a quarter of them
    # or less. The spans before cannot count (they end before the window starts), so the rates
    # are the same; only on a clock that never goes back (a bridged interval may be negative when
    # both wall clocks stepped back and no monotonic measure is known: then every poll is read).
    first = 0
    if all(map(operator.le, times, itertools.islice(times, 1, None))):
        first = max(0, bisect.bisect_left(times, now - max(window_s, average_s)) - 1)
    points: list[rates.Point] = [
        (t, r[2] or 0, r[3] or 0, bool(r[4])) for t, r in zip(times[first:], rows[first:], strict=True)
    ]
    spans = rates.valid_spans(points)  # once for both windows
    _, tps_1m = rates.spans_rate(spans, window_s, now)
    cps_15m, tps_15m, var = rates.spans_window_rates(spans, average_s, now)  # the average and its variance
    grown = next((r[0] for r in reversed(rows) if (r[2] or 0) > 0), None)
    live_at = next((i for i, r in enumerate(rows) if (r[2] or 0) > 0 and not r[4]), None)
    live = None if live_at is None else rows[live_at][0]
    pps = prompts_rate(rows, times, now, average_s)
    out = NodeRate(tps_1m, tps_15m, cps_15m, grown, rows[0][0], live, var, pps)
    # What the average covers, on the rates' clock: a wall-clock step since must not make the run
    # look older by the step or younger than 0 s (#40 item 7).
    out.first_seen_bridged, out.first_live_bridged = times[0], None if live_at is None else times[live_at]
    return out


def prompts_rate(rows: Sequence[Sequence], times: Sequence[float], now: float, average_s: float) -> float | None:
    """New distinct prompts per second over the average: the same spans, window and backfill rule
    as the completions' rate, over each poll's `prompts` (row[5], migration 12). None when no poll
    in the rows added a prompt (no prompt IDs in the shards: skipped at no cost); polls from
    before migration 12 (NULL) are left out, so a migrated store's rate starts at its first
    counted poll instead of counting the time before as zero."""
    if not any(len(r) > 5 and r[5] for r in rows):
        return None
    # Only the polls from the one that opens the window's first span on (times never decrease):
    # the screens read an hour of polls, and the rest cannot change the rate (a quarter of the work).
    first = max(0, bisect.bisect_left(times, now - average_s) - 1)
    points: list[rates.Point] = [
        (t, r[5], 0, bool(r[4])) for t, r in zip(times[first:], rows[first:], strict=True) if r[5] is not None
    ]
    return rates.windowed_rate(points, average_s, now)[0]


def run_rates(
    rows_by_node: Mapping[str, Sequence[Sequence]],
    now: float,
    window_s: float = RATE_WINDOW_S,
    average_s: float = AVERAGE_WINDOW_S,
) -> RunRates:
    """Per-node NodeRate and run totals (tokens/s over the live window and the average,
    completions/s over the average)."""
    per_node = {name: node_rate(rows, now, window_s, average_s) for name, rows in rows_by_node.items()}

    def total(attr: str) -> float | None:
        known = [getattr(r, attr) for r in per_node.values() if getattr(r, attr) is not None]
        return float(sum(known)) if known else None

    return RunRates(
        now,
        per_node,
        total("tokens_per_s_1m"),
        total("tokens_per_s_15m"),
        total("completions_per_s_15m"),
        window_s=window_s,
        average_s=average_s,
        completions_var_15m=total("completions_var_15m"),
        prompts_per_s_15m=total("prompts_per_s_15m"),
    )


def throughput_buckets(
    rows_by_node: Mapping[str, Sequence[Sequence]], bucket_s: float, since: float, until: float
) -> list[tuple[float, float]]:
    """(bucket_unix, tokens/s) of each bucket starting at or after `since` and ending by `until`
    that some node's polls cover, in time order: the throughput chart's points on the rates'
    terms. Each poll's tokens are spread evenly over the seconds it covers (the collector's
    monotonic measure since the node's previous poll, or the wall seconds between the two where
    that is unknown) and pro rata over the buckets those overlap; a poll that ends catch-up work
    (backfill) or covers no time counts nothing, as in `rates.valid_spans`. A node's rate in a
    bucket is its tokens there over the seconds its polls cover there, and the run's is the
    nodes' sum, as `run_rates` sums them. So a poll that covers minutes (the first after a
    collector restart, or after an unreachable stretch) counts at its average over them, not as a
    spike in the bucket it landed in; a bucket a collector stopped in counts the time it covered;
    a bucket no poll covers is absent (the chart leaves a gap, not a line across it), and so is
    one covered less than half as long as the median bucket (node-seconds): the sliver at the
    edge of such a gap, where some nodes' polls reach into it and others' do not. `rows_by_node`:
    `poll_rows`' (seven columns). Vectorised: an hour of 1,024 nodes' polls at 10 s is 370,000 rows."""
    first, count = int(since // bucket_s), int(until // bucket_s) - int(since // bucket_s)
    groups = [rows for rows in rows_by_node.values() if rows]
    flat = list(itertools.chain.from_iterable(groups))
    if count <= 0 or not flat:
        return []
    size = len(flat)

    def column(i: int) -> np.ndarray:  # NULL as NaN
        return np.array(list(map(operator.itemgetter(i), flat)), float)

    ts, tokens, backfill, mono = np.fromiter(map(operator.itemgetter(0), flat), float, size), *map(column, (3, 4, 6))
    tokens, live = np.nan_to_num(tokens), np.nan_to_num(backfill) == 0
    node = np.repeat(np.arange(len(groups)), [len(rows) for rows in groups])
    after = np.ones(size, bool)  # a node's first row has no previous poll: it opens no span
    after[np.cumsum([0, *(len(rows) for rows in groups[:-1])])] = False
    before = np.concatenate(([np.nan], ts[:-1]))
    covered = np.where(np.isnan(mono), ts - before, mono)
    lo, hi = first * bucket_s, (first + count) * bucket_s
    keep = after & live & (covered > 0) & (ts > lo) & (ts - covered < hi)
    t1, per_s, node = ts[keep], np.maximum(tokens[keep], 0) / covered[keep], node[keep]
    t0 = np.maximum(t1 - covered[keep], lo)
    t1 = np.minimum(t1, hi)
    b0 = np.floor(t0 / bucket_s).astype(np.int64) - first
    b1 = np.minimum(np.floor(t1 / bucket_s).astype(np.int64) - first, count - 1)
    cells = len(groups) * count
    got, secs = np.zeros(cells), np.zeros(cells)
    span = np.arange(len(t1))
    for j in itertools.count():  # the spans' j-th bucket; past the second, only long spans remain
        span = span[b0[span] + j <= b1[span]]
        if not len(span):
            break
        b = b0[span] + j
        part = np.minimum(t1[span], (first + b + 1) * bucket_s) - np.maximum(t0[span], (first + b) * bucket_s)
        key = node[span] * count + b
        got += np.bincount(key, weights=per_s[span] * part, minlength=cells)
        secs += np.bincount(key, weights=part, minlength=cells)
    by_node, covered_s = got.reshape(len(groups), count), secs.reshape(len(groups), count)
    rate = np.divide(by_node, covered_s, out=np.zeros_like(by_node), where=covered_s > 0).sum(axis=0)
    node_s = covered_s.sum(axis=0)
    seen = node_s >= 0.5 * np.median(node_s[node_s > 0]) if node_s.any() else node_s > 0
    return [((first + int(i)) * bucket_s, float(rate[i])) for i in np.flatnonzero(seen)]


def minute_rates(buckets: Sequence[Mapping[str, Any]], bucket_s: float = DROP_BUCKET_S) -> list[float]:
    """Tokens/s of each complete, non-backfill bucket (polls_by_bucket rows; the last one is
    still filling and is dropped)."""
    return [b["tokens"] / bucket_s for b in buckets[:-1] if not b["backfill"] and b["tokens"] is not None]


def rate_drop(current_tps: float | None, minute_tps: list[float]) -> float | None:
    """The last hour's median per-minute rate when `current_tps` is below half of it, else None."""
    if current_tps is None or len(minute_tps) < MIN_MINUTES_FOR_MEDIAN:
        return None
    median = statistics.median(minute_tps)
    return median if median > 0 and current_tps < DROP_FRACTION * median else None


def run_interval_s(store: Store) -> float:
    """The run's poll interval as its collector recorded it (run meta), 10 s when not recorded."""
    return store.run_settings().interval_s


def recent_rates(
    store: Store, now: float, lookback_s: float | None = None, interval_s: float | None = None
) -> RunRates:
    """`run_rates` over the polls of the last `lookback_s`, with the windows of a run polled every
    `interval_s` (default: the run's, from the store); lookback default: what the live rate needs
    (the exporter's read)."""
    interval_s = run_interval_s(store) if interval_s is None else interval_s
    window_s, average_s = windows.rate_window_s(interval_s), windows.average_window_s(interval_s)
    if lookback_s is None:
        lookback_s = windows.rates_lookback_s(interval_s, window_s)
    return run_rates(poll_rows(store, now, lookback_s), now, window_s, average_s)


def poll_rows(store: Store, now: float, lookback_s: float) -> dict[str, list[tuple]]:
    """Each node's polls of the last `lookback_s` as `run_rates` reads them: (ts_unix,
    node_ts_unix, completions, tokens, backfill, prompts, interval_s) in poll order."""
    # Store.polls(since, in_poll_order=True)'s rows, only the columns a rate needs, as tuples: a
    # scrape reads 15 min of every node's polls (47,000 rows at 512 nodes), a dict each was most of it.
    # The polls from before a forward step of the collector's clock within the lookback are read
    # too (meta 'clock_steps', written with the polls): their times are older by the step, and the
    # rates' clock bridges it (without them the average would start at the step).
    since_sql = (
        "? - (SELECT COALESCE(SUM(MAX(0, json_extract(s.value, '$[1]'))), 0)"
        " FROM json_each((SELECT value FROM meta WHERE key = 'clock_steps')) s"
        " WHERE json_extract(s.value, '$[0]') >= ?)"
    )
    # Kept in memory and read on from the last rowid (#42 item 3: the Overview, /metrics and the
    # alerts read an hour of polls each, 368,000 rows at 1,024 nodes): the same rows, in the same order.
    return pollrows.of(store).read(since_sql, (now - lookback_s, now - lookback_s))


def token_buckets(store: Store, bucket_s: float, since_unix: float) -> list[TokenBucket]:
    """`Store.polls_by_bucket(bucket_s, since_unix)`'s bucket_unix, tokens and backfill, from the
    poll rows kept in memory (runhealth/store/pollrows.py: each bucket summed as its polls come,
    not the hour's polls again each read; SQL's where a token count is no integer)."""
    got = pollrows.of(store).token_buckets(bucket_s, since_unix)
    if got is None:
        return [
            {"bucket_unix": b["bucket_unix"], "tokens": b["tokens"], "backfill": b["backfill"]}
            for b in store.polls_by_bucket(bucket_s, since_unix=since_unix)
        ]
    return [{"bucket_unix": k, "tokens": tokens, "backfill": backfill} for k, tokens, backfill in got]


def read_rates(
    store: Store,
    now: float,
    lookback_s: float | None = None,
    interval_s: float | None = None,
    memo: dict[tuple, RunRates] | None = None,
) -> RunRates:
    """The run's rates at `now` from the store: the polls of the last `lookback_s` (default: the
    hour the screens read, or what the average needs when longer; the alerts read twice the
    stall window), last growth per node (a full scan only when a node did not grow within it)
    and the rate drop (the last hour's per-minute buckets, summed in SQL). The windows follow the
    run's poll interval (windows.rate_window_s): every consumer gets the same rate.

    `memo`: readings already taken for the same instant (a /metrics scrape's stall series and
    its alerts both read the same polls): one with the same lookback and interval is reused."""
    interval_s = run_interval_s(store) if interval_s is None else interval_s
    needed = windows.rates_lookback_s(interval_s, windows.average_window_s(interval_s))
    lookback = max(needed, DROP_LOOKBACK_S if lookback_s is None else lookback_s)
    key = (now, lookback, interval_s)
    if memo is not None and key in memo:
        return memo[key]
    found = _read_rates(store, now, lookback, interval_s)
    if memo is not None:
        memo[key] = found
    return found


def _read_rates(store: Store, now: float, lookback: float, interval_s: float) -> RunRates:
    out = recent_rates(store, now, lookback, interval_s)
    if any(r.last_growth_unix is None for r in out.per_node.values()):
        for node, ts in store.last_growth_unix().items():
            if node in out.per_node and out.per_node[node].last_growth_unix is None:
                out.per_node[node].last_growth_unix = ts
    minute = minute_rates(token_buckets(store, DROP_BUCKET_S, now - DROP_LOOKBACK_S))
    return dataclasses.replace(out, drop_median_tps=rate_drop(out.tokens_per_s_1m, minute))


@dataclasses.dataclass(frozen=True)
class Stalls:
    """What the stall rule found at one instant."""

    run_since_unix: float | None  # the run is stalled: no new completion since (the last one's time)
    nodes: Mapping[str, float]  # every quiet live node that wrote before -> its last growth
    writing: frozenset[str]  # live nodes that grew within the window
    waiting: Mapping[str, float] = dataclasses.field(default_factory=dict)  # never grew -> first seen

    def lone(self) -> dict[str, float]:
        """Quiet nodes worth naming on their own: only while some other node writes."""
        return dict(self.nodes) if self.writing else {}


def stall_state(
    per_node: Mapping[str, NodeRate], now: float, stall_after_s: float, live: Collection[str] | None = None
) -> Stalls:
    """The one stall rule (see the module docstring). `live`: nodes answering polls (a node
    that is down is reported as down, not as stalled); None: every node."""
    names = [n for n in per_node if live is None or n in live]
    grown: dict[str, float] = {}
    for n in names:
        if (t := per_node[n].last_growth_unix) is not None:
            grown[n] = t
    writing = frozenset(n for n, t in grown.items() if now - t < stall_after_s)
    quiet = {n: t for n, t in grown.items() if n not in writing}
    waiting: dict[str, float] = {}
    for n in names:
        seen = per_node[n].first_seen_unix
        if n not in grown and seen is not None and now - seen >= stall_after_s:
            waiting[n] = seen
    run = None
    if (quiet or waiting) and not writing:
        run = max(grown.values()) if grown else min(waiting.values())
    return Stalls(run, quiet, writing, waiting)
