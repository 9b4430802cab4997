"""Dashboard side of the agent pipe: bootstrap, framing and request/response sessions.

The node runs ``python -u -c BOOTSTRAP``; the bootstrap reads one frame holding the agent's
sources (runhealth/node/: agent.py plus scan.py, backfill.py, gpu.py, wire.py, and pynvml's, so
a node needs only python3 and the driver) and executes it. After that every request and reply
is a frame as runhealth/node/wire.py encodes and decodes it (docs/design.md section 1); what a
login shell prints before a reply's SYNC marker is skipped. `AgentSession` speaks that over any
byte stream with
deadline-aware reads, so the same code serves a local subprocess and an SSH channel.
"""

from __future__ import annotations

import functools
import importlib.util
import time
from pathlib import Path
from typing import Protocol

from runhealth import textsafe
from runhealth.errors import AgentError, CommandTimeout, ConfigError, TransportError
from runhealth.node import wire
from runhealth.node.wire import (
    MAX_HEADER_BYTES,
    MAX_NOISE_BYTES,
    MAX_REPLY_BYTES,
    SCHEMA_VERSION,
    SYNC,
    encode_frame,
)
from runhealth.settings.config import PYTHON_RE

BOOTSTRAP = (
    "import sys,json;i=sys.stdin.buffer;n=int(i.readline());p=json.loads(i.read(n));"
    "g={'__name__':'runhealth_agent','__modules__':p.get('modules',{})};"
    "exec(compile(p['main'],'runhealth_agent','exec'),g)"
)
__all__ = [
    "BOOTSTRAP",
    "MAX_REPLY_BYTES",
    "SCHEMA_VERSION",
    "AgentSession",
    "ByteStream",
    "encode_frame",
    "launch_argv",
    "program_frame",
    "safe_preview",
]
_NODE_DIR = Path(wire.__file__).parent
_AGENT_PATH = _NODE_DIR / "agent.py"
# The agent's other modules, shipped under these names (node/agent.py SHIPPED_PREFIX + part);
# agent.py registers them in sys.modules.
AGENT_PARTS = {
    "runhealth_node_" + part: part + ".py" for part in ("wire", "formats", "fields", "scan", "gpu", "backfill")
}
NOISE_PREVIEW_CHARS = 80  # of a login shell's output, quoted in the error and the log
log = textsafe.get_logger(__name__)


def _agent_source(filename: str) -> str:
    path = _AGENT_PATH.with_name(filename)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TransportError(f"cannot read the agent source {path}: {exc.strerror}") from None


@functools.lru_cache(maxsize=4)
def _program_frame(main_source: str | None, include_pynvml: bool) -> bytes:
    if main_source is None:
        main_source = _agent_source(_AGENT_PATH.name)
    modules = {name: _agent_source(filename) for name, filename in AGENT_PARTS.items()}
    if include_pynvml:
        spec = importlib.util.find_spec("pynvml")
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            modules["pynvml"] = Path(spec.origin).read_text(encoding="utf-8")
    return encode_frame({"main": main_source, "modules": modules})


def program_frame(include_pynvml: bool = True, main_source: str | None = None) -> bytes:
    """The first frame sent to BOOTSTRAP: the agent's sources and, if installed, pynvml's.

    ``main`` is node/agent.py; ``modules`` holds node/wire.py, fields.py, scan.py, gpu.py and backfill.py
    (as AGENT_PARTS names them, "runhealth_node_wire" etc., always: agent.py needs them) and
    pynvml.

    Args:
        include_pynvml: ship the dashboard's nvidia-ml-py ``pynvml.py`` along, so a node without
            it can still read NVML (the agent imports it only if the node has none).
        main_source: run this source instead of runhealth/node/agent.py (tests use stand-in agents).
    """
    return _program_frame(main_source, include_pynvml)


def launch_argv(python: str) -> list[str]:
    """The agent's argv; `python` is the only config value that ever reaches a command line."""
    if not isinstance(python, str) or not PYTHON_RE.fullmatch(python):
        raise ConfigError(
            f"python = {python!r} is not a plain interpreter name or path "
            "(allowed characters: letters, digits, _ . / + -)"
        )
    return [python, "-u", "-c", BOOTSTRAP]


def safe_preview(data: bytes | bytearray, limit: int = 200) -> str:
    """Show untrusted bytes as a printable, bounded Python literal."""
    text = repr(bytes(data[:limit]))
    return text + (" ..." if len(data) > limit else "")


class ByteStream(Protocol):
    """What `AgentSession` needs from a pipe: deadline-aware I/O (deadlines are monotonic)."""

    def write(self, data: bytes, deadline: float) -> None:
        """Write all of `data`; raise builtin TimeoutError at the deadline."""

    def read(self, max_bytes: int, deadline: float) -> bytes:
        """Return 1..max_bytes bytes, b"" at EOF; raise builtin TimeoutError at the deadline."""

    def eof_detail(self) -> str:
        """Why the stream ended (exit status, stderr tail), for the error message."""


