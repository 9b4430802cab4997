"""runhealth/store/pollrows.py: the poll rows kept in memory are the rows one SELECT gives, always.

Each test changes the polls table the way the product (or an operator) can, then compares the
kept rows with the SELECT `activity.poll_rows` ran before they were kept, rows and node order.
"""

from __future__ import annotations

import json

import pytest

from runhealth.rules import activity
from runhealth.store import Store, pollrows, rollup

T0 = 1_800_000_000.0
SQL = (
    "SELECT node, ts_unix, node_ts_unix, completions, tokens, backfill, prompts, interval_s FROM polls"
    " WHERE ts_unix >= ? - (SELECT COALESCE(SUM(MAX(0, json_extract(s.value, '$[1]'))), 0)"
    " FROM json_each((SELECT value FROM meta WHERE key = 'clock_steps')) s"
    " WHERE json_extract(s.value, '$[0]') >= ?) ORDER BY rowid"
)


def direct(store: Store, now: float, lookback_s: float) -> dict[str, list[tuple]]:
    rows: dict[str, list[tuple]] = {}
    for node, *row in store.cursor(SQL, (now - lookback_s, now - lookback_s)):
        rows.setdefault(node, []).append(tuple(row))
    return rows


def same(store: Store, now: float, lookback_s: float) -> dict[str, list[tuple]]:
    got, want = activity.poll_rows(store, now, lookback_s), direct(store, now, lookback_s)
    assert got == want
    assert list(got) == list(want)  # the nodes' order: the rates sum in it
    return got


def same_buckets(store: Store, bucket_s: float, since: float) -> list:
    got = activity.token_buckets(store, bucket_s, since)
    want = [
        {"bucket_unix": b["bucket_unix"], "tokens": b["tokens"], "backfill": b["backfill"]}
        for b in store.polls_by_bucket(bucket_s, since_unix=since)
    ]
    assert got == want
    assert [tuple(map(type, b.values())) for b in got] == [tuple(map(type, b.values())) for b in want]
    return got


def add_polls(
    store: Store,
    start: float,
    n: int,
    nodes: tuple[str, ...] = ("a", "b", "c"),
    step_s: float = 10.0,
    tokens=lambda k, i: 900 + k,
    backfill=lambda k, i: 0,
):
    with store.transaction() as db:
        for k in range(n):
            for i, node in enumerate(nodes):
                ts = start + k * step_s + i * 0.01
                db.execute(
                    "INSERT INTO polls (ts_unix, node, node_ts_unix, completions, tokens, length_stops, malformed,"
                    " backfill, rtt_ms, prompts, interval_s) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (ts, node, ts + 0.5, 3 + k % 4, tokens(k, i), 0, 0, backfill(k, i), 20.0, None, step_s),
                )


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "s.sqlite3")
    yield s
    s.close()


def test_new_polls_are_read_on_from_the_last_rowid(store):
    add_polls(store, T0, 100)
    same(store, T0 + 1000, 600)
    kept = pollrows.of(store)
    reloads = kept.reloads
    add_polls(store, T0 + 1000, 5, nodes=("d", "a"))  # a new node too: it comes after the others
    got = same(store, T0 + 1050, 600)
    assert list(got)[-1] == "d"
    same(store, T0 + 1050, 300)  # a shorter lookback: a slice of what is kept
    assert kept.reloads == reloads  # both answered without reading the kept rows again


def test_a_longer_lookback_reads_further_back(store):
    add_polls(store, T0, 200)
    same(store, T0 + 2000, 300)
    same(store, T0 + 2000, 1500)


def test_rows_a_fold_deleted_leave_the_answer(store):
    add_polls(store, T0, 400)  # 4,000 s of polls
    same(store, T0 + 4000, 3900)
    rollup.rollup(store, now=T0 + 4000, raw_keep_s=1800)  # deletes the raw polls older than 30 min
    assert direct(store, T0 + 4000, 3900) != {}
    same(store, T0 + 4000, 3900)


def test_the_newest_rows_deleted_and_their_rowids_used_again(store):
    add_polls(store, T0, 10)
    same(store, T0 + 100, 1000)
    with store.transaction() as db:  # the top rows go; the next inserts take their rowids again
        db.execute("DELETE FROM polls WHERE rowid > (SELECT MAX(rowid) - 3 FROM polls)")
    add_polls(store, T0 + 50, 1, nodes=("x", "y", "z"))
    same(store, T0 + 100, 1000)


def test_a_clock_step_reads_the_polls_before_it(store):
    add_polls(store, T0, 100)
    same(store, T0 + 1000, 300)
    store.set_meta("clock_steps", [[T0 + 900, 200.0]])  # a forward step: the lookback reaches back by it
    same(store, T0 + 1000, 300)


