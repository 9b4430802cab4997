"""Tests of runhealth/node/agent.py: the shard scanner, sampling, poll replies and the serve loop.

Scenarios are named after what happens on a real node: a shard still being written, a
rotated or truncated shard, a writer that died mid-line, hostile file names, a 50 MB line.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runhealth.node import agent, wire
from runhealth.remote import protocol

AGENT_PATH = Path(agent.__file__)
# The agent is seven modules shipped together; BOOTSTRAP registers these under these names.
PARTS = {
    "runhealth_node_formats": AGENT_PATH.with_name("formats.py"),
    "runhealth_node_wire": AGENT_PATH.with_name("wire.py"),
    "runhealth_node_scan": AGENT_PATH.with_name("scan.py"),
    "runhealth_node_backfill": AGENT_PATH.with_name("backfill.py"),
    "runhealth_node_fields": AGENT_PATH.with_name("fields.py"),
    "runhealth_node_gpu": AGENT_PATH.with_name("gpu.py"),
}
BIG = 1 << 40  # "no budget limit" for a test-sized shard


# ---------------------------------------------------------------------------- line builders
def flat(fr, ct, text="hello world", **extra):
    rec = {"prompt": "Say hi", "text": text, "finish_reason": fr}
    if ct is not None:
        rec["usage"] = {"prompt_tokens": 3, "completion_tokens": ct}
    rec.update(extra)
    return rec


def chat(fr, ct, content="Hi there.", reasoning=None):
    msg = {"role": "assistant", "content": content}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1764690000,
        "model": "m",
        "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": fr}],
        "usage": {"prompt_tokens": 12, "completion_tokens": ct, "total_tokens": 12 + ct},
    }


def completion(fr, ct, text="Once upon a time"):
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": fr}],
        "usage": {"prompt_tokens": 4, "completion_tokens": ct, "total_tokens": 4 + ct},
    }


def batch(fr, ct, content="Batch answer"):
    return {
        "id": "batch_req_1",
        "custom_id": "request-7",
        "response": {"status_code": 200, "request_id": "r1", "body": chat(fr, ct, content)},
        "error": None,
    }


def sglang(fr, ct, text="SGLang says hi"):
    finish = {"type": fr, "length": ct} if fr == "length" else {"type": fr, "matched": 151645}
    return {
        "text": text,
        "meta_info": {
            "id": "abc",
            "finish_reason": finish,
            "prompt_tokens": 9,
            "completion_tokens": ct,
            "cached_tokens": 0,
        },
    }


def write(path, records, mode="wb"):
    with open(path, mode) as f:
        for rec in records:
            f.write(rec if isinstance(rec, bytes) else json.dumps(rec).encode() + b"\n")
    return str(path)


def scan(path, offset=0, inode=None, budget=BIG, paths=None):
    return agent.scan_file(str(path), inode, offset, budget, paths)


# ---------------------------------------------------------------------------- schemas
SCHEMAS = {"flat": flat, "chat": chat, "completion": completion, "batch": batch, "sglang": sglang}


@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_every_schema_counts_like_json_loads(tmp_path, schema):
    make = SCHEMAS[schema]
    recs = [make("length", 4096)] * 17 + [make("stop", 2301)] * 5 + [make("stop", 12)]
    entry = scan(write(tmp_path / "a.jsonl", recs))
    assert entry["counts"] == [[12, "stop", 0, 1], [2301, "stop", 0, 5], [4096, "length", 0, 17]]
    assert (entry["lines"], entry["malformed"], entry["error"]) == (23, 0, None)
    assert entry["tokens"] == 17 * 4096 + 5 * 2301 + 12
    assert entry["offset"] == entry["size"] == os.path.getsize(tmp_path / "a.jsonl")


def test_template_path_is_used_and_agrees(tmp_path):
    before = dict(agent.STATE.line_stats)
    recs = [chat("stop", n, "x" * (n % 300)) for n in range(1, 400)]
    entry = scan(write(tmp_path / "a.jsonl", recs))
    assert entry["counts"] == [[n, "stop", 0, 1] for n in range(1, 400)]
    assert agent.STATE.line_stats["template"] - before["template"] >= 390


def test_keys_quoted_inside_text_do_not_count(tmp_path):
    sneaky = 'He wrote {\\"finish_reason\\": \\"length\\", "completion_tokens": 9} and \\\\"'
    recs = [
        chat("stop", 7, sneaky),
        flat("stop", 5, '"finish_reason": "length"'),
        sglang("stop", 3, 'meta_info": {"finish_reason": {"type": "length"}}'),
    ] * 3
    entry = scan(write(tmp_path / "a.jsonl", recs))
    assert entry["counts"] == [[3, "stop", 0, 3], [5, "stop", 0, 3], [7, "stop", 0, 3]]


def test_nested_finish_reason_elsewhere_is_not_the_answer(tmp_path):
    # choices[0] has no finish_reason; one deeper down must not be taken for it.
    rec = chat("stop", 5)
    del rec["choices"][0]["finish_reason"]
    rec["choices"][0]["extra"] = {"finish_reason": "length"}
    entry = scan(write(tmp_path / "a.jsonl", [chat("stop", 5), rec, rec]))
    assert entry["counts"] == [[5, None, 0, 2], [5, "stop", 0, 1]]


def test_missing_tokens_are_estimated_from_text(tmp_path):
    recs = [
        flat("stop", None, "abcdefghi"),
        flat(None, None, ""),
        chat("length", 1, "x") | {"usage": None},
        {"choices": [{"message": {"content": "abcd", "reasoning_content": "efgh"}}]},
    ]
    entry = scan(write(tmp_path / "a.jsonl", recs))
    # 9 chars -> 3 tokens; "" -> 0; "x" -> 1; 4 + 4 chars -> 2 (labelled estimated = 1)
    assert entry["counts"] == [[0, None, 1, 1], [1, "length", 1, 1], [2, None, 1, 1], [3, "stop", 1, 1]]


def test_overrides_force_paths(tmp_path):
    rec = {"out": {"why": "length", "n": 77}, "finish_reason": "stop", "completion_tokens": 1}
    path = write(tmp_path / "a.jsonl", [rec] * 4)
    entry = scan(path, paths={"finish_reason_path": "out.why", "completion_tokens_path": "out.n"})
    assert entry["counts"] == [[77, "length", 0, 4]]
    entry = scan(path, paths={"finish_reason_path": "choices.0.finish_reason"})
    assert entry["counts"] == [[1, None, 0, 4]]


# ---------------------------------------------------------------------------- growing, rotated
def test_growing_shard_with_half_written_last_line(tmp_path):
    path = tmp_path / "live.jsonl"
    whole = json.dumps(chat("length", 4096)).encode() + b"\n"
    write(path, [chat("stop", 10)] * 3 + [whole[:50]])
    first = scan(path)
    assert (first["lines"], first["counts"]) == (3, [[10, "stop", 0, 3]])
    assert first["offset"] < first["size"] and first["pending_bytes"] == 0
    again = scan(path, first["offset"], first["inode"])  # nothing new: the half line waits
    assert (again["lines"], again["offset"], again["reset"]) == (0, first["offset"], False)
    write(path, [whole[50:], chat("stop", 11)], mode="ab")
    second = scan(path, first["offset"], first["inode"])
    assert second["counts"] == [[11, "stop", 0, 1], [4096, "length", 0, 1]]
    assert second["offset"] == second["size"] and not second["reset"]


def test_rotated_shard_new_inode_resets(tmp_path):
    path = tmp_path / "a.jsonl"
    first = scan(write(path, [flat("stop", 1)] * 5))
    os.replace(write(tmp_path / "b.jsonl", [flat("length", 2)] * 7), path)
    second = scan(path, first["offset"], first["inode"])
    assert second["reset"] and second["offset_from"] == 0
    assert second["counts"] == [[2, "length", 0, 7]]


def test_truncated_shard_resets(tmp_path):
    path = tmp_path / "a.jsonl"
    first = scan(write(path, [flat("stop", 1)] * 5))
    with open(path, "r+b") as f:
        f.truncate(0)
    write(path, [flat("length", 3)], mode="ab")
    second = scan(path, first["offset"], first["inode"])
    assert second["reset"] and second["counts"] == [[3, "length", 0, 1]]


# ---------------------------------------------------------------------------- bad input
def test_malformed_blank_and_non_objects(tmp_path):
    good = json.dumps(flat("stop", 4)).encode() + b"\n"
    lines = [
        good,
        good,
        b"\n",
        b"[1, 2]\n",
        b'"text"\n',
        b'{"finish_reason": "stop", \n',
        good[:40] + good,  # a writer died mid-line and the next record followed
        good[:-2] + b"\n",  # lost its closing brace
        b"\x00\x00\x00" + good,
        good,
    ]  # a crash left a hole of zeros
    entry = scan(write(tmp_path / "a.jsonl", lines))
    assert (entry["lines"], entry["malformed"], entry["blank_lines"]) == (10, 6, 1)
    assert entry["counts"] == [[4, "stop", 0, 3]]


@pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"), reason="json.loads reads any integer before 3.11")
@pytest.mark.parametrize("where", ["completion_tokens", "prompt_tokens", "created", "id", "token_ids"])
def test_an_integer_json_loads_refuses_makes_one_malformed_line(tmp_path, where):
    """An integer of more digits than json.loads reads (4,300 by default) is one malformed line, on
    the template path too, and the shard's other lines are counted: it once failed the whole
    shard's scan (int() of the template's count raised: "lines 0", every poll)."""
    if where == "token_ids":  # vLLM offline: the count is the list's length
        out = {"index": 0, "text": "t", "token_ids": [5, 6, 7], "finish_reason": "stop"}
        rec = {"request_id": "r", "prompt_token_ids": [1, 2], "outputs": [out]}
        line = json.dumps(rec)
        out["token_ids"][1] = 123456789
    else:
        rec = chat("stop", 7)
        line = json.dumps(rec)
        (rec if where in ("id", "created") else rec["usage"])[where] = 123456789
    victim = json.dumps(rec).replace("123456789", "7" * (sys.get_int_max_str_digits() + 1))
    with pytest.raises(ValueError):
        json.loads(victim)
    good = (line + "\n").encode()
    entry = scan(write(tmp_path / "a.jsonl", [good] * 3 + [(victim + "\n").encode()] + [good] * 3))
    assert entry["error"] is None
    assert (entry["lines"], entry["malformed"]) == (7, 1)
    assert entry["counts"] == [[3 if where == "token_ids" else 7, "stop", 0, 6]]


@pytest.mark.parametrize("where", ["in the text", "in the reasoning", "after the text", "in the head"])
def test_writer_restart_runs_a_record_into_a_torn_line(tmp_path, where):
    """A writer killed mid-line, restarted in append mode: the next record follows the torn one.

    The fast path (templates already learned from the good lines) must call it malformed, as
    json.loads does, wherever the cut falls, even though the line ends like a valid record.
    """
    text = 'code {"a": 1} and "quotes" ' * 200
    good = [
        json.dumps(chat("stop" if i % 3 else "length", i + 1, text, reasoning="why " * 300)).encode() for i in range(40)
    ]
    victim = good[0]
    cut = {
        "in the text": victim.find(b"and") + 2000,
        "in the reasoning": victim.find(b"why") + 50,
        "after the text": victim.find(b'"logprobs"') + 3,
        "in the head": 30,
    }[where]
    torn = victim[:cut] + good[1]
    before = agent.STATE.line_stats["template"]
    entry = scan(
        write(tmp_path / "a.jsonl", [g + b"\n" for g in good[:20]] + [torn + b"\n"] + [g + b"\n" for g in good[20:]])
    )
    assert (entry["lines"], entry["malformed"]) == (41, 1)
    want = {}
    for i in range(40):
        key = (i + 1, "stop" if i % 3 else "length")
        want[key] = want.get(key, 0) + 1
    assert {(t, fr): n for t, fr, _, n in entry["counts"]} == want
    assert agent.STATE.line_stats["template"] - before >= 38  # the good lines took the fast path


def test_content_rule_string_content_is_repaired_structure_is_not(tmp_path):
    """README "Exactness": broken string *content* counts; broken structure never does."""
    good = json.dumps(flat("stop", 4, "caf\u00e9 x", model="m")).encode() + b"\n"
    content_only = [
        good.replace(b"\\u00e9", b"\xe9"),  # a latin-1 byte: invalid UTF-8
        good.replace(b"\\u00e9", b"\xed\xa0\x80"),  # an encoded surrogate
        good.replace(b"\\u00e9", b"\x01\t"),  # raw control characters
        good.replace(b"\\u00e9", b"\\q"),  # a bad escape
        good.replace(b'"model"', b'"mod\xe9l"'),  # invalid UTF-8 in another key
        good.replace(b'"m"}', b'"m\x01"}'),
    ]  # a control character in a short value
    structural = [
        good.replace(b'"stop"', b'"st\xe9p"'),  # invalid UTF-8 in finish_reason
        good.replace(b'x", "finish', b'x" "finish'),  # a missing comma after the text
        good.replace(b'x", "finish', b'x\\", "finish'),
    ]  # the text's end quote escaped
    for raw in content_only + structural:  # json.loads itself rejects each of them
        with pytest.raises(ValueError):
            json.loads(raw.decode("utf-8"))
    utf8 = good.replace(b"\\u00e9", "\u00e9".encode())
    before = agent.STATE.line_stats["template"]
    entry = scan(write(tmp_path / "a.jsonl", [good, utf8] + content_only + structural))
    assert (entry["lines"], entry["malformed"], entry["counts"]) == (11, 3, [[4, "stop", 0, 8]])
    assert agent.STATE.line_stats["template"] - before >= 5  # the raw-UTF-8 text took the template
    for raw in content_only:  # the same outcome with no template learned yet (first line)
        alone = scan(write(tmp_path / "b.jsonl", [raw]))
        assert (alone["lines"], alone["malformed"], alone["counts"]) == (1, 0, [[4, "stop", 0, 1]])


def test_empty_file(tmp_path):
    entry = scan(write(tmp_path / "a.jsonl", []))
    assert (entry["lines"], entry["offset"], entry["counts"], entry["error"]) == (0, 0, [], None)


def test_missing_file_is_an_error_entry(tmp_path):
    entry = scan(tmp_path / "nope.jsonl")
    assert entry["error"].startswith("FileNotFoundError") and entry["counts"] == []


def test_50_mb_line(tmp_path):
    big = chat("length", 32768, "y" * (50 << 20))
    path = write(tmp_path / "a.jsonl", [chat("stop", 1), big, chat("stop", 2)])
    entry = scan(path)
    assert entry["counts"] == [[1, "stop", 0, 1], [2, "stop", 0, 1], [32768, "length", 0, 1]]
    small_budget = scan(path, budget=1 << 20)  # one line longer than the budget still gets read
    assert small_budget["lines"] >= 1 and small_budget["pending_bytes"] > 0


def test_budget_split_gives_the_same_totals(tmp_path):
    recs = [sglang("length" if i % 3 else "stop", i % 50, "z" * (i % 700)) for i in range(3000)]
    path = write(tmp_path / "a.jsonl", recs)
    whole = scan(path)
    totals, offset, inode, calls = {}, 0, None, 0
    while True:
        e = scan(path, offset, inode, budget=100_000)
        for t, fr, est, n in e["counts"]:
            totals[(t, fr, est)] = totals.get((t, fr, est), 0) + n
        offset, inode, calls = e["offset"], e["inode"], calls + 1
        if e["pending_bytes"] == 0:
            break
    assert calls > 5 and offset == whole["size"]
    assert sorted([*k, n] for k, n in totals.items()) == sorted(whole["counts"])


# ---------------------------------------------------------------------------- poll and globs
def poll(globs, state=None, budget=BIG, **extra):
    req = {
        "op": "poll",
        "shards": {"globs": globs, "state": state or {}, "budget_bytes": budget},
        "gpu": "off",
        "metrics_urls": [],
        **extra,
    }
    reply = agent.handle(req)
    assert reply["ok"], reply
    return reply


def test_poll_reply_has_every_key(tmp_path):
    write(tmp_path / "a.jsonl", [flat("stop", 1)])
    reply = poll(
        [str(tmp_path / "*.jsonl"), str(tmp_path / "none-*.jsonl")],
        metrics_urls=["file:///etc/passwd", "http://127.0.0.1:9/metrics"],
        metrics_timeout_s=0.5,
    )
    for key in ("schema_version", "time_unix", "agent_ms", "hostname", "loadavg", "gpus", "shards", "disk", "metrics"):
        assert key in reply
    assert reply["shards"]["matched"] == 1
    assert reply["shards"]["unmatched_globs"] == [str(tmp_path / "none-*.jsonl")]
    assert reply["gpus"]["source"] is None and "off" in reply["gpus"]["reason"]
    assert "http" in reply["metrics"]["file:///etc/passwd"]["error"]
    assert reply["metrics"]["http://127.0.0.1:9/metrics"]["error"]
    (disk,) = reply["disk"].values()
    assert 0 < disk["free_bytes"] <= disk["total_bytes"]


def test_budget_is_shared_so_no_shard_starves(tmp_path):
    for i in range(6):
        write(tmp_path / f"s{i}.jsonl", [flat("stop", i, "w" * 2000)] * 2000)
    state, rounds, touched = {}, 0, []
    while True:
        reply = poll([str(tmp_path / "*.jsonl")], state, budget=3 << 20)
        files = reply["shards"]["files"]
        touched.append({p for p, e in files.items() if e["lines"]})
        state = {p: {"inode": e["inode"], "offset": e["offset"]} for p, e in files.items()}
        rounds += 1
        if reply["shards"]["pending_bytes"] == 0:
            break
    assert len(touched[0]) == 3 and len(touched[0] | touched[1]) == 6  # round-robin slices
    assert rounds >= 4 and all(e["offset"] == e["size"] for e in files.values())


HOSTILE = ["a b", "q'uote\"d", "$(touch pwned)", "`touch pwned2`", "x; touch pwned3"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_paths_are_literal(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / name
    folder.mkdir()
    path = write(folder / (name + ".jsonl"), [flat("stop", 2)] * 3)
    reply = poll([path])
    assert reply["shards"]["files"][path]["counts"] == [[2, "stop", 0, 3]]
    sample = agent.handle({"op": "sample", "globs": [path], "n": 2, "seed": 1})
    assert sample["ok"] and len(sample["samples"]) == 2
    assert sorted(os.listdir(tmp_path)) == [name]  # nothing was executed, nothing created


# ---------------------------------------------------------------------------- sampling
def test_sampling_is_uniform_by_line_not_by_byte(tmp_path):
    # 10 lines of 100 KB and 990 lines of ~100 B: by byte, long lines would be ~91% of draws.
    recs = [flat("length", 9, "L" * 100_000) if i % 99 == 0 else flat("stop", 1, "s") for i in range(1000)]
    path = write(tmp_path / "a.jsonl", recs)
    long_hits = draws = 0
    for seed in range(10):
        reply = agent.handle({"op": "sample", "globs": [path], "n": 200, "seed": seed, "tail_chars": 10})
        assert reply["population"] == 1000
        draws += len(reply["samples"])
        long_hits += sum(s["finish_reason"] == "length" for s in reply["samples"])
    expected = draws * 10 / 1000  # 20
    assert (long_hits - expected) ** 2 / expected < 12, long_hits  # chi-square, 1 dof, p ~ 0.0005


def test_sampling_weights_shards_by_line_count(tmp_path):
    a = write(tmp_path / "a.jsonl", [flat("stop", 1, "A" * 20_000)] * 100)
    write(tmp_path / "b.jsonl", [flat("stop", 1, "b")] * 900)
    reply = agent.handle({"op": "sample", "globs": [str(tmp_path / "*.jsonl")], "n": 500, "seed": 3})
    from_a = sum(s["path"] == a for s in reply["samples"])
    assert reply["population"] == 1000 and 25 <= from_a <= 80  # expected 50


def test_sample_filter_full_text_and_fields(tmp_path):
    recs = [
        {
            "messages": [
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": f"Q{i}?"},
            ],
            "text": f"T{i} " + "x" * 3000,
            "finish_reason": "length" if i % 10 == 0 else "stop",
            "completion_tokens": i,
        }
        for i in range(300)
    ]
    path = write(tmp_path / "a.jsonl", recs)
    reply = agent.handle(
        {
            "op": "sample",
            "globs": [path],
            "n": 5,
            "seed": 7,
            "finish_reason": "length",
            "head_chars": 5,
            "tail_chars": 3,
            "full_text": True,
        }
    )
    assert len(reply["samples"]) == 5
    for s in reply["samples"]:
        i = s["line_no"] - 1
        assert s["finish_reason"] == "length" and s["tokens"] == i and s["estimated"] == 0
        assert s["prompt_head"] == f"Q{i}?" and s["text_head"] == (f"T{i} " + "xxxx")[:5]
        assert s["text_tail"] == "xxx" and s["text_chars"] == len(recs[i]["text"])
        assert s["text"] == recs[i]["text"] and s["prompt"] == f"Q{i}?"
        with open(path, "rb") as f:
            f.seek(s["offset"])
            assert json.loads(f.readline()) == recs[i]


def test_sample_same_seed_same_draws_and_index_grows(tmp_path):
    path = tmp_path / "a.jsonl"
    write(path, [flat("stop", i) for i in range(50)])
    req = {"op": "sample", "globs": [str(path)], "n": 10, "seed": 42}
    one, two = agent.handle(req), agent.handle(req)
    assert [s["line_no"] for s in one["samples"]] == [s["line_no"] for s in two["samples"]]
    write(path, [flat("stop", 99)] * 50 + [b'{"half'], mode="ab")
    assert agent.handle(req)["population"] == 100


# ---------------------------------------------------------------------------- serving
def frame(obj):
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return b"%d\n" % len(data) + data


def read_reply(stream):
    return wire.read_frame(stream, sync=True)


def test_serve_loop_over_a_real_subprocess(tmp_path):
    path = write(tmp_path / "a.jsonl", [chat("stop", 5)] * 4)
    # -I keeps the script's folder off sys.path and cwd is elsewhere: agent.py must find
    # scan.py / gpu.py / wire.py beside itself.
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(AGENT_PATH)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        proc.stdin.write(frame({"op": "hello"}) + frame(b"{not json") + frame({"op": "launch"}))
        proc.stdin.write(frame({"op": "poll", "shards": {"globs": [path]}, "gpu": "demo", "demo_gpus": 7}))
        proc.stdin.flush()
        hello, bad, unknown, polled = (read_reply(proc.stdout) for _ in range(4))
        assert hello["ok"] and hello["schema_version"] == 1 and hello["pid"] == proc.pid
        assert not bad["ok"] and "bad frame" in bad["error"]
        assert not unknown["ok"] and "launch" in unknown["error"]
        assert polled["shards"]["files"][path]["counts"] == [[5, "stop", 0, 4]]
        assert polled["gpus"]["simulated"] and len(polled["gpus"]["devices"]) == 7
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_demo_gpus_are_plausible_b200_readings():
    gpus = agent.read_gpus("demo", 7)
    assert gpus["source"] == "demo" and gpus["simulated"] and len(gpus["devices"]) == 7
    for d in gpus["devices"]:
        assert 90 <= d["util_pct"] <= 99 and 800 <= d["power_w"] <= 1000 <= d["power_limit_w"]
        assert 55 <= d["temp_c"] <= 70 and 160_000 < d["mem_used_mib"] < d["mem_total_mib"]


STDLIB_PROBE = """
import json, sys
src = open(sys.argv[1]).read()
parts = json.loads(sys.argv[3])
g = {"__name__": "probe", "__modules__": {name: open(path).read() for name, path in parts.items()}}
exec(compile(src, "agent", "exec"), g)
g["handle"]({"op": "poll", "shards": {"globs": [sys.argv[2]]}, "gpu": "auto",
             "metrics_urls": ["http://127.0.0.1:9/m"], "metrics_timeout_s": 0.2})
