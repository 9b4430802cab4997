"""Faults found by hostile testing (issue #12), each with real processes, files and filesystems.

Every scenario here made the collector stop, hang or go quiet while the screen still looked
normal before its fix; each test reproduces the fault for real and checks what the operator
now sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from store_fixtures import write_reply
from test_faults import run_totals, wait_for

import runhealth.errors
from runhealth.store import Store

pytestmark = pytest.mark.faults


def hold_write_lock(path, seconds: float) -> subprocess.Popen:
    """Another process (as the sqlite3 shell or a backup would) holding the write lock."""
    code = (
        "import sqlite3, sys, time\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('BEGIN IMMEDIATE')\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "db.execute('ROLLBACK')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


# ---------------------------------------------------------------------------- 1: write lock
def test_a_write_that_times_out_on_a_busy_store_does_not_block_later_writes(tmp_path):
    store = Store(tmp_path / "s.sqlite3", busy_timeout_s=0.2)
    holder = hold_write_lock(store.path, 1.0)
    try:
        with pytest.raises(Exception, match="locked"):
            store.record_failure("n1", "first", time.time())
    finally:
        holder.wait(timeout=10)
    done = threading.Event()

    def later_write():
        store.record_failure("n1", "second", time.time())
        done.set()

    threading.Thread(target=later_write, daemon=True).start()
    assert done.wait(5), "the write lock leaked: a later write never ran"
    assert store.nodes()[0]["last_error"] == "second"


# ---------------------------------------------------------------------------- 3 and 9: line rules
def chat(tokens, finish="stop") -> bytes:
    rec = {
        "id": "x",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello there " * 8}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 7},
    }
    line = json.dumps(rec).replace('"completion_tokens": 7', f'"completion_tokens": {tokens}')
    return line.encode() + b"\n"


def local_collector(tmp_path, shard_glob, **node):
    from runhealth.collect.collector import Collector
    from runhealth.settings.config import NodeConfig, RunConfig

    config = RunConfig(
        name="hostile",
        interval_s=0.3,
        nodes=[NodeConfig(name="n1", host="local", shards=[shard_glob], gpu="off", python=sys.executable, **node)],
    )
    store = Store(tmp_path / "s.sqlite3")
    return Collector(config, store), store


@pytest.mark.parametrize(
    "bad", ["99999999999999999999999", "9223372036854775807", "1099511627777", "-5", "12.0", "1e3", "true", '"12"']
)
def test_an_absurd_token_count_is_one_malformed_line_not_a_failed_node(tmp_path, bad):
    shard = tmp_path / "out.jsonl"
    # good lines first so the template path is learned, then the bad one, then more good ones
    shard.write_bytes(chat(5) * 30 + chat(bad) + chat(6, "length") * 10 + chat(1 << 40))
    collector, store = local_collector(tmp_path, str(tmp_path / "*.jsonl"))
    with collector:
        results = collector.poll_once()
    assert not isinstance(results["n1"], Exception), results["n1"]
    node = store.nodes()[0]
    assert node["last_error"] is None and node["last_ok_unix"] is not None
    assert node["malformed"] == 1
    counts = {(r["tokens"], r["finish_reason"]): r["count"] for r in store.length_counts()}
    assert counts == {(5, "stop"): 30, (6, "length"): 10, (1 << 40, "stop"): 1}


def test_blank_lines_are_counted_apart_from_malformed_ones(tmp_path):
    from runhealth.node.scan import scan_file

    lines = [chat(5)] * 3 + [b"\n", b"   \n", b"\t\r\n"] + [b"{not json\n"] * 7 + [b" \n", b"\n"] + [chat(8)]
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(b"".join(lines))
    entry = scan_file(str(shard), None, 0, 1 << 20)
    assert (entry["malformed"], entry["blank_lines"], entry["lines"]) == (7, 5, 16)
    assert entry["counts"] == [[5, "stop", 0, 3], [8, "stop", 0, 1]]
    out = subprocess.run(
        [sys.executable, "-m", "runhealth", "scan", str(shard)], capture_output=True, text=True, timeout=60
    ).stdout
    assert "completions: 4  (unparseable lines: 7, blank lines skipped: 5)" in out
    assert scan_cli(str(shard))["blank_lines"] == 5 and scan_cli(str(shard))["unparseable"] == 7


# ---------------------------------------------------------------------------- 4: store write failures
@pytest.fixture
def small_disk(tmp_path):
    """An 8 MB tmpfs: a real filesystem that really fills up (root, as the test runner is)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode:  # fail, never skip: the disk-full scenario is part of the fault suite
        pytest.fail(f"this test mounts an 8 MB tmpfs and needs root: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path) -> None:
    # Unbuffered: a buffered file would raise ENOSPC again from close() with its unwritten tail.
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def test_a_full_disk_under_the_store_is_the_nodes_error_and_an_alert_then_recovers(tmp_path, small_disk):
    from components import alerts as alert_words
    from runhealth.collect.collector import Collector
    from runhealth.rules.health import node_status
    from runhealth.screens.overview import overview
    from runhealth.settings.config import NodeConfig, RunConfig

    shard = tmp_path / "out.jsonl"
    shard.write_bytes(chat(5) * 20)
    config = RunConfig(
        name="full",
        interval_s=0.3,
        nodes=[NodeConfig(name="n1", host="local", shards=[str(shard)], gpu="off", python=sys.executable)],
    )
    store = Store(small_disk / "s.sqlite3", busy_timeout_s=1)
    with Collector(config, store) as collector:
        assert not isinstance(collector.poll_once()["n1"], Exception)
        fill(small_disk / "filler")
        with open(shard, "ab") as f:  # many new lengths: the poll must write many new rows
            f.write(b"".join(chat(k) for k in range(100, 3000)))
        result = collector.poll_once()["n1"]
        assert isinstance(result, Exception) and str(result) == "cannot write the history store: disk full"
        node = store.nodes()[0]
        assert node["last_error"] == "cannot write the history store: disk full"
        state, why = node_status(node, time.time() + 60, stale_after=30)
        assert state == "stale" and "disk full" in why
        alerts = alert_words.lines(list(overview(store, config, time.time()).alerts))  # the Overview's alert box
        assert (
            "error",
            "n1: cannot write the history store: disk full — new data is not being saved (see Nodes).",
        ) in alerts
        (small_disk / "filler").unlink()  # space returns: the next poll writes everything
        assert not isinstance(collector.poll_once()["n1"], Exception)
    node = store.nodes()[0]
    assert "store_error" not in node and node["failing_since_unix"] is None
    assert sum(r["count"] for r in store.length_counts()) == 20 + 2900


# ---------------------------------------------------------------------------- 5: aliases and loops
def scan_cli(*globs, timeout=60):
    proc = subprocess.run(
        [sys.executable, "-m", "runhealth", "scan", "--json", *globs], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_shard_reached_through_a_symlink_loop_is_counted_once(tmp_path):
    loop = tmp_path / "loop"
    (loop / "a").mkdir(parents=True)
    (loop / "b").mkdir()
    (loop / "out.jsonl").write_bytes(chat(5) * 10)
    (loop / "a" / "back").symlink_to(loop)
    (loop / "b" / "back").symlink_to("../..")  # two loops: 2^40 paths for a naive walk
    assert scan_cli(str(loop / "**" / "*.jsonl"), timeout=30)["completions"] == 10


def test_alias_paths_and_overlapping_globs_count_a_file_once(tmp_path, monkeypatch):
    from runhealth.node.agent import expand_globs

    data = tmp_path / "data"
    (data / "run3").mkdir(parents=True)
    (data / "run3" / "out.jsonl").write_bytes(chat(5) * 10)
    (data / "latest").symlink_to("run3")
    (data / "run3" / "hard.jsonl").hardlink_to(data / "run3" / "out.jsonl")
    globs = [str(data / "**"), str(data / "latest" / "*.jsonl"), str(data / "run3" / "*.jsonl")]
    assert scan_cli(*globs)["completions"] == 10
    files, unmatched = expand_globs(globs)
    assert files == [str(data / "run3" / "out.jsonl")] and unmatched == []  # no symlink, shortest
    monkeypatch.chdir(tmp_path)
    assert expand_globs(["**/*.jsonl", "nothing/**"]) == (["data/run3/out.jsonl"], ["nothing/**"])


# ---------------------------------------------------------------------------- 7: terminal escapes
TITLE = "\x1b]0;PWNED\x07"


def test_terminal_escapes_in_shard_data_never_reach_the_terminal(tmp_path):
    shard = tmp_path / "out.jsonl"
    shard.write_bytes(chat(5) * 3 + chat(6, TITLE) * 2)
    proc = subprocess.run(
        [sys.executable, "-m", "runhealth", "scan", str(tmp_path / "*.jsonl"), str(tmp_path / f"{TITLE}*.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr
    assert "\\x1b]0;PWNED\\x07 2" in proc.stdout  # kept, visibly
    assert "nothing matched" in proc.stderr and "\\x1b]0;PWNED" in proc.stderr


def test_log_lines_escape_remote_text(tmp_path, caplog):
    """A store warning that names a shard path holding an escape sequence (a real file name)."""
    store = Store(tmp_path / "s.sqlite3")
    path = str(tmp_path / f"{TITLE}.jsonl")
    entry = {"inode": 1, "size": 10, "offset_from": 0, "offset": 10, "reset": False, "counts": [[5, "stop", 0, 1]]}
    write_reply(store, "n1", {"shards": {"files": {path: entry}}}, time.time(), 1.0)
    with caplog.at_level("WARNING", logger="runhealth"):
        write_reply(store, "n1", {"shards": {"files": {path: dict(entry, offset_from=3)}}}, time.time(), 1.0)
    [record] = [r for r in caplog.records if "ignored a scan" in r.getMessage()]
    assert "\x1b" not in record.getMessage() and "\\x1b]0;PWNED\\x07" in record.getMessage()


# ---------------------------------------------------------------------------- 8: stale errors, paramiko noise
def test_a_recovered_node_reads_healthy_with_its_last_error_as_history(tmp_path, monkeypatch):
    import store_fixtures
    from test_pages import assert_clean, run_page, texts

    store, config = store_fixtures.make_store(tmp_path, "healthy")
    last = store.last_collection_unix()
    store.record_failure("node-1", "connection refused", last - 20)
    write_reply(store, "node-1", store_fixtures.poll_reply(last, [], {}), last, rtt_ms=5.0)
    store.close()
    monkeypatch.setattr(time, "time", lambda: last + 5)
    at = run_page("nodes", config, monkeypatch)
    assert_clean(at)
    shown = texts(at)
    assert "Last error (25 s ago; resolved — polled fine 5 s ago): connection refused" in shown
    assert "DOWN" not in shown and "STALE" not in shown


def test_a_silent_node_costs_one_log_line_not_a_traceback(tmp_path):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.31", 0))
    listener.listen(8)
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    (tmp_path / "known_hosts").write_text("")
    (tmp_path / "cfg.toml").write_text(
        f'[run]\nname = "x"\n[[nodes]]\nname = "silent"\nhost = "127.0.0.31"\nport = {listener.getsockname()[1]}\n'
        f'known_hosts = "{tmp_path / "known_hosts"}"\nshards = ["/x/*.jsonl"]\ngpu = "off"\nconnect_timeout_s = 1\n'
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "runhealth", "poll", "--config", str(tmp_path / "cfg.toml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        listener.close()
        for conn, _ in accepted:
            conn.close()
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "  File " not in proc.stderr, proc.stderr
    assert proc.stderr.count("Error reading SSH protocol banner") == 1, proc.stderr


# ---------------------------------------------------------------------------- also: unmatched globs in poll
def test_poll_warns_about_a_glob_that_matches_nothing(tmp_path):
    (tmp_path / "cfg.toml").write_text(
        f'[run]\nname = "x"\n[[nodes]]\nname = "n1"\nhost = "local"\npython = "{sys.executable}"\n'
        f'shards = ["{tmp_path}/nothing-here/*.jsonl"]\ngpu = "off"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "runhealth", "poll", "--config", str(tmp_path / "cfg.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"warning: nothing matched {tmp_path}/nothing-here/*.jsonl on n1" in proc.stderr


# ---------------------------------------------------------------------------- 6: store deleted or truncated
def read_counts_elsewhere(path) -> int | None:
    """Completions in the store file as a separate process sees it (the file on disk is what counts)."""
    code = (
        "import sqlite3, sys\n"
        "try:\n"
        "    db = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\n"
        "    print(db.execute('SELECT SUM(count) FROM node_length_counts').fetchone()[0])\n"
        "except sqlite3.Error:\n"
        "    print('None')\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30)
    return None if out.stdout.strip() == "None" else int(out.stdout)


@pytest.mark.parametrize("how", ["deleted", "truncated"])
def test_a_store_deleted_or_truncated_under_a_running_collector_is_recreated(tmp_path, how):
    shard = tmp_path / "out.jsonl"
    shard.write_bytes(chat(5) * 50)
    collector, store = local_collector(tmp_path, str(shard))
    collector.start()
    try:
        assert wait_for(lambda: sum(r["count"] for r in store.length_counts()) == 50)
        if how == "deleted":  # as `rm store.sqlite3*` would
            for suffix in ("", "-wal", "-shm"):
                (tmp_path / f"s.sqlite3{suffix}").unlink()
        else:
            with open(store.path, "r+b") as f:
                f.truncate(0)
        with open(shard, "ab") as f:
            f.write(chat(6) * 7)
        collector.request_refresh()
        assert wait_for(lambda: read_counts_elsewhere(store.path) == 57, timeout_s=20), read_counts_elsewhere(
            store.path
        )
        assert store.incident is not None and f"was {how}" in store.incident[0]
        assert {n["name"] for n in store.nodes()} == {"n1"} and store.meta("run")["name"] == "hostile"
    finally:
        collector.stop()


def other_store(path, user_version: int | None = None) -> None:
    """Another run's store, closed cleanly (no -wal), as `mv other.sqlite3 store.sqlite3` would bring."""
    other = Store(path)
    other.set_meta("run", {"name": "other"})
    other.register_node("elsewhere", {})
    if user_version is not None:
        other.cursor(f"PRAGMA user_version = {user_version}")
    other.close()
    assert not path.with_name(path.name + "-wal").exists()


def read_elsewhere(path, sql: str):
    """One value read from the store file by a separate process."""
    code = "import sqlite3, sys\nprint(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])\n"
    out = subprocess.run([sys.executable, "-c", code, str(path), sql], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]


def test_a_store_replaced_under_a_running_collector_is_opened_without_the_old_wal(tmp_path):
    shard = tmp_path / "out.jsonl"
    shard.write_bytes(chat(5) * 50)
    collector, store = local_collector(tmp_path, str(shard))
    collector.start()
    try:
        assert wait_for(lambda: sum(r["count"] for r in store.length_counts()) == 50)
        other_store(tmp_path / "other.sqlite3")
        (tmp_path / "other.sqlite3").replace(store.path)  # as `mv other.sqlite3 s.sqlite3` would
        with open(shard, "ab") as f:
            f.write(chat(6) * 7)
        collector.request_refresh()
        # Read by another process only once the collector has seen the new file: until then the
        # old -wal is still at the path, and any SQLite reader opening it would replay it there.
        assert wait_for(lambda: store.incident is not None and "was replaced by another file" in store.incident[0])
        # The new file knew nothing of n1's shard: its 57 lines are counted from the start, once.
        assert wait_for(lambda: read_counts_elsewhere(store.path) == 57, timeout_s=20), read_counts_elsewhere(
            store.path
        )
        assert read_elsewhere(store.path, "PRAGMA integrity_check") == "ok"
        # What the moved-in file held is still there: the old file's WAL was not replayed onto it.
        assert read_elsewhere(store.path, "SELECT COUNT(*) FROM nodes WHERE name = 'elsewhere'") == "1"
    finally:
        collector.stop()


def test_a_store_renamed_aside_keeps_its_last_writes_when_another_file_takes_its_place(tmp_path):
    # `mv s.sqlite3 backup.sqlite3; mv other.sqlite3 s.sqlite3`: the last polls sit in s.sqlite3-wal,
    # which SQLite finds by name only. They belong to the backup, not to the file now at the path.
    from test_store import entry, reply

    store = Store(tmp_path / "s.sqlite3")
    write_reply(store, "n1", reply({"/a": entry(100, [[10, "stop", 0, 3]])}), 1.0, 1.0)
    assert (tmp_path / "s.sqlite3-wal").stat().st_size > 0  # not checkpointed yet
    store.path.rename(tmp_path / "backup.sqlite3")
    other_store(tmp_path / "other.sqlite3")
    (tmp_path / "other.sqlite3").replace(store.path)
    write_reply(store, "n1", reply({"/a": entry(100, [[10, "stop", 0, 3]])}), 2.0, 1.0)
    store.close()
    assert read_elsewhere(tmp_path / "backup.sqlite3", "SELECT SUM(count) FROM node_length_counts") == "3"
    assert read_elsewhere(store.path, "SELECT SUM(count) FROM node_length_counts") == "3"
    assert read_elsewhere(store.path, "SELECT COUNT(*) FROM nodes WHERE name = 'elsewhere'") == "1"


def test_a_newer_store_moved_under_a_running_collector_is_refused_untouched(tmp_path):
    shard = tmp_path / "out.jsonl"
    shard.write_bytes(chat(5) * 50)
    collector, store = local_collector(tmp_path, str(shard))
    collector.start()
    try:
        assert wait_for(lambda: sum(r["count"] for r in store.length_counts()) == 50)
        other_store(tmp_path / "newer.sqlite3", user_version=99)
        (tmp_path / "newer.sqlite3").replace(store.path)
        collector.request_refresh()
        refused = "schema version 99, newer than this runhealth's"
        assert wait_for(lambda: store.incident is not None and refused in store.incident[0], timeout_s=20), (
            store.incident
        )
        assert str(store.path) in store.incident[0]
        collector.request_refresh()
        time.sleep(1.0)  # polls keep running: none of them may write into the refused file
        assert read_elsewhere(store.path, "PRAGMA user_version") == "99"
        assert read_elsewhere(store.path, "SELECT COUNT(*) FROM shards") == "0"
        assert read_elsewhere(store.path, "SELECT group_concat(name) FROM nodes") == "elsewhere"
        # A usable store put back under the path is opened as at start, and counting resumes.
        (tmp_path / "newer.sqlite3").write_bytes(b"")
        (tmp_path / "newer.sqlite3").replace(store.path)
        collector.request_refresh()
        assert wait_for(lambda: read_counts_elsewhere(store.path) == 50, timeout_s=20), read_counts_elsewhere(
            store.path
        )
    finally:
        collector.stop()


def test_the_original_store_moved_back_after_a_refusal_is_kept_whole_and_restart_is_asked(tmp_path):
    shard = tmp_path / "out.jsonl"
    shard.write_bytes(chat(5) * 50)
    collector, store = local_collector(tmp_path, str(shard))
    collector.start()
    try:
        assert wait_for(lambda: sum(r["count"] for r in store.length_counts()) == 50)
        store.path.rename(tmp_path / "aside.sqlite3")  # `mv s.sqlite3 aside.sqlite3; mv newer.sqlite3 s.sqlite3`
        other_store(tmp_path / "newer.sqlite3", user_version=99)
        (tmp_path / "newer.sqlite3").replace(store.path)
        collector.request_refresh()
        assert wait_for(lambda: store.incident is not None and "schema version 99" in store.incident[0], timeout_s=20)
        (tmp_path / "aside.sqlite3").replace(store.path)  # the operator undoes it
        collector.request_refresh()
        assert wait_for(
            lambda: store.incident is not None and "restart runhealth" in store.incident[0], timeout_s=20
        ), store.incident
        # Its last writes were saved into it when it was let go of, and nothing wrote to it since.
        assert read_counts_elsewhere(store.path) == 50
        assert read_elsewhere(store.path, "PRAGMA integrity_check") == "ok"
    finally:
        collector.stop()
    store.close()
    assert sum(r["count"] for r in Store(store.path).length_counts()) == 50  # as after a restart


def mv_at_open(monkeypatch, src, dest, after: bool) -> list[bool]:
    """`mv src dest` landing exactly as SQLite opens `dest` next: just after its open (after=True)
    or between the store's look at the path and the open. Returns a flag set once it has moved."""
    import sqlite3

    real, moved = sqlite3.connect, []

    def connect(database, *args, **kwargs):
        if str(database) != str(dest) or moved:
            return real(database, *args, **kwargs)
        if not after:
            src.replace(dest)
        db = real(database, *args, **kwargs)
        if after:
            src.replace(dest)
        moved.append(True)
        return db

    monkeypatch.setattr(sqlite3, "connect", connect)
    return moved


def test_a_file_moved_under_the_path_as_a_deleted_store_is_recreated_is_checked_not_trusted(tmp_path, monkeypatch):
    """CI caught it once (`mv s.sqlite3 aside; mv newer s.sqlite3` with a poll between the two): the
    store recreated its deleted file, and the newer one came under the path right after SQLite had
    opened the new empty file. The store then took the path's file identity for its own: it went on
    writing into the unlinked empty file and never saw the newer store it should have refused."""
    import hashlib

    store = Store(tmp_path / "s.sqlite3")
    store.register_node("n1", {})
    store.path.rename(tmp_path / "aside.sqlite3")
    other_store(tmp_path / "newer.sqlite3", user_version=99)
    newer = hashlib.sha256((tmp_path / "newer.sqlite3").read_bytes()).hexdigest()
    moved = mv_at_open(monkeypatch, tmp_path / "newer.sqlite3", store.path, after=True)
    incident = store.check_file()
    assert moved and incident is not None and "schema version 99" in incident[0], incident
    with pytest.raises(runhealth.errors.StoreError, match="schema version 99"):
        store.register_node("n2", {})  # refused, never written into a file no longer named
    assert hashlib.sha256(store.path.read_bytes()).hexdigest() == newer  # left untouched
    store.close()


def test_a_thread_never_writes_unchecked_into_a_file_moved_under_the_path_as_it_connects(tmp_path, monkeypatch):
    """A thread's first access opens its own connection by the path's name. A newer store moved
    there between the store's look at the path and that open was written to unchecked (the WAL
    switch and the write itself) before the next access found it replaced."""
    import hashlib

    store = Store(tmp_path / "s.sqlite3")
    store.register_node("n1", {})  # this thread's connection, to the store's own file
    other_store(tmp_path / "newer.sqlite3", user_version=99)
    newer = hashlib.sha256((tmp_path / "newer.sqlite3").read_bytes()).hexdigest()
    moved = mv_at_open(monkeypatch, tmp_path / "newer.sqlite3", store.path, after=False)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            store.register_node("n2", {})
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=write)
    t.start()
    t.join(30)
    assert moved and len(errors) == 1 and "schema version 99" in str(errors[0]), errors
    assert hashlib.sha256(store.path.read_bytes()).hexdigest() == newer  # left untouched
    store.close()


def test_a_path_whose_file_is_replaced_at_every_open_is_given_up_after_five_opens(tmp_path, monkeypatch):
    """The re-open after a file moved in meanwhile is bounded: OPEN_TRIES opens, none waiting, then a
    refusal that says why (and every later access tries again, as for any refused file)."""
    import shutil
    import sqlite3

    from runhealth.store import lifecycle

    store = Store(tmp_path / "s.sqlite3")
    store.register_node("n1", {})
    other_store(tmp_path / "other.sqlite3")
    store.path.unlink()
    real, opens = sqlite3.connect, []

    def connect(database, *args, **kwargs):
        db = real(database, *args, **kwargs)
        if str(database) == str(store.path):  # another run's store mv'ed in right after each open
            opens.append(time.monotonic())
            shutil.copy(tmp_path / "other.sqlite3", tmp_path / "next.sqlite3")
            (tmp_path / "next.sqlite3").replace(store.path)
        return db

    monkeypatch.setattr(sqlite3, "connect", connect)
    incident = store.check_file()
    assert len(opens) == lifecycle.OPEN_TRIES == 5
    assert opens[-1] - opens[0] < 2.0  # no waits between them
    assert incident is not None and "replaced by another file each of the 5 times it was opened" in incident[0]
    monkeypatch.undo()
    store.close()


def test_a_reader_that_held_the_log_back_saves_it_into_the_replaced_file_when_the_next_is_refused(tmp_path):
    """Seen under load (test_the_original_store_moved_back..., 1 in ~15 with two busy loops): the
    file set aside keeps the frames after a reader's snapshot in its log until a connection to
    it checkpoints again, and only a new generation (a file taken up) retired the other threads'
    connections. With the next file refused, none did: the file moved back lacked its last writes
    for any other process. Now each thread saves its own connection's log into the file set aside on
    its next access, taken up or not."""
    store = Store(tmp_path / "s.sqlite3")
    store.register_node("n1", {})
    snapshot_taken, snapshot_end, accessed, done = (threading.Event() for _ in range(4))
    seen: list[BaseException] = []

    def reader() -> None:
        with store.snapshot():
            store.query("SELECT COUNT(*) FROM nodes")
            snapshot_taken.set()
            snapshot_end.wait(30)
        try:
            store.query("SELECT 1")  # its next access, after its snapshot ended
        except runhealth.errors.StoreError as exc:
            seen.append(exc)
        accessed.set()
        done.wait(30)  # alive, its connection not closed by the thread's end

    t = threading.Thread(target=reader)
    t.start()
    try:
        assert snapshot_taken.wait(30)
        for name in ("n2", "n3", "n4"):
            store.register_node(name, {})  # frames after the reader's snapshot
        store.path.rename(tmp_path / "aside.sqlite3")
        other_store(tmp_path / "newer.sqlite3", user_version=99)
        (tmp_path / "newer.sqlite3").replace(store.path)
        incident = store.check_file()  # this thread's connection: checkpointed up to the snapshot
        assert incident is not None and "schema version 99" in incident[0], incident
        snapshot_end.set()
        assert accessed.wait(30) and len(seen) == 1 and "schema version 99" in str(seen[0]), seen
        assert read_elsewhere(tmp_path / "aside.sqlite3", "SELECT COUNT(*) FROM nodes") == "4"
    finally:
        snapshot_end.set()
        done.set()
        t.join(30)
    store.close()


def test_a_retired_connection_saves_the_frames_a_reader_in_another_thread_held_back(tmp_path):
    """The connection let go of when its file was renamed aside checkpoints through its own
    descriptors. A reader on the same file (another thread's connection, which stays open) held
    a snapshot older than the last writes, so one PASSIVE checkpoint left them in the log, whose
    name was gone: the renamed file lacked them (test_hostile's moved-back store read None under
    load). The checkpoint is tried again until the reader's snapshot ends."""
    import shutil
    import sqlite3

    from runhealth.store import storefile

    path = tmp_path / "s.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE t (x)")
    writer.execute("INSERT INTO t VALUES (1)")
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    assert reader.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1  # its snapshot: 1 row
    writer.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(49)])  # after the snapshot
    path.rename(tmp_path / "aside.sqlite3")
    for suffix in ("-wal", "-shm"):  # as Store._set_old_file_aside lets the old log's names go
        (tmp_path / f"s.sqlite3{suffix}").unlink()
    threading.Timer(0.2, lambda: reader.execute("COMMIT")).start()  # the reader's statement ends; it stays open
    storefile.retire(writer, wait_s=10)  # the product waits 1 s; a loaded test machine may start the timer late
    shutil.copy(tmp_path / "aside.sqlite3", tmp_path / "copy.sqlite3")  # what the file itself holds
    copy = sqlite3.connect(tmp_path / "copy.sqlite3")
    try:
        assert copy.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 50
    finally:
        copy.close()
        reader.close()


@pytest.mark.parametrize("copied", [10, 4])
def test_a_retired_connections_checkpoint_is_tried_once_when_it_completes_and_at_a_bounded_rate_else(copied):
    """The retry's rate: a checkpoint that copies every frame is the only one; one that never
    does is tried every 20 ms until `wait_s`, then the connection is closed anyway."""
    from runhealth.store import storefile

    class Db:
        calls, closed = 0, False

        def execute(self, sql):
            assert sql == "PRAGMA wal_checkpoint(PASSIVE)"
            self.calls += 1
            return self

        def fetchone(self):
            return (0, 10, copied)  # (busy, frames in the log, frames copied)

        def close(self):
            self.closed = True

    db = Db()
    t0 = time.monotonic()
    storefile.retire(db, wait_s=0.3)  # type: ignore[arg-type]
    took = time.monotonic() - t0
    assert db.closed
    if copied == 10:
        assert db.calls == 1 and took < 0.1
    else:
        assert 0.3 <= took < 2.0 and 2 <= db.calls <= 16, (db.calls, took)


def test_the_original_store_moved_back_is_taken_up_again_when_no_connection_was_left_on_it(tmp_path):
    from test_store import entry, reply

    store = Store(tmp_path / "s.sqlite3")  # one thread: its only connection is let go of at the refusal
    write_reply(store, "n1", reply({"/a": entry(100, [[10, "stop", 0, 3]])}), 1.0, 1.0)
    store.path.rename(tmp_path / "aside.sqlite3")
    other_store(tmp_path / "newer.sqlite3", user_version=99)
    (tmp_path / "newer.sqlite3").replace(store.path)
    assert "schema version 99" in store.check_file()[0]
    (tmp_path / "aside.sqlite3").replace(store.path)
    taken_up = store.check_file()
    assert "was replaced by another file" in taken_up[0] and "(it held 1 node(s))" in taken_up[0]
    assert run_totals(store) == {("n1", 10, "stop"): 3}
    assert store.check_file() == taken_up  # opened once, not again on every access


def test_the_sidebar_says_the_store_was_deleted_instead_of_a_traceback(tmp_path, monkeypatch):
    import store_fixtures
    import streamlit as st
    from test_pages import run_page, texts

    st.cache_resource.clear()
    store, config = store_fixtures.make_store(tmp_path, "healthy")
    store.close()
    try:
        at = run_page("nodes", config, monkeypatch)
        assert not at.exception
        for path in tmp_path.glob("*.sqlite3*"):
            path.unlink()
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert "was deleted at" in texts(at)
    finally:
        st.cache_resource.clear()


# ---------------------------------------------------------------------------- 2: time-bounded scans
def slow_line(i: int) -> bytes:
    """A logprobs-heavy line (~1 KB) whose keys differ from line to line, so no template learned
    on one line fits the next: json.loads speed, ~10 MB/s."""
    rec = {
        f"id{i}": i,
        "choices": [
            {"index": 0, "logprobs": {"content": [{"t": k, "lp": -0.5} for k in range(40)]}, "finish_reason": "stop"}
        ],
        "usage": {"completion_tokens": 7},
    }
    return json.dumps(rec).encode() + b"\n"


def test_a_scan_longer_than_the_command_timeout_still_indexes_and_shows_progress(tmp_path):
    from runhealth.screens import nodestates

    shard = tmp_path / "big.jsonl"
    n = 96_000  # ~100 MB: more than one poll's 0.25 s scan budget (a 1 s command timeout) even at 80 MB/s
    shard.write_bytes(b"".join(slow_line(i) for i in range(n)))
    collector, store = local_collector(tmp_path, str(shard), command_timeout_s=1.0)
    seen_progress = []

    def watch():
        nodes = store.nodes()
        progress = nodestates.indexing_progress(nodes)
        if progress is not None and "left" in progress[1]:
            seen_progress.append(progress)
        return sum(r["count"] for r in store.length_counts()) == n

    collector.start()
    try:
        assert wait_for(watch, timeout_s=60, step_s=0.02), store.nodes()[0]
    finally:
        collector.stop()
    node = store.nodes()[0]
    assert node["pending_bytes"] == 0 and node["bytes_indexed"] == shard.stat().st_size
    assert seen_progress, "no progress with speed and time left was shown while indexing"
    share, text = seen_progress[0]
    assert 0 < share < 1 and "Indexing the backlog:" in text and "/s" in text


# ---------------------------------------------------------------------------- also: test hygiene
def test_the_leak_check_fails_a_run_that_leaves_a_process_behind(tmp_path):
    (tmp_path / "test_leaky.py").write_text(
        "import subprocess\ndef test_leaks():\n    subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
    )
    (tmp_path / "test_tidy.py").write_text(
        "import subprocess\ndef test_tidy():\n    subprocess.Popen(['sleep', '300']).kill()\n"
    )
    env = dict(__import__("os").environ, PYTHONPATH=str(__import__("pathlib").Path(__file__).parent))
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "leakcheck"]
    leaky = subprocess.run([*run, "test_leaky.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert leaky.returncode == 1 and "1 passed" in leaky.stdout, leaky.stdout
    assert "process(es) left running by the tests (now killed)" in leaky.stdout and "sleep 300" in leaky.stdout
    tidy = subprocess.run([*run, "test_tidy.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert tidy.returncode == 0, tidy.stdout


def test_the_leak_check_fails_a_parallel_run_that_leaves_a_process_behind(tmp_path):
    """Under pytest-xdist (as scripts/test.sh runs) a worker's exit status and output never reach
    the run's: the worker hands what it found to the controller, which fails the run."""
    (tmp_path / "test_leaky.py").write_text(
        "import subprocess\ndef test_leaks():\n    subprocess.Popen(['sleep', '301'], start_new_session=True)\n"
    )
    (tmp_path / "test_tidy.py").write_text("def test_tidy():\n    pass\n")
    env = dict(__import__("os").environ, PYTHONPATH=str(__import__("pathlib").Path(__file__).parent))
    argv = [*LEAK_RUN, "-n", "2", "test_leaky.py", "test_tidy.py"]
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "2 passed" in run.stdout, run.stdout + run.stderr
    assert "1 process(es) left running by the tests (now killed)" in run.stdout and "sleep 301" in run.stdout, (
        run.stdout
    )


LEAK_RUN = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "leakcheck"]


def inner_pytest(tmp_path, test_file: str, source: str) -> subprocess.CompletedProcess:
    """A separate pytest run of one test file under tmp_path, with its own basetemp and session mark."""
    (tmp_path / test_file).write_text(source)
    env = dict(__import__("os").environ, PYTHONPATH=str(__import__("pathlib").Path(__file__).parent))
    argv = [*LEAK_RUN, f"--basetemp={tmp_path / 'inner'}", test_file]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_the_leak_check_finds_an_sshd_that_rewrote_its_environment(tmp_path):
    source = (
        "import leakcheck, sshd\n"
        "sshd.ON_START.append(leakcheck.track)  # as tests/conftest.py does\n"
        "def test_sshd_left_running(tmp_path):\n"
        "    host, client = sshd.keygen(tmp_path / 'host'), sshd.keygen(tmp_path / 'client')\n"
        "    keys = tmp_path / 'authorized_keys'\n"
        "    keys.write_text((tmp_path / 'client.pub').read_text())\n"
        "    sshd.Sshd('127.0.0.1', host, keys, tmp_path).start()\n"
    )
    run = inner_pytest(tmp_path, "test_sshd_leak.py", source)
    assert run.returncode == 1 and "1 passed" in run.stdout, run.stdout + run.stderr
    assert "process(es) left running by the tests (now killed)" in run.stdout and "sshd:" in run.stdout, run.stdout


def test_the_leak_check_leaves_a_foreign_process_naming_its_temp_folder_alone(tmp_path):
    # Not this run's: started outside it, it only names a path in the run's basetemp.
    foreign = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", str(tmp_path / "inner" / "test_x0" / "out.log")],
        start_new_session=True,
    )
    try:
        run = inner_pytest(tmp_path, "test_tidy.py", "def test_tidy(tmp_path):\n    assert tmp_path.is_dir()\n")
        assert run.returncode == 0 and "left running" not in run.stdout, run.stdout
        assert foreign.poll() is None, "the leak check killed a process that was not its run's"
    finally:
        foreign.kill()
        foreign.wait()