def test_a_clock_stepped_back_keeps_poll_order(store):
    add_polls(store, T0, 20)
    add_polls(store, T0 - 500, 20)  # later polls with earlier times (the wall clock went back)
    same(store, T0 + 200, 800)
    add_polls(store, T0 + 200, 3)
    same(store, T0 + 230, 400)


def test_a_reader_in_an_older_snapshot_sees_its_own_rows(store, tmp_path):
    add_polls(store, T0, 10)
    other = Store(tmp_path / "s.sqlite3")  # another connection keeps writing meanwhile
    try:
        with store.snapshot():
            same(store, T0 + 100, 1000)
            add_polls(other, T0 + 100, 2)
            kept = pollrows.of(other)
            got = kept.read("?", (T0 - 900,))  # the same kept rows are per Store object: read the writer's too
            assert sum(map(len, got.values())) == 36
            same(store, T0 + 100, 1000)  # still 30 rows here
        same(store, T0 + 120, 1000)
    finally:
        other.close()


def test_a_replaced_file_is_read_afresh(store, tmp_path):
    add_polls(store, T0, 10)
    same(store, T0 + 100, 1000)
    other = Store(tmp_path / "other.sqlite3")  # as many polls at the same times, one node named apart
    add_polls(other, T0, 10, nodes=("q", "b", "c"))
    other.close()
    (tmp_path / "other.sqlite3").replace(store.path)
    store.check_file()
    assert same(store, T0 + 100, 1000).keys() == {"q", "b", "c"}


def test_nodes_come_in_the_order_of_their_first_row_read(store):
    add_polls(store, T0, 10, nodes=("z",))  # kept first, but outside the later read's window
    add_polls(store, T0 + 100, 50, nodes=("a", "b"))
    add_polls(store, T0 + 600, 1, nodes=("z",))
    same(store, T0 + 700, 1000)
    assert list(same(store, T0 + 700, 400)) == ["a", "b", "z"]


def test_rows_older_than_every_recent_read_are_let_go_of(store):
    clock = [0.0]
    kept = pollrows.PollRows(store, monotonic=lambda: clock[0])
    add_polls(store, T0, 100)
    assert sum(map(len, kept.read("?", (T0,)).values())) == 300
    clock[0] = pollrows.TRIM_KEEP_S + 1  # the read from T0 is too old to keep rows for
    kept.read("?", (T0 + 500,))
    assert kept.low == T0 + 500
    assert sum(len(n.rows) for n in kept.nodes.values()) == 150
    got = kept.read("?", (T0 + 100,))  # further back than kept: read again, all there
    assert sum(map(len, got.values())) == 270
    assert json.dumps(got) == json.dumps(direct(store, T0 + 100, 0))


def test_token_buckets_sum_as_sql_does(store):
    """Live polls only where a bucket has one, else its backfill polls; NULL tokens left out (a
    bucket of only NULLs is NULL); the first bucket cut by `since`; 60.0 and 30 s buckets."""
    add_polls(store, T0, 30, backfill=lambda k, i: int(k < 8 or (i == 0 and k < 20)))
    add_polls(store, T0 + 300, 12, nodes=("n",), tokens=lambda k, i: None if k % 3 else 7, backfill=lambda k, i: k % 2)
    add_polls(store, T0 + 500, 6, nodes=("m",), tokens=lambda k, i: None)
    for since in (T0 - 100, T0 + 35.5, T0 + 301):
        for bucket_s in (60.0, 30):
            same_buckets(store, bucket_s, since)
    kept = pollrows.of(store)
    reloads = kept.reloads
    add_polls(store, T0 + 560, 4, backfill=lambda k, i: k % 2)  # summed into the kept buckets as they come
    assert same_buckets(store, 60.0, T0 + 35.5)[-1]["bucket_unix"] == T0 + 540
    same_buckets(store, 30, T0 + 301)
    assert kept.reloads == reloads


def test_token_buckets_follow_deleted_rows_and_integer_times(store):
    add_polls(store, T0, 100)
    same_buckets(store, 60.0, T0 + 10)
    rollup.rollup(store, now=T0 + 4000, raw_keep_s=3600)  # the polls before T0 + 400 go
    same_buckets(store, 60.0, T0 + 10)
    with store.transaction() as db:  # integer times (stored as REAL, the column's type)
        db.execute(
            "INSERT INTO polls (ts_unix, node, completions, tokens, length_stops, malformed, backfill)"
            " VALUES (1800001019, 'i', 1, 5, 0, 0, 0), (1800001021, 'i', 1, 6, 0, 0, 0)"
        )
    for bucket_s in (60, 60.0, 7):
        same_buckets(store, bucket_s, T0 + 10)


def test_token_buckets_leave_float_tokens_to_sql(store):
    add_polls(store, T0, 20, tokens=lambda k, i: 0.1 * (k + i))  # a float sum depends on its order
    assert pollrows.of(store).token_buckets(60.0, T0) is None
    same_buckets(store, 60.0, T0)
