"""Parallel backfill (runhealth/node/backfill.py): same counts as one process, real workers.

The property: cutting a shard's range at any byte offsets (inside multibyte characters, inside
torn lines, at line starts) and scanning the pieces separately gives exactly the entry one
scan_file() call gives. The pool tests then run real "fork" workers: in this process, and in a
real agent exec'd by protocol.BOOTSTRAP from shipped sources (code loaded with `-c`, which is
what rules out "spawn" and "forkserver").
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scan_property import BROKEN_CONTENT, SCHEMAS, build, corrupt_text, dumps, shapes, values

from runhealth.node import agent, wire
from runhealth.remote import protocol

backfill = agent.backfill
scan_one = agent.scan.scan_file


def fresh_templates():
    agent.scan.TEMPLATES.entries.clear()  # a worker may start a piece knowing no template
    agent.scan.TEMPLATES.inode_of.clear()


def one_process(path, offset, budget):
    fresh_templates()
    return scan_one(path, None, offset, budget)


def in_pieces(path, offset, budget, cuts, workers=2, runner=backfill.scan_piece):
    fresh_templates()
    out = backfill.scan_jobs([(path, None, offset, budget)], workers, scan_one, runner=runner, cuts={path: cuts})[path]
    assert out.pop("by_workers") is True
    return out


@st.composite
def shards(draw):
    """Bytes of a shard: one schema, raw UTF-8 or not, with torn and broken-content lines."""
    schema, shape = draw(st.sampled_from(SCHEMAS)), draw(shapes)
    body = b""
    for _ in range(draw(st.integers(1, 14))):
        rec = build(schema, draw(values), shape)
        line = dumps(rec, shape)
        roll = draw(st.integers(0, 9))
        if roll == 0:  # a writer died mid-line and its restart appended the next record
            line = line[: draw(st.integers(0, len(line) - 2))] + dumps(build(schema, draw(values), shape), shape)
        elif roll == 1:
            line = corrupt_text(line, rec, shape, draw(st.sampled_from(BROKEN_CONTENT)))
        elif roll == 2:  # a blank line
            line = b"\n"
        body += line
    if draw(st.booleans()):  # a half-written last line
        body += dumps(build(schema, draw(values), shape), shape)[:-3]
    return body


@settings(max_examples=2 * settings.default.max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=shards(), data=st.data())
def test_any_split_counts_exactly_what_one_process_counts(tmp_path_factory, body, data):
    path = str(tmp_path_factory.mktemp("split") / "s.jsonl")
    with open(path, "wb") as f:
        f.write(body)
    starts = [0] + [i + 1 for i, b in enumerate(body) if b == 10]
    offset = data.draw(st.sampled_from(starts))  # resume where an earlier poll stopped
    budget = data.draw(st.one_of(st.just(1 << 30), st.integers(0, len(body) + 2)))
    multibyte = [i for i, b in enumerate(body) if b >= 0x80]  # cuts inside UTF-8 sequences
    anywhere = st.integers(0, len(body) + 2)
    cuts = data.draw(
        st.lists(st.one_of(anywhere, st.sampled_from(multibyte or [0]), st.sampled_from(starts)), max_size=8)
    )
    assert in_pieces(path, offset, budget, cuts) == one_process(path, offset, budget)


def test_named_splits_inside_a_character_and_a_torn_line(tmp_path):
    text = "中文 é 😀 " * 50
    good = [
        json.dumps({"text": text, "finish_reason": fr, "completion_tokens": n}, ensure_ascii=False).encode() + b"\n"
        for n, fr in [(5, "stop"), (7, "length"), (9, "stop")]
    ]
    torn = good[0][:300] + good[1]
    body = good[0] + torn + good[2] + good[1][:40]
    path = str(tmp_path / "a.jsonl")
    with open(path, "wb") as f:
        f.write(body)
    inside_char = body.index("文".encode()) + 1
    inside_torn = len(good[0]) + 200
    whole = one_process(path, 0, 1 << 30)
    assert (whole["lines"], whole["malformed"], whole["offset"]) == (3, 1, len(body) - 40)
    for cuts in ([inside_char], [inside_torn], [inside_char, inside_torn, len(body) - 10], [len(good[0])]):
        assert in_pieces(path, 0, 1 << 30, cuts) == whole, cuts


def test_a_deadline_keeps_an_exact_prefix(tmp_path, monkeypatch):
    line = json.dumps({"text": "x" * 200, "finish_reason": "stop", "completion_tokens": 3}).encode() + b"\n"
    path = str(tmp_path / "a.jsonl")
    with open(path, "wb") as f:
        f.write(line * 1000)
    cuts = list(range(1, len(line) * 1000, 10 * len(line)))  # 100 pieces
    fresh_templates()
    out = backfill.scan_jobs(
        [(path, None, 0, 1 << 30)],
        2,
        scan_one,
        deadline=time.monotonic() - 1,
        runner=backfill.scan_piece,
        cuts={path: cuts},
    )[path]
    assert out == dict(out, lines=1000)  # in-process runner: a deadline does not apply to it
    monkeypatch.setattr(backfill, "PARALLEL_MIN_BYTES", 0)
    out = backfill.scan_jobs([(path, None, 0, 1 << 30)], 2, scan_one, deadline=time.monotonic() - 1, cuts={path: cuts})[
        path
    ]
    done = out["lines"]
    assert 0 < done < 1000 and out["offset"] == done * len(line)  # the first batch, then stop
    assert out["pending_bytes"] == (1000 - done) * len(line)
    assert out["counts"] == [[3, "stop", 0, done]]


def test_real_fork_workers_at_lower_priority(tmp_path, monkeypatch):
    monkeypatch.setattr(backfill, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(backfill, "PIECE_MIN_BYTES", 1)
    line = (
        json.dumps({"text": "ü" * 300, "finish_reason": "length", "completion_tokens": 8}, ensure_ascii=False).encode()
        + b"\n"
    )
    path = str(tmp_path / "a.jsonl")
    with open(path, "wb") as f:
        f.write(line * 3000 + line[:50])
    whole = one_process(path, 0, 1 << 30)
    out = backfill.scan_jobs([(path, None, 0, 1 << 30)], 2, scan_one)[path]
    assert out.pop("by_workers") and out == whole
    assert backfill.LAST_RUN["workers"] == 2 and os.getpid() not in backfill.LAST_RUN["pids"]
    assert backfill.LAST_RUN["nice"] == {min(19, os.nice(0) + backfill.WORKER_NICE)}


def test_default_workers_is_a_quarter_of_the_cores_within_1_to_8():
    assert [backfill.default_workers(c) for c in (1, 4, 7, 8, 16, 32, 64, 256)] == [1, 1, 1, 2, 4, 8, 8, 8]
    assert backfill.resolve_workers(None) == backfill.default_workers()
    assert backfill.resolve_workers(99) == 8 and backfill.resolve_workers(0) == 1


def frame(obj):
    data = json.dumps(obj).encode()
    return b"%d\n%s" % (len(data), data)


def read_reply(stream):
    return wire.read_frame(stream, sync=True)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_real_bootstrap_scans_with_fork_workers(tmp_path, workers):
    """A node's view: agent exec'd from `python -c BOOTSTRAP`; worker code exists only in memory."""
    line = (
        json.dumps(
            {"text": "中文 " * 100, "finish_reason": "stop", "completion_tokens": 4}, ensure_ascii=False
        ).encode()
        + b"\n"
    )
    path = str(tmp_path / "a.jsonl")
    with open(path, "wb") as f:
        f.write(line * 2000)
    header, body = protocol.program_frame(include_pynvml=False).split(b"\n", 1)
    program = json.loads(body)
    small = (
        program["modules"]["runhealth_node_backfill"]
        .replace(  # a test-sized backlog
            "PARALLEL_MIN_BYTES = 64 << 20", "PARALLEL_MIN_BYTES = 1"
        )
        .replace("PIECE_MIN_BYTES = 4 << 20", "PIECE_MIN_BYTES = 1")
    )
    assert small != program["modules"]["runhealth_node_backfill"]
    program["modules"]["runhealth_node_backfill"] = small
    poll = {"op": "poll", "gpu": "off", "shards": {"globs": [path], "scan_workers": workers, "budget_bytes": 1 << 30}}
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-u", "-c", protocol.BOOTSTRAP],
        input=frame(program) + frame(poll),
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    reply = read_reply(io.BytesIO(done.stdout))
    assert reply["ok"], reply
    entry = reply["shards"]["files"][path]
    assert reply["shards"]["scan_workers"] == (workers if workers > 1 else 0)
    assert (entry["lines"], entry["malformed"], entry["counts"], entry["offset"]) == (
        2000,
        0,
        [[4, "stop", 0, 2000]],
        len(line) * 2000,
    )


def test_no_fork_falls_back_to_one_process(tmp_path, monkeypatch):
    """fork refused (process limits) or a worker killed: the poll still progresses, same counts."""
    import multiprocessing

    def refuse(method):
        raise OSError("fork refused")

    monkeypatch.setattr(backfill, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(backfill, "PIECE_MIN_BYTES", 1)
    monkeypatch.setattr(multiprocessing, "get_context", refuse)
    line = json.dumps({"text": "x" * 100, "finish_reason": "stop", "completion_tokens": 2}).encode() + b"\n"
    path = str(tmp_path / "a.jsonl")
    with open(path, "wb") as f:
        f.write(line * 500)
    whole = one_process(path, 0, 1 << 30)
    out = backfill.scan_jobs([(path, None, 0, 1 << 30)], 2, scan_one)[path]
    assert out.pop("by_workers") and out == whole and backfill.LAST_RUN["workers"] == 0


def small_backfill_program():
    """The shipped program with a test-sized backlog threshold (PARALLEL_MIN_BYTES = 1)."""
    header, body = protocol.program_frame(include_pynvml=False).split(b"\n", 1)
    program = json.loads(body)
    shipped = program["modules"]["runhealth_node_backfill"]
    small = shipped.replace("PARALLEL_MIN_BYTES = 64 << 20", "PARALLEL_MIN_BYTES = 1").replace(
        "PIECE_MIN_BYTES = 4 << 20", "PIECE_MIN_BYTES = 1"
    )
    assert small.count("= 1  #") == 2, "the knobs this test lowers moved"
    program["modules"]["runhealth_node_backfill"] = small
    return program


def bootstrap_poll(tmp_path, program, shards_request):
    """One poll of a real agent exec'd from `python -c BOOTSTRAP`: its shards reply."""
    poll = {"op": "poll", "gpu": "off", "shards": shards_request}
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-u", "-c", protocol.BOOTSTRAP],
        input=frame(program) + frame(poll),
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    reply = read_reply(io.BytesIO(done.stdout))
    assert reply["ok"], reply
    return reply["shards"]


