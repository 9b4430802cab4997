"""runhealth wire contract: the shapes of every request and reply between dashboard and agent.

The one place the agent protocol is declared (docs/design.md section 1 explains it and points
here). Shipped to the node as one more part of the agent, so it is standard library only, keeps
Python 3.8 syntax and holds no behaviour beyond framing: the agent (node/agent.py), the
dashboard side of the pipe (remote/protocol.py), the collector and the reply reader
(runhealth/ingest.py) import the same names, so a renamed field is a type error, not a grep.

Why no ``from __future__ import annotations`` and only ``typing.List``/``Dict``/``Optional``:
a TypedDict evaluates its field annotations when the class is made, and Python 3.8 has neither
``list[int]`` nor ``X | None`` at run time.

Frames: ASCII decimal byte length, ``\\n``, then that many bytes of UTF-8 JSON. Every frame the
agent writes (a reply) starts with the SYNC marker, and a reader drops whatever comes before it:
the agent's stdout is the SSH channel, and a login shell may print there before the agent starts
(an echo in ~/.bashrc or /etc/profile, common on HPC login nodes). At most MAX_NOISE_BYTES of
such text are skipped before one reply; more is an error that quotes it (NoiseError). Frames the
dashboard writes (the program, requests) go to the agent's stdin, which no shell writes to, and
carry no marker.

Both directions encode with ``ensure_ascii=True`` (json's default): every Python str encodes,
including the lone surrogates that undecodable file names (os.fsdecode's surrogateescape) and
``\\udcxx`` escapes in shard text become; with ``ensure_ascii=False`` those fail UTF-8 encoding
and the reply is lost. The price is size: a non-ASCII character travels as a 6-byte escape (2x
for CJK text, which only sample text carries; counts and paths are almost always ASCII).
"""

import json
from typing import Any, Dict, List, NamedTuple, Optional, TypedDict, Union

SCHEMA_VERSION = 1  # the wire's version; every reply carries it (the store has its own)
MAX_HEADER_BYTES = 20  # "268435456\n" is 10; anything longer is not a frame header
SYNC = b"\x1eRUNHEALTH1\n"  # starts every frame the agent writes (see the module docstring)
MAX_NOISE_BYTES = 64 << 10  # text before one reply's SYNC that a reader skips, at most
MAX_REPLY_BYTES = 256 << 20  # the dashboard refuses a larger reply frame
METRICS_MAX_BYTES = 8 << 20  # one /metrics body, as fetched by the agent and parsed by analysis/servermetrics.py
FULL_TEXT_MAX_CHARS = 1 << 20  # one sampled prompt or completion with full_text
DEFAULT_BUDGET_BYTES = 256 << 20  # a poll's scan budget when the request sets none
MAX_SAMPLE_N = 10000  # samples one request may ask for
MAX_FAILED_REASONS = 32  # distinct failed-request reasons one shard scan reports (the rest: "other")


# ---------------------------------------------------------------------------- framing
def encode_frame(obj, sync=False):
    # type: (Any, bool) -> bytes
    """One frame: decimal byte length, newline, compact ASCII JSON (see the module docstring);
    with `sync` (the agent's replies) SYNC comes first."""
    body = json.dumps(obj, separators=(",", ":")).encode("ascii")
    return b"%s%d\n%s" % (SYNC if sync else b"", len(body), body)


class NoiseError(ValueError):
    """More than MAX_NOISE_BYTES came before a reply's SYNC; `noise` holds the first of them."""

    def __init__(self, noise):
        # type: (bytes) -> None
        super().__init__("no reply marker within %d bytes of output: %r" % (MAX_NOISE_BYTES, noise[:80]))
        self.noise = noise


def frame_size(header):
    # type: (bytes) -> int
    """The body size a header line announces (without its newline); ValueError when it is not
    a plain decimal number of at most MAX_HEADER_BYTES digits."""
    if not header.isdigit() or len(header) > MAX_HEADER_BYTES:
        raise ValueError("not a frame header: %r" % (header[:MAX_HEADER_BYTES],))
    return int(header)


