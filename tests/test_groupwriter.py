"""Polls' writes grouped (runhealth/collect/groupwriter.py): one transaction for the polls that
land together, each caller back once its poll is committed, a failure only the failing poll's."""

from __future__ import annotations

import threading
import time

from shardgen import truth_rows, write_shard
from store_fixtures import poll_reply
from test_collector import local_node

from runhealth import ingest
from runhealth.collect import groupwriter
from runhealth.collect.collector import Collector
from runhealth.settings.config import RunConfig
from runhealth.store import Store


def record(offset_from: int, offset: int, counts: list[list]) -> ingest.PollRecord:
    tokens = sum(t * n for t, _f, _e, n in counts)
    entry = {"inode": 7, "size": offset, "offset_from": offset_from, "offset": offset, "reset": False}
    entry |= {"lines": sum(c[3] for c in counts), "malformed": 0, "tokens": tokens, "counts": counts, "error": None}
    return ingest.read_poll(poll_reply(1000.0, [], {"/data/a.jsonl": entry}))  # type: ignore[arg-type]


def write_together(writer: groupwriter.GroupWriter, polls: dict[str, ingest.PollRecord]) -> dict[str, object]:
    """Each poll from its own thread, all begun (`polling`) before any is written, as a pool's
    polls of one round: node -> its delta or the exception its write raised."""
    out: dict[str, object] = {}
    begun = threading.Barrier(len(polls))

    def one(node: str, rec: ingest.PollRecord) -> None:
        with writer.polling():
            begun.wait()
            try:
                out[node] = writer.write_poll(node, rec, 10.0, 5.0)
            except Exception as exc:
                out[node] = exc

    threads = [threading.Thread(target=one, args=item) for item in polls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_polls_that_land_together_commit_in_one_transaction(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    writer = groupwriter.GroupWriter(store, linger_s=5.0)  # long: the group is the polls in flight
    polls = {f"n{i}": record(0, 100 + i, [[4096, "length", 0, 1], [10 + i, "stop", 0, 2]]) for i in range(8)}
    got = write_together(writer, polls)
    assert writer.groups == 1 and writer.polls == 8  # all 8 waited for each other, not for the linger
    assert got == {n: {**got[n], "completions": 3} for n in polls}  # each caller its own poll's deltas
    assert {n: store.shard_state(n)["/data/a.jsonl"]["offset"] for n in polls} == {f"n{i}": 100 + i for i in range(8)}
    rows = {(r["tokens"], r["finish_reason"]): r["count"] for r in store.length_counts()}
    assert rows == {(4096, "length"): 8} | {(10 + i, "stop"): 2 for i in range(8)}
    writer.stop()


def test_a_failing_poll_fails_alone_and_writes_nothing(tmp_path):
    # A count too large for SQLite fails its poll's statements: the group is rolled back whole and
    # its polls written again one by one, so only that poll fails, with its own error, and none of
    # its rows (not its offset either) is in the store; the next poll of it counts from where it was.
    store = Store(tmp_path / "s.sqlite3")
    writer = groupwriter.GroupWriter(store, linger_s=5.0)
    polls = {f"n{i}": record(0, 100, [[50, "stop", 0, 1]]) for i in range(4)}
    polls["n2"] = record(0, 100, [[50, "stop", 0, 2**64]])
    got = write_together(writer, polls)
    assert isinstance(got["n2"], OverflowError)
    assert all(got[n] == {**got["n0"], "completions": 1} for n in ("n0", "n1", "n3"))
    assert store.shard_state("n2") == {} and store.polls(node="n2") == []
    assert {r["node"] for r in store.polls()} == {"n0", "n1", "n3"}
    assert writer.write_poll("n2", record(0, 100, [[50, "stop", 0, 5]]), 20.0, 5.0)["completions"] == 5
    writer.stop()


def test_a_lone_poll_is_written_at_once_and_after_stop_by_its_caller(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    writer = groupwriter.GroupWriter(store, linger_s=30.0)
    start = time.monotonic()
    with writer.polling():  # no other poll in flight: nothing to wait for
        writer.write_poll("n1", record(0, 100, [[50, "stop", 0, 1]]), 10.0, 5.0)
    assert time.monotonic() - start < 10.0 and writer.groups == 1
    writer.stop()
    assert writer.write_poll("n1", record(100, 200, [[50, "stop", 0, 1]]), 20.0, 5.0)["completions"] == 1
    assert writer.groups == 1 and len(store.polls(node="n1")) == 2  # written by the caller


def test_a_collector_writes_in_groups_at_its_poll_rate_and_counts_exactly(tmp_path):
    """Six real agents (local transport) polled every 0.5 s for 3 s: each node keeps its rate
    (polls done / scheduled as without groups), every poll was written through the writer, and
    the counts are each shard's exact ones."""
    sizes = [300, 200, 250, 150, 100, 350]
    for i, n in enumerate(sizes):
        (tmp_path / f"n{i}").mkdir()
        write_shard(tmp_path / f"n{i}" / "a.jsonl", truth_rows(n, i + 1))
    nodes = [local_node(f"n{i}", str(tmp_path / f"n{i}" / "*.jsonl")) for i in range(len(sizes))]
    store = Store(tmp_path / "store.sqlite3")
    collector = Collector(RunConfig(name="t", nodes=nodes, interval_s=0.5), store)
    collector.start()
    try:
        time.sleep(3.2)
    finally:
        collector.stop()
    polls = dict(store.cursor("SELECT node, COUNT(*) FROM polls GROUP BY node").fetchall())
    assert all(4 <= polls[f"n{i}"] <= 8 for i in range(len(sizes))), polls  # ~6 scheduled each
    assert collector.writer.polls == sum(polls.values()) and 1 <= collector.writer.groups <= collector.writer.polls
    assert {r["name"]: r["completions"] for r in store.nodes()} == {f"n{i}": n for i, n in enumerate(sizes)}


def test_a_writer_thread_that_ended_leaves_no_caller_waiting(tmp_path, monkeypatch):
    # It never should end while polls come (each group's errors are its polls'); if it did, a
    # caller must not wait forever: its poll, still queued, is written by the caller.
    store = Store(tmp_path / "s.sqlite3")
    writer = groupwriter.GroupWriter(store)
    monkeypatch.setattr(groupwriter, "WRITER_CHECK_S", 0.05)
    monkeypatch.setattr(writer, "_next_group", lambda: None)  # the thread ends at once, taking nothing
    assert writer.write_poll("n1", record(0, 100, [[50, "stop", 0, 1]]), 10.0, 5.0)["completions"] == 1
    assert writer.groups == 0 and store.shard_state("n1")["/data/a.jsonl"]["offset"] == 100
