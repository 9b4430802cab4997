"""/metrics and the alerts stay bounded and current under hostile data (issue 23, items 12-13 and
two minor ones): finish_reason values that are all different, control characters in label
values, a node removed from the config, more than five scrapes at once. Real shards read by the
real agent, real SQLite files, a real HTTP server on loopback."""

from __future__ import annotations

import math
import socket
import sqlite3
import threading
import time
import urllib.request
from collections import Counter

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from shardgen import chat_line

from components.tables import finish_reason_table
from runhealth.alerting import exporter
from runhealth.analysis import reasons
from runhealth.collect.collector import Collector
from runhealth.rules import health
from runhealth.settings.config import RunConfig
from runhealth.store import Store
from tests.test_collector import local_node
from tests.test_prometheus import META, _store

JUNK = 3000  # distinct made-up finish reasons (100,000 in the report; the bound does not depend on it)


def _hostile_shard(path) -> Counter:
    """stop, length, and JUNK lines each with its own finish_reason (long ones, ESC and NUL in
    some); returns what each reason counts."""
    truth: Counter = Counter()
    with open(path, "w") as f:
        for i in range(600):
            reason = "stop" if i % 3 else "length"
            f.write(chat_line(100 + i % 7, reason))
            truth[reason] += 1
        for i in range(JUNK):
            reason = f"junk-{i}" + ("\x1b]0;pwned\x07" if i % 2 else "\x00" * 3) + "x" * (i % 90)
            f.write(chat_line(50 + i % 5, reason))
            truth[reason] += 1
    return truth


def _exposition(store: Store) -> str:
    return generate_latest(exporter.registry_for(store)).decode()


def test_distinct_finish_reasons_stay_a_bounded_set_with_exact_totals(tmp_path):
    (tmp_path / "n1").mkdir()
    truth = _hostile_shard(tmp_path / "n1" / "a.jsonl")
    config = RunConfig(name="t", nodes=[local_node("n1", str(tmp_path / "n1" / "*.jsonl"))], interval_s=1)
    store = Store(tmp_path / "store.sqlite3")
    Collector(config, store).poll_once()
    total = sum(truth.values())

    stored = store.query("SELECT finish_reason, SUM(count) AS n FROM node_length_counts GROUP BY finish_reason")
    assert len(stored) <= len(reasons.KNOWN) + reasons.MAX_STORED_OTHERS + 1  # + "other"
    assert sum(r["n"] for r in stored) == total
    by_name = {r["finish_reason"]: r["n"] for r in stored}
    assert by_name["stop"] == truth["stop"] and by_name["length"] == truth["length"]
    assert all(len(name) <= reasons.MAX_REASON_CHARS and name.isprintable() for name in by_name)

    text = _exposition(store)
    samples = [
        s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "runhealth_completions_total"
    ]
    assert len(samples) <= len(reasons.KNOWN) + reasons.MAX_SHOWN_OTHERS + 1
    assert sum(s.value for s in samples) == total
    assert {s.labels["finish_reason"]: s.value for s in samples}["stop"] == truth["stop"]
    assert "\x1b" not in text and "\x00" not in text and len(text) < 20_000

    summary = health.run_summary(store, None)
    assert sum(summary.finish_reasons.values()) == total
    assert len(summary.finish_reasons) <= len(reasons.KNOWN) + reasons.MAX_SHOWN_OTHERS + 1
    assert len(finish_reason_table(summary)) <= len(reasons.KNOWN) + reasons.MAX_SHOWN_OTHERS + 3


def test_a_store_written_before_the_bound_still_exports_a_bounded_set(tmp_path):
    """100,000 distinct reasons already in a store's table (written by an older version): the
    scrape stays small and the counts exact."""
    store = _store(tmp_path, "healthy")
    before = store.query("SELECT SUM(count) AS n FROM node_length_counts")[0]["n"]
    size_before = len(_exposition(store))  # the GPU families alone are ~45 KB on this store
    with sqlite3.connect(store.path) as db:
        db.executemany(
            "INSERT INTO node_length_counts VALUES (?,?,?,?,?)",
            [("node-1", 7, f"reason-{i}", 0, 1 + (i == 5)) for i in range(100_000)],
        )
    # CPU time: the scrape's own cost, not the machine's load; the least of three scrapes (2.19 s
    # in a loaded CI run, 1.74-1.84 s alone here, before the unshown reasons were summed in
    # countgroups.regroup; 1.08-1.15 s after: a core shared with the other workers runs slower).
    scrape_s = math.inf
    for _ in range(3):
        t0 = time.process_time()
        text = _exposition(store)
        scrape_s = min(scrape_s, time.process_time() - t0)
    samples = [
        s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "runhealth_completions_total"
    ]
    assert sum(s.value for s in samples) == before + 100_001
    labels = {s.labels["finish_reason"] for s in samples if s.labels["node"] == "node-1"}
    assert "reason-5" in labels and "other" in labels  # the most frequent other is named
    assert len(samples) <= 4 * (len(reasons.KNOWN) + reasons.MAX_SHOWN_OTHERS + 2)
    # 100,000 more reasons add a bounded few samples (~1 KB), not one line each (~9 MB)
    assert len(text) - size_before < 5_000 and scrape_s < 2.0, (len(text), size_before, scrape_s)


