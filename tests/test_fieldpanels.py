"""The per-line field figures (#33) on every screen: Output lengths' panels and what-if, the
Samples page's never-answered filter, the Compare page's prompt overlap and /metrics' gauges.

Two demo runs are written by the simulator (which knows what it wrote: demo.FieldTruth) and
collected through the real agent into real stores; each screen's numbers are checked against
that truth exactly, and a store whose shards lack the fields must name the field, never show 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import store_fixtures
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_pages import _clear_streamlit_caches, assert_clean, run_page, texts  # noqa: F401 (autouse fixture)

from components import fieldcharts
from runhealth.alerting.exporter import registry_for
from runhealth.collect import sampling
from runhealth.collect.collector import Collector
from runhealth.demo import GROUP_PATH, MAX_MODEL_LEN, Simulator
from runhealth.screens import compare as compare_model
from runhealth.screens import fieldpanels, lengths, samples
from runhealth.screens.words import fmt_count
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store

CEILING = 4096
RUNS = {
    "run-a": (1500, 230),
    "run-b": (1200, 32),
}  # name: (lines, seed): run-a has context-window stops (9) and mislabels (2)


def _config(name: str, folder: Path, expected: int) -> RunConfig:
    node = NodeConfig(
        name="n1",
        host="local",
        shards=[str(folder / "shards" / "*.jsonl")],
        python=sys.executable,
        gpu="off",
        group_path=GROUP_PATH,
    )
    return RunConfig(
        name=name,
        nodes=[node],
        interval_s=5.0,
        expected_prompts=expected,
        max_model_len=MAX_MODEL_LEN,
        max_output_tokens=CEILING,
        store_path=str(folder / "store.sqlite3"),
    )


def _toml(configs: list[RunConfig]) -> str:
    out = []
    for c in configs:
        n = c.nodes[0]
        out += [
            "[[runs]]",
            f'name = "{c.name}"',
            f'store_path = "{c.store_path}"',
            f"max_output_tokens = {c.max_output_tokens}",
            f"expected_prompts = {c.expected_prompts}",
            f"max_model_len = {c.max_model_len}",
            "interval_s = 5",
            "[[runs.nodes]]",
            f'name = "{n.name}"',
            'host = "local"',
            f"shards = {json.dumps(n.shards)}",
            f'python = "{sys.executable}"',
            'gpu = "off"',
            f'group_path = "{GROUP_PATH}"',
            "",
        ]
    return "\n".join(out)


def _collect(config: RunConfig) -> Store:
    collector = Collector(config, Store(config.store_path))
    for _ in range(50):
        collector.poll_once()
        if not collector.store.nodes()[0]["pending_bytes"]:
            break
    batch = collector.store.new_sample_batch(400)
    got, population, errors = collector.sample_now(400, "length")
    sampling.score_loops(got)
    collector.store.finish_sample_batch(batch, got, population, errors)
    collector.stop()
    return collector.store


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """{name: (config, simulator)} and the TOML config naming both runs."""
    tmp = tmp_path_factory.mktemp("fieldpanels")
    out = {}
    for name, (n, seed) in RUNS.items():
        sim = Simulator(tmp / name, seed=seed, ceiling=CEILING)
        sim.shard_dir.mkdir(parents=True)
        sim.write_backlog(n)
        config = _config(name, tmp / name, sim.fields.issued)
        _collect(config).close()
        out[name] = (config, sim)
    path = tmp / "runhealth.toml"
    path.write_text(_toml([c for c, _ in out.values()]), encoding="utf-8")
    return out, path


def test_lengths_model_panels_are_the_simulators_truth(demo_runs):
    config, sim = demo_runs[0]["run-a"]
    truth = sim.fields
    store = Store(config.store_path)
    m = lengths.lengths(store, config)
    store.close()
    p = m.fields
    assert p is not None and p.split.cut == truth.length_at_ceiling
    assert p.split.never_answered.k == truth.never_answered > 0
    assert p.split.mid_answer.k == truth.length_at_ceiling - truth.never_answered > 0
    assert p.split.never_answered.lo < p.split.never_answered.share < p.split.never_answered.hi
    assert p.labels.mislabelled == truth.mislabelled > 0 and sum(p.labels.by_reason.values()) == truth.mislabelled
    assert p.labels.context_stops == truth.context_stops > 0
    assert {r.group: r.completions for r in p.groups.rows} == {k: n for k, (n, _) in truth.groups.items()}
    assert p.groups.counts == "cut" and {r.group: r.cut for r in p.groups.rows} == truth.group_cuts
    below = {r.group: r.below_ceiling for r in p.groups.rows}  # the context window's stops, apart (#41)
    assert below == {k: stops - truth.group_cuts[k] for k, (_, stops) in truth.groups.items()}
    assert sum(r.cut for r in p.groups.rows) == p.split.cut
    shares = [r.share for r in p.groups.rows]
    assert shares == sorted(shares, reverse=True) and p.groups.field == GROUP_PATH
    assert json.dumps(m.to_json()["fields"])  # the model's JSON carries the panels


def test_recovered_answers_follow_the_what_if_share():
    split = fieldpanels.cut_split({"never_answered": 600, "cut_mid_answer": 400, "length_stops": 1000})
    r = fieldpanels.recovered(split, 8192, 0.2, 0.05, (0.04, 0.08))
    assert r is not None and r.finish_share == pytest.approx(0.75) and r.answers == pytest.approx(450)
    assert r.answers_interval == pytest.approx((600 * 0.6, 600 * 0.8))
    assert "about 450 of the 600 never-answered cuts" in r.line()
    assert fieldpanels.recovered(fieldpanels.cut_split({"never_answered": None}), 8192, 0.2, 0.05, (0, 0)) is None


def test_lengths_model_recovers_never_answered_cuts_only_above_the_ceiling(demo_runs):
    from runhealth.analysis.whatif import what_if

    config, sim = demo_runs[0]["run-a"]
    store = Store(config.store_path)
    m = lengths.lengths(store, config)
    store.close()
    r = what_if(m.counts.hist, CEILING, 2 * CEILING, loop_sample=m.loop_sample, bootstrap=20)
    got = m.recovered(r)
    assert got is not None and got.never_answered == sim.fields.never_answered
    assert 0 < got.answers_interval[0] <= got.answers <= got.answers_interval[1] <= sim.fields.never_answered
    lower = what_if(m.counts.hist, CEILING, CEILING // 2, bootstrap=20)
    assert m.recovered(lower) is None  # a lower limit recovers nothing: no line at all


def test_output_lengths_page_shows_the_panels(demo_runs, monkeypatch):
    runs, path = demo_runs
    truth = runs["run-a"][1].fields
    at = run_page("lengths", path, monkeypatch)  # a run page opens on the config's first run
    assert_clean(at)
    text = texts(at)
    assert "Cut before answering" in text and "Label checks" in text and "Which prompts get cut" in text
    tiles = "\n".join(str(m.value) for m in at.markdown)
    assert f">{fmt_count(truth.never_answered)}<" in tiles
    assert f">{fmt_count(truth.length_at_ceiling - truth.never_answered)}<" in tiles
    assert f">{fmt_count(truth.mislabelled)}<" in tiles and f">{fmt_count(truth.context_stops)}<" in tiles
    for group, (n, _cut) in truth.groups.items():
        assert group in text and fmt_count(n) in text
    # A few groups: a static table (#42: no data grid on the page), every group with its counts.
    (panel,) = [t.value for t in at.table if "95% interval" in t.value.columns]
    shown = dict(zip(panel.iloc[:, 0], panel["completions"], strict=True))
    assert shown == {group: fmt_count(n) for group, (n, _cut) in truth.groups.items()}, shown
    assert "never-answered cuts finish" in text and "upper estimate" in text  # the what-if's line


def test_a_store_without_the_fields_names_them_instead_of_zero(tmp_path, monkeypatch):
    store, path = store_fixtures.make_store(tmp_path, "ceiling_18")
    m = lengths.lengths(store, _config("x", tmp_path, 1))
    store.close()
    p = m.fields
    assert p is not None and p.split.never_answered is None and "reasoning_content" in str(p.split.message)
    assert p.labels.context_stops is None and "prompt_tokens_path" in str(p.labels.context_message)
    assert p.groups.rows == () and "group_path" in str(p.groups.message)
    at = run_page("lengths", path, monkeypatch)
    assert_clean(at)
    text = texts(at).replace("\\", "")  # the messages are markdown-escaped (group\\_path)
    assert "group_path" in text and "prompt_tokens_path" in text and "reasoning_content" in text
    assert "Never answered" not in text


def test_group_cut_figure_draws_intervals_most_cut_first(demo_runs):
    config, _ = demo_runs[0]["run-a"]
    store = Store(config.store_path)
    p = lengths.lengths(store, config).fields
    store.close()
    assert p is not None
    df = fieldcharts.group_frame(p.groups)
    fig = fieldcharts.make_group_cut_figure(df, p.groups.label)
    bar = fig.data[0]
    assert list(bar.x) == [r.group for r in p.groups.rows] and bar.error_y.array is not None
    assert list(bar.y) == sorted(bar.y, reverse=True)
    assert GROUP_PATH in fig.layout.title.text
    hostile = fieldcharts.group_frame(
        fieldpanels.group_cuts(
            {
                "rows": [
                    {"group": "<b>x</b>", "completions": 4, "length_stops": 1, "share": 0.25, "low": 0.05, "high": 0.7}
                ]
            }
        )
    )
    assert list(fieldcharts.make_group_cut_figure(hostile, "g").data[0].x) == [
        "&lt;b&gt;x&lt;/b&gt;"
    ]  # shown, not read


def _line_never_answered(s) -> bool:
    """The truth for one sampled line: its shard line's message content is empty."""
    with open(s["path"], "rb") as f:
        f.seek(s["offset"])
        obj = json.loads(f.readline())
    return obj["choices"][0]["message"]["content"] == ""


