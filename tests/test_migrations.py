"""Store migrations: an older store opens and upgrades, a newer one is refused, a failed step changes nothing."""

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from store_fixtures import write_reply

from runhealth.alerting import notify
from runhealth.errors import StoreError
from runhealth.store import Store, migrations, rollup, storefile
from runhealth.store.migrations import MIGRATIONS, STORE_VERSION, Migration, migrate
from tests.test_store import entry, reply, run_counts

EARLY_SCHEMA = (Path(__file__).parent / "fixtures" / "stores" / "early_schema.sql").read_text()


def raw(path):
    return sqlite3.connect(path, isolation_level=None)


def version(path):
    with raw(path) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


def early_store(path):
    """A store written by an early runhealth: its DDL, a meta schema_version row, counts and samples."""
    db = raw(path)
    db.executescript(EARLY_SCHEMA)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('run', '{\"name\": \"old\"}')")
    db.execute("INSERT INTO shards (node, path, inode, offset, size, lines) VALUES ('n1', '/a', 7, 300, 300, 5)")
    db.executemany(
        "INSERT INTO length_counts VALUES (?, ?, ?, ?, ?, ?)",
        [
            ("n1", "/a", 4096, "length", 0, 2),
            ("n1", "/a", 10, "stop", 0, 1),
            ("n1", "/b", 4096, "length", 0, 3),
            ("n2", "/c", 12, "", 0, 4),
        ],
    )
    db.executemany(
        "INSERT INTO metric_samples VALUES (?, ?, ?, ?)",
        [(100.0, "n1", "vllm:x", 1.0), (200.0, "n1", "vllm:x", 2.0), (150.0, "n1", "vllm:y", 5.0)],
    )
    db.close()
    assert version(path) == 0


def test_a_new_store_starts_at_the_newest_version(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    assert version(store.path) == STORE_VERSION == MIGRATIONS[-1].version
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))  # ordered, no gaps
    assert store.meta("schema_version") is None  # the old unread meta row is gone for good


def test_a_new_file_opened_by_several_connections_at_once_opens_for_each(tmp_path):
    """The dashboard's reader and its in-process collector open a new store together (CI saw the
    collector refused "database is locked": both left rollback mode at once, and SQLite answers
    one of them at once, without waiting). 6 of 100 pairs failed before the WAL switch waited."""
    for i in range(25):
        path, errors = tmp_path / f"s{i}.sqlite3", []

        def open_it(path=path, errors=errors):
            try:
                Store(path).close()
            except StoreError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=open_it) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert version(path) == STORE_VERSION


def test_a_store_read_torn_while_another_connection_writes_it_is_read_again(tmp_path):
    """The check before opening reads the file's own bytes with no lock (SQLite's immutable mode): a
    file another connection is checkpointing into that instant reads torn, as "damaged" (the
    several-connections test above saw it once in 1,500 new stores). While the file is in use (a
    log beside it) the check reads again, and the store opens once whole; a torn file nobody
    writes is still refused, at once."""
    path = tmp_path / "s.sqlite3"
    Store(path).close()
    whole = path.read_bytes()
    page = 4096
    torn = whole[:page] + bytes(len(whole) - page)  # the schema's root page written, the pages it names not yet
    assert len(whole) > 2 * page
    path.write_bytes(torn)
    with pytest.raises(StoreError, match="is damaged"):
        storefile.precheck(path)  # nobody writes it: refused
    Path(f"{path}-wal").write_bytes(b"")  # a WAL-mode writer's log beside it

    def checkpoint_done():
        path.write_bytes(whole)
        Path(f"{path}-wal").unlink()

    timer = threading.Timer(0.3, checkpoint_done)
    timer.start()
    try:
        storefile.precheck(path)
    finally:
        timer.join()
    assert version(path) == STORE_VERSION
    Store(path).close()


