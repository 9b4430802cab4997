"""The collector over real agents (local transport): exact counts, growth, failures, samples."""

import http.server
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest
from shardgen import chat_line, truth_rows, write_shard

from runhealth.collect.collector import Collector, NodePoller
from runhealth.errors import StoreError
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store


def local_node(name, shard_glob, **kw):
    return NodeConfig(
        name=name, host="local", shards=[shard_glob], python=sys.executable, gpu="off", command_timeout_s=20.0, **kw
    )


@pytest.fixture
def run(tmp_path):
    """Two local nodes with known shards: 600 + 400 completions, 18% at 4096."""
    for i, (n, seed) in enumerate([(600, 1), (400, 2)], start=1):
        (tmp_path / f"n{i}").mkdir()
        write_shard(tmp_path / f"n{i}" / "a.jsonl", truth_rows(n, seed))
    config = RunConfig(
        name="t",
        nodes=[local_node("n1", str(tmp_path / "n1" / "*.jsonl")), local_node("n2", str(tmp_path / "n2" / "*.jsonl"))],
        interval_s=0.5,
    )
    store = Store(tmp_path / "store.sqlite3")
    collector = Collector(config, store)
    yield tmp_path, config, store, collector
    collector.stop()


def counts(store, by="run"):
    out = {}
    for r in store.length_counts(by=by):
        key = (r.get("node"), r["tokens"], r["finish_reason"])
        out[key] = out.get(key, 0) + r["count"]
    return out


def truth(*row_lists, node=None):
    out = {}
    for rows in row_lists:
        for t, f in rows:
            out[(node, t, f)] = out.get((node, t, f), 0) + 1
    return out


def test_poll_once_counts_every_line_exactly(run):
    tmp, config, store, collector = run
    results = collector.poll_once()
    assert all(isinstance(r, dict) for r in results.values())
    assert counts(store) == truth(truth_rows(600, 1), truth_rows(400, 2))
    assert counts(store, "node") == {**truth(truth_rows(600, 1), node="n1"), **truth(truth_rows(400, 2), node="n2")}


def test_growth_half_written_line_and_restart_never_double_count(run):
    tmp, config, store, collector = run
    collector.poll_once()
    shard = tmp / "n1" / "a.jsonl"
    extra = [(4096, "length"), (77, "stop")]
    write_shard(shard, extra, mode="a")
    half = chat_line(123, "stop")
    with open(shard, "a") as f:
        f.write(half[:30])  # the writer is mid-line
    collector.poll_once()
    expected = truth(truth_rows(600, 1), truth_rows(400, 2), extra)
    assert counts(store) == expected
    with open(shard, "a") as f:
        f.write(half[30:])
    # A dashboard restart: a fresh collector resumes from the stored offsets.
    collector.stop()
    with Collector(config, store) as again:
        again.poll_once()
    expected[(None, 123, "stop")] = expected.get((None, 123, "stop"), 0) + 1
    assert counts(store) == expected


def test_a_failing_node_does_not_stop_the_others(tmp_path):
    (tmp_path / "ok").mkdir()
    write_shard(tmp_path / "ok" / "a.jsonl", truth_rows(50, 3))
    config = RunConfig(
        name="t",
        nodes=[
            local_node("good", str(tmp_path / "ok" / "*.jsonl")),
            NodeConfig(name="bad", host="local", shards=["/nonexistent/*.jsonl"], python="/nonexistent/python3"),
        ],
    )
    store = Store(tmp_path / "s.sqlite3")
    with Collector(config, store) as collector:
        results = collector.poll_once()
    assert isinstance(results["good"], dict) and isinstance(results["bad"], Exception)
    nodes = {n["name"]: n for n in store.nodes()}
    assert nodes["good"]["last_ok_unix"] is not None and nodes["good"]["completions"] == 50
    assert nodes["bad"]["last_ok_unix"] is None and nodes["bad"]["last_error"]


def test_background_threads_poll_and_refresh_wakes_them(run):
    tmp, config, store, collector = run
    collector.start()
    deadline = time.time() + 20
    while time.time() < deadline and sum(counts(store).values()) < 1000:
        time.sleep(0.1)
    assert sum(counts(store).values()) == 1000
    write_shard(tmp / "n2" / "a.jsonl", [(5, "stop")], mode="a")
    collector.request_refresh()
    while time.time() < deadline and sum(counts(store).values()) < 1001:
        time.sleep(0.05)
    assert sum(counts(store).values()) == 1001


