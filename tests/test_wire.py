"""The wire contract (runhealth/node/wire.py) against the real agent, and the reply reader
(runhealth/ingest.py) on replies the real agent made.

The contract test walks every reply the agent gives for hello, poll (with demo GPUs, a dead
metrics URL, a missing glob and a shard) and sample, and fails on a key the TypedDicts do not
declare or a declared-required key the agent left out: a field added to the agent without
adding it to wire.py (how `gpus.reason` and `attempts` went undocumented) fails here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import threading
import time
import typing

import pytest

from runhealth import ingest
from runhealth.errors import AgentError
from runhealth.node import agent, wire
from runhealth.remote.protocol import AgentSession

LINES = [
    {"text": "a", "finish_reason": "stop", "completion_tokens": 5},
    {"text": "b", "finish_reason": "length", "completion_tokens": 9},
    {"text": "b", "finish_reason": "length", "completion_tokens": 9},
    {"text": "x" * 40, "finish_reason": "length"},  # no count: estimated 10 tokens
    {"text": "c", "completion_tokens": 2},
]  # no finish_reason


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in LINES))
    return str(path)


def poll(shard, **extra):
    req = {
        "op": "poll",
        "shards": {"globs": [shard, shard + ".missing*"]},
        "gpu": "demo",
        "demo_gpus": 2,
        "metrics_urls": ["http://127.0.0.1:9/metrics"],
        "metrics_timeout_s": 0.2,
    }
    req.update(extra)
    return agent.handle(req)


def keys(td) -> tuple[frozenset, frozenset]:
    return td.__required_keys__, td.__required_keys__ | td.__optional_keys__


def check(value, tp, where="reply"):
    """Fail on an undeclared or missing key anywhere in `value`, following the annotations."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if typing.is_typeddict(tp):
        required, allowed = keys(tp)
        assert isinstance(value, dict), where
        assert not set(value) - allowed, f"{where}: undeclared {sorted(set(value) - allowed)}"
        assert not required - set(value), f"{where}: missing {sorted(required - set(value))}"
        hints = typing.get_type_hints(tp)
        for k, v in value.items():
            check(v, hints[k], f"{where}.{k}")
    elif origin is typing.Union:
        if value is not None:
            check(
                value, next(a for a in args if a is not type(None) and (a is not str or isinstance(value, str))), where
            )
    elif origin is list and value is not None:
        for i, v in enumerate(value):
            check(v, args[0], f"{where}[{i}]")
    elif origin is dict and value is not None:
        for k, v in value.items():
            check(v, args[1], f"{where}[{k!r}]")


def test_every_reply_field_the_agent_sends_is_declared_in_wire(shard):
    check(agent.handle({"op": "hello"}), wire.HelloReply, "hello")
    reply = poll(shard)
    assert reply["ok"] and reply["gpus"]["devices"] and reply["metrics"] and reply["shards"]["unmatched_globs"]
    check(reply, wire.PollReply, "poll")
    check(poll(shard, gpu="off"), wire.PollReply, "poll(gpu off)")  # gpus.reason set
    sample = agent.handle({"op": "sample", "globs": [shard], "n": 3, "seed": 1, "full_text": True})
    assert sample["ok"] and len(sample["samples"]) == 3
    check(sample, wire.SampleReply, "sample")
    check(agent.handle({"op": "nope"}), wire.ReplyBase, "error reply")


def test_the_request_the_collector_sends_is_declared_in_wire():
    from runhealth.collect.collector import poll_request
    from runhealth.settings.config import NodeConfig

    req = poll_request(
        NodeConfig(name="n", host="local", shards=["/x/*.jsonl"]),
        {"/x/a.jsonl": {"inode": 1, "offset": 2}, "/x/b.jsonl": {"inode": 3, "offset": 4, "mark": "0f1e2d3c4b5a6978"}},
    )
    check(req, wire.PollRequest, "poll request")


def test_count_rows_keep_the_positional_json_and_read_by_name(shard):
    entry = poll(shard)["shards"]["files"][shard]
    rows = wire.count_rows(entry["counts"])
    assert json.loads(json.dumps(rows)) == entry["counts"]  # a CountRow travels as the same list
    assert rows[0] == wire.CountRow(tokens=2, finish_reason=None, estimated=0, count=1)
    assert {(r.tokens, r.finish_reason, r.estimated): r.count for r in rows} == {
        (2, None, 0): 1,
        (5, "stop", 0): 1,
        (9, "length", 0): 2,
        (10, "length", 1): 1,
    }
    with pytest.raises(TypeError):
        wire.count_rows([[1, "stop", 0]])  # a row of another shape is refused, not misread


def test_read_poll_totals_and_exact_length_stops(shard):
    record = ingest.read_poll(poll(shard))
    (update,) = record.shards
    assert (update.path, update.offset_from, update.offset, update.reset) == (shard, 0, update.size, False)
    assert update.completions == 5 and update.tokens == 2 + 5 + 18 + 10
    assert update.length_stops == 3  # the estimated one counts as a stop
    assert update.exact_length_stops() == {9: 2}  # but not as an exact length
    assert record.scanned_bytes == update.size and record.pending_bytes == 0
    assert record.status.gpus_found == 2 and record.status.gpu_simulated and record.status.gpu_source == "demo"
    assert record.status.unmatched_globs == [shard + ".missing*"]
    assert list(record.status.metrics_errors) == ["http://127.0.0.1:9/metrics"]
    assert record.host and record.host["cpus"]


def test_read_poll_of_a_reply_with_parts_missing():
    record = ingest.read_poll({"schema_version": 1, "ok": True})
    assert record.shards == () and record.gpus == () and record.host is None
    assert record.status.pending_bytes == 0 and record.status.metrics_errors == {}


