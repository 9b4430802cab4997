"""The length counts' aggregates the store's triggers keep (store migration 15, #42 item 3:
runhealth/store/lengthgroups.py): node_length_groups and shard_length_totals equal a GROUP BY over
the raw rows after any sequence of writes (polls, resets, a test's own INSERT / UPDATE / DELETE,
a node or shard renamed in place, the bounds changed), a /metrics scrape served from them is byte
for byte the one the full scan gave, and a store of version 14 gets them built from its counts."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

import pytest
from store_fixtures import write_reply

from runhealth.alerting import countgroups, exporter
from runhealth.analysis import stats
from runhealth.records import LENGTH
from runhealth.store import Store, lengthgroups
from runhealth.store.migrations import MIGRATIONS, migrate
from tests.test_store import entry, reply

TOKENS = (0, 1, 63, 64, 65, 255, 256, 257, 1000, 2047, 2048, 2049, 4095, 4096, 4097, 9000)
REASONS = ("stop", "length", None, "eos", "weird")


def _groups_wanted(db: sqlite3.Connection) -> list[tuple]:
    """node_length_groups as it must be: the raw rows grouped in Python, each row's bucket the
    number of stored bounds below its length."""
    splits = [r[0] for r in db.execute("SELECT bound FROM length_splits")]
    out: dict[tuple, list[int]] = {}
    for node, tokens, reason, est, count in db.execute("SELECT * FROM node_length_counts"):
        got = out.setdefault((node, reason, est, sum(1 for b in splits if b < tokens)), [0, 0, 0])
        got[0], got[1], got[2] = got[0] + 1, got[1] + count, got[2] + tokens * count
    return sorted((*k, *v) for k, v in out.items())


def _shards_wanted(db: sqlite3.Connection) -> list[tuple]:
    out: dict[tuple, list[int]] = {}
    for node, path, _tokens, _reason, est, count in db.execute("SELECT * FROM length_counts"):
        got = out.setdefault((node, path, est), [0, 0])
        got[0], got[1] = got[0] + 1, got[1] + count
    return sorted((*k, *v) for k, v in out.items())


def _assert_exact(db: sqlite3.Connection) -> None:
    assert sorted(tuple(r) for r in db.execute("SELECT * FROM node_length_groups")) == _groups_wanted(db)
    assert sorted(tuple(r) for r in db.execute("SELECT * FROM shard_length_totals")) == _shards_wanted(db)


def _random_counts(rng: random.Random) -> list[list]:
    return [[rng.choice(TOKENS), rng.choice(REASONS), rng.randint(0, 1), rng.randint(1, 5)] for _ in range(6)]


def _step(store: Store, rng: random.Random, offsets: dict[tuple[str, str], int], k: int) -> None:
    """One random write, of the kinds that change the counts."""
    node, path = rng.choice(("n1", "n2", "n3")), rng.choice(("/a", "/b"))
    kind = rng.choice(("poll", "poll", "poll", "reset", "insert", "count", "key", "rename", "delete", "bounds"))
    if kind in ("poll", "reset"):
        reset = kind == "reset" and (node, path) in offsets
        start = 0 if reset else offsets.get((node, path), 0)
        offsets[(node, path)] = start + 100
        files = {path: entry(start + 100, _random_counts(rng), inode=k if reset else 1, reset=reset, offset_from=start)}
        write_reply(store, node, reply(files), float(k), 1.0)
        return
    if kind == "bounds":  # a new ceiling: the groups bucketed again (and again through the triggers after)
        ceiling = rng.choice((None, 18, 2048, 4096))
        lengthgroups.cover(store, countgroups.splits_for(exporter.length_buckets(ceiling), ceiling))
        return
    with store.transaction() as db:
        if kind == "insert":  # a row no poll wrote this way (both tables, as the fixtures do)
            t, r, e, n = _random_counts(rng)[0]
            db.execute("INSERT OR IGNORE INTO node_length_counts VALUES (?,?,?,?,?)", (node, t, r or "", e, n))
            db.execute("INSERT OR IGNORE INTO length_counts VALUES (?,?,?,?,?,?)", (node, path, t, r or "", e, n))
        elif kind == "count":  # some counts grow, some fall to 0 or below (left in place)
            delta = rng.choice((-6, -1, 2, 7))
            db.execute(
                "UPDATE node_length_counts SET count = count + ? WHERE node = ? AND tokens % 2 = ?",
                (delta, node, k % 2),
            )
            db.execute("UPDATE length_counts SET count = count + ? WHERE path = ? AND tokens % 3 = 0", (delta, path))
        elif kind == "key":  # a length, a reason or the estimated flag changed in place
            t = rng.choice(TOKENS)
            db.execute("UPDATE OR IGNORE node_length_counts SET tokens = ? WHERE node = ? AND tokens < ?", (t, node, t))
            db.execute("UPDATE OR IGNORE node_length_counts SET finish_reason = 'stop' WHERE finish_reason = 'weird'")
            db.execute(
                "UPDATE OR IGNORE length_counts SET estimated = 1 - estimated WHERE node = ? AND tokens > ?", (node, t)
            )
        elif kind == "rename":  # a node or a shard renamed in place
            new = rng.choice(("n1", "n2", "n3", "n4"))
            db.execute("UPDATE OR IGNORE node_length_counts SET node = ? WHERE node = ?", (new, node))
            db.execute(
                "UPDATE OR IGNORE length_counts SET path = ? WHERE node = ? AND path = ?", (path + "x", node, path)
            )
        else:
            db.execute("DELETE FROM node_length_counts WHERE node = ? AND (tokens > 1000 OR count <= 0)", (node,))
            db.execute("DELETE FROM length_counts WHERE node = ? AND path = ?", (node, path))


@pytest.mark.parametrize("seed", range(6))
def test_the_aggregates_equal_the_rows_grouped_after_any_writes(tmp_path, seed):
    rng = random.Random(seed)
    store = Store(tmp_path / "s.sqlite3")
    lengthgroups.cover(store, [64, 4095, 4096])
    offsets: dict[tuple[str, str], int] = {}
    for k in range(1, 41):
        _step(store, rng, offsets, k)
        _assert_exact(store._db())
    assert store.cursor("SELECT COUNT(*) FROM node_length_groups").fetchone()[0] > 0
    store.close()


def test_the_bounds_grow_then_start_again_past_the_cap(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    write_reply(store, "n1", reply({"/a": entry(100, [[t, "stop", 0, 1] for t in TOKENS])}), 1.0, 1.0)
    assert lengthgroups.cover(store, [100, 200]) is True
    assert lengthgroups.cover(store, [200]) is False  # already there: nothing rebuilt
    assert lengthgroups.cover(store, [300]) is True
    assert [r[0] for r in store.cursor(lengthgroups.SPLITS_SQL)] == [
        100,
        200,
        300,
    ]  # grown, a ceiling back finds its own
    many = list(range(1000, 1000 + lengthgroups.MAX_SPLITS))
    assert lengthgroups.cover(store, many) is True
    assert [r[0] for r in store.cursor(lengthgroups.SPLITS_SQL)] == many
    _assert_exact(store._db())
    store.close()


# -- a scrape served from the groups is the full scan's, byte for byte --------------------------
def _old_read(store: Store, bounds, ceiling) -> list[countgroups.Group]:
    """countgroups.read as it was before the store kept the groups (main e2c40b8), the reference."""
    where, gone = store.counted_where()
    whens = " ".join(f"WHEN tokens <= {int(b)} THEN {i}" for i, b in enumerate(bounds))
    bucket = f"CASE {whens} ELSE {len(bounds)} END" if bounds else "0"
    sql = (
        f"SELECT node, finish_reason, estimated, {bucket}, {stats.cut_sql(ceiling)}, SUM(count), SUM(tokens * count)"
        f" FROM node_length_counts NOT INDEXED{where} GROUP BY 1, 2, 3, 4, 5"
    )
    return [countgroups.Group(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6]) for r in store.cursor(sql, gone)]


def _old_ceiling(self, settings):
    """StoreMetrics._ceiling before (main e2c40b8): its probes over node_length_counts."""
    where, gone = self.store.counted_where()
    exact = self.store.query(f"SELECT EXISTS (SELECT 1 FROM node_length_counts{where} AND estimated = 0) AS e", gone)
    some = self.store.query(f"SELECT 1 FROM node_length_counts{where} LIMIT 1", gone)
    estimated = 0 if exact[0]["e"] or not some else 1
    if settings.max_output_tokens:
        return settings.max_output_tokens, estimated
    rows = self.store.length_counts(by="run", finish_reason=LENGTH)
    hist = stats.LengthHist.from_rows((r["tokens"], r["finish_reason"], r["estimated"], r["count"]) for r in rows)
    return stats.detect_ceiling(hist), estimated


def _reference_text(store: Store, now: float, monkeypatch) -> bytes:
    with monkeypatch.context() as m:
        m.setattr(countgroups, "read", _old_read)
        m.setattr(exporter.StoreMetrics, "_ceiling", _old_ceiling)
        return exporter.scrape_text(store, clock=lambda: now)


def _mixed_rows(nodes=("a", "b", "c", "old-c"), scale: int = 1) -> list[tuple]:
    """Exact and estimated lengths around every bound, length stops at and below the ceilings,
    rows without a finish reason, unknown reasons (more than a scrape names)."""
    rows = []
    for i, node in enumerate(nodes):
        for t in (1, 63, 64, 65, 255, 1000, 1535, 2047, 2048, 2049, 3839, 4000, 4095, 4096, 4097, 5000):
            rows += [(node, t, "stop", 0, scale * (3 + i)), (node, t, "length", t % 2, 1 + t % 7)]
            rows += [(node, t, "", 1, 2), (node, t, f"weird-{t % 5}-{i % 2}", t % 2, 1 + i), (node, t, "eos", 0, 1)]
        rows.append((node, 4096, "length", 0, scale * 40))  # the pile a detected ceiling finds
    summed: dict[tuple, int] = {}
    for *key, n in rows:
        summed[tuple(key)] = summed.get(tuple(key), 0) + n
    return [(*k, n) for k, n in summed.items()]


def _mixed_store(path: Path) -> Store:
    store = Store(path)
    with store.transaction() as db:
        db.executemany("INSERT INTO node_length_counts VALUES (?,?,?,?,?)", _mixed_rows())
        db.executemany("INSERT INTO shards (node, path) VALUES (?, ?)", [(n, "/x/1.jsonl") for n in ("c", "old-c")])
    for node in ("a", "b", "c", "old-c"):  # c reads the files old-c read: old-c was renamed c
        store.register_node(node, {"name": node, "host": f"host-{node[-1]}", "shards": ["/x/*.jsonl"]})
    return store


def _set_ceiling(store: Store, ceiling: int | None) -> None:
    store.set_meta("run", {"name": "mixed", "nodes": ["a", "b", "c"], "interval_s": 10, "max_output_tokens": ceiling})


def test_the_exposition_is_the_full_scans_byte_for_byte(tmp_path, monkeypatch):
    """Ceilings configured, changed, detected and back, counts written between scrapes (through
    the triggers, after the groups were bucketed), a renamed node left out: every scrape is the
    old code's text exactly, and reads no row of node_length_counts once bucketed."""
    now = time.time()
    store = _mixed_store(tmp_path / "mixed.sqlite3")
    texts = []
    for k, ceiling in enumerate((4096, 2048, None, 4096, 18, 1, None)):
        _set_ceiling(store, ceiling)
        assert store.superseded_nodes() == {"old-c": "c"}
        got = exporter.scrape_text(store, clock=lambda: now)
        assert got == _reference_text(store, now, monkeypatch), ceiling
        seen: list[str] = []
        store._db().set_trace_callback(seen.append)
        again = exporter.scrape_text(store, clock=lambda: now)
        store._db().set_trace_callback(None)
        assert again == got
        # No count row read, but the renamed node's own (its key: the run's counts less them) and
        # the length stops (their partial index).
        read = [s for s in seen if "FROM node_length_counts" in s and "INDEXED BY" not in s]
        assert not [s for s in read if "FROM node_length_counts WHERE node IN (" not in s], ceiling
        texts.append(got)
        with store.transaction() as db:  # more counts, through the triggers over the bucketed groups
            db.executemany(
                "INSERT INTO node_length_counts VALUES (?,?,?,?,?) ON CONFLICT (node, tokens, finish_reason, estimated)"
                " DO UPDATE SET count = count + excluded.count",
                _mixed_rows(("a", "c", "old-c", f"new-{k}"), scale=k + 1),
            )
            db.execute("DELETE FROM node_length_counts WHERE node = 'b' AND tokens = ?", (TOKENS[k],))
    assert b'runhealth_completions_at_ceiling_total{node="a",run="mixed"}' in texts[0]
    assert b'node="old-c"' not in texts[0]  # the renamed node's old name left out, as before
    assert b"runhealth_ceiling_tokens" in texts[2]  # detected
    assert len(set(texts)) == len(texts)
    store.close()


