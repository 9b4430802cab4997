"""LocalTransport: the node agent as a subprocess of the dashboard (host = "local", the demo).

The subprocess's stdin/stdout become a deadline-aware `ByteStream` (non-blocking writes,
selector-bounded reads); its stderr is drained by a thread into a bounded `Tail`, so a chatty
agent never blocks and a dead one's last words reach the error message.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import threading
import time

from runhealth.errors import TransportError
from runhealth.remote.base import Tail, Transport
from runhealth.remote.protocol import AgentSession, launch_argv


class _PipeStream:
    """A subprocess's stdin/stdout as a deadline-aware `ByteStream`; stderr kept bounded."""

    def __init__(self, proc: subprocess.Popen):
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # all PIPE
        self.proc = proc
        self._pipes = (proc.stdin, proc.stdout, proc.stderr)
        self.stderr = Tail()
        self._in, self._out, self._err = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
        os.set_blocking(self._in, False)
        self._rsel = selectors.DefaultSelector()
        self._rsel.register(self._out, selectors.EVENT_READ)
        self._wsel = selectors.DefaultSelector()
        self._wsel.register(self._in, selectors.EVENT_WRITE)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True, name="runhealth-agent-stderr")
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        fd = self._err
        try:
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                self.stderr.add(chunk)
        except OSError:  # closed under us by close()
            pass

    def write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._in, view) :]
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
        for pipe in self._pipes:
            pipe.close()
        self._rsel.close()
        self._wsel.close()


class LocalTransport(Transport):
    """The agent as a subprocess of the dashboard (host = "local", and the demo)."""

    def __init__(
        self,
        python: str = sys.executable,
        name: str = "local",
        command_timeout_s: float = 30.0,
        program: bytes | None = None,
    ):
        super().__init__(name, command_timeout_s, command_timeout_s, program)
        self.argv = launch_argv(python)
        self._stream: _PipeStream | None = None

    @property
    def pid(self) -> int | None:
        """The agent process id while one runs."""
        return self._stream.proc.pid if self._stream else None

    def _start(self) -> AgentSession:
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(f"cannot start {self.argv[0]}: {exc.strerror}") from None
        self._stream = _PipeStream(proc)
        return AgentSession(self._stream, self.name)

    def _stop_agent(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
