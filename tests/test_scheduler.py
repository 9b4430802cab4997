"""The fleet scheduler: bounded threads, staggered first polls, one poll per node at a time."""

from __future__ import annotations

import threading
import time

from runhealth.collect.scheduler import PollScheduler, pool_size


class Recorder:
    def __init__(self, hold_s: float = 0.0):
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.starts: dict[str, list[float]] = {}
        self.active: set[str] = set()
        self.max_active = 0
        self.overlap = False
        self.threads: set[int] = set()

    def __call__(self, name: str) -> None:
        with self.lock:
            self.overlap |= name in self.active
            self.active.add(name)
            self.max_active = max(self.max_active, len(self.active))
            self.starts.setdefault(name, []).append(time.monotonic())
            self.threads.add(threading.get_ident())
        time.sleep(self.hold_s)
        with self.lock:
            self.active.discard(name)


def _wait(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_many_nodes_run_on_a_bounded_pool_and_each_keeps_its_interval():
    names = [f"n{i}" for i in range(100)]
    rec = Recorder(hold_s=0.02)
    sched = PollScheduler(names, rec, interval_s=0.5, max_workers=8, connects_per_s=1000)
    before = threading.active_count()
    sched.start()
    try:
        _wait(lambda: all(len(rec.starts.get(n, [])) >= 3 for n in names))
        assert threading.active_count() - before <= 8 + 1  # the workers and the dispatcher
    finally:
        sched.stop()
    assert rec.max_active <= 8 and len(rec.threads) <= 8
    assert not rec.overlap  # a node is never polled twice at once
    gaps = [b - a for n in names for a, b in zip(rec.starts[n], rec.starts[n][1:], strict=False)]
    assert min(gaps) >= 0.5 - 0.01  # next poll is due interval_s after the last one started


def test_first_polls_are_staggered():
    names = [f"n{i}" for i in range(40)]
    rec = Recorder()
    t0 = time.monotonic()
    sched = PollScheduler(names, rec, interval_s=60, max_workers=40, connects_per_s=40)
    sched.start()
    try:
        _wait(lambda: len(rec.starts) == 40)
    finally:
        sched.stop()
    firsts = sorted(v[0] - t0 for v in rec.starts.values())
    for i, t in enumerate(firsts):  # at most 40 set-ups per second: the i-th not before i/40 s
        assert t >= i / 40 - 0.01, (i, t)
    assert firsts[-1] >= 39 / 40 - 0.01


def test_wake_all_polls_everyone_now_and_failures_do_not_lose_a_node():
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def poll(name):
        with lock:
            calls[name] = calls.get(name, 0) + 1
        if name == "bad":
            raise RuntimeError("node unreachable")

    sched = PollScheduler(["a", "b", "bad"], poll, interval_s=3600, max_workers=2, connects_per_s=1000)
    sched.start()
    try:
        _wait(lambda: len(calls) == 3)
        sched.wake_all()
        _wait(lambda: all(calls[n] == 2 for n in ("a", "b", "bad")))
    finally:
        sched.stop()
    assert pool_size(512) == 32 and pool_size(3) == 3 and pool_size(0) == 1


def test_a_wake_during_a_poll_polls_that_node_again_right_after():
    release = threading.Event()
    calls: list[float] = []

    def poll(name):
        calls.append(time.monotonic())
        if len(calls) == 1:
            release.wait(10)

    sched = PollScheduler(["a"], poll, interval_s=3600, max_workers=1, connects_per_s=1000)
    sched.start()
    try:
        _wait(lambda: len(calls) == 1)
        sched.wake_all()  # "Refresh now" while the first poll is still running
        release.set()
        _wait(lambda: len(calls) == 2)
    finally:
        sched.stop()


def test_due_in_says_how_soon_the_next_queued_poll_is():
    """What follows a round waits for its staggered polls (Collector._polls_busy): at the end of
    every poll but a round's last, the next node is due within the stagger; after the last, not
    for most of an interval."""
    ends: dict[str, list[float]] = {}
    sched: PollScheduler

    def poll(name: str) -> None:
        ends.setdefault(name, []).append(sched.due_in())

    # A poll's end is recorded by its worker thread before the next node is dispatched: the
    # stagger is that thread's margin (at 50 ms, a loaded CI run once dispatched c before b's
    # worker had recorded its end).
    sched = PollScheduler(["a", "b", "c"], poll, interval_s=2.0, connects_per_s=5)
    assert sched.due_in() == 0.0  # not started: the first is due now
    sched.start()
    try:
        _wait(lambda: all(len(ends.get(n, [])) >= 2 for n in "abc"))
    finally:
        sched.stop()
    assert all(0 <= d <= 1 / 5 + 0.01 for n in "ab" for d in ends[n]), ends  # b, then c, 200 ms on
    assert all(d >= 2.0 - 2 / 5 - 0.05 for d in ends["c"]), ends  # the round's last: a again, 1.6 s on
    assert PollScheduler([], poll, interval_s=1.0).due_in() == float("inf")
