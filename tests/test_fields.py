"""Per-line fields (#33 items 1, 3, 4, 5): prompt IDs, unanswered cuts, labels that lie,
context-window stops and groups, counted exactly by the real scanner against generated truth.

The demo simulator knows what it wrote (demo.FieldTruth); every figure is checked against it
through the template engine, the json.loads path (a finish_reason_path override forces it),
incremental polls, worker processes, the store and a real sshd node.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys

import pytest

from runhealth import ingest
from runhealth.analysis import fieldfigures
from runhealth.cli import scan_paths
from runhealth.collect.collector import Collector
from runhealth.demo import GROUP_PATH, MAX_MODEL_LEN, Simulator
from runhealth.node import agent, backfill, scan
from runhealth.screens import fieldmodel, overview
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store

CEILING = 4096
FORCE_JSON = {"finish_reason_path": "choices.0.finish_reason"}  # overrides send every line to json.loads


def demo_shards(tmp_path, n=2500, seed=7):
    sim = Simulator(tmp_path, seed=seed)
    sim.shard_dir.mkdir(parents=True)
    sim.write_backlog(n)
    return sim


def figures_of(sim, glob, paths=None):
    totals = fieldfigures.FieldTotals()
    hist, _, _ = scan_paths([glob], None, 1, {"group_path": GROUP_PATH} if paths is None else paths, totals)
    rows = [{"tokens": t, "finish_reason": fr, "estimated": e, "count": n} for t, fr, e, n in hist.rows()]
    return fieldfigures.figures(totals, rows, CEILING, sim.fields.issued, MAX_MODEL_LEN)


def assert_matches_truth(f, truth):
    p = f["prompts"]
    assert (p["answered"], p["answered_more_than_once"]) == (truth.answered, truth.answered_twice)
    assert p["missing"] == truth.issued - truth.answered > 0 and truth.answered_twice > 0
    assert p["id_field"] == "custom_id" and p["lines_without_id"] == 0
    u = f["unanswered"]
    assert (u["never_answered"], u["with_reasoning"]) == (truth.never_answered, truth.reasoned_at_ceiling)
    assert u["cut_mid_answer"] == truth.length_at_ceiling - truth.never_answered > 0
    assert f["mislabelled"]["count"] == truth.mislabelled > 0
    assert f["context_stops"]["count"] == truth.context_stops > 0
    groups = {r["group"]: [r["completions"], r["length_stops"]] for r in f["groups"]["rows"]}
    assert groups == truth.groups and f["groups"]["field"] == GROUP_PATH
    # cut per group is the headline's rule (at the ceiling); the context window's stops apart (#41)
    g = f["groups"]
    assert g["counts"] == "cut" and {r["group"]: r["cut"] for r in g["rows"]} == truth.group_cuts
    assert sum(r["below_ceiling"] for r in g["rows"]) >= truth.context_stops > 0
    assert sum(r["cut"] for r in g["rows"]) == truth.length_at_ceiling == u["length_stops"]
    shares = [r["share"] for r in f["groups"]["rows"]]
    assert shares == sorted(shares, reverse=True) and len(set(shares)) == 4  # the most cut on top


def test_demo_fields_are_exact_on_the_template_path(tmp_path):
    sim = demo_shards(tmp_path)
    before = dict(agent.STATE.line_stats)
    f = figures_of(sim, str(sim.shard_dir / "*.jsonl"))
    assert agent.STATE.line_stats["template"] - before["template"] > 2000  # the fast path counted them
    assert_matches_truth(f, sim.fields)


def test_demo_fields_are_exact_on_the_json_path(tmp_path):
    sim = demo_shards(tmp_path, n=1200, seed=8)
    f = figures_of(sim, str(sim.shard_dir / "*.jsonl"), {"group_path": GROUP_PATH, **FORCE_JSON})
    assert_matches_truth(f, sim.fields)


def _odd_line(rng, i):
    """A line in one of many shapes: IDs of every type (or none), think tags, null texts,
    escapes, groups of every type, prompt tokens where the scanner looks and elsewhere."""
    ct = rng.choice([5, 300, 4096])
    msg = {"role": "assistant"}
    msg["content"] = rng.choice(["", "ok", "<think>never closed", "<think>a</think> b", None, "x\\u003cthink>"])
    msg["content"] = msg["content"].replace("\\u003c", "<") if isinstance(msg["content"], str) else msg["content"]
    if rng.random() < 0.6:
        msg[rng.choice(["reasoning_content", "reasoning"])] = rng.choice(["", "thinking", None, 'q"uote'])
    rec = {"choices": [{"index": 0, "message": msg, "finish_reason": "length" if ct == 4096 else "stop"}]}
    idv = rng.choice([f"p{rng.randint(0, 300)}", rng.randint(0, 300), "", None, "é" + str(i % 40), 'q"' + str(i % 9)])
    key = rng.choice(["custom_id", "id", "prompt_id", "request_id", None])
    if key:
        rec[key] = idv
    if rng.random() < 0.3:
        rec["metadata"] = {"id": rng.choice([f"m{i % 50}", None, 7]), "src": rng.choice(["a", "b", 3, True, None])}
    usage = {"completion_tokens": ct}
    if rng.random() < 0.7:
        usage["prompt_tokens"] = rng.choice([1, 900, 30000, None, "12"])
    rec["usage"] = usage
    return json.dumps(rec, ensure_ascii=rng.random() < 0.5)


def test_template_and_json_paths_agree_on_every_shape(tmp_path):
    rng = random.Random(3)
    shard = tmp_path / "odd.jsonl"
    shard.write_text("".join(_odd_line(rng, i) + "\n" for i in range(4000)), encoding="utf-8")
    for paths in ({}, {"group_path": "metadata.src"}, {"prompt_id_path": "metadata.id"}):
        scan.TEMPLATES.forget(str(shard))
        fast = scan.scan_file(str(shard), None, 0, 1 << 30, paths)
        slow = scan.scan_file(str(shard), None, 0, 1 << 30, {**paths, **FORCE_JSON})
        ff, sf = dict(fast["fields"]), dict(slow["fields"])
        assert set(ff.pop("id_fields")) >= set(sf.pop("id_fields"))  # templates also name the fields they capture
        assert fast["counts"] == slow["counts"] and ff == sf, paths
        assert fast["fields"]["id_lines"] > 0 and fast["fields"]["no_answer"]


def test_polls_that_follow_appends_count_every_line_once(tmp_path):
    sim = demo_shards(tmp_path, n=600, seed=9)
    glob = str(sim.shard_dir / "*.jsonl")
    state, parts = {}, []
    for _ in range(3):
        reply = agent.handle(
            {"op": "poll", "gpu": "off", "metrics_urls": [], "shards": {"globs": [glob], "state": state}}
        )
        for path, e in reply["shards"]["files"].items():
            state[path] = {"inode": e["inode"], "offset": e["offset"]}
            if e.get("fields"):
                parts.append(ingest.field_update(e["fields"]))
        sim.write_backlog(400)  # appended between polls
    reply = agent.handle({"op": "poll", "gpu": "off", "metrics_urls": [], "shards": {"globs": [glob], "state": state}})
    parts += [ingest.field_update(e["fields"]) for e in reply["shards"]["files"].values() if e.get("fields")]
    hashes: dict[int, int] = {}
    totals = fieldfigures.FieldTotals()
    for p in parts:
        fieldfigures.add_update(totals, p, hashes)
    assert totals.id_lines == sum(sim.fields.answers.values())
    assert (
        totals.id_lines + len(sim.fields.failed) > 1790
    )  # 1,800 lines, a malformed one or two; failed lines have no answer
    assert fieldfigures.hash_totals(hashes) == (sim.fields.answered, sim.fields.answered_twice)


def test_worker_processes_give_the_one_process_fields(tmp_path):
    sim = demo_shards(tmp_path, n=1500, seed=10)
    path = str(sim.shard_dir / "node1-gpu0.jsonl")
    whole = scan.scan_file(path, None, 0, 1 << 30, {"group_path": GROUP_PATH})
    jobs = [(path, None, 0, 1 << 30)]
    out = backfill.scan_jobs(
        jobs,
        4,
        None,
        runner=backfill.scan_piece,
        cuts={path: [whole["offset"] // 3, 2 * whole["offset"] // 3]},
        paths={"group_path": GROUP_PATH},
    )
    assert out[path]["fields"] == whole["fields"]


def test_a_shard_without_the_fields_says_which_is_missing(tmp_path):
    shard = tmp_path / "flat.jsonl"
    shard.write_text(
        "".join(
            json.dumps({"text": "x" * 50, "finish_reason": fr, "completion_tokens": t}) + "\n"
            for t, fr in [(10, "stop"), (4096, "length"), (4096, "stop")] * 50
        )
    )
    entry = scan.scan_file(str(shard), None, 0, 1 << 30)
    assert "fields" not in entry  # today's reply, unchanged
    f = figures_of(Simulator(tmp_path), str(shard), {})
    assert f["prompts"]["answered"] is None and "prompt_id_path" in f["prompts"]["line"]
    assert f["unanswered"]["never_answered"] is None and "reasoning_content" in f["unanswered"]["message"]
    assert f["context_stops"]["count"] is None and "prompt_tokens_path" in f["context_stops"]["message"]
    assert f["groups"]["rows"] == [] and "group_path" in f["groups"]["message"]
    assert f["mislabelled"]["count"] == 50 and f["mislabelled"]["by_reason"] == {"stop": 50}  # a result, not a gap


def _collector(folder, node, expected):
    config = RunConfig(
        name="t",
        nodes=[node],
        interval_s=1.0,
        expected_prompts=expected,
        max_model_len=MAX_MODEL_LEN,
        max_output_tokens=CEILING,
    )
    return config, Collector(config, Store(folder / "store.sqlite3"))


def _poll_all(collector):
    for _ in range(50):
        collector.poll_once()
        if not collector.store.nodes()[0]["pending_bytes"]:
            return
    raise AssertionError("still pending")


def test_store_figures_through_a_real_sshd_node(tmp_path, sshd_node):
    sim = demo_shards(tmp_path, n=1500, seed=11)
    node = sshd_node("127.0.0.33").node_config(
        name="n1", gpu="off", shards=[str(sim.shard_dir / "*.jsonl")], group_path=GROUP_PATH
    )
    config, collector = _collector(tmp_path, node, sim.fields.issued)
    try:
        _poll_all(collector)
        sim.write_backlog(500)  # more lines between polls: nothing double counted
        _poll_all(collector)
        config = dataclasses.replace(config, expected_prompts=sim.fields.issued)
        f = fieldmodel.field_figures(collector.store, config, CEILING)
        assert_matches_truth(f, sim.fields)
        assert fieldmodel.field_figures(collector.store, config, CEILING, "n1")["prompts"] == f["prompts"]
        m = overview.overview(collector.store, config)
        f_ = sim.fields
        line = f"prompts answered {f_.answered:,} of {f_.issued:,} · not answered {f_.issued - f_.answered:,}"
        assert m.prompts is not None and m.prompts["line"].startswith(line) and line in m.text()
        assert m.headline()["prompts_answered_twice"] == sim.fields.answered_twice
    finally:
        collector.stop()
        collector.store.close()


def _ids(path):
    """The prompt IDs of a demo shard's well-formed lines."""
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines() if line.startswith('{"id": "gen')]