def test_workers_count_with_the_configured_field_paths(tmp_path):
    """finish_reason_path / completion_tokens_path reach every worker: a parallel backfill
    counts exactly what the one-process scan counts (before: workers auto-detected the fields)."""
    path = str(tmp_path / "a.jsonl")
    want: dict = {}
    with open(path, "w", encoding="utf-8") as f:
        for i in range(3000):  # the auto-detected fields (choices / usage) say something else
            why, n = ["tool", "eos", "cap"][i % 3], 100 + i % 7
            rec = {
                "choices": [{"message": {"content": "hi " * 30}, "finish_reason": "stop"}],
                "usage": {"completion_tokens": 5},
                "meta": {"why": why, "n": n},
            }
            f.write(json.dumps(rec) + "\n")
            want[(n, why)] = want.get((n, why), 0) + 1
    program = small_backfill_program()
    configured = {"finish_reason_path": "meta.why", "completion_tokens_path": "meta.n"}
    serial = bootstrap_poll(tmp_path, program, dict(configured, globs=[path], scan_workers=1))
    parallel = bootstrap_poll(tmp_path, program, dict(configured, globs=[path], scan_workers=2))
    assert (serial["scan_workers"], parallel["scan_workers"]) == (0, 2)
    assert {(t, fr): n for t, fr, _, n in serial["files"][path]["counts"]} == want
    assert parallel["files"][path] == serial["files"][path]


