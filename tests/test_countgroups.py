"""A scrape's one pass over the length counts (runhealth/alerting/countgroups.py): every figure
summed from the groups equals the statement that computed it on its own before (#42 item 3: five
full scans of node_length_counts a scrape, ~7 CPU s at 1,024 nodes with a day of history), on the
fixture scenarios and on counts with estimated lengths, missing and many unknown finish reasons."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runhealth.alerting import countgroups, exporter
from runhealth.analysis import reasons, stats
from runhealth.rules import health
from runhealth.store import Store, reasonnames
from tests.store_fixtures import make_store


def _reference(store: Store, ceiling: int | None, estimated: int) -> dict:
    """The figures as the exporter's separate statements computed them (803e677), kept here as the reference."""
    where, gone = store.counted_where()
    totals = {
        r[0]: r[1]
        for r in store.cursor(
            f"SELECT finish_reason, SUM(count) FROM node_length_counts{where} GROUP BY finish_reason", gone
        )
    }
    names = reasons.shown_names(totals)
    kept = sorted(names)
    done: dict[tuple[str, str], int] = {}
    for node, reason, n in store.cursor(
        f"SELECT node, CASE WHEN finish_reason IN ({','.join('?' * len(kept))}) THEN finish_reason END,"
        f" SUM(count) FROM node_length_counts{where} GROUP BY 1, 2 ORDER BY 1, 2",
        (*kept, *gone),
    ):
        key = (node, names.get(reason, reasons.OTHER) if reason is not None else reasons.OTHER)
        done[key] = done.get(key, 0) + n
    unknown = store.cursor(
        "SELECT COALESCE(SUM(count), 0), COALESCE(SUM(CASE WHEN finish_reason = '' THEN count END), 0),"
        f" COALESCE(SUM(CASE WHEN estimated = 1 THEN count END), 0) FROM node_length_counts{where}",
        gone,
    ).fetchone()
    bounds = exporter.length_buckets(ceiling)
    cols = "".join(f", SUM(CASE WHEN tokens <= {int(b)} THEN count ELSE 0 END)" for b in bounds)
    cut = stats.cut_sql(ceiling)
    hist = [
        (r[0], r[1], r[2], list(r[3:-1]), r[-1])
        for r in store.cursor(
            f"SELECT node, SUM(count), SUM(tokens * count){cols}, SUM(CASE WHEN {cut} THEN count ELSE 0 END)"
            f" FROM node_length_counts{where} AND estimated = ? GROUP BY node ORDER BY node",
            (*gone, estimated),
        )
    ]
    natural = ",".join(f"'{r}'" for r in reasonnames.NATURAL)
    costs = [
        (node, a or 0, c or 0, u or 0)
        for node, a, c, u in store.cursor(
            f"SELECT node, SUM(tokens * count), SUM(CASE WHEN {cut} THEN tokens * count ELSE 0 END),"
            f" SUM(CASE WHEN finish_reason IN ({natural}) THEN tokens * count ELSE 0 END)"
            f" FROM node_length_counts{where} AND estimated = ? GROUP BY node ORDER BY node",
            (*gone, estimated),
        )
    ]
    return {"done": list(done.items()), "unknown": tuple(unknown), "hist": hist, "costs": costs}


def _grouped(store: Store, ceiling: int | None, estimated: int) -> dict:
    bounds = exporter.length_buckets(ceiling)
    groups = countgroups.read(store, bounds, ceiling)
    lengths = countgroups.per_node(groups, len(bounds), estimated)
    return {
        "done": list(countgroups.reason_counts(groups).items()),
        "unknown": countgroups.unknown_parts(groups),
        "hist": [(node, n.count, n.tokens, n.cumulative, n.at_ceiling) for node, n in lengths.items()],
        "costs": [(node, n.tokens, n.cut_tokens, n.usable_tokens) for node, n in lengths.items()],
    }


