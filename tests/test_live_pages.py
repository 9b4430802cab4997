"""Issue #15 under AppTest: every page says when its numbers are from, stalls are named on the
Overview, one definition of truncated, sample shares never alarm from a handful, kiosk mode.

Stores are built through `Store.write_poll` (store_fixtures.write_reply: ingest.read_poll, then write_poll) as the collector builds them (tests/store_fixtures.py);
a stall is polls that keep answering while the shards stop growing.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import store_fixtures
from store_fixtures import write_reply
from streamlit.testing.v1 import AppTest
from test_pages import PAGES, ROOT, TIMEOUT_S, _clear_streamlit_caches, assert_clean, run_page, texts, tile_blocks  # noqa: F401 (autouse fixture)

from components import page as page_mod
from runhealth.store import Store


def idle_polls(store: Store, nodes: list[str], start: float, end: float, every: float = 10.0) -> None:
    """Polls that answer (node up) while the named nodes' shards do not grow."""
    t = start
    while t <= end:
        for node in nodes:
            files = {
                path: {
                    "inode": s["inode"],
                    "size": s["offset"],
                    "offset_from": s["offset"],
                    "offset": s["offset"],
                    "reset": False,
                    "lines": 0,
                    "malformed": 0,
                    "tokens": 0,
                    "counts": [],
                    "error": None,
                }
                for path, s in store.shard_state(node).items()
            }
            write_reply(store, node, store_fixtures.poll_reply(t + 0.4, [], files), t, rtt_ms=5.0)
        t += every


def stalled_store(tmp: Path, stalled: list[str]) -> Path:
    now = time.time()
    store, config = store_fixtures.make_store(tmp, "empty")
    store_fixtures.build_run(store, now=now - 400, trunc_frac=0.01, polls=20)
    writing = [n for n in ("node-1", "node-2", "node-3", "node-4") if n not in stalled]
    idle_polls(store, stalled, now - 390, now - 2)
    if writing:  # the others keep writing: replay a normal run for them over the same span
        for t in range(int(now - 390), int(now - 2), 10):
            for node in writing:
                files = {}
                for path, s in store.shard_state(node).items():
                    counts = [[900, "stop", 0, 20]]
                    files[path] = {
                        "inode": s["inode"],
                        "size": s["offset"] + 80_000,
                        "offset_from": s["offset"],
                        "offset": s["offset"] + 80_000,
                        "reset": False,
                        "lines": 20,
                        "malformed": 0,
                        "tokens": 18_000,
                        "counts": counts,
                        "error": None,
                    }
                write_reply(store, node, store_fixtures.poll_reply(t + 0.4, [], files), t, rtt_ms=5.0)
    store.close()
    return config


