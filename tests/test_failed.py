"""Failed requests counted apart on every consumer, and never a silent zero (#39 items 2 and 3).

Agent replies are built by hand in the wire shape (ShardEntry's `failed` / `failed_ids`, the
contract with the agent's side), written through ingest -> store exactly as the collector does,
and then read back on each surface: the Overview and Nodes models and pages (AppTest), the
Output lengths page, Compare, /metrics' text, a webhook to a real local HTTP receiver, and
`runhealth status / poll / scan --json`. The figures are computed here from what was sent.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from pathlib import Path

import pytest
import store_fixtures
from test_pages import _clear_streamlit_caches, assert_clean, run_page, texts  # noqa: F401 (autouse fixture)
from test_webhooks import Receiver, _notifier

from runhealth import cli, ingest
from runhealth.alerting import exporter
from runhealth.node import agent
from runhealth.screens import compare as compare_screen
from runhealth.screens import nodes as nodes_screen
from runhealth.screens import overview, published, runfigures
from runhealth.settings.config import load_config
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store

POLLS, PER_SHARD, SHARDS = 6, 100, 2  # per node: 1,200 completions
FAILED = [["server_error", 2], ["http_500", 1]]  # node-2, each shard, each poll
NODE2_FAILED = POLLS * SHARDS * 3  # 36
COMPLETIONS = 2 * POLLS * SHARDS * PER_SHARD  # 2,400 over both nodes


def shown(markdown: str) -> str:
    """Markdown as read (the pages escape `_`, `[` and `]` in data words)."""
    return markdown.replace("\\", "")


def ids(*hashes: int) -> str:
    return base64.b64encode(b"".join(struct.pack("<q", h) for h in hashes)).decode()


def build(tmp: Path, *, failed: bool = True, no_reason: bool = False) -> tuple[Store, Path]:
    """Two nodes, six polls; node-2's shards report FAILED each poll; the collector's meta saved."""
    path = tmp / "x.sqlite3"
    store = Store(path)
    store_fixtures.build_run(
        store,
        now=time.time(),
        trunc_frac=0.1,
        nodes=2,
        polls=POLLS,
        per_shard=PER_SHARD,
        failed={"node-2": FAILED} if failed else None,
        no_reason=no_reason,
    )
    config = store_fixtures.write_config(tmp, path, nodes=2, target=10_000)
    store.set_meta("run", dict(RunSettings.from_config(load_config(config)).to_meta()))
    return store, config


@pytest.fixture
def failed_store(tmp_path):
    store, config = build(tmp_path)
    yield store, config
    store.close()


# -- the wire and ingest ---------------------------------------------------------------------------
def entry(**extra) -> dict:
    return {"offset_from": 0, "offset": 10, "lines": 1, "tokens": 5, "counts": [[5, "stop", 0, 1]], **extra}


def test_an_older_agent_without_the_keys_has_no_failed_requests():
    update = ingest.shard_update("/a.jsonl", entry())
    assert (update.failed, update.failed_ids, update.failed_total) == ((), (), 0)


def test_failed_requests_are_read_apart_from_the_completions():
    update = ingest.shard_update("/a.jsonl", entry(failed=[["expired", 3], ["http_500", 1]], failed_ids=ids(7, -9)))
    assert update.failed == (("expired", 3), ("http_500", 1)) and update.failed_ids == (7, -9)
    assert update.completions == 1 and update.failed_total == 4


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"failed": {"expired": 3}}, "'failed' must be a list of [reason, count] pairs, not dict"),
        ({"failed": [["expired", -1]]}, "each must be [reason text, count >= 0]"),
        ({"failed": [["expired", "3"]]}, "each must be [reason text, count >= 0]"),
        ({"failed": [["expired", True]]}, "each must be [reason text, count >= 0]"),
        ({"failed": [["", 3]]}, "each must be [reason text, count >= 0]"),
        ({"failed": [["expired"]]}, "each must be [reason text, count >= 0]"),
        ({"failed": [[f"r{i}", 1] for i in range(40)]}, "40 reasons, more than 32"),
        ({"failed": [["expired", 1]], "failed_ids": 5}, "'failed_ids' must be base64 text, not int"),
        ({"failed": [["expired", 1]], "failed_ids": "AAAA"}, "'failed_ids': "),
        ({"failed": [["expired", 1]], "failed_ids": ids(1, 2)}, "holds 2 IDs for 1 failed lines"),
    ],
)
def test_a_malformed_failed_part_is_refused_by_name_and_writes_nothing(tmp_path, extra, words):
    with pytest.raises(ingest.ReplyError) as caught:
        ingest.shard_update("/data/a.jsonl", entry(**extra))
    assert "shard /data/a.jsonl" in str(caught.value) and words in str(caught.value)
    store = Store(tmp_path / "s.sqlite3")
    reply = store_fixtures.poll_reply(1.0, [], {"/data/a.jsonl": entry(**extra)})
    with pytest.raises(ingest.ReplyError):
        store_fixtures.write_reply(store, "n1", reply, 1.0, 1.0)
    assert store.nodes() == [] and store.failed_rows() == []  # nothing half written
    store.close()


# -- the store -------------------------------------------------------------------------------------
def test_failed_counts_are_written_with_the_shard_and_dropped_by_its_reset(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    a, b = "/d/a.jsonl", "/d/b.jsonl"
    files = {a: entry(inode=1, failed=[["expired", 3]]), b: entry(inode=2, failed=[["expired", 1], ["http_500", 2]])}
    store_fixtures.write_reply(store, "n1", store_fixtures.poll_reply(1.0, [], files), 1.0, 1.0)
    assert store.failed_rows() == [
        {"node": "n1", "reason": "expired", "count": 4},
        {"node": "n1", "reason": "http_500", "count": 2},
    ]
    # a.jsonl is rewritten: its failed requests go with its other counts; b's stay.
    again = {a: entry(inode=5, reset=True, offset_from=0, failed=[["canceled", 1]])}
    store_fixtures.write_reply(store, "n1", store_fixtures.poll_reply(2.0, [], again), 2.0, 1.0)
    assert {(r["reason"], r["count"]) for r in store.failed_rows()} == {
        ("expired", 1),
        ("http_500", 2),
        ("canceled", 1),
    }
    store.close()


def test_the_stored_reasons_are_bounded_like_finish_reasons(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    for p in range(3):  # 3 polls x 20 new reasons: the first 32 kept, the rest counted as "other"
        rows = [[f"code_{p}_{i}", 1] for i in range(20)]
        store_fixtures.write_reply(
            store, "n1", store_fixtures.poll_reply(p, [], {f"/d/{p}.jsonl": entry(failed=rows)}), p, 1.0
        )
    got = {r["reason"]: r["count"] for r in store.failed_rows()}
    assert len(got) == 33 and got["other"] == 60 - 32 and sum(got.values()) == 60
    store.close()


def test_a_failed_prompt_answered_later_counts_as_answered_once_and_as_a_retried_failure(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    first = {"/d/a.jsonl": entry(failed=[["server_error", 2]], failed_ids=ids(11, 12), fields={"ids": ids(10)})}
    store_fixtures.write_reply(store, "n1", store_fixtures.poll_reply(1.0, [], first), 1.0, 1.0)
    # Only prompt 10 was answered: the failed IDs 11 and 12 are not prompts answered.
    assert store.prompt_counts()["distinct_prompts"] == 1
    assert store.failed_prompts() == {"failed_prompts": 2, "retried": 0}
    retry = {"/d/b.jsonl": entry(fields={"ids": ids(11)})}  # prompt 11 retried, answered on another shard
    store_fixtures.write_reply(store, "n1", store_fixtures.poll_reply(2.0, [], retry), 2.0, 1.0)
    assert store.prompt_counts() == {"distinct_prompts": 2, "answered_more_than_once": 0, "id_lines": 2}
    assert store.failed_prompts() == {"failed_prompts": 2, "retried": 1}
    store.close()


# -- the Overview, status --json and the alert -----------------------------------------------------
def test_the_overview_counts_failed_requests_as_a_share_of_requests(failed_store, capsys):
    store, config = failed_store
    cfg = load_config(config)
    m = overview.overview(store, cfg)
    share = NODE2_FAILED / (COMPLETIONS + NODE2_FAILED)
    assert m.summary.completions == COMPLETIONS  # failed lines are no completions
    assert (m.failed.failed, m.failed.requests) == (NODE2_FAILED, COMPLETIONS + NODE2_FAILED)
    assert m.failed_line.startswith(f"Failed requests {NODE2_FAILED} ({share:.1%} of requests)")
    alert = next(a for a in m.alerts if a.name == "failed_requests_high")
    assert alert.severity == "warning" and alert.value == pytest.approx(share)  # 1.5%: past 1%, below 5%
    assert f"{NODE2_FAILED} requests failed" in alert.summary and "server_error 24, http_500 12" in alert.summary
    assert m.failed_level == "warn"
    head = m.headline()
    assert head["failed_requests"] == NODE2_FAILED and head["failed_pct"] == round(100 * share, 3)
    assert head["failed_by_reason"] == {"server_error": 24, "http_500": 12}
    # The published record (what the page and `status` show while it holds) carries the same.
    assert published.publish(store, cfg, m.now).model.headline()["failed_by_reason"] == head["failed_by_reason"]
    assert cli.main(["status", "--config", str(config), "--json"]) in (0, 1)
    record = json.loads(capsys.readouterr().out)
    assert record["failed_requests"] == NODE2_FAILED and record["failed_pct"] == head["failed_pct"]
    assert "failed_requests_high" in {a["name"] for a in record["alerts"]}


def test_the_thresholds_come_from_the_run_config(tmp_path):
    store, config = build(tmp_path)
    text = config.read_text().replace("[run]\n", "[run]\nfailed_warn_share = 0.001\nfailed_crit_share = 0.01\n")
    config.write_text(text)
    m = overview.overview(store, load_config(config))
    assert next(a for a in m.alerts if a.name == "failed_requests_high").severity == "critical"
    assert m.failed_level == "alert"
    store.close()


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ("failed_warn_share = 1.5", "'failed_warn_share'"),
        ('failed_crit_share = "high"', "'failed_crit_share'"),
        ("failed_warn_share = 0.2\nfailed_crit_share = 0.1", "'failed_warn_share' (0.2) must not exceed"),
    ],
)
def test_bad_thresholds_are_named(tmp_path, keys, words):
    from runhealth.errors import ConfigError

    config = store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3")
    config.write_text(config.read_text().replace("[run]\n", f"[run]\n{keys}\n"))
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert words in str(caught.value) and str(config) in str(caught.value)


def test_the_overview_page_shows_the_failed_line_and_its_alert(failed_store, monkeypatch):
    _store, config = failed_store
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    share = NODE2_FAILED / (COMPLETIONS + NODE2_FAILED)
    line = next(md.value for md in at.markdown if "Failed requests" in md.value)
    assert line.startswith(":orange[") and f"Failed requests {NODE2_FAILED} ({share:.1%} of requests)" in line
    assert any(f"{NODE2_FAILED} requests failed" in w.value for w in [*at.warning, *at.error])


def test_the_nodes_page_shows_each_nodes_failed_requests(failed_store, monkeypatch):
    store, config = failed_store
    m = nodes_screen.nodes(store, load_config(config))
    rows = {r["Node"]: r for r in m.failed_rows()}
    mine = NODE2_FAILED / (COMPLETIONS // 2 + NODE2_FAILED)
    assert rows["node-2"]["Failed requests"] == f"{NODE2_FAILED} ({mine:.1%} of requests)"
    assert rows["node-1"]["Failed requests"] == "0" and rows["node-2"]["Reasons"] == "server_error 24, http_500 12"
    at = run_page("nodes", config, monkeypatch)
    assert_clean(at)
    table = next(df.value for df in at.dataframe if "Failed requests" in df.value.columns)
    assert table.set_index("Node").loc["node-2", "Failed requests"] == rows["node-2"]["Failed requests"]
    assert "Failed requests, per node" in texts(at)


def test_metrics_export_the_failed_counter_ratio_and_alert(failed_store):
    store, _config = failed_store
    text = exporter.scrape_text(store).decode()
    assert 'runhealth_failed_requests_total{node="node-2",reason="server_error",run="gen-run-42"} 24.0' in text
    assert 'runhealth_failed_requests_total{node="node-2",reason="http_500",run="gen-run-42"} 12.0' in text
    ratio = next(line for line in text.splitlines() if line.startswith("runhealth_failed_requests_ratio{"))
    assert float(ratio.split()[-1]) == pytest.approx(NODE2_FAILED / (COMPLETIONS + NODE2_FAILED))
    assert 'alert="failed_requests_high"' in text and 'severity="warning"' in text


def test_the_webhook_body_carries_the_failed_count(failed_store):
    store, _config = failed_store
    ok = Receiver(200)
    try:
        n = _notifier(store, [ok.url()])
        for e in n.check():
            n.deliver(ok.url(), e)
        post = next(p for p in ok.posts if p["alert"] == "failed_requests_high")
        assert f"{NODE2_FAILED} requests failed" in post["summary"] and post["severity"] == "warning"
        assert post["value"] == pytest.approx(NODE2_FAILED / (COMPLETIONS + NODE2_FAILED))
    finally:
        ok.close()


def test_poll_json_reads_the_failed_requests_per_node(failed_store):
    store, config = failed_store
    cfg = load_config(config)
    report = cli.poll_report(cfg, store, {n.name: {} for n in cfg.nodes})
    assert report["lengths"]["failed_requests"] == NODE2_FAILED and report["lengths"]["completions"] == COMPLETIONS
    by = {n["name"]: n["lengths"] for n in report["nodes"]}
    assert by["node-2"]["failed_by_reason"] == {"server_error": 24, "http_500": 12}
    assert by["node-1"]["failed_requests"] == 0 and by["node-1"]["failed_pct"] == 0.0


def test_scan_json_reads_the_failed_requests_of_openai_batch_lines(tmp_path, capsys):
    """`scan --json` through the real scanner over OpenAI Batch output with failed lines (status
    500, 502, `response: null` with an error); the truth from the generated outcomes."""
    import formatgen

    shard = tmp_path / "a.jsonl"
    truth = formatgen.write_shard(shard, "openai-batch", 400, seed=9)
    assert len(truth.failed) >= 2
    assert cli.main(["scan", str(shard), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    failed = sum(truth.failed.values())
    assert report["completions"] == truth.completions and report["failed_requests"] == failed
    assert report["failed_pct"] == round(100 * failed / (truth.completions + failed), 3)
    assert report["failed_by_reason"] == dict(truth.failed) and report["truncated_unknown"] is None


def test_compare_shows_each_runs_failed_share(failed_store, tmp_path):
    store, _config = failed_store
    other = Store(tmp_path / "b.sqlite3")
    store_fixtures.build_run(other, now=time.time(), trunc_frac=0.05, nodes=2, polls=POLLS, per_shard=PER_SHARD)
    a = runfigures.run_numbers(store, "a", 4096, None, True)
    b = runfigures.run_numbers(other, "b", 4096, None, True)
    got = compare_screen.compare(a, b, (60, 60), time.time(), bootstrap=20)
    row = next(r for r in got.rows if r["metric"] == "failed requests")
    share = NODE2_FAILED / (COMPLETIONS + NODE2_FAILED)
    assert row["A"] == f"{NODE2_FAILED} ({share:.1%} of requests)" and row["B"] == "0"
    assert row["B − A"] == f"{-100 * share:+.1f} pts"
    assert got.to_json()["failed"]["a"]["failed_requests"] == NODE2_FAILED
    other.close()


# -- never a silent zero ---------------------------------------------------------------------------
def test_a_store_without_finish_reasons_reads_unknown_everywhere(tmp_path, monkeypatch, capsys):
    store, config = build(tmp_path, failed=False, no_reason=True)
    m = overview.overview(store, load_config(config))
    tile = next(t for t in m.tiles if t.label == "Truncated")
    assert (tile.value, tile.sub, tile.level) == ("unknown", "no finish reason on 100.0% of completions", "alert")
    alert = next(a for a in m.alerts if a.name == "truncation_unknown")
    assert alert.severity == "critical" and "truncation_high" not in {a.name for a in m.alerts}
    for words in ("finish_reason_path", "choices[0].finish_reason", "cut_labels", "100.0% of completions"):
        assert words in alert.summary
    assert m.waste_line == "unknown: no finish reason on 100.0% of completions"  # was "0.0% ... were cut"
    head = m.headline()
    assert head["truncated_pct"] is None and head["truncated_tokens_pct"] is None
    assert "finish_reason_path" in head["truncated_unknown"]["why"]
    assert head["truncated_unknown"]["missing_finish_reason"] == COMPLETIONS
    assert cli.main(["status", "--config", str(config), "--json"]) in (0, 1)
    record = json.loads(capsys.readouterr().out)
    assert record["truncated_pct"] is None and record["truncated_unknown"]["why"] == head["truncated_unknown"]["why"]
    text = exporter.scrape_text(store).decode()
    assert "runhealth_truncated_ratio{" not in text and 'alert="truncation_unknown"' in text
    assert "runhealth_completions_total{" in text  # the counts are still exported
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    assert any(f"Truncation unknown: {m.unknown.text}" in shown(e.value) for e in at.error)  # the red banner
    assert "What the cut cost:** unknown" in texts(at) and "were cut at" not in texts(at)
    at = run_page("lengths", config, monkeypatch)
    assert_clean(at)
    assert any(shown(e.value).startswith(f"Truncation unknown. {m.unknown.text}") for e in at.error)
    store.close()


def test_a_webhook_says_the_truncation_is_unknown(tmp_path):
    store, _config = build(tmp_path, failed=False, no_reason=True)
    ok = Receiver(200)
    try:
        n = _notifier(store, [ok.url()])
        for e in n.check():
            n.deliver(ok.url(), e)
        post = next(p for p in ok.posts if p["alert"] == "truncation_unknown")
        assert "finish_reason_path" in post["summary"]
    finally:
        ok.close()
        store.close()


def test_a_few_missing_reasons_leave_the_share_known(tmp_path):
    """At most 1% of completions without a reason: the share stands (the rule's edge)."""
    from runhealth.analysis import unknowns

    assert unknowns.unknown_from(1000, 10, 0) is None and unknowns.unknown_from(1000, 11, 0) is not None
    assert unknowns.unknown_from(1000, 0, 11).text.startswith("No token count on 1.1% of completions")
    assert unknowns.unknown_from(0, 0, 0) is None


# -- the demo (#39 item 5) -------------------------------------------------------------------------
def test_the_demos_failed_requests_reach_the_agents_reply(tmp_path):
    """The demo writes ~0.5% OpenAI Batch failures (demo.FAILED_SHARE); the real agent counts each
    one apart, exactly the simulator's truth: not a completion, not an answered prompt."""
    from runhealth import demo

    assert demo.FAILED_SHARE == 0.005  # the demo shows failed requests
    sim = demo.Simulator(tmp_path, seed=21)
    sim.shard_dir.mkdir(parents=True)
    sim.write_backlog(4000)
    lines = [
        json.loads(x) for p in sim.shard_dir.glob("*.jsonl") for x in p.read_text().splitlines() if '"broken"' not in x
    ]
    written = [x["custom_id"] for x in lines if (x.get("response") or {}).get("status_code") == 500]
    assert sorted(written) == sorted(sim.fields.failed)  # every failed line written as a Batch 500
    assert 5 <= len(written) <= 45  # ~0.5% of 4,000
    reply = agent.handle(
        {
            "op": "poll",
            "gpu": "off",
            "metrics_urls": [],
            "shards": {"globs": [str(sim.shard_dir / "*.jsonl")], "budget_bytes": 1 << 30},
        }
    )
    updates = [ingest.shard_update(p, e) for p, e in reply["shards"]["files"].items()]
    assert sum(u.failed_total for u in updates) == len(sim.fields.failed)
    assert sum(u.completions for u in updates) == len(lines) - len(sim.fields.failed)


# -- through the real collector and agent ----------------------------------------------------------
def test_the_collector_stores_an_agents_failed_part_and_refuses_a_broken_one(tmp_path):
    """Real local agents over the collector; the `failed` part is added to each real reply at the
    transport (the boundary), as an agent that detects failures sends it."""
    import sys

    from shardgen import truth_rows, write_shard

    from runhealth.collect.collector import Collector
    from runhealth.errors import AgentError
    from runhealth.settings.config import NodeConfig, RunConfig

    parts = {"n1": [["expired", 3]], "n2": {"expired": 3}}  # n2's agent breaks the contract
    nodes = []
    for name in parts:
        (tmp_path / name).mkdir()
        write_shard(tmp_path / name / "a.jsonl", truth_rows(200, 1))
        nodes.append(
            NodeConfig(
                name=name, host="local", shards=[str(tmp_path / name / "*.jsonl")], python=sys.executable, gpu="off"
            )
        )
    store = Store(tmp_path / "s.sqlite3")
    with Collector(RunConfig(name="t", nodes=nodes, interval_s=0.5), store) as collector:
        for name, part in parts.items():
            transport = collector.pollers[name].transport
            real = transport.request

            def request(obj, timeout, real=real, part=part):
                reply = real(obj, timeout)
                for e in (reply.get("shards") or {}).get("files", {}).values():
                    if e.get("lines"):
                        e["failed"] = part
                return reply

            transport.request = request
        results = collector.poll_once()
    assert isinstance(results["n2"], AgentError) and "'failed' must be a list" in str(results["n2"])
    by = {n["name"]: n for n in store.nodes()}
    assert "breaks the wire contract: shard " in by["n2"]["last_error"] and by["n2"]["completions"] == 0
    assert store.failed_rows() == [{"node": "n1", "reason": "expired", "count": 3}]
    assert by["n1"]["completions"] == 200
    store.close()


def test_the_samples_population_counts_completions_only(tmp_path):
    """The Samples page's "n of N" (#39): N counts completions, not the failed request lines (nor
    malformed or blank ones) the agents drew among. OpenAI Batch shards with ~6% failed lines,
    through real local agents and the real scanner; the truth comes from the generated outcomes."""
    import sys

    import formatgen

    from runhealth.collect.collector import Collector
    from runhealth.settings.config import NodeConfig, RunConfig

    nodes, completions, failed = [], 0, 0
    for i, name in enumerate(("n1", "n2")):
        (tmp_path / name).mkdir()
        shard = tmp_path / name / "a.jsonl"
        truth = formatgen.write_shard(shard, "openai-batch", 300 + 100 * i, seed=5 + i)
        with shard.open("a") as f:
            f.write('{"custom_id": "broken", "response": {"status_code": 200\n\n')  # one malformed, one blank
        completions, failed = completions + truth.completions, failed + sum(truth.failed.values())
        nodes.append(NodeConfig(name=name, host="local", shards=[str(shard)], python=sys.executable, gpu="off"))
    assert failed >= 20  # the shards hold failed lines to leave out
    store = Store(tmp_path / "s.sqlite3")
    try:
        with Collector(RunConfig(name="t", nodes=nodes, interval_s=0.5), store) as collector:
            collector.poll_once()
            assert sum(r["count"] for r in store.failed_rows()) == failed
            samples, population, errors = collector.sample_now(60, seed=3)
    finally:
        store.close()
    assert errors == {} and population == completions and len(samples) == 60


def test_a_shard_in_an_unknown_format_reads_unknown_naming_every_formats_fields(tmp_path, capsys):
    """A format no entry knows (the finish reason and the tokens under keys of its own): `scan`
    through the real scanner says "unknown", never 0%, and names the fields of every format
    entry (node/formats.py), so a format added there is named with no second list."""
    from runhealth.node import formats

    shard = tmp_path / "a.jsonl"
    rows = [
        {"req": f"r{i}", "out": {"why": "cut" if i % 5 else "eos", "n": 512}, "text": "w " * 40} for i in range(200)
    ]
    shard.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["scan", str(shard), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completions"] == 200 and report["at_ceiling_fraction"] is None
    why = report["truncated_unknown"]["why"]
    assert report["truncated_unknown"]["missing_finish_reason"] == 200
    assert report["truncated_unknown"]["estimated_tokens"] == 200
    # every entry's first finish and token path, spelled as people write them
    for body in (formats.FLAT, *formats.BODIES):
        for path in (body.finish[0], body.tokens[0]):
            named = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
            assert named in why, (body.name, named)
    assert cli.main(["scan", str(shard)]) == 0
    assert "at the ceiling: unknown. No finish reason on 100.0% of completions" in capsys.readouterr().out