def _mixed_store(tmp_path: Path) -> Store:
    """Counts no poll writes this way at once: estimated and exact lengths, rows without a finish
    reason, more unknown reasons than a scrape names (the rest are "other"), and a renamed node
    (its old name's counts are counted under the new one only)."""
    store = Store(tmp_path / "mixed.sqlite3")
    rows = []
    for i, node in enumerate(("a", "b", "c", "old-c")):
        for t in (1, 63, 64, 65, 1000, 2047, 2048, 2049, 4000, 4095, 4096, 5000):
            rows += [(node, t, "stop", 0, 3 + i), (node, t, "length", 0, 1 + t % 7), (node, t, "", 1, 2)]
            rows += [(node, t, f"weird-{t}-{i % 2}", t % 2, 1 + i)]
    with store.transaction() as db:
        db.executemany("INSERT INTO node_length_counts VALUES (?,?,?,?,?)", rows)
        db.executemany(  # c reads the files old-c read: old-c was renamed c
            "INSERT INTO shards (node, path) VALUES (?, ?)", [(n, "/x/1.jsonl") for n in ("c", "old-c")]
        )
    for node in ("a", "b", "c", "old-c"):
        store.register_node(node, {"name": node, "host": f"host-{node[-1]}", "shards": ["/x/*.jsonl"]})
    store.set_meta("run", {"name": "mixed", "nodes": ["a", "b", "c"]})
    assert store.superseded_nodes() == {"old-c": "c"}
    return store


@pytest.mark.parametrize("scenario", ["healthy", "ceiling_18", "node_down", "drift", "empty"])
@pytest.mark.parametrize("ceiling", [4096, 18, None])
@pytest.mark.parametrize("estimated", [0, 1])
def test_the_groups_give_each_figure_the_separate_statement_gave(tmp_path, scenario, ceiling, estimated):
    store, _cfg = make_store(tmp_path, scenario, now=time.time())
    assert _grouped(store, ceiling, estimated) == _reference(store, ceiling, estimated)
    store.close()


@pytest.mark.parametrize("ceiling", [4096, 2048, None])
@pytest.mark.parametrize("estimated", [0, 1])
def test_estimated_missing_and_many_reasons_and_a_renamed_node(tmp_path, ceiling, estimated):
    store = _mixed_store(tmp_path)
    got, want = _grouped(store, ceiling, estimated), _reference(store, ceiling, estimated)
    assert got == want
    assert ("a", reasons.OTHER) in dict(got["done"])  # some reasons past the named few
    assert "old-c" not in {node for node, _n, _t, _c, _a in got["hist"]}
    assert want["hist"] and want["unknown"][1] > 0 and want["unknown"][2] > 0  # the cases are there
    store.close()


def test_a_scrape_reads_the_stored_groups_not_the_counts(tmp_path):
    """After the scrape that buckets the groups for the ceiling, a scrape reads no row of
    node_length_counts at all (#42 item 3): on main each scrape ran one full scan (803e677 ran six)."""
    now = time.time()
    store, _cfg = make_store(tmp_path, "node_down", now=now)
    store.set_meta("run", {"name": "r", "max_output_tokens": 4096, "interval_s": 10})
    seen: list[str] = []
    exporter.scrape_text(store, clock=lambda: now)  # the thread's connection opened, the groups bucketed
    store._db().set_trace_callback(seen.append)
    text = exporter.scrape_text(store, clock=lambda: now).decode()
    store._db().set_trace_callback(None)
    assert [s for s in seen if "FROM node_length_counts" in s] == []
    assert [s for s in seen if "FROM node_length_groups" in s]
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"runhealth_completions", "runhealth_completion_length_tokens", "runhealth_generated_tokens"} <= names
    store.close()


@pytest.mark.parametrize("renamed", [True, False])
def test_the_runs_length_rows_are_its_length_counts_as_tuples(tmp_path, renamed):
    """Store.run_length_rows (#42 item 2: no dict per row on every live page's rerun) gives the
    rows of length_counts(by="run"), in order, with a renamed node's old name left out, and the
    Summary that health reads from them is the one the dict rows gave."""
    store = _mixed_store(tmp_path)
    if not renamed:
        with store.transaction() as db:
            db.execute("DELETE FROM node_length_counts WHERE node = 'old-c'")
            db.execute("DELETE FROM shards WHERE node = 'old-c'")
        assert not store.superseded_nodes()
    got = store.run_length_rows()
    want = [(r["tokens"], r["finish_reason"], r["estimated"], r["count"]) for r in store.length_counts(by="run")]
    assert got == want and len(got) > 40
    assert any(reason is None for _t, reason, _e, _n in got)  # a stored '' reads as no finish reason
    hist = stats.LengthHist.from_rows(want)
    assert len(_reasons_of(want)) > len(reasons.KNOWN) + reasons.MAX_SHOWN_OTHERS + 2  # health folds them first
    for ceiling in (4096, 2048, None):  # the same Summary either way (health._summary's docstring)
        assert health.run_summary(store, ceiling) == stats.summarize(hist, ceiling=ceiling)
    store.close()


def _reasons_of(rows):
    return {r or "" for _t, r, _e, _n in rows}