def test_a_reset_shard_takes_its_prompts_out_of_the_totals(tmp_path):
    sim = demo_shards(tmp_path, n=800, seed=12)
    node = NodeConfig(
        name="n1",
        host="local",
        shards=[str(sim.shard_dir / "*.jsonl")],
        python=sys.executable,
        gpu="off",
        group_path=GROUP_PATH,
    )
    _, collector = _collector(tmp_path, node, None)
    try:
        _poll_all(collector)
        before = collector.store.prompt_counts()
        victim = max(sim.shard_dir.glob("*.jsonl"), key=lambda p: p.stat().st_size)
        ids = _ids(victim)
        victim.write_text("")  # truncated: its counts are dropped
        _poll_all(collector)
        after = collector.store.prompt_counts()
        assert after["id_lines"] == before["id_lines"] - len(ids) and len(ids) > 50
        others = {i for p in sim.shard_dir.glob("*.jsonl") for i in _ids(p)}
        assert after["distinct_prompts"] == len(others) < before["distinct_prompts"]
        # the run's kept summary equals the node's count from its hashes
        assert collector.store.prompt_counts("n1") == after
        groups = sum(g["completions"] for g in collector.store.group_counts())
        assert groups == before["id_lines"] - len(ids)
    finally:
        collector.stop()
        collector.store.close()


