"""`runhealth collect` follows its config without restarting what did not change (issue 29 item 7).

Real collector processes over local shards, a real webhook receiver on loopback. Config
management touching or rewriting the file with the same runs used to stop and start every
collector: new agent processes, and every active alert announced again as a new "start" with a
new `since`. Now the same runs are a no-op (the same agent processes go on), an edit restarts
only the run it changes, and a restarted process does not announce an alert that still holds
(its state lives in the store). Agents are told apart by the python they were started with (a
symlink per run), read from /proc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from shardgen import truth_rows, write_shard
from test_packaging import CollectProcess, start_collect, stored_count, wait_for_count
from test_service import rewrite

from runhealth.store import Store
from tests.test_webhooks import Receiver

SAME_RUNS = "config file rewritten with the same runs: nothing restarted"
RESTARTED_B = "config changed: restarted b (changed); 1 unchanged run(s) went on"


def _run(tmp_path: Path, name: str, interval_s: float = 1, down_node: bool = False) -> str:
    """One run over its own shard folder and store, its agent started through its own python."""
    folder, python = tmp_path / name, tmp_path / f"python-{name}"
    if not folder.exists():
        folder.mkdir()
        write_shard(folder / "s.jsonl", truth_rows(40, 3))
        python.symlink_to(sys.executable)
    text = (
        f'[[runs]]\nname = "{name}"\ninterval_s = {interval_s}\nstore_path = "{tmp_path / name}.sqlite3"\n'
        f'[[runs.nodes]]\nname = "local"\nhost = "local"\nshards = ["{folder}/*.jsonl"]\npython = "{python}"\n'
        'gpu = "off"\n'
    )
    if down_node:  # nothing listens on port 1: node_down holds from the first poll on
        text += '[[runs.nodes]]\nname = "down"\nhost = "127.0.0.1"\nport = 1\nshards = ["/x/*.jsonl"]\nconnect_timeout_s = 2\n'
    return text + "\n"


def _start(config: Path, receiver: Receiver | None = None) -> CollectProcess:
    return start_collect(config, {"RUNHEALTH_WEBHOOK_URLS": receiver.url()} if receiver is not None else None)


def agents(pid: int) -> dict[int, str]:
    """The collector's agent processes: pid -> the python they run (argv[0]). Descendants, not
    only children: with several runs each run has a collector process of its own (issue 42)."""
    parents, argv0s = {}, {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv0s[int(entry)] = f.read().split(b"\0")[0].decode()
        except (OSError, ValueError, IndexError):
            continue

    def under(p: int) -> bool:
        while p > 1:
            p = parents.get(p, 0)
            if p == pid:
                return True
        return False

    return {p: Path(a).name for p, a in argv0s.items() if "python-" in a and under(p)}


def starts(receiver: Receiver) -> list[dict]:
    """The "start" messages received (node_down's; the run's truncation_high also holds)."""
    return [p for p in receiver.posts if p["alert"] == "node_down" and not p["resolved"] and not p["repeat"]]


def announced_twice(receiver: Receiver) -> list[tuple]:
    """Alerts whose "start" came more than once."""
    keys = [(p["alert"], p["node"]) for p in receiver.posts if not p["resolved"] and not p["repeat"]]
    return sorted({k for k in keys if keys.count(k) > 1})


def wait_for(cond, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cond()


def wait_for_evaluations(store_path: Path, n: int, timeout_s: float = 30) -> None:
    """Until the collector has evaluated the alerts `n` more times: each evaluation while an
    alert holds stores a new `last_seen_unix` (an event to wait on, not a guess at how long n take)."""
    store = Store(store_path)

    def last_seen() -> float | None:
        return store.query("SELECT MAX(last_seen_unix) AS t FROM alert_state")[0]["t"]

    try:
        before, seen = last_seen(), set()

        def enough() -> bool:
            t = last_seen()
            if t is not None and (before is None or t > before):
                seen.add(t)
            return len(seen) >= n

        wait_for(enough, timeout_s)
    finally:
        store.close()


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_touching_or_rewriting_the_same_config_restarts_nothing_and_sends_nothing_again(tmp_path):
    receiver = Receiver(200)
    config = tmp_path / "runhealth.toml"
    text = _run(tmp_path, "a", down_node=True)
    config.write_text(text, encoding="utf-8")
    proc = _start(config, receiver)
    try:
        wait_for_count(proc, tmp_path / "a.sqlite3", 40)
        wait_for(lambda: len(starts(receiver)) == 1)
        before = agents(proc.pid)
        assert sorted(before.values()) == ["python-a"], before
        rewrites = (text, text, "# managed by config management\n" + text)  # touch, same bytes, a comment
        for i, new_text in enumerate(rewrites, start=1):
            rewrite(config, new_text)
            proc.wait_for_log(SAME_RUNS, count=i)  # this rewrite was read (and restarted nothing)
        write_shard(tmp_path / "a" / "s.jsonl", truth_rows(5, 8), mode="a")
        wait_for_count(proc, tmp_path / "a.sqlite3", 45)
        wait_for_evaluations(tmp_path / "a.sqlite3", 2)  # two alert evaluations after the last rewrite
        after = agents(proc.pid)
        err = stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.close()
    assert after == before  # the same agent process: no reconnect, no restart
    assert len(starts(receiver)) == 1 and not announced_twice(receiver), receiver.posts  # once, not per touch
    assert err.count("collecting 2 node(s) of a") == 1  # started once
    assert err.count(SAME_RUNS) == 3, err


def test_an_edit_to_one_run_restarts_only_that_run(tmp_path):
    config = tmp_path / "runhealth.toml"
    config.write_text(_run(tmp_path, "a") + _run(tmp_path, "b"), encoding="utf-8")
    proc = _start(config)
    try:
        wait_for_count(proc, tmp_path / "a.sqlite3", 40)
        wait_for_count(proc, tmp_path / "b.sqlite3", 40)
        wait_for(lambda: len(agents(proc.pid)) == 2)
        before = {name: pid for pid, name in agents(proc.pid).items()}
        rewrite(config, _run(tmp_path, "a") + _run(tmp_path, "b", interval_s=0.5))
        wait_for(lambda: before["python-b"] not in agents(proc.pid) and len(agents(proc.pid)) == 2)
        write_shard(tmp_path / "b" / "s.jsonl", truth_rows(5, 8), mode="a")
        wait_for_count(proc, tmp_path / "b.sqlite3", 45)  # run b collects again, at its new interval
        proc.wait_for_log(RESTARTED_B)  # the edit's whole restart is done: a restart of run a would be too
        after = {name: pid for pid, name in agents(proc.pid).items()}
        err = stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert after["python-a"] == before["python-a"]  # run a untouched: its agent goes on
    assert after["python-b"] != before["python-b"]  # run b restarted with its new settings
    assert RESTARTED_B in err, err
    assert stored_count(tmp_path / "a.sqlite3") == 40 and stored_count(tmp_path / "b.sqlite3") == 45


def test_a_restarted_collector_does_not_announce_an_alert_that_still_holds(tmp_path):
    receiver = Receiver(200)
    config = tmp_path / "runhealth.toml"
    config.write_text(_run(tmp_path, "a", down_node=True), encoding="utf-8")
    store = tmp_path / "a.sqlite3"
    try:
        proc = _start(config, receiver)
        wait_for_count(proc, store, 40)
        wait_for(lambda: len(starts(receiver)) == 1)
        stop(proc)
        proc = _start(config, receiver)  # a new process, the same store
        write_shard(tmp_path / "a" / "s.jsonl", truth_rows(5, 8), mode="a")
        wait_for_count(proc, store, 45)
        wait_for_evaluations(store, 3)  # three alert evaluations of the new process
        stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.close()
    sent = starts(receiver)
    assert len(sent) == 1, sent  # not announced again by the new process
    assert not announced_twice(receiver), receiver.posts
    key = '["node_down", "down", null]'  # the alert's key as stored (JSON)
    held = Store(store).query("SELECT since_unix FROM alert_state WHERE key = ?", (key,))
    assert [r["since_unix"] for r in held] == [sent[0]["since"]]  # it still started when it did


def _store_with_old_rows(path: Path, housekept_s_ago: float) -> float:
    """A store holding poll rows just past the 24 h raw window (the fold walks the time between
    the oldest row and the cutoff: a short walk) and a housekeeping time `housekept_s_ago`."""
    now = time.time()
    store = Store(path)
    with store.transaction() as db:
        db.executemany(
            "INSERT INTO polls (ts_unix, node, completions, tokens, length_stops, malformed, backfill)"
            " VALUES (?, 'local', 1, 10, 0, 0, 0)",
            [(now - 86400 - 1800 + i,) for i in range(0, 600, 10)],
        )
    store.set_meta("housekeeping", {"last_unix": now - housekept_s_ago})
    store.close()
    return now - 86400


def _old_raw_rows(path: Path, before_unix: float) -> int:
    store = Store(path)
    try:
        return store.query("SELECT COUNT(*) AS n FROM polls WHERE ts_unix < ?", (before_unix,))[0]["n"]
    finally:
        store.close()


def test_housekeeping_follows_the_stores_last_run_not_the_collectors_age(tmp_path):
    """A store last pruned two hours ago is pruned by a collector seconds old (one restarted by
    every config rewrite never got there); one pruned ten minutes ago is left for 50 more."""
    (tmp_path / "due").mkdir(), (tmp_path / "young").mkdir()
    procs, cutoffs = {}, {}
    for name, ago_s in (("due", 7200.0), ("young", 600.0)):
        config = tmp_path / name / "runhealth.toml"
        config.write_text(_run(tmp_path / name, "a"), encoding="utf-8")
        cutoffs[name] = _store_with_old_rows(tmp_path / name / "a.sqlite3", ago_s)
        procs[name] = _start(config)
    try:
        for name, proc in procs.items():
            wait_for_count(proc, tmp_path / name / "a.sqlite3", 40)
        due = tmp_path / "due" / "a.sqlite3"
        wait_for(lambda: _old_raw_rows(due, cutoffs["due"]) == 0, timeout_s=10)
        time.sleep(1)
        young = _old_raw_rows(tmp_path / "young" / "a.sqlite3", cutoffs["young"])
    finally:
        for proc in procs.values():
            stop(proc)
    assert young == 60  # not due: untouched
    store = Store(due)
    try:
        assert time.time() - store.meta("housekeeping")["last_unix"] < 30  # the new run time, recorded
        assert store.query("SELECT SUM(completions) AS n FROM poll_rollup")[0]["n"] == 60  # folded, not lost
    finally:
        store.close()


def test_an_edit_onto_a_busy_store_keeps_the_run_as_it_was_then_takes_over(tmp_path):
    """Run b edited onto a store another process collects into: refused before anything stops
    (run b's agent goes on, not restarted on every retry), then taken over once that one stops."""
    (tmp_path / "other").mkdir()
    other = tmp_path / "other" / "runhealth.toml"
    other.write_text(_run(tmp_path / "other", "b"), encoding="utf-8")
    config = tmp_path / "runhealth.toml"
    config.write_text(_run(tmp_path, "a") + _run(tmp_path, "b"), encoding="utf-8")
    holder, proc = _start(other), _start(config)
    try:
        wait_for_count(holder, tmp_path / "other" / "b.sqlite3", 40)
        wait_for_count(proc, tmp_path / "b.sqlite3", 40)
        wait_for(lambda: len(agents(proc.pid)) == 2)
        before = agents(proc.pid)
        rewrite(
            config,
            _run(tmp_path, "a")
            + _run(tmp_path, "b").replace(str(tmp_path / "b.sqlite3"), str(tmp_path / "other" / "b.sqlite3")),
        )
        time.sleep(3)  # six reload checks, three lock retries
        during = agents(proc.pid)
        stop(holder)
        wait_for(lambda: before.keys() - agents(proc.pid).keys() != set())  # run b restarted onto the free store
        err = stop(proc)
    finally:
        for p in (holder, proc):
            if p.poll() is None:
                p.kill()
    assert during == before, (during, before)
    assert "still collecting with the previous one" in err and "the store is free again" in err, err
