"""Page payloads (runhealth/payloads/pagedata.py): the collector computes what pages show, pages only read.

Each payload must equal what the page computed before on the same store (the loaders' on-demand
path is that computation, kept for a missing payload), the collector must write payloads after
its polls without ever running two computations at once, and pages must read them, say how old
they are, and fall back when a payload is missing, damaged or made for other parameters.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import store_fixtures
import streamlit as st
import test_gpubands
from shardgen import truth_rows, write_shard
from streamlit.testing.v1 import AppTest
from test_consistency import tile, tiles_of
from test_pages import _clear_streamlit_caches, open_app  # noqa: F401 (autouse fixture: caches leak between AppTests)

from components import loaders, precomputed
from components.format import fmt_clock
from runhealth.analysis import loops, stats, whatif
from runhealth.collect.collector import Collector
from runhealth.payloads import pagedata
from runhealth.payloads.pagetypes import GroupTable, RunLengths
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store

ROOT = Path(__file__).resolve().parent.parent
CEILING = store_fixtures.CEILING
INTERVAL_S = 10.0  # store_fixtures.write_config's interval


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in ("healthy", "ceiling_18", "node_down", "drift", "empty"):
        tmp = tmp_path_factory.mktemp(name)
        store, config = store_fixtures.make_store(tmp, name)
        store.close()
        out[name] = config
    return out


def store_of(config: Path) -> Store:
    return Store(config.parent / "x.sqlite3")


def page_views(store: Store) -> dict:
    """What the Output lengths page loads, through the loaders (payload or on-demand)."""
    st.cache_data.clear()
    st.cache_resource.clear()
    run = loaders.load_run_lengths(store, CEILING)
    ceiling = run.summary.ceiling_tokens
    return {
        "run": run,
        "node": loaders.load_group_lengths(store, "node", CEILING),
        "shard": loaders.load_group_lengths(store, "shard", CEILING),
        "over_time": loaders.load_truncation_over_time(store, INTERVAL_S, ceiling),
        "hourly": loaders.load_lengths_over_time(store, ceiling),
    }


def same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = a.copy(), b.copy()
    a.attrs, b.attrs = {}, {}
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False)


@pytest.mark.parametrize("scenario", ["healthy", "ceiling_18", "node_down", "drift", "empty"])
def test_payloads_equal_what_the_page_computed(stores, scenario):
    store = store_of(stores[scenario])
    with store.transaction() as db:
        db.execute("DELETE FROM page_data")
    before = page_views(store)
    assert before["run"].as_of is None and before["node"].attrs["as_of"] is None
    pagedata.Refresher(store, CEILING, INTERVAL_S).run_now()
    after = page_views(store)
    assert after["run"].as_of is not None and after["node"].attrs["as_of"] is not None
    assert after["run"].summary == before["run"].summary
    assert after["run"].hist.rows() == before["run"].hist.rows()
    for key in ("bins", "cdf"):
        same_frame(getattr(after["run"], key), getattr(before["run"], key))
    for key in ("node", "shard", "over_time", "hourly"):
        same_frame(after[key], before[key])
    if scenario == "drift":  # the point of the per-node table: node-4's own ceiling
        assert after["node"].set_index("group").loc["node-4", "drift"]


def test_whatif_payload_is_the_pages_default_fit(stores):
    store = store_of(stores["ceiling_18"])
    pagedata.Refresher(store, CEILING, INTERVAL_S).run_now()
    data = loaders.load_run_lengths(store, CEILING)
    hist, ceiling = data.hist, data.summary.ceiling_tokens
    sample = loops.loop_sample(store.latest_sample_batch())
    read, as_of = loaders.load_whatif_with_age(store, hist, ceiling, 2 * ceiling, sample)
    assert as_of is not None
    fresh = whatif.for_run(hist, ceiling, 2 * ceiling, sample)
    assert read.to_json() == json.loads(json.dumps(fresh.to_json()))
    # Another limit, another loop sample, or another histogram with the same total: computed on
    # demand, not the stored fit.
    assert loaders.load_whatif_with_age(store, hist, ceiling, 3 * ceiling, sample)[1] is None
    assert loaders.load_whatif_with_age(store, hist, ceiling, 2 * ceiling, (0, 0))[1] is None
    rows = hist.rows()
    moved = stats.LengthHist.from_rows([(t + 1 if t < ceiling else t, r, e, n) for t, r, e, n in rows])
    assert moved.total == hist.total
    assert loaders.load_whatif_with_age(store, moved, ceiling, 2 * ceiling, sample)[1] is None


def test_gpu_window_bands_equal_the_pages_bands(stores):
    """The payload's bands are the old builder's (test_gpubands.reference_window), and the page
    without a payload computes the same ones (precomputed._computed_now)."""
    store = store_of(stores["healthy"])  # 32 GPUs: per-node bands
    now = time.time()
    payload = pagedata.gpu_window(store, None, now)
    labels = payload.labels
    assert len(labels) == 32 and payload.series is None and payload.bands is not None
    step, first = pagedata.band_cells(None, now, pagedata.gpu_oldest(store) or 0)
    test_gpubands.assert_same_bands(payload, test_gpubands.reference_window(store, step, first))
    on_page = precomputed._computed_now(store, "whole run", now)
    for value in pagedata.GPU_VALUES:
        same_frame(precomputed.frame(payload.bands[value]), precomputed.frame(on_page.bands[value]))
    assert payload.limits["power_limit_w"] == {f"node-{i}": 700.0 for i in range(1, 5)}


def test_gpu_window_small_run_keeps_per_gpu_series(tmp_path):
    store = Store(tmp_path / "x.sqlite3")
    store_fixtures.build_run(store, now=time.time(), trunc_frac=0.01, nodes=1, gpus=4, polls=5)
    payload = pagedata.gpu_window(store, 3600, time.time())
    assert payload.bands is None and payload.series is not None
    got = precomputed.frame(payload.series)
    want = loaders.load_gpu_series(store, payload.since)
    same_frame(got[want.columns], want)


def test_whole_run_windows_are_computed_once(stores):
    store = store_of(stores["healthy"])  # 5 minutes of history: every window reaches past its start
    out = pagedata.gpu_windows(store, time.time())
    assert set(out) == {f"gpu:{w}" for w in pagedata.GPU_WINDOWS_S}
    assert out["gpu:1 h"].bands == out["gpu:whole run"].bands
    assert pagedata.gpu_windows(store, time.time(), due=lambda w: w == "15 min").keys() == {"gpu:15 min"}


def test_window_due_scales_with_the_bucket_width():
    assert pagedata.window_due(3600, None, 30)  # never computed
    assert not pagedata.window_due(3600, 10, 30) and pagedata.window_due(3600, 31, 30)
    assert not pagedata.window_due(86400, 300, 30) and pagedata.window_due(86400, 361, 30)  # 360 s band steps
    # 3.75 s steps: due at every computation, also one that came a little early
    assert pagedata.window_due(900, 4.99, 5) and pagedata.window_due(900, 5.0, 5)
    assert not pagedata.window_due(900, 2.0, 5) and not pagedata.window_due(3600, 12, 5)  # 15 s steps


def test_damaged_or_missing_payload_falls_back(stores):
    store = store_of(stores["ceiling_18"])
    with store.transaction() as db:
        db.execute("DELETE FROM page_data")
    assert pagedata.get(store, "run_lengths") is None
    with store.transaction() as db:
        db.execute("INSERT INTO page_data VALUES ('run_lengths', ?, ?)", (time.time(), b"not zlib"))
    assert pagedata.get(store, "run_lengths") is None
    assert loaders.load_run_lengths(store, CEILING).as_of is None  # computed on demand
    # Computed for another max_output_tokens (the config changed): not used.
    pagedata.put(store, {"run_lengths": pagedata.run_lengths(store, 2048)}, time.time())
    st.cache_data.clear()
    st.cache_resource.clear()
    assert loaders.load_run_lengths(store, CEILING).as_of is None


def test_refresher_is_rate_limited_and_never_runs_twice(tmp_path):
    store = Store(tmp_path / "x.sqlite3")
    now = [1000.0]
    started, release = threading.Event(), threading.Event()
    refresher = pagedata.Refresher(store, CEILING, INTERVAL_S, min_interval_s=30, monotonic=lambda: now[0])

    def slow_run() -> None:
        started.set()
        release.wait(5)

    refresher.run_now = slow_run  # type: ignore[method-assign]
    assert refresher.after_poll()
    assert started.wait(5)
    now[0] += 10
    assert not refresher.after_poll()  # one still runs: polls go on, one computation is owed
    assert not refresher.after_poll()
    release.set()
    assert refresher.wait_idle()
    assert not refresher.after_poll()  # under min_interval_s since the last start
    assert refresher._timer is not None  # the owed one, for when the limit allows
    now[0] += 21
    assert refresher.after_poll()
    assert refresher.wait_idle() and refresher._timer is None
    refresher.stop()


class Counted:
    """A Refresher's computation stand-in: when each ran (monotonic), taking `cost_s`."""

    def __init__(self, cost_s: float = 0.0) -> None:
        self.at: list[float] = []
        self.cost_s = cost_s

    def __call__(self) -> None:
        self.at.append(time.monotonic())
        if self.cost_s:
            threading.Event().wait(self.cost_s)


