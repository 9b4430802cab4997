"""Issue 33 item 1 per node and as progress: the Nodes page's prompts-and-labels table and the
Overview's progress from distinct prompts.

The demo simulator writes one run's shards; the store is built by the real collector through the
local agent. Each node's truth is the simulator's own FieldTruth replayed over that node's shard
lines (what the node really holds), so every cell is checked exactly; a third node's shards carry
no prompt ID, no reasoning and no prompt tokens, and its cells must say so, never 0. A retry the
simulator sends to another node answers one prompt on two nodes: the nodes' prompts then sum to
more than the run's distinct prompts, and the caption must say that with both numbers.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from test_pages import _clear_streamlit_caches, assert_clean, run_page, texts  # noqa: F401 (autouse fixture)
from test_screens import counting

from runhealth import cli
from runhealth.collect.collector import Collector
from runhealth.demo import GROUP_PATH, MAX_MODEL_LEN, FieldTruth, Simulator
from runhealth.screens import nodefields, overview
from runhealth.screens import nodes as nodes_model
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store

CEILING = 4096
LINES = 1500
NODE_GLOBS = {"n1": "shards/node1-*.jsonl", "n2": "shards/node2-*.jsonl", "bare": "bare/*.jsonl"}


def _config(folder: Path, globs: dict[str, str], expected: int | None, store: str) -> RunConfig:
    nodes = [
        NodeConfig(
            name=name,
            host="local",
            shards=[str(folder / g)],
            python=sys.executable,
            gpu="off",
            group_path=GROUP_PATH,
        )
        for name, g in globs.items()
    ]
    return RunConfig(
        name="fields-run",
        nodes=nodes,
        interval_s=5.0,
        target_completions=10_000,
        expected_prompts=expected,
        max_model_len=MAX_MODEL_LEN,
        max_output_tokens=CEILING,
        store_path=str(folder / store),
    )


def _toml(c: RunConfig) -> str:
    out = [
        "[run]",
        f'name = "{c.name}"',
        f'store_path = "{c.store_path}"',
        f"max_output_tokens = {c.max_output_tokens}",
        f"target_completions = {c.target_completions}",
        f"max_model_len = {c.max_model_len}",
        "interval_s = 5",
    ]
    if c.expected_prompts:
        out.append(f"expected_prompts = {c.expected_prompts}")
    for n in c.nodes:
        out += ["[[nodes]]", f'name = "{n.name}"', 'host = "local"', f"shards = {json.dumps(n.shards)}"]
        out += [f'python = "{sys.executable}"', 'gpu = "off"', f'group_path = "{GROUP_PATH}"', ""]
    return "\n".join(out)


def _collect(config: RunConfig) -> None:
    collector = Collector(config, Store(config.store_path))
    for _ in range(50):
        collector.poll_once()
        if not any(n["pending_bytes"] for n in collector.store.nodes()):
            break
    collector.stop()
    collector.store.close()


def _bare_lines(src: Path, n: int) -> list[str]:
    """Demo records stripped of every prompt ID candidate, the reasoning and the prompt tokens."""
    out = []
    for line in src.read_text(encoding="utf-8").splitlines()[:n]:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        for k in ("id", "custom_id"):
            r.pop(k, None)
        r["choices"][0]["message"].pop("reasoning_content", None)
        r["usage"].pop("prompt_tokens", None)
        out.append(json.dumps(r) + "\n")
    return out


def _truth(folder: Path, glob: str) -> FieldTruth:
    """The FieldTruth of one node: the simulator's counting replayed over that node's lines."""
    t = FieldTruth()
    for path in sorted(folder.glob(glob)):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the simulator's malformed lines: not completions
            if "custom_id" in record and "choices" in record:  # a failed request (Batch 500) is no answer
                t.count(record, CEILING)
    return t


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(folder, config with expected_prompts, the simulator, per-node truth, TOML path)."""
    folder = tmp_path_factory.mktemp("nodefields")
    sim = Simulator(folder, seed=11, ceiling=CEILING)
    sim.shard_dir.mkdir(parents=True)
    sim.write_backlog(LINES)
    (folder / "bare").mkdir()
    (folder / "bare" / "x.jsonl").write_text("".join(_bare_lines(sim.shard_path(0), 40)), encoding="utf-8")
    config = _config(folder, NODE_GLOBS, sim.fields.issued, "store.sqlite3")
    _collect(config)
    truth = {n: _truth(folder, g) for n, g in NODE_GLOBS.items() if n != "bare"}
    path = folder / "runhealth.toml"
    path.write_text(_toml(config), encoding="utf-8")
    return folder, config, sim, truth, path


def _model(config: RunConfig) -> nodes_model.Nodes:
    store = Store(config.store_path)
    try:
        return nodes_model.nodes(store, config)
    finally:
        store.close()