def decode_body(body):
    # type: (bytes) -> Any
    """The JSON value of a frame body (ValueError / UnicodeDecodeError when it is not one)."""
    return json.loads(body.decode("utf-8"))


def skip_to_sync(inp):
    # type: (Any) -> bool
    """Read a blocking binary stream up to and including the next SYNC; False at EOF first.

    Raises NoiseError when more than MAX_NOISE_BYTES come before it. SYNC ends with the only
    newline it holds, so it always ends a line: noise without a newline of its own and SYNC
    arrive as one line.
    """
    noise = bytearray()  # appended to in place: many short lines cost linear time
    while True:
        line = inp.readline(MAX_NOISE_BYTES - len(noise) + len(SYNC))
        if line.endswith(SYNC):
            return True
        if not line:
            return False
        noise += line
        if len(noise) > MAX_NOISE_BYTES:
            raise NoiseError(bytes(noise))


def read_frame(inp, sync=False):
    # type: (Any, bool) -> Any
    """The next frame's value from a blocking binary stream; None at EOF or a pipe closed
    mid-frame; ValueError for a bad header or body. With `sync` (reading the agent's replies)
    whatever precedes the frame's SYNC is skipped (NoiseError past MAX_NOISE_BYTES)."""
    if sync and not skip_to_sync(inp):
        return None
    header = inp.readline()
    if not header:
        return None
    n = frame_size(header.strip())
    body = inp.read(n)
    if len(body) != n:
        return None  # the pipe closed mid-frame: treat as EOF
    return decode_body(body)


# ---------------------------------------------------------------------------- shared rows
class CountRow(NamedTuple):
    """One counted (tokens, finish_reason, estimated) bucket; JSON is the positional list
    ``[tokens, finish_reason, estimated, count]``. ``estimated`` 1: tokens = ceil(chars / 4)."""

    tokens: int
    finish_reason: Optional[str]
    estimated: int
    count: int  # type: ignore[assignment]  # shadows tuple.count, as the field is named on the wire


def count_rows(rows):
    # type: (Any) -> List[CountRow]
    """Wire rows (lists) as CountRows; raises ValueError/TypeError for a row of another shape."""
    return [CountRow(*row) for row in rows]


# ---------------------------------------------------------------------------- requests
# Shard paths, as keys of ShardRequest.state, ShardsReply.files and the disk reply, and as
# SampleRow.path, are the agent's wire names (agent.wire_name): the path itself, or for a file
# name that is not UTF-8 its bytes with each undecodable one written as \xNN.
class _ShardCursorBase(TypedDict):
    inode: Optional[int]
    offset: int


class ShardCursor(_ShardCursorBase, total=False):
    # ShardEntry.mark as the last poll returned it; absent or None: trust inode and size
    # (a store from before marks), as agents before marks did.
    mark: Optional[str]


class ShardRequest(TypedDict, total=False):
    globs: List[str]
    state: Dict[str, ShardCursor]  # path -> where the last poll stopped
    budget_bytes: Optional[int]  # per worker when the poll is a parallel backfill
    budget_s: Optional[float]
    scan_workers: Optional[int]  # None: a quarter of the node's cores, 1..8
    finish_reason_path: Optional[str]
    completion_tokens_path: Optional[str]
    prompt_id_path: Optional[str]  # None: detected (node/formats.py ID_FIELDS)
    prompt_tokens_path: Optional[str]
    group_path: Optional[str]  # None: prompt-token bins
    # Finish reasons read as "length" (cut at the token limit) besides each format's own
    # (node/formats.py): for a configured finish_reason_path whose labels are not known.
    cut_labels: List[str]


class PollRequest(TypedDict, total=False):
    op: str  # "poll"
    shards: ShardRequest
    gpu: str  # "auto", "off", "demo"
    demo_gpus: int  # how many simulated GPUs gpu = "demo" reports
    demo_time_unix: float  # gpu = "demo": the collector's clock, which the simulated readings follow
    demo_seed: int  # gpu = "demo": which simulated node (each node's GPUs and host their own readings)
    demo_host: bool  # the built-in demo: a simulated host (CPU load, RAM), not the machine's own
    metrics_urls: List[str]
    metrics_timeout_s: float


