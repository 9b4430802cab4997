"""Stragglers (#33 item 6): each node's ETA to its share, and the Overview's line when one is late.

The pure parts (the batch-means ETA interval, the late rule, the words) are checked on numbers
worked by hand; the model and the pages on a store built poll by poll as the collector builds it
(Store.write_poll): node-4 writes a third as fast as the others, so at its own rate it writes
its share of the target hours after the run's ETA.
"""

from __future__ import annotations

import json
import math
import random
import time

import pytest
import store_fixtures
from store_fixtures import write_reply
from test_pages import _clear_streamlit_caches, assert_clean, run_page, texts  # noqa: F401 (autouse fixture)

from runhealth import cli
from runhealth.analysis import rates, stragglers
from runhealth.screens import etas, nodes, overview, runeta
from runhealth.settings.config import load_config
from runhealth.store import Store

ROUNDS = 120  # 20 min of 10 s polls: the 15-min average holds the run's writing
TARGET = 40_000


def shares(target, done, cps, var, per_node):
    """The stragglers' record with the run's ETA from runeta (the one place it is computed)."""
    return stragglers.stragglers(target, *runeta.rate_eta(done, target, cps, var), per_node)


def uneven_run(tmp_path, slow: float = 1 / 3, seed: int = 3, rounds: int = ROUNDS):
    """4 nodes polled every 10 s for 20 min ending now: ~30 completions a poll each, node-4 `slow`
    times that (noise of a few completions a poll). Returns (store, config path, now)."""
    rng = random.Random(seed)
    now = time.time()
    store = Store(tmp_path / "x.sqlite3")
    for k in range(rounds):
        ts = now - (rounds - 1 - k) * 10
        for i in range(1, 5):
            n = max(1, round((30 * (slow if i == 4 else 1)) + rng.gauss(0, 3)))
            counts = store_fixtures.lengths(rng, n, 0.1)
            tokens = sum(t * c for t, _, _, c in counts)
            entry = {"inode": 10_000 * i + k, "size": tokens * 4, "offset_from": 0, "offset": tokens * 4}
            entry.update(reset=False, lines=n, malformed=0, tokens=tokens, counts=counts, error=None)
            reply = store_fixtures.poll_reply(ts + 0.3, [], {f"/data/out/r{k}.jsonl": entry})
            write_reply(store, f"node-{i}", reply, ts, rtt_ms=4.0)
    config = store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3", target=TARGET)
    return store, config, now


# -- pure parts ------------------------------------------------------------------------------------
def test_the_eta_interval_follows_the_rates_interval():
    # 1,000 left at 10/s (sd 1/s): 100 s, from 1000/11.96 to 1000/8.04 s.
    lo, hi = rates.eta_interval(9_000, 10_000, 10.0, 1.0)
    assert math.isclose(lo, 1000 / (10 + rates.Z95)) and math.isclose(hi, 1000 / (10 - rates.Z95))
    assert rates.eta_interval(9_000, 10_000, 1.0, 1.0) == (1000 / (1 + rates.Z95), math.inf)  # reaches 0/s
    assert rates.eta_interval(10_000, 10_000, 1.0, 1.0) == (0.0, 0.0)
    assert rates.eta_interval(9_000, None, 10.0, 1.0) is None and rates.eta_interval(9_000, 10_000, 10.0, None) is None


def test_a_node_is_late_only_when_its_interval_lies_after_the_runs():
    # Target 4,000 over 4 nodes: 1,000 each. The run: 1,000 done at 1.0/s -> 3,000 s.
    per_node = {f"n{i}": (300, 0.3, 0.0001) for i in (1, 2, 3)} | {"n4": (100, 0.1, 0.0001)}
    found = shares(4_000, 1_000, 1.0, 0.0004, per_node)
    assert found is not None and found.share == 1_000
    by = {n.node: n for n in found.nodes}
    assert math.isclose(by["n1"].eta_s or 0, 700 / 0.3) and math.isclose(by["n4"].eta_s or 0, 900 / 0.1)
    assert [n.node for n in found.late] == ["n4"] and math.isclose(found.most_done_s or 0, 700 / 0.3)
    # The same slow node with a rate too noisy to tell: its interval reaches the run's, not late.
    noisy = shares(4_000, 1_000, 1.0, 0.0004, per_node | {"n4": (100, 0.1, 0.01)})
    assert noisy is not None and noisy.late == ()
    # A node past its share is done; one without a rate has no ETA and is never called late.
    done = shares(4_000, 1_000, 1.0, 0.0004, per_node | {"n1": (1_200, 0.3, 0.0001), "n2": (300, None, None)})
    assert done is not None and {n.node: n.eta_s for n in done.nodes}["n1"] == 0.0
    assert {n.node: n.eta_s for n in done.nodes}["n2"] is None and "n2" not in [n.node for n in done.late]
    assert shares(None, 1_000, 1.0, 0.0004, per_node) is None


