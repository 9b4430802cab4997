"""Issue 33 item 1's last part: progress AND ETA from distinct prompts (screens/runeta.py).

The scenario a completions ETA gets wrong: node n2 runs a relaunch of the same prompt list one
poll behind n1, so every prompt n1 answers is answered again by n2. The demo simulator writes n1's
lines (its own retries included), n2 writes copies of them; the real scanner counts each poll's
lines and the store writes them as the collector does, on a fixed clock, so the generated truth
gives both rates exactly: completions per second count both nodes' lines, new distinct prompts per
second only n1's first answers. With [run] expected_prompts the ETA is the prompts still to
answer over the prompts rate, about twice the completions ETA; without expected_prompts, or
with shards that carry no prompt ID, it stays on completions and says so.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from store_fixtures import poll_reply, write_reply
from test_pages import _clear_streamlit_caches, assert_clean, run_page, tile_blocks  # noqa: F401 (autouse fixture)

from runhealth import cli
from runhealth.collect.collector import Collector
from runhealth.demo import Simulator
from runhealth.node import scan
from runhealth.rules import activity
from runhealth.screens import derived, lengths, overview, runeta, runfigures
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store, rollup
from runhealth.store.migrations import STORE_VERSION

CEILING = 512  # short demo lines: a fast test
INTERVAL_S = 30.0
POLLS = 41  # 20 min of polls: the 15-min average holds the run's writing
PER_POLL = 6  # lines n1 writes between two polls (n2 copies them a poll later)
WINDOW_POLLS = 30  # the 15-min average is the last 30 spans of 30 s
GOAL = 9_000  # the run's prompts: [run] expected_prompts, and target_completions at one answer each


@dataclasses.dataclass
class Truth:
    """What the two nodes wrote, counted from the lines themselves, per poll (index: the poll)."""

    completions: list[int]  # well-formed lines counted at each poll (both nodes)
    new_prompts: list[int]  # prompt IDs the run had not seen before that poll
    answered: int = 0
    issued: int = 0

    def rate(self, per_poll: list[int]) -> float:
        """Per second over the 15-min average ending at the last poll (its last WINDOW_POLLS spans)."""
        return sum(per_poll[-WINDOW_POLLS:]) / (WINDOW_POLLS * INTERVAL_S)


def _ids(line: str) -> str | None:
    try:
        return json.loads(line).get("custom_id", "")
    except json.JSONDecodeError:
        return None  # the simulator's malformed lines: not completions


def _strip(line: str) -> str:
    """The line without a prompt ID (a shard that carries none)."""
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        return line
    r.pop("custom_id", None)
    r.pop("id", None)
    return json.dumps(r) + "\n"


def config_of(folder: Path, expected: int | None) -> RunConfig:
    nodes = [
        NodeConfig(
            name=n, host="local", shards=[str(folder / "shards" / f"{n}.jsonl")], python=sys.executable, gpu="off"
        )
        for n in ("n1", "n2")
    ]
    return RunConfig(
        name="relaunch-run",
        nodes=nodes,
        interval_s=INTERVAL_S,
        target_completions=GOAL,
        expected_prompts=expected,
        shared_queue=True,  # n2 answers n1's prompts again: no node holds a share of its own (#41)
        max_output_tokens=CEILING,
        store_path=str(folder / "store.sqlite3"),
    )


def build(folder: Path, now: float, with_ids: bool = True, polls: int = POLLS) -> Truth:
    """`polls` polls of n1 (fresh demo lines) and n2 (n1's previous lines again), ending at `now`."""
    sim = Simulator(folder, seed=5, ceiling=CEILING)
    sim.shard_dir.mkdir(parents=True)
    shards = {n: sim.shard_dir / f"{n}.jsonl" for n in ("n1", "n2")}
    for p in shards.values():
        p.write_text("")
    store = Store(folder / "store.sqlite3")
    truth, seen, last = Truth([], []), set(), []
    at = {n: (None, 0) for n in shards}
    for k in range(polls):
        ts = now - (polls - 1 - k) * INTERVAL_S
        fresh = [sim.completion_line(1) for _ in range(PER_POLL)] if k else []
        for node, lines in (("n1", fresh), ("n2", last)):
            with open(shards[node], "a", encoding="utf-8") as f:
                f.writelines(lines if with_ids else map(_strip, lines))
        ids = [i for i in map(_ids, fresh + last) if i is not None]
        truth.completions.append(len(ids))
        truth.new_prompts.append(len(set(ids) - seen))
        seen |= set(ids)
        last = fresh
        for node, path in shards.items():
            entry = scan.scan_file(str(path), *at[node], 1 << 30)
            at[node] = (entry["inode"], entry["offset"])
            write_reply(store, node, poll_reply(ts + 0.4, [], {str(path): entry}), ts, rtt_ms=5.0)
    store.close()
    truth.answered, truth.issued = len(seen), sim.fields.issued
    assert truth.answered == sim.fields.answered  # n2's copies answer no new prompt
    return truth


@pytest.fixture(scope="module")
def relaunch(tmp_path_factory):
    """(folder, truth, its config with expected_prompts, the time of its last poll)."""
    folder = tmp_path_factory.mktemp("relaunch")
    now = time.time()
    truth = build(folder, now)
    config = config_of(folder, GOAL)
    store = Store(config.store_path)
    store.set_meta("run", RunSettings.from_config(config).to_meta())  # as its collector records it
    store.close()
    return folder, truth, config, now


def _overview(config: RunConfig, now: float) -> overview.Overview:
    store = Store(config.store_path)
    try:
        return overview.overview(store, config, now)
    finally:
        store.close()


def copy_of(path, to):
    """A copy of the store at `path` (VACUUM INTO `to`), opened: a test changes it, not the fixture's."""
    src = Store(path)
    src.cursor(f"VACUUM INTO '{to}'")
    src.close()
    return Store(to)


def test_each_poll_row_holds_the_distinct_prompts_it_added(relaunch):
    folder, truth, config, _now = relaunch
    store = Store(config.store_path)
    rows = store.polls()
    store.close()
    added = [sum(r["prompts"] for r in rows[2 * k : 2 * k + 2]) for k in range(POLLS)]
    assert added == truth.new_prompts
    assert [r["prompts"] for r in rows if r["node"] == "n2"] == [0] * POLLS  # the relaunch adds none
    assert sum(added) == truth.answered


def test_the_eta_is_from_distinct_prompts_with_expected_prompts(relaunch):
    _folder, truth, config, now = relaunch
    m = _overview(config, now)
    cps, pps = truth.rate(truth.completions), truth.rate(truth.new_prompts)
    assert cps > 1.9 * pps  # the premise: every prompt answered twice
    assert m.state == "writing" and m.run_eta is not None and m.run_eta.basis == "prompts"
    assert m.run_eta.per_s == pytest.approx(pps, rel=1e-9)
    prompts_eta = (GOAL - truth.answered) / pps
    assert m.eta_s == pytest.approx(prompts_eta, rel=1e-9)
    completions_eta = (GOAL - sum(truth.completions)) / cps
    assert runeta.rate_eta(sum(truth.completions), GOAL, cps)[0] == pytest.approx(completions_eta, rel=1e-9)  # before
    assert m.eta_s > 2 * completions_eta  # twice the rate, and fewer to go: the completions ETA was far too early
    tile = next(t for t in m.tiles if t.label == "ETA")
    assert tile.sub == f"at the 15 min avg, {pps:,.1f} prompts/s" and tile.level == "ok"
    record = m.headline()
    assert record["eta_basis"] == "prompts" and record["eta_rate_per_s"] == round(pps, 3)
    assert record["prompts_per_s_15_min_avg"] == round(pps, 3)
    assert record["eta_hours_at_15_min_avg"] == round(prompts_eta / 3600, 2)
    # the stragglers stay on completions (each node's share of target_completions) and say so
    assert m.straggler_line.endswith(runeta.STRAGGLERS_NOTE) and record["straggler_line"] == m.straggler_line


def test_output_lengths_and_compare_take_the_same_eta(relaunch):
    """One ETA everywhere: Output lengths' ETA (its what-if's ETA change scales it) and the
    Compare page's ETA row are the Overview's, on the prompts basis."""
    _folder, truth, config, now = relaunch
    prompts_eta = (GOAL - truth.answered) / truth.rate(truth.new_prompts)
    store = Store(config.store_path)
    try:
        m = lengths.lengths(store, config, now)
        live = runfigures.run_numbers(store, config.name, CEILING, GOAL, False, now)
    finally:
        store.close()
    assert m.eta_s == pytest.approx(prompts_eta, rel=1e-9) and m.to_json()["eta_basis"] == "prompts"
    change = m.eta_change(dataclasses.replace(_what_if(), extra_tokens_per_completion=m.summary.tokens.mean))
    assert change.eta_s_new == pytest.approx(2 * prompts_eta, rel=1e-9)  # twice the tokens: twice the time
    assert live.eta_s == pytest.approx(prompts_eta, rel=1e-9) and live.eta_basis == "prompts"
    row = next(
        r
        for r in runfigures.comparison_rows(live, live, runfigures.compare_runs(live, live, 10))
        if r["metric"] == "ETA"
    )
    assert row["A"] == f"{prompts_eta / 3600:,.1f} h (distinct prompts)"


def _what_if():
    """A what-if record (only its extra tokens are read by eta_change)."""
    from runhealth.analysis.whatif import WhatIf

    fields = {f.name: None for f in dataclasses.fields(WhatIf)}
    return WhatIf(**{**fields, "extra_tokens_interval": None})


def test_without_expected_prompts_the_eta_stays_on_completions(relaunch):
    _folder, truth, config, now = relaunch
    m = _overview(dataclasses.replace(config, expected_prompts=None), now)
    cps = truth.rate(truth.completions)
    assert m.run_eta is not None and m.run_eta.basis == "completions"
    assert m.eta_s == pytest.approx((GOAL - sum(truth.completions)) / cps, rel=1e-9)
    tile = next(t for t in m.tiles if t.label == "ETA")
    assert tile.sub == f"at the 15 min avg, {cps:,.1f} completions/s"
    record = m.headline()
    assert record["eta_basis"] == "completions" and record["eta_basis_note"] == ""
    assert record["prompts_per_s_15_min_avg"] == round(truth.rate(truth.new_prompts), 3)  # still reported


def test_shards_without_a_prompt_id_keep_the_completions_eta_and_say_why(tmp_path):
    now = time.time()
    truth = build(tmp_path, now, with_ids=False)
    config = config_of(tmp_path, GOAL)
    m = _overview(config, now)
    cps = truth.rate(truth.completions)
    assert m.run_eta is not None and m.run_eta.basis == "completions"
    assert m.eta_s == pytest.approx((GOAL - sum(truth.completions)) / cps, rel=1e-9)
    tile = next(t for t in m.tiles if t.label == "ETA")
    assert tile.sub.startswith(f"at the 15 min avg, {cps:,.1f} completions/s · on completions:")
    assert "prompt_id_path" in tile.sub and m.headline()["eta_basis_note"] == runeta.NO_ID_NOTE
    assert m.headline()["prompts_per_s_15_min_avg"] is None  # no ID: no prompts rate, never a 0


def test_a_stalled_run_has_no_prompts_eta_and_still_names_its_basis(relaunch, tmp_path):
    _folder, _truth, config, now = relaunch
    store = copy_of(config.store_path, tmp_path / "stalled.sqlite3")
    shards = store.query("SELECT node, path, inode, offset FROM shards")
    for k in range(1, 11):  # the collector still polls for 5 min; nothing new is written: stalled
        ts = now + k * INTERVAL_S
        for s in shards:
            entry = scan.scan_file(s["path"], s["inode"], s["offset"], 1 << 30)
            write_reply(store, s["node"], poll_reply(ts + 0.4, [], {s["path"]: entry}), ts, rtt_ms=5.0)
    m = overview.overview(store, config, now + 10 * INTERVAL_S)
    live = runfigures.run_numbers(store, config.name, CEILING, GOAL, False, now + 10 * INTERVAL_S)
    store.close()
    assert m.state == "stalled" and m.eta_s is None
    assert live.eta_s is None and live.eta_why_none == "run stalled"  # Compare: the same rule
    tile = next(t for t in m.tiles if t.label == "ETA")
    assert (tile.value, tile.sub) == ("—", "no ETA: the run is stalled (no new completions)")
    record = m.headline()
    assert record["eta_hours_at_15_min_avg"] is None and record["eta_basis"] == "prompts"


def test_no_prompts_eta_before_the_average_holds_the_runs_writing(tmp_path):
    now = time.time()
    build(tmp_path, now, polls=11)  # 5 min of writing: the 15-min average does not hold it yet
    m = _overview(config_of(tmp_path, GOAL), now)
    assert m.state == "writing" and m.run_eta is not None and m.run_eta.per_s and m.eta_s is None
    tile = next(t for t in m.tiles if t.label == "ETA")
    assert (tile.value, tile.sub) == ("—", "after 15 min of writing (the average needs a full window)")
    assert m.headline()["eta_basis"] == "prompts" and m.headline()["eta_hours_at_15_min_avg"] is None


def test_all_expected_prompts_answered_is_done(relaunch):
    _folder, truth, config, now = relaunch
    m = _overview(dataclasses.replace(config, expected_prompts=truth.answered), now)
    tile = next(t for t in m.tiles if t.label == "ETA")
    assert (tile.value, tile.sub) == ("done", "all expected prompts answered") and m.eta_s == 0


def test_a_relaunch_reset_takes_its_prompts_out_of_the_poll(tmp_path):
    """A truncated shard's prompts leave the run: that poll's row says so (negative), and the
    rate clips it as the completions' rate clips a reset (no negative rate)."""
    now = time.time()
    truth = build(tmp_path, now)
    config = config_of(tmp_path, None)
    n1 = Path(config.nodes[0].shards[0])
    store = Store(config.store_path)
    before = store.prompt_summary()["distinct_prompts"]
    n1.write_text("")  # n1's shard truncated: the run keeps the prompts n2 answered again
    entry = scan.scan_file(str(n1), None, 0, 1 << 30)
    write_reply(store, "n1", poll_reply(now + INTERVAL_S + 0.4, [], {str(n1): {**entry, "reset": True}}), now + 30, 5.0)
    gone = before - store.prompt_summary()["distinct_prompts"]
    assert gone == truth.new_prompts[-1] > 0  # n1's last answers: n2 has not copied them yet
    assert store.polls()[-1]["prompts"] == -gone
    rates = activity.read_rates(store, now + INTERVAL_S, interval_s=INTERVAL_S)
    store.close()
    assert rates.prompts_per_s_15m is not None and rates.prompts_per_s_15m >= 0


def test_the_rollup_keeps_the_prompts_deltas(relaunch, tmp_path):
    _folder, truth, config, now = relaunch
    store = copy_of(config.store_path, tmp_path / "copy.sqlite3")
    rollup.rollup(store, now=now + 2 * 24 * 3600, pause_s=0)  # every raw poll folded into minutes
    assert store.cursor("SELECT COUNT(*) FROM polls").fetchone()[0] == 0
    assert store.cursor("SELECT SUM(prompts) FROM poll_rollup").fetchone()[0] == truth.answered
    store.close()


def _toml(config: RunConfig) -> str:
    out = ["[run]", f'name = "{config.name}"', f'store_path = "{config.store_path}"']
    out += [f"max_output_tokens = {CEILING}", f"target_completions = {GOAL}", f"interval_s = {int(INTERVAL_S)}"]
    out.append(f"expected_prompts = {config.expected_prompts}")
    for n in config.nodes:
        out += ["[[nodes]]", f'name = "{n.name}"', 'host = "local"', f"shards = {json.dumps(n.shards)}"]
        out += [f'python = "{sys.executable}"', 'gpu = "off"', ""]
    return "\n".join(out)


def test_status_json_and_the_overview_page_show_the_prompts_eta(relaunch, monkeypatch, capsys):
    folder, truth, config, _now = relaunch
    path = folder / "runhealth.toml"
    path.write_text(_toml(config), encoding="utf-8")
    pps = truth.rate(truth.new_prompts)
    assert cli.main(["status", "--config", str(path), "--json"]) in (0, 1)
    record = json.loads(capsys.readouterr().out)
    # read a few seconds after the last poll: the window moved by those seconds (rates ~ equal)
    assert record["eta_basis"] == "prompts" and record["eta_rate_per_s"] == pytest.approx(pps, rel=0.02)
    eta_h = (GOAL - truth.answered) / pps / 3600
    assert record["eta_hours_at_15_min_avg"] == pytest.approx(eta_h, rel=0.02)
    tile = next(t for t in record["tiles"] if t["label"] == "ETA")
    assert re.fullmatch(r"at the 15 min avg, [\d.,]+ prompts/s", tile["sub"]), tile
    at = run_page("overview", path, monkeypatch)
    assert_clean(at)
    eta = next(t for t in tile_blocks(at) if '<div class="rh-label">ETA</div>' in t)
    assert re.search(r'rh-sub">at the 15 min avg, [\d.,]+ prompts/s<', eta), eta
    assert "expected_prompts distinct prompts answered" in eta  # the tooltip says what it is from


def test_the_collector_writes_each_polls_new_prompts_through_a_real_sshd_node(tmp_path, sshd_node):
    """The real collector and agent over sshd: the polls' `prompts` sum to the run's distinct
    prompts, and a relaunch's copies (a new shard answering old prompts) add completions, no prompts."""
    sim = Simulator(tmp_path, seed=9, ceiling=CEILING)
    sim.shard_dir.mkdir(parents=True)
    sim.write_backlog(300)
    node = sshd_node("127.0.0.41").node_config(name="n1", gpu="off", shards=[str(sim.shard_dir / "*.jsonl")])
    config = dataclasses.replace(config_of(tmp_path, GOAL), nodes=[node])
    collector = Collector(config, Store(config.store_path))
    try:
        _poll_all(collector)
        polled, first, lines = len(collector.store.polls()), sim.fields.answered, sum(sim.fields.answers.values())
        copies = (sim.shard_dir / "node1-gpu0.jsonl").read_text(encoding="utf-8")
        (sim.shard_dir / "relaunch.jsonl").write_text(copies, encoding="utf-8")  # old prompts again
        sim.write_backlog(200)  # and new ones (with the simulator's own retries)
        _poll_all(collector)
        rows = collector.store.polls()
        assert sum(r["prompts"] for r in rows[:polled]) == first
        assert sum(r["prompts"] for r in rows[polled:]) == sim.fields.answered - first > 0
        assert sum(r["prompts"] for r in rows) == collector.store.prompt_summary()["distinct_prompts"]
        copied = sum(1 for line in copies.splitlines() if _ids(line) is not None)
        written = copied + sum(sim.fields.answers.values()) - lines
        assert sum(r["completions"] for r in rows[polled:]) == written and copied > 0  # the copies: completions only
    finally:
        collector.stop()
        collector.store.close()


def _poll_all(collector: Collector) -> None:
    for _ in range(50):
        collector.poll_once()
        if not collector.store.nodes()[0]["pending_bytes"]:
            return
    raise AssertionError("still pending")


def test_polls_from_before_migration_12_are_left_out_of_the_rate_not_counted_as_zero(tmp_path):
    """A store migrated mid-run: its older polls have no `prompts` (NULL). The prompts rate is
    taken over the polls that have one (3 new prompts a poll: 0.1/s), not as 0 over the whole
    window (which would say 0.067/s and make the ETA 50% late)."""
    rows = [(t, t + 0.4, 5, 500, 0, None if t < 600 else 3) for t in range(0, 1201, 30)]
    r = activity.node_rate(rows, 1200.0, 60.0, 900.0)
    assert r.prompts_per_s_15m == pytest.approx(0.1, rel=1e-12)
    assert r.completions_per_s_15m == pytest.approx(5 / 30, rel=1e-12)  # the completions' rate: every span
    no_ids = [(*row[:5], 0) for row in rows]  # shards without prompt IDs: every poll added none
    assert activity.node_rate(no_ids, 1200.0, 60.0, 900.0).prompts_per_s_15m is None  # no rate, never a 0


def test_migration_12_adds_the_column_and_keeps_older_polls(tmp_path):
    path = tmp_path / "old.sqlite3"
    Store(path).close()
    with sqlite3.connect(path) as db:  # the store as version 11 left it, with one poll
        for table in ("polls", "poll_rollup"):
            db.execute(f"ALTER TABLE {table} DROP COLUMN prompts")
        db.execute("ALTER TABLE polls DROP COLUMN interval_s")  # migration 13's (#40)
        db.execute("ALTER TABLE node_energy DROP COLUMN dropped_steps")
        db.execute("INSERT INTO polls VALUES (100.0, 'n1', 100.4, 5, 500, 0, 0, 0, 5.0)")
        db.execute("PRAGMA user_version = 11")
    store = Store(path)
    assert store.cursor("PRAGMA user_version").fetchone()[0] == STORE_VERSION  # 12, then the later steps
    assert [r["prompts"] for r in store.polls()] == [None]
    assert "prompts" in {r[1] for r in store.cursor("PRAGMA table_info(poll_rollup)")}
    store.close()


def test_the_completions_eta_and_the_run_state_are_computed_in_runeta_only():
    """#41: the ETA was computed in screens/derived.py (Standup.eta_s) and analysis/stragglers.py
    besides runeta, and the run state kept a second copy in store_eta (its own stall rule, which
    called a run that reached its target stalled). One place each: runeta."""
    root = Path(runeta.__file__).resolve().parents[1]
    for path in sorted((root / "screens").glob("*.py")):
        if path.name != "runeta.py":
            text = path.read_text(encoding="utf-8")
            assert "eta_seconds(" not in text and "eta_interval(" not in text, path.name
            assert "stall_state(" not in text or path.name == "published.py", path.name  # published: staleness only
            assert "def run_state" not in text, path.name
    strag = (root / "analysis" / "stragglers.py").read_text(encoding="utf-8")
    assert "eta_seconds(done, target" not in strag and "eta_interval(done, target" not in strag
    assert "eta_s" not in {f.name for f in dataclasses.fields(derived.Standup)}