def test_a_damaged_file_in_use_is_read_six_times_over_a_second_and_a_half_then_refused(tmp_path, monkeypatch):
    """The re-reads of a file in use are bounded: PRECHECK_RETRY_WAITS_S between six reads (1.55 s
    of waiting), then the refusal; never a loop on a file that stays damaged."""
    path = tmp_path / "s.sqlite3"
    Store(path).close()
    whole = path.read_bytes()
    path.write_bytes(whole[:4096] + bytes(len(whole) - 4096))
    Path(f"{path}-wal").write_bytes(b"")  # in use, by the look of it, and never made whole
    reads, real = [], storefile.check_is_store

    def counted(db, p):
        reads.append(time.monotonic())
        real(db, p)

    monkeypatch.setattr(storefile, "check_is_store", counted)
    start = time.monotonic()
    with pytest.raises(StoreError, match="is damaged"):
        storefile.precheck(path)
    assert len(reads) == len(storefile.PRECHECK_RETRY_WAITS_S) + 1 == 6
    gaps = [b - a for a, b in zip(reads, reads[1:], strict=False)]
    assert all(g >= w for g, w in zip(gaps, storefile.PRECHECK_RETRY_WAITS_S, strict=True)), gaps
    assert 1.55 <= time.monotonic() - start < 5, gaps


def test_an_early_store_opens_and_is_upgraded(tmp_path):
    path = tmp_path / "old.sqlite3"
    early_store(path)
    store = Store(path)
    assert version(path) == STORE_VERSION
    # Derived tables built from what was there; added columns present with their defaults.
    assert run_counts(store) == {(4096, "length", 0): 5, (10, "stop", 0): 1, (12, None, 0): 4}
    assert [(m["node"], m["name"], m["value"]) for m in store.metric_latest()] == [
        ("n1", "vllm:x", 2.0),
        ("n1", "vllm:y", 5.0),
    ]
    with raw(path) as db:
        assert db.execute("SELECT blank_lines FROM shards").fetchall() == [(0,)]
        assert db.execute("SELECT COUNT(*) FROM meta WHERE key = 'schema_version'").fetchone()[0] == 0
    assert store.meta("run") == {"name": "old"}
    # ... and it is written to like any store, resuming from the stored offset.
    assert store.shard_state("n1") == {"/a": {"inode": 7, "offset": 300}}
    write_reply(store, "n1", reply({"/a": entry(400, [[10, "stop", 0, 2]], inode=7, offset_from=300)}), 1.0, 1.0)
    assert run_counts(store)[(10, "stop", 0)] == 3
    store.close()
    assert run_counts(Store(path))[(10, "stop", 0)] == 3  # reopening migrates nothing twice


def test_a_store_with_todays_tables_but_no_version_is_recognised_as_version_1(tmp_path):
    path = tmp_path / "v0.sqlite3"
    store = Store(path)
    write_reply(store, "n1", reply({"/a": entry(100, [[4096, "length", 0, 2]])}), 1.0, 1.0)
    store.record_metrics("n1", {"vllm:x": 1.0}, 100.0)
    store.close()
    with raw(path) as db:
        db.execute("PRAGMA user_version = 0")  # what every store written before versions carries
    store = Store(path)
    assert version(path) == STORE_VERSION  # recognised as version 1, then upgraded
    assert run_counts(store) == {(4096, "length", 0): 2}  # node totals not built a second time
    assert [m["value"] for m in store.metric_latest()] == [1.0]


def test_a_newer_store_is_refused_and_not_migrated(tmp_path):
    path = tmp_path / "new.sqlite3"
    Store(path).close()
    with raw(path) as db:
        db.execute(f"PRAGMA user_version = {STORE_VERSION + 5}")
        db.execute("CREATE TABLE from_the_future (x)")
    with pytest.raises(StoreError) as info:
        Store(path)
    message = str(info.value)
    assert str(path) in message and f"version {STORE_VERSION + 5}" in message
    assert f"({STORE_VERSION})" in message and "Upgrade runhealth" in message and "store_path" in message
    assert version(path) == STORE_VERSION + 5


def test_another_programs_database_is_refused_untouched(tmp_path):
    path = tmp_path / "app.db"
    with raw(path) as db:
        db.execute("CREATE TABLE customers (name TEXT)")
        db.execute("INSERT INTO customers VALUES ('ada')")
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreError) as info:
        Store(path)
    message = str(info.value)
    assert str(path) in message and "not a runhealth store" in message and "customers" in message
    assert "store_path" in message
    assert path.read_bytes() == before  # not even switched to WAL
    assert not (tmp_path / "app.db-wal").exists()


