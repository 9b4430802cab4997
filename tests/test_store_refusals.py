"""A store runhealth cannot use is refused in words, never a traceback (issue 40 items 6 and 8).

Real files on real filesystems and real `runhealth` processes. A full disk is not a damaged
store: on a small tmpfs that the test fills (mounted here, unmounted in teardown; the test runs
as root, as CI does) the migration of a healthy version-11 store used to say "not an SQLite
database (disk I/O error) … Move it away" (SQLite could not grow its -shm), or "stays at
version 12" about a store still at 11 (the version was taken before the COMMIT that failed). A
damaged store (4 KB of garbage at offset 8192 of a real one) gave a traceback from `collect` and
`status`; a lock file the collecting user may not write gave a PermissionError traceback (run
as `nobody` with setpriv: root may write anything). Each is now a sentence naming the file and
what to do, exit code 2, and the file is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard
from test_hostile import fill
from test_packaging import start_collect, wait_for_count

from runhealth.errors import StoreError
from runhealth.store import Store
from runhealth.store.migrations import STORE_VERSION

ROOT = Path(__file__).resolve().parent.parent


def version(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def write_config(folder: Path, store: Path, shard_glob: str) -> Path:
    """A run over local shards. Its numbers go stale after 1 s (stale_after_s), so `status` a
    moment after the collector stopped builds its Overview from the store's tables instead of
    showing the one the collector published (which reads no more than its own row)."""
    config = folder / "runhealth.toml"
    config.write_text(
        f'[run]\nname = "r"\nstore_path = "{store}"\ninterval_s = 1\nstale_after_s = 1\n\n[[nodes]]\nname = "n1"\nhost = "local"\n'
        f'shards = ["{shard_glob}"]\npython = "{sys.executable}"\ngpu = "off"\n',
        encoding="utf-8",
    )
    return config


def real_store(folder: Path, n: int = 300) -> tuple[Path, Path]:
    """A store that a real `runhealth collect` filled from a shard of `n` completions, then
    stopped (its -wal folded into the file when the test's own connection closes last); and
    its config."""
    write_shard(folder / "a.jsonl", truth_rows(n, 3))
    store = folder / "s.sqlite3"
    config = write_config(folder, store, str(folder / "*.jsonl"))
    proc = start_collect(config)
    try:
        wait_for_count(proc, store, n)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    with contextlib.closing(sqlite3.connect(store)) as db:  # the last connection: it folds the -wal in
        db.execute("SELECT COUNT(*) FROM meta").fetchone()
    assert not Path(f"{store}-wal").exists()
    return store, config


def runhealth(
    *args: str, as_nobody: bool = False, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": tempfile.gettempdir(), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [*as_user, sys.executable, "-m", "runhealth", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd or tempfile.gettempdir(),
    )


# ---------------------------------------------------------------------------- 6: a full disk
@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs: a real filesystem that really fills up (root, as the test runner is)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode:  # fail, never skip: the full-disk refusal is part of the fault suite
        pytest.fail(f"this test mounts a 4 MB tmpfs and needs root: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def version_11_store(folder: Path) -> tuple[Path, Path]:
    """A healthy store as runhealth wrote it at schema version 11 (before polls.prompts)."""
    store, config = real_store(folder)
    with contextlib.closing(sqlite3.connect(store, isolation_level=None)) as db:
        for table in ("polls", "poll_rollup"):
            db.execute(f"ALTER TABLE {table} DROP COLUMN prompts")
        db.execute("PRAGMA user_version = 11")
    assert STORE_VERSION > 11 and version(store) == 11 and not Path(f"{store}-wal").exists()
    return store, config


@pytest.mark.parametrize("room", [0, 36 * 1024], ids=["no-room-for-its-shm", "room-for-its-shm-only"])
def test_a_full_disk_is_said_to_be_full_not_a_damaged_store_and_the_version_is_right(small_disk, room):
    store, config = version_11_store(small_disk)
    with contextlib.closing(sqlite3.connect(store)) as db:
        counted = db.execute("SELECT SUM(count) FROM length_counts").fetchone()[0]
    before = store.read_bytes()
    (small_disk / "room").write_bytes(b"\0" * room)
    fill(small_disk / "filler")
    (small_disk / "room").unlink()
    with pytest.raises(StoreError) as info:
        Store(store)
    said = str(info.value)
    status = runhealth("status", "--config", str(config))
    print(said, status.stderr, sep="\n")
    assert "not an SQLite database" not in said and "Move it away" not in said and "is damaged" not in said
    assert f"the disk holding history store {store} is full (" in said and f"free in {small_disk};" in said
    assert "free space there" in said and "store_path" in said
    if room:  # the -shm fitted, the migration's log did not: the version it still has is named
        assert "migration to version 12 (polls.prompts, poll_rollup.prompts) failed" in said
        assert "the store stays at version 11:" in said
    assert status.returncode == 2 and "Traceback" not in status.stderr
    assert f"the disk holding history store {store} is full" in status.stderr
    (small_disk / "filler").unlink()  # space again: the same store opens and is upgraded, nothing lost
    assert version(store) == 11 and store.read_bytes() == before
    opened = Store(store)
    assert version(store) == STORE_VERSION and sum(r["count"] for r in opened.length_counts()) == counted == 300
    opened.close()


# ---------------------------------------------------------------------------- 8: clear refusals
def damage(store: Path) -> None:
    """4 KB of garbage at offset 8192: page 3 of a real store (the meta table's index)."""
    with open(store, "r+b") as f:
        f.seek(8192)
        f.write(random.Random(8192).randbytes(4096))  # the same garbage every run


@pytest.mark.parametrize("command", ["collect", "status"])
def test_a_damaged_store_is_refused_naming_it_without_a_traceback(tmp_path, command):
    store, config = real_store(tmp_path)
    damage(store)
    before = store.read_bytes()
    time.sleep(1.5)  # the published Overview is no longer true (stale after 1 s): status reads the tables
    done = runhealth(command, "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"history store {store} is damaged (database disk image is malformed)" in done.stderr
    assert "Move it away" in done.stderr and "store_path" in done.stderr
    assert store.read_bytes() == before  # refused untouched


@pytest.fixture
def shared_folder():
    """A folder the user `nobody` can reach (pytest's tmp_path is root's, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="runhealth-refusals-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_a_lock_file_that_cannot_be_written_is_refused_naming_it(shared_folder):
    store, config = real_store(shared_folder)
    for path in (shared_folder, store, config, shared_folder / "a.jsonl"):
        os.chown(path, 65534, 65534)  # nobody's: the store and its folder are writable by the user
    lock = Path(f"{store}.collector.lock")
    lock.write_text("pid 1 on elsewhere\n")
    lock.chmod(0o600)  # root's, left behind by a collector once run as root
    done = runhealth("collect", "--config", str(config), as_nobody=True)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"cannot write history store {store} ([Errno 13] Permission denied: '{lock}')" in done.stderr
    assert f"write access to {shared_folder}" in done.stderr


def test_a_store_folder_that_cannot_be_written_is_not_called_a_foreign_file(shared_folder):
    """Its -wal cannot be made: SQLite says "attempt to write a readonly database", which was
    worded as "not an SQLite database … Move it away" about a healthy store."""
    store, config = real_store(shared_folder)
    store.chmod(0o666)  # the file writable by anyone, its folder (root's, 0755) not
    done = runhealth("collect", "--config", str(config), as_nobody=True)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "not an SQLite database" not in done.stderr and "Move it away" not in done.stderr
    assert f"cannot write history store {store} (attempt to write a readonly database)" in done.stderr
    assert f"write access to {shared_folder}" in done.stderr