def test_a_poll_under_the_limit_is_computed_once_the_limit_allows(tmp_path):
    """#42 item 2: a poll that landed under min_interval_s after a computation began was dropped,
    so its numbers waited for a later poll (up to an interval late on the GPUs and Output lengths
    pages); now one computation follows when the limit allows, one for any number of polls."""
    store = Store(tmp_path / "x.sqlite3")
    refresher = pagedata.Refresher(store, CEILING, INTERVAL_S, min_interval_s=0.4)
    ran = Counted()
    refresher.run_now = ran  # type: ignore[method-assign]
    assert refresher.after_poll() and refresher.wait_idle()
    last_poll = time.monotonic()
    assert not any(refresher.after_poll() for _ in range(5))
    time.sleep(0.8)
    assert refresher.wait_idle()
    assert len(ran.at) == 2  # one more, not five
    assert ran.at[1] - ran.at[0] >= 0.4 - pagedata.early_s(0.4) - 0.01 and ran.at[1] > last_poll
    time.sleep(0.5)
    assert len(ran.at) == 2  # nothing owed: nothing more
    refresher.stop()


def test_polls_without_end_make_one_computation_an_interval_and_the_last_is_read(tmp_path):
    """The rate: polls every 10 ms for 2 s (a fleet's) start one computation per min_interval_s
    (0.25 s) less its early allowance at most (the newest poll each reads is that much newer than
    the last one's; the polls here are 10 ms apart), never two within half an interval, and one
    after the last poll."""
    store = Store(tmp_path / "x.sqlite3")
    refresher = pagedata.Refresher(store, CEILING, INTERVAL_S, min_interval_s=0.25)
    ran = Counted(cost_s=0.05)
    refresher.run_now = ran  # type: ignore[method-assign]
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        refresher.after_poll()
        time.sleep(0.01)
    last_poll = time.monotonic()
    time.sleep(0.6)
    assert refresher.wait_idle()
    gaps = [b - a for a, b in zip(ran.at, ran.at[1:], strict=False)]
    gap = 0.25 - pagedata.early_s(0.25)
    assert 2.0 / 0.25 - 2 <= len(ran.at) <= 2.0 / gap + 2, ran.at
    assert min(gaps) >= max(0.25 / 2, gap - 0.01 - 0.02) - 0.005, gaps  # a poll's spacing, the timer's lateness
    assert ran.at[-1] >= last_poll - 0.25, "the last polls were never computed"
    refresher.stop()


