"""Transports: keep one long-lived agent per node and send it framed requests.

`LocalTransport` runs the agent as a subprocess of the dashboard; `SSHTransport` runs it over
one persistent paramiko connection per node (one ``exec`` channel, kept open across polls, so a
poll costs a round trip instead of a login, a channel and a Python start-up). Both start the
agent lazily, restart it after any failure, and back off (1, 2, 4 ... 60 s) while a node stays
unreachable. `fan_out` polls many nodes at once and returns each node's reply or exception, so
one host never fails the group.
"""

from __future__ import annotations

import math
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runhealth import textsafe
from runhealth.errors import (
    RunhealthError,
    TransportError,
)
from runhealth.protocol import AgentSession, launch_argv, program_frame

log = textsafe.get_logger(__name__)

BACKOFF_MAX_S = 60.0
_STDERR_KEEP_BYTES = 64 * 1024
_POLL_SLICE_S = 0.25  # how often a blocked read wakes to drain the agent's stderr


def sanitize(text: bytes | str, limit: int = 600) -> str:
    """Untrusted remote text as one printable line, keeping the last `limit` characters."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else "..." + flat[-limit:]


class _Tail:
    """The last few KiB of a stream (an agent's stderr); thread-safe."""

    def __init__(self, limit: int = _STDERR_KEEP_BYTES):
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

    def __init__(self, name: str, command_timeout_s: float = 30.0,
                 connect_timeout_s: float = 10.0, program: bytes | None = None):
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


# ----------------------------------------------------------------------------- local


class _PipeStream:
    """A subprocess's stdin/stdout as a deadline-aware `ByteStream`; stderr kept bounded."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.stderr = _Tail()
        self._in, self._out = proc.stdin.fileno(), proc.stdout.fileno()
        os.set_blocking(self._in, False)
        self._rsel = selectors.DefaultSelector()
        self._rsel.register(self._out, selectors.EVENT_READ)
        self._wsel = selectors.DefaultSelector()
        self._wsel.register(self._in, selectors.EVENT_WRITE)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True,
                                               name="runhealth-agent-stderr")
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        fd = self.proc.stderr.fileno()
        try:
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                self.stderr.add(chunk)
        except OSError:  # closed under us by close()
            pass

    def write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._in, view):]
                continue
            except BlockingIOError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._wsel.select(remaining)

    def read(self, max_bytes: int, deadline: float) -> bytes:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if self._rsel.select(remaining):
                return os.read(self._out, max_bytes)

    def eof_detail(self) -> str:
        try:
            status = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            status = None
        return f"exit status {status}; stderr: {self.stderr.text()}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5.0)
        self._stderr_thread.join(timeout=1.0)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            pipe.close()
        self._rsel.close()
        self._wsel.close()


class LocalTransport(Transport):
    """The agent as a subprocess of the dashboard (host = "local", and the demo)."""

    def __init__(self, python: str = sys.executable, name: str = "local",
                 command_timeout_s: float = 30.0, program: bytes | None = None):
        super().__init__(name, command_timeout_s, command_timeout_s, program)
        self.argv = launch_argv(python)
        self._stream: _PipeStream | None = None

    @property
    def pid(self) -> int | None:
        """The agent process id while one runs."""
        return self._stream.proc.pid if self._stream else None

    def _start(self) -> AgentSession:
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, bufsize=0, start_new_session=True)
        except OSError as exc:
            raise TransportError(f"cannot start {self.argv[0]}: {exc.strerror}") from None
        self._stream = _PipeStream(proc)
        return AgentSession(self._stream, self.name)

    def _stop_agent(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


def fan_out(transports: Mapping[str, Transport], request_for_name: Callable[[str], dict],
            timeout_s: float | None = None) -> dict[str, dict | Exception]:
    """Send one request to every node at once; map each name to its reply or its exception.

    One host never fails the group (Fabric's GroupResult habit), and each request is bounded
    by its own transport's connect timeout plus `timeout_s` (or the node's command timeout).
    """
    if not transports:
        return {}

    def one(name: str) -> dict:
        return transports[name].request(request_for_name(name), timeout_s)

    results: dict[str, dict | Exception] = {}
    with ThreadPoolExecutor(max_workers=min(len(transports), 128),
                            thread_name_prefix="runhealth-fanout") as pool:
        futures = {name: pool.submit(one, name) for name in transports}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - reported per node, never raised
                results[name] = exc
    return results


def make_transport(node: Any, **kwargs: Any) -> Transport:
    """LocalTransport for ``host = "local"``, SSHTransport otherwise.

    A local node runs the dashboard's own interpreter unless its python is set to something
    other than the default "python3".
    """
    if node.host == "local":
        python = node.python if node.python not in (None, "python3") else sys.executable
        return LocalTransport(python, name=node.name, command_timeout_s=node.command_timeout_s,
                              program=kwargs.get("program"))
    from runhealth.ssh import SSHTransport  # here: ssh.py builds on this module

    return SSHTransport(node, **kwargs)