def test_samples_never_answered_filter_matches_the_lines(demo_runs, monkeypatch):
    runs, path = demo_runs
    config, sim = runs["run-a"]
    store = Store(config.store_path)
    m = samples.samples(store, config)
    store.close()
    cut = [s for s in m.truncated if s["tokens"] >= CEILING]
    assert len(cut) > 50
    truth = [s for s in cut if _line_never_answered(s)]
    assert [samples.sample_key(s) for s in m.never_answered] == [samples.sample_key(s) for s in truth]
    assert 0 < len(truth) < len(cut) and m.never_answered_in_sample.k == len(truth)
    assert m.cut_split.never_answered.k == sim.fields.never_answered  # the exact count beside it
    at = run_page("samples", path, monkeypatch)  # run-a, the config's first run
    assert_clean(at)
    tiles = "\n".join(str(x.value) for x in at.markdown)
    assert "Never answered · all cuts" in tiles and f"{fmt_count(sim.fields.never_answered)} of" in tiles
    at.toggle(key="samples_never_answered_only").set_value(True).run()
    assert_clean(at)
    shown = at.dataframe[0].value
    assert len(shown) == len(m.never_answered) and set(shown["answer"]) == {"never answered"}


def test_compare_prompt_overlap_is_exact(demo_runs, monkeypatch):
    runs, path = demo_runs
    (ca, sa), (cb, sb) = runs["run-a"], runs["run-b"]
    a_ids, b_ids = set(sa.fields.answers), set(sb.fields.answers)
    both = len(a_ids & b_ids)
    a, b = Store(ca.store_path), Store(cb.store_path)
    p = compare_model.prompt_overlap(a, b)
    a.close()
    b.close()
    assert (p.a_prompts, p.b_prompts, p.in_both) == (len(a_ids), len(b_ids), both)
    missing = len(a_ids) - both
    line = f"B answered {100 * both / len(a_ids):.1f}% of A's prompts; {missing:,} of A's prompts are missing from B"
    assert p.line.startswith(line) and missing > 0
    at = run_page("compare", path, monkeypatch)
    assert_clean(at)
    text = texts(at)
    other = f"B answered {100 * both / len(b_ids):.1f}% of A's prompts"  # the page's default pair may be B, A
    assert line in text or other in text
    assert "cannot be checked" not in text