def test_a_newer_store_in_rollback_journal_mode_is_left_byte_for_byte(tmp_path):
    path = tmp_path / "new.sqlite3"
    Store(path).close()
    with raw(path) as db:
        db.execute("PRAGMA journal_mode=DELETE")  # as a copy made with the sqlite3 shell's .backup is
        db.execute(f"PRAGMA user_version = {STORE_VERSION + 5}")
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer than this runhealth"):
        Store(path)
    assert path.read_bytes() == before  # not even switched to WAL


def test_a_damaged_file_is_refused_untouched(tmp_path):
    path = tmp_path / "s.sqlite3"
    path.write_bytes(b"this is a config file, not a database\n" * 200)
    before = path.read_bytes()
    with pytest.raises(StoreError) as info:
        Store(path)
    message = str(info.value)
    assert str(path) in message and "not an SQLite database" in message and "store_path" in message
    assert path.read_bytes() == before


def test_an_empty_file_becomes_a_store(tmp_path):
    path = tmp_path / "s.sqlite3"
    path.write_bytes(b"")
    Store(path).close()
    assert version(path) == STORE_VERSION


def test_a_failed_migration_leaves_the_store_at_its_old_version(tmp_path):
    path = tmp_path / "s.sqlite3"
    Store(path).close()

    def broken(db):
        db.execute("CREATE TABLE half_done (x)")
        db.execute("ALTER TABLE shards ADD COLUMN extra INTEGER")
        db.execute("INSERT INTO no_such_table VALUES (1)")  # fails after two changes

    steps = (*MIGRATIONS, Migration(STORE_VERSION + 1, "a broken step: for the test", broken))
    db = raw(path)
    with pytest.raises(StoreError, match=f"migration to version {STORE_VERSION + 1}.*stays at version {STORE_VERSION}"):
        migrate(db, path, steps)
    assert not db.in_transaction
    assert db.execute("PRAGMA user_version").fetchone()[0] == STORE_VERSION
    assert db.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'half_done'").fetchone()[0] == 0
    assert "extra" not in {r[1] for r in db.execute("PRAGMA table_info(shards)")}

    def interrupted(db):
        db.execute("CREATE TABLE half_done (x)")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate(db, path, (*MIGRATIONS, Migration(STORE_VERSION + 1, "interrupted", interrupted)))
    assert db.execute("PRAGMA user_version").fetchone()[0] == STORE_VERSION
    assert db.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'half_done'").fetchone()[0] == 0


def test_steps_run_in_order_once_each(tmp_path):
    path = tmp_path / "s.sqlite3"
    ran = []
    steps = (
        *MIGRATIONS,
        Migration(STORE_VERSION + 1, "two", lambda db: ran.append(2) or db.execute("CREATE TABLE t2 (x)")),
        Migration(STORE_VERSION + 2, "three", lambda db: ran.append(3) or db.execute("ALTER TABLE t2 ADD y")),
    )
    db = raw(path)
    assert migrate(db, path, steps) == STORE_VERSION + 2
    assert migrate(db, path, steps) == STORE_VERSION + 2
    assert ran == [2, 3]
    assert {r[1] for r in db.execute("PRAGMA table_info(t2)")} == {"x", "y"}


def test_the_v1_statements_are_cut_correctly():
    # A comment in the schema holds a ';': cutting on ';' would break a statement in two.
    statements = migrations._statements(migrations._V1_SCHEMA)
    assert all(sqlite3.complete_statement(s) for s in statements)
    assert sum(s.count("CREATE TABLE") for s in statements) == len(statements) - sum(
        s.count("CREATE INDEX") for s in statements
    )


def _gpus(*indexes, error_at=None):
    """A poll's GPU section: a reading per index; `error_at` reports an error entry (no numbers)."""
    devices = [{"index": i, "util_pct": 90.0, "error": "GPU is lost" if i == error_at else None} for i in indexes]
    return {"source": "nvml", "error": None, "devices": devices}


def _distinct_seen(path, since):
    """The question gpus_seen answers, asked of the samples themselves (what it read before v3)."""
    with raw(path) as db:
        rows = db.execute("SELECT DISTINCT node, gpu FROM gpu_samples WHERE ts_unix >= ?", (since,)).fetchall()
    out = {}
    for node, gpu in rows:
        out.setdefault(node, set()).add(gpu)
    return out