def test_compare_two_runs_prompt_sets(tmp_path):
    stores = []
    for name, ids in (("a", range(0, 1000)), ("b", list(range(0, 990)) + list(range(2000, 2050)))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "s.jsonl").write_text(
            "".join(
                json.dumps({"custom_id": f"q{i}", "text": "x", "finish_reason": "stop", "completion_tokens": 3}) + "\n"
                for i in ids
            )
        )
        node = NodeConfig(name="n", host="local", shards=[str(folder / "*.jsonl")], python=sys.executable, gpu="off")
        _, collector = _collector(folder, node, None)
        _poll_all(collector)
        collector.stop()
        stores.append(collector.store)
    overlap = stores[0].prompt_overlap(stores[1].path)
    assert overlap == {"a_prompts": 1000, "b_prompts": 1040, "in_both": 990}
    c = fieldfigures.compare_prompts(**overlap)
    assert c["line"] == "B answered 99.0% of A's prompts; 10 of A's prompts are missing from B"
    for s in stores:
        s.close()


def test_scan_and_poll_json_carry_the_figures(tmp_path, capsys):
    from runhealth import cli

    sim = demo_shards(tmp_path, n=900, seed=13)
    glob = str(sim.shard_dir / "*.jsonl")
    argv = ["scan", glob, "--json", "--group-path", GROUP_PATH, "--max-model-len", str(MAX_MODEL_LEN)]
    assert cli.main([*argv, "--expected-prompts", str(sim.fields.issued)]) == 0
    scanned = json.loads(capsys.readouterr().out)["fields"]
    assert_matches_truth(scanned, sim.fields)
    assert cli.main(["scan", glob, "--group-path", GROUP_PATH]) == 0  # the same in words
    text = capsys.readouterr().out
    assert f"prompts answered {sim.fields.answered:,} · answered twice {sim.fields.answered_twice:,}" in text
    assert f"{sim.fields.never_answered:,} never answered" in text and "cut at the ceiling by metadata.dataset" in text
    node = NodeConfig(name="n1", host="local", shards=[glob], python=sys.executable, gpu="off", group_path=GROUP_PATH)
    config = RunConfig(
        name="t",
        nodes=[node],
        expected_prompts=sim.fields.issued,
        max_model_len=MAX_MODEL_LEN,
        max_output_tokens=CEILING,
    )
    polled = cli.poll_run(config)
    assert (
        polled["lengths"]["fields"] == scanned
        and polled["nodes"][0]["lengths"]["fields"]["prompts"] == scanned["prompts"]
    )


