"""Page payloads: what the screens show, computed by the collector after a poll and stored.

A page render used to aggregate the store itself: length statistics over every count row, the
what-if fit with its bootstrap, truncation per node and per shard with intervals, GPU series
downsampled over a day and banded per node. On the bench store (24 h x 64 GPUs, 1.5M
completions) that was most of a second per page, and several seconds at 64 nodes x 8 GPUs.
Now the collector calls `Refresher.after_poll()` after each poll; at most once every
`min_interval_s`, and never twice at once, one background thread computes every payload here
and writes it to the store's `page_data` table (name -> when computed, payload). A page reads
one row, shows the payload's age, and computes on demand only when the row is missing (the
first seconds after start) or was computed for other parameters.

Each payload is a frozen dataclass (runhealth/payloads/pagetypes.py: RunLengths, GroupTable,
LengthsOverTime, TruncationOverTime, WhatIfDefault, GpuWindow), written as compact JSON
(typedjson's shape), zlib-compressed, and read back typed: `get(store, name, RunLengths)`.
Tables are stored column-wise (pagetypes.Table: {"columns": [...], "data": {column: [values]}})
so a page turns them into a DataFrame without a per-row loop. No pickle: a store file from
elsewhere can never run code in the dashboard.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast, overload

from runhealth import textsafe, typedjson
from runhealth.analysis import lengthtime, loops, stats, whatif
from runhealth.payloads import gpubands, pagetypes, truncbuckets
from runhealth.payloads.pagetypes import GpuWindow, GroupRow, Payload, RunLengths, Table, WhatIfDefault
from runhealth.records import GroupTotalRow, LabelledGpuPoint, LengthCountRow, rows_as, widen
from runhealth.settings.windows import WHATIF_REFIT_S, stale_after_s
from runhealth.store import Store, rollup

log = textsafe.get_logger(__name__)

MIN_INTERVAL_S = 30.0  # default rate limit; the collector passes its poll interval (counts must stay live)
SETTLE_MAX_S = 0.5  # a computation waits at most this long for the polls still running (Refresher)


def early_s(min_interval_s: float) -> float:
    """How much sooner than `min_interval_s` after the last one a computation may start: what a
    round's wait for its polls (at most SETTLE_MAX_S) can move it, at most half the interval."""
    return min(SETTLE_MAX_S, min_interval_s / 2)


# The GPU page's windows (seconds; None = the whole run), the points per GPU it asks the store
# for, and the time steps of the per-node bands it draws past PER_GPU_LINES_UP_TO GPUs.
GPU_WINDOWS_S: dict[str, float | None] = {"15 min": 900, "1 h": 3600, "6 h": 6 * 3600, "24 h": 86400, "whole run": None}
GPU_MAX_POINTS = 400
BAND_POINTS = gpubands.BAND_POINTS
PER_GPU_LINES_UP_TO = 8
# The Refresher's kept bands and truncation buckets, in the store (#42 item 4): a restarted
# collector resumes from them instead of reading the whole history again. Written every
# STATE_EVERY_S and when the collector stops; a page never reads it.
STATE = "state:incremental"
STATE_EVERY_S = 300.0
GPU_VALUES = gpubands.VALUES
T = TypeVar("T")


# -- storage -----------------------------------------------------------------------------------
def encode(obj: Any) -> bytes:
    """`typedjson.dump(obj)` as JSON, compressed (tests/test_pagedata.py checks the two agree).
    json.dumps asks `default` for each value it cannot write itself, so a dataclass becomes the
    object of its fields one level at a time and long lists are written at C speed; a GPU band
    table goes in as the JSON text its steps were serialised to when computed (each step once,
    not every refresh)."""
    texts: list[str] = []
    token = os.urandom(8).hex()  # placeholders no value in the payload can spell by chance

    def default(o: Any) -> Any:
        if isinstance(o, gpubands.BandTable):
            texts.append(o.json_text())
            return f"\x00{token}:{len(texts) - 1}\x00"
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
        if hasattr(o, "to_json"):  # a class that writes itself (Table, stats.LengthHist), as typedjson.dump
            return o.to_json()
        if isinstance(o, Mapping):
            return dict(o)
        if isinstance(o, (set, frozenset)):
            return sorted(o)
        raise TypeError(f"cannot store {type(o).__name__} in a page payload")

    text = json.dumps(obj, separators=(",", ":"), default=default)
    if texts:
        text = re.sub(rf'"\\u0000{token}:(\d+)\\u0000"', lambda m: texts[int(m.group(1))], text)
    return zlib.compress(text.encode("utf-8"), 1)