def test_a_store_it_cannot_write_is_read_from_every_count(tmp_path, monkeypatch):
    """The groups' bounds cannot be changed (read-only file, locked past the busy timeout): the
    scrape reads every count as before, the same text."""
    now = time.time()
    store = _mixed_store(tmp_path / "mixed.sqlite3")
    _set_ceiling(store, 4096)

    def refused(*_a, **_k):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(lengthgroups, "cover", refused)
    seen: list[str] = []
    store._db().set_trace_callback(seen.append)
    got = exporter.scrape_text(store, clock=lambda: now)
    store._db().set_trace_callback(None)
    assert [s for s in seen if "FROM node_length_counts NOT INDEXED" in s]  # the scan served it
    assert got == _reference_text(store, now, monkeypatch)
    store.close()


# -- the page data's group tables --------------------------------------------------------------
def test_the_group_tables_reads_equal_the_old_statements(tmp_path):
    """Store.group_totals from the aggregates and the length stops through their partial index:
    the rows, values and order the old statements over every count gave (main e2c40b8)."""
    store = _mixed_store(tmp_path / "mixed.sqlite3")
    _set_ceiling(store, None)
    with store.transaction() as db:
        for i, (node, t, r, e, n) in enumerate(_mixed_rows(("c", "a", "old-c"))):
            db.execute(
                "INSERT OR IGNORE INTO length_counts VALUES (?,?,?,?,?,?)", (node, f"/x/{i % 3}.jsonl", t, r, e, n)
            )
    where, gone = store.counted_where()
    assert gone == ("old-c",)
    for by, table, keys in (("node", "node_length_counts", "node"), ("shard", "length_counts", "node, path")):
        old = store.query(
            f"SELECT {keys}, SUM(count) AS completions, SUM(CASE WHEN estimated = 0 THEN count ELSE 0 END)"
            f" AS exact FROM {table} NOT INDEXED{where} GROUP BY {keys} ORDER BY {keys}",
            gone,
        )
        assert store.group_totals(by) == old and old
        stops = store.query(
            f"SELECT {keys}, tokens, finish_reason, estimated, count FROM {table} NOT INDEXED{where} AND finish_reason = ?",
            (*gone, LENGTH),
        )
        got = store.length_counts(by=by, finish_reason=LENGTH)
        assert [tuple(r.values()) for r in got] == [tuple(r.values()) for r in stops] and stops
    store.close()