def test_rounds_one_interval_apart_are_computed_at_their_polls_whatever_the_first_phase(tmp_path):
    """#42 item 2: the limit was "min_interval_s since the last start". With rounds of polls
    exactly one interval apart, a first computation that came late (here 0.3 s after its round)
    made every later round wait the same 0.3 s for the timer, and each timer's lateness added to
    it. Now a round's computation starts at its poll; a poll between rounds still waits."""
    store = Store(tmp_path / "x.sqlite3")
    now = [1000.3]
    refresher = pagedata.Refresher(store, CEILING, INTERVAL_S, min_interval_s=5, monotonic=lambda: now[0])
    ran: list[float] = []
    refresher.run_now = lambda: ran.append(now[0])  # type: ignore[method-assign]
    assert refresher.after_poll() and refresher.wait_idle()  # late: round 0 was at 1000.0
    for k in range(1, 50):
        now[0] = 1000.0 + 5 * k + (0.001 if k % 2 else 0.0)  # round k's poll lands, a little jitter
        assert refresher.after_poll(), f"round {k} waited for the timer"
        assert refresher.wait_idle()
    assert ran[1:] == [1000.0 + 5 * k + (0.001 if k % 2 else 0.0) for k in range(1, 50)]
    now[0] += 1.0  # a poll between rounds (a node retried): owed, not computed now
    assert not refresher.after_poll() and refresher._timer is not None
    refresher.stop()