def test_a_fleet_of_late_nodes_is_split_without_comparing_node_records(monkeypatch):
    # #42 item 3: `n not in late` compared each node's NodeEta with every late one (2,000 nodes,
    # 1,000 late: a million dataclass comparisons, a third of the Overview's build at 1,024 nodes).
    # Now by name: the same split, and no record is ever compared.
    def refuse(self, other):
        raise AssertionError("NodeEta records compared")

    monkeypatch.setattr(stragglers.NodeEta, "__eq__", refuse)
    # Share 2,000 each; the run: 3.6M left at 200/s, 18,000 s. "s": 19,000 s, sure of it (late);
    # "h": 19,000 s, too noisy to tell (not late, but a hold may keep it); "f": 5,667 s.
    per_node = {f"s{i:04d}": (100, 0.1, 1e-6) for i in range(1_000)}
    per_node |= {f"h{i:04d}": (100, 0.1, 0.01) for i in range(500)} | {
        f"f{i:04d}": (300, 0.3, 1e-6) for i in range(500)
    }
    found = shares(4_000_000, 400_000, 200.0, 0.2, per_node)
    assert found is not None and len(found.late) == 1_000 and {n.node[0] for n in found.late} == {"s"}
    assert math.isclose(found.most_done_s or 0, 19_000)
    assert runeta.holdable(found) == frozenset(f"h{i:04d}" for i in range(500))


def test_the_line_names_the_late_nodes_with_their_clock_times():
    per_node = {f"n{i}": (300, 0.3, 0.0001) for i in (1, 2, 3)} | {"n4": (100, 0.1, 0.0001)}
    found = shares(4_000, 1_000, 1.0, 0.0004, per_node)
    now = time.mktime((2026, 12, 5, 10, 0, 0, 0, 0, -1))
    assert etas.straggler_line(found, now) == "most nodes done by 10:38; n4 finishes at 12:30"
    assert "target / 4 nodes = 1,000 completions" in etas.assumption(found)  # type: ignore[arg-type]
    assert etas.eta_cells(found, now)["n4"] == "12:30 (in 2.5 h)"
    pair = shares(2_000, 400, 0.4, 0.0002, {"n1": (300, 0.3, 0.0001), "n4": (100, 0.1, 0.0001)})
    assert etas.straggler_line(pair, now) == "n1 done by 10:38; n4 finishes at 12:30"  # two nodes: the other named
    # #41: the Nodes page's caption said "Loc done by": a sentence capitalises its own words only.
    lower = shares(2_000, 400, 0.4, 0.0002, {"loc": (300, 0.3, 0.0001), "n4": (100, 0.1, 0.0001)})
    assert etas.straggler_sentence(lower, now).startswith("loc done by 10:38; ")
    assert etas.straggler_sentence(found, now).startswith("Most nodes done by 10:38; ")
    even = shares(4_000, 1_000, 1.0, 0.0004, {f"n{i}": (250, 0.25, 0.0001) for i in range(4)})
    assert etas.straggler_line(even, now) == ""


# -- the model, the pages, status --json -----------------------------------------------------------
def test_the_overview_names_the_slow_node_and_the_nodes_table_gives_each_eta(tmp_path, monkeypatch):
    store, config, now = uneven_run(tmp_path)
    cfg = load_config(config)
    m = overview.overview(store, cfg, now)
    assert m.state == "writing" and m.eta_s is not None and m.stragglers is not None
    assert [n.node for n in m.stragglers.late] == ["node-4"]
    slow = next(n for n in m.stragglers.nodes if n.node == "node-4")
    # Its own numbers: share 10,000, about 1 completion/s: ~2 h 20 min, past the run's ~45 min.
    assert slow.share == TARGET / 4 and 0.8 < (slow.completions_per_s or 0) < 1.2
    assert slow.eta_s is not None and m.stragglers.run_eta_s is not None and slow.eta_s > 2 * m.stragglers.run_eta_s
    # Fixed shares (the default): the run ends when node-4 writes its share, and its ETA says so (#41).
    assert m.eta_s == slow.eta_s and m.run_eta is not None and m.run_eta.last_node == "node-4"
    eta_tile = next(t for t in m.tiles if t.label == "ETA")
    assert eta_tile.sub.startswith("node-4's share ends the run") and m.headline()["eta_last_node"] == "node-4"
    line = m.straggler_line
    assert line.startswith("most nodes done by ") and "; node-4 finishes at " in line
    assert m.headline()["straggler_line"] == line and m.headline()["late_nodes"] == ["node-4"]
    store.close()
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    shown = texts(at)
    assert "Stragglers:" in shown and "node-4 finishes at" in shown
    nodes_page = run_page("nodes", config, monkeypatch)
    assert_clean(nodes_page)
    table = next(df.value for df in nodes_page.dataframe if "ETA (its share)" in df.value.columns)
    cells = dict(zip(table["node"], table["ETA (its share)"], strict=True))
    assert set(cells) == {"node-1", "node-2", "node-3", "node-4"} and all("(in " in c for c in cells.values())
    assert "target / 4 nodes = 10,000 completions" in texts(nodes_page)


