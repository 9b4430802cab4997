"""The screen models (runhealth.screens): one reading per screen, one run state, honest averages.

Stores are built through `Store.write_poll` (store_fixtures.write_reply: ingest.read_poll, then write_poll) as the collector builds them (tests/store_fixtures.py);
the Overview is checked as a model, on its page (AppTest) and through `runhealth status`, which
must all show the same record (issue 31, items 1 and 6).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import re
import time
from pathlib import Path

import pytest
import store_fixtures
from store_fixtures import write_reply
from test_pages import _clear_streamlit_caches, assert_clean, run_page  # noqa: F401 (autouse fixture)

from runhealth import cli
from runhealth.payloads import pagedata
from runhealth.payloads.pagetypes import GroupTable
from runhealth.screens import overview
from runhealth.settings.config import load_config
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store

NODES = 4


def grow(store: Store, ts: float, per_node: int, tag: str, seed: int = 1) -> None:
    """One poll round in which every node's new shard `tag` gains `per_node` completions
    (`per_node` = 0: a round with no growth, as a stalled writer's)."""
    rng = random.Random(seed)
    for i in range(1, NODES + 1):
        files = {}
        if per_node:
            counts = store_fixtures.lengths(rng, per_node, 0.18)
            tokens = sum(t * k for t, _, _, k in counts)
            size = tokens * 4 + per_node * 600
            files[f"/data/out/{tag}-{i}.jsonl"] = {
                "inode": hash((tag, i)) % 10**6 + 10**6,
                "size": size,
                "offset_from": 0,
                "offset": size,
                "reset": False,
                "lines": per_node,
                "malformed": 0,
                "tokens": tokens,
                "counts": counts,
                "error": None,
            }
        devices = [store_fixtures.gpu_device(g, 95.0) for g in range(8)]
        write_reply(store, f"node-{i}", store_fixtures.poll_reply(ts + 0.4, devices, files), ts, rtt_ms=5.0)


def quiet_run(tmp_path: Path, quiet_s: float, *, writing_polls: int = 120) -> tuple[Store, Path]:
    """A run that wrote for `writing_polls` x 10 s and then polled `quiet_s` with no new completion."""
    now = time.time()
    store = Store(tmp_path / "x.sqlite3")
    store_fixtures.build_run(store, now=now - quiet_s, trunc_frac=0.18, polls=writing_polls)
    t = now - quiet_s + 10
    while t <= now:
        grow(store, t, 0, "quiet")
        t += 10
    return store, store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3")


def tile(at, label: str) -> tuple[str, str, str]:
    """(value, sub, level) of the tile whose label starts with `label` on the rendered page."""
    for md in at.markdown:
        m = re.search(
            r'rh-tile (\w+)"><div class="rh-label">' + re.escape(label) + r'[^<]*</div><div class="rh-value">([^<]*)'
            r'</div><div class="rh-sub">([^<]*)',
            md.value,
        )
        if m:
            return m.group(2), m.group(3), m.group(1)
    raise AssertionError(f"no tile {label!r}")


# -- item 1: one reading ---------------------------------------------------------------------------
def counting(monkeypatch) -> collections.Counter:
    """Every SQL statement the store runs, by the Store method (or module) that asked for it."""
    calls: collections.Counter = collections.Counter()
    real = Store.cursor

    def cursor(self, sql, params=()):
        calls["sql"] += 1
        return real(self, sql, params)

    monkeypatch.setattr(Store, "cursor", cursor)
    for name in ("nodes", "length_counts", "polls", "polls_by_bucket", "gpu_latest", "gpu_health", "host_latest"):
        method = getattr(Store, name)

        def wrapped(self, *a, _m=method, _n=name, **k):
            calls[_n] += 1
            return _m(self, *a, **k)

        monkeypatch.setattr(Store, name, wrapped)
    real_rows = Store.run_length_rows  # the run's length counts as tuples: a read of them all the same

    def rows(self):
        calls["length_counts"] += 1
        return real_rows(self)

    monkeypatch.setattr(Store, "run_length_rows", rows)
    return calls


def test_overview_model_reads_each_table_once(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    cfg = load_config(config)
    calls = counting(monkeypatch)
    model = overview.overview(store, cfg, time.time())
    assert model.summary.completions == 12_000 and len(model.tiles) == 6
    # One reading: nodes, length counts, GPU and host tables each once (main: nodes() 4 times, the
    # length summary and the GPU table each twice or three times, 37 statements); the polls are
    # read once too, as tuples through one statement (activity.recent_rates), counted in "sql".
    assert {k: v for k, v in calls.items() if k not in ("sql", "polls_by_bucket", "polls")} == dict.fromkeys(
        ("nodes", "length_counts", "gpu_latest", "gpu_health", "host_latest"), 1
    )
    assert calls.get("polls", 0) <= 1, calls
    # 17 before #33, which reads the loop sample's two counts, the GPU energy rows, the
    # prompts line's single row (store.prompt_summary) and the last hour's run events (the
    # throughput chart's markers, store/runevents.py): one each; #39 the failed requests (one
    # statement, and one for their prompt IDs only when some failed); #42 item 3: +2, the kept poll
    # rows' check (runhealth/store/pollrows.py: one statement a read, one more to read rows anew).
    assert calls["polls_by_bucket"] <= 2 and calls["sql"] <= 24, calls


def test_overview_page_render_reads_the_store_a_few_times(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    store.close()
    calls = counting(monkeypatch)
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    assert calls["nodes"] == 1 and calls["length_counts"] == 1 and calls["gpu_latest"] == 1, calls
    # Nothing published (no collector ran): the page builds the model itself. main: 37 statements
    # for one render of the whole app; 20 before #33 added the loop sample's counts, the GPU energy
    # rows, prompt_summary and the run events; +1 for the look for a published Overview; +1 for
    # the failed requests (#39); +2 for the kept poll rows' check (#42 item 3, store/pollrows.py).
    # With one published it is 4 (tests/test_published.py).
    assert calls["sql"] <= 28, calls


# -- item 6: what the model must get right -----------------------------------------------------------
def test_a_stalled_run_shows_no_plain_eta_on_any_consumer(tmp_path, monkeypatch):
    """One run state decides every tile, the banner and the export (main: "ETA 23 min" in plain
    blue beside the red "Run stalled" banner, and a headline JSON with an ETA and no stall flag)."""
    store, config = quiet_run(tmp_path, 600)
    model = overview.overview(store, load_config(config), time.time())
    assert model.state == "stalled" and any(a.name == "run_stalled" for a in model.alerts)
    record = model.headline()
    assert record["run_state"] == "stalled" and record["stalled"] is True
    assert record["eta_hours_at_15_min_avg"] is None
    store.close()
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    assert any("Run stalled" in e.value for e in at.error)
    value, sub, level = tile(at, "ETA")
    assert (value, level) == ("—", "alert") and "stalled" in sub
    assert tile(at, "Tokens / s")[2] == "alert"


def test_status_cli_prints_the_same_record_and_exits_1_when_stalled(tmp_path, capsys):
    store, config = quiet_run(tmp_path, 600)
    store.close()
    assert cli.main(["status", "--config", str(config), "--json"]) == 1
    record = json.loads(capsys.readouterr().out)
    assert record["run_state"] == "stalled" and record["stalled"] and record["eta_hours_at_15_min_avg"] is None
    eta = next(t for t in record["tiles"] if t["label"] == "ETA")
    assert (eta["value"], eta["level"]) == ("—", "alert")
    assert cli.main(["status", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("gen-run-42: stalled") and "Run stalled" in out


def test_completions_tile_and_banner_are_one_instant(tmp_path, monkeypatch):
    """The tiles and the banner come from one read (main: the Completions tile came from the
    collector's payload, a poll behind the banner's n on the same screen)."""
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    pagedata.put(store, pagedata.compute_all(store, 4096, 10), time.time())  # the collector's payload ...
    grow(store, time.time(), 250, "late")  # ... then one more poll: 1,000 new completions
    store.close()
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    banner = next(e.value for e in at.error if "ceiling" in e.value)
    n = int(re.search(r"n=([\d,]+)", banner).group(1).replace(",", ""))
    assert n == 13_000
    assert tile(at, "Completions")[0] == "13,000"
    assert tile(at, "Truncated")[1].endswith("of 13,000")


def test_a_run_younger_than_the_average_says_so_and_gives_no_eta(tmp_path, monkeypatch):
    """2 min of polls before the first completion, then 5 min of writing: the average is "since
    collection began", and there is no ETA (main: an ETA at the "15-min average" of 7 minutes,
    idle included)."""
    now = time.time()
    store = Store(tmp_path / "x.sqlite3")
    t = now - 420
    for k in range(42):
        grow(store, t, 0 if k < 12 else 200, f"s{k}", seed=k)
        t += 10
    config = store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3")
    model = overview.overview(store, load_config(config), now)
    assert model.state == "writing" and model.run_eta is not None and model.run_eta.eta_s is not None  # a rate ...
    assert model.eta_s is None and model.headline()["eta_hours_at_15_min_avg"] is None  # ... but no ETA yet
    assert model.average.label.startswith("avg since collection began")
    store.close()
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    assert tile(at, "ETA")[0] == "—"
    assert "avg since collection began" in tile(at, "Tokens / s")[1]
    assert "15-min avg" not in tile(at, "Tokens / s")[1]


def test_a_run_writing_for_the_whole_window_gets_an_eta_at_the_15_min_average(tmp_path):
    now = time.time()
    store = Store(tmp_path / "x.sqlite3")
    store_fixtures.build_run(store, now=now, trunc_frac=0.18, polls=120)  # 20 min of writing
    model = overview.overview(store, load_config(store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3")), now)
    assert model.average.label == "15 min avg" and model.eta_s is not None and model.eta_s > 0
    eta = next(t for t in model.tiles if t.label == "ETA")
    assert eta.level == "ok" and "at the 15 min avg" in eta.sub


def test_truncation_by_node_is_precomputed_for_a_detected_ceiling(tmp_path, monkeypatch):
    """With no max_output_tokens configured the page asks for the groups at the detected 4,096:
    the collector's payload must be keyed by that (main: keyed by the configured None, so the
    page recomputed it on every refresh, "(no precomputed copy yet)" forever)."""
    store = Store(tmp_path / "x.sqlite3")
    store_fixtures.build_run(store, now=time.time(), trunc_frac=0.18)
    config = store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3", max_output_tokens=None)
    pagedata.Refresher(store, None, 10).run_now()
    assert pagedata.get(store, "groups:node", GroupTable)[1].ceiling == 4096
    store.close()
    at = run_page("lengths", config, monkeypatch)
    assert_clean(at)
    captions = [c.value for c in at.caption if c.value.startswith("Truncation by")]
    assert captions and all("computed by the collector" in c for c in captions), captions


# -- the Nodes screen --------------------------------------------------------------------------------
def test_nodes_model_states_shards_and_servers_are_what_the_store_holds(tmp_path):
    """node_down: node-3 unreachable for 10 min (down), node-2 for 1 min (stale), the others up;
    every node's shards and server metric as the store holds them, one instant for all."""
    from runhealth.screens import nodes

    store, config = store_fixtures.make_store(tmp_path, "node_down")
    now = time.time()
    model = nodes.nodes(store, load_config(config), now)
    assert [s.name for s in model.states] == [f"node-{i}" for i in range(1, NODES + 1)]
    # node-1 and node-4 wrote their share (16,000 of 50,000 / 4): done, a state of its own (#41);
    # node-2 is past its share too but stale (its poll is old: that comes first).
    assert {s.name: s.state for s in model.states} == {
        "node-1": "done",
        "node-2": "stale",
        "node-3": "down",
        "node-4": "done",
    }
    assert model.counts == {"up": 0, "done": 2, "stale": 1, "down": 1, "pending": 0}
    assert model.state_of("node-3").reason.startswith("down for 10 min")
    held = {n["name"]: n["completions"] for n in store.nodes()}
    for name, lines in held.items():
        mine = model.shards_of(name)
        assert len(mine) == 2 and sum(s["completions"] for s in mine) == lines
        assert not model.replaced(name)
    assert {(m["node"], m["name"]) for m in model.server_metrics} == {
        (f"node-{i}", "sglang:gen_throughput") for i in range(1, NODES + 1)
    }
    assert model.per_node is not None and set(model.per_node) == set(held)
    assert model.collector_fault is not None and "No collector has written" in model.collector_fault
    assert model.removed == () and json.loads(json.dumps(model.to_json()))["counts"]["down"] == 1
    done = nodes.nodes(store, load_config(config), now, finished=True)
    assert done.per_node is None and done.collector_fault is None


def test_nodes_model_names_removed_nodes_and_replaced_shards(tmp_path):
    """A node the collector no longer polls (the run's meta names three) is a notice with its
    count, not a row; a shard rewritten under the same inode is named with when."""
    from runhealth.screens import nodes

    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    store.set_meta("run", {"nodes": ["node-1", "node-2", "node-3"]})
    lines = {n["name"]: n["completions"] for n in store.nodes()}
    ts = time.time()
    reply = store_fixtures.poll_reply(
        ts + 0.4,
        [store_fixtures.gpu_device(0, 90.0)],
        {
            "/data/out/shard-01-0.jsonl": {
                "inode": 1000,
                "size": 900,
                "offset_from": 0,
                "offset": 900,
                "reset": True,
                "replaced": True,
                "lines": 3,
                "malformed": 0,
                "tokens": 30,
                "counts": [[10, "stop", 0, 3]],
                "error": None,
            }
        },
    )
    write_reply(store, "node-1", reply, ts, rtt_ms=5.0)
    model = nodes.nodes(store, load_config(config), ts + 1)
    assert [s.name for s in model.states] == ["node-1", "node-2", "node-3"]
    assert model.removed == (nodes.Removed("node-4", lines["node-4"], None),)
    assert f"its {lines['node-4']:,} completions are kept in the run's totals" in model.removed[0].text
    (replaced,) = model.replaced("node-1")
    assert replaced["path"] == "/data/out/shard-01-0.jsonl" and replaced["replaced_unix"] == ts
    assert replaced["completions"] == 3


# -- the GPUs screen ---------------------------------------------------------------------------------
def test_gpus_model_is_the_stores_gpus_their_alerts_and_notes(tmp_path):
    """node_down: 4 nodes x 8 GPUs; node-2's GPU 5 idles while the run writes and GPU 6 sits at
    the power cap; node-4's GPU 3 is lost: one reading names each, as the store holds it."""
    from runhealth.rules import health
    from runhealth.screens import gpus

    store, config = store_fixtures.make_store(tmp_path, "node_down")
    cfg = load_config(config)
    now = time.time()
    model = gpus.gpus(store, cfg, now)
    assert model.gpus == tuple(store.gpu_latest()) and len(model.gpus) == NODES * 8
    assert model.writing and not model.simulated and not model.never_polled
    expected = [a for a in health.evaluate(store, now, RunSettings.from_config(cfg)) if a.name.startswith("gpu_")]
    assert [a.name for a in model.alerts] == [a.name for a in expected] == ["gpu_error", "gpu_idle"]
    assert model.problems == [("error" if a.severity == "critical" else "warning", a.summary) for a in expected] + [
        ("info", "At the power cap (sw_power_cap: normal under full load): node-2/6")
    ]
    assert "node-4/GPU 3" in model.alerts[0].summary and "node-2/GPU 5" in model.alerts[1].summary
    assert json.loads(json.dumps(model.to_json()))["writing"] is True


@pytest.mark.parametrize("scenario", ["node_down", "healthy", "drift", "empty"])
@pytest.mark.parametrize("left_out", [None, "node-2"])
def test_gpus_alerts_are_the_runs_gpu_alerts_without_reading_the_length_counts(
    tmp_path, monkeypatch, scenario, left_out
):
    """#42: the GPUs page reads `health.read_hardware`, not the whole reading (the run's length
    counts were most of its every rerun). Its alerts are still the run's GPU alerts, in the
    Overview's order, with a node the config leaves out left out of both."""
    from runhealth.rules import health
    from runhealth.screens import gpus

    store, config = store_fixtures.make_store(tmp_path, scenario)
    cfg = load_config(config)
    settings = RunSettings.from_config(cfg)
    nodes = [n["name"] for n in store.nodes()]
    if left_out and left_out in nodes:
        settings = dataclasses.replace(settings, nodes=tuple(n for n in nodes if n != left_out))
    now = time.time()
    whole = health.read(store, now, settings)
    expected = [a for a in health.alerts_of(whole) if a.name.startswith(gpus.GPU_ALERT_PREFIX)]
    calls = counting(monkeypatch)
    hw = health.read_hardware(store, now, settings)
    assert calls["length_counts"] == 0 and calls["nodes"] == 1, calls
    assert health.gpu_alerts(hw) == [a for a in health.alerts_of(whole) if a in health.gpu_alerts(hw)]
    assert [a for a in health.gpu_alerts(hw) if a.name.startswith(gpus.GPU_ALERT_PREFIX)] == expected
    assert (hw.nodes, hw.gpu_latest, hw.rates) == (whole.nodes, whole.gpu_latest, whole.rates)
    if scenario == "node_down":
        assert expected, "the scenario raises GPU alerts"
        if left_out:
            assert not any(a.node == left_out for a in expected)


def test_gpus_model_of_a_store_never_polled(tmp_path):
    from runhealth.screens import gpus

    store, config = store_fixtures.make_store(tmp_path, "empty")
    model = gpus.gpus(store, load_config(config), time.time())
    assert model.gpus == () and model.never_polled and not model.writing and model.problems == []


# -- the Output lengths screen -----------------------------------------------------------------------
def test_lengths_model_is_the_fixtures_truth(tmp_path):
    """ceiling_18: 4 nodes x 2 shards x 30 polls x 50 completions, exactly 9 of each 50 at the
    4,096 ceiling, 400 completions a 10 s poll round; the sample batch holds 4 truncated, 2 loops."""
    from runhealth.analysis import whatif
    from runhealth.screens import lengths

    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    cfg = load_config(config)
    now = time.time()
    model = lengths.lengths(store, cfg, now)
    s = model.summary
    assert (s.completions, s.at_ceiling, s.ceiling_tokens) == (12_000, 240 * 9, 4096)
    assert model.counts.as_of is None  # no collector payload yet: counted now
    assert [n["name"] for n in model.nodes] == [f"node-{i}" for i in range(1, NODES + 1)]
    assert model.loop_sample == (2, 4)
    # 5 min of polls: the Overview gives no ETA before its 15-min average holds the run's writing,
    # and Output lengths' ETA change follows it (#41: it was built on the raw rate's ETA).
    assert model.completions_per_s_15m == 40.0 and model.eta_s is None
    assert model.eta_withheld == "after 15 min of writing"
    r = whatif.for_run(model.counts.hist, 4096, 8192, model.loop_sample, 20)
    change = model.eta_change(r)
    assert change.eta_s_now is None and change.delta_s is None and r.extra_tokens_per_completion is not None
    # The collector's payload, when it is of this ceiling, is what the model shows (with its time).
    ts = now - 5
    pagedata.put(store, pagedata.compute_all(store, 4096, 10), ts)
    again = lengths.lengths(store, cfg, now)
    assert again.counts.as_of == ts and again.summary.at_ceiling == s.at_ceiling
    assert again.counts.bins == model.counts.bins
    assert json.loads(json.dumps(again.to_json()))["at_ceiling"] == 2160


# -- the Samples screen ------------------------------------------------------------------------------
def test_samples_model_is_the_batch_beside_the_exact_counts(tmp_path):
    """ceiling_18's batch: 8 samples, 4 cut at the 4,096 ceiling, 2 of those loops; beside it the
    exact 2,160 of 12,000 over all completions."""
    from runhealth.analysis.stats import wilson_interval
    from runhealth.screens import samples

    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    model = samples.samples(store, load_config(config), time.time())
    assert model.batch is not None and len(model.samples) == 8 and len(model.truncated) == 4
    assert model.truncated_in_sample == samples.Share(4, 8, *wilson_interval(4, 8))
    assert (model.loop_share.n, model.loop_share.loops, model.loop_share.fraction) == (4, 2, 0.5)
    assert (model.summary.at_ceiling, model.summary.length_count) == (2160, 12_000)
    assert json.loads(json.dumps(model.to_json()))["truncated_all"] == {"k": 2160, "n": 12_000}


def test_samples_model_without_a_batch(tmp_path):
    from runhealth.screens import samples

    store = Store(tmp_path / "x.sqlite3")
    store_fixtures.build_run(store, now=time.time(), trunc_frac=0.18, polls=3)
    model = samples.samples(store, load_config(store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3")))
    assert model.batch is None and model.samples == [] and model.truncated_in_sample is None
    assert model.loop_share.n == 0 and model.summary.completions == 4 * 2 * 3 * 50


def test_nodes_and_gpus_pages_read_each_table_once(tmp_path, monkeypatch):
    """One model per render: the node and GPU tables are read once for the Nodes and the GPUs
    page (main: the node table, the alerts and the rates each read them again)."""
    for name in ("nodes", "gpus"):
        (tmp_path / name).mkdir()
        store, config = store_fixtures.make_store(tmp_path / name, "ceiling_18")
        store.close()
        calls = counting(monkeypatch)
        at = run_page(name, config, monkeypatch)
        assert_clean(at)
        # the polls once too, as tuples through one statement (activity.recent_rates), counted in "sql"
        assert calls["nodes"] == 1 and calls["gpu_latest"] == 1 and calls.get("polls", 0) <= 1, (name, calls)
        # 26 before #33's per-node prompts and labels on the Nodes page: the run's prompt summary
        # (its caption's total), the field presence and two grouped reads, for all nodes at once;
        # +1 on each for #39's failed requests (health.read's one statement, every node's rows at once);
        # +2 for the kept poll rows' check (#42 item 3, store/pollrows.py).
        assert calls["sql"] <= (33 if name == "nodes" else 29), (name, calls)
        monkeypatch.undo()


def test_lengths_and_samples_read_one_instant_when_the_payload_is_a_poll_behind(tmp_path, monkeypatch):
    """Issue 41: Output lengths showed "4,966 of 30,410" beside "of 4,968 cut", Samples "3,421 of
    5,090" (truth 5,103): the counts came from the collector's payload, a poll behind the reads
    beside them. The payload lends its bins only when it is of the store's counts now; each model
    is read inside one snapshot; the pages show the store's 13,000."""
    from runhealth.screens import lengths, samples

    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    cfg = load_config(config)
    pagedata.put(store, pagedata.compute_all(store, 4096, 10), time.time())  # the collector's payload ...
    grow(store, time.time(), 250, "late")  # ... then one more poll: 1,000 new completions
    truth = sum(r["count"] for r in store.length_counts(by="run"))
    assert truth == 13_000
    m = lengths.lengths(store, cfg)
    assert m.summary.completions == truth and m.counts.as_of is None  # counted now, not the stale payload
    assert m.summary.at_ceiling == sum(
        r["count"] for r in store.length_counts(by="run") if r["finish_reason"] == "length" and r["tokens"] >= 4096
    )
    assert samples.samples(store, cfg).summary.length_count == truth
    # Every read inside a model sees one commit: a poll another connection writes meanwhile is
    # not half in it (the first read of the run's counts lets one land).
    seen: list[int] = []
    real = store.run_length_rows

    def counts_then_a_poll_lands():
        rows = real()
        seen.append(sum(n for *_x, n in rows))
        if len(seen) == 1:
            other = Store(store.path)
            grow(other, time.time(), 25, "meanwhile")
            other.close()
        return rows

    monkeypatch.setattr(store, "run_length_rows", counts_then_a_poll_lands)
    m2 = lengths.lengths(store, cfg)
    assert seen == [truth]  # the run's counts are read once (#42: runeta.store_eta takes them) ...
    assert m2.summary.completions == truth
    # ... and every read after it is of the same commit: the nodes' counts (another table) too.
    assert sum(n["completions"] for n in m2.nodes) == truth
    monkeypatch.undo()
    now_total = sum(r["count"] for r in store.length_counts(by="run"))
    assert now_total == truth + 100
    store.close()
    at = run_page("lengths", config, monkeypatch)
    assert_clean(at)
    assert tile(at, "Truncated")[1].endswith(f"of {now_total:,}")


def test_the_average_covers_the_polls_when_this_hosts_clock_stepped_back():
    """`status` on a host whose clock just stepped back 1 h, before the collector's first poll on
    the new clock: the polls are stamped an hour after its now. The average covered "(0 s)" then
    (CI saw it 1.5 s after a -1 h step, tests/test_clock_steps.py); the polls cover their 10 s."""
    from runhealth.rules import activity

    t = time.time()
    rows = [(t - 10 + k, t - 10 + k + 0.4, 1, 100, 0, None, 1.0) for k in range(11)]
    r = activity.run_rates({"a": rows}, t - 3600)
    assert overview.average_of(r, t - 3600, t).covered_s == pytest.approx(10.0)
    assert overview.average_of(r, t + 5, t).covered_s == pytest.approx(15.0)  # a clock that did not step: to now
