"""The poll budget and schedule on real layouts: many small shards, live shards beside finished
ones, a stalled unterminated tail, deep `**` globs (issue 29 items 1, 3 and 9).

The collector tests run real agents (LocalTransport: the agent as a subprocess) and count the
polls the store recorded; the glob tests run the agent's poll op in-process on a real tree."""

import os
import sys
import threading
import time

from shardgen import chat_line, truth_rows, write_shard

from runhealth.collect.collector import Collector
from runhealth.node import agent
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store


def local_node(shard_glob, timeout_s=20.0):
    return NodeConfig(
        name="n1", host="local", shards=[shard_glob], python=sys.executable, gpu="off", command_timeout_s=timeout_s
    )


def lines_counted(store):
    return sum(r["completions"] for r in store.nodes())


def steady_polls(tmp_path, shard_glob, live, warm_lines, window_s=4.0):
    """Polls recorded in `window_s` of steady state (interval 1 s) while each `live` shard gets
    a line every 0.01 s; the polls of the first index and its catch-up are left out."""
    store = Store(tmp_path / "store.sqlite3")
    stop = threading.Event()

    def write():
        while not stop.is_set():
            for p in live:
                write_shard(p, [(7, "stop")], mode="a")
            stop.wait(0.01)

    writer = threading.Thread(target=write, daemon=True)
    collector = Collector(RunConfig(name="t", nodes=[local_node(shard_glob)], interval_s=1.0), store)
    writer.start()
    collector.start()
    try:
        deadline = time.monotonic() + 30
        while lines_counted(store) < warm_lines and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.5)  # past the first index
        since = time.time()
        time.sleep(window_s)
        return [p for p in store.polls(node="n1") if p["ts_unix"] >= since], store
    finally:
        collector.stop()
        stop.set()
        writer.join()


def test_two_thousand_small_shards_are_counted_in_a_few_polls(tmp_path):
    """2,000 shards x 10 lines share one poll's byte budget. Before: each shard with new data
    took a 1 MB slot of the budget, and the budget (speed measured over glob + stat time too)
    fell to its 1 MB floor: one shard per poll, hundreds of polls."""
    (tmp_path / "d").mkdir()
    rows = truth_rows(20_000, 5)
    for k in range(2000):
        write_shard(tmp_path / "d" / f"s{k:04d}.jsonl", rows[k * 10 : (k + 1) * 10])
    store = Store(tmp_path / "store.sqlite3")
    with Collector(RunConfig(name="t", nodes=[local_node(str(tmp_path / "d" / "*.jsonl"))]), store) as collector:
        collector.poll_once()
    assert lines_counted(store) == 20_000
    assert sum(r["count"] for r in store.length_counts() if r["finish_reason"] == "length") == sum(
        1 for t, f in rows if f == "length"
    )
    assert len(store.polls(node="n1")) <= 3


def test_finished_and_live_shards_give_one_poll_per_interval(tmp_path):
    """300 finished shards + 8 live ones: one poll per interval, none marked backfill (so tok/s
    and the ETA have their polls). Before: ~47 polls per interval, every one backfill."""
    (tmp_path / "d").mkdir()
    for k in range(300):
        write_shard(tmp_path / "d" / f"done{k:03d}.jsonl", truth_rows(10, k))
    live = [tmp_path / "d" / f"live{k}.jsonl" for k in range(8)]
    for p in live:
        write_shard(p, [(5, "stop")])
    polls, _ = steady_polls(tmp_path, str(tmp_path / "d" / "*.jsonl"), live, 3008)
    assert 3 <= len(polls) <= 5, len(polls)
    assert not any(p["backfill"] for p in polls)
    assert sum(p["completions"] for p in polls) > 0


def test_a_stalled_unterminated_tail_adds_no_polls(tmp_path):
    """A 58-byte last line with no newline that never grows is no work left: one poll per
    interval, not backfill. Before: ~600 polls per interval, every one backfill."""
    (tmp_path / "d").mkdir()
    stalled, live = tmp_path / "d" / "stalled.jsonl", tmp_path / "d" / "live.jsonl"
    write_shard(stalled, truth_rows(20, 1))
    with open(stalled, "a") as f:
        f.write(chat_line(99, "stop")[:58])  # the writer crashed mid-line
    write_shard(live, [(5, "stop")])
    polls, store = steady_polls(tmp_path, str(tmp_path / "d" / "*.jsonl"), [live], 21)
    assert 3 <= len(polls) <= 5, len(polls)
    assert not any(p["backfill"] for p in polls)
    shard = next(s for s in store.shards() if s["path"].endswith("stalled.jsonl"))
    assert shard["offset"] == os.path.getsize(stalled) - 58  # the tail stays for its writer


def tree(root, folders=12, files=3):
    """root/a{i}/b/s{j}.jsonl, every folder's mtime set 10 s back (not "racy": its listing
    may be kept)."""
    past = time.time() - 10
    for i in range(folders):
        leaf = root / f"a{i:02d}" / "b"
        leaf.mkdir(parents=True)
        for j in range(files):
            write_shard(leaf / f"s{j}.jsonl", truth_rows(4, i * files + j))
    for folder, _, _ in os.walk(root):
        os.utime(folder, (past, past))


def poll_glob(pattern, state, budget_s=None):
    reply = agent.handle(
        {"op": "poll", "gpu": "off", "shards": {"globs": [pattern], "state": state, "budget_s": budget_s}}
    )
    assert reply["ok"], reply
    for path, e in reply["shards"]["files"].items():
        state[path] = {"inode": e["inode"], "offset": e["offset"]}
    return reply["shards"]


def test_a_deep_glob_lists_only_folders_that_changed(tmp_path, monkeypatch):
    """`**` remembers each folder's listing and mtime: a tree that did not change is not listed
    again, and a file added lists its folder only. Before: every folder, every poll."""
    tree(tmp_path / "run")
    listed = []
    real_scandir = os.scandir
    monkeypatch.setattr(agent.os, "scandir", lambda p=".": listed.append(p) or real_scandir(p))
    pattern, state = str(tmp_path / "run" / "**" / "*.jsonl"), {}
    first = poll_glob(pattern, state)
    assert first["matched"] == 36 and len(listed) == 25  # run, 12 a*, 12 b
    listed.clear()
    again = poll_glob(pattern, state)
    assert again["matched"] == 36 and listed == []
    write_shard(tmp_path / "run" / "a03" / "b" / "new.jsonl", truth_rows(4, 99))
    grown = poll_glob(pattern, state)
    assert grown["matched"] == 37 and listed == [str(tmp_path / "run" / "a03" / "b")]
    assert sum(e["lines"] for e in grown["files"].values()) == 4


def test_a_deep_walk_past_the_time_budget_names_the_glob_and_resumes(tmp_path):
    """A walk that does not fit the poll's time budget stops there, says which glob, does not
    call it unmatched, and goes on next poll from what it listed. Before: the walk ran outside
    the budget, however long it took."""
    tree(tmp_path / "run")
    pattern, state = str(tmp_path / "run" / "**" / "*.jsonl"), {}
    first = poll_glob(pattern, state, budget_s=1e-6)
    assert pattern in first["slow_globs"] and pattern in first["slow_globs"][pattern]
    assert first["matched"] < 36 and first["unmatched_globs"] == []
    for _ in range(30):
        if not poll_glob(pattern, state, budget_s=1e-6)["slow_globs"]:
            break
    done = poll_glob(pattern, state)
    assert done["matched"] == 36 and done["slow_globs"] == {}
    assert sum(s["offset"] for s in state.values()) == sum(os.path.getsize(p) for p in state)