def test_control_characters_never_reach_the_exposition_raw(tmp_path):
    store = _store(tmp_path, "healthy")
    with sqlite3.connect(store.path) as db:  # as an agent could report them
        db.execute("UPDATE gpu_latest SET uuid = ? WHERE node = 'node-1'", ("GPU-\x1b[2J\x00x",))
        db.execute("INSERT INTO node_length_counts VALUES ('node-1', 9, ?, 0, 3)", ("st\x1bop\x00",))
    text = _exposition(store)
    assert "\x1b" not in text and "\x00" not in text
    assert "GPU-\\\\x1b[2J\\\\x00x" in text  # shown as visible escapes, not dropped


def test_a_node_removed_from_the_config_leaves_alerts_and_series_but_keeps_its_history(tmp_path):
    now = time.time()
    store = _store(tmp_path, now=now)  # node-2 stale, node-3 down
    assert {a.node for a in health.evaluate(store, now)} >= {"node-2", "node-3"}
    completions = sum(n["completions"] for n in store.nodes())
    store.set_meta("run", {**META, "nodes": ["node-1", "node-2", "node-4"]})  # node-3 removed
    assert "node-3" not in {a.node for a in health.evaluate(store, now)}
    assert "node-2" in {a.node for a in health.evaluate(store, now)}  # still configured: still alerted
    text = _exposition(store)
    up = {
        s.labels["node"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name in ("runhealth_node_up", "runhealth_last_poll_age_seconds", "runhealth_gpu_temperature_celsius")
    }
    assert up == {"node-1", "node-2", "node-4"}
    assert sum(n["completions"] for n in store.nodes()) == completions  # its history stays readable
    assert any(r["node"] == "node-3" for r in store.length_counts(by="node"))


def test_more_than_five_concurrent_scrapes_are_all_answered(tmp_path):
    """The listen backlog was 5: with the server busy, a sixth connection waited for the
    kernel's SYN retry (1 s, then 3 s). Counted with the accept loop paused: every connection
    the kernel completes waits in the backlog."""
    store = _store(tmp_path, "healthy")
    server = exporter.serve(store, 0)
    port = server.server_port
    try:
        times: list[float] = []

        def scrape() -> None:
            t0 = time.monotonic()
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            times.append(time.monotonic() - t0)

        threads = [threading.Thread(target=scrape) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert len(times) == 12
        server.shutdown()  # the accept loop stops; the socket keeps listening
        waiting = []
        for _ in range(20):
            try:
                waiting.append(socket.create_connection(("127.0.0.1", port), timeout=0.3))
            except OSError:  # the backlog is full: the kernel drops the SYN
                break
        assert len(waiting) == 20
    finally:
        for sock in locals().get("waiting", []):
            sock.close()
        server.server_close()


def test_reason_names_keep_known_ones_the_most_frequent_others_and_exact_totals():
    counts = {"stop": 50, "length": 20, "": 3, **{f"r{i}": i for i in range(1, 21)}}
    shown = reasons.bounded(counts, keep=3)
    assert shown == {
        "stop": 50,
        "other": sum(range(1, 18)),
        "length": 20,
        "r20": 20,
        "r19": 19,
        "r18": 18,
        "missing": 3,
    }
    assert sum(shown.values()) == sum(counts.values())
    assert reasons.clean("x" * 100) == "x" * 39 + "…" and reasons.clean("a\x1bb") == "a\\x1bb"
    namer = reasons.Namer(["stop", "old-1", "old-2"], limit=3)
    assert [namer.name(r) for r in ("length", "old-1", "new-1", "new-2", None)] == [
        "length",
        "old-1",
        "new-1",
        "other",
        None,
    ]
