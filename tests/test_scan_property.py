"""Property test: the scanner's fast (template) path counts exactly what json.loads counts.

Each example builds one shard: lines of one schema and one writer style (separators, key order,
ensure_ascii), values drawn adversarially (text holding `"finish_reason": "length"`, escaped
quotes, backslash runs, unicode, nested objects carrying the same keys), plus a few lines of
other shapes and some truncated lines. The reference below is a plain json.loads per line,
written from design.md independently of runhealth/node/agent.py.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import tempfile
import zlib
from collections import Counter

import formatgen
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runhealth.node import agent, scan

# ---------------------------------------------------------------------------- reference
TEXT_KEYS = ("text", "completion", "output", "response")


def _completion_fields(obj):
    """(finish_reason value, completion_tokens value, [text parts]) per design.md."""
    rec = obj
    resp = obj.get("response")
    if isinstance(resp, dict) and isinstance(resp.get("body"), dict):
        rec = resp["body"]
    choices = rec.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c0 = choices[0]
        usage = rec.get("usage")
        ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
        msg = c0.get("message")
        if isinstance(msg, dict):
            why = msg.get("reasoning_content")
            why = why if isinstance(why, str) else msg.get("reasoning")
            texts = [why, msg.get("content")]
        else:
            texts = [c0.get("text")]
        return c0.get("finish_reason"), ct, texts
    meta = rec.get("meta_info")
    if isinstance(meta, dict):
        fr = meta.get("finish_reason")
        fr = fr.get("type") if isinstance(fr, dict) else fr
        return fr, meta.get("completion_tokens"), [rec.get("text")]
    usage = rec.get("usage")
    if isinstance(usage, dict) and "completion_tokens" in usage:
        ct = usage["completion_tokens"]
    else:
        ct = rec.get("completion_tokens")
    text = next((rec[k] for k in TEXT_KEYS if isinstance(rec.get(k), str)), None)
    return rec.get("finish_reason"), ct, [text]


def _repair_escapes(text: str) -> str:
    """Double every backslash that starts no valid JSON escape (walked left to right)."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "\\":
            out.append(text[i])
            i += 1
        elif text[i + 1 : i + 2] and text[i + 1] in '"\\/bfnrt':
            out.append(text[i : i + 2])
            i += 2
        elif (
            text[i + 1 : i + 2] == "u"
            and all(c in "0123456789abcdefABCDEF" for c in text[i + 2 : i + 6])
            and len(text) >= i + 6
        ):
            out.append(text[i : i + 6])
            i += 6
        else:
            out.append("\\\\")
            i += 1
    return "".join(out)


def parse_line(raw: bytes):
    """The README's content rule: strict json.loads, else string content repaired; None if neither."""
    try:
        return json.loads(raw.decode("utf-8")), False
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(_repair_escapes(raw.decode("utf-8", "surrogateescape")), strict=False), True
    except (ValueError, RecursionError):
        return None, True


def reference_counts(data: bytes):
    """(lines, malformed, counts rows) from json.loads on every complete line (content rule)."""
    counts, lines, malformed = {}, 0, 0
    for raw in data.split(b"\n")[:-1]:
        lines += 1
        if not raw.strip(b" \t\r"):  # blank: skipped by jq and pandas, counted apart
            continue
        obj, repaired = parse_line(raw)
        if not isinstance(obj, dict):
            malformed += 1
            continue
        fr, ct, texts = _completion_fields(obj)
        fr = fr if isinstance(fr, str) else None
        if repaired and fr is not None and any(0xDC80 <= ord(c) <= 0xDCFF for c in fr):
            malformed += 1  # an invalid UTF-8 byte in finish_reason
            continue
        if fr is not None:  # a lone surrogate (JSON "\\ud800") counts as U+FFFD, storable text
            fr = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in fr)
        if type(ct) is int and 0 <= ct <= 1 << 40:
            key = (ct, fr, 0)
        elif ct is not None:  # a count that is negative, huge, a float or a bool: malformed
            malformed += 1
            continue
        else:
            key = (math.ceil(sum(len(t) for t in texts if isinstance(t, str)) / 4), fr, 1)
        counts[key] = counts.get(key, 0) + 1
    return lines, malformed, _rows(counts)


