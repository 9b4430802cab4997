"""What the cut cost (#33 item 2): the share of tokens cut at the ceiling, tokens per usable
completion and GPU energy per usable token, on every consumer.

A run is written through `Store.write_poll` (store_fixtures.write_reply: ingest.read_poll, then write_poll) as the collector writes it (tests/store_fixtures.py):
two nodes, four polls, shard counts drawn at random with the truth kept apart; node-1 has a GPU
whose NVML energy counter resets (the driver reloaded) and one whose counter is NOT_SUPPORTED
(so its energy is power x time), node-2 a GPU with a steady counter. The figures are checked
against that truth on the Overview model, its page (AppTest), `runhealth status --json`, the
Nodes page, /metrics (and promtool's lint) and Compare.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import store_fixtures
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from store_fixtures import write_reply
from test_pages import _clear_streamlit_caches, run_page, texts  # noqa: F401 (autouse fixture)

from runhealth import cli
from runhealth.alerting import exporter
from runhealth.analysis import stats, tokencost
from runhealth.screens import compare as compare_model
from runhealth.screens import nodes as nodes_model
from runhealth.screens import overview
from runhealth.screens import runfigures as runcompare
from runhealth.screens import waste as waste_words
from runhealth.settings.config import load_config
from runhealth.store import Store, energymeter

CEILING = 4096
DT = 10.0
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


# -- the energy arithmetic ----------------------------------------------------------------------
def R(ts, counter=None, power=None, uuid="GPU-0"):
    return energymeter.Reading(ts, uuid, counter, power)


def test_counter_difference_is_the_energy():
    got = energymeter.step(R(0, 1_000_000), R(10, 7_500_000))
    assert (got.joules, got.gpu_s, got.source, got.reset) == (6500.0, 10, energymeter.COUNTER, False)


def test_first_reading_is_only_a_baseline():
    assert energymeter.step(None, R(10, 7_500_000)) == energymeter.Step(0.0, 0.0, None)


def test_counter_reset_counts_energy_since_the_reload():
    """The driver reloaded between polls: the counter starts again at 0, so the reading itself is
    what was used since (never a negative or a 2^64 wrap)."""
    got = energymeter.step(R(0, 9_000_000), R(10, 2_000_000))
    assert (got.joules, got.source, got.reset) == (2000.0, energymeter.COUNTER, True)


def test_another_gpu_under_the_same_index_is_a_new_baseline():
    got = energymeter.step(R(0, 9_000_000, uuid="GPU-a"), R(10, 9_500_000, uuid="GPU-b"))
    assert got.source is None and got.joules == 0.0


def test_not_supported_counter_falls_back_to_power_times_time():
    """NVML's NOT_SUPPORTED reaches the store as energy_mj None: power x time (trapezoid), said so."""
    got = energymeter.step(R(0, None, 600.0), R(10, None, 700.0))
    assert (got.joules, got.source) == (6500.0, energymeter.POWER_X_TIME)
    assert energymeter.step(R(0, None, None), R(10, None, 700.0)).source is None


# -- a run written as the collector writes it ---------------------------------------------------
def _counts(rng: random.Random, n: int) -> list[list]:
    c: Counter = Counter()
    for _ in range(n):
        x = rng.random()
        if x < 0.18:
            c[(CEILING, "length")] += 1
        elif x < 0.20:
            c[(rng.randint(1000, CEILING - 1), "length")] += 1  # context-window stops: not cut, not usable
        elif x < 0.22:
            c[(rng.randint(10, 3000), "abort")] += 1
        else:
            c[(rng.randint(50, 3000), "stop")] += 1
    return [[t, f, 0, k] for (t, f), k in sorted(c.items())]


def _device(index, counter, power_w, uuid):
    d = store_fixtures.gpu_device(index, 95.0, power_w=power_w)
    d["uuid"] = uuid
    d["energy_mj"] = counter
    return d