def test_compare_names_the_run_without_prompt_ids(demo_runs, tmp_path):
    config, _ = demo_runs[0]["run-a"]
    bare, _ = store_fixtures.make_store(tmp_path, "healthy")
    a = Store(config.store_path)
    p = compare_model.prompt_overlap(a, bare, "run-a", "bare")
    a.close()
    bare.close()
    assert p.share is None and "run B (bare) has no prompt IDs" in p.line and "prompt_id_path" in p.line


def _scrape(store: Store) -> dict[str, float]:
    text = generate_latest(registry_for(store)).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_gauges_are_the_truth_and_absent_without_the_field(demo_runs, tmp_path):
    config, sim = demo_runs[0]["run-a"]
    truth = sim.fields
    store = Store(config.store_path)
    try:
        got = _scrape(store)
        assert got["runhealth_prompts_answered"] == truth.answered
        assert got["runhealth_prompts_answered_more_than_once"] == truth.answered_twice
        assert got["runhealth_truncated_never_answered"] == truth.never_answered
        assert got["runhealth_truncated_mid_answer"] == truth.length_at_ceiling - truth.never_answered
        assert got["runhealth_mislabelled_completions"] == truth.mislabelled
        # The collector saved the run's expected_prompts and max_model_len with its meta.
        assert got["runhealth_prompts_missing"] == truth.issued - truth.answered > 0
        assert got["runhealth_context_window_stops"] == truth.context_stops > 0
        meta = store.meta("run") or {}
        assert (meta["expected_prompts"], meta["max_model_len"]) == (truth.issued, MAX_MODEL_LEN)
        # Without them (a store written before, or a run that sets neither): no series, never a zero.
        store.set_meta("run", {k: v for k, v in meta.items() if k not in ("expected_prompts", "max_model_len")})
        got = _scrape(store)
        assert "runhealth_prompts_missing" not in got and "runhealth_context_window_stops" not in got
        store.set_meta("run", meta)
    finally:
        store.close()
    bare, _ = store_fixtures.make_store(tmp_path, "healthy")
    got = _scrape(bare)
    bare.close()
    for name in ("prompts_answered", "truncated_never_answered", "context_window_stops"):
        assert f"runhealth_{name}" not in got
    assert "runhealth_mislabelled_completions" in got  # a count every shard has: 0 is a result


def _sample(text: str, head: int = 400, tail: int = 4000) -> dict:
    return {"text_head": text[:head], "text_tail": text[-tail:], "text_chars": len(text)}


@pytest.mark.parametrize(
    ("text", "never"),
    [
        ("thinking about it\n\n", True),  # reasoning, then the node's blank line, then an empty answer
        ("thinking about it\n\nThe answer is 4", False),  # cut mid-answer
        ("<think>still going " + "x" * 9000, True),  # a <think> never closed (head and tail kept)
        ("<think>done</think> The answer is 4", False),
        ("<think>long " + "x" * 9000 + "</think> answer", False),  # closed within the tail
        ("plain text, no reasoning", False),
        ("", False),  # no text kept: nothing to judge
    ],
)
def test_answer_empty_reads_the_kept_text(text, never):
    assert samples.answer_empty(_sample(text)) is never