def _rows(counts):
    return sorted(([*k, n] for k, n in counts.items()), key=lambda r: (r[0], r[1] is not None, r[1] or "", r[2]))


# ---------------------------------------------------------------------------- generators
FRAGMENTS = [
    '"finish_reason": "length"',
    '"completion_tokens": 7',
    '\\"',
    "\\",
    "\\\\",
    '"',
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\n",
    "\t",
    "é",
    "中文",
    "\U0001f600",
    "\ud800",
    '{"type": "length"}',
    '"meta_info": {',
    '"choices": [{',
    "null",
    "\\u0041",
]
texts = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(FRAGMENTS)), max_size=6).map("".join)
reasons = st.one_of(st.sampled_from(["stop", "length", "abort", "tool_calls"]), st.none(), texts, st.integers(0, 3))
tokens = st.one_of(
    st.integers(0, 1 << 40),
    st.none(),
    st.just(-3),
    st.just(4.0),
    st.booleans(),
    st.just((1 << 40) + 1),
    st.just(1 << 63),
    st.just(10**23),
)
nested = st.fixed_dictionaries(
    {
        "finish_reason": reasons,
        "completion_tokens": tokens,
        "text": texts,
        "meta_info": st.fixed_dictionaries({"finish_reason": reasons}),
    }
)
STYLES = [(",", ":"), (", ", ": "), (" ,  ", " : "), (",\t", ":\t")]
SCHEMAS = ["flat", "flat_usage", "chat", "completion", "batch", "sglang"]


def build(schema, v, shape):
    """One record of `schema` from drawn values v; shape decides which optional keys exist."""
    fr, ct, text = v["fr"], v["ct"], v["text"]
    if schema in ("flat", "flat_usage"):
        rec = {"prompt": v["prompt"], "text": text, "finish_reason": fr}
        if schema == "flat_usage":
            rec["usage"] = {"prompt_tokens": 5, "completion_tokens": ct}
        else:
            rec["completion_tokens"] = ct
    elif schema in ("chat", "batch"):
        msg = {"role": "assistant", "content": text}
        if shape["reasoning"]:
            msg["reasoning_content"] = v["prompt"]
        rec = {
            "id": "chatcmpl-x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": msg, "finish_reason": fr}],
            "usage": {"prompt_tokens": 3, "completion_tokens": ct},
        }
        if schema == "batch":
            rec = {"id": "b1", "custom_id": v["prompt"][:5], "response": {"status_code": 200, "body": rec}}
    elif schema == "completion":
        rec = {"choices": [{"text": text, "index": 0, "finish_reason": fr}], "usage": {"completion_tokens": ct}}
    else:
        finish = {"type": fr, "length": 5} if shape["fr_object"] else fr
        rec = {"text": text, "meta_info": {"id": "q", "finish_reason": finish, "completion_tokens": ct}}
    if shape["nested"] is not None:  # a nested object carrying the same keys
        rec["extra"] = shape["nested"]
    for key in shape["drop"]:
        _drop(rec, key)
    return rec


def _drop(obj, key):
    if isinstance(obj, dict):
        obj.pop(key, None)
        for child in obj.values():
            _drop(child, key)
    elif isinstance(obj, list):
        for child in obj:
            _drop(child, key)


def ordered(obj, salt):
    """Same key order for every line of a shard (a writer's habit), shuffled per shard."""
    if isinstance(obj, dict):
        keys = sorted(obj, key=lambda k: zlib.crc32((salt + k).encode("utf-8", "surrogatepass")))
        return {k: ordered(obj[k], salt) for k in keys}
    if isinstance(obj, list):
        return [ordered(x, salt) for x in obj]
    return obj


