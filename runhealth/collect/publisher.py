"""The collector publishes the Overview after polls (runhealth.screens.published says why).

`after_poll()` is called after every node's poll: it marks the store changed and returns at once.
One publishing thread builds whenever something changed, at most once per `gap_s()`: so a fleet's
hundreds of polls a minute make one build a second at most, not hundreds, and the last poll of a
burst (a "Refresh now", a round of staggered polls) is always published, at most one gap later.
While other polls are still running (`busy`, the collector's), a build waits for them, up to
SETTLE_MAX_S after the first poll it would show: a round of a few nodes, polled together, is
published once, right after its last poll, instead of its first node at once and the others a
gap later (#42 item 2: 1.2 s from the demo's second node to the screen). A fleet's polls never
all end; its builds come when the gap ends, as before.
The gap adapts to what a build costs (its CPU seconds): at least MIN_GAP_S, and long enough that
building takes at most COST_SHARE of a core (at most MAX_GAP_INTERVALS poll intervals, and half of
stale_after, so that a build's numbers never turn stale before the next one). Each build is written with
the age it may be shown to (`max_age_s`: three gaps, at least two intervals), so a page shows the
published Overview while the collector keeps up and builds its own when it does not.

The build's alerts are the run's alerts at its instant: the collector's alert history records
them (`alerts_at`) instead of evaluating the rules again, while the build still holds. Measured
(bench/fleet.py, 512 nodes x 8 GPUs, a day of history): a build costs about half a CPU second
there, so it runs every 15 s (half the default stale_after); a run of a few nodes builds in ~10 ms,
every second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from runhealth import textsafe
from runhealth.rules import health
from runhealth.screens import published
from runhealth.settings.config import RunConfig
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store

log = textsafe.get_logger(__name__)

MIN_GAP_S = 1.0  # a small run publishes after (nearly) every poll
COST_SHARE = 0.02  # builds take at most this share of a core ...
MAX_GAP_INTERVALS = 3  # ... unless that would leave more than this many poll intervals between them
SETTLE_MAX_S = 0.5  # a build waits at most this long for the polls still running (the module docstring)


class Publisher:
    """Builds and writes the Overview after polls: at most once a gap, never twice at once, off the poll loop."""

    def __init__(
        self,
        store: Store,
        config: RunConfig,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        busy: Callable[[], bool] | None = None,
    ):
        self.store, self.config = store, config
        self.clock, self.monotonic = clock, monotonic
        self.busy = busy  # whether polls are still running (the collector's); None: never waits
        self._lock = threading.Lock()
        self._dirty = False  # a poll landed since the last build began
        self._dirty_since: float | None = None  # monotonic: the first poll the next build shows
        self._last_start: float | None = None  # monotonic
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self.latest: published.Published | None = None  # the last build, as written
        self.build_s = 0.0  # the last build's cost (its thread's CPU seconds)
        self.runs = 0
        self.last_error: str | None = None

    def gap_s(self) -> float:
        """Seconds between two builds' starts: see the module docstring."""
        cost_bound = max(MIN_GAP_S, self.build_s / COST_SHARE)
        # Half stale_after at most: a build older than that may not be shown once its numbers'
        # age passes stale_after (published.still_true), and the alert history would evaluate again.
        return min(cost_bound, MAX_GAP_INTERVALS * self.config.interval_s, self.config.stale_after / 2)

    def max_age_s(self) -> float:
        """How old the next build may be shown: three gaps (the next build comes after one, and
        takes time), at least published.max_age_s."""
        return max(published.max_age_s(self.config), 3 * self.gap_s())

    def wait_s(self) -> float:
        """Seconds until the next build may start (0: now)."""
        last = self._last_start
        return 0.0 if last is None else max(0.0, last + self.gap_s() - self.monotonic())

    def settle_s(self) -> float:
        """Seconds a due build still waits for the polls running (0: build now): until they end,
        at most SETTLE_MAX_S after the first poll it would show. Each poll's end wakes the thread."""
        since = self._dirty_since
        if self.busy is None or since is None or not self.busy():
            return 0.0
        return max(0.0, since + SETTLE_MAX_S - self.monotonic())

    def mark(self) -> None:
        """A poll landed: the next build is due (the thread's input; after_poll also wakes it)."""
        with self._lock:
            if not self._dirty:
                self._dirty_since = self.monotonic()
            self._dirty = True

    def after_poll(self) -> None:
        """A poll landed: the publishing thread builds within one gap (started on first use)."""
        self.mark()
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name="runhealth-publish", daemon=True)
                self._thread.start()
        self._wake.set()

    def run_pending(self) -> bool:
        """Build and write now if a poll landed since the last build began (the thread's step;
        False: nothing to do). A failed build is logged: pages then build the Overview themselves."""
        with self._lock:
            if not self._dirty:
                return False
            self._dirty, self._dirty_since, self._last_start = False, None, self.monotonic()
        try:
            self.publish_now()
            self.last_error = None
        except Exception as exc:  # the poll loop is unaffected; the next poll tries again
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("overview not published: %s", self.last_error)
        return True

    def publish_now(self) -> None:
        """Build and write the Overview in this thread (tests, the bench). Its cost is the CPU
        seconds this thread spent on it, not the wall seconds: a build that waited for the CPU (a
        page data computation beside it, a page's run) cost a core nothing more, and counted in
        wall seconds, one build of the demo's taking 0.2 s set the next gap to 10 s, so a round of
        polls was published two intervals late (a page left open showed it 4.9 s late)."""
        began = time.thread_time()
        self.latest = published.publish(self.store, self.config, self.clock(), self.max_age_s())
        self.build_s = time.thread_time() - began
        self.runs += 1

    def alerts_at(self, store: Store, now: float) -> list[health.Alert]:
        """The run's alerts at `now` (the alert history's source): the last build's while it still
        holds (published.still_true, as a page decides), else the rules evaluated now."""
        last = self.latest
        if last is not None and published.still_true(last.model, now, self.config, last.max_age_s):
            return list(last.model.alerts)
        return health.evaluate(store, now, RunSettings.from_config(self.config))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                if self._stop.wait(self.wait_s()):
                    return
                settle = self.settle_s()
                if settle > 0:  # polls still running: the next one's end (after_poll) wakes us
                    self._wake.wait(settle)
                    self._wake.clear()
                    continue
                if not self.run_pending():
                    break

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the publishing thread (a build in progress finishes first: its write is whole)."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
