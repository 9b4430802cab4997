"""The fault suite: real sshd processes and real files, broken on purpose mid-run.

A run-health screen is looked at when something has gone wrong, so each scenario here is one
that happens on real fleets. Counts are always checked against the ground truth written.
"""

import dataclasses
import os
import signal
import socket
import sys
import threading
import time

import pytest
import sshd as sshd_lib
from shardgen import chat_line, truth_rows, write_shard

from runhealth.collect.collector import Collector
from runhealth.settings.config import RunConfig
from runhealth.store import Store

pytestmark = pytest.mark.faults


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (sshd forks one child per connection)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    stack, victims = [pid], []
    while stack:
        p = stack.pop()
        victims.append(p)
        stack.extend(children.get(p, []))
    for p in victims:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(predicate, timeout_s=30.0, step_s=0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return False


def run_totals(store: Store) -> dict[tuple, int]:
    return {(r["node"], r["tokens"], r["finish_reason"]): r["count"] for r in store.length_counts(by="node")}


def expected_totals(rows_by_node: dict[str, list]) -> dict[tuple, int]:
    out: dict[tuple, int] = {}
    for node, rows in rows_by_node.items():
        for t, f in rows:
            out[(node, t, f)] = out.get((node, t, f), 0) + 1
    return out


@pytest.fixture
def fleet(tmp_path, sshd_node):
    """Three sshd nodes on 127.0.0.21-23, each with its own shard folder."""
    nodes, rows = [], {}
    for i in (21, 22, 23):
        folder = tmp_path / f"node{i}"
        folder.mkdir()
        name = f"node-{i}"
        rows[name] = truth_rows(300, i)
        write_shard(folder / "out.jsonl", rows[name])
        server = sshd_node(f"127.0.0.{i}")
        nodes.append(
            (
                server,
                server.node_config(
                    name=name, shards=[str(folder / "*.jsonl")], gpu="off", connect_timeout_s=2.0, command_timeout_s=5.0
                ),
            )
        )
    config = RunConfig(name="faults", nodes=[cfg for _, cfg in nodes], interval_s=0.5)
    store = Store(tmp_path / "store.sqlite3")
    return tmp_path, nodes, rows, config, store


def test_sshd_killed_mid_run_then_back_loses_and_doubles_nothing(fleet, ssh_dir):
    tmp, nodes, rows, config, store = fleet
    collector = Collector(config, store)
    collector.start()
    try:
        assert wait_for(lambda: run_totals(store) == expected_totals(rows)), "first full index"
        victim, victim_cfg = nodes[1]
        kill_tree(victim.sshd.proc.pid)
        victim.sshd.proc.wait()
        # While it is down the others keep updating; the victim records a plain error.
        more = {name: truth_rows(40, 100 + k) for k, name in enumerate(rows)}
        for (_server, cfg), name in zip(nodes, rows, strict=True):
            write_shard(tmp / f"node{cfg.host.rsplit('.', 1)[1]}" / "out.jsonl", more[name], mode="a")
        for name in rows:
            if name != victim_cfg.name:
                rows[name] += more[name]
        assert wait_for(
            lambda: (
                {k: v for k, v in run_totals(store).items() if k[0] != victim_cfg.name}
                == {k: v for k, v in expected_totals(rows).items() if k[0] != victim_cfg.name}
            )
        )
        status = {n["name"]: n for n in store.nodes()}[victim_cfg.name]
        assert wait_for(lambda: {n["name"]: n for n in store.nodes()}[victim_cfg.name]["last_error"])
        status = {n["name"]: n for n in store.nodes()}[victim_cfg.name]
        assert status["failing_since_unix"] is not None
        # The node comes back on the same address with the same host key.
        # Replaces the killed one in the fixture's list, so session teardown stops it too.
        victim.sshd = sshd_lib.Sshd(
            victim.ip, victim.host_key, ssh_dir / "authorized_keys", ssh_dir, port=victim.port
        ).start()
        rows[victim_cfg.name] += more[victim_cfg.name]
        collector.request_refresh()
        assert wait_for(lambda: run_totals(store) == expected_totals(rows), timeout_s=40)
        status = {n["name"]: n for n in store.nodes()}[victim_cfg.name]
        assert status["failing_since_unix"] is None
    finally:
        collector.stop()


def test_a_node_that_never_answers_does_not_delay_the_others(fleet):
    tmp, nodes, rows, config, store = fleet
    listener = socket.socket()
    listener.bind(("127.0.0.24", 0))
    listener.listen(8)
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    stalled = dataclasses.replace(
        nodes[0][1], name="stalled", host="127.0.0.24", port=listener.getsockname()[1], connect_timeout_s=8.0
    )
    config.nodes.append(stalled)
    collector = Collector(config, store)
    collector.start()
    try:
        started = time.monotonic()
        assert wait_for(lambda: run_totals(store) == expected_totals(rows), timeout_s=20)
        # The healthy nodes were fully counted well before the stalled one's 8 s timeout.
        assert time.monotonic() - started < 6.0
        assert wait_for(lambda: {n["name"]: n for n in store.nodes()}["stalled"]["last_error"], timeout_s=30)
        message = {n["name"]: n for n in store.nodes()}["stalled"]["last_error"]
        assert "banner" in message.lower() or "timed out" in message.lower() or "timeout" in message.lower()
    finally:
        collector.stop()
        listener.close()


def test_each_connection_failure_reads_differently(tmp_path, sshd_node):
    good = sshd_node("127.0.0.25")
    unknown_key = good.node_config(
        name="unknown-key",
        known_hosts=str(tmp_path / "empty_known_hosts"),
        shards=["/x/*.jsonl"],
        gpu="off",
        connect_timeout_s=3.0,
    )
    (tmp_path / "empty_known_hosts").write_text("")
    refused = good.node_config(
        name="refused",
        port=sshd_lib.free_port("127.0.0.26"),
        host="127.0.0.26",
        shards=["/x/*.jsonl"],
        gpu="off",
        connect_timeout_s=3.0,
    )
    dns = good.node_config(
        name="dns", host="no-such-host.invalid", shards=["/x/*.jsonl"], gpu="off", connect_timeout_s=3.0
    )
    other_key = sshd_lib.keygen(tmp_path / "stranger")
    auth = good.node_config(
        name="auth", identity_file=str(other_key), shards=["/x/*.jsonl"], gpu="off", connect_timeout_s=3.0
    )
    config = RunConfig(name="errors", nodes=[unknown_key, refused, dns, auth])
    store = Store(tmp_path / "s.sqlite3")
    with Collector(config, store) as collector:
        results = collector.poll_once()
    errors = {n["name"]: n["last_error"] for n in store.nodes()}
    assert all(isinstance(r, Exception) for r in results.values())
    assert "not in known_hosts" in errors["unknown-key"] or "unknown" in errors["unknown-key"].lower()
    assert "refused" in errors["refused"]
    assert "dns" in errors["dns"].lower() or "resolve" in errors["dns"].lower()
    assert "auth" in errors["auth"].lower()
    assert len(set(errors.values())) == 4


def test_thousands_of_shards_are_all_counted(tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    rows = {}
    for i in range(2000):
        rows[i] = truth_rows(2, i)
        write_shard(folder / f"shard-{i:05d}.jsonl", rows[i])
    from runhealth.cli import scan_paths  # the agent's scanner, in-process

    hist, malformed, unmatched = scan_paths([str(folder / "*.jsonl")])
    assert hist.total == 4000 and malformed == 0 and unmatched == []


def _last_ok(store: Store) -> float:
    nodes = store.nodes()
    return (nodes[0]["last_ok_unix"] or 0.0) if nodes else 0.0


def test_shards_appended_to_while_polls_run_are_counted_exactly(tmp_path):
    """A writer flushing half-lines while the collector polls: no line lost, none doubled."""
    from runhealth.settings.config import NodeConfig

    folder = tmp_path / "live"
    folder.mkdir()
    rows = truth_rows(3000, 77)
    config = RunConfig(
        name="live",
        interval_s=0.5,
        nodes=[
            NodeConfig(name="live", host="local", shards=[str(folder / "*.jsonl")], gpu="off", python=sys.executable)
        ],
    )
    store = Store(tmp_path / "s.sqlite3")
    collector = Collector(config, store)
    collector.start()
    try:
        with open(folder / "out.jsonl", "w") as f:
            for i, (tokens, finish) in enumerate(rows):
                line = chat_line(tokens, finish)
                f.write(line[: len(line) // 2])
                f.flush()  # a poll may see this half line: it must wait for the rest
                if i % 500 == 250:  # and six surely do, however slow the machine (CI at load 15 saw 2 polls)
                    before = _last_ok(store)
                    collector.request_refresh()
                    assert wait_for(lambda before=before: _last_ok(store) > before, timeout_s=30)
                f.write(line[len(line) // 2 :])
                if i % 50 == 0:
                    f.flush()
                    collector.request_refresh()
                    time.sleep(0.01)
        assert wait_for(lambda: run_totals(store) == expected_totals({"live": rows}), timeout_s=30)
        assert len(store.polls()) > 5  # the polls really did interleave with the writes
        assert store.nodes()[0]["malformed"] == 0
    finally:
        collector.stop()