class SampleRequest(TypedDict, total=False):
    op: str  # "sample"
    globs: List[str]
    n: int  # at most MAX_SAMPLE_N
    seed: Optional[int]
    finish_reason: Optional[str]  # draw only among lines with this finish reason
    full_text: bool  # also return prompt/text whole (FULL_TEXT_MAX_CHARS each)
    head_chars: int
    tail_chars: int
    prompt_path: Optional[str]
    finish_reason_path: Optional[str]
    completion_tokens_path: Optional[str]
    cut_labels: List[str]  # as ShardRequest.cut_labels


class HelloRequest(TypedDict):
    op: str  # "hello"


Request = Union[HelloRequest, PollRequest, SampleRequest]


# ---------------------------------------------------------------------------- replies
class ReplyBase(TypedDict, total=False):
    schema_version: int  # SCHEMA_VERSION
    ok: bool
    error: str  # only when ok is false
    time_unix: float  # the node's clock when the reply was made
    agent_ms: float


class HelloReply(ReplyBase, total=False):
    agent_version: str
    python: str
    hostname: str
    pid: int


class ShardEntry(TypedDict, total=False):
    inode: Optional[int]
    size: Optional[int]
    offset_from: int  # the offset this scan continued from (0 after a reset)
    offset: int  # just after the last complete line counted
    reset: bool  # inode changed, file shrank or replaced: drop the shard's old counts first
    # The reset is a replacement: the bytes before the stored offset no longer match its mark
    # (the file was rewritten under the same inode). Absent from older agents.
    replaced: bool
    # A hash of the file's first and last 256 bytes before `offset` (node/scan.content_mark),
    # None at offset 0 or when it could not be read: the caller sends it back in
    # ShardCursor.mark so the next poll can tell the same file grown from a file rewritten
    # under the same inode. Absent when the offset did not move (the cursor's mark stands).
    mark: Optional[str]
    lines: int
    malformed: int
    blank_lines: int
    tokens: int
    counts: List[CountRow]
    error: Optional[str]  # the shard could not be read (permission, vanished): nothing counted
    # A problem while the shard still counts: lines skipped as longer than the agent's line
    # bound (64 MiB), or an unterminated last line over that bound. Absent from older agents.
    problem: Optional[str]
    # Per-line fields (node/fields.py), only from a shard whose lines have them (#33).
    fields: "FieldCounts"
    # Failed requests (#39): lines that are a request that failed, not a completion (an HTTP
    # status other than 200, an `error` object with no response, an Anthropic result of type
    # errored / expired / canceled, a Responses `status: failed`, a Gemini `error`; the rules
    # are node/formats.py's). They are in none of lines, counts, tokens or fields. Each row is
    # [reason, count]: the error's type or code ("server_error", "http_500", "expired",
    # "overloaded_error"), printable ASCII, at most 40 characters, at most 32 distinct reasons a
    # scan (the rest summed under "other"). Absent when there were none; absent from older agents.
    failed: List[List[Any]]
    # base64 of the 64-bit prompt-ID hashes of the failed lines that have an ID (as
    # FieldCounts.ids: fields.id_hash, little-endian), one per such line; only when the shard's
    # per-line fields are on (a failed line's ID turns them on). Absent when there are none.
    failed_ids: str


class FieldCounts(TypedDict, total=False):
    """What a scan's lines said beyond (tokens, finish_reason); node/fields.py documents each."""

    ids: str  # base64 of 64-bit prompt-ID hashes (fields.id_hash, little-endian), one per line with an ID
    id_lines: int
    id_fields: List[str]  # dotted paths the IDs were found at
    prompt_token_lines: int
    group_field: Optional[str]  # the configured group path, "prompt_tokens" (bins), or None
    # [label, completions, length stops, [[tokens, length stops], ...]]: the 4th (#41) splits the
    # stops at the ceiling from context-window ones; an older agent sends 3 (the split unknown)
    groups: List[List[Any]]
    length_prompt_tokens: List[List[int]]  # [tokens, prompt tokens, length stops]
    no_answer: List[List[int]]  # [tokens, length stops that never answered]
    reasoned: List[List[int]]  # [tokens, length stops with reasoning text or a <think>]