def test_many_groups_with_scattered_length_stops_fold_into_labels_not_other(tmp_path):
    """The template path keeps a `length` stop's token count in its raw group key (#41): 200
    groups x many distinct counts pass the raw keys' cap, which folds them into their labels (the
    json.loads path's counts), never into "(other)"."""
    rng = random.Random(5)
    lines = []
    for i in range(6000):
        ct = rng.choice([4096, rng.randint(10, 4000)])
        fr = "length" if ct == 4096 or rng.random() < 0.5 else "stop"
        rec = {"id": f"p{i}", "metadata": {"src": f"g{i % 200}"}, "usage": {"completion_tokens": ct}}
        rec["choices"] = [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": fr}]
        lines.append(json.dumps(rec) + "\n")
    shard = tmp_path / "many.jsonl"
    shard.write_text("".join(lines), encoding="utf-8")
    paths = {"group_path": "metadata.src"}
    fast = scan.scan_file(str(shard), None, 0, 1 << 30, paths)["fields"]
    slow = scan.scan_file(str(shard), None, 0, 1 << 30, {**paths, **FORCE_JSON})["fields"]
    assert fast["groups"] == slow["groups"] and len(fast["groups"]) == 200
    assert sum(len(g[3]) for g in fast["groups"]) > 4 * 256  # past the raw keys' cap
    for _label, _n, stops, by in fast["groups"]:
        assert sum(k for _, k in by) == stops


def test_an_older_agents_groups_count_length_stops_and_say_why(tmp_path):
    """A 3-element group (an agent from before #41) has no split: the column counts every
    `length` stop and the note names the agent; a 4th element that misses stops is refused."""
    new = ingest.field_update({"ids": "", "groups": [["a", 10, 3, [[100, 1], [4096, 2]]]]})
    old = ingest.field_update({"ids": "", "groups": [["b", 10, 4]]})
    assert new is not None and old is not None
    totals, hashes = fieldfigures.FieldTotals(), {}  # type: ignore[var-annotated]
    fieldfigures.add_update(totals, new, hashes)
    g = fieldfigures.group_shares(totals, 4096)
    assert g["counts"] == "cut" and [(r["cut"], r["below_ceiling"], r["length_stops"]) for r in g["rows"]] == [
        (2, 1, 3)
    ]
    fieldfigures.add_update(totals, old, hashes)
    g = fieldfigures.group_shares(totals, 4096)
    assert g["counts"] == "length stops" and "agent" in g["note"]
    assert {r["group"]: (r["cut"], r["length_stops"]) for r in g["rows"]} == {"a": (None, 3), "b": (None, 4)}
    assert fieldfigures.group_shares(totals, None)["note"] == fieldfigures.NO_SPLIT_CEILING
    with pytest.raises(ValueError, match="do not sum to 3"):
        ingest.field_update({"ids": "", "groups": [["a", 10, 3, [[4096, 2]]]]})