def decode(blob: bytes) -> Any:
    return json.loads(zlib.decompress(blob).decode("utf-8"))


def put(store: Store, payloads: Mapping[str, Any], ts_unix: float) -> None:
    """Write payloads in one transaction: a page never mixes two computations' numbers."""
    blobs = [(name, ts_unix, encode(p)) for name, p in payloads.items()]
    with store.transaction() as db:
        db.executemany("INSERT OR REPLACE INTO page_data (name, ts_unix, payload) VALUES (?, ?, ?)", blobs)


def computed_at(store: Store, name: str) -> float | None:
    """When payload `name` was computed (None: there is none, or no page_data table yet)."""
    try:
        row = store.cursor("SELECT ts_unix FROM page_data WHERE name = ?", (name,)).fetchone()
    except Exception:  # a store from before the table
        return None
    return float(row[0]) if row else None


@overload
def get(store: Store, name: str) -> tuple[float, Any] | None: ...
@overload
def get(store: Store, name: str, tp: type[T]) -> tuple[float, T] | None: ...
def get(store: Store, name: str, tp: type[Any] | None = None) -> tuple[float, Any] | None:
    """(when it was computed, payload), or None when there is none (yet) or it cannot be read.
    `tp`: the payload's type (pagetypes): read back typed (typedjson.load); a row that does not
    fit it is logged and read as None, so the page computes on demand. Without: the JSON data."""
    got = _read(store, name)
    if got is None or tp is None:
        return got
    try:
        return got[0], typedjson.load(tp, got[1], name)
    except typedjson.TypedJsonError as exc:
        log.warning("page payload %s does not fit %s (%s): computing on demand", name, tp.__name__, exc)
        return None


def _read(store: Store, name: str) -> tuple[float, Any] | None:
    try:
        row = store.cursor("SELECT ts_unix, payload FROM page_data WHERE name = ?", (name,)).fetchone()
    except Exception as exc:  # a store from before the table: the page computes on demand
        log.debug("page_data %s unreadable: %s", name, exc)
        return None
    if row is None:
        return None
    try:
        return float(row[0]), decode(row[1])
    except (ValueError, zlib.error) as exc:
        log.warning("page payload %s is damaged (%s): computing on demand", name, exc)
        return None


# -- the payloads: each function is what the page computed before -------------------------------
def run_lengths(store: Store, ceiling: int | None) -> RunLengths:
    """The run's length counts (a LengthHist), with histogram bins and CDF points."""
    hist = stats.LengthHist.from_rows(store.run_length_rows())
    malformed = sum(n["malformed"] for n in store.counted_nodes())
    return RunLengths(
        ceiling=ceiling,
        rows=hist,
        malformed=malformed,
        bins=tuple(map(tuple, stats.histogram(hist))),
        cdf=tuple(stats.cdf_points(hist)),
    )


def group_lengths(store: Store, by: str, ceiling: int | None) -> list[GroupRow]:
    """Share at the ceiling per node or shard, with Wilson interval and ceiling drift.

    Only the length-stop rows come out of SQL (totals are summed there): a group's ceiling
    and its mass at the ceiling depend on nothing else.
    """

    def name(r: LengthCountRow | GroupTotalRow) -> str:
        return r["node"] if by == "node" else f"{r['node']}:{r['path']}"

    groups: dict[str, stats.LengthHist] = {}
    for r in store.length_counts(by=by, finish_reason="length"):
        groups.setdefault(name(r), stats.LengthHist()).add(r["tokens"], r["finish_reason"], r["estimated"], r["count"])
    drift = stats.ceiling_drift(groups)
    out: list[GroupRow] = []
    for t in store.group_totals(by):
        group = name(t)
        hist = groups.get(group, stats.LengthHist())
        own = stats.detect_ceiling(hist)
        limit = ceiling or own
        at = sum(n for tok, fr, est, n in hist.rows() if not est and stats.is_cut(tok, fr, limit))
        denominator = t["exact"] or t["completions"]
        lo, hi = stats.wilson_interval(at, denominator)
        out.append(
            GroupRow(
                group=group,
                completions=t["completions"],
                at_ceiling=at,
                fraction=at / denominator if denominator else 0.0,
                lo=lo,
                hi=hi,
                ceiling=own if own is not None else ceiling,
                drift=group in drift,
            )
        )
    return out


