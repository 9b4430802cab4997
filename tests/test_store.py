"""The history store: polls fold in atomically, resets never double, a kill -9 corrupts nothing."""

import os
import signal
import subprocess
import sys
import textwrap

from store_fixtures import write_reply

from runhealth.store import Store


def reply(files, *, pending=0, time_unix=1000.0, gpus=None):
    return {
        "schema_version": 1,
        "ok": True,
        "time_unix": time_unix,
        "agent_ms": 1.0,
        "hostname": "h",
        "loadavg": [0, 0, 0],
        "gpus": gpus or {"source": None, "error": "no GPU telemetry: test", "devices": []},
        "shards": {"matched": len(files), "unmatched_globs": [], "pending_bytes": pending, "files": files},
        "disk": {},
        "metrics": {},
    }


def entry(offset, counts, *, inode=1, reset=False, malformed=0, offset_from=0):
    tokens = sum(t * n for t, _, _, n in counts)
    return {
        "inode": inode,
        "size": offset,
        "offset_from": offset_from,
        "offset": offset,
        "reset": reset,
        "lines": sum(c[3] for c in counts) + malformed,
        "malformed": malformed,
        "tokens": tokens,
        "counts": counts,
        "error": None,
    }


def run_counts(store):
    return {(r["tokens"], r["finish_reason"], r["estimated"]): r["count"] for r in store.length_counts()}