# node -> per poll: list of (counter_mj or None, power_w) per GPU
GPUS = {
    "node-1": [
        [(1_000_000, 650.0), (None, 600.0)],
        [(7_500_000, 650.0), (None, 700.0)],  # +6500 J ; (600+700)/2*10 = 6500 J
        [(3_000_000, 650.0), (None, 700.0)],  # reset: +3000 J ; 7000 J
        [(9_500_000, 650.0), (None, 500.0)],  # +6500 J ; 6000 J
    ],
    "node-2": [
        [(50_000_000, 400.0)],
        [(54_000_000, 400.0)],
        [(58_000_000, 400.0)],
        [(62_000_000, 400.0)],
    ],
}
JOULES = {"node-1": 6500 + 3000 + 6500 + 6500 + 7000 + 6000, "node-2": 12_000}
INTEGRATED = {"node-1": 6500 + 7000 + 6000, "node-2": 0}
GPU_S = {"node-1": 2 * 3 * DT, "node-2": 3 * DT}


def build(path: Path, now: float, seed: int = 7) -> tuple[Store, dict]:
    """Four polls of two nodes; returns the store and the truth: every count row written, and the
    usable tokens of the measured polls (2-4; poll 1 is the first scan, backfill)."""
    rng = random.Random(seed)
    store = Store(path)
    truth: dict = {"rows": [], "usable_measured": Counter(), "usable_n_measured": Counter()}
    offsets: dict[str, int] = {}
    for k in range(4):
        ts = now - (3 - k) * DT - 1
        for node, polls in GPUS.items():
            counts = _counts(rng, 300 + 50 * k)
            truth["rows"] += counts
            tokens = sum(t * n for t, _f, _e, n in counts)
            start = offsets.get(node, 0)
            offsets[node] = start + tokens * 4
            if k > 0:
                truth["usable_measured"][node] += sum(t * n for t, f, _e, n in counts if f == "stop")
                truth["usable_n_measured"][node] += sum(n for _t, f, _e, n in counts if f == "stop")
            files = {
                f"/data/out/{node}.jsonl": {
                    "inode": 1000 + int(node[-1]),
                    "size": offsets[node],
                    "offset_from": start,
                    "offset": offsets[node],
                    "reset": False,
                    "malformed": 0,
                    "tokens": tokens,
                    "counts": counts,
                    "error": None,
                }
            }
            devices = [_device(i, c, p, f"GPU-{node}-{i}") for i, (c, p) in enumerate(polls[k])]
            write_reply(store, node, store_fixtures.poll_reply(ts + 0.2, devices, files), ts, rtt_ms=5.0)
    return store, truth


def expected(truth: dict) -> dict:
    """The figures from the raw count rows, computed here without the code under test."""
    all_t = sum(t * n for t, _f, _e, n in truth["rows"])
    cut_t = sum(t * n for t, f, _e, n in truth["rows"] if f == "length" and t >= CEILING)
    cut_n = sum(n for t, f, _e, n in truth["rows"] if f == "length" and t >= CEILING)
    n = sum(n for _t, _f, _e, n in truth["rows"])
    usable_n = sum(n for _t, f, _e, n in truth["rows"] if f == "stop")
    usable_m = sum(truth["usable_measured"].values())
    joules = sum(JOULES.values())
    return {
        "all": all_t,
        "cut": cut_t,
        "cut_n": cut_n,
        "n": n,
        "token_share": cut_t / all_t,
        "completion_share": cut_n / n,
        "per_usable": all_t / usable_n,
        "joules": joules,
        "j_per_m": joules / usable_m * 1e6,
        "gpu_h_per_m": sum(GPU_S.values()) / 3600 / usable_m * 1e6,
        "integrated": sum(INTEGRATED.values()),
    }


@pytest.fixture
def run(tmp_path):
    now = time.time()
    store, truth = build(tmp_path / "x.sqlite3", now)
    config = store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3", nodes=2)
    yield store, truth, expected(truth), config, now
    store.close()