def whatif_default(hist: stats.LengthHist, ceiling: int, loop_sample: tuple[int, int] | None) -> WhatIfDefault:
    """The what-if the page opens with (new limit = 2 x the ceiling): whatif.for_run, as the page asks."""
    limit = 2 * ceiling
    result = whatif.for_run(hist, ceiling, limit, loop_sample, whatif.BOOTSTRAP)
    return WhatIfDefault(
        ceiling=ceiling,
        limit=limit,
        hist_key=stats.hist_digest(hist),
        loop_sample=(loop_sample[0], loop_sample[1]) if loop_sample else None,
        result=result.to_json(),
    )


def truncation_over_time(
    store: Store, interval_s: float, ceiling: int | None, cache: truncbuckets.Truncation | None = None
) -> pagetypes.TruncationOverTime:
    """Poll deltas per hour, or per a few polls while the run is short, and the length stops of
    each bucket split at the ceiling (the page merges the two): raw and rolled-up deltas, the
    whole run, from `cache` (kept by the Refresher: only new rows' buckets are recomputed)."""
    bucket_s: float = 3600
    if truncbuckets.span_s(store, bucket_s) < 6 * 3600:
        bucket_s = stale_after_s(interval_s)  # a few polls
    polls, split = (cache or truncbuckets.Truncation(store)).buckets(bucket_s, ceiling)
    return pagetypes.TruncationOverTime(interval_s, ceiling, bucket_s, tuple(polls), tuple(split))


def gpu_since(window_s: float | None, now: float) -> float | None:
    """The window's start as the GPU page rounds it (to 10 s, so a cache key lasts 10 s)."""
    return (now - window_s) // 10 * 10 if window_s else None


def gpu_series(store: Store, since_unix: float | None, max_points: int = GPU_MAX_POINTS) -> list[LabelledGpuPoint]:
    """Per GPU, at most max_points averaged points (raw and rolled-up rows), with label and GiB."""
    rows = widen(rollup.gpu_history(store, since_unix=since_unix, max_points=max_points))
    for r in rows:
        r["label"] = f"{r['node']}/{r['gpu']}"
        r["mem_used_gib"] = r["mem_used_mib"] / 1024 if r["mem_used_mib"] is not None else None
    return rows_as(LabelledGpuPoint, rows)


def gpu_oldest(store: Store) -> float | None:
    """The oldest GPU reading the store holds (raw or rolled up): where the whole run starts."""
    found = [store.cursor("SELECT MIN(ts_unix) FROM gpu_samples").fetchone()[0]]
    if rollup.has_rollups(store):
        sql = "SELECT MIN(bucket_unix) FROM gpu_rollup WHERE res_s = ?"
        found += [store.cursor(sql, (res,)).fetchone()[0] for res in rollup.TIERS]
    return min((t for t in found if t is not None), default=None)


def band_cells(window_s: float | None, now: float, oldest: float) -> tuple[float, int]:
    """(step width, first step index) of a window's bands: about BAND_POINTS aligned steps over
    the window (a window reaching past the oldest reading is the whole run's)."""
    since = gpu_since(window_s, now)
    if since is None or window_s is None or since <= oldest:
        step = gpubands.step_for(now - oldest)
        return step, int(oldest / step)
    step = gpubands.step_for(window_s)
    return step, int(since / step)


