"""One bad file never silences a node (issue #23): a real agent subprocess, real files.

Each scenario puts one bad shard beside good ones on a `host = "local"` node (the agent runs as
a child process, exactly as over SSH but without sshd) and checks that the node keeps counting
everything else exactly, across polls, and that the bad file is named in the store (the Nodes
page reads it there), in the log and, for two of them, on the rendered Nodes page.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import streamlit as st
from shardgen import chat_line
from store_fixtures import write_config
from test_faults import wait_for

from components import tables
from runhealth.collect.collector import Collector
from runhealth.settings.config import NodeConfig, RunConfig
from runhealth.store import Store
from tests.test_pages import assert_clean, run_page, texts

pytestmark = pytest.mark.faults

NODE = "node-1"  # the name store_fixtures.write_config gives the first node
BOUND_BYTES = 2 << 20  # the agent's line bound for these tests (shipped: 64 MiB)


@pytest.fixture
def shared_dir():
    """A folder any user may enter (pytest's tmp_path is 0700 under root-only parents)."""
    folder = Path(tempfile.mkdtemp(prefix="rh-badfiles-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def collector_for(folder: Path, store: Store, **extra) -> Collector:
    """A collector (not started: the test polls) with one local node reading folder/*.jsonl."""
    node = NodeConfig(name=NODE, host="local", shards=[f"{folder}/*.jsonl"], gpu="off", command_timeout_s=20, **extra)
    return Collector(RunConfig(name="badfiles", nodes=[node], interval_s=1.0), store)


def good_lines(n: int, first_tokens: int) -> list[str]:
    return [chat_line(first_tokens + i, "stop") for i in range(n)]


def totals(store: Store) -> dict[tuple[int, str | None], int]:
    return {(r["tokens"], r["finish_reason"]): r["count"] for r in store.length_counts(by="node")}


def expected(lines: list[str]) -> dict[tuple[int, str | None], int]:
    out: dict[tuple[int, str | None], int] = {}
    for line in lines:
        obj = json.loads(line)
        key = (obj["usage"]["completion_tokens"], obj["choices"][0]["finish_reason"])
        out[key] = out.get(key, 0) + 1
    return out


def shard_rows(store: Store) -> dict[str, dict]:
    return {Path(r["path"]).name: dict(r) for r in store.shards(NODE)}


def proc_field(pid: int, name: str, field: str) -> int:
    """One number from /proc/<pid>/<name> (status: kB values; io: bytes)."""
    with open(f"/proc/{pid}/{name}", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/{name}")


def page_text(tmp_path: Path, store: Store, monkeypatch, page: str = "nodes") -> str:
    """A rendered page's text for this store (Streamlit's AppTest, collector off), Markdown's
    backslash escapes (a `_` in a temp folder's name) taken out."""
    st.cache_data.clear()
    st.cache_resource.clear()
    at = run_page(page, write_config(tmp_path, store.path, nodes=1), monkeypatch)
    assert_clean(at)
    return texts(at).replace("\\", "")


# ---------------------------------------------------------------------------- 1: permission denied
def unprivileged_python(folder: Path) -> str:
    """The node's python for an agent that a 0600 file of ours refuses: as root (the suites' usual
    user, whom no mode stops) a wrapper that runs it as nobody (uid/gid 65534); else our own."""
    if os.geteuid() != 0:
        return sys.executable
    wrapper = folder / "nobody-python"
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run the agent as another user"
    wrapper.write_text(f'#!/bin/sh\nexec {setpriv} --reuid=65534 --regid=65534 --clear-groups {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_shard_the_agent_may_not_read_is_named_and_the_rest_counted(shared_dir, tmp_path, monkeypatch, caplog):
    lines = good_lines(5, 10)
    (shared_dir / "good.jsonl").write_text("".join(lines))
    secret = shared_dir / "secret.jsonl"
    secret.write_text("".join(good_lines(3, 100)))
    secret.chmod(0o000 if os.geteuid() else 0o600)  # the agent's user may not read it
    store = Store(tmp_path / "store.sqlite3")
    collector = collector_for(shared_dir, store, python=unprivileged_python(shared_dir))
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                collector.pollers[NODE].poll()
        assert totals(store) == expected(lines), "the readable shard is counted, once"
        row = shard_rows(store)["secret.jsonl"]
        assert "Permission denied" in row["error"] and str(secret) in row["error"]
        assert row["offset"] == 0 and row["completions"] == 0
        assert store.nodes()[0]["last_error"] is None, "the poll itself succeeded"
        assert str(secret) in caplog.text
        assert f"cannot read {secret}: PermissionError" in page_text(tmp_path, store, monkeypatch)
        secret.chmod(0o644)  # fixed: counted from its start, nothing counted twice
        collector.pollers[NODE].poll()
        assert totals(store) == expected(lines + good_lines(3, 100))
        assert shard_rows(store)["secret.jsonl"]["error"] is None
    finally:
        collector.stop()


# ---------------------------------------------------------------------------- 2: name not UTF-8
def test_a_file_name_that_is_not_utf8_is_counted_and_named_escaped(shared_dir, tmp_path):
    lines, odd = good_lines(5, 10), good_lines(4, 200)
    (shared_dir / "good.jsonl").write_text("".join(lines))
    bad = os.fsencode(shared_dir) + b"/bad\xff.jsonl"
    with open(bad, "w", encoding="utf-8") as f:
        f.write("".join(odd[:2]))
    store = Store(tmp_path / "store.sqlite3")
    collector = collector_for(shared_dir, store)
    try:
        collector.pollers[NODE].poll()
        with open(bad, "a", encoding="utf-8") as f:  # it grows: counted from where it stopped
            f.write("".join(odd[2:]))
        collector.pollers[NODE].poll()
        collector.pollers[NODE].poll()
        assert totals(store) == expected(lines + odd), "every line once, the odd name's included"
        assert store.nodes()[0]["last_error"] is None
        row = shard_rows(store)["bad\\xff.jsonl"]  # the undecodable byte shown as \xff
        assert row["error"] is None and row["offset"] == os.path.getsize(bad)
        samples, population, errors = collector.sample_now(20, seed=1)
        assert errors == {} and population == 9 and len(samples) == 9
        assert sum(s["path"].endswith("bad\\xff.jsonl") for s in samples) == 4
    finally:
        collector.stop()


def test_a_samples_population_counts_completions_not_malformed_or_blank_lines(shared_dir, tmp_path):
    """50 completions, 3 malformed and 2 blank lines: the batch the Samples page shows says "of
    50" (main: 55, as "50 of 50,005 completions" on a 50,000-completion run)."""
    lines = good_lines(50, 10)
    junk = ['{"id": "broken", "choices": [\n', "\n", "not json\n", "   \n", '{"usage": {"completion_tokens": -4}}\n']
    (shared_dir / "mixed.jsonl").write_text("".join(lines[:20] + junk + lines[20:]))
    store = Store(tmp_path / "store.sqlite3")
    collector = collector_for(shared_dir, store)
    try:
        collector.pollers[NODE].poll()
        node = store.nodes()[0]
        assert (node["completions"], node["malformed"], node["blank_lines"]) == (50, 3, 2)
        # The node's details name what the store's `lines` counts: completions, not every line
        # (issue 31 item 4: "50 lines counted" beside "3 malformed lines" read as 53 lines).
        details = dict(tables.node_details(node, now=node["last_ok_unix"]).values.tolist())
        assert (details["completions counted"], details["malformed lines"]) == ("50", "3")
        samples, population, errors = collector.sample_now(10, seed=3)
        assert errors == {} and population == 50 and len(samples) == 10
        batch = store.new_sample_batch(10, 1.0)
        store.finish_sample_batch(batch, samples, population, errors, 2.0)
    finally:
        collector.stop()
    assert store.latest_sample_batch()["population"] == 50


# ---------------------------------------------------------------------------- 3: lone surrogates
def test_lone_surrogates_in_finish_reason_and_text_count_and_sample(shared_dir, tmp_path):
    lines = good_lines(5, 10)
    odd_reason = '{"finish_reason": "\\ud800", "completion_tokens": 7}\n'  # json.loads accepts it
    odd_text = chat_line(9, "length", text="loop \\ud83d and on").replace("\\\\ud83d", "\\ud83d")
    assert json.loads(odd_text)["choices"][0]["message"]["content"] == "loop \ud83d and on"
    (shared_dir / "out.jsonl").write_text("".join(lines) + odd_reason + odd_text)
    store = Store(tmp_path / "store.sqlite3")
    collector = collector_for(shared_dir, store)
    try:
        collector.pollers[NODE].poll()
        collector.pollers[NODE].poll()
        want = expected(lines)
        want.update({(7, "\ufffd"): 1, (9, "length"): 1})
        assert totals(store) == want
        assert store.nodes()[0]["last_error"] is None
        batch = collector.request_sample(50)
        assert wait_for(lambda: (store.latest_sample_batch() or {}).get("batch") == batch, timeout_s=20)
        done = store.latest_sample_batch()
        assert done is not None and done["errors"] == {} and len(done["samples"]) == 7
        texts_drawn = {s["text_head"] for s in done["samples"]}
        assert "loop \ufffd and on" in texts_drawn
        assert "\ufffd" in {s["finish_reason"] for s in done["samples"]}
    finally:
        collector.stop()


# ---------------------------------------------------------------------------- 14: no newline at all
# In one process, and with scan workers (a backlog of 64 MiB+ is scanned by forked workers,
# whose memory of the unfinished line must reach the agent or every poll forks and re-reads).
@pytest.mark.parametrize("workers, stuck_bytes", [(None, 4 * BOUND_BYTES), (2, 72 << 20)], ids=["agent", "workers"])
def test_a_shard_without_a_newline_is_read_once_and_named(
    shared_dir, tmp_path, monkeypatch, caplog, workers, stuck_bytes
):
    monkeypatch.setenv("RUNHEALTH_MAX_LINE_BYTES", str(BOUND_BYTES))  # the agent inherits it
    lines = good_lines(5, 10)
    (shared_dir / "good.jsonl").write_text("".join(lines))
    stuck = shared_dir / "stuck.jsonl"
    stuck.write_bytes(b'{"text": "' + b"x" * stuck_bytes)  # a writer died mid-line
    store = Store(tmp_path / "store.sqlite3")
    collector = collector_for(shared_dir, store, scan_workers=workers)
    poller = collector.pollers[NODE]
    try:
        with caplog.at_level(logging.WARNING):
            first = poller.poll()
        assert first["shards"]["scan_workers"] == (workers or 0)
        pid = poller.transport.pid
        for _ in range(3):  # later polls read only what was added, not the whole line again
            read_before = proc_field(pid, "io", "rchar")
            assert poller.poll()["shards"]["scan_workers"] == 0, "nothing left that needs workers"
            assert proc_field(pid, "io", "rchar") - read_before < BOUND_BYTES // 2
        assert totals(store) == expected(lines)
        row = shard_rows(store)["stuck.jsonl"]
        assert row["offset"] == 0 and row["size"] == stuck.stat().st_size
        assert row["error"].startswith(f"unterminated line: {stuck.stat().st_size} bytes from byte offset 0")
        assert str(stuck) in caplog.text and "unterminated" in caplog.text
        assert f"cannot read {stuck}: unterminated line" in page_text(tmp_path, store, monkeypatch)
        assert f"{NODE}: 1 shard(s) cannot be read (see Nodes)." in page_text(tmp_path, store, monkeypatch, "overview")
        more = good_lines(2, 300)
        with open(stuck, "a", encoding="utf-8") as f:  # the line ends at last: too long, skipped
            f.write('"}\n' + "".join(more))
        poller.poll()
        poller.poll()
        assert totals(store) == expected(lines + more), "counted once, nothing lost"
        row = shard_rows(store)["stuck.jsonl"]
        assert row["malformed"] == 1 and row["offset"] == stuck.stat().st_size
        assert row["error"].startswith("skipped 1 line(s) longer than the 2097152-byte line bound")
    finally:
        collector.stop()


# ---------------------------------------------------------------------------- 15: one huge line
def test_a_line_longer_than_the_bound_is_skipped_in_bounded_memory(shared_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNHEALTH_MAX_LINE_BYTES", str(BOUND_BYTES))
    lines = good_lines(3, 10)
    (shared_dir / "a.jsonl").write_text("".join(lines))
    store = Store(tmp_path / "store.sqlite3")
    collector = collector_for(shared_dir, store)
    poller = collector.pollers[NODE]
    try:
        poller.poll()
        pid = poller.transport.pid
        peak_before_kib = proc_field(pid, "status", "VmHWM")
        huge = chat_line(50, "stop", text="y" * (24 * BOUND_BYTES))  # valid JSON, 48 MiB
        after = good_lines(3, 400)
        (shared_dir / "b.jsonl").write_text("".join(good_lines(2, 500)) + huge + "".join(after))
        poller.poll_until_indexed()
        poller.poll()
        grown_mib = (proc_field(pid, "status", "VmHWM") - peak_before_kib) / 1024
        assert grown_mib < 12, f"agent peak RSS grew {grown_mib:.0f} MiB for a {len(huge) >> 20} MiB line"
        assert totals(store) == expected(lines + good_lines(2, 500) + after), "the rest counted exactly"
        row = shard_rows(store)["b.jsonl"]
        assert row["malformed"] == 1 and row["offset"] == (shared_dir / "b.jsonl").stat().st_size
        assert f"the last: {len(huge)} bytes at byte offset" in row["error"]
        samples, _, errors = collector.sample_now(50, seed=2)
        assert errors == {} and len(samples) == 9
        skipped = [s for s in samples if s["error"]]
        assert len(skipped) == 1 and "longer than the 2097152-byte line bound" in skipped[0]["error"]
        assert (proc_field(pid, "status", "VmHWM") - peak_before_kib) / 1024 < 12, "sampling it stays bounded too"
    finally:
        collector.stop()