def test_each_nodes_figures_are_its_shards_truth(run):
    _folder, config, sim, truth, _path = run
    m = _model(config)
    by = {f.node: f for f in m.fields}
    assert sorted(by) == ["bare", "n1", "n2"]
    for name, t in truth.items():
        f = by[name]
        assert f.prompts["answered"] == t.answered > 0
        assert f.prompts["answered_more_than_once"] == t.answered_twice
        assert f.prompts["lines_without_id"] == 0
        assert f.unanswered["never_answered"] == t.never_answered > 0
        assert f.unanswered["length_stops"] == t.length_at_ceiling
        assert f.mislabelled["count"] == t.mislabelled
        assert f.context_stops["count"] == t.context_stops
        row = f.row()
        assert row["Prompts answered"] == f"{t.answered:,}"
        assert row["Cut, never answered"] == f"{t.never_answered:,} of {t.length_at_ceiling:,} cuts"
    assert all(t.answered_twice for t in truth.values())  # retries within a node: the grouped part
    store = Store(config.store_path)
    by_node = store.prompt_counts_by_node()  # the one-statement read agrees with the per-node one
    assert all(by_node[n] == store.prompt_counts(n) for n in truth), by_node
    store.close()
    # every count the two nodes hold is the simulator's, line for line
    assert sum(t.mislabelled for t in truth.values()) == sim.fields.mislabelled
    assert sum(t.context_stops for t in truth.values()) == sim.fields.context_stops > 0


def test_a_field_a_node_lacks_is_named_in_its_cell_never_zero(run):
    _folder, config, _sim, _truth, _path = run
    m = _model(config)
    bare = next(f for f in m.fields if f.node == "bare").row()
    assert bare["Prompts answered"] == bare["Answered more than once"] == nodefields.NO_ID
    assert bare["Lines without an ID"] == nodefields.NO_ID
    assert bare["Cut, never answered"] == nodefields.NO_REASONING
    assert bare["Context-window stops"] == nodefields.NO_PROMPT_TOKENS
    assert bare["Mislabelled at the ceiling"].isdigit()  # needs only the length counts every shard has
    how = "\n".join(m.fields_missing)
    assert f"“{nodefields.NO_ID}”: no prompt ID in the shards" in how and "prompt_tokens_path" in how
    assert "max_model_len" not in how  # configured: no line for it


def test_the_nodes_prompts_do_not_sum_to_the_run_and_the_caption_says_so(run):
    _folder, config, sim, truth, _path = run
    per_node = sum(t.answered for t in truth.values())
    assert per_node > sim.fields.answered  # retries landed on the other node: the premise holds
    m = _model(config)
    assert m.prompts_answered == sim.fields.answered
    assert f"this column sums to {per_node:,}; the run answered {sim.fields.answered:,}" in m.fields_caption
    assert m.to_json()["prompts_answered"] == sim.fields.answered


def test_the_nodes_model_statements_do_not_grow_with_the_nodes(run, monkeypatch):
    """Three grouped field reads for all nodes: the same statements for 3 nodes as for 8 (one
    node per shard file), not one query per node per figure."""
    folder, config, _sim, _truth, _path = run
    globs = {f"g{k}": f"shards/node{1 if k < 4 else 2}-gpu{k}.jsonl" for k in range(7)}
    many = _config(folder, {**globs, "bare": NODE_GLOBS["bare"]}, config.expected_prompts, "many.sqlite3")
    _collect(many)
    counts = []
    for c in (config, many):
        calls = counting(monkeypatch)
        m = _model(c)
        counts.append(calls["sql"])
        monkeypatch.undo()
        assert len(m.fields) == len(c.nodes)
    assert counts[0] == counts[1], counts


def test_the_nodes_page_shows_the_table_and_its_csv(run, monkeypatch):
    _folder, _config, sim, truth, path = run
    at = run_page("nodes", path, monkeypatch)
    assert_clean(at)
    shown = texts(at)
    assert "Prompts and labels, per node" in shown
    assert f"the run answered {sim.fields.answered:,} distinct prompts" in shown
    table = next(df.value for df in at.dataframe if "Prompts answered" in df.value.columns)
    rows = {r["Node"]: r for r in table.to_dict("records")}
    assert rows["n1"]["Prompts answered"] == f"{truth['n1'].answered:,}"
    assert rows["n2"]["Answered more than once"] == f"{truth['n2'].answered_twice:,}"
    assert rows["bare"]["Prompts answered"] == nodefields.NO_ID
    assert "no prompt ID in the shards (looked for custom" in shown  # and how to configure it
    assert any(b.label == "Download per-node prompts and labels CSV" for b in at.get("download_button"))


def test_progress_reads_distinct_prompts_on_the_model_page_and_cli(run, monkeypatch, capsys):
    _folder, config, sim, _truth, path = run
    answered, expected = sim.fields.answered, sim.fields.issued
    assert answered < LINES  # distinct prompts, not lines: retries are no progress
    store = Store(config.store_path)
    m = overview.overview(store, config)
    words = f"{answered:,} of {expected:,} prompts answered"
    assert m.progress == (answered / expected, words)
    assert m.headline()["progress_line"] == words
    # without expected_prompts the bar stays completions of the target
    plain = overview.overview(store, dataclasses.replace(config, expected_prompts=None))
    store.close()
    assert plain.progress is not None and plain.progress[1] == f"{plain.summary.completions:,} of 10,000 completions"
    assert cli.main(["status", "--config", str(path), "--json"]) in (0, 1)
    record = json.loads(capsys.readouterr().out)
    assert record["progress_line"] == words and record["prompts_answered"] == answered
    assert record["progress_pct"] == round(100 * answered / expected, 2)
    at = run_page("overview", path, monkeypatch)
    assert_clean(at)
    bars = [p.proto.text for p in at.get("progress")]
    assert words in bars, bars