def test_counts_accumulate_and_offsets_resume(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    write_reply(store, "n1", reply({"/a": entry(100, [[4096, "length", 0, 2], [10, "stop", 0, 1]])}), 1.0, 5.0)
    write_reply(
        store, "n1", reply({"/a": entry(150, [[4096, "length", 0, 1], [12, None, 0, 1]], offset_from=100)}), 2.0, 5.0
    )
    assert run_counts(store) == {(4096, "length", 0): 3, (10, "stop", 0): 1, (12, None, 0): 1}
    assert store.shard_state("n1") == {"/a": {"inode": 1, "offset": 150}}
    polls = store.polls()
    assert [p["completions"] for p in polls] == [3, 2]
    assert [p["length_stops"] for p in polls] == [2, 1]
    assert [p["backfill"] for p in polls] == [1, 0]  # the first poll of a node is catch-up, not throughput


def test_length_stops_over_time_split_at_the_ceiling_known_at_read_time(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    write_reply(store, "n1", reply({"/a": entry(100, [[4096, "length", 0, 2], [3000, "length", 0, 1]])}), 10.0, 5.0)
    write_reply(
        store,
        "n1",
        reply({"/a": entry(150, [[4096, "length", 0, 1], [900, "length", 1, 4]], offset_from=100)}),
        70.0,
        5.0,
    )
    rows = store.length_stops_by_bucket(60, ceiling=4096)
    assert [(r["bucket_unix"], r["at_ceiling"], r["below_ceiling"]) for r in rows] == [(0, 2, 1), (60, 1, 0)]
    # Estimated lengths (chars/4) are left out: they cannot be placed against the ceiling.
    assert store.length_stops_by_bucket(60, ceiling=2048)[0]["at_ceiling"] == 3
    assert store.last_growth_unix() == {"n1": 70.0}


def test_reset_drops_the_old_counts_of_that_shard_only(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    write_reply(
        store, "n1", reply({"/a": entry(100, [[5, "stop", 0, 4]]), "/b": entry(10, [[7, "stop", 0, 1]])}), 1.0, 1.0
    )
    write_reply(store, "n1", reply({"/a": entry(20, [[9, "stop", 0, 1]], inode=2, reset=True)}), 2.0, 1.0)
    assert run_counts(store) == {(9, "stop", 0): 1, (7, "stop", 0): 1}
    shard = {s["path"]: s for s in store.shards()}
    assert shard["/a"]["completions"] == 1 and shard["/a"]["resets"] == 1 and shard["/a"]["inode"] == 2
    assert store.polls()[-1]["backfill"] == 1


def test_groupings_and_node_status(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    store.register_node("n1", {"name": "n1", "passphrase_set": True})
    write_reply(store, "n1", reply({"/a": entry(10, [[5, "stop", 0, 2]])}, time_unix=103.0), 100.0, 3.0)
    write_reply(store, "n2", reply({"/b": entry(10, [[5, "stop", 0, 1]])}), 100.0, 3.0)
    store.record_failure("n2", "connection refused by 127.0.0.3:22", 200.0)
    by_node = {(r["node"], r["tokens"]): r["count"] for r in store.length_counts(by="node")}
    assert by_node == {("n1", 5): 2, ("n2", 5): 1}
    assert len(store.length_counts(by="shard")) == 2
    nodes = {n["name"]: n for n in store.nodes()}
    assert nodes["n1"]["skew_s"] == 3.0 and nodes["n1"]["config"] == {"name": "n1", "passphrase_set": True}
    assert nodes["n2"]["last_error"] == "connection refused by 127.0.0.3:22"
    assert nodes["n2"]["last_ok_unix"] == 100.0 and nodes["n2"]["failing_since_unix"] == 200.0
    assert store.last_collection_unix() == 100.0


def test_gpu_series_is_downsampled_in_sql(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    gpus = {
        "source": "nvml",
        "error": None,
        "devices": [
            {
                "index": i,
                "name": "H200",
                "uuid": f"GPU-{i}",
                "util_pct": 90,
                "mem_used_mib": 1,
                "mem_total_mib": 2,
                "power_w": 600,
                "power_limit_w": 700,
                "temp_c": 60,
                "sm_clock_mhz": 1900,
                "throttle_reasons": [],
                "processes": [],
                "error": None,
            }
            for i in range(2)
        ],
    }
    for t in range(500):
        write_reply(store, "n1", reply({}, gpus=gpus), float(t), 1.0)
    series = store.gpu_series(max_points=50)
    assert 2 * 45 <= len(series) <= 2 * 50
    assert {r["gpu"] for r in series} == {0, 1} and all(r["util_pct"] == 90 for r in series)
    assert len(store.gpu_latest()) == 2


def test_sample_batches(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    batch = store.new_sample_batch(3, 1.0)
    assert store.pending_sample_batch()["batch"] == batch and store.latest_sample_batch() is None
    store.finish_sample_batch(
        batch,
        [
            {
                "node": "n1",
                "path": "/a",
                "line_no": 1,
                "tokens": 4096,
                "finish_reason": "length",
                "text_tail": "<script>x</script>",
            }
        ],
        10,
        {},
        2.0,
    )
    latest = store.latest_sample_batch()
    assert latest["population"] == 10 and latest["samples"][0]["text_tail"] == "<script>x</script>"
    assert store.pending_sample_batch() is None


def test_history_survives_a_restart(tmp_path):
    write_reply(Store(tmp_path / "s.sqlite3"), "n1", reply({"/a": entry(10, [[5, "stop", 0, 2]])}), 1.0, 1.0)
    again = Store(tmp_path / "s.sqlite3")
    assert again.shard_state("n1") == {"/a": {"inode": 1, "offset": 10}}
    assert run_counts(again) == {(5, "stop", 0): 2}


WRITER = textwrap.dedent("""
    import sys
    from runhealth import ingest
    from runhealth.store import Store
    store = Store(sys.argv[1])
    i = 0
    while True:
        i += 1
        files = {"/a": {"inode": 1, "size": i, "offset": i, "reset": False, "malformed": 0, "tokens": 0,
                        "counts": [[1, "stop", 0, 1]], "error": None}}
        store.write_poll("n1", ingest.read_poll({"time_unix": 0, "shards": {"files": files}}), float(i), 1.0)
        if i == 50:
            print("ready", flush=True)
""")


def test_kill_9_mid_write_leaves_counts_consistent_with_offsets(tmp_path):
    """Every committed poll moved the offset by exactly one line and added one count."""
    path = tmp_path / "s.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert proc.stdout.readline().strip() == b"ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = Store(path)
    offset = store.shard_state("n1")["/a"]["offset"]
    assert offset >= 50
    assert run_counts(store) == {(1, "stop", 0): offset}
    assert len(store.polls()) == offset
    assert store._db().execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_reply_that_does_not_continue_from_the_stored_offset_is_ignored(tmp_path):
    """Two collectors on one store (or a replayed reply) must not double-count a shard."""
    store = Store(tmp_path / "s.sqlite3")
    first = reply({"/a": entry(100, [[5, "stop", 0, 4]])})
    write_reply(store, "n1", first, 1.0, 1.0)
    write_reply(store, "n1", first, 2.0, 1.0)  # the same scan from offset 0, delivered twice
    assert run_counts(store) == {(5, "stop", 0): 4}
    assert store.polls()[-1]["completions"] == 0


def test_the_poll_that_finishes_a_backlog_is_not_throughput(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    write_reply(store, "n1", reply({"/a": entry(100, [[5, "stop", 0, 4]])}, pending=900), 1.0, 1.0)
    write_reply(store, "n1", reply({"/a": entry(1000, [[5, "stop", 0, 40]], offset_from=100)}), 1.1, 1.0)
    write_reply(store, "n1", reply({"/a": entry(1010, [[5, "stop", 0, 1]], offset_from=1000)}), 6.0, 1.0)
    assert [p["backfill"] for p in store.polls()] == [1, 1, 0]


def test_node_aggregates_always_equal_the_sum_of_their_shards(tmp_path):
    """node_length_counts is maintained incrementally, resets included: it must never drift."""
    store = Store(tmp_path / "s.sqlite3")
    write_reply(
        store,
        "n1",
        reply({"/a": entry(100, [[5, "stop", 0, 4], [9, "length", 0, 1]]), "/b": entry(50, [[5, "stop", 0, 2]])}),
        1.0,
        1.0,
    )
    write_reply(store, "n1", reply({"/a": entry(30, [[5, "stop", 0, 1]], inode=2, reset=True)}), 2.0, 1.0)
    write_reply(store, "n1", reply({"/b": entry(80, [[7, None, 1, 3]], offset_from=50)}), 3.0, 1.0)

    def by_key(rows):
        out = {}
        for r in rows:
            key = (r["node"], r["tokens"], r["finish_reason"], r["estimated"])
            out[key] = out.get(key, 0) + r["count"]
        return out

    assert (
        by_key(store.length_counts(by="node"))
        == by_key(store.length_counts(by="shard"))
        == {("n1", 5, "stop", 0): 3, ("n1", 7, None, 1): 3}
    )
    totals = store.group_totals("node")
    assert totals == [{"node": "n1", "completions": 6, "exact": 3}]


def test_metric_latest_is_the_newest_sample_and_is_built_for_older_stores(tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    store.record_metrics("n1", {"vllm:x": 1.0, "vllm:y": 5.0}, 100.0)
    store.record_metrics("n1", {"vllm:x": 2.0}, 200.0)
    store.record_metrics("n1", {"vllm:x": 9.0}, 150.0)  # arrives late: older than what is shown
    store.record_metrics("n2", {"vllm:x": 3.0, "vllm:skip": None}, 120.0)
    latest = [(m["node"], m["name"], m["value"], m["ts_unix"]) for m in store.metric_latest()]
    assert latest == [("n1", "vllm:x", 2.0, 200.0), ("n1", "vllm:y", 5.0, 100.0), ("n2", "vllm:x", 3.0, 120.0)]
    # A store from before the metric_latest table (so before store versions, user_version 0):
    # rebuilt from the samples when opened (migration 1; tests/test_migrations.py has the rest).
    store._db().execute("DELETE FROM metric_latest")
    store._db().execute("PRAGMA user_version = 0")
    store.close()
    assert [(m["node"], m["name"], m["value"]) for m in Store(tmp_path / "h.sqlite3").metric_latest()] == [
        ("n1", "vllm:x", 2.0),
        ("n1", "vllm:y", 5.0),
        ("n2", "vllm:x", 3.0),
    ]


def test_pruning_drops_latest_metrics_that_stopped_reporting(tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    store.record_metrics("gone", {"vllm:x": 1.0}, 100.0)
    store.record_metrics("n1", {"vllm:x": 2.0, "vllm:y": 4.0}, 100.0)
    store.record_metrics("n1", {"vllm:x": 3.0}, 500.0)
    store.prune(keep_s=200, now_unix=600.0)
    assert [(m["node"], m["name"], m["value"]) for m in store.metric_latest()] == [("n1", "vllm:x", 3.0)]


def test_a_steady_poll_reads_each_row_it_updates_once(tmp_path, caplog):
    # #42 item 3: a poll's write is ~1.5 ms at 1,024 nodes, most of it SQLite; a steady poll read
    # each shard row twice (offset, then error) and the node row twice (its previous poll, then
    # again for the energy), and re-inserted rows it had just read ("INSERT OR IGNORE").
    store = Store(tmp_path / "s.sqlite3")
    files = {p: entry(100, [[4096, "length", 0, 2], [10, "stop", 0, 1]], inode=i) for i, p in enumerate(("/a", "/b"))}
    write_reply(store, "n1", reply(files), 1.0, 5.0)
    statements: list[str] = []
    store.cursor("SELECT 1").connection.set_trace_callback(statements.append)
    files = {
        p: entry(150, [[4096, "length", 0, 1]], inode=i, offset_from=100) | {"error": "gone?" if p == "/b" else None}
        for i, p in enumerate(("/a", "/b"))
    }
    with caplog.at_level("WARNING", logger="runhealth.store.writes"):
        write_reply(store, "n1", reply(files, time_unix=1010.0), 11.0, 5.0)
        write_reply(store, "n1", reply({p: e | {"offset_from": 150} for p, e in files.items()}), 21.0, 5.0)
    store.cursor("SELECT 1").connection.set_trace_callback(None)
    shard_reads = [s for s in statements if s.startswith("SELECT") and "FROM shards" in s]
    node_reads = [s for s in statements if s.startswith("SELECT") and "FROM nodes" in s]
    assert len(shard_reads) == 2 * 2 and len(node_reads) == 2  # per poll: each shard's row once, the node's once
    assert not [s for s in statements if s.startswith("INSERT OR IGNORE INTO")]  # the rows exist: read already
    # The shard's problem is still logged once, when it appears (not again while it stays).
    assert [r.getMessage() for r in caplog.records] == ["n1:/b: gone?"]
    assert store.shard_state("n1") == {"/a": {"inode": 0, "offset": 150}, "/b": {"inode": 1, "offset": 150}}
    assert run_counts(store) == {(4096, "length", 0): 8, (10, "stop", 0): 2}
