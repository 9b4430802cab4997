"""The run's length counts (store table run_length_counts, migration 11, #34 item 1): kept by
triggers on node_length_counts, so they always equal the per-node rows summed, whoever writes
them (polls, resets, a direct INSERT, UPDATE or DELETE); and a read of the run's counts costs the
run's distinct lengths, not nodes x lengths (the covering index it replaces made every poll
rewrite a page per length, and every read walk every node's rows)."""

from __future__ import annotations

import sqlite3

from store_fixtures import write_reply

from runhealth.store import Store
from runhealth.store.migrations import MIGRATIONS, migrate
from tests.test_store import entry, reply

GROUPED = (
    "SELECT tokens, finish_reason, estimated, SUM(count) AS count FROM node_length_counts"
    " GROUP BY tokens, finish_reason, estimated ORDER BY tokens, finish_reason, estimated"
)


def _run_table(store: Store) -> list[tuple]:
    return [tuple(r) for r in store.cursor("SELECT tokens, finish_reason, estimated, count FROM run_length_counts")]


def _grouped(store: Store) -> list[tuple]:
    return [tuple(r) for r in store.cursor(GROUPED)]


def test_run_counts_equal_the_node_rows_summed_through_every_write(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    first = {"/a": entry(100, [[5, "stop", 0, 4], [9, "length", 0, 1]]), "/b": entry(50, [[5, "stop", 0, 2]])}
    write_reply(store, "n1", reply(first), 1.0, 1.0)
    write_reply(store, "n2", reply({"/a": entry(70, [[5, "stop", 0, 7], [7, None, 1, 3]])}), 1.0, 1.0)
    assert _run_table(store) == _grouped(store) == [(5, "stop", 0, 13), (7, "", 1, 3), (9, "length", 0, 1)]
    write_reply(store, "n1", reply({"/a": entry(30, [[5, "stop", 0, 1]], inode=2, reset=True)}), 2.0, 1.0)
    write_reply(store, "n2", reply({"/a": entry(90, [[11, "stop", 0, 2]], offset_from=70)}), 2.0, 1.0)
    assert _run_table(store) == _grouped(store) == [(5, "stop", 0, 10), (7, "", 1, 3), (11, "stop", 0, 2)]
    with store.transaction() as db:  # writers other than a poll: a test's rows, a key changed, a node dropped
        db.execute("INSERT INTO node_length_counts VALUES ('n3', 9, 'length', 0, 4)")
        db.execute("UPDATE node_length_counts SET tokens = 12 WHERE node = 'n2' AND tokens = 11")
        db.execute("DELETE FROM node_length_counts WHERE node = 'n1'")
    expected = [(5, "stop", 0, 7), (7, "", 1, 3), (9, "length", 0, 4), (12, "stop", 0, 2)]
    assert _run_table(store) == _grouped(store) == expected
    rows = store.length_counts(by="run")
    assert [(r["tokens"], r["finish_reason"], r["estimated"], r["count"]) for r in rows] == [
        (5, "stop", 0, 7),
        (7, None, 1, 3),
        (9, "length", 0, 4),
        (12, "stop", 0, 2),
    ]
    assert [r["tokens"] for r in store.length_counts(by="run", finish_reason="length")] == [9]


def test_an_older_store_gets_its_run_counts_built_once(tmp_path):
    path = tmp_path / "old.sqlite3"
    store = Store(path)
    write_reply(store, "n1", reply({"/a": entry(100, [[5, "stop", 0, 4], [9, "length", 0, 1]])}), 1.0, 1.0)
    write_reply(store, "n2", reply({"/a": entry(100, [[5, "stop", 0, 2]])}), 1.0, 1.0)
    store.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DROP TABLE run_length_counts")  # as a store of version 9 has it
    for name in ("insert", "count", "key", "delete"):
        db.execute(f"DROP TRIGGER IF EXISTS run_length_counts_{name}")
    db.execute("PRAGMA user_version = 9")
    assert migrate(db, path) == MIGRATIONS[-1].version
    assert [tuple(r) for r in db.execute("SELECT * FROM run_length_counts")] == [(5, "stop", 0, 6), (9, "length", 0, 1)]
    assert db.execute("SELECT COUNT(*) FROM sqlite_schema WHERE name = 'node_length_counts_by_tokens'").fetchone() == (
        0,
    )
    db.close()


def _read_steps(store: Store) -> int:
    steps = [0]
    db = store._db()
    db.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1), 100)
    try:
        rows = store.length_counts(by="run")
    finally:
        db.set_progress_handler(None, 0)
    assert sum(r["count"] for r in rows) > 0
    return steps[0]


def test_reading_the_run_counts_costs_its_lengths_not_its_nodes(tmp_path):
    """On main the read walked every node's rows (the covering index): 40 nodes cost ~20x 2 nodes."""
    found = {}
    for nodes in (2, 40):
        store = Store(tmp_path / f"{nodes}.sqlite3")
        for i in range(nodes):
            counts = [[t, "stop", 0, 1 + (t + i) % 3] for t in range(100, 400)]
            write_reply(store, f"n{i}", reply({"/a": entry(10**6, counts)}), 1.0, 1.0)
        found[nodes] = _read_steps(store)
        store.close()
    assert found[40] <= 1.5 * found[2] + 10, found