class ShardsReply(TypedDict):
    matched: int
    unmatched_globs: List[str]
    pending_bytes: int  # left to scan because of budget_bytes / budget_s
    scan_s: float
    walk_s: float  # of scan_s, globbing and stat-ing (not scan speed); absent from older agents
    slow_globs: Dict[str, str]  # `**` glob -> its walk was cut short by budget_s (what is left)
    scan_workers: int  # worker processes this poll used (0: in the agent's process)
    files: Dict[str, ShardEntry]


class GpuProcess(TypedDict):
    pid: int
    name: Optional[str]
    mem_used_mib: Optional[int]


class GpuHealth(TypedDict, total=False):  # NVML only; keys the GPU does not support are absent
    ecc_uncorrected_volatile: int
    ecc_uncorrected_aggregate: int
    retired_pages_pending: bool
    remapped_rows_pending: bool
    row_remap_failure: bool
    pcie_replay: int
    xid: List[int]  # critical XIDs since the last poll; absent without driver events


class GpuDevice(TypedDict, total=False):  # a GPU that errors has only index and error
    index: int
    name: Optional[str]
    uuid: Optional[str]
    util_pct: Optional[float]
    mem_used_mib: Optional[int]
    mem_total_mib: Optional[int]
    power_w: Optional[float]
    power_limit_w: Optional[float]
    energy_mj: Optional[int]  # NVML's total energy since the driver loaded; None: not supported
    temp_c: Optional[float]
    sm_clock_mhz: Optional[float]
    throttle_reasons: Optional[List[str]]
    processes: Optional[List[GpuProcess]]
    health: GpuHealth
    error: Optional[str]


class GpusReply(TypedDict):
    source: Optional[str]  # "nvml", "nvidia-smi", "demo", or None: no telemetry
    error: Optional[str]
    simulated: bool
    reason: Optional[str]  # why there is no telemetry when it is switched off
    devices: List[GpuDevice]


class DiskEntry(TypedDict):
    free_bytes: Optional[int]
    total_bytes: Optional[int]
    error: Optional[str]


class HostInfo(TypedDict, total=False):  # fields the kernel does not report are absent
    cpus: Optional[int]
    mem_total_bytes: int
    mem_available_bytes: int
    swap_total_bytes: int
    swap_free_bytes: int
    simulated: bool  # the built-in demo's host (agent.demo_host), not a real machine's


class MetricsEntry(TypedDict):
    text: Optional[str]  # at most METRICS_MAX_BYTES
    error: Optional[str]


class PollReply(ReplyBase, total=False):
    """A poll's answer. Per shard (ShardsReply.files) the counts of complete lines, and apart
    from them the failed requests (ShardEntry.failed, failed_ids)."""

    hostname: str
    loadavg: Optional[List[float]]
    host: HostInfo
    gpus: GpusReply
    shards: ShardsReply
    disk: Dict[str, DiskEntry]  # one shard folder per filesystem
    metrics: Dict[str, MetricsEntry]  # by URL


class SampleRow(TypedDict, total=False):
    path: str
    line_no: int  # from 1
    offset: int
    tokens: Optional[int]
    estimated: Optional[int]
    finish_reason: Optional[str]
    prompt_head: Optional[str]
    text_head: str
    text_tail: str
    text_chars: int
    prompt: Union[None, str, List[Dict[str, Any]]]  # full_text only; a message list kept whole
    text: Optional[str]  # full_text only
    error: Optional[str]  # a malformed line drawn
    node: str  # added by the collector, not the agent


class SampleReply(ReplyBase, total=False):
    population: int  # complete lines the draw was among
    attempts: int  # draws made (rejection sampling for finish_reason)
    unmatched_globs: List[str]
    samples: List[SampleRow]