def test_uniform_sample_across_nodes_and_coalescing(run):
    tmp, config, store, collector = run
    collector.poll_once()
    samples, population, errors = collector.sample_now(200, seed=7)
    assert errors == {} and population == 1000 and len(samples) == 200
    by_node = sum(s["node"] == "n1" for s in samples)
    assert 90 <= by_node <= 150  # n1 holds 60% of the lines
    truncated, _, _ = collector.sample_now(40, finish_reason="length", seed=8)
    assert truncated and all(s["finish_reason"] == "length" for s in truncated)
    # Two tabs clicking Re-sample while a sample is in flight: one batch. Holding a node's
    # agent lock keeps the first sample in flight, so the test does not depend on timing.
    batches = []
    with collector.pollers["n1"].lock:
        threads = [threading.Thread(target=lambda: batches.append(collector.request_sample(30))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(batches) == 2 and len(set(batches)) == 1
    deadline = time.time() + 20
    while store.latest_sample_batch() is None and time.time() < deadline:
        time.sleep(0.05)
    batch = store.latest_sample_batch()
    assert batch["batch"] == batches[0] and len(batch["samples"]) == 30


def test_a_second_collector_on_the_same_store_refuses_to_start(run):
    tmp, config, store, collector = run
    collector.start()
    second = Collector(config, Store(store.path))
    with pytest.raises(StoreError, match="already collecting"):
        second.start()
    collector.stop()
    second.start()  # the lock goes with the first collector
    second.stop()


def test_start_is_idempotent(run):
    tmp, config, store, collector = run
    collector.start()
    threads = {t.ident for t in threading.enumerate() if t.name.startswith("runhealth-")}
    collector.start()
    assert {t.ident for t in threading.enumerate() if t.name.startswith("runhealth-")} == threads


# -- one write per poll (issue 31 item 2) ----------------------------------------------------
VLLM_METRICS = (Path(__file__).parent / "fixtures" / "metrics" / "vllm.txt").read_bytes()


@pytest.fixture
def metrics_url():
    """A vLLM /metrics endpoint on loopback (the fixture's text), for the agent to fetch."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(VLLM_METRICS)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def _poller(tmp_path, metrics_url, rows):
    write_shard(tmp_path / "a.jsonl", rows)
    store = Store(tmp_path / "store.sqlite3")
    node = local_node("n1", str(tmp_path / "*.jsonl"), metrics_urls=[metrics_url])
    return store, NodePoller(node, store, 1.0)


def _everything(store):
    """What one poll writes, table by table (counts, offsets, poll rows, hourly rows, metrics)."""
    return {
        "counts": counts(store),
        "offsets": {p: c["offset"] for p, c in store.shard_state("n1").items()},
        "polls": len(store.polls()),
        "hourly": store.cursor("SELECT COALESCE(SUM(count), 0) FROM length_hourly").fetchone()[0],
        "metrics": len(store.metric_latest()),
    }


def test_a_poll_is_one_write_transaction(tmp_path, metrics_url):
    """Counts, hourly length rows and server metrics of one reply: one transaction (three on 739751b)."""
    rows = truth_rows(300, 5)
    store, poller = _poller(tmp_path, metrics_url, rows)
    begun = []
    transaction = store.transaction

    def counting():
        begun.append(1)
        return transaction()

    store.transaction = counting  # an instance attribute: this store's writes only
    poller.poll()
    assert len(begun) == 1
    got = _everything(store)
    assert got["counts"] == truth(rows) and got["hourly"] == 300 and got["metrics"] > 0


@pytest.mark.parametrize("table", ["length_hourly", "metric_samples"])
def test_a_poll_whose_hourly_or_metrics_write_fails_writes_nothing(tmp_path, metrics_url, table):
    """A kill or a failure between the counts and their hourly rows or metrics cannot leave counts
    without them: the poll writes all or nothing, and the next one writes all of it once."""
    rows = truth_rows(300, 6)
    store, poller = _poller(tmp_path, metrics_url, rows)
    db = sqlite3.connect(store.path, isolation_level=None)
    db.execute(  # on a store where the table is still created on first use (739751b's length_hourly)
        "CREATE TABLE IF NOT EXISTS length_hourly (bucket_unix INTEGER NOT NULL, tokens INTEGER NOT NULL,"
        " by_length INTEGER NOT NULL, estimated INTEGER NOT NULL, backfill INTEGER NOT NULL, count INTEGER NOT NULL,"
        " PRIMARY KEY (bucket_unix, tokens, by_length, estimated, backfill)) WITHOUT ROWID"
    )
    db.execute(f"CREATE TRIGGER fail BEFORE INSERT ON {table} BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END")
    with pytest.raises(StoreError, match="disk I/O error"):
        poller.poll()
    assert _everything(store) == {"counts": {}, "offsets": {}, "polls": 0, "hourly": 0, "metrics": 0}
    db.execute("DROP TRIGGER fail")
    db.close()
    poller.poll()
    got = _everything(store)
    assert got["counts"] == truth(rows) and got["hourly"] == 300 and got["polls"] == 1 and got["metrics"] > 0