def test_store_sums_energy_and_tokens_over_the_same_polls(run):
    store, truth, _want, _config, _now = run
    rows = {r["node"]: r for r in store.node_energy()}
    for node in GPUS:
        r = rows[node]
        assert r["joules"] == pytest.approx(JOULES[node]) and r["integrated_j"] == pytest.approx(INTEGRATED[node])
        assert r["gpu_s"] == pytest.approx(GPU_S[node])
        assert r["usable_tokens"] == truth["usable_measured"][node]
        assert r["usable_completions"] == truth["usable_n_measured"][node]
    assert rows["node-1"]["resets"] == 1 and rows["node-2"]["resets"] == 0
    assert (rows["node-1"]["counter_gpus"], rows["node-2"]["counter_gpus"]) == (1, 1)


def test_overview_model_status_json_and_text(run, capsys):
    store, _truth, want, config, now = run
    m = overview.overview(store, load_config(config), now)
    assert m.summary.at_ceiling_tokens == want["cut"] and m.summary.tokens_total == want["all"]
    line = (
        f"{100 * want['completion_share']:.1f}% of completions, {100 * want['token_share']:.1f}% of tokens "
        f"were cut at 4,096"
    )
    assert m.waste_line.startswith(line)
    assert f"{want['per_usable']:,.0f} tokens per usable completion" in m.waste_line
    assert m.energy is not None and m.energy.joules == pytest.approx(want["joules"])
    assert m.energy.joules_per_m == pytest.approx(want["j_per_m"])
    assert "power × time" in m.energy_line  # node-1's second GPU has no counter: said on screen
    store.close()
    assert cli.main(["status", "--config", str(config), "--json"]) in (0, 1)
    record = json.loads(capsys.readouterr().out)
    assert record["truncated_tokens"] == want["cut"] and record["tokens_total"] == want["all"]
    assert record["truncated_tokens_pct"] == round(100 * want["token_share"], 2)
    assert record["tokens_per_usable_completion"] == round(want["per_usable"], 1)
    assert record["joules_per_1m_usable_tokens"] == round(want["j_per_m"], 1)
    assert record["gpu_hours_per_1m_usable_tokens"] == round(want["gpu_h_per_m"], 4)
    assert record["energy_source"] == "mixed" and record["waste_line"].startswith(line)
    cli.main(["status", "--config", str(config)])
    assert line in capsys.readouterr().out


