"""Property test: per-line fields (#33) counted on the template path equal the json.loads path's.

The reference is the scanner's json.loads path (a finish_reason_path override sends every line
there; fields.line_values and fields.answer_state are the reference rules). Each example is a
chat shard of one writer's habit (separators, ensure_ascii, which keys) whose lines mostly hold
the usual kinds of value (the first line always), so the strict template's inline walk
(scan._walk) counts most of them, and some hold others: IDs that are empty, null, true, integers or escaped; prompt tokens that
are null, strings, floats or past 2^40; counts of 13 digits (a valid 10^12 + 5 and an invalid
2^40 + 1); `length` stops with and without an answer. Those take the tolerant template, the
json.loads path or the walk's `length` branch, and every figure must still match.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runhealth.node import fields, scan

FORCE_JSON = {"finish_reason_path": "choices.0.finish_reason"}
ODD_IDS = st.one_of(st.sampled_from(["", 'q"1', "a\\b", "é9"]), st.none(), st.booleans(), st.integers(-5, 5))
ODD_PT = st.sampled_from([None, "12", 2.5, -1, (1 << 40) + 1, 10**13, True])
ODD_CT = st.sampled_from([10**12 + 5, (1 << 40) + 1, 0])
CONTENT = st.sampled_from(
    ["ok", "", "x", "<think>never closed", "<think>a</think> b", "<think>a</think>", "x\\u003cthink>", None]
)
REASONING = st.sampled_from(["thinking", "", None])
line_values = st.fixed_dictionaries(
    {
        "odd": st.integers(0, 9),  # 0-2: one field holds an odd value
        "id": st.one_of(st.integers(0, 40).map("p{}".format), st.integers(0, 40)),
        "odd_id": ODD_IDS,
        "id2": st.one_of(st.sampled_from(["chatcmpl-1", "", "c\\d"]), st.none(), st.integers(0, 3)),
        "pt": st.integers(0, 70000),
        "odd_pt": ODD_PT,
        "ct": st.integers(1, 4096),
        "odd_ct": ODD_CT,
        "fr": st.sampled_from(["stop", "stop", "length", "tool_calls", None]),
        "content": CONTENT,
        "reasoning": REASONING,
    }
)
shapes = st.fixed_dictionaries(
    {
        "sep": st.sampled_from([(", ", ": "), (",", ":")]),
        "ascii": st.booleans(),
        "id_key": st.sampled_from(["id", "custom_id", "request_id", None]),
        "id_key2": st.sampled_from([None, "id", "prompt_id"]),  # a second ID candidate (tried before or after)
        "pt": st.booleans(),
        "reasoning": st.booleans(),
        "paths": st.sampled_from(
            [{}, {}, {"prompt_id_path": "custom_id"}, {"prompt_tokens_path": "usage.prompt_tokens"}]
        ),
    }
)


def record(shape, v):
    """One line of the shard: the shape's keys, v's values (v["odd"] picks a field to make odd)."""
    msg = {"role": "assistant", "content": v["content"]}
    if shape["reasoning"]:
        msg["reasoning_content"] = v["reasoning"]
    rec = {"object": "chat.completion"}
    if shape["id_key2"] and shape["id_key2"] != shape["id_key"]:
        rec[shape["id_key2"]] = v["id2"]
    if shape["id_key"]:
        rec[shape["id_key"]] = v["odd_id"] if v["odd"] == 0 else v["id"]
    rec["choices"] = [{"index": 0, "message": msg, "finish_reason": v["fr"]}]
    usage = {"completion_tokens": v["odd_ct"] if v["odd"] == 2 else v["ct"]}
    if shape["pt"]:
        usage["prompt_tokens"] = v["odd_pt"] if v["odd"] == 1 else v["pt"]
    rec["usage"] = usage
    return json.dumps(rec, separators=shape["sep"], ensure_ascii=shape["ascii"]) + "\n"


def scan_whole(path, paths, budget=1 << 30):
    """The shard counted in polls of `budget` bytes: (lines, malformed, counts, fields)."""
    offset, inode, lines, malformed, counts, found = 0, None, 0, 0, {}, None
    while True:
        e = scan.scan_file(path, inode, offset, budget, paths)
        assert e["error"] is None
        for t, fr, est, n in e["counts"]:
            counts[(t, fr, est)] = counts.get((t, fr, est), 0) + n
        lines, malformed, found = lines + e["lines"], malformed + e["malformed"], fields.merge(found, e.get("fields"))
        offset, inode = e["offset"], e["inode"]
        if e["pending_bytes"] == 0:
            return lines, malformed, sorted(counts.items(), key=repr), found


def compare(path, paths, budget):
    scan.TEMPLATES.forget(path)
    fast = scan_whole(path, paths, budget)
    scan.TEMPLATES.forget(path)
    slow = scan_whole(path, {**paths, **FORCE_JSON})
    assert fast == slow  # id_fields too: each path names the ID fields its lines held IDs at


@settings(max_examples=4 * settings.default.max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, vals=st.lists(line_values, min_size=1, max_size=25), budget=st.integers(200, 1 << 30))
def test_template_fields_equal_the_json_path(shape, vals, budget):
    # A shard's fields are on from the first parsed line that has one (fields.has_fields); the
    # template path parses only lines no template takes, so the first line is a usual one
    # with an ID or prompt tokens: both paths count fields from there.
    shape = dict(shape, pt=shape["pt"] or not shape["id_key"])
    vals = [dict(vals[0], odd=9, content="ok")] + vals
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(record(shape, v) for v in vals))
        compare(path, shape["paths"], budget)
    finally:
        scan.TEMPLATES.forget(path)
        os.unlink(path)


def test_the_inline_walk_counts_the_usual_lines(tmp_path):
    """Guard against a vacuous pass: a shard of usual lines is counted by the strict template's
    inline walk, with its IDs in line order as id_hash gives them (little-endian on the wire)."""
    shape = {"sep": (", ", ": "), "ascii": False, "id_key": "id", "pt": True, "reasoning": True, "paths": {}}
    shape["id_key2"] = None
    vals = [
        {"odd": 9, "id": f"p{i % 7}", "pt": 100 + i, "ct": 1 + i, "fr": "length" if i % 5 == 0 else "stop"}
        for i in range(60)
    ]
    for v in vals:
        v.update(
            id2=None, odd_id=None, odd_pt=None, odd_ct=None, content="<think>x" if v["ct"] % 2 else "ok", reasoning="r"
        )
    path = tmp_path / "usual.jsonl"
    path.write_text("".join(record(shape, v) for v in vals), encoding="utf-8")
    before = dict(scan.LINE_STATS)
    whole = scan.scan_file(str(path), None, 0, 1 << 30)
    assert scan.LINE_STATS["template"] - before["template"] == 59  # all but the first line
    plan = scan.TEMPLATES.get(str(path), path.stat().st_ino)[0][0]
    assert plan.walk is not None  # the inline walk, not _match_fields
    ids = struct.unpack("<60Q", base64.b64decode(whole["fields"]["ids"]))
    assert list(ids) == [fields.id_hash(b'"%s"' % v["id"].encode()) for v in vals]
    assert whole["fields"]["prompt_token_lines"] == 60
    compare(str(path), {}, 1 << 30)
    compare(str(path), {}, 2000)  # polls of a few lines each


def _usual(i, id_, id2=None):
    return {"odd": 9, "id": id_, "id2": id2, "odd_id": None, "pt": 5 + i, "odd_pt": None, "ct": 7 + i}


CANDIDATE_CASES = [  # (second ID key, [(ID, second ID) per line]); "prompt_id" is tried before "id"
    ("prompt_id", [("p1", None), ("p2", None), ("p3", "x")]),  # the walk reads id; a tolerant line prompt_id
    ("prompt_id", [("p1", ""), ("p2", "x"), ("p3", "")]),  # "" learned: no walk may skip prompt_id
    (None, [(None, None), ("x", None), (3, None)]),  # no ID learned: tolerant lines name theirs
    ("id", [("p1", 4), ("p2", None)]),  # custom_id... here request_id, after id
]


def test_every_id_candidate_layout_matches_the_json_path(tmp_path):
    """The walk's choice among several ID candidates (scan._walk) and the reply's id_fields."""
    for n, (key2, ids) in enumerate(CANDIDATE_CASES):
        shape = {"sep": (", ", ": "), "ascii": True, "id_key": "id", "id_key2": key2, "pt": True}
        shape.update(reasoning=False, id_key="request_id" if key2 == "id" else "id")
        lines = [dict(_usual(i, a, b), fr="stop", content="ok", reasoning=None) for i, (a, b) in enumerate(ids * 3)]
        path = tmp_path / f"case{n}.jsonl"
        path.write_text("".join(record(shape, v) for v in lines), encoding="utf-8")
        for budget in (1 << 30, 300):
            compare(str(path), {}, budget)
        # templates learned in an earlier poll: this poll's id_fields come from the walk alone
        first = len(record(shape, lines[0]))
        later = []
        for paths in ({}, FORCE_JSON):
            scan.TEMPLATES.forget(str(path))
            e = scan.scan_file(str(path), None, 0, first, paths)
            later.append(scan.scan_file(str(path), e["inode"], e["offset"], 1 << 30, paths)["fields"])
        assert later[0] == later[1], n