def test_status_prints_the_same_straggler_line(tmp_path, capsys):
    store, config, now = uneven_run(tmp_path)
    store.close()
    assert cli.main(["status", "--config", str(config), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["late_nodes"] == ["node-4"] and "; node-4 finishes at " in record["straggler_line"]
    assert record["node_share"] == TARGET / 4 and set(record["node_eta_s"]) == {f"node-{i}" for i in range(1, 5)}
    assert cli.main(["status", "--config", str(config)]) == 0
    assert "  most nodes done by " in capsys.readouterr().out


def test_even_nodes_give_no_straggler_line(tmp_path):
    store, config, now = uneven_run(tmp_path, slow=1.0)
    m = overview.overview(store, load_config(config), now)
    assert m.stragglers is not None and m.stragglers.late == () and m.straggler_line == ""
    n = nodes.nodes(store, load_config(config), now)
    assert set(n.eta_cells) == {"node-1", "node-2", "node-3", "node-4"}
    assert n.to_json()["late_nodes"] == []


def test_the_averages_one_pass_agrees_with_the_windowed_rate():
    """rates.window_rates (the 15-min average with its variance, activity.node_rate's) gives
    windowed_rate's numbers: a span straddling the window start counts pro rata in both."""
    rng = random.Random(5)
    points = [(k * 10.0 + rng.random(), rng.randint(0, 9), rng.randint(0, 9000), k == 0) for k in range(200)]
    for window in (60.0, 900.0, 5_000.0):
        cps, tps, var = rates.window_rates(points, window, 1_995.0)
        assert (cps, tps) == pytest.approx(rates.windowed_rate(points, window, 1_995.0))
        assert var is not None and var > 0
    assert rates.window_rates([], 900.0) == (None, None, None)


def test_a_straggler_stays_named_until_its_interval_overlaps_the_runs_for_a_few_polls(tmp_path):
    """#41: the straggler line came and went between polls. node-4 writes a third of the others'
    rate for 20 min, then three times theirs: the late rule (its ETA interval wholly after the
    run's) lets go of it at some poll while its ETA still lies after the run's. A sequence of
    Overview models, one a poll as the store grows: the named node stays named until the rule has
    not named it for runeta.LATE_HOLD_POLLS polls (main dropped it at the first such poll), and
    never while its ETA is before the run's."""
    rng = random.Random(7)
    start = time.time() - 60 * 60
    store = Store(tmp_path / "x.sqlite3")
    config = load_config(store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3", target=TARGET))
    strict: list[bool] = []
    shown: list[bool] = []
    for k in range(300):
        ts = start + 10 * k
        for i in range(1, 5):
            pace = 30 * ((1 / 3 if k < ROUNDS else 3) if i == 4 else 1)
            n = max(1, round(pace + rng.gauss(0, 3)))
            counts = store_fixtures.lengths(rng, n, 0.1)
            tokens = sum(t * c for t, _, _, c in counts)
            entry = {"inode": 10_000 * i + k, "size": tokens * 4, "offset_from": 0, "offset": tokens * 4}
            entry.update(reset=False, lines=n, malformed=0, tokens=tokens, counts=counts, error=None)
            write_reply(store, f"node-{i}", store_fixtures.poll_reply(ts + 0.3, [], {f"/o/r{k}.jsonl": entry}), ts)
        if k < ROUNDS:
            continue
        m = overview.overview(store, config, ts + 1)
        s = m.stragglers
        assert s is not None and s.run_eta_interval_s is not None
        slow = next(n for n in s.nodes if n.node == "node-4")
        strict.append(slow.eta_interval_s is not None and slow.eta_interval_s[0] > s.run_eta_interval_s[1])
        shown.append("node-4" in [n.node for n in s.late])
        if shown[-1]:
            assert (slow.eta_s or 0) > (s.run_eta_s or 0)  # never named while its ETA is before the run's
        if not any(strict[-runeta.LATE_HOLD_POLLS :]):
            assert not shown[-1]  # let go after LATE_HOLD_POLLS polls the rule did not name it
        if len(strict) > 2 and not strict[-1] and strict[-2]:
            break
    store.close()
    assert strict[0] and shown[0], "the premise: node-4 starts out late"
    assert not strict[-1] and shown[-1], (strict, shown)  # the rule let go; the line keeps naming it


def test_no_node_eta_while_the_run_is_too_young_for_one(tmp_path, monkeypatch):
    """#41: in the demo's first 15 minutes the Nodes page gave each node an ETA while the Overview
    refused one ("after 15 min of writing"). 5 min of writing: the same too-young rule
    (runeta.enough_for_eta) on both, and the Nodes page says why."""
    store, config, now = uneven_run(tmp_path, rounds=30)
    cfg = load_config(config)
    m = overview.overview(store, cfg, now)
    n = nodes.nodes(store, cfg, now)
    store.close()
    assert m.state == "writing" and m.eta_s is None and m.stragglers is None  # the Overview refuses one
    assert n.stragglers is None and n.eta_cells == {} and n.to_json()["node_eta_s"] == {}
    assert "of writing" in n.eta_caption and "as the Overview" in n.eta_caption
    at = run_page("nodes", config, monkeypatch)
    assert_clean(at)
    assert not [df for df in at.dataframe if "ETA (its share)" in df.value.columns]
    assert any("No node ETA while the run has none (after " in c.value for c in at.caption)
