"""Polls' writes grouped: the polls that land together written in one transaction (#42 item 3).

At 1,024 nodes a collector writes ~100 polls a second, each in its own transaction
(`Store.write_poll`) from whichever pool thread polled. `GroupWriter.write_poll` hands the poll to
one writer thread instead and waits for its commit: the writer writes every poll queued by then
(`Store.write_poll_in` one after another) in one transaction. While other polls are still in
their round trip (`polling()`) it waits for them up to LINGER_S after the first one queued, at
most MAX_POLLS a group; a lone poll (a small run, a test) is written at once.

What a poll's write guaranteed stands: its offsets and the counts they produced commit together
(in its group's transaction, which holds all of them or none), a caller returns only once its
poll is committed (its next poll resumes from the offsets written), and a failure loses nothing
and is the failing poll's own: when a group's transaction fails, nothing of it was written and
each of its polls is written again alone (`Store.write_poll`), so only the poll (or the store)
at fault fails, with its own error. The writer's connection keeps its page cache between groups
(a pool thread's is dropped whenever another connection commits).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from runhealth import textsafe
from runhealth.ingest import PollRecord
from runhealth.store import Store

log = textsafe.get_logger(__name__)

LINGER_S = 0.05  # a group waits at most this long after its first poll for polls still in flight
MAX_POLLS = 32  # polls a transaction at most
WRITER_CHECK_S = 1.0  # a caller waiting for its group checks this often that the writer still runs


class _Pending:
    """One poll handed to the writer, and its outcome."""

    __slots__ = ("args", "queued", "done", "delta", "error")

    def __init__(self, args: tuple, queued: float):
        self.args, self.queued = args, queued
        self.done = threading.Event()
        self.delta: dict[str, int] | None = None
        self.error: BaseException | None = None


class GroupWriter:
    """Writes polls in groups from one thread (see the module docstring); stats in `groups`, `polls`."""

    def __init__(
        self,
        store: Store,
        linger_s: float = LINGER_S,
        max_polls: int = MAX_POLLS,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.store, self.linger_s, self.max_polls, self.monotonic = store, linger_s, max_polls, monotonic
        self._cond = threading.Condition()
        self._queue: list[_Pending] = []
        self._polling = 0  # polls begun (polling()) and not yet ended: queued ones among them
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.groups = 0  # transactions committed (tests, the bench)
        self.polls = 0  # polls written in them

    @contextlib.contextmanager
    def polling(self) -> Iterator[None]:
        """Around a poll, request to write: the writer waits for polls in flight (at most LINGER_S)."""
        with self._cond:
            self._polling += 1
        try:
            yield
        finally:
            with self._cond:
                self._polling -= 1
                self._cond.notify_all()  # a poll that failed before its write: no need to wait for it

    def write_poll(
        self, node: str, record: PollRecord, ts_unix: float, rtt_ms: float | None, interval_s: float | None = None
    ) -> dict[str, int]:
        """`Store.write_poll`, in the next group: returns once the poll is committed; raises its error."""
        pending = _Pending((node, record, ts_unix, rtt_ms, interval_s), self.monotonic())
        with self._cond:
            queued = not self._stopped  # after stop(): written here, as before
            if queued:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="runhealth-writer", daemon=True)
                    self._thread.start()
                self._queue.append(pending)
                self._cond.notify_all()
        while queued and not pending.done.wait(WRITER_CHECK_S):
            with self._cond:  # a writer thread that ended (it never should) leaves no caller waiting
                if not self._thread.is_alive() and pending in self._queue:  # type: ignore[union-attr]
                    self._queue.remove(pending)
                    queued = False
        if not queued:
            return self.store.write_poll(node, record, ts_unix, rtt_ms, interval_s)
        if pending.error is not None:
            raise pending.error
        assert pending.delta is not None  # set with done when no error
        return pending.delta

    def stop(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then end the thread; later writes are written by their caller."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _next_group(self) -> list[_Pending] | None:
        """The next group (None: stopped and nothing queued), after waiting for polls in flight."""
        with self._cond:
            while not self._queue and not self._stopped:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = self._queue[0].queued + self.linger_s
            while not self._stopped and len(self._queue) < min(self.max_polls, self._polling):
                left = deadline - self.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            group, self._queue = self._queue[: self.max_polls], self._queue[self.max_polls :]
            return group

    def _loop(self) -> None:
        while (group := self._next_group()) is not None:
            try:
                self._write(group)
            finally:
                for pending in group:
                    if pending.delta is None and pending.error is None:
                        pending.error = RuntimeError("the poll's write was interrupted")
                    pending.done.set()

    def _write(self, group: list[_Pending]) -> None:
        """One transaction for the group; on a failure each poll again alone (its own error)."""
        store = self.store
        try:
            with store.transaction() as db:
                deltas = [store.write_poll_in(db, *p.args) for p in group]
        except Exception as exc:
            if len(group) == 1:
                group[0].error = exc
                return
            log.debug("a group of %d polls failed (%s): each written alone", len(group), exc)
            for p in group:
                try:
                    p.delta = store.write_poll(*p.args)
                except Exception as alone:
                    p.error = alone
            return
        for p, delta in zip(group, deltas, strict=True):
            store.write_failures.pop(p.args[0], None)  # written again: the store is healthy for this node
            p.delta = delta
        self.groups += 1
        self.polls += len(group)