def test_overview_page_shows_the_line(run, monkeypatch):
    _store, _truth, want, config, _now = run
    at = run_page("overview", config, monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    shown = texts(at)
    assert f"{100 * want['token_share']:.1f}% of tokens were cut at 4,096" in shown
    assert f"{100 * want['completion_share']:.1f}% of completions" in shown
    assert waste_words.fmt_joules(want["j_per_m"]) + " and" in shown and "power × time" in shown


def test_nodes_page_and_model_per_node(run, monkeypatch):
    store, truth, _want, config, now = run
    m = nodes_model.nodes(store, load_config(config), now)
    by_node = {c.node: c for c in m.costs}
    for node in GPUS:
        e = by_node[node].energy
        assert e is not None and e.joules_per_m == pytest.approx(JOULES[node] / truth["usable_measured"][node] * 1e6)
    at = run_page("nodes", config, monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    table = next(df.value for df in at.dataframe if "Energy per 1M usable tokens" in df.value.columns)
    row = table.set_index("Node").loc["node-2"]
    assert row["Energy per 1M usable tokens"] == waste_words.fmt_joules(
        JOULES["node-2"] / truth["usable_measured"]["node-2"] * 1e6
    )
    assert row["Energy from"] == "NVML energy counter"
    assert table.set_index("Node").loc["node-1"]["Energy from"].endswith("power × time (GPUs without the counter)")


def _families(store: Store, now: float) -> tuple[str, dict]:
    text = generate_latest(exporter.registry_for(store, clock=lambda: now)).decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_export_tokens_and_energy(run, tmp_path):
    store, truth, want, _config, now = run
    store.set_meta("run", {"name": "gen-run-42", "max_output_tokens": CEILING})
    text, fams = _families(store, now)
    tokens = {
        (s.labels["node"], s.labels["kind"]): s.value
        for s in fams["runhealth_generated_tokens"].samples
        if s.name.endswith("_total")
    }
    assert sum(v for (_n, k), v in tokens.items() if k == "all") == want["all"]
    assert sum(v for (_n, k), v in tokens.items() if k == "cut_at_ceiling") == want["cut"]
    (ratio,) = fams["runhealth_truncated_tokens_ratio"].samples
    assert ratio.value == pytest.approx(want["token_share"])
    joules = {(s.labels["node"], s.labels["source"]): s.value for s in fams["runhealth_gpu_energy_joules"].samples}
    assert joules[("node-1", "power_x_time")] == pytest.approx(INTEGRATED["node-1"])
    assert sum(joules.values()) == pytest.approx(want["joules"])
    (per,) = fams["runhealth_energy_per_usable_token_joules"].samples
    assert per.value * 1e6 == pytest.approx(want["j_per_m"])
    assert "# HELP runhealth_gpu_energy_joules_total GPU energy" in text
    lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert not [x for x in (lint.stdout + lint.stderr).splitlines() if "runhealth_gpu_energy" in x or "tokens" in x]


def test_compare_shows_energy_per_usable_token_a_vs_b(run, tmp_path):
    store_a, truth, want, _config, now = run
    store_b, truth_b = build(tmp_path / "b.sqlite3", now, seed=99)
    a = runcompare.run_numbers(store_a, "A", CEILING, None, False, now)
    b = runcompare.run_numbers(store_b, "B", CEILING, None, False, now)
    m = compare_model.compare(a, b, (60.0, 60.0), now, bootstrap=20)
    rows = {r["metric"]: r for r in m.rows}
    want_b = expected(truth_b)
    assert rows["energy per 1M usable tokens"]["A"] == waste_words.fmt_joules(want["j_per_m"])
    assert rows["energy per 1M usable tokens"]["B"] == waste_words.fmt_joules(want_b["j_per_m"])
    assert rows["energy per 1M usable tokens"]["B − A"] == f"{100 * (want_b['j_per_m'] / want['j_per_m'] - 1):+.0f}%"
    assert rows["tokens cut at the ceiling"]["A"] == f"{100 * want['token_share']:.1f}%"
    assert rows["tokens per usable completion"]["B"] == f"{want_b['per_usable']:,.0f}"
    store_b.close()


def test_loop_tokens_are_an_estimate_with_n_and_interval():
    hist = stats.LengthHist.from_rows([(CEILING, "length", 0, 20), (1000, "stop", 0, 80)])
    w = tokencost.waste(stats.summarize(hist, CEILING), (3, 10))
    cut = 20 * CEILING / (20 * CEILING + 80 * 1000)
    assert w.loops is not None and w.loops.share == pytest.approx(cut * 0.3)
    lo, hi = stats.wilson_interval(3, 10)
    assert (w.loops.low, w.loops.high) == (pytest.approx(cut * lo), pytest.approx(cut * hi))
    assert "3 of 10 sampled cut completions loop" in waste_words.waste_line(w)


def test_loop_sample_read_in_one_statement_equals_the_batch_count(tmp_path):
    """The Overview's one-statement read gives what loops.loop_sample gives over the whole batch."""
    from runhealth.analysis import loops

    store, _config = store_fixtures.make_store(tmp_path, "ceiling_18")
    assert store.latest_loop_sample() == loops.loop_sample(store.latest_sample_batch())
    assert store.latest_loop_sample()[1] > 0
    store.close()