def dumps(rec, shape):
    text = json.dumps(ordered(rec, shape["salt"]), separators=shape["style"], ensure_ascii=shape["ascii"])
    return text.encode("utf-8", "surrogatepass") + b"\n"  # lone surrogates -> invalid UTF-8


BROKEN_CONTENT = [
    b"\xe9",
    b"\xff\xfe",
    b"\xed\xa0\x80",
    b"\xc3",
    b"\x01",
    b"\x1f\t",
    b"\\q",
    b"\\u12",
    b"\\x41\xe4\xb8",
]


def corrupt_text(line: bytes, rec, shape, junk: bytes) -> bytes:
    """Insert `junk` just after the opening quote of the record's text (or first string) value."""
    text = next((t for t in _completion_fields(rec)[2] if isinstance(t, str)), None)
    enc = json.dumps(text, ensure_ascii=shape["ascii"]).encode("utf-8", "surrogatepass") if text else b'"'
    at = line.find(enc) + 1 if line.find(enc) > 0 else line.find(b'"') + 1
    return line[:at] + junk + line[at:]


values = st.fixed_dictionaries({"fr": reasons, "ct": tokens, "text": texts, "prompt": texts})
shapes = st.fixed_dictionaries(
    {
        "style": st.sampled_from(STYLES),
        "ascii": st.booleans(),
        "salt": st.text(max_size=3),
        "nested": st.one_of(st.none(), nested),
        "reasoning": st.booleans(),
        "fr_object": st.booleans(),
        "drop": st.lists(st.sampled_from(["finish_reason", "completion_tokens", "usage", "text"]), max_size=1),
        # a writer that does not escape: every line of the shard carries this in its text, so
        # templates are learned from repaired lines only
        "writer": st.one_of(st.none(), st.none(), st.sampled_from(BROKEN_CONTENT)),
    }
)


# ---------------------------------------------------------------------------- the property
def scan_all(path, budget):
    totals, offset, inode, lines, malformed = {}, 0, None, 0, 0
    while True:
        e = agent.scan_file(path, inode, offset, budget)
        assert e["error"] is None
        for t, fr, est, n in e["counts"]:
            totals[(t, fr, est)] = totals.get((t, fr, est), 0) + n
        lines, malformed = lines + e["lines"], malformed + e["malformed"]
        offset, inode = e["offset"], e["inode"]
        if e["pending_bytes"] == 0:
            return lines, malformed, _rows(totals)


