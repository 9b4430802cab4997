"""`runhealth collect` as a service: a bad edit of its config never stops it (issue 23 item 5).

Real collector processes over local shards: a reload whose new store cannot be opened (a path
under a regular file) or names another run's store through a `../` spelling keeps collecting
with the previous config and says why in the log, as any other bad edit does. The core object
both the collector and the dashboard use (`runhealth.settings.runset.RunSet`) is checked directly too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard
from test_packaging import start_collect, stored_count, wait_for_count

from runhealth.errors import ConfigError
from runhealth.settings import runs
from runhealth.settings.runset import RunSet

KEPT = "does not load, still collecting with the previous one"


def two_runs(tmp_path: Path, store_b: str) -> str:
    text = ""
    for name, n in (("a", 60), ("b", 40)):
        folder = tmp_path / name
        if not folder.exists():
            folder.mkdir()
            write_shard(folder / "s.jsonl", truth_rows(n, 3))
        store = tmp_path / "a.sqlite3" if name == "a" else store_b
        text += (
            f'[[runs]]\nname = "run-{name}"\ninterval_s = 0.5\nstore_path = "{store}"\n'
            f'[[runs.nodes]]\nname = "localhost"\nhost = "local"\nshards = ["{folder}/*.jsonl"]\n'
            f'python = "{sys.executable}"\ngpu = "off"\n\n'
        )
    return text


def rewrite(path: Path, text: str) -> None:
    """Write and move the mtime on by a second, so a coarse-mtime file system sees the change too."""
    stamp = path.stat().st_mtime_ns + 10**9
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(stamp, stamp))


def still_collecting(proc, shard: Path, store: Path, before: int) -> None:
    """The process is alive and counts rows appended after the bad edit."""
    write_shard(shard, truth_rows(25, 9), mode="a")
    wait_for_count(proc, store, before + 25)


def stop(proc) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_reload_to_a_store_that_cannot_be_opened_keeps_collecting(tmp_path):
    config = tmp_path / "runhealth.toml"
    config.write_text(two_runs(tmp_path, str(tmp_path / "b.sqlite3")), encoding="utf-8")
    (tmp_path / "plain-file").write_text("not a folder")
    proc = start_collect(config)
    try:
        wait_for_count(proc, tmp_path / "a.sqlite3", 60)
        wait_for_count(proc, tmp_path / "b.sqlite3", 40)  # each run polls in its own process, on its own clock
        rewrite(config, two_runs(tmp_path, str(tmp_path / "plain-file" / "b.sqlite3")))
        proc.wait_for_log(KEPT)  # checked every 0.5 s: refused, not applied
        assert proc.poll() is None, proc.said()
        still_collecting(proc, tmp_path / "a" / "s.jsonl", tmp_path / "a.sqlite3", 60)
        err = stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert KEPT in err and "plain-file" in err, err
    assert stored_count(tmp_path / "b.sqlite3") == 40  # run b's store kept its counts


def test_reload_to_another_runs_store_spelled_with_dotdot_keeps_collecting(tmp_path):
    config = tmp_path / "runhealth.toml"
    config.write_text(two_runs(tmp_path, str(tmp_path / "b.sqlite3")), encoding="utf-8")
    (tmp_path / "sub").mkdir()
    proc = start_collect(config)
    try:
        # Both first: each run polls in its own process, on its own clock (a loaded CI run stopped
        # before run a had counted anything, and read 0 where 60 was asserted at the end).
        wait_for_count(proc, tmp_path / "a.sqlite3", 60)
        wait_for_count(proc, tmp_path / "b.sqlite3", 40)
        rewrite(config, two_runs(tmp_path, str(tmp_path / "sub" / ".." / "a.sqlite3")))
        proc.wait_for_log(KEPT)
        assert proc.poll() is None, proc.said()
        still_collecting(proc, tmp_path / "b" / "s.jsonl", tmp_path / "b.sqlite3", 40)
        err = stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert KEPT in err and "field 'store_path' is run 'run-a'" in err, err
    assert "another runhealth process" not in err
    assert stored_count(tmp_path / "a.sqlite3") == 60  # nothing doubled into run a's store


def test_dotdot_spelling_of_another_runs_store_is_refused_at_load(tmp_path):
    (tmp_path / "sub").mkdir()
    config = tmp_path / "runhealth.toml"
    config.write_text(two_runs(tmp_path, str(tmp_path / "sub" / ".." / "a.sqlite3")), encoding="utf-8")
    with pytest.raises(ConfigError, match="field 'store_path' is run 'run-a'"):
        runs.load_runs(config)


def test_runset_keeps_the_last_good_runs_and_the_latest_error(tmp_path):
    config = tmp_path / "runhealth.toml"
    config.write_text(two_runs(tmp_path, str(tmp_path / "b.sqlite3")), encoding="utf-8")
    runset = RunSet(config)
    first = runset.reload()
    assert first is not None and [e.config.name for e in runset.entries] == ["run-a", "run-b"]
    assert runset.reload() is None  # unchanged file: nothing to do
    rewrite(config, config.read_text().replace("interval_s = 0.5", "interval_s = 0", 1))
    with pytest.raises(ConfigError, match="interval_s"):
        runset.reload()
    assert runset.reload() is None  # said once per version of the file
    assert runset.error is not None and "interval_s" in runset.error and str(config) in runset.error
    assert [e.config.interval_s for e in runset.entries] == [0.5, 0.5]  # the last good set
    rewrite(config, two_runs(tmp_path, str(tmp_path / "b2.sqlite3")))
    change = runset.reload()
    assert runset.error is None and change is not None
    assert change.changed == ["run-b"] and change.added == [] and change.removed == []


def test_sigusr1_polls_every_node_now(tmp_path):
    """The dashboard's "Refresh now" reaches the collector process as SIGUSR1."""
    import signal

    config = tmp_path / "runhealth.toml"
    config.write_text(two_runs(tmp_path, str(tmp_path / "b.sqlite3")).replace("interval_s = 0.5", "interval_s = 60"))
    proc = start_collect(config)
    try:
        wait_for_count(proc, tmp_path / "a.sqlite3", 60)  # the first poll comes at once
        write_shard(tmp_path / "a" / "s.jsonl", truth_rows(25, 9), mode="a")
        proc.send_signal(signal.SIGUSR1)
        wait_for_count(proc, tmp_path / "a.sqlite3", 85)  # within 30 s, not after the 60 s interval
        err = stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "collector stopped" in err