# -- a store of version 14 ----------------------------------------------------------------------
def test_a_version_14_store_gets_its_aggregates_built_from_its_counts(tmp_path, monkeypatch):
    path = tmp_path / "v14.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    assert migrate(db, path, MIGRATIONS[:14]) == 14
    db.executemany("INSERT INTO node_length_counts VALUES (?,?,?,?,?)", _mixed_rows())
    db.executemany(
        "INSERT INTO length_counts VALUES (?,?,?,?,?,?)",
        [(n, f"/x/{t % 2}.jsonl", t, r, e, c) for n, t, r, e, c in _mixed_rows()],
    )
    assert migrate(db, path) == MIGRATIONS[-1].version >= 15
    _assert_exact(db)
    assert db.execute("SELECT COUNT(*) FROM length_splits").fetchone() == (0,)
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_schema WHERE type = 'index'")}
    assert {"node_length_counts_length", "length_counts_length"} <= indexes
    assert not {"node_length_counts_totals", "length_counts_totals"} & indexes  # the triggers' tables replace them
    db.close()
    store = Store(path)
    with store.transaction() as w:
        w.executemany("INSERT INTO shards (node, path) VALUES (?, ?)", [(n, "/x/1.jsonl") for n in ("c", "old-c")])
    for node in ("a", "b", "c", "old-c"):
        store.register_node(node, {"name": node, "host": f"host-{node[-1]}", "shards": ["/x/*.jsonl"]})
    _set_ceiling(store, 2048)
    now = time.time()
    assert exporter.scrape_text(store, clock=lambda: now) == _reference_text(store, now, monkeypatch)
    _assert_exact(store._db())
    store.close()