@settings(max_examples=3 * settings.default.max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_path_counts_equal_json_loads(data):
    schema = data.draw(st.sampled_from(SCHEMAS))
    shape = data.draw(shapes)
    body = b""
    for _ in range(data.draw(st.integers(1, 12))):
        rec = build(schema, data.draw(values), shape)
        line = dumps(rec, shape)
        roll = data.draw(st.integers(0, 19))
        if roll == 0:  # another writer's shape in the same shard
            line = dumps(build(data.draw(st.sampled_from(SCHEMAS)), data.draw(values), data.draw(shapes)), shape)
        elif roll == 1:  # a writer died mid-line
            line = line[: data.draw(st.integers(0, max(0, len(line) - 2)))] + b"\n"
        elif roll == 2:  # a writer died mid-line and its restart appended the next record to it
            line = line[: data.draw(st.integers(0, max(0, len(line) - 2)))] + dumps(
                build(schema, data.draw(values), shape), shape
            )
        elif roll in (3, 4):  # a broken writer: bytes json.dumps never writes, inside the text
            line = corrupt_text(line, rec, shape, data.draw(st.sampled_from(BROKEN_CONTENT)))
        if shape.get("writer") is not None and roll not in (1, 2):
            line = corrupt_text(line, rec, shape, shape["writer"])
        body += line
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        expected = reference_counts(body)
        assert scan_all(path, 1 << 30) == expected
        assert scan_all(path, data.draw(st.integers(1, 4096))) == expected  # budget-split polls
    finally:
        os.unlink(path)


def test_the_property_exercises_the_template_path():
    """Guard against a vacuous pass: adversarial but same-shaped lines go through templates."""
    before = agent.STATE.line_stats["template"]
    nest = {"finish_reason": "length", "completion_tokens": 1, "text": "", "meta_info": {"finish_reason": "x"}}
    shape = {
        "style": (", ", ": "),
        "ascii": False,
        "salt": "s",
        "nested": nest,
        "reasoning": True,
        "fr_object": True,
        "drop": [],
    }
    vals = [
        {"fr": fr, "ct": i, "text": 'a \\" "finish_reason": "length" \\\\' * (i % 5) + "é", "prompt": "p\\\\"}
        for i, fr in enumerate(["stop", "length"] * 50)
    ]
    for schema in SCHEMAS:
        body = b"".join(dumps(build(schema, v, shape), shape) for v in vals)
        fd, path = tempfile.mkstemp(suffix=".jsonl")
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        try:
            assert scan_all(path, 1 << 30) == reference_counts(body)
        finally:
            os.unlink(path)
    assert agent.STATE.line_stats["template"] - before >= 5 * 95


def _broken_shard(schema, junk):
    """100 same-shaped lines, each with `junk` (a broken writer's bytes) in its text."""
    shape = {"style": (", ", ": "), "ascii": True, "salt": "s", "nested": None, "reasoning": True}
    shape.update(fr_object=True, drop=[])
    vals = [
        {"fr": fr, "ct": i, "text": 'said "hi" \\ caf\u00e9 JUNK ' * (1 + i % 5), "prompt": "p"}
        for i, fr in enumerate(["stop", "length"] * 50)
    ]
    return b"".join(dumps(build(schema, v, shape), shape).replace(b"JUNK", junk) for v in vals)


def test_broken_writer_lines_take_the_template_path():
    """A shard in which no line is valid JSON (raw control characters, invalid UTF-8, a bad
    escape in every text) still learns templates (issue 34: it went 25-32 MB/s through
    json.loads, line by line), and counts exactly what the reference counts."""
    for junk in (b"\t\x01", b"\xff", b"\xe4\xb8", b"\\q"):
        for schema in SCHEMAS:
            body = _broken_shard(schema, junk)
            before = agent.STATE.line_stats["template"]
            fd, path = tempfile.mkstemp(suffix=".jsonl")
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            try:
                expected = reference_counts(body)
                assert expected[1] == 0 and sum(r[3] for r in expected[2]) == 100, (junk, schema)
                assert scan_all(path, 1 << 30) == expected, (junk, schema)
            finally:
                os.unlink(path)
            assert agent.STATE.line_stats["template"] - before >= 95, (junk, schema)


LINE_PIECES = [b"a", b"\\", b"\\\\", b'\\"', b'"', b"\\u00e9", b"\\ud800", b"\\u12", b"\\uZZZZ", b"\\q", b"\\/"]
LINE_PIECES += [
    b"\t",
    b"\x00",
    b"\x01",
    b"\x1f",
    b"\x7f",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    "\u00e9".encode(),
    b"}",
    b",",
]


@settings(max_examples=4 * settings.default.max_examples, deadline=None)
@given(
    parts=st.lists(st.sampled_from(LINE_PIECES), max_size=12), key=st.lists(st.sampled_from(LINE_PIECES), max_size=2)
)
def test_counted_line_parse_equals_the_reference(parts, key):
    """The scanner's json.loads path (strict, then strict=False, then escapes repaired) reads
    every class of broken content (raw control characters, invalid UTF-8, bad and good escapes,
    lone surrogates, quotes that end a string early) exactly as the reference's one repair."""
    raw = b'{"' + b"".join(key) + b'": 1, "text": "' + b"".join(parts) + b'", "n": 2}'
    obj, repaired = scan._load_counted_line(raw)
    ref, ref_repaired = parse_line(raw)
    assert repr(obj) == repr(ref if isinstance(ref, dict) else None)
    assert repaired == ref_repaired


# ---------------------------------------------------------------------------- every format (#39)
@st.composite
def format_shard(draw):
    """A shard of one published format (tests/formatgen.py writes each from its provider's docs)
    with adversarial texts, one writer style and key order, and its truth from the drawn outcomes."""
    name = draw(st.sampled_from(list(formatgen.FORMATS)))
    fmt = formatgen.FORMATS[name]
    kinds = list(fmt.labels) + (["failed"] if fmt.failures else [])
    outs = []
    for i in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(kinds))
        toks = 0 if kind == "failed" else draw(st.integers(0, 40))
        reason = draw(st.sampled_from(fmt.failures)) if kind == "failed" else ""
        outs.append(
            formatgen.Outcome(kind, toks, draw(st.integers(0, 40)), f"id-{i}", draw(texts), draw(texts), reason)
        )
    shape = {"style": draw(st.sampled_from(STYLES)), "ascii": draw(st.booleans()), "salt": draw(st.text(max_size=3))}
    body = b"".join(dumps(fmt.write(o, i), shape) for i, o in enumerate(outs))
    return fmt, body, formatgen.truth_of(fmt, outs)