g["handle"]({"op": "sample", "globs": [sys.argv[2]], "n": 2})
print(json.dumps(sorted(sys.modules)))
"""


def test_agent_imports_only_the_standard_library(tmp_path):
    path = write(tmp_path / "a.jsonl", [chat("stop", 5)] * 4)
    parts = json.dumps({name: str(p) for name, p in PARTS.items()})
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", STDLIB_PROBE, str(AGENT_PATH), path, parts],
        capture_output=True,
        timeout=60,
        check=True,
    )
    mods = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert set(PARTS) <= mods  # all four parts ran, so their imports are in the check
    ours = set(PARTS) | {"__main__", "__mp_main__"}  # multiprocessing's alias of __main__
    third_party = mods - set(sys.stdlib_module_names) - set(sys.builtin_module_names) - ours
    assert not third_party, third_party


@pytest.mark.parametrize("path", [AGENT_PATH, *PARTS.values()], ids=lambda p: p.name)
def test_agent_source_parses_as_python_3_8(path):
    import ast

    ast.parse(path.read_text(), feature_version=(3, 8))


# ---------------------------------------------------------------------------- shipping to a node
def test_program_frame_ships_the_agent_and_its_parts():
    header, body = protocol.program_frame().split(b"\n", 1)
    program = json.loads(body)
    assert int(header) == len(body) and program["main"] == AGENT_PATH.read_text()
    for name, path in PARTS.items():
        assert program["modules"][name] == path.read_text(), name


def test_bootstrap_runs_the_shipped_agent_without_the_runhealth_package(tmp_path):
    """The node's view: only python3, no runhealth installed, sources arrive in the first frame."""
    path = write(tmp_path / "a.jsonl", [chat("stop", 5)] * 3 + [sglang("length", 9)])
    stdin = (
        protocol.program_frame()
        + frame({"op": "hello"})
        + frame({"op": "poll", "shards": {"globs": [path]}, "gpu": "off"})
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", protocol.BOOTSTRAP],
        input=stdin,
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    replies = io.BytesIO(done.stdout)
    hello, polled = read_reply(replies), read_reply(replies)
    assert hello["ok"] and hello["agent_version"] == agent.AGENT_VERSION
    assert polled["ok"] and polled["shards"]["files"][path]["counts"] == [[5, "stop", 0, 3], [9, "length", 0, 1]]
    assert polled["gpus"]["source"] is None and polled["gpus"]["reason"]


def test_host_memory_from_proc_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       2097152 kB\nMemFree:  1000 kB\nMemAvailable:   1048576 kB\n"
        "SwapTotal:             0 kB\nSwapFree:              0 kB\n"
    )
    host = agent.read_host(str(meminfo))
    assert host["mem_total_bytes"] == 2 * 2**30 and host["mem_available_bytes"] == 2**30
    assert host["swap_total_bytes"] == 0 and host["cpus"] >= 1
    assert agent.read_host(str(tmp_path / "absent")) == {"cpus": host["cpus"]}  # no /proc: fields absent