def test_every_page_says_when_its_numbers_are_from(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    store.close()
    for path in PAGES:
        at = run_page(path, config, monkeypatch)
        assert_clean(at)
        assert "Numbers as of" in texts(at), path


def test_every_page_says_so_when_its_numbers_are_stale(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18", now=time.time() - 3600)
    store.close()
    for path in PAGES:
        at = run_page(path, config, monkeypatch)
        assert_clean(at)
        assert any("these numbers are stale" in e.value for e in at.error), path


def test_a_run_that_stopped_writing_raises_no_new_completions(tmp_path, monkeypatch):
    config = stalled_store(tmp_path, ["node-1", "node-2", "node-3", "node-4"])
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    errors = [e.value for e in at.error]
    assert any("no new completions from any node since" in e for e in errors), errors
    assert "Tokens / s · last 1 min" in texts(at)


def test_one_node_that_stopped_writing_is_named_while_others_write(tmp_path, monkeypatch):
    config = stalled_store(tmp_path, ["node-3"])
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    warnings = [w.value for w in at.warning]
    assert any(re.match(r"node-3: no new completions for [67] min \(since \d\d:\d\d:\d\d\)", w) for w in warnings), (
        warnings
    )
    assert not any("node-1: no new" in w for w in warnings)
    assert not any("any node" in e.value for e in at.error)
    table = at.table[0].value  # a handful of nodes: a static table (#42)
    assert list(table.columns)[:5] == ["node", "status", "last seen", "tok/s (1 min)", "last new"]


def test_truncated_is_one_number_and_context_stops_have_their_own_name(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    store.close()
    at = run_page("lengths", config, monkeypatch)
    assert_clean(at)
    page = texts(at)
    assert "length stops below the 4,096 ceiling (context window)" in page
    assert "from the shards" not in page  # the old second "truncated" figure is gone
    at = run_page("overview", config, monkeypatch)
    assert "18.0%" in texts(at)


def test_a_loop_share_from_a_handful_of_samples_is_not_an_alarm(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")  # 4 truncated samples, 2 loops
    store.close()
    at = run_page("samples", config, monkeypatch)
    assert_clean(at)
    tile = next(t for t in tile_blocks(at) if "Truncated that loop" in t)
    assert "rh-tile muted" in tile and "n = 4" in tile and "too few to judge" in tile
    assert any("Truncated · this sample" in m.value and "n = 8" in m.value for m in at.markdown)


def test_kiosk_mode_hides_the_chrome_and_enlarges_type(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "healthy")
    store.close()
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT_S)
    at.query_params["kiosk"] = "1"
    at.query_params["rotate"] = "0"
    at.run()
    assert_clean(at)
    assert any('[data-testid="stSidebar"]' in m.value and "display: none" in m.value for m in at.markdown)
    at = run_page("overview", config, monkeypatch)
    assert not any('[data-testid="stSidebar"]' in m.value for m in at.markdown)  # only in kiosk mode


@pytest.mark.parametrize(
    ("asked", "seconds", "noted"),
    [
        (None, 20.0, False),
        ("30", 30.0, False),
        ("0", 0.0, False),  # pins the page
        ("0.001", 5.0, True),
        ("1e-300", 5.0, True),
        ("-3", 5.0, True),
        ("inf", 3600.0, True),
        ("1e308", 3600.0, True),
        ("nan", 20.0, True),
        ("soon", 20.0, True),
    ],
)
def test_kiosk_rotate_is_clamped_to_5_s_to_1_h(asked, seconds, noted):
    got = page_mod.kiosk_rotate_s(20.0, asked)
    assert got[0] == seconds and (got[1] is not None) == noted, got


def test_a_clamped_kiosk_rotate_is_said_on_the_page(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "healthy")
    store.close()
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT_S)
    at.query_params["kiosk"] = "1"
    at.query_params["rotate"] = "0.001"
    at.run()
    assert_clean(at)
    assert "?rotate=0.001 is outside 5 s - 60 min: rotating every 5 s" in texts(at)


def test_kiosk_rotation_order():
    assert page_mod.next_kiosk_page("overview", False) == "lengths"
    assert page_mod.next_kiosk_page("lengths", False) == "gpus"
    assert page_mod.next_kiosk_page("gpus", False) == "overview"
    assert page_mod.next_kiosk_page("gpus", True) == "nodes"  # only while a node is down
    assert page_mod.next_kiosk_page("nodes", True) == "overview"
    assert page_mod.next_kiosk_page("nodes", False) == "overview"
    assert page_mod.next_kiosk_page("samples", False) == "overview"


def test_gpu_and_host_problems_are_named_on_overview_gpus_and_nodes(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "healthy")
    ts = store.last_collection_unix() + 1
    devices = [store_fixtures.gpu_device(g, 95.0) for g in range(8)]
    devices[0]["health"] = {"ecc_uncorrected_volatile": 3, "pcie_replay": 0, "xid": [79]}
    devices[1] = store_fixtures.gpu_device(1, 90.0, throttle=("hw_thermal_slowdown",), temp_c=92)
    reply = store_fixtures.poll_reply(ts, devices[:7], {})  # GPU 7 fell out of this poll
    reply["host"] = {
        "cpus": 64,
        "mem_total_bytes": 2 * 2**40,
        "mem_available_bytes": 2**36,
        "swap_total_bytes": 2**33,
        "swap_free_bytes": 2**31,
    }
    write_reply(store, "node-1", reply, ts, rtt_ms=5.0)
    store.close()
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    errors, warnings = [e.value for e in at.error], [w.value for w in at.warning]
    # Every problem is one alert of health.evaluate, worded once (#30 item 4).
    assert "node-1/GPU 0: XID 79 (GPU has fallen off the bus)." in errors, errors
    assert "node-1/GPU 0: 3 uncorrected ECC errors since the driver loaded." in errors, errors
    assert any("node-1/GPU 1 throttled: hw\\_thermal\\_slowdown" in w for w in warnings), warnings  # markdown-escaped
    assert any("node-1: swap 75% used" in w for w in warnings), warnings
    assert "node-1: GPU 7 missing from the latest poll (7 of 8 reporting)." in errors, errors
    assert sum("XID 79" in e for e in errors) == 1 and sum("throttled" in w for w in warnings) == 1  # once
    at = run_page("gpus", config, monkeypatch)
    assert_clean(at)
    assert any("node-1/GPU 0: XID 79" in e.value for e in at.error)
    at = run_page("nodes", config, monkeypatch)
    assert_clean(at)
    assert any("node-1: swap 75% used" in w.value for w in at.warning)
    assert "97% used of 2,048.0 GiB" in texts(at)


def test_headline_export_carries_the_standup_figures(tmp_path):
    from runhealth.screens import overview
    from runhealth.settings.config import load_config

    # 20 minutes of writing: the 15-min average holds the run's writing, so there is an ETA.
    store = Store(tmp_path / "x.sqlite3")
    store_fixtures.build_run(store, now=time.time(), trunc_frac=0.18, polls=120)
    config = store_fixtures.write_config(tmp_path, tmp_path / "x.sqlite3")
    model = overview.overview(store, load_config(config), time.time())
    record = model.headline()
    assert record["completions"] == model.summary.completions > 0
    assert (
        record["truncated_pct"] == 18.0 and record["truncated_pct_95ci_low"] < 18.0 < record["truncated_pct_95ci_high"]
    )
    assert record["tokens_per_s_last_1_min"] > 0 and record["tokens_per_s_15_min_avg"] > 0
    assert record["eta_hours_at_15_min_avg"] is not None and (record["nodes_up"], record["nodes"]) == (4, 4)
    assert record["numbers_as_of"] is not None and record["run_state"] == "writing" and not record["stalled"]


def test_samples_download_carries_the_text(tmp_path):
    from components import tables

    store, _config = store_fixtures.make_store(tmp_path, "ceiling_18")
    samples = store.latest_sample_batch()["samples"]
    df = tables.samples_export(samples)
    assert len(df) == len(samples) == 8
    loop = df[df["loop"]].iloc[0]
    assert loop["text tail"].endswith("The answer is 42. ") and len(loop["text tail"]) == tables.EXPORT_TAIL_CHARS
    assert loop["text head"].startswith("The answer is 42.") and loop["prompt head"].startswith("Solve problem")
    assert df["path"].str.startswith("/data/out/").all()


def test_overview_heatstrip_marks_a_hardware_throttled_gpu(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "healthy")
    ts = store.last_collection_unix() + 1
    devices = [store_fixtures.gpu_device(g, 95.0) for g in range(8)]
    devices[1] = store_fixtures.gpu_device(1, 90.0, throttle=("hw_power_brake_slowdown",))
    write_reply(store, "node-1", store_fixtures.poll_reply(ts, devices, {}), ts, rtt_ms=5.0)
    store.close()
    at = run_page("overview", config, monkeypatch)
    assert_clean(at)
    chart = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "GPUs now" in c.proto.spec)
    labels = chart["data"][0]["x"]
    assert "node-1/1 ⚠ throttled" in labels and "node-1/0" in labels