def test_health_rows_split_xids_from_readings():
    reply = {
        "gpus": {
            "devices": [
                {"index": 0, "health": {"pcie_replay": 3, "xid": [79, 48]}},
                {"index": 1, "health": {"xid": []}},
                {"index": 2, "error": "fell off the bus"},
            ]
        }
    }
    rows = ingest.read_poll(reply).health
    assert [(h.index, h.health, h.xids) for h in rows] == [(0, {"pcie_replay": 3}, (79, 48)), (1, {}, ()), (2, {}, ())]
    assert reply["gpus"]["devices"][0]["health"]["xid"] == [79, 48]  # the reply itself is left alone


@pytest.mark.parametrize(
    ("first", "catching_up", "resets", "pending", "expected"),
    [
        (False, False, 0, 0, False),
        (True, False, 0, 0, True),
        (False, True, 0, 0, True),
        (False, False, 1, 0, True),
        (False, False, 0, 1, True),
    ],
)
def test_backfill_rule(first, catching_up, resets, pending, expected):
    assert ingest.is_backfill(first, catching_up, resets, pending) is expected


def test_frame_round_trip_and_bad_headers():
    stream = io.BytesIO(wire.encode_frame({"op": "hello", "t": "中"}) + wire.encode_frame([1]))
    assert wire.read_frame(stream) == {"op": "hello", "t": "中"}
    assert wire.read_frame(stream) == [1] and wire.read_frame(stream) is None  # EOF
    assert wire.read_frame(io.BytesIO(b"10\n{}")) is None  # closed mid-frame
    for header in (b"x1", b"-1", b"1" * (wire.MAX_HEADER_BYTES + 1), b""):
        with pytest.raises(ValueError):
            wire.frame_size(header)


# ---------------------------------------------------------------------------- a talking login shell
# What ~/.bashrc or /etc/profile print on a node's stdout comes before the agent's first reply
# (issue 29, item 10): the reply readers skip it up to the SYNC marker, and only so much of it.
BANNER = b"Welcome to hpc-login-01\n\x1b[1mquota: 93% of /home used\x1b[0m\n2026\nno newline at the end"
REPLY = {"schema_version": wire.SCHEMA_VERSION, "ok": True}


def reply_frame(n: int, noise: bytes = b"") -> bytes:
    return noise + wire.encode_frame(dict(REPLY, n=n), sync=True)


class PipeStream:
    """The read end of a real pipe as an AgentSession ByteStream; what is written is dropped."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, data: bytes, deadline: float) -> None:
        pass

    def read(self, max_bytes: int, deadline: float) -> bytes:
        if not select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        return os.read(self.fd, max_bytes)

    def eof_detail(self) -> str:
        return "exit status 0; stderr: "


@pytest.fixture
def pipe():
    """feed(data): a real pipe whose writer (a thread: a pipe holds 64 KiB) writes `data` and closes."""
    fds, threads = [], []

    def feed(data: bytes) -> int:
        r, w = os.pipe()
        fds.append((r, os.fstat(r).st_ino))  # the pipe's inode: its number may be reused once the test closes it

        def write():
            with os.fdopen(w, "wb") as out:
                with contextlib.suppress(BrokenPipeError):
                    out.write(data)

        threads.append(threading.Thread(target=write, daemon=True))
        threads[-1].start()
        return r

    yield feed
    for fd, ino in fds:  # close what the test left open, never a number reused by a later pipe's writer
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == ino:
                os.close(fd)
    for thread in threads:
        thread.join(timeout=5)


def test_reply_readers_skip_a_login_shells_output_before_and_between_frames(pipe):
    data = reply_frame(1, BANNER) + reply_frame(2) + reply_frame(3, b"late echo from a background job\n")
    with os.fdopen(pipe(data), "rb") as inp:
        assert [wire.read_frame(inp, sync=True) for _ in range(4)] == [dict(REPLY, n=n) for n in (1, 2, 3)] + [None]
    session = AgentSession(PipeStream(pipe(data)), "node-1")
    assert [session.request({"op": "hello"}, 5)["n"] for _ in range(3)] == [1, 2, 3] and not session.broken
    # "2026\n" alone would pass for a frame header: the marker, not the first digits, starts a reply
    with os.fdopen(pipe(b"2026\n" + reply_frame(4)), "rb") as inp:
        assert wire.read_frame(inp, sync=True) == dict(REPLY, n=4)


def test_reply_readers_skip_at_most_max_noise_bytes_then_quote_the_shell(pipe):
    at_bound = (BANNER * wire.MAX_NOISE_BYTES)[: wire.MAX_NOISE_BYTES]
    with os.fdopen(pipe(reply_frame(1, at_bound)), "rb") as inp:
        assert wire.read_frame(inp, sync=True) == dict(REPLY, n=1)
    assert AgentSession(PipeStream(pipe(reply_frame(1, at_bound))), "n").request({"op": "hello"}, 5)["n"] == 1
    over = reply_frame(1, at_bound + b"!")
    with os.fdopen(pipe(over), "rb") as inp, pytest.raises(wire.NoiseError) as info:
        wire.read_frame(inp, sync=True)
    assert info.value.noise.startswith(BANNER) and len(info.value.noise) > wire.MAX_NOISE_BYTES
    session = AgentSession(PipeStream(pipe(over)), "node-1")
    with pytest.raises(AgentError) as info:
        session.request({"op": "hello"}, 5)
    message = str(info.value)
    assert message.startswith("agent on node-1 sent no reply within 65536 bytes of other output: 'Welcome to")
    assert "\\x1b[1mquota" in message and "\x1b" not in message  # escaped, never run by a terminal
    assert "the login shell printed text before the agent started (e.g. an echo in ~/.bashrc" in message
    assert session.broken
