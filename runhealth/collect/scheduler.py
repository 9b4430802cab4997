"""Poll scheduling for a fleet: a bounded worker pool instead of one thread per node.

One dispatcher thread keeps each node's next due time in a heap and hands due polls to a
`ThreadPoolExecutor` of at most `max_workers` threads, so 512 nodes need 32 poll threads, not
512. A node is never polled twice at once; its next poll is due `interval_s` after its last
one started (a slow node slips, it does not pile up). First polls are staggered: at most
`connects_per_s` nodes start in any second, so 512 nodes do not open 512 SSH handshakes at
once (at the default 32/s the first round of 512 nodes is spread over 16 s).

Note: paramiko's SSH transport keeps one reader thread per open connection; those threads
block on sockets and cost memory, not CPU, and are outside this scheduler's control.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 32
DEFAULT_CONNECTS_PER_S = 32.0


def pool_size(nodes: int, max_workers: int = DEFAULT_MAX_WORKERS) -> int:
    return max(1, min(nodes, max_workers))


class PollScheduler:
    """Runs `poll(name)` for every name every `interval_s`, on at most `max_workers` threads."""

    def __init__(
        self,
        names: list[str],
        poll: Callable[[str], None],
        interval_s: float,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        connects_per_s: float = DEFAULT_CONNECTS_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.poll, self.interval_s, self.clock = poll, interval_s, clock
        self.max_workers = pool_size(len(names), max_workers)
        now = clock()
        # Staggered start: node i's first poll is due i / connects_per_s seconds from now.
        self._heap = [(now + i / connects_per_s, name) for i, name in enumerate(names)]
        heapq.heapify(self._heap)
        self._busy: set[str] = set()
        self._rewake: set[str] = set()  # woken while being polled: poll again right after
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="runhealth-poll")
        self._thread = threading.Thread(target=self._dispatch, name="runhealth-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s)
        self._pool.shutdown(wait=timeout_s is None or timeout_s > 0, cancel_futures=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def due_in(self) -> float:
        """Seconds until the next queued poll is due (0: due now; inf: none queued). A node being
        polled is not queued: the caller counts those."""
        with self._cond:
            return max(0.0, self._heap[0][0] - self.clock()) if self._heap else math.inf

    def wake_all(self) -> None:
        """Make every node due now (a page's "Refresh now"); a node being polled goes again right after."""
        now = self.clock()
        with self._cond:
            self._heap = [(min(due, now), name) for due, name in self._heap]
            heapq.heapify(self._heap)
            self._rewake |= self._busy
            self._cond.notify_all()

    def _dispatch(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if not self._heap:
                    self._cond.wait(1.0)
                    continue
                due, name = self._heap[0]
                wait = due - self.clock()
                if wait > 0:
                    self._cond.wait(min(wait, 1.0))
                    continue
                heapq.heappop(self._heap)
                self._busy.add(name)
            try:
                self._pool.submit(self._run, name)
            except RuntimeError:  # pool shut down under us: stopping
                return

    def _run(self, name: str) -> None:
        started = self.clock()  # when a worker took it, not when it was queued
        try:
            self.poll(name)
        except Exception as exc:  # the poller records its own failures; never lose the node
            log.info("node %s: poll failed: %s", name, exc)
        finally:
            with self._cond:
                self._busy.discard(name)
                due = self.clock() if name in self._rewake else max(started + self.interval_s, self.clock())
                self._rewake.discard(name)
                heapq.heappush(self._heap, (due, name))
                self._cond.notify_all()
