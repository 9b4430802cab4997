"""Only the process holding a store's collector lock writes to it (issue 29 item 8).

Real processes only. A second `runhealth collect` with another config on a running collector's
store used to write its run settings and node list before it tried the lock, then exit: the
running collector's /metrics lost its node and showed the other file's nodes down, and its
thresholds became the other file's. Now it writes nothing and exits saying who collects. A
second `runhealth dashboard` on that store is a viewer of the running collector and says so,
and its collector takes over within about one interval once the first collector stops, however
it stops (SIGTERM, or SIGKILL with no chance to clean up).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard
from test_dashboard import start_dashboard, wait_gone
from test_packaging import start_collect, stored_count, wait_for_count, wait_for_polls

from runhealth.screens import events as run_events
from runhealth.store import Store
from runhealth.store.runevents import EventRow
from tests.test_collect_outbound import _scrape
from tests.test_prometheus import _free_port


def _config(tmp_path: Path, name: str, store: Path, nodes: list[str], target: int, metrics_port: int | None) -> Path:
    """A run over tmp's shards; its first node local, any others on a port nothing answers."""
    folder = tmp_path / name
    folder.mkdir()
    text = (
        f'[run]\nname = "{name}"\nstore_path = "{store}"\ninterval_s = 1\ntarget_completions = {target}\n'
        f"truncation_alert_fraction = {0.9 if name == 'ghost' else 0.3}\n"
        + (f"metrics_port = {metrics_port}\n" if metrics_port else "")
        + f'\n[[nodes]]\nname = "{nodes[0]}"\nhost = "local"\nshards = ["{tmp_path / "*.jsonl"}"]\n'
        f'python = "{sys.executable}"\ngpu = "off"\n'
    )
    for node in nodes[1:]:
        text += f'\n[[nodes]]\nname = "{node}"\nhost = "127.0.0.1"\nport = 1\nshards = ["/x/*.jsonl"]\n'
    path = folder / "runhealth.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _what_others_see(store_path: Path, metrics_url: str) -> tuple:
    """The run settings, the node list and /metrics' per-node series of a store."""
    store = Store(store_path)
    try:
        meta = store.meta("run")
        nodes = {r["name"]: json.dumps(r["config"], sort_keys=True) for r in store.nodes()}
    finally:
        store.close()
    scraped = _scrape(metrics_url)
    per_node = sorted(k for k in scraped if dict(k[1]).get("node"))
    progress = [v for (name, _labels), v in scraped.items() if name == "runhealth_progress_ratio"]
    return meta, nodes, per_node, progress


def test_a_second_collector_with_another_config_writes_nothing_and_says_who_collects(tmp_path):
    write_shard(tmp_path / "a.jsonl", truth_rows(200, 3))
    store, port = tmp_path / "shared.sqlite3", _free_port()
    first = start_collect(_config(tmp_path, "real", store, ["node-a"], 1000, port))
    try:
        wait_for_count(first, store, 200)
        wait_for_polls(store)  # a poll after the count: every node's status settled
        before = _what_others_see(store, f"http://127.0.0.1:{port}/metrics")
        assert before[2] and before[3] == [0.2], before  # 200 of 1000
        second = subprocess.run(
            [sys.executable, "-m", "runhealth", "collect", "--config"]
            + [str(_config(tmp_path, "ghost", store, ["ghost-1", "ghost-2"], 20_000_000, None))],
            capture_output=True,
            text=True,
            timeout=60,
        )
        wait_for_polls(store)  # a poll and a scrape later: what the second one wrote would show now
        after = _what_others_see(store, f"http://127.0.0.1:{port}/metrics")
        assert first.poll() is None
    finally:
        first.terminate()
        first.communicate(timeout=30)
    assert after == before  # settings, thresholds, node list and /metrics: the first one's
    assert "ghost" not in json.dumps(after)
    assert second.returncode == 2, second.stderr
    assert f"another runhealth process is already collecting into {store} (pid {first.pid} on " in second.stderr
    assert "Traceback" not in second.stderr