def test_a_round_of_polls_is_computed_once_after_its_last_poll(tmp_path):
    """A computation started by a round's first poll waits for the others still running (at most
    SETTLE_MAX_S): the demo's two nodes, polled 70 ms apart, were computed at the first and shown
    one interval later for the second."""
    store = Store(tmp_path / "x.sqlite3")
    running = [2]  # the round's polls in progress
    refresher = pagedata.Refresher(store, CEILING, INTERVAL_S, min_interval_s=5, busy=lambda: running[0] > 0)
    ran = Counted()
    refresher.run_now = ran  # type: ignore[method-assign]
    running[0] = 1
    assert refresher.after_poll()  # the first node's poll ended; the second's runs
    time.sleep(0.1)
    assert ran.at == []  # waiting for it
    running[0] = 0
    second = time.monotonic()
    assert not refresher.after_poll()  # the second's end: the waiting computation reads both
    assert refresher.wait_idle()
    assert len(ran.at) == 1 and ran.at[0] >= second
    assert refresher._pending is False and refresher._timer is None  # nothing owed: both were read
    running[0] = 1  # polls that never all end (a fleet): it waits SETTLE_MAX_S, no longer
    refresher.min_interval_s = 0
    t0 = time.monotonic()
    assert refresher.after_poll() and refresher.wait_idle()
    assert pagedata.SETTLE_MAX_S - 0.05 <= ran.at[1] - t0 < pagedata.SETTLE_MAX_S + 0.5
    refresher.stop()


def test_the_stop_forgets_the_computation_owed(tmp_path):
    store = Store(tmp_path / "x.sqlite3")
    refresher = pagedata.Refresher(store, CEILING, INTERVAL_S, min_interval_s=0.3)
    ran = Counted()
    refresher.run_now = ran  # type: ignore[method-assign]
    assert refresher.after_poll() and refresher.wait_idle()
    assert not refresher.after_poll()
    refresher.stop()
    time.sleep(0.5)
    assert len(ran.at) == 1


def test_a_failed_computation_is_logged_and_cleared(tmp_path):
    store = Store(tmp_path / "x.sqlite3")
    refresher = pagedata.Refresher(store, CEILING, INTERVAL_S, min_interval_s=0)
    refresher.run_now = lambda: 1 / 0  # type: ignore[method-assign,assignment,return-value]
    assert refresher.after_poll() and refresher.wait_idle()
    assert refresher.last_error and "ZeroDivisionError" in refresher.last_error
    assert refresher.after_poll() and refresher.wait_idle()  # the next poll tries again