def _scan_formats(path, budget):
    """(completions, malformed, finish reasons, tokens, failed by reason) over budget-split polls."""
    offset, inode, lines, malformed, finish, tokens, failed = 0, None, 0, 0, Counter(), 0, Counter()
    while True:
        e = agent.scan_file(path, inode, offset, budget)
        for t, fr, est, n in e["counts"]:
            assert est == 0
            finish[fr] += n
            tokens += t * n
        failed.update(dict(map(tuple, e.get("failed") or [])))
        lines, malformed = lines + e["lines"], malformed + e["malformed"]
        offset, inode = e["offset"], e["inode"]
        if e["pending_bytes"] == 0:
            return lines, malformed, finish, tokens, failed


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shard=format_shard(), budget=st.integers(1, 4096))
def test_every_format_counts_what_it_was_written_with(shard, budget):
    """Each format's counts equal the generated truth on the template path, in one poll and in
    budget-split polls: label maps, token-ID lists, failed requests apart (#39)."""
    fmt, body, truth = shard
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body + body)  # the second copy is read by the templates the first taught
        want = (2 * truth.completions, 0, truth.finish + truth.finish, 2 * truth.tokens, truth.failed + truth.failed)
        assert _scan_formats(path, 1 << 30) == want, fmt.name
        assert _scan_formats(path, budget) == want, fmt.name
    finally:
        os.unlink(path)


LIST_PIECES = [
    b"0",
    b"1",
    b"9",
    b"17",
    b",",
    b", ",
    b" ",
    b", 1",
    b", 0",
    b"-",
    b"00",
    b"\t",
    b"\r",
    b"x",
    b"!",
    b"[",
    b"1.5",
    b"1e2",
]


@settings(max_examples=2000, deadline=None)
@given(parts=st.lists(st.sampled_from(LIST_PIECES), max_size=10), tail=st.integers(0, 3))
def test_a_token_id_list_is_counted_as_json_loads_reads_it(parts, tail):
    """vLLM's token_ids, read as a hole: the count is the list's length exactly when json.loads
    reads the bytes as a list of integers, and the line is no template hit otherwise (#39)."""
    body = b"".join(parts)
    try:
        items = json.loads(b"[" + body + b"]")
        want = len(items) if all(type(x) is int for x in items) else -1
        counted = len(items)  # the reference (count_key) counts any list: its length
    except ValueError:
        want = counted = -1
    line = b'{"outputs": [{"token_ids": [' + body + b'], "finish_reason": "stop"}]}'
    s = line.index(b"[", 13) + 1
    assert scan._list_items(line, s, s + len(body)) == want
    if b"]" not in body and b"[" not in body:  # through a template taught by a good line
        good = b'{"outputs": [{"token_ids": [1, 2], "finish_reason": "stop"}]}\n'
        fd, path = tempfile.mkstemp(suffix=".jsonl")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(good * (1 + tail) + line + b"\n")
            e = agent.scan_file(path, None, 0, 1 << 30)
            assert e["malformed"] == (counted < 0) and e["lines"] == 2 + tail
            merged = {(2, "stop", 0): 1 + tail}
            if counted >= 0:
                merged[(counted, "stop", 0)] = merged.get((counted, "stop", 0), 0) + 1
            assert sorted(e["counts"]) == sorted([*k, n] for k, n in merged.items())
        finally:
            os.unlink(path)


