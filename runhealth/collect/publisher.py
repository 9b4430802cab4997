"""The collector publishes the Overview after polls (runhealth.screens.published says why).

`after_poll()` is called after every node's poll; it starts one build in a background thread
unless one runs or the last began less than `gap_s()` ago, so the poll loop never waits and a
fleet's hundreds of polls a minute do not become hundreds of builds. The gap adapts to what a
build costs: at least MIN_GAP_S, and long enough that building takes at most COST_SHARE of a
core, but never more than half a poll interval, so the published Overview is always younger
than the interval a page accepts (published.max_age_s) while the collector keeps up.
Measured: bench/fleet.py reports its CPU share beside the poll writes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from runhealth import textsafe
from runhealth.screens import published
from runhealth.settings.config import RunConfig
from runhealth.store import Store

log = textsafe.get_logger(__name__)

MIN_GAP_S = 1.0  # a small run publishes after (nearly) every poll
COST_SHARE = 0.02  # builds take at most this share of a core, up to half an interval apart


class Publisher:
    """Builds and writes the Overview after polls: rate-limited, one build at a time, off the poll loop."""

    def __init__(
        self,
        store: Store,
        config: RunConfig,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.store, self.config = store, config
        self.clock, self.monotonic = clock, monotonic
        self._lock = threading.Lock()
        self._running = False
        self._last_start: float | None = None
        self.build_s = 0.0  # the last build's duration (monotonic seconds)
        self.runs = 0
        self.last_error: str | None = None

    def gap_s(self) -> float:
        """Seconds between two builds' starts: see the module docstring."""
        return min(max(MIN_GAP_S, self.build_s / COST_SHARE), self.config.interval_s / 2)

    def after_poll(self) -> bool:
        """Start a build unless one runs or the last began under gap_s() ago (True: started)."""
        now = self.monotonic()
        with self._lock:
            if self._running or (self._last_start is not None and now - self._last_start < self.gap_s()):
                return False
            self._running, self._last_start = True, now
        threading.Thread(target=self._run, name="runhealth-publish", daemon=True).start()
        return True

    def publish_now(self) -> None:
        """Build and write the Overview in this thread (tests, the first start)."""
        began = self.monotonic()
        published.publish(self.store, self.config, self.clock())
        self.build_s = self.monotonic() - began
        self.runs += 1

    def _run(self) -> None:
        try:
            self.publish_now()
            self.last_error = None
        except Exception as exc:  # pages build the Overview themselves; the poll loop is unaffected
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("overview not published: %s", self.last_error)
        finally:
            with self._lock:
                self._running = False

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """True once no build runs (tests)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._running:
                    return True
            time.sleep(0.01)
        return False