def gpu_window(store: Store, window_s: float | None, now: float, bands: gpubands.Bands | None = None) -> GpuWindow:
    """What the GPU page draws for one window, all nodes: the series itself for a small run,
    per-node bands (and each limit's maximum) past PER_GPU_LINES_UP_TO GPUs, from `bands`
    (kept between calls by the Refresher; a fresh one computes the window from scratch)."""
    since = gpu_since(window_s, now)
    oldest = gpu_oldest(store)
    seen = store.gpus_seen(-math.inf if since is None else since)
    if oldest is None or sum(map(len, seen.values())) <= PER_GPU_LINES_UP_TO:
        rows = gpu_series(store, since)
        series = Table.of_rows(rows, list(rows[0]) if rows else [])
        return GpuWindow(since, tuple(sorted({r["label"] for r in rows})), series, None, {})
    step, first = band_cells(window_s, now, oldest)
    bands = bands or gpubands.Bands(store)
    bands.update(step, first)
    labels = sorted(f"{n}/{g}" for n, gpus in store.gpus_seen(first * step).items() for g in gpus)
    return GpuWindow(since, tuple(labels), None, *bands.window(step, first))


# -- the collector's side --------------------------------------------------------------------------
def window_due(span_s: float | None, age_s: float | None, min_interval_s: float) -> bool:
    """A GPU window is recomputed once its points could have moved: a day's window has 360 s
    buckets, so redoing it every 30 s would cost a fleet seconds of CPU for the same picture. A
    computation may come `early_s` sooner than an interval after the last: a window due at every
    computation (a step under the interval) is not skipped by one that came a little early."""
    width = (span_s or GPU_WINDOWS_S["24 h"] or 0) / BAND_POINTS
    return age_s is None or age_s >= max(min_interval_s, width) - early_s(min_interval_s)


def gpu_windows(
    store: Store, now: float, due: Callable[[str], bool] = lambda name: True, bands: gpubands.Bands | None = None
) -> dict[str, GpuWindow]:
    """The GPU page's due windows. A window reaching back past the oldest reading is the whole
    run's: computed once, stored under each such name. `bands` keeps the steps between calls."""
    bands = bands or gpubands.Bands(store)
    oldest = gpu_oldest(store)
    out: dict[str, GpuWindow] = {}
    whole: GpuWindow | None = None
    for name, span in GPU_WINDOWS_S.items():
        if not due(name):
            continue
        since = gpu_since(span, now)
        if oldest is not None and (since is None or since <= oldest):
            whole = whole or gpu_window(store, None, now, bands)
            out[f"gpu:{name}"] = dataclasses.replace(whole, since=since)
        else:
            out[f"gpu:{name}"] = gpu_window(store, span, now, bands)
    if oldest is not None:  # the widths some window uses now, due or not: the others are let go
        bands.forget(band_cells(span, now, oldest)[0] for span in GPU_WINDOWS_S.values())
    return out


def compute_all(
    store: Store,
    ceiling_config: int | None,
    interval_s: float,
    now: float | None = None,
    gpu_due: Callable[[str], bool] = lambda name: True,
    whatif_due: bool = True,
    bands: gpubands.Bands | None = None,
    truncation: truncbuckets.Truncation | None = None,
) -> dict[str, Payload]:
    """Every payload, by name (what `Refresher` writes); GPU windows only when `gpu_due(window)`,
    their bands kept in `bands` and the truncation buckets in `truncation` between calls (None:
    computed from scratch)."""
    now = time.time() if now is None else now
    out: dict[str, Payload] = {}
    lengths = run_lengths(store, ceiling_config)
    out["run_lengths"] = lengths
    hist = lengths.rows
    ceiling = stats.summarize(hist, ceiling=ceiling_config, unparseable=lengths.malformed).ceiling_tokens
    for by in ("node", "shard"):  # keyed by the ceiling the page asks with: configured, else detected
        table = Table.of_rows(group_lengths(store, by, ceiling), pagetypes.GROUP_COLUMNS)
        out[f"groups:{by}"] = pagetypes.GroupTable(ceiling, table)
    hours = cast(list[pagetypes.LengthHour], lengthtime.hourly(store, ceiling))
    out["lengths_over_time"] = pagetypes.LengthsOverTime(ceiling, tuple(hours))
    out["truncation_over_time"] = truncation_over_time(store, interval_s, ceiling, truncation)
    if ceiling and hist.total and whatif_due:
        out["whatif"] = whatif_default(hist, ceiling, loops.loop_sample(store.latest_sample_batch()))
    out.update(gpu_windows(store, now, gpu_due, bands))
    return out