def _polls(store):
    write_reply(store, "n1", reply({}, gpus=_gpus(0, 1, 2)), 100.0, 1.0)
    write_reply(store, "n2", reply({}, gpus=_gpus(0, 1)), 150.0, 1.0)
    write_reply(store, "n1", reply({}, gpus=_gpus(0, 1, 2, error_at=2)), 300.0, 1.0)  # GPU 2 lost: no sample
    write_reply(store, "n1", reply({}, gpus=_gpus(0)), 250.0, 1.0)  # a late reply must not move "last" back


def test_gpus_seen_answers_what_the_samples_say(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    _polls(store)
    for since in (0.0, 100.0, 101.0, 150.0, 151.0, 250.0, 300.0, 301.0):
        assert store.gpus_seen(since) == _distinct_seen(store.path, since), since
    assert store.gpus_seen(101.0) == {"n1": {0, 1}, "n2": {0, 1}}  # n1's GPU 2 last read at 100
    store.prune(keep_s=100, now_unix=260.0)  # samples before 160 go, and what they alone said
    with raw(store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM gpu_seen WHERE last_unix < 160").fetchone()[0] == 0
    assert store.gpus_seen(0.0) == _distinct_seen(store.path, 0.0) == {"n1": {0, 1}}


def test_a_version_2_store_gains_gpu_seen_built_from_its_samples(tmp_path):
    path = tmp_path / "v2.sqlite3"
    store = Store(path)
    _polls(store)
    store.close()
    with raw(path) as db:  # the store as version 2 wrote it: no gpu_seen table
        db.execute("DROP TABLE gpu_seen")
        db.execute("PRAGMA user_version = 2")
    store = Store(path)
    assert version(path) == STORE_VERSION >= 3
    for since in (0.0, 101.0, 151.0, 300.0):
        assert store.gpus_seen(since) == _distinct_seen(path, since), since
    write_reply(store, "n2", reply({}, gpus=_gpus(0, 1, 5)), 400.0, 1.0)  # and kept up from then on
    assert store.gpus_seen(301.0) == {"n2": {0, 1, 5}} == _distinct_seen(path, 301.0)


def test_a_version_3_store_gains_content_marks_and_its_shards_continue(tmp_path):
    """Issue 29 item 4: step 4 adds shards.mark and shards.replaced_unix. An upgraded store's
    rows keep their counts and offsets and have no mark, so the agent trusts inode and size for
    them as before (no reset of every shard after an upgrade)."""
    path = tmp_path / "v3.sqlite3"
    Store(path).close()
    db = raw(path)
    db.execute("ALTER TABLE shards DROP COLUMN mark")
    db.execute("ALTER TABLE shards DROP COLUMN replaced_unix")
    db.execute("INSERT INTO shards (node, path, inode, offset, size, lines) VALUES ('n1', '/a', 7, 900, 900, 9)")
    db.execute("PRAGMA user_version = 3")
    db.close()
    store = Store(path)
    assert version(path) == STORE_VERSION
    assert store.shard_state("n1") == {"/a": {"inode": 7, "offset": 900}}  # no mark: trusted as before
    (row,) = store.shards()
    assert (row["completions"], row["mark"], row["replaced_unix"]) == (9, None, None)


FIRST_USE_TABLES = ("length_hourly", "gpu_rollup", "poll_rollup", "metric_rollup", "webhook_deliveries")


def _tables(path):
    with raw(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_version_5_store_gains_the_tables_once_created_on_first_use(tmp_path):
    """Issue 31 item 2: the hourly lengths, rollups and webhook deliveries come with the store
    (step 6), so no write or read creates schema; a version 5 store without them gains them."""
    path = tmp_path / "v5.sqlite3"
    Store(path).close()
    with raw(path) as db:
        for table in FIRST_USE_TABLES:
            db.execute(f"DROP TABLE {table}")
        db.execute("PRAGMA user_version = 5")
    store = Store(path)
    assert version(path) == STORE_VERSION >= 6
    assert set(FIRST_USE_TABLES) <= _tables(path)
    assert store.cursor("SELECT COUNT(*) FROM length_hourly").fetchone()[0] == 0


def test_a_version_5_store_that_created_them_on_first_use_keeps_their_rows(tmp_path):
    """A store whose tables were created on first use (by the code of version 5, with these
    statements) migrates cleanly and keeps every row in them."""
    path = tmp_path / "v5-used.sqlite3"
    Store(path).close()
    first_use = {  # the statements rollup.py, notify.py and lengthtime.py ran before step 6
        "length_hourly": "(bucket_unix INTEGER NOT NULL, tokens INTEGER NOT NULL, by_length INTEGER NOT NULL,"
        " estimated INTEGER NOT NULL, backfill INTEGER NOT NULL, count INTEGER NOT NULL,"
        " PRIMARY KEY (bucket_unix, tokens, by_length, estimated, backfill)) WITHOUT ROWID",
        "gpu_rollup": "(res_s INTEGER NOT NULL, bucket_unix REAL NOT NULL, node TEXT NOT NULL, gpu INTEGER NOT NULL,"
        " n INTEGER NOT NULL, util_pct REAL, mem_used_mib REAL, mem_total_mib REAL, power_w REAL, power_limit_w REAL,"
        " temp_c REAL, sm_clock_mhz REAL, throttled INTEGER, PRIMARY KEY (res_s, bucket_unix, node, gpu)) WITHOUT ROWID",
        "poll_rollup": "(res_s INTEGER NOT NULL, bucket_unix REAL NOT NULL, node TEXT NOT NULL, polls INTEGER NOT NULL,"
        " completions INTEGER, tokens INTEGER, length_stops INTEGER, malformed INTEGER, backfill INTEGER,"
        " PRIMARY KEY (res_s, bucket_unix, node)) WITHOUT ROWID",
        "metric_rollup": "(res_s INTEGER NOT NULL, bucket_unix REAL NOT NULL, node TEXT NOT NULL, name TEXT NOT NULL,"
        " n INTEGER NOT NULL, value REAL, value_max REAL, PRIMARY KEY (res_s, bucket_unix, node, name)) WITHOUT ROWID",
        "webhook_deliveries": "(ts_unix REAL NOT NULL, target TEXT NOT NULL, alert TEXT, node TEXT, kind TEXT,"
        " ok INTEGER NOT NULL, attempts INTEGER NOT NULL, error TEXT)",
    }
    with raw(path) as db:
        for table, columns in first_use.items():
            db.execute(f"DROP TABLE {table}")
            db.execute(f"CREATE TABLE IF NOT EXISTS {table} {columns}")
        db.execute("INSERT INTO length_hourly VALUES (3600, 4096, 1, 0, 0, 7)")
        db.execute("INSERT INTO poll_rollup VALUES (60, 120.0, 'n1', 6, 60, 6000, 3, 0, 0)")
        db.execute(
            "INSERT INTO webhook_deliveries VALUES (1.0, 'https://x.example/…', 'stall', 'n1', 'start', 1, 1, NULL)"
        )
        db.execute("PRAGMA user_version = 5")
    store = Store(path)
    assert version(path) == STORE_VERSION >= 6
    assert store.query("SELECT bucket_unix, tokens, count FROM length_hourly") == [
        {"bucket_unix": 3600, "tokens": 4096, "count": 7}
    ]
    assert store.cursor("SELECT completions FROM poll_rollup").fetchone()[0] == 60
    assert [r["delivered"] for r in notify.delivery_status(store, 0)] == [1]
    assert rollup.has_rollups(store)


def test_no_module_creates_a_table_outside_the_migrations():
    """Every table is a migration step's: no CREATE TABLE in runhealth/ outside migrations.py."""
    root = Path(__file__).resolve().parent.parent / "runhealth"
    found = [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*.py"))
        if p.name != "migrations.py" and "CREATE TABLE" in p.read_text().upper()
    ]
    assert found == []


def test_a_version_9_store_gains_the_run_events_table_and_keeps_its_rows(tmp_path):
    """Issue 33 item 7: step 10 adds run_events (the charts' markers); a version 9 store's polls
    and settings stay, and the first collector to claim it writes its first event there."""
    path = tmp_path / "v9.sqlite3"
    store = Store(path)
    store.set_meta("run", {"name": "old", "nodes": ["n1"], "max_output_tokens": 4096})
    store.close()
    with raw(path) as db:
        db.execute("DROP TABLE run_events")
        db.execute("PRAGMA user_version = 9")
    assert "run_events" not in _tables(path)
    store = Store(path)
    assert version(path) == STORE_VERSION >= 10 and "run_events" in _tables(path)
    assert store.meta("run")["max_output_tokens"] == 4096
    assert store.cursor("SELECT COUNT(*) FROM run_events").fetchone()[0] == 0
    assert [m.description.split(":")[0] for m in MIGRATIONS if m.version == 10] == ["run_events"]