class _Steps:
    """SQLite's VM steps (in hundreds) of the new read and of the old statement."""

    def __init__(self) -> None:
        self.counted = [0, 0]

    def new(self) -> None:
        self.counted[0] += 1

    def old(self) -> None:
        self.counted[1] += 1


def test_the_runs_counts_less_a_renamed_node_are_the_old_group_by(tmp_path):
    """With a renamed node's old name in the store, the run's counts are run_length_counts less that
    node's rows (read by its key), not a GROUP BY over every node's rows: the same rows in the same
    order, at a fraction of the steps (on main every scrape and refresh ran that GROUP BY)."""
    store = _mixed_store(tmp_path / "mixed.sqlite3")
    _set_ceiling(store, None)
    with store.transaction() as db:  # more nodes, so the old statement's cost shows
        db.executemany("INSERT INTO node_length_counts VALUES (?,?,?,?,?)", _mixed_rows([f"m{i}" for i in range(30)]))
    where, gone = store.counted_where()
    assert gone == ("old-c",)
    for reason in (None, LENGTH, "stop", "eos"):
        and_reason = " AND finish_reason = ?" if reason else ""
        old_sql = (
            f"SELECT tokens, finish_reason, estimated, SUM(count) AS count FROM node_length_counts NOT INDEXED{where}"
            f"{and_reason} GROUP BY tokens, finish_reason, estimated"
        )
        old = [(r[0], r[1] or None, r[2], r[3]) for r in store.cursor(old_sql, (*gone, *([reason] if reason else [])))]
        steps = _Steps()
        store._db().set_progress_handler(steps.new, 100)
        got = store.length_counts(by="run", finish_reason=reason)
        store._db().set_progress_handler(steps.old, 100)
        store.cursor(old_sql, (*gone, *([reason] if reason else []))).fetchall()
        store._db().set_progress_handler(None, 0)
        assert [(r["tokens"], r["finish_reason"], r["estimated"], r["count"]) for r in got] == old and old
        assert steps.counted[0] * 4 < steps.counted[1], (
            reason,
            steps.counted,
        )  # a fraction of the GROUP BY over every node
    store.close()