def test_reload_to_a_store_another_process_collects_into_keeps_the_previous_runs(tmp_path):
    """The new set loads and its store opens, but another collector holds it: the restart is
    undone and the previous runs collect on (the path that stops and restarts collectors)."""
    other_dir, mine_dir = tmp_path / "other", tmp_path / "mine"
    other_dir.mkdir(), mine_dir.mkdir()
    other = other_dir / "runhealth.toml"
    other.write_text(two_runs(other_dir, str(other_dir / "b.sqlite3")), encoding="utf-8")
    mine = mine_dir / "runhealth.toml"
    mine.write_text(two_runs(mine_dir, str(mine_dir / "b.sqlite3")), encoding="utf-8")
    holder, proc = start_collect(other), start_collect(mine)
    try:
        wait_for_count(holder, other_dir / "a.sqlite3", 60)
        wait_for_count(proc, mine_dir / "b.sqlite3", 40)
        rewrite(mine, two_runs(mine_dir, str(other_dir / "b.sqlite3")))  # run b -> the other's store
        proc.wait_for_log(KEPT)
        assert proc.poll() is None, proc.said()
        still_collecting(proc, mine_dir / "b" / "s.jsonl", mine_dir / "b.sqlite3", 40)
        still_collecting(proc, mine_dir / "a" / "s.jsonl", mine_dir / "a.sqlite3", 60)
        err = stop(proc)
    finally:
        for p in (proc, holder):
            if p.poll() is None:
                p.terminate()
                p.communicate(timeout=30)
    assert KEPT in err and "another runhealth process is already collecting" in err, err
    assert stored_count(other_dir / "b.sqlite3") == 40  # the other collector's counts untouched