class Refresher:
    """Recomputes the page payloads after polls: one computation at a time, in a background
    thread, so the poll loop never waits for it, at a limited rate (below).

    A poll that lands while a computation runs, or before the limit allows the next, is not
    dropped: one computation follows when the limit allows (a timer), so the last poll of a round
    is always shown within one interval. A computation that starts while other polls still run (`busy`, the
    collector's) waits for them, at most SETTLE_MAX_S: a round of a few nodes polled together is
    computed once, right after its last poll (#42 item 2: on the demo the GPUs and Output lengths
    pages showed a poll up to an interval late, 3.6 s of 5, when a round's first poll started the
    computation and the second, 70 ms later, waited for the next round's).

    The rate: a computation starts once the newest poll the last one read is `min_interval_s` less
    `early_s` old (SETTLE_MAX_S: under polls that never stop, a fleet's, at most 5% more
    computations than one per interval at a 10 s interval), and never within half an interval of
    the last start. The limit was "one interval since the last start": rounds of polls one interval
    apart then locked the computations to whatever phase the first one had, each waiting for the
    last start plus an interval, never for its round; as a start is never early, the delay only
    grew, by the timer's lateness each round, up to an interval (#42 item 2: the demo's GPUs and
    Output lengths pages showed each round 0.2 s after its polls, and 2.5 s after a collector
    restart's catch-up). Counted from the polls read, the limit follows the rounds: a round's
    computation starts once its polls have landed, whatever the phase of the one before."""

    def __init__(
        self,
        store: Store,
        ceiling: int | None,
        interval_s: float,
        min_interval_s: float = MIN_INTERVAL_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        busy: Callable[[], bool] | None = None,
    ):
        """`clock`: the wall clock the payloads are stamped with (shown as "computed at");
        `monotonic`: the clock of the rate limits, which a step of the wall clock must not stop;
        `busy`: whether polls are still running (None: never waits for them)."""
        self.store, self.ceiling, self.interval_s = store, ceiling, interval_s
        self.min_interval_s = min_interval_s
        self.clock, self.monotonic, self.busy = clock, monotonic, busy
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a computation ends
        self._polled = threading.Event()  # set by each poll: a settling computation looks again
        self._running = False
        self._pending = False  # a poll landed that no computation has read yet
        self._timer: threading.Timer | None = None  # the computation owed once the limit allows
        self.started_at: list[float] = []  # monotonic starts of the computations (the rate's tests)
        self._last_start: float | None = None  # monotonic
        self._last_poll: float | None = None  # monotonic: the newest poll's end
        self._read_upto: float | None = None  # monotonic: the newest poll the last computation read
        self._gpu_done: dict[str, float] = {}  # window -> when last computed (monotonic)
        self._whatif_done: float | None = None  # monotonic
        self.bands = gpubands.Bands(store)  # the GPU bands' steps, kept: each poll's rows are read once per width
        self.truncation = truncbuckets.Truncation(store)  # truncation over time per bucket, kept likewise
        self.last_error: str | None = None
        self.runs = 0
        self._restored = False  # the kept state read back from the store (once, at the first run)
        self._state_saved: float | None = None  # monotonic

    def restore_state(self) -> tuple[int, bool]:
        """Resume the kept bands and truncation buckets from the store's STATE row (what a
        previous collector wrote): (band widths taken, truncation taken). Parts whose rows the
        store no longer holds as they were are computed again."""
        self._restored = True
        got = _read(self.store, STATE)
        if got is None or not isinstance(got[1], dict):
            return 0, False
        widths = self.bands.restore(got[1].get("bands"))
        return widths, self.truncation.restore(got[1].get("truncation"))

    def save_state(self, ts_unix: float | None = None) -> None:
        """Write the kept state (call from the computing thread, or while none runs)."""
        state = {"bands": self.bands.snapshot(), "truncation": self.truncation.snapshot()}
        put(self.store, {STATE: state}, self.clock() if ts_unix is None else ts_unix)
        self._state_saved = self.monotonic()

    def save_on_stop(self, timeout_s: float = 10.0) -> bool:
        """Write the kept state once no computation runs (the collector stops): the next start
        resumes from here. False: a computation still ran after `timeout_s`, nothing written."""
        if not self.wait_idle(timeout_s) or self.runs == 0:
            return False
        with self._lock:
            if self._running:
                return False
            self._running = True
        try:
            self.save_state()
        except Exception as exc:  # a store that cannot be written now: the next start recomputes
            log.warning("page data state not kept: %s", exc)
            return False
        finally:
            with self._lock:
                self._running = False
                self._idle.notify_all()
        return True

    def after_poll(self, ended: float | None = None) -> bool:
        """A poll landed (`ended`: when its rows were written, monotonic; default now): start a
        computation now (True), or, while one runs or the limit does not allow one yet, owe one
        for when it does (False). A poll that a computation begun since has read owes nothing: the
        collector calls this after the poll stops counting as running, and a computation waiting
        for the round can start in between (it owed one more computation, reading nothing new,
        that pushed the next round's back, #42 item 2)."""
        now = self.monotonic()
        ended = now if ended is None else min(ended, now)
        with self._lock:
            self._polled.set()
            if self._last_start is not None and ended <= self._last_start:
                self._read_upto = max(ended, self._read_upto if self._read_upto is not None else ended)
                return False
            self._pending = True
            self._last_poll = max(ended, self._last_poll if self._last_poll is not None else ended)
            return self._start_or_owe()

    def stop(self) -> None:
        """Forget the computation owed (the collector stops; one running ends on its own)."""
        with self._lock:
            self._pending = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _start_or_owe(self) -> bool:
        """With the lock held and a poll unread: start now, or arm the timer for when allowed."""
        if self._running:
            return False  # the computation's end looks again
        now = self.monotonic()
        wait = 0.0
        if self._last_start is not None:
            read = self._read_upto if self._read_upto is not None else self._last_start
            gap = self.min_interval_s - early_s(self.min_interval_s)
            wait = max(read + gap, self._last_start + self.min_interval_s / 2) - now
        if wait > 0:
            if self._timer is None:
                self._timer = threading.Timer(wait, self._owed)
                self._timer.daemon = True
                self._timer.start()
            return False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._running = True  # _run sets _last_start once its reads begin
        threading.Thread(target=self._run, name="runhealth-pagedata", daemon=True).start()
        return True

    def _owed(self) -> None:
        with self._lock:
            self._timer = None
            if self._pending:
                self._start_or_owe()

    def _settle(self) -> None:
        """Wait for the polls still running (each one's end looks again), at most SETTLE_MAX_S."""
        if self.busy is None:
            return
        deadline = self.monotonic() + SETTLE_MAX_S
        while self.busy():
            left = deadline - self.monotonic()
            if left <= 0:
                return
            self._polled.wait(left)
            self._polled.clear()

    def run_now(self) -> None:
        """Compute and write every payload in this thread (tests, the bench, the first start)."""
        if not self._restored:
            self.restore_state()
        started, began = self.clock(), self.monotonic()

        def due(window: str) -> bool:
            last = self._gpu_done.get(window)
            return window_due(GPU_WINDOWS_S[window], None if last is None else began - last, self.min_interval_s)

        refit = WHATIF_REFIT_S - early_s(self.min_interval_s)  # a computation may come a little early
        whatif_due = self._whatif_done is None or began - self._whatif_done >= refit
        payloads = compute_all(
            self.store,
            self.ceiling,
            self.interval_s,
            now=started,
            gpu_due=due,
            whatif_due=whatif_due,
            bands=self.bands,
            truncation=self.truncation,
        )
        put(self.store, payloads, started)
        if "whatif" in payloads:
            self._whatif_done = began
        self._gpu_done.update({name[4:]: began for name in payloads if name.startswith("gpu:")})
        self.runs += 1
        if self._state_saved is None or began - self._state_saved >= STATE_EVERY_S:
            self.save_state(started)

    def _run(self) -> None:
        try:
            self._settle()
            with self._lock:  # what lands from here on is not read by this computation: owed
                self._pending = False
                self._last_start, self._read_upto = self.monotonic(), self._last_poll
                self.started_at.append(self._last_start)
            self.run_now()
            self.last_error = None
        except Exception as exc:  # pages fall back to computing on demand; the poll loop is unaffected
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("page data not refreshed: %s", self.last_error)
        finally:
            with self._lock:
                self._running = False
                self._idle.notify_all()
                if self._pending:
                    self._start_or_owe()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """True once no computation runs (tests, and the collector's stop). A wait on a condition,
        not a sleep: under libfaketime with the wall clock stepped back, time.sleep fails (EINVAL)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout_s)
