"""Transport base: keep one long-lived agent per node and send it framed requests.

`Transport` starts the agent lazily, restarts it after any failure, and backs off (1, 2, 4 ...
60 s) while a node stays unreachable; its subclasses say how the agent runs: `LocalTransport`
(remote/local.py) as a subprocess of the dashboard, `SSHTransport` (remote/ssh.py) over one
persistent paramiko connection per node. `fan_out` polls many nodes at once and returns each
node's reply or exception, so one host never fails the group; `fan_out_calls` is the same
thread pool for any per-node call (the collector's polls and samples). This module also holds
what both subclasses share: `Tail` (bounded stderr), `sanitize`, `POLL_SLICE_S`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from runhealth import textsafe
from runhealth.errors import RunhealthError
from runhealth.remote.protocol import AgentSession, program_frame

log = textsafe.get_logger(__name__)

BACKOFF_MAX_S = 60.0
STDERR_KEEP_BYTES = 64 * 1024
POLL_SLICE_S = 0.25  # how often a blocked read wakes to drain the agent's stderr
MAX_FAN_OUT_THREADS = 128
T = TypeVar("T")


def sanitize(text: bytes | str, limit: int = 600) -> str:
    """Untrusted remote text as one printable line, keeping the last `limit` characters."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else "..." + flat[-limit:]


class Tail:
    """The last few KiB of a stream (an agent's stderr); thread-safe."""

    def __init__(self, limit: int = STDERR_KEEP_BYTES):
        self._limit = limit
        self._data = bytearray()
        self._lock = threading.Lock()

    def add(self, chunk: bytes) -> None:
        with self._lock:
            self._data += chunk
            del self._data[: max(0, len(self._data) - self._limit)]

    def text(self) -> str:
        with self._lock:
            return sanitize(bytes(self._data)) or "(empty)"


class Transport:
    """One node's agent link: lazy start, framed requests, restart and backoff after failure.

    Attributes:
        name: the node's name, used in messages.
        rtt_ms: wall time of the last successful request, in milliseconds (None before one).
    """

    def __init__(
        self, name: str, command_timeout_s: float = 30.0, connect_timeout_s: float = 10.0, program: bytes | None = None
    ):
        self.name = name
        self.command_timeout_s = command_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.rtt_ms: float | None = None
        self._program = program
        self._session: AgentSession | None = None
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: RunhealthError | None = None

    @property
    def connected(self) -> bool:
        """True while an agent is running and in step with us."""
        session = self._session
        return session is not None and not session.broken

    def request(self, obj: dict, timeout_s: float | None = None) -> dict:
        """Send one request to the node's agent, starting it first if needed.

        Raises:
            TransportError: (or a subclass) the agent could not be reached, timed out or died;
                while backing off after a failed start, the last start error is raised at once.
            AgentError: the agent answered with an error or garbage.
        """
        timeout_s = self.command_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            session = self._ensure_session()
            started = time.perf_counter()
            try:
                reply = session.request(obj, timeout_s)
            finally:
                if session.broken:
                    self._drop_session()
            self.rtt_ms = (time.perf_counter() - started) * 1000.0
            return reply

    def retry_now(self) -> None:
        """Forget the backoff so the next request reconnects immediately."""
        self._retry_at = 0.0

    def close(self) -> None:
        """Stop the agent and close the connection; a later request starts them again."""
        with self._lock:
            self._drop_session()
            self._close_connection()

    def _ensure_session(self) -> AgentSession:
        if self._session is not None:
            return self._session
        wait_s = self._retry_at - time.monotonic()
        if self._last_error is not None and wait_s > 0:
            err = self._last_error
            raise type(err)(f"{err} (next reconnect attempt in {math.ceil(wait_s)} s)")
        try:
            session = self._start()
            self._session = session
            session.send_program(self._program or program_frame(), self.command_timeout_s)
        except BaseException as exc:
            self._drop_session()
            if not isinstance(exc, RunhealthError):
                raise
            self._failures += 1
            delay_s = min(BACKOFF_MAX_S, 2.0 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay_s
            self._last_error = exc
            log.warning("%s: %s (retrying in %.0f s)", self.name, exc, delay_s)
            raise
        self._failures, self._last_error = 0, None
        return session

    def _drop_session(self) -> None:
        self._session = None
        try:
            self._stop_agent()
        except Exception:  # noqa: BLE001 - best-effort cleanup must not hide the real error
            log.debug("%s: error while stopping the agent", self.name, exc_info=True)

    def _start(self) -> AgentSession:
        raise NotImplementedError

    def _stop_agent(self) -> None:
        raise NotImplementedError

    def _close_connection(self) -> None:
        """Close what outlives one agent (the SSH connection); nothing for subprocesses."""


def fan_out_calls(
    calls: Mapping[str, Callable[[], T]], max_workers: int = MAX_FAN_OUT_THREADS
) -> dict[str, T | Exception]:
    """Run one call per node at once on up to `max_workers` threads; map each name to the
    call's result or the exception it raised (one host never fails the group: Fabric's
    GroupResult habit). Results keep the order of `calls`."""
    if not calls:
        return {}
    results: dict[str, T | Exception] = {}
    with ThreadPoolExecutor(
        max_workers=max(1, min(len(calls), max_workers)), thread_name_prefix="runhealth-fanout"
    ) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - reported per node, never raised
                results[name] = exc
    return results


def fan_out(
    transports: Mapping[str, Transport], request_for_name: Callable[[str], dict], timeout_s: float | None = None
) -> dict[str, dict | Exception]:
    """Send one request to every node at once; map each name to its reply or its exception.

    Each request is bounded by its own transport's connect timeout plus `timeout_s` (or the
    node's command timeout).
    """

    def call(name: str) -> Callable[[], dict]:
        return lambda: transports[name].request(request_for_name(name), timeout_s)

    return fan_out_calls({name: call(name) for name in transports})