def rchar(pid):
    """Bytes the process (and the workers it reaped) read so far, from /proc/<pid>/io."""
    with open(f"/proc/{pid}/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def count_rows(lines):
    """{(tokens, finish_reason): count} of flat JSON lines, the reference the agent must match."""
    out: dict = {}
    for line in lines:
        obj = json.loads(line)
        key = (obj["completion_tokens"], obj["finish_reason"])
        out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.parametrize("prefix_lines", [0, 3000], ids=["line-alone", "after-lines"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_newline_search_stops_at_the_time_budget_and_resumes(tmp_path, workers, prefix_lines):
    """A line with no newline yet, bigger than a poll can search in budget_s: each poll searches
    about budget_s worth (at least one read), the next resumes where it stopped (no byte read
    twice), the reply says work is pending, and once the line ends the counts are exact.
    Before: the first poll searched the whole 256 MiB, whatever budget_s said."""
    size = 256 << 20
    lines = [
        json.dumps({"text": "ok", "finish_reason": "stop", "completion_tokens": i % 9}) for i in range(prefix_lines)
    ]
    prefix = "".join(line + "\n" for line in lines).encode()
    stuck = tmp_path / "stuck.jsonl"
    with open(stuck, "wb") as f:  # sparse: no disk used; reads as NUL bytes, never a newline
        f.write(prefix + b'{"text": "')
        f.truncate(size)
    env = dict(os.environ, RUNHEALTH_MAX_LINE_BYTES=str(1 << 20))  # the least bound: 1 MiB
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-u", "-c", protocol.BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    state: dict = {}
    counted: dict = {"lines": 0, "malformed": 0, "rows": {}}

    def poll(budget_s):
        shards = {"globs": [str(stuck)], "state": state, "budget_s": budget_s, "scan_workers": workers}
        shards["budget_bytes"] = 1 << 30  # the whole line in one poll's byte budget
        proc.stdin.write(frame({"op": "poll", "gpu": "off", "shards": shards}))
        proc.stdin.flush()
        reply = read_reply(proc.stdout)
        assert reply["ok"], reply
        entry = reply["shards"]["files"][str(stuck)]
        assert (entry["reset"], entry["error"]) == (False, None)
        state[str(stuck)] = {"inode": entry["inode"], "offset": entry["offset"]}
        counted["lines"] += entry["lines"]
        counted["malformed"] += entry["malformed"]
        for t, fr, _, n in entry["counts"]:
            counted["rows"][(t, fr)] = counted["rows"].get((t, fr), 0) + n
        return reply["shards"], entry

    try:
        proc.stdin.write(frame(small_backfill_program()) + frame({"op": "hello"}))
        proc.stdin.flush()
        assert read_reply(proc.stdout)["ok"]  # the program is in: from here the agent reads shards
        searched, read_bytes = [0], 0
        deadline = time.monotonic() + 30
        while len(searched) < 4 and time.monotonic() < deadline:
            before = rchar(proc.pid)
            shards, entry = poll(0.005)
            if len(searched) > 1:  # the line's first search (and any planning) is done
                read_bytes += rchar(proc.pid) - before
            assert 0 < shards["pending_bytes"] <= size - entry["offset"], "the reply says the shard has work left"
            if entry["problem"] is None:
                continue  # the poll's time was gone before the line's turn: nothing searched
            assert entry["offset"] == len(prefix)
            found = re.match(r"unterminated line: (\d+) bytes from byte offset (\d+)", entry["problem"])
            n = int(found.group(1))
            assert shards["pending_bytes"] == size - entry["offset"] - n, "what is left: the bytes not searched yet"
            assert int(found.group(2)) == len(prefix), entry["problem"]
            if n == searched[-1]:
                # The poll's time was gone before the line's turn (a loaded machine: seen with a busy
                # loop beside the suite): nothing searched, the line's problem said from the last search.
                continue
            assert searched[-1] < n < size - len(prefix), "the search stopped at the time budget, further than before"
            searched.append(n)
        assert len(searched) == 4, searched
        assert read_bytes < searched[-1] - searched[1] + (3 << 20), "each poll resumed where the last stopped"
        more = [json.dumps({"text": "x", "finish_reason": "length", "completion_tokens": 3 + i}) for i in range(5)]
        with open(stuck, "ab") as f:
            f.write(b'"}\n' + "".join(line + "\n" for line in more).encode())
        before = rchar(proc.pid)
        shards, entry = poll(None)  # no time limit: the search ends, only its last bytes are read
        assert rchar(proc.pid) - before < size - len(prefix) - searched[-1] + (4 << 20)
        assert shards["pending_bytes"] == 0 and entry["offset"] == os.path.getsize(stuck)
        assert entry["problem"].startswith("skipped 1 line(s) longer")
        assert counted == {"lines": prefix_lines + 6, "malformed": 1, "rows": count_rows(lines + more)}
    finally:
        proc.kill()
        proc.wait()


def test_planning_reads_an_unfinished_line_once_not_once_per_cut(tmp_path):
    """The first parallel poll of a shard ending in a big unfinished line: cut points inside
    it are searched once (the first search's answer serves the rest), so the poll reads it about
    twice (planning, then the worker's search from the line's start). Before: once per cut
    point (8 pieces: about 4.5 times)."""
    size = 96 << 20
    good = [json.dumps({"text": "ok", "finish_reason": "stop", "completion_tokens": 2 + i}) + "\n" for i in range(5)]
    path = tmp_path / "died.jsonl"
    with open(path, "wb") as f:  # a writer died mid-line; sparse: no disk used, no newline in it
        f.write("".join(good).encode() + b'{"text": "')
        f.truncate(size)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-u", "-c", protocol.BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=tmp_path,
        env=dict(os.environ, RUNHEALTH_MAX_LINE_BYTES=str(1 << 20)),
    )
    try:
        proc.stdin.write(frame(small_backfill_program()) + frame({"op": "hello"}))
        proc.stdin.flush()
        assert read_reply(proc.stdout)["ok"]
        before = rchar(proc.pid)
        shards = {"globs": [str(path)], "scan_workers": 2, "budget_bytes": 1 << 30}
        proc.stdin.write(frame({"op": "poll", "gpu": "off", "shards": shards}))
        proc.stdin.flush()
        reply = read_reply(proc.stdout)
        read_bytes = rchar(proc.pid) - before
        assert reply["ok"] and reply["shards"]["scan_workers"] == 2
        entry = reply["shards"]["files"][str(path)]
        assert (entry["lines"], entry["offset"]) == (5, len("".join(good)))
        assert entry["counts"] == [[2 + i, "stop", 0, 1] for i in range(5)]
        assert read_bytes < 2 * size + (4 << 20), f"{read_bytes / size:.1f} times the shard read"
    finally:
        proc.kill()
        proc.wait()
