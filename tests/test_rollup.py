"""Whole-run history: raw rows fold into 1-min and 10-min rollups without losing a count."""

from __future__ import annotations

import random

import pytest
from store_fixtures import write_reply

from runhealth.store import Store, rollup

DAY = 86400.0
NOW = 1_800_000_000.0  # a multiple of 600: bucket edges are easy to reason about
FAST = {"chunk_s": 6 * 3600, "pause_s": 0.0}  # the default 2-min chunks work the same, 180x the transactions


def _fill(store: Store, days: float = 9, step: float = 30.0, nodes: int = 2, gpus: int = 2, seed: int = 1) -> None:
    """`days` of samples every `step` seconds ending at NOW, written as the store's own writes would."""
    rng = random.Random(seed)
    rows_gpu, rows_poll, rows_metric = [], [], []
    t = NOW - days * DAY
    while t < NOW:
        for n in range(nodes):
            node = f"node-{n}"
            for g in range(gpus):
                rows_gpu.append(
                    (
                        t,
                        node,
                        g,
                        rng.uniform(0, 100),
                        1000.0,
                        2000.0,
                        rng.uniform(100, 700),
                        700.0,
                        60.0,
                        1900.0,
                        int(rng.random() < 0.01),
                    )
                )
            rows_poll.append((t, node, t, rng.randint(0, 50), rng.randint(0, 50_000), rng.randint(0, 5), 0, 0, 5.0))
            rows_metric.append((t, node, "sglang:gen_throughput", rng.uniform(1000, 2000)))
        t += step
    with store.transaction() as db:
        db.executemany("INSERT INTO gpu_samples VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows_gpu)
        db.executemany(
            "INSERT INTO polls (ts_unix, node, node_ts_unix, completions, tokens, length_stops, malformed, backfill, rtt_ms) VALUES (?,?,?,?,?,?,?,?,?)",
            rows_poll,
        )
        db.executemany("INSERT INTO metric_samples VALUES (?,?,?,?)", rows_metric)


def _totals(store: Store) -> dict:
    raw = store.query(
        "SELECT COUNT(*) AS polls, SUM(completions) AS c, SUM(tokens) AS t, SUM(length_stops) AS l FROM polls"
    )[0]
    rolled = {"polls": 0, "c": 0, "t": 0, "l": 0}
    if store.query("SELECT 1 FROM sqlite_master WHERE name = 'poll_rollup'"):
        rolled = store.query(
            "SELECT COALESCE(SUM(polls), 0) AS polls, COALESCE(SUM(completions), 0) AS c,"
            " COALESCE(SUM(tokens), 0) AS t, COALESCE(SUM(length_stops), 0) AS l FROM poll_rollup"
        )[0]
    return {k: (raw[k] or 0) + rolled[k] for k in raw}


def _gpu_mean(store: Store, node: str, gpu: int) -> tuple[float, int]:
    raw = store.query(
        "SELECT SUM(util_pct) AS s, COUNT(*) AS n FROM gpu_samples WHERE node = ? AND gpu = ?", (node, gpu)
    )[0]
    s, n = raw["s"] or 0.0, raw["n"]
    if store.query("SELECT 1 FROM sqlite_master WHERE name = 'gpu_rollup'"):
        r = store.query(
            "SELECT SUM(util_pct * n) AS s, SUM(n) AS n FROM gpu_rollup WHERE node = ? AND gpu = ?", (node, gpu)
        )[0]
        s, n = s + (r["s"] or 0.0), n + (r["n"] or 0)
    return s / n, n


def test_fold_keeps_every_count_and_every_mean(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    _fill(store)
    before, mean_before = _totals(store), _gpu_mean(store, "node-1", 1)
    rollup.rollup(store, now=NOW, **FAST)
    assert _totals(store) == before
    mean, n = _gpu_mean(store, "node-1", 1)
    assert n == mean_before[1] and mean == pytest.approx(mean_before[0], rel=1e-12)
    oldest_raw = store.query("SELECT MIN(ts_unix) AS t FROM gpu_samples")[0]["t"]
    assert oldest_raw >= NOW - DAY - 60
    tiers = {
        r["res_s"]: r
        for r in store.query(
            "SELECT res_s, MIN(bucket_unix) AS lo, MAX(bucket_unix) AS hi, COUNT(*) AS k FROM gpu_rollup GROUP BY res_s"
        )
    }
    assert tiers[60]["lo"] >= NOW - 7 * DAY - 600 and tiers[60]["hi"] < NOW - DAY
    assert tiers[600]["hi"] < NOW - 7 * DAY and tiers[600]["lo"] <= NOW - 9 * DAY + 600
    rows_after = store.query("SELECT (SELECT COUNT(*) FROM gpu_samples) + (SELECT COUNT(*) FROM gpu_rollup) AS n")
    # 4 GPUs: a day of 30 s rows, 6 days of 1-min rows, 2 days of 10-min rows (was 9 days of 30 s rows).
    assert rows_after[0]["n"] == 4 * (DAY / 30 + 6 * 1440 + 2 * 144)


def test_rollup_is_idempotent_and_merges_late_rows(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    _fill(store, days=3)
    rollup.rollup(store, now=NOW, **FAST)
    snapshot = store.query("SELECT * FROM gpu_rollup ORDER BY res_s, bucket_unix, node, gpu")
    rollup.rollup(store, now=NOW, **FAST)
    assert store.query("SELECT * FROM gpu_rollup ORDER BY res_s, bucket_unix, node, gpu") == snapshot
    before = _totals(store)
    late_t = NOW - 2 * DAY + 15  # inside a bucket already rolled up
    write_reply(store, "node-0", {"time_unix": late_t, "shards": {"files": {}}, "gpus": {}}, late_t, 5.0)
    rollup.rollup(store, now=NOW, **FAST)
    after = _totals(store)
    assert after["polls"] == before["polls"] + 1 and after["c"] == before["c"]


def test_history_reads_span_the_whole_run_at_bounded_size(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    _fill(store, days=9, step=60)
    whole_raw = store.gpu_series(max_points=100)
    rollup.rollup(store, now=NOW, **FAST)
    series = rollup.gpu_history(store, max_points=100)
    per_gpu = [r for r in series if r["node"] == "node-0" and r["gpu"] == 0]
    assert 90 <= len(per_gpu) <= 100
    assert per_gpu[0]["ts_unix"] <= NOW - 9 * DAY + 600 and per_gpu[-1]["ts_unix"] >= NOW - 2 * DAY
    # The same buckets from raw rows and from rollups agree (weighted means of the same samples).
    raw_mean = sum(r["util_pct"] for r in whole_raw if r["node"] == "node-0" and r["gpu"] == 0) / 100
    rolled_mean = sum(r["util_pct"] for r in per_gpu) / len(per_gpu)
    assert rolled_mean == pytest.approx(raw_mean, rel=0.02)
    polls = rollup.poll_history(store, 3600)
    assert len(polls) == 9 * 24
    assert sum(p["completions"] for p in polls) == _totals(store)["c"]
    last_day = rollup.poll_history(store, 3600, since_unix=NOW - DAY)
    assert len(last_day) == 24


@pytest.mark.parametrize("since", [None, NOW - 900])
def test_the_union_read_and_the_raw_read_are_one_downsampling(tmp_path, monkeypatch, since):
    """gpu_history's raw + rollup read (forced, though nothing is rolled up yet) gives exactly
    Store.gpu_series' buckets: the raw read is a fast path of the same SQL builder, not a second
    downsampler (issue 31 item 4), down to a missing reading and a throttled sample."""
    store = Store(tmp_path / "s.sqlite3")
    _fill(store, days=0.1, step=10)
    with store.transaction() as db:  # one GPU that cannot report power: a NULL mean, not a zero
        db.execute("UPDATE gpu_samples SET power_w = NULL WHERE node = 'node-1' AND gpu = 1")
        db.execute("UPDATE gpu_samples SET temp_c = NULL WHERE node = 'node-0' AND ts_unix > ?", (NOW - 600,))
    raw = store.gpu_series(since_unix=since, max_points=37)
    monkeypatch.setattr(rollup, "has_rollups", lambda s: True)
    assert rollup.gpu_history(store, since_unix=since, max_points=37) == raw
    assert any(r["power_w"] is None for r in raw) and any(r["temp_c"] is None for r in raw)
    assert any(r["throttled"] for r in raw) and 30 <= len(raw) // 4 <= 37


def test_reads_fall_back_to_raw_before_any_rollup(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    _fill(store, days=0.1)
    assert rollup.gpu_history(store, max_points=50) == store.gpu_series(max_points=50)
    assert rollup.poll_history(store, 600) == store.polls_by_bucket(600)
