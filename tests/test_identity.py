"""A shard's identity includes its content (issue 29, item 4): a file rewritten under the same
inode is a new file, counted from byte 0, and its old counts leave the totals.

ext4 hands a freed inode straight back (`rm f` then create `f`), and `open(path, "w")` keeps
it: inode + size alone cannot tell a relaunch's new shard from the old one grown. Every test
here rewrites real files and checks that the inode really was kept.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import pytest
from shardgen import chat_line

from runhealth.collect.collector import Collector
from runhealth.node import agent, wire
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store

OLD = [(100 + i % 50, "stop") for i in range(1000)]  # the first launch: 1,000 stops
NEW = [(4096, "length")] * 1500  # the relaunch: 1,500 lines truncated at the limit


def text(rows, pad=40):
    return "".join(chat_line(t, fr, "y" * pad) for t, fr in rows)


def rewrite(path, data, how):
    """Replace the file's content: `rm` + create (ext4 reuses the freed inode at once, unless
    another process takes it first) or a truncating open(path, "w") (always keeps it). Returns
    whether the inode was kept."""
    inode = os.stat(path).st_ino
    if how == "rm":
        os.remove(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)
    return os.stat(path).st_ino == inode


def relaunch(tmp_path, collect, how, node=None, attempts=8):
    """(collector, shard) once a shard of OLD was counted and then rewritten with NEW under its
    inode. With `rm` another process may take the freed inode first (the other tests running
    on this disk): then the scenario is set up again in a fresh folder with a fresh store."""
    for attempt in range(attempts):
        folder = tmp_path / f"try{attempt}"
        folder.mkdir()
        shard = folder / "out.jsonl"
        shard.write_text(text(OLD))
        collector = collect(folder, node)
        poll_until_indexed(collector)
        assert totals(collector.store) == ({"stop": 1000}, 0)
        if rewrite(shard, text(NEW), how):
            return collector, shard
    pytest.skip(f"this filesystem never gave the recreated file its inode back in {attempts} tries")


def totals(store):
    """(completions by finish_reason, malformed) over every shard the store holds."""
    by_reason: dict[str | None, int] = {}
    for r in store.length_counts():
        by_reason[r["finish_reason"]] = by_reason.get(r["finish_reason"], 0) + r["count"]
    return by_reason, sum(s["malformed"] for s in store.shards())


def local_node(shard_glob, name="n1", **kw):
    return NodeConfig(
        name=name, host="local", shards=[shard_glob], python=sys.executable, gpu="off", command_timeout_s=20.0, **kw
    )


def poll_until_indexed(collector):
    for _ in range(50):
        collector.poll_once()
        if not collector.store.nodes()[0]["pending_bytes"]:
            return
    raise AssertionError("still pending after 50 polls")


@pytest.fixture
def collect(tmp_path):
    """Factory: collect(folder=tmp_path, node=None) -> a Collector of one node reading
    folder/*.jsonl into folder/store.sqlite3 (`node`: a NodeConfig whose shards are set here)."""
    made = []

    def make(folder=tmp_path, node=None):
        glob = str(folder / "*.jsonl")
        node = local_node(glob) if node is None else dataclasses.replace(node, shards=[glob])
        store = Store(folder / "store.sqlite3")
        made.append((Collector(RunConfig(name="t", nodes=[node], interval_s=1.0), store), store))
        return made[-1][0]

    yield make
    for collector, store in made:
        collector.stop()
        store.close()


@pytest.mark.parametrize("how", ["rm", "truncate"])
def test_a_relaunch_rewriting_the_shard_under_the_same_inode_is_recounted(tmp_path, collect, how):
    collector, shard = relaunch(tmp_path, collect, how)
    poll_until_indexed(collector)
    # Before: {"stop": 1000, "length": 512} and 1 malformed (old counts + the new file read
    # from the old offset, mid-line).
    assert totals(collector.store) == ({"length": 1500}, 0)
    (row,) = collector.store.shards()
    assert (row["inode"], row["completions"], row["offset"]) == (shard.stat().st_ino, 1500, shard.stat().st_size)
    assert row["resets"] == 1 and row["replaced_unix"] is not None
    collector.poll_once()  # and the next poll continues the new file: no reset storm
    assert collector.store.shards()[0]["resets"] == 1 and totals(collector.store) == ({"length": 1500}, 0)
    assert metrics_completions(collector.store) == 1500  # /metrics reads the same totals


def metrics_completions(store):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from runhealth.alerting import exporter

    text = generate_latest(exporter.registry_for(store)).decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "runhealth_completions_total"
    )


def test_a_live_rewrite_with_longer_lines_between_polls_is_exact(tmp_path, collect):
    """The writer truncates and rewrites with longer lines while the collector keeps polling."""
    shard = tmp_path / "out.jsonl"
    shard.write_text(text(OLD))
    collector = collect()
    poll_until_indexed(collector)
    inode = shard.stat().st_ino
    longer = [(4000 + i % 96, "length") for i in range(1200)]
    counted_to = collector.store.shards()[0]["offset"]
    with open(shard, "w", encoding="utf-8") as f:  # truncates: the same inode
        f.write(text(longer[:800], pad=120))  # past the counted offset before the next poll
        f.flush()
        assert shard.stat().st_size > counted_to
        for i in range(800, 1200, 100):
            collector.poll_once()
            f.write(text(longer[i : i + 100], pad=120))
            f.flush()
    assert shard.stat().st_ino == inode
    poll_until_indexed(collector)
    # Before: 1,280 completions (1,000 old stops kept, the new file read from the old offset).
    assert totals(collector.store) == ({"length": 1200}, 0)
    assert sum(r["count"] for r in collector.store.length_counts()) == 1200


def test_a_rewrite_racing_the_polls_never_doubles(tmp_path, collect):
    """A writer thread rewrites the shard (truncate, then line by line) with no pause for the
    polls: whatever poll sees whatever moment, the counts end exact."""
    import threading

    shard = tmp_path / "out.jsonl"
    shard.write_text(text(OLD))
    collector = collect()
    poll_until_indexed(collector)
    longer = [(3000 + i % 7, "length") for i in range(1200)]

    started = threading.Event()

    def writer():
        with open(shard, "w", encoding="utf-8") as f:
            f.write(text(longer[:800], pad=200))  # past the counted offset at once, then line by line
            f.flush()
            started.set()
            for i in range(800, 1200, 10):
                f.write(text(longer[i : i + 10], pad=200))
                f.flush()
                time.sleep(0.001)

    t = threading.Thread(target=writer)
    t.start()
    started.wait(10)
    while t.is_alive():
        collector.poll_once()
    t.join()
    poll_until_indexed(collector)
    collector.poll_once()
    assert totals(collector.store) == ({"length": 1200}, 0)


def test_through_a_real_sshd_node(tmp_path, collect, sshd_node):
    node = sshd_node("127.0.0.29").node_config(name="n1", gpu="off")
    collector, _ = relaunch(tmp_path, collect, "rm", node)
    poll_until_indexed(collector)
    assert totals(collector.store) == ({"length": 1500}, 0)


def test_an_upgraded_store_without_marks_is_trusted_not_reset(tmp_path, collect):
    """A store from before content marks holds none: its shards continue (inode + size, as
    before), no reset storm; the first poll stores a mark, so later rewrites are caught."""
    shard = tmp_path / "out.jsonl"
    shard.write_text(text(OLD))
    collector = collect()
    poll_until_indexed(collector)
    with collector.store.transaction() as db:
        db.execute("UPDATE shards SET mark = NULL")  # what migration 5 leaves in an old store
    with open(shard, "a", encoding="utf-8") as f:
        f.write(text(OLD[:10]))
    collector.poll_once()
    (row,) = collector.store.shards()
    assert row["resets"] == 0 and row["completions"] == 1010 and row["mark"]
    assert rewrite(shard, text(NEW), "truncate")
    poll_until_indexed(collector)
    assert totals(collector.store) == ({"length": 1500}, 0)


# ---------------------------------------------------------------------------- the Nodes page
def _app_script(start: str) -> None:
    import app  # the repository's router, as `streamlit run app.py` runs it

    app.main(start)


def test_the_nodes_page_says_the_shard_was_replaced(tmp_path, collect, monkeypatch):
    import store_fixtures
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from components import loaders, tables

    collector, shard = relaunch(tmp_path, collect, "truncate", local_node("", name="node-1"))
    poll_until_indexed(collector)
    collector.stop()
    replaced_at = collector.store.shards()[0]["replaced_unix"]
    # The loader and the notice, as pure functions ...
    frame = loaders.load_shards.__wrapped__(collector.store)
    assert list(frame["replaced_unix"]) == [replaced_at]
    notice = tables.replaced_notice("node-1", frame, replaced_at + 120)
    assert notice == (
        "node-1: 1 shard(s) replaced (content changed under the same inode), old counts dropped and "
        f"recounted from byte 0: {shard} at {time.strftime('%H:%M:%S', time.localtime(replaced_at))} (2 min ago)."
    )
    assert tables.replaced_notice("node-1", frame, replaced_at + tables.REPLACED_NOTICE_S + 1) is None
    # ... and on the page, the table included.
    st.cache_data.clear()  # AppTest shares this process's caches (streamlit #9139)
    config = store_fixtures.write_config(tmp_path, shard.parent / "store.sqlite3", nodes=1)
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = AppTest.from_function(_app_script, args=("nodes",), default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    warned = [w.value.replace("\\", "") for w in at.warning if "replaced" in w.value]
    assert len(warned) == 1 and "node-1: 1 shard(s) replaced (content changed under the same inode)" in warned[0]
    assert str(shard) in warned[0] and "recounted from byte 0" in warned[0], warned
    table = next(df.value for df in at.dataframe if "path" in df.value.columns)
    assert table["replaced (recounted)"].str.contains("ago").tolist() == [True]


# ---------------------------------------------------------------------------- the agent alone
def poll(path, state=None):
    req = {"op": "poll", "shards": {"globs": [str(path)], "state": state or {}}, "gpu": "off"}
    reply = agent.handle(req)
    assert reply["ok"], reply
    return reply["shards"]["files"][str(path)]


def cursor(entry, before=None):
    """The next poll's cursor, as the store keeps it (an entry without a mark keeps the last)."""
    return {"inode": entry["inode"], "offset": entry["offset"], "mark": entry.get("mark", (before or {}).get("mark"))}


def test_the_agent_reports_a_replaced_file_as_a_reset_from_byte_0(tmp_path):
    shard = tmp_path / "out.jsonl"
    shard.write_text(text(OLD))
    first = poll(shard)
    assert first["mark"] and not first["reset"]
    assert rewrite(shard, text(NEW), "truncate")
    entry = poll(shard, {str(shard): cursor(first)})
    assert (entry["reset"], entry["replaced"], entry["offset_from"], entry["lines"]) == (True, True, 0, 1500)
    assert set(entry) <= wire.ShardEntry.__optional_keys__ | wire.ShardEntry.__required_keys__  # declared
    assert {tuple(r[:2]): r[3] for r in entry["counts"]} == {(4096, "length"): 1500}
    again = poll(shard, {str(shard): cursor(entry)})  # the new content's own mark holds
    assert (again["reset"], again["lines"], "mark" in again) == (False, 0, False)  # unchanged: not sent


def test_a_same_size_rewrite_is_caught_and_an_append_is_not(tmp_path):
    shard = tmp_path / "out.jsonl"
    shard.write_text(text(OLD))
    first = poll(shard)
    with open(shard, "a", encoding="utf-8") as f:  # growth: the counted bytes are untouched
        f.write(text(OLD[:5]))
    grown = poll(shard, {str(shard): cursor(first)})
    assert (grown["reset"], grown["lines"]) == (False, 5)
    data = shard.read_bytes()
    assert rewrite(shard, data.replace(b'"stop"', b'"STOP"').decode(), "truncate")  # same size, new content
    assert len(shard.read_bytes()) == len(data)
    entry = poll(shard, {str(shard): cursor(grown)})
    assert (entry["reset"], entry["replaced"], entry["lines"]) == (True, True, 1005)


def test_a_sample_after_the_replacement_draws_the_new_lines(tmp_path):
    """The sampling index (line starts) of the old content is not reused for the new."""
    shard = tmp_path / "out.jsonl"
    shard.write_text(text(OLD, pad=10))
    first = poll(shard)
    before = agent.handle({"op": "sample", "globs": [str(shard)], "n": 20, "seed": 1})
    assert {s["finish_reason"] for s in before["samples"]} == {"stop"}
    assert rewrite(shard, text(NEW, pad=77), "truncate")
    after = agent.handle({"op": "sample", "globs": [str(shard)], "n": 50, "seed": 2})
    # Before: old line starts into the new bytes (malformed draws), a population of 1,000.
    assert after["population"] == 1500
    assert [s["error"] for s in after["samples"] if s["error"]] == []
    assert {s["finish_reason"] for s in after["samples"]} == {"length"}
    poll(shard, {str(shard): cursor(first)})  # the poll sees the replacement too
    again = agent.handle({"op": "sample", "globs": [str(shard)], "n": 50, "seed": 3})
    assert again["population"] == 1500 and {s["finish_reason"] for s in again["samples"]} == {"length"}


def test_a_replaced_shard_scanned_by_worker_processes_is_a_reset_too(tmp_path, monkeypatch):
    """A backlog goes to forked workers (backfill.py), which merge their pieces into an entry
    that knows nothing of marks: the replacement still reaches the reply."""
    from runhealth.node import backfill

    monkeypatch.setattr(backfill, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(backfill, "PIECE_MIN_BYTES", 1)
    shard = tmp_path / "out.jsonl"
    shard.write_text(text(OLD))
    req = {"globs": [str(shard)], "scan_workers": 2}
    first = agent.handle({"op": "poll", "gpu": "off", "shards": req})["shards"]["files"][str(shard)]
    assert backfill.LAST_RUN["workers"] == 2 and first["lines"] == 1000
    assert rewrite(shard, text(NEW), "truncate")
    reply = agent.handle({"op": "poll", "gpu": "off", "shards": {**req, "state": {str(shard): cursor(first)}}})
    entry = reply["shards"]["files"][str(shard)]
    assert backfill.LAST_RUN["workers"] == 2 and reply["shards"]["scan_workers"] == 2
    assert (entry["reset"], entry["replaced"], entry["offset_from"], entry["offset"]) == (
        True,
        True,
        0,
        shard.stat().st_size,
    )
    assert {tuple(r[:2]): r[3] for r in entry["counts"]} == {(4096, "length"): 1500} and entry["malformed"] == 0
