"""Issue 39: every published output format read exactly with no config, failed requests apart.

The shards come from tests/formatgen.py: one writer per format, written from the provider's
public documentation (each names its page), and the truth is added up from the generated
outcomes, never read back from the lines. Each format is checked through `runhealth scan
--json`, through the agent's scan on the template path (the fast path: most lines matched by a
template, with exactly the counts of the first, json.loads-taught scan), through sampling, and
all of them at once through a real sshd node and as one mixed-format run.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import sys
from collections import Counter
from pathlib import Path

import formatgen
import pytest
from formatgen import CEILING, FORMATS, Truth

from runhealth import cli
from runhealth.collect.collector import poll_request
from runhealth.errors import ConfigError
from runhealth.node import agent, fields, formats, scan
from runhealth.remote import make_transport
from runhealth.settings.config import parse_config

N = 600
README = Path(__file__).resolve().parent.parent / "README.md"


def _hashes(ids: list[str]) -> list[int]:
    return sorted(fields.id_hash(b'"' + i.encode() + b'"') for i in ids)


def _decoded(b64: str) -> list[int]:
    raw = base64.b64decode(b64)
    return sorted(struct.unpack(f"<{len(raw) // 8}Q", raw))


def _entry_truth(entry: dict, truth: Truth) -> None:
    """One scan entry against the generated truth: every figure a shard entry carries."""
    by_reason: Counter = Counter()
    for _tokens, reason, estimated, n in entry["counts"]:
        by_reason[reason] += n
        assert estimated == 0  # each format's own token count, never the chars/4 estimate
    assert dict(by_reason) == dict(truth.finish)
    assert entry["lines"] == truth.completions == sum(r[3] for r in entry["counts"])
    assert entry["tokens"] == truth.tokens and entry["malformed"] == 0
    assert dict(map(tuple, entry.get("failed") or [])) == dict(truth.failed)
    assert _decoded(entry.get("failed_ids", "")) == _hashes(truth.failed_ids)
    f = entry.get("fields") or {}
    assert _decoded(f.get("ids", "")) == _hashes(truth.ids)
    assert sum(n for _t, n in f.get("reasoned", [])) == truth.reasoned
    assert sum(n for _t, n in f.get("no_answer", [])) == truth.never_answered


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_through_the_cli(tmp_path, capsys, name):
    truth = formatgen.write_shard(tmp_path / "shard.jsonl", name, N)
    assert cli.main(["scan", str(tmp_path / "*.jsonl"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completions"] == truth.completions and report["unparseable"] == 0
    assert report["finish_reasons"] == dict(truth.finish)
    assert report["ceiling"] == CEILING and report["ceiling_source"] == "detected"
    assert report["at_ceiling"] == truth.cut > 0 and report["length_below_ceiling"] == 0
    assert report["tokens_total"] == truth.tokens and report["estimated_count"] == 0
    assert report["failed_requests"] == sum(truth.failed.values())
    assert report["failed_by_reason"] == dict(truth.failed)
    if truth.ids:  # prompts answered: the distinct IDs of the completions, never the failed ones'
        assert report["fields"]["prompts"]["answered"] == len(set(truth.ids))
    if FORMATS[name].has_reasoning:
        unanswered = report["fields"]["unanswered"]
        assert unanswered["length_stops"] == truth.cut
        assert (unanswered["with_reasoning"], unanswered["never_answered"]) == (truth.reasoned, truth.never_answered)


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_is_read_on_the_template_path(tmp_path, name):
    """A first scan learns templates from parsed lines; a second scan of the same bytes (new
    templates, fresh counts) matches nearly every line by template and counts exactly the same."""
    path = tmp_path / "shard.jsonl"
    truth = formatgen.write_shard(path, name, N)
    for _ in range(2):
        before = agent.STATE.line_stats["template"]
        entry = agent.scan_file(str(path), None, 0, 1 << 40)
        _entry_truth(entry, truth)
    assert agent.STATE.line_stats["template"] - before >= 0.97 * truth.completions


def test_failed_lines_are_no_samples_and_samples_show_the_mapped_reason(tmp_path):
    path = tmp_path / "b.jsonl"
    fmt = FORMATS["anthropic-batch"]
    outs = formatgen.outcomes(fmt, 300, seed=5)
    path.write_text("".join(line + "\n" for line in formatgen.lines(fmt, outs)), encoding="utf-8")
    truth = formatgen.truth_of(fmt, outs)
    every = agent.handle({"op": "sample", "globs": [str(path)], "n": 2000, "seed": 1})  # every line drawn
    assert every["ok"] and len(every["samples"]) == truth.completions  # the failed never drawn
    assert Counter(s["finish_reason"] for s in every["samples"]) == truth.finish
    cut = agent.handle({"op": "sample", "globs": [str(path)], "n": 20, "seed": 2, "finish_reason": "length"})
    assert cut["samples"] and all(s["finish_reason"] == "length" and s["tokens"] == CEILING for s in cut["samples"])
    for s in cut["samples"]:  # the thinking, then the answer: where it was cut
        o = outs[s["line_no"] - 1]
        assert o.kind == "cut" and s["text_tail"] == "\n\n".join(([o.reasoning] if o.reasoning else []) + [o.answer])


def test_a_mixed_format_shard_and_run(tmp_path, capsys):
    """Lines of every format interleaved in one shard, plus one shard per format: one run."""
    total, mixed = Truth(), []
    for k, name in enumerate(FORMATS):
        fmt = FORMATS[name]
        outs = formatgen.outcomes(fmt, 120, seed=100 + k)
        mixed.append(formatgen.lines(fmt, outs))
        total.add(formatgen.truth_of(fmt, outs))
        total.add(formatgen.write_shard(tmp_path / f"{k}.jsonl", name, 150, seed=200 + k))
    interleaved = [line for group in zip(*mixed, strict=True) for line in group]
    (tmp_path / "mixed.jsonl").write_text("".join(x + "\n" for x in interleaved), encoding="utf-8")
    assert cli.main(["scan", str(tmp_path / "*.jsonl"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completions"] == total.completions and report["finish_reasons"] == dict(total.finish)
    assert report["at_ceiling"] == total.cut and report["tokens_total"] == total.tokens
    assert report["failed_by_reason"] == dict(total.failed)


def test_every_format_through_a_real_sshd_node(tmp_path, sshd_node):
    truths = {name: formatgen.write_shard(tmp_path / f"{name}.jsonl", name, 300, seed=7) for name in FORMATS}
    node = sshd_node("127.0.0.39").node_config(name="fmt", gpu="off", shards=[str(tmp_path / "*.jsonl")])
    transport = make_transport(node)
    try:
        reply = transport.request(poll_request(node, {}, 1 << 30), 60)
    finally:
        transport.close()
    assert reply["ok"], reply
    files = reply["shards"]["files"]
    assert sorted(files) == sorted(str(tmp_path / f"{name}.jsonl") for name in FORMATS)
    for name, truth in truths.items():
        _entry_truth(files[str(tmp_path / f"{name}.jsonl")], truth)


def test_a_configured_finish_reason_path_maps_its_cut_labels(tmp_path):
    path = tmp_path / "x.jsonl"
    rows = [{"out": {"why": w, "n": n}, "text": "t"} for w, n in [("budget", 64), ("done", 3), ("budget", 64)] * 5]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shards = {"globs": [str(path)], "finish_reason_path": "out.why", "completion_tokens_path": "out.n"}

    def reasons(extra):
        reply = agent.handle({"op": "poll", "gpu": "off", "shards": {**shards, **extra}})
        return Counter({r[1]: r[3] for r in reply["shards"]["files"][str(path)]["counts"]})

    assert reasons({}) == {"budget": 10, "done": 5}  # not known: kept, never guessed
    assert reasons({"cut_labels": ["budget"]}) == {"length": 10, "done": 5}
    assert reasons({"cut_labels": []}) == {"budget": 10, "done": 5}  # dropped again: maps restored


def test_cut_labels_in_the_config_reach_the_poll_request(tmp_path):
    raw = {
        "run": {"name": "r", "cut_labels": ["budget"]},
        "nodes": [{"name": "n", "host": "local", "shards": ["/x/*.jsonl"]}],
    }
    config = parse_config(raw, "t.toml")
    assert config.cut_labels == ["budget"]
    assert poll_request(config.nodes[0], {}, cut_labels=config.cut_labels)["shards"]["cut_labels"] == ["budget"]
    with pytest.raises(ConfigError, match=r"t\.toml: \[run\].*cut_labels"):
        parse_config({**raw, "run": {"name": "r", "cut_labels": ["ok", 3]}}, "t.toml")


def test_records_that_only_look_like_a_batch_envelope_are_completions(tmp_path):
    """A flat record with a `custom_id` and a `response` text, or a `result` object of its own,
    is a completion: only the envelopes' own failure signals make a failed request."""
    path = tmp_path / "flat.jsonl"
    rows = [
        {"custom_id": "a", "response": "the answer", "finish_reason": "length", "completion_tokens": 9},
        {"custom_id": "b", "result": {"type": "graded", "score": 1}, "finish_reason": "stop", "completion_tokens": 3},
        {"request": {"q": 1}, "status": "ok", "finish_reason": "stop", "completion_tokens": 4},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = agent.scan_file(str(path), None, 0, 1 << 40)
    assert "failed" not in entry and entry["lines"] == 3
    assert sorted(entry["counts"]) == [[3, "stop", 0, 1], [4, "stop", 0, 1], [9, "length", 0, 1]]


def test_failed_reasons_are_bounded_per_scan(tmp_path):
    path = tmp_path / "f.jsonl"
    lines = [
        {"custom_id": f"c{i}", "response": None, "error": {"code": f"code_{i % 50}", "message": "x"}}
        for i in range(200)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    entry = agent.scan_file(str(path), None, 0, 1 << 40)
    assert len(entry["failed"]) == formats.MAX_FAILED_REASONS and sum(n for _r, n in entry["failed"]) == 200
    assert entry["lines"] == 0 and entry["counts"] == []


# ---------------------------------------------------------------------------- the README's table
TABLE_START = "<!-- formats-table: generated from runhealth/node/formats.py (formats.markdown()); tests/test_formats.py fails when this differs -->"


def test_the_readme_format_table_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    found = re.search(re.escape(TABLE_START) + r"\n(.*?)\n<!-- /formats-table -->", text, re.S)
    assert found, "README.md lost its <!-- formats-table --> markers"
    assert found.group(1).strip() == formats.markdown().strip()
    for name in FORMATS:  # every fixture's format is in it, by the entry that reads it
        assert scan.locate(
            json.loads(formatgen.lines(FORMATS[name], formatgen.outcomes(FORMATS[name], 1, 3))[0])
        ).body.name in found.group(1)


if __name__ == "__main__":  # print the table: python tests/test_formats.py
    sys.stdout.write(formats.markdown())