def test_the_stop_waits_for_a_running_computation_without_sleeping(tmp_path, monkeypatch):
    """The collector's stop waits for a computation still running. Under libfaketime with the
    wall clock stepped back, time.sleep fails with EINVAL (a collector stopped after a step back
    exited with a traceback: test_clock_steps found it), so the wait is on a condition."""
    store = Store(tmp_path / "x.sqlite3")
    refresher = pagedata.Refresher(store, CEILING, INTERVAL_S, min_interval_s=0)
    release = threading.Event()
    refresher.run_now = release.wait  # type: ignore[method-assign,assignment]

    def no_sleep(_s: float) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(time, "sleep", no_sleep)
    assert refresher.after_poll()
    assert not refresher.wait_idle(0.05)  # still running: the wait times out
    threading.Timer(0.1, release.set).start()
    t0 = time.monotonic()
    assert refresher.wait_idle(10)
    assert time.monotonic() - t0 < 5


def local_nodes(tmp_path: Path, rows: list[tuple[int, int]]) -> list[NodeConfig]:
    """Nodes n1, n2, ... on real local agents, node i's one shard holding rows[i - 1] = (n, seed)."""
    nodes = []
    for i, (n, seed) in enumerate(rows, start=1):
        (tmp_path / f"n{i}").mkdir()
        write_shard(tmp_path / f"n{i}" / "a.jsonl", truth_rows(n, seed))
        nodes.append(
            NodeConfig(
                name=f"n{i}",
                host="local",
                shards=[str(tmp_path / f"n{i}" / "*.jsonl")],
                python=sys.executable,
                gpu="off",
                command_timeout_s=20.0,
            )
        )
    return nodes


def test_collector_writes_payloads_after_polls(tmp_path):
    """Real agents (local transport): after the first polls the store holds every payload, and
    the lengths payload counts every completion the shards hold."""
    nodes = local_nodes(tmp_path, [(600, 1), (400, 2)])
    config = RunConfig(name="t", nodes=nodes, interval_s=0.5, max_output_tokens=4096)
    store = Store(tmp_path / "store.sqlite3")
    collector = Collector(config, store)
    collector.pagedata.min_interval_s = 0.2
    try:
        collector.start()
        deadline = time.time() + 30
        total = 0
        while time.time() < deadline and total < 1000:
            got = pagedata.get(store, "run_lengths", RunLengths)
            total = got[1].rows.total if got else 0
            time.sleep(0.1)
        assert total == 1000
        names = {r[0] for r in store.cursor("SELECT name FROM page_data")}
        assert {"run_lengths", "groups:node", "groups:shard", "truncation_over_time", "whatif"} <= names
        assert {f"gpu:{w}" for w in pagedata.GPU_WINDOWS_S} <= names
    finally:
        collector.stop()
        collector.pagedata.wait_idle()


def test_each_computation_reads_a_whole_round_of_staggered_polls(tmp_path):
    """The scheduler staggers nodes 31 ms apart; a local agent answers in a few ms, so a round's
    polls ran one at a time and, counting only polls running, the page data was computed after the
    first node's and showed the second's from the round before (#42 item 2). Every computation
    now reads both nodes' polls of one round."""
    nodes = local_nodes(tmp_path, [(50, 1), (50, 2)])
    config = RunConfig(name="t", nodes=nodes, interval_s=1.0, max_output_tokens=4096)
    store = Store(tmp_path / "store.sqlite3")
    collector = Collector(config, store)
    read: list[dict[str, float | None]] = []
    computed = collector.pagedata.run_now

    def run_now() -> None:
        read.append({n["name"]: n["last_ok_unix"] for n in store.nodes()})
        computed()

    collector.pagedata.run_now = run_now  # type: ignore[method-assign]
    try:
        collector.start()
        deadline = time.time() + 30
        while time.time() < deadline and sum(None not in r.values() for r in read) < 5:
            time.sleep(0.1)
    finally:
        collector.stop()
        collector.pagedata.wait_idle()
    rounds = [r for r in read if None not in r.values()][1:]  # the first may be the agents' start-up
    assert len(rounds) >= 4, read
    assert all(abs(r["n1"] - r["n2"]) < 0.5 for r in rounds), read  # type: ignore[operator]