class AgentSession:
    """Framed request/response over one agent's byte stream.

    Output before a reply's SYNC marker (a login shell's banner) is skipped, up to
    MAX_NOISE_BYTES. After a timeout, EOF, more output than that or a malformed frame the stream
    is out of step: `broken` turns true and the owner must restart the agent. An ``ok: false``
    reply raises `AgentError` but keeps the session usable.
    """

    def __init__(self, stream: ByteStream, name: str, max_reply_bytes: int = MAX_REPLY_BYTES):
        self.stream = stream
        self.name = name
        self.max_reply_bytes = max_reply_bytes
        self.broken = False
        self._buf = bytearray()
        self._noise_logged = False

    def send_program(self, frame: bytes, timeout_s: float) -> None:
        """Send the program frame that BOOTSTRAP is waiting for."""
        self._write(frame, time.monotonic() + timeout_s, "the agent program")

    def request(self, obj: dict, timeout_s: float) -> dict:
        """Send one request and return the agent's reply dict.

        Raises:
            CommandTimeout: no complete reply before `timeout_s` seconds.
            TransportError: the agent's stream ended (message carries its stderr tail).
            AgentError: garbage, oversized or wrong-schema reply, or ``ok: false``.
        """
        if self.broken:
            raise TransportError(f"agent session for {self.name} is closed")
        op = obj.get("op", "?")
        deadline = time.monotonic() + timeout_s
        self._write(encode_frame(obj), deadline, f"request {op!r}")
        try:
            self._skip_noise(deadline)
            size = self._read_header(deadline)
            body = self._read_exact(size, deadline)
        except TimeoutError:
            self.broken = True
            raise CommandTimeout(f"agent on {self.name} did not answer {op!r} within {timeout_s:g} s") from None
        return self._check_reply(body)

    def _write(self, data: bytes, deadline: float, what: str) -> None:
        try:
            self.stream.write(data, deadline)
        except TimeoutError:
            self.broken = True
            raise CommandTimeout(f"agent on {self.name} did not accept {what} in time") from None
        except OSError:
            self.broken = True
            raise TransportError(f"agent on {self.name} ended: {self.stream.eof_detail()}") from None

    def _fill(self, deadline: float) -> None:
        chunk = self.stream.read(1 << 20, deadline)
        if not chunk:
            self.broken = True
            raise TransportError(f"agent on {self.name} ended: {self.stream.eof_detail()}")
        self._buf += chunk

    def _skip_noise(self, deadline: float) -> None:
        """Drop what precedes the next SYNC: text a login shell printed (docs/design.md section 1)."""
        while (at := self._buf.find(SYNC, 0, MAX_NOISE_BYTES + len(SYNC))) < 0:
            if len(self._buf) >= MAX_NOISE_BYTES + len(SYNC):
                self.broken = True
                raise AgentError(
                    f"agent on {self.name} sent no reply within {MAX_NOISE_BYTES} bytes of other output: "
                    f"{_noise_preview(self._buf)}; likely cause: the login shell printed text before the "
                    "agent started (e.g. an echo in ~/.bashrc or /etc/profile); print only in interactive "
                    "shells, e.g. behind [[ $- == *i* ]]"
                )
            self._fill(deadline)
        if at and not self._noise_logged:  # once per agent: a banner comes with every login
            self._noise_logged = True
            preview = _noise_preview(self._buf[:at])
            log.info(
                "%s: skipped %d bytes of output before the agent's reply (a login shell's?): %s", self.name, at, preview
            )
        del self._buf[: at + len(SYNC)]

    def _read_header(self, deadline: float) -> int:
        while (newline := self._buf.find(b"\n")) < 0:
            if len(self._buf) > MAX_HEADER_BYTES:
                break
            self._fill(deadline)
        try:
            size = wire.frame_size(bytes(self._buf[:newline])) if newline >= 0 else -1
        except ValueError:
            size = -1
        if size < 0:
            self.broken = True
            raise AgentError(f"agent on {self.name} sent garbage instead of a reply: {safe_preview(self._buf)}")
        del self._buf[: newline + 1]
        if size > self.max_reply_bytes:
            self.broken = True
            raise AgentError(f"agent on {self.name}: reply too large ({size} bytes, limit {self.max_reply_bytes})")
        return size

    def _read_exact(self, size: int, deadline: float) -> bytes:
        while len(self._buf) < size:
            self._fill(deadline)
        body = bytes(self._buf[:size])
        del self._buf[:size]
        return body

    def _check_reply(self, body: bytes) -> dict:
        try:
            reply = wire.decode_body(body)
        except ValueError:  # UnicodeDecodeError included
            reply = None
        if not isinstance(reply, dict):
            raise AgentError(f"agent on {self.name} sent a reply that is not a JSON object: {safe_preview(body)}")
        version = reply.get("schema_version")
        if version != SCHEMA_VERSION:
            raise AgentError(f"agent on {self.name}: agent schema version {version!r}, expected {SCHEMA_VERSION}")
        if reply.get("ok") is not True:
            raise AgentError(f"agent on {self.name}: {reply.get('error') or 'request failed'}")
        return reply


def _noise_preview(data: bytes | bytearray) -> str:
    """The start of untrusted output as quoted, escaped text (control characters made visible)."""
    text = bytes(data[: 4 * NOISE_PREVIEW_CHARS]).decode("utf-8", "replace")
    more = " ..." if len(text) > NOISE_PREVIEW_CHARS or len(data) > 4 * NOISE_PREVIEW_CHARS else ""
    return f"'{textsafe.escape(text[:NOISE_PREVIEW_CHARS])}'{more}"