def _seconds_until_counted(store: Path, want: int, timeout_s: float) -> float:
    """Seconds until the store counts `want` completions (inf past `timeout_s`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if stored_count(store) == want:
            return time.monotonic() - start
        time.sleep(0.1)
    return float("inf")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_second_dashboard_is_a_viewer_and_collects_once_the_first_collector_stops(tmp_path, sig):
    write_shard(tmp_path / "a.jsonl", truth_rows(100, 4))
    store = tmp_path / "shared.sqlite3"
    config = _config(tmp_path, "real", store, ["node-a"], 1000, None)
    first = start_collect(config)
    dashboard = start_dashboard(tmp_path, ["--config", str(config), "--port", str(_free_port())])
    log = tmp_path / "dashboard.log"
    try:
        wait_for_count(first, store, 100)
        deadline = time.monotonic() + 60
        while "runhealth dashboard on" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        said = log.read_text()
        first.send_signal(sig)
        assert wait_gone([first.pid], 20) == [] and first.wait(timeout=20) is not None
        write_shard(tmp_path / "a.jsonl", truth_rows(50, 5), mode="a")
        took_s = _seconds_until_counted(store, 150, 20)
        print(f"taken over and counted in {took_s:.2f} s")
        assert dashboard.poll() is None, log.read_text()
    finally:
        for proc in (first, dashboard):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    # One interval (1 s) to notice the lock is free, the first poll at once, an agent to start:
    # well inside 5 s. Before the fix it never collected.
    assert took_s < 5, log.read_text()
    assert "the store is free again: this process collects now" in log.read_text()
    assert "viewer of the collector that already runs on this store" in said, said
    assert f"not collecting: another runhealth process is already collecting into {store}" in said, said
    assert "collector running" not in said


# -- issue 40 item 3: one writer per store, whatever is deleted --------------------------------------
def _second_collect(config: Path, timeout_s: float = 30) -> tuple[int | None, str]:
    """Run a second `runhealth collect`; (exit code, stderr). None: still running after
    `timeout_s` (it was let in: stopped here, so the test can say so)."""
    proc = start_collect(config)
    try:
        _, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        proc.terminate()
        return None, proc.communicate(timeout=30)[1]


def _wait_until(ready, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _run_settings(store_path: Path) -> tuple:
    store = Store(store_path)
    try:
        return store.meta("run"), sorted(r["name"] for r in store.nodes())
    finally:
        store.close()


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
    return proc.communicate(timeout=30)[1]


def _lock_events(store_path: Path) -> list[dict]:
    store = Store(store_path)
    try:
        rows = store.query("SELECT detail FROM run_events WHERE kind = 'store_lock_replaced'")
    finally:
        store.close()
    return [json.loads(r["detail"]) for r in rows]


def test_a_deleted_lock_file_lets_no_second_collector_in_and_the_holder_says_so(tmp_path):
    write_shard(tmp_path / "a.jsonl", truth_rows(200, 3))
    store = tmp_path / "shared.sqlite3"
    lock = Path(f"{store}.collector.lock")
    first = start_collect(_config(tmp_path, "real", store, ["node-a"], 1000, None))
    try:
        wait_for_count(first, store, 200)
        before = _run_settings(store)
        lock.unlink()  # a tmp cleaner, a user "starting afresh"
        # The holder notices within its 0.5 s check; the newcomer comes after it (a newcomer that comes
        # first, while the holder cannot look, is the SIGSTOP test below). Without this wait the order
        # is the scheduler's, and a loaded machine made the holder find the newcomer's file ("replaced").
        _wait_until(lambda: lock.exists() and f"pid {first.pid} " in lock.read_text() and _lock_events(store))
        code, said = _second_collect(_config(tmp_path, "ghost", store, ["ghost-1"], 99_999_999, None))
        after = _run_settings(store)
        events = _lock_events(store)
        assert first.poll() is None
    finally:
        first_said = _stop(first)
    assert code == 2, said  # on main: None, it collected beside the first one
    assert f"another runhealth process is already collecting into {store} (pid {first.pid} on " in said
    assert "Traceback" not in said
    assert after == before and "ghost" not in json.dumps(after)  # settings and nodes: the first one's
    assert f"the collector lock file {lock} was deleted while this process (pid {first.pid})" in first_said
    assert [(e["how"], e["pid"]) for e in events] == [("deleted", first.pid)]  # a marker on the charts
    marker = run_events.word(EventRow(ts_unix=0.0, kind="store_lock_replaced", node=None, detail=events[0]))
    assert marker.label == "lock" and marker.text == (
        f"The collector's lock file {lock} was deleted while it collected (pid {first.pid}): it locked a new one,"
        " so a second collector is still refused"
    )


def stop_all_threads(proc) -> None:
    """SIGSTOP `proc` and wait until every thread of it is stopped: the signal is delivered
    asynchronously, and a lock check running meanwhile could lock the next file first (CI saw the
    holder's flock refused once, at load 13)."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                states.append((task / "stat").read_bytes().rsplit(b")", 1)[1].split()[0])
        if states and all(state in (b"T", b"t") for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {proc.pid} did not stop: {states}")


def test_a_collector_whose_lock_file_went_while_it_hung_still_keeps_the_store(tmp_path):
    """SIGSTOP: the holder cannot lock a new file before the newcomer wins the flock on one. The
    newcomer reads the store's collector status: a live process on this host, not stopped, heard
    from seconds ago; it is refused naming it, and the holder, resumed, takes the store's lock again."""
    write_shard(tmp_path / "a.jsonl", truth_rows(200, 3))
    store = tmp_path / "shared.sqlite3"
    lock = Path(f"{store}.collector.lock")
    first = start_collect(_config(tmp_path, "real", store, ["node-a"], 1000, None))
    try:
        wait_for_count(first, store, 200)
        before = _run_settings(store)
        stop_all_threads(first)
        lock.unlink()
        code, said = _second_collect(_config(tmp_path, "ghost", store, ["ghost-1"], 99_999_999, None))
        after = _run_settings(store)
        first.send_signal(signal.SIGCONT)
        write_shard(tmp_path / "a.jsonl", truth_rows(50, 4), mode="a")
        wait_for_count(first, store, 250)  # the first one collects on
        assert first.poll() is None
    finally:
        first_said = _stop(first)
    assert code == 2, said
    assert f"already collecting into {store} (pid {first.pid} on " in said and "was deleted or replaced" in said
    assert after == before and "ghost" not in json.dumps(after)
    assert f"the collector lock file {lock} was replaced while this process (pid {first.pid})" in first_said


def test_a_collector_that_lost_its_lock_to_another_process_stops_writing_and_exits_2(tmp_path):
    write_shard(tmp_path / "a.jsonl", truth_rows(200, 3))
    store = tmp_path / "shared.sqlite3"
    lock = Path(f"{store}.collector.lock")
    first = start_collect(_config(tmp_path, "real", store, ["node-a"], 1000, None))
    holder = None
    try:
        wait_for_count(first, store, 200)
        stop_all_threads(first)
        lock.unlink()
        holder = subprocess.Popen(  # another process locks a new file at the path and keeps it
            [
                sys.executable,
                "-c",
                "import fcntl, os, socket, sys, time\n"
                f"f = open({str(lock)!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
                "f.write(f'pid {os.getpid()} on {socket.gethostname()}\\n'); f.flush(); print('locked', flush=True)\n"
                "time.sleep(120)",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        polls = Store(store).cursor("SELECT COUNT(*) FROM polls").fetchone()[0]
        write_shard(tmp_path / "a.jsonl", truth_rows(50, 4), mode="a")  # what it would count if it wrote
        first.send_signal(signal.SIGCONT)
        code = first.wait(timeout=20)  # on main: it collects on, writing beside the holder
        first_said = first.communicate(timeout=30)[1]
        after = Store(store).cursor("SELECT COUNT(*) FROM polls").fetchone()[0]
    finally:
        if first.poll() is None:
            _stop(first)
        if holder is not None:
            holder.kill()
            holder.wait(timeout=30)
    assert code == 2, first_said
    assert (
        f"its lock file {lock} was replaced while it collected, and another process (pid {holder.pid} on " in first_said
    )
    assert "Traceback" not in first_said
    # Nothing written once the lock was lost: the 50 lines appended meanwhile are never counted
    # (a poll write already begun when SIGSTOP came may still commit: at most that one row).
    assert stored_count(store) == 200 and after - polls <= 1


def test_store_files_deleted_under_a_collector_are_said_and_no_second_one_gets_in(tmp_path):
    """`rm store.sqlite3*`: the store, its -wal/-shm and the lock file go at once."""
    write_shard(tmp_path / "a.jsonl", truth_rows(200, 3))
    store = tmp_path / "shared.sqlite3"
    first = start_collect(_config(tmp_path, "real", store, ["node-a"], 1000, None))
    try:
        wait_for_count(first, store, 200)
        for path in tmp_path.glob("shared.sqlite3*"):
            path.unlink()
        # As in the deleted-lock test: the newcomer comes once the holder has locked a new file (with
        # the store gone too, nothing is left that could name the holder to a newcomer that came first).
        lock = Path(f"{store}.collector.lock")
        _wait_until(lambda: lock.exists() and f"pid {first.pid} " in lock.read_text())
        code, said = _second_collect(_config(tmp_path, "ghost", store, ["ghost-1"], 99_999_999, None))
        wait_for_count(first, store, 200)  # recreated, counted again from the start of the shard
        after = _run_settings(store)
        assert first.poll() is None
    finally:
        first_said = _stop(first)
    assert code == 2, said
    assert f"already collecting into {store} (pid {first.pid} on " in said
    assert after[1] == ["node-a"] and after[0]["name"] == "real"
    assert f"The history store {store} was deleted at " in first_said
    assert f"the collector lock file {store}.collector.lock was deleted while this process" in first_said