def run_page(page: str, config: Path, monkeypatch) -> AppTest:
    """Screen `page` through the app's router (tests/test_pages.open_app)."""
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = open_app(page, timeout=30)
    at.run()
    assert not at.exception
    return at


def captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


def whatif_tile_sub(at: AppTest) -> str:
    """The sub-line of the Output lengths page's "Still truncated at …" tile."""
    return tile(tiles_of(at), "Still truncated at")[1]


def test_pages_read_the_payload_and_say_how_old_it_is(stores, monkeypatch):
    store = store_of(stores["ceiling_18"])
    computed = pagedata.compute_all(store, CEILING, INTERVAL_S)
    # Marked so that only a page that reads the payload can show it.
    groups = computed["groups:node"]
    assert isinstance(groups, GroupTable)
    groups.table.data["group"][0] = "read-from-payload"
    put_at = time.time() - 40
    pagedata.put(store, computed, put_at)
    at = run_page("lengths", stores["ceiling_18"], monkeypatch)
    by_group = next(t.value for t in at.table if "drift" in t.value.columns)  # the truncation-by-node table
    assert "read-from-payload" in by_group["node"].tolist()
    text = captions(at)
    assert "Truncation by node: computed by the collector at" in text
    assert "Length statistics: computed by the collector at" in text
    ages = [int(a) for a in re.findall(r"collector at [\d:]+ \((\d+) s ago\)", text)]
    assert ages and all(40 <= a < 100 for a in ages)  # the payload's age, not the page's
    assert "This what-if: computed by the collector at" in text
    # The what-if's share cut is its counts' (refitted once a minute): dated with the fit, never
    # a second "now" beside the live part's newer share.
    assert re.search(r"\d+\.\d% cut at " + re.escape(fmt_clock(put_at)), whatif_tile_sub(at)), whatif_tile_sub(at)
    assert "now" not in whatif_tile_sub(at)


def test_pages_without_payload_compute_and_say_so(stores, monkeypatch):
    store = store_of(stores["drift"])
    with store.transaction() as db:
        db.execute("DELETE FROM page_data")
    at = run_page("lengths", stores["drift"], monkeypatch)
    assert "Truncation by node: computed just now for this page (no precomputed copy yet)" in captions(at)
    # The what-if fitted here: dated by its counts' last collection, by the clock (its panel is
    # refitted once a minute; "just now" would stand unchanged for that minute).
    counts_at = fmt_clock(store.last_collection_unix())
    assert f"This what-if: fitted for this page on the counts of {counts_at}" in captions(at), captions(at)
    assert f"cut at {counts_at}" in whatif_tile_sub(at)
    assert any("Ceiling drift: node-4" in w.value for w in at.warning)


def test_gpu_page_reads_the_window_payload(stores, monkeypatch):
    store = store_of(stores["healthy"])
    with store.transaction() as db:
        db.execute("DELETE FROM page_data")
    at = run_page("gpus", stores["healthy"], monkeypatch)
    assert "Series over the last 1 h: computed just now" in captions(at)
    pagedata.put(store, pagedata.gpu_windows(store, time.time()), time.time() - 5)
    st.cache_data.clear()
    st.cache_resource.clear()
    at = run_page("gpus", stores["healthy"], monkeypatch)
    assert "Series over the last 1 h: computed by the collector at" in captions(at)
    assert len(at.get("plotly_chart")) >= 6  # the heat strip and five series