@pytest.mark.parametrize("n_ids", [1, 4096, 70_000])
@pytest.mark.parametrize("damage", [None, "zero", "leading zero", "no space", "empty item"])
def test_a_long_token_id_list_is_counted_as_json_loads_reads_it(n_ids, damage):
    """Lists as vLLM writes them (json.dumps: ", " between IDs), past the class pass's 65,537
    items too, with an item 0, and with one flaw json.loads rejects near the end (#39)."""
    rng = random.Random(n_ids)
    ids = [rng.randrange(1, 150_000) for _ in range(n_ids)]
    if damage == "zero":
        ids[-1 if n_ids == 1 else n_ids // 2] = 0
    body = json.dumps(ids)[1:-1].encode()
    if damage == "leading zero":
        body = body[:-8] + body[-8:].replace(b", ", b", 0", 1) if n_ids > 1 else b"0" + body
    elif damage == "no space":
        body = body[:-8] + body[-8:].replace(b", ", b",1 ", 1) if n_ids > 1 else body + b",1 2"
    elif damage == "empty item":
        body = body + b", , 5"
    try:
        want = len(json.loads(b"[" + body + b"]"))
    except ValueError:
        want = -1
    assert (want == -1) == (damage not in (None, "zero"))
    line = b'{"token_ids": [' + body + b"]}"
    assert scan._list_items(line, 15, 15 + len(body)) == want
    assert scan._list_items(bytearray(line), 15, 15 + len(body)) == want


def _json_list_items(body):
    """The reference for a list body: its length when json.loads reads it as a list of integers, else -1."""
    try:
        items = json.loads(b"[" + body + b"]")
    except ValueError:
        return -1
    return len(items) if all(type(x) is int for x in items) else -1


# Bytes a damaged token-ID list could hold: the list's own, JSON's other number bytes, whitespace (no
# newline: it ends the line),
# brackets and quotes (a nested list, a string item), and a byte outside ASCII.
MUTATION_BYTES = b'0123456789, -+.eE\t\r[]"x\xc3'


@settings(max_examples=3000, deadline=None)
@given(
    ids=st.lists(st.integers(0, 150_000), min_size=1, max_size=40),
    edits=st.lists(
        st.tuples(
            st.sampled_from(("insert", "delete", "replace")), st.integers(0, 1 << 16), st.sampled_from(MUTATION_BYTES)
        ),
        max_size=3,
    ),
    count=st.booleans(),
)
def test_the_pair_check_decides_a_damaged_list_as_json_loads(ids, edits, count):
    """_list_items' pair check (the big-integer one) on json.dumps lists with up to three bytes
    inserted, deleted or replaced: the count is json.loads' exactly, and -1 where json.loads
    rejects the list (an empty item, a leading zero, a float, a sign, a missing space, a nested
    list, a string item), in a bytes line and in the reader's bytearray (#39 item 4)."""
    body = bytearray(json.dumps(ids)[1:-1].encode())
    for op, at, b in edits:
        i = at % (len(body) + 1)
        if op == "insert":
            body[i:i] = bytes([b])
        elif body and i < len(body):
            body[i : i + 1] = b"" if op == "delete" else bytes([b])
    body = bytes(body)
    want = _json_list_items(body)
    line = b'{"outputs": [{"token_ids": [' + body + b'], "text": "\\"token_ids\\": [1, 2]"}]}'
    s = line.index(b"[", 13) + 1
    for buf in (line, bytearray(line)):
        got = scan._list_items(buf, s, s + len(body), count)
        assert (got if count else min(got, 0)) == (want if count else min(want, 0)), body


@pytest.mark.parametrize(
    "body",
    [
        b"1",
        b"7, 10, 100, 1000",  # zeros inside items
        b"1, 0",  # a token ID 0 (the pair check passes it on)
        b"0, 1",
        b"1, 01",  # a leading zero
        b"1,2",  # no space: valid JSON
        b"1 ,2",
        b"1,  2",
        b"1, , 2",  # an empty item
        b"1, 2,",
        b", 1",
        b"1, -2",
        b"1, 2.0",
        b"1, 2e3",
        b"1, [2]",
        b'1, "2"',
        b"1, 2 ",
        b"1,\t2",
        b"1, 2\r",
        b"1 2",
        b"12" * 2000,  # one item of 4,000 digits (under json.loads' 4,300-digit limit since Python 3.11)
        b"7" * 4300,  # at the limit: read
        b"7" * 4301,  # past it: json.loads refuses the line
        b"1, " + b"7" * 4301 + b", 3",
        b"1," + b"7" * 4301 + b",3",  # written without spaces (the fallback's check)
        b"0, " + b"7" * 4400,  # an item 0 first (the fallback)
        b", ".join([b"123456"] * 700 + [b"9" * 4301] + [b"42"] * 700),  # among short items, off the check points
        b", ".join([b"123456"] * 700 + [b"9" * 4300] + [b"42"] * 700),
        b", ".join([b"5"] * 3000 + [b"8" * 9000]),  # the last item, across two check points
        b", ".join(b"%d" % (i % 150_000 + 1) for i in range(70_000)),  # past the masks' first 64 KiB
    ],
)
@pytest.mark.parametrize("bit_count", [True, False])
def test_the_pair_check_on_lists_written_otherwise(body, bit_count, monkeypatch):
    """Lists json.dumps would not write, and long ones (#39 item 4): the count is json.loads',
    with int.bit_count and, as on Python 3.8-3.9, without (the commas counted)."""
    monkeypatch.setattr(scan, "_BIT_COUNT", bit_count)
    line = b'{"token_ids": [' + body + b"]}"
    assert scan._list_items(line, 15, 15 + len(body)) == _json_list_items(body)


def test_the_pair_check_takes_json_dumps_lists():
    """A json.dumps list of IDs from 1 up is decided by the pair check: the fallback is not called."""
    rng = random.Random(3)
    body = json.dumps([rng.randrange(1, 150_000) for _ in range(5000)])[1:-1].encode()
    calls = []
    real = scan._list_items_sep
    scan._list_items_sep = lambda b: calls.append(b) or real(b)
    try:
        assert scan._list_items(body, 0, len(body)) == 5000
        assert scan._list_items(body, 0, len(body), False) >= 0
        assert scan._list_items(body + b", 0", 0, len(body) + 3) == 5001  # an ID 0: the fallback
    finally:
        scan._list_items_sep = real
    assert len(calls) == 1


def _state_after_scan(body):
    """(scan_all's counts, the shard's template state, template lines) for a shard of `body`."""
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        before = agent.STATE.line_stats["template"]
        counts = scan_all(path, 1 << 30)
        state = scan.TEMPLATES.get(path, os.stat(path).st_ino)
        return counts, (len(state[0]), len(state[1]), state[4]), agent.STATE.line_stats["template"] - before
    finally:
        scan.TEMPLATES.forget(path)
        os.unlink(path)


def test_a_shard_its_strict_plans_read_compiles_no_tolerant_plan():
    """Same-shaped lines (one writer): every line after the first takes the strict plan, so the
    tolerant one, ~3x the compile time, is never built (#39 item 4: a small shard's fixed cost)."""
    rng = random.Random(5)
    shape = {"style": (", ", ": "), "ascii": True, "salt": "", "nested": None, "reasoning": False}
    shape.update(fr_object=False, drop=[])
    vals = [
        {"fr": rng.choice(["stop", "length"]), "ct": rng.randrange(1, 5000), "text": "x" * i, "prompt": "p"}
        for i in range(60)
    ]
    body = b"".join(dumps(build("chat", v, shape), shape) for v in vals)
    counts, (strict, tolerant, misses), template_lines = _state_after_scan(body)
    assert counts == reference_counts(body)
    assert (strict, tolerant, misses, template_lines) == (1, 0, 0, 59)


def test_lines_the_strict_plans_miss_turn_the_tolerant_plans_on():
    """A writer whose whitespace varies line by line (more layouts than MAX_TEMPLATES): the
    completion lines the strict plans miss take json.loads, and once TOLERANT_AFTER_MISSES
    have, the tolerant plans are compiled and read the rest; the counts stay json.loads' (#39)."""
    rng = random.Random(6)
    styles = [
        (a + "," + b, c + ":" + d) for a in ("", " ") for b in ("", " ", "\t") for c in ("", " ") for d in ("", " ")
    ]
    lines = []
    for i in range(300):
        shape = {"style": rng.choice(styles), "ascii": True, "salt": "", "nested": None, "reasoning": False}
        shape.update(fr_object=False, drop=[])
        v = {"fr": rng.choice(["stop", "length"]), "ct": rng.randrange(1, 5000), "text": "y" * i, "prompt": "p"}
        lines.append(dumps(build("chat", v, shape), shape))
    body = b"".join(lines)
    counts, (strict, tolerant, misses), template_lines = _state_after_scan(body)
    assert counts == reference_counts(body)
    assert misses == scan.TOLERANT_AFTER_MISSES and tolerant >= 1 and strict == scan.MAX_TEMPLATES
    assert template_lines >= 300 - scan.MAX_TEMPLATE_BUILDS - scan.TOLERANT_AFTER_MISSES


# The template builder's tokenizer as it was written first: a string as one alternation per byte,
# every integer of a list its own token (scan._collapse_int_lists joined them after).
_TOKEN_RE_ALTERNATION = re.compile(
    rb'([ \t\r]*)(?:("(?:[^"\\]|\\.)*")|(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)'
    rb"|(true|false|null)|([{}\[\]:,]))"
)
TOKEN_PIECES = [
    b'"',
    b"\\",
    b"\\\\",
    b'\\"',
    b"a",
    b"\xc3\xa9",
    b" ",
    b"\t",
    b"\n",
    b":",
    b",",
    b", ",
    b"{",
    b"[",
    b"]",
]
TOKEN_PIECES += [b"1", b"17", b"0", b"01", b"-", b"-2", b"1.5", b"1.", b"e5", b"null", b"[1, 2]", b"[]"]
# near misses of a list of integers: a leading zero, a trailing comma, no comma, a float, a sign
TOKEN_PIECES += [b"[1, 01]", b"[1,]", b"[1 2]", b"[-0 ,\t1 ]", b"[1, 2.5]", b"[01]", b"[1, -]", b"[1, [2]]"]


@settings(max_examples=4000, deadline=None)
@given(raw=st.lists(st.sampled_from(TOKEN_PIECES), max_size=24))
def test_the_tokenizer_reads_as_the_alternation_form(raw):
    """scan._tokens (the unrolled string loop, a list of integers as one token) gives the
    builder the tokens the per-byte alternation and _collapse_int_lists gave it (#39 item 4),
    on runs of quotes, backslashes, escapes, numbers and lists."""
    line = b"".join(raw)
    want = scan._collapse_int_lists([m.groups() for m in _TOKEN_RE_ALTERNATION.finditer(line)])
    assert scan._collapse_int_lists(scan._tokens(line)) == want
