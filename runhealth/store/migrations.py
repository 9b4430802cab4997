"""Store migrations: the history store's schema version and the ordered steps that reach it.

The version lives in SQLite's own header (`PRAGMA user_version`), so it is read without any
table. `migrate()` runs when a store is opened: each step of `MIGRATIONS` newer than the file's
version runs in its own transaction together with the version bump, so a step that fails leaves
the store at the version it had. A store newer than this code (`user_version` above
`STORE_VERSION`) is refused, untouched, with a message saying what to do.

Version 1 is the schema as it stood when versions began. Stores from before then carry
`user_version` 0: an empty new file, a store from an early release (missing later columns and
derived tables), or a store that already has every version-1 table. Step 1 is written to bring
each of these to version 1: it creates what is missing and upgrades what is old, and is a no-op
on a store that is already complete. To change the schema, append a step (2, "what", function)
and never edit a step that has shipped.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from runhealth.errors import StoreError
from runhealth.store import fileproblems


class Migration(NamedTuple):
    version: int  # the user_version the store has once this step ran
    description: str
    apply: Callable[[sqlite3.Connection], None]  # runs inside the step's transaction


_V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY, last_ok_unix REAL, last_attempt_unix REAL,
    last_error TEXT, last_error_unix REAL, failing_since_unix REAL,
    rtt_ms REAL, agent_ms REAL, skew_s REAL, hostname TEXT, loadavg TEXT,
    gpus_found INTEGER, gpu_source TEXT, gpu_error TEXT, gpu_simulated INTEGER,
    shards_matched INTEGER, unmatched_globs TEXT, pending_bytes INTEGER,
    disk TEXT, metrics_errors TEXT, config TEXT, index_bytes_per_s REAL);
CREATE TABLE IF NOT EXISTS shards (
    node TEXT NOT NULL, path TEXT NOT NULL, inode INTEGER, offset INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0, lines INTEGER NOT NULL DEFAULT 0,
    malformed INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    resets INTEGER NOT NULL DEFAULT 0, error TEXT, updated_unix REAL,
    blank_lines INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (node, path));
-- finish_reason '' stands for "absent" so the primary key can be upserted.
CREATE TABLE IF NOT EXISTS length_counts (
    node TEXT NOT NULL, path TEXT NOT NULL, tokens INTEGER NOT NULL,
    finish_reason TEXT NOT NULL, estimated INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (node, path, tokens, finish_reason, estimated));
-- The same counts summed per node, kept up to date with length_counts in the same
-- transaction, so run- and node-level views read a few thousand rows, not every shard's.
CREATE TABLE IF NOT EXISTS node_length_counts (
    node TEXT NOT NULL, tokens INTEGER NOT NULL, finish_reason TEXT NOT NULL,
    estimated INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (node, tokens, finish_reason, estimated));
-- Covering indexes for the page reads: the run's counts grouped by length without a sort, and
-- the per-group totals (on a 1.5M-completion store: 55 -> 19 ms, 33 -> 11 ms, 124 -> 23 ms).
-- They hold `count`, so each poll's count upserts update them too (about 2x the write time);
-- an index for the length-stop rows saved nothing measurable and is left out.
CREATE INDEX IF NOT EXISTS node_length_counts_by_tokens
    ON node_length_counts (tokens, finish_reason, estimated, count);
CREATE INDEX IF NOT EXISTS node_length_counts_totals ON node_length_counts (node, estimated, count);
CREATE INDEX IF NOT EXISTS length_counts_totals ON length_counts (node, path, estimated, count);
CREATE TABLE IF NOT EXISTS polls (
    ts_unix REAL NOT NULL, node TEXT NOT NULL, node_ts_unix REAL, completions INTEGER,
    tokens INTEGER, length_stops INTEGER, malformed INTEGER, backfill INTEGER, rtt_ms REAL);
CREATE INDEX IF NOT EXISTS polls_ts ON polls (ts_unix);
-- Each poll's length stops by token count, so "truncated" over time can be split at whatever
-- ceiling the run has (it is only known, or detected, at read time) from context-window stops.
CREATE TABLE IF NOT EXISTS poll_length_stops (
    ts_unix REAL NOT NULL, node TEXT NOT NULL, tokens INTEGER NOT NULL, count INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS poll_length_stops_ts ON poll_length_stops (ts_unix);
CREATE TABLE IF NOT EXISTS gpu_samples (
    ts_unix REAL NOT NULL, node TEXT NOT NULL, gpu INTEGER NOT NULL, util_pct REAL,
    mem_used_mib REAL, mem_total_mib REAL, power_w REAL, power_limit_w REAL, temp_c REAL,
    sm_clock_mhz REAL, throttled INTEGER);
CREATE INDEX IF NOT EXISTS gpu_samples_ts ON gpu_samples (ts_unix);
CREATE TABLE IF NOT EXISTS gpu_latest (
    node TEXT NOT NULL, gpu INTEGER NOT NULL, ts_unix REAL, name TEXT, uuid TEXT,
    util_pct REAL, mem_used_mib REAL, mem_total_mib REAL, power_w REAL, power_limit_w REAL,
    temp_c REAL, sm_clock_mhz REAL, throttle_reasons TEXT, processes TEXT, error TEXT,
    PRIMARY KEY (node, gpu));
-- What predicts a GPU falling out (ECC, retired/remapped rows, PCIe replays: the agent's
-- "health" dict, unsupported keys absent), the latest per GPU; XID events as they came.
CREATE TABLE IF NOT EXISTS gpu_health (
    node TEXT NOT NULL, gpu INTEGER NOT NULL, ts_unix REAL, health TEXT, PRIMARY KEY (node, gpu));
CREATE TABLE IF NOT EXISTS gpu_events (ts_unix REAL NOT NULL, node TEXT NOT NULL, gpu INTEGER, xid INTEGER);
CREATE INDEX IF NOT EXISTS gpu_events_ts ON gpu_events (ts_unix);
-- Host CPUs, RAM and swap per node (the agent's "host" dict from /proc), the latest reading.
CREATE TABLE IF NOT EXISTS host_latest (node TEXT PRIMARY KEY, ts_unix REAL, host TEXT);
CREATE TABLE IF NOT EXISTS metric_samples (
    ts_unix REAL NOT NULL, node TEXT NOT NULL, name TEXT NOT NULL, value REAL);
CREATE INDEX IF NOT EXISTS metric_samples_ts ON metric_samples (ts_unix);
-- The newest value of each metric per node, upserted with every sample (pages read this, not
-- a GROUP BY over a day of samples).
CREATE TABLE IF NOT EXISTS metric_latest (
    node TEXT NOT NULL, name TEXT NOT NULL, value REAL, ts_unix REAL NOT NULL,
    PRIMARY KEY (node, name));
CREATE TABLE IF NOT EXISTS sample_batches (
    batch INTEGER PRIMARY KEY AUTOINCREMENT, requested_unix REAL, done_unix REAL,
    requested_n INTEGER, population INTEGER, errors TEXT);
CREATE TABLE IF NOT EXISTS samples (
    batch INTEGER NOT NULL, node TEXT, path TEXT, line_no INTEGER, offset INTEGER,
    tokens INTEGER, estimated INTEGER, finish_reason TEXT, prompt_head TEXT, text_head TEXT,
    text_tail TEXT, text_chars INTEGER, is_loop INTEGER);
CREATE INDEX IF NOT EXISTS samples_batch ON samples (batch);
"""

# Columns added before versions began: (table, column, declaration), for stores from an early release.
_V1_ADDED_COLUMNS = (("shards", "blank_lines", "INTEGER NOT NULL DEFAULT 0"), ("nodes", "index_bytes_per_s", "REAL"))


def _statements(script: str) -> list[str]:
    """`script` cut into single statements (sqlite3's executescript would commit our transaction)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    return out


def _to_v1(db: sqlite3.Connection) -> None:
    """Today's tables and indexes; an early store's missing columns and derived tables."""
    for statement in _statements(_V1_SCHEMA):
        db.execute(statement)
    for table, column, decl in _V1_ADDED_COLUMNS:
        if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
    if db.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM node_length_counts) AND EXISTS (SELECT 1 FROM length_counts)"
    ).fetchone()[0]:
        # A store written before node_length_counts existed: build it once.
        db.execute(
            "INSERT INTO node_length_counts SELECT node, tokens, finish_reason, estimated,"
            " SUM(count) FROM length_counts GROUP BY node, tokens, finish_reason, estimated"
        )
    if db.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM metric_latest) AND EXISTS (SELECT 1 FROM metric_samples)"
    ).fetchone()[0]:
        # A store written before metric_latest existed (SQLite's bare-column MAX rule).
        db.execute(
            "INSERT INTO metric_latest SELECT node, name, value, MAX(ts_unix) FROM metric_samples GROUP BY node, name"
        )
    # The version was once a meta row nothing read; user_version replaces it.
    db.execute("DELETE FROM meta WHERE key = 'schema_version'")


def _to_v2(db: sqlite3.Connection) -> None:
    """Page payloads (runhealth/payloads/pagedata.py, #16): what each screen shows, computed by the
    collector after a poll so a page only reads one row; ts_unix = when it was computed."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS page_data (name TEXT PRIMARY KEY, ts_unix REAL NOT NULL, payload BLOB NOT NULL)"
    )


def _to_v3(db: sqlite3.Connection) -> None:
    """gpu_seen: per GPU, when it last reported readings, kept with every poll's GPU samples, so
    "which GPUs reported in the last hour" (the missing-GPU check) reads one row per GPU instead
    of a DISTINCT over the hour's samples (52 -> 0.6 ms on a 64 x 8 GPU store; a covering index
    on gpu_samples only got it to 34 ms). Built once from the samples an older store holds."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS gpu_seen (node TEXT NOT NULL, gpu INTEGER NOT NULL, last_unix REAL NOT NULL,"
        " PRIMARY KEY (node, gpu)) WITHOUT ROWID"
    )
    db.execute("INSERT OR REPLACE INTO gpu_seen SELECT node, gpu, MAX(ts_unix) FROM gpu_samples GROUP BY node, gpu")


def _to_v4(db: sqlite3.Connection) -> None:
    """alert_state: the alerts the notifier announced and that still hold (runhealth/alerting/notify.py),
    so a restarted collector neither sends them again nor loses when they started. `key` is the
    alert's key as JSON, `alert` its newest value and wording as JSON; times are unix."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS alert_state (key TEXT PRIMARY KEY, alert TEXT NOT NULL,"
        " since_unix REAL NOT NULL, last_seen_unix REAL NOT NULL, last_sent_unix REAL NOT NULL)"
    )


def _to_v5(db: sqlite3.Connection) -> None:
    """shards.mark: the content mark at the stored offset, sent back to the agent so a file
    rewritten under the same inode is recounted (issue 29); NULL in an older store's rows, which
    the agent then trusts on inode and size as before. shards.replaced_unix: when it last was."""
    have = {r[1] for r in db.execute("PRAGMA table_info(shards)")}
    for column, decl in (("mark", "TEXT"), ("replaced_unix", "REAL")):
        if column not in have:
            db.execute(f"ALTER TABLE shards ADD COLUMN {column} {decl}")


# The tables other modules created on first use before step 6, as they created them (a store
# that has them keeps them; IF NOT EXISTS makes the step a no-op for those).
_V6_SCHEMA = """
CREATE TABLE IF NOT EXISTS length_hourly (bucket_unix INTEGER NOT NULL, tokens INTEGER NOT NULL,
    by_length INTEGER NOT NULL, estimated INTEGER NOT NULL, backfill INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (bucket_unix, tokens, by_length, estimated, backfill)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gpu_rollup (res_s INTEGER NOT NULL, bucket_unix REAL NOT NULL, node TEXT NOT NULL,
    gpu INTEGER NOT NULL, n INTEGER NOT NULL, util_pct REAL, mem_used_mib REAL, mem_total_mib REAL, power_w REAL,
    power_limit_w REAL, temp_c REAL, sm_clock_mhz REAL, throttled INTEGER,
    PRIMARY KEY (res_s, bucket_unix, node, gpu)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS poll_rollup (res_s INTEGER NOT NULL, bucket_unix REAL NOT NULL, node TEXT NOT NULL,
    polls INTEGER NOT NULL, completions INTEGER, tokens INTEGER, length_stops INTEGER, malformed INTEGER,
    backfill INTEGER, PRIMARY KEY (res_s, bucket_unix, node)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metric_rollup (res_s INTEGER NOT NULL, bucket_unix REAL NOT NULL, node TEXT NOT NULL,
    name TEXT NOT NULL, n INTEGER NOT NULL, value REAL, value_max REAL,
    PRIMARY KEY (res_s, bucket_unix, node, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS webhook_deliveries (ts_unix REAL NOT NULL, target TEXT NOT NULL, alert TEXT, node TEXT,
    kind TEXT, ok INTEGER NOT NULL, attempts INTEGER NOT NULL, error TEXT);
"""


def _to_v6(db: sqlite3.Connection) -> None:
    """The tables that were created on first use by the module that owns them (#31): the hourly
    length rows every poll writes (analysis/lengthtime.py reads them), rollup.py's 1-min and
    10-min folds, notify.py's webhook deliveries. Created with the store now, so a poll's write,
    a fold and a read never create schema, and a replaced store gets them when it is reopened."""
    for statement in _statements(_V6_SCHEMA):
        db.execute(statement)


def _to_v7(db: sqlite3.Connection) -> None:
    """alert_history: one row per alert episode (#32), written by the collecting process whether
    or not webhooks are configured (runhealth/alerting/alerthistory.py): when it started and, once
    resolved, when it stopped holding; its name, worst severity, node, GPU, summary and value at
    start and at the end; last_seen_unix: the last evaluation it held, absent_unix: the first
    evaluation that no longer saw an open one (NULL while it holds; it becomes resolved_unix
    once the alert stays away for the webhooks' clear_s). Open rows are the state a restarted
    collector goes on from. `key` is the alert's key as JSON. Alerts the notifier
    already held (alert_state) become open episodes from their `since`, so an upgrade does not
    start them again."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS alert_history (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,"
        " name TEXT NOT NULL, severity TEXT NOT NULL, node TEXT, gpu INTEGER, started_unix REAL NOT NULL,"
        " resolved_unix REAL, last_seen_unix REAL NOT NULL, absent_unix REAL, summary_start TEXT NOT NULL,"
        " summary_end TEXT, value_start REAL, value_end REAL)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS alert_history_started ON alert_history (started_unix)")
    for key, alert, since, seen in db.execute(
        "SELECT key, alert, since_unix, last_seen_unix FROM alert_state"
    ).fetchall():
        a = json.loads(alert)
        db.execute(
            "INSERT INTO alert_history (key, name, severity, node, gpu, started_unix, last_seen_unix,"
            " summary_start, summary_end, value_start, value_end) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                key,
                a["name"],
                a["severity"],
                a.get("node"),
                a.get("gpu"),
                since,
                seen,
                a["summary"],
                a["summary"],
                a.get("value"),
                a.get("value"),
            ),
        )


_V8_SCHEMA = """
CREATE TABLE IF NOT EXISTS field_shards (id INTEGER PRIMARY KEY, node TEXT NOT NULL, path TEXT NOT NULL,
    id_lines INTEGER NOT NULL DEFAULT 0, prompt_token_lines INTEGER NOT NULL DEFAULT 0, group_field TEXT,
    id_fields TEXT, UNIQUE (node, path));
CREATE TABLE IF NOT EXISTS prompt_ids (shard INTEGER NOT NULL, hash INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (shard, hash)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS prompt_hashes (hash INTEGER PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS prompt_summary (id INTEGER PRIMARY KEY CHECK (id = 0),
    distinct_prompts INTEGER NOT NULL, answered_twice INTEGER NOT NULL);
INSERT OR IGNORE INTO prompt_summary VALUES (0, 0, 0);
CREATE TABLE IF NOT EXISTS field_counts (shard INTEGER NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL,
    tokens INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (shard, kind, key, tokens, prompt_tokens)) WITHOUT ROWID;
"""


def _to_v8(db: sqlite3.Connection) -> None:
    """Per-line fields (#33, node/fields.py): `field_shards` gives each (node, shard) a stable id
    (an INTEGER PRIMARY KEY survives VACUUM) with its lines that had a prompt ID / prompt tokens,
    its group field and its ID paths; `prompt_ids` the 64-bit prompt-ID hashes per shard with
    how often each came (dropped with the shard's counts on a reset); `prompt_hashes` the same
    summed over the run (distinct prompts = its rows), with `prompt_summary` keeping its row
    count and its rows above 1 up to date in the same transaction (a page reads one row, not
    millions); `field_counts` the keyed counts: kind
    'group' / 'group_length' (key: the group's label), 'length_prompt_tokens' (tokens, prompt
    tokens of `length` stops), 'no_answer' and 'reasoned' (tokens of `length` stops).

    A store that already counted completions never read their prompt IDs (#40 item 4): meta
    'prompt_ids_since' records when the counting began and how many completions came before, so
    every consumer says the prompts answered are counted since the upgrade instead of showing
    them as the run's total (and no "missing" against expected_prompts, no prompts ETA)."""
    for statement in _statements(_V8_SCHEMA):
        db.execute(statement)
    before = db.execute("SELECT COALESCE(SUM(count), 0) FROM node_length_counts").fetchone()[0]
    if before:
        mark = {"since_unix": time.time(), "completions_before": int(before)}
        db.execute("INSERT OR REPLACE INTO meta VALUES ('prompt_ids_since', ?)", (json.dumps(mark),))


def _to_v9(db: sqlite3.Connection) -> None:
    """GPU energy (#33 item 2, runhealth/store/energymeter.py). gpu_energy: per GPU, the last reading
    (ts_unix, uuid, NVML's counter_mj or NULL, power_w) the next poll's energy is measured from,
    and what was summed over the polls that were throughput (not backfill): joules, of them
    integrated_j from power x time, gpu_s the seconds covered, resets of the counter.
    node_energy: per node, the tokens the shards gained over those same polls (all exact ones
    and the usable ones: a natural stop), so joules / usable_tokens covers one span; since_unix
    is the first such poll. Numbered 9 in issue 33's plan (8 is the scan's tables)."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS gpu_energy (node TEXT NOT NULL, gpu INTEGER NOT NULL, uuid TEXT,"
        " ts_unix REAL NOT NULL, counter_mj INTEGER, power_w REAL, joules REAL NOT NULL DEFAULT 0,"
        " integrated_j REAL NOT NULL DEFAULT 0, gpu_s REAL NOT NULL DEFAULT 0,"
        " resets INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (node, gpu)) WITHOUT ROWID"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS node_energy (node TEXT PRIMARY KEY, since_unix REAL, last_unix REAL,"
        " tokens INTEGER NOT NULL DEFAULT 0, usable_tokens INTEGER NOT NULL DEFAULT 0,"
        " usable_completions INTEGER NOT NULL DEFAULT 0)"
    )


def _to_v10(db: sqlite3.Connection) -> None:
    """run_events (#33 item 7, runhealth/store/runevents.py): what moved the lines on the time
    charts, written by the collecting process: its (re)starts, the config changes it found against
    the run settings the store last recorded (ceiling, nodes added or removed, target, poll
    interval), a new run registered, and shards reset or rewritten (a relaunch) found by a poll.
    `detail` is JSON; the words are the screens' (runhealth/screens/events.py)."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS run_events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts_unix REAL NOT NULL,"
        " kind TEXT NOT NULL, node TEXT, detail TEXT NOT NULL)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS run_events_ts ON run_events (ts_unix)")


# The run's length counts (node_length_counts summed over nodes), kept by triggers so every
# writer (write_poll, a reset, a test's INSERT) keeps it exact. A key whose count reaches 0 is
# removed, as node_length_counts drops its rows at 0. Clustered by its key (WITHOUT ROWID).
_V11_SCHEMA = """
CREATE TABLE IF NOT EXISTS run_length_counts (
    tokens INTEGER NOT NULL, finish_reason TEXT NOT NULL, estimated INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (tokens, finish_reason, estimated)) WITHOUT ROWID;
DELETE FROM run_length_counts;
INSERT INTO run_length_counts
    SELECT tokens, finish_reason, estimated, SUM(count) FROM node_length_counts GROUP BY 1, 2, 3;
CREATE TRIGGER IF NOT EXISTS run_length_counts_insert AFTER INSERT ON node_length_counts BEGIN
    INSERT INTO run_length_counts VALUES (new.tokens, new.finish_reason, new.estimated, new.count)
        ON CONFLICT (tokens, finish_reason, estimated) DO UPDATE SET count = count + excluded.count;
END;
CREATE TRIGGER IF NOT EXISTS run_length_counts_count AFTER UPDATE OF count ON node_length_counts
    WHEN new.tokens = old.tokens AND new.finish_reason = old.finish_reason AND new.estimated = old.estimated
BEGIN
    UPDATE run_length_counts SET count = count + new.count - old.count
        WHERE tokens = new.tokens AND finish_reason = new.finish_reason AND estimated = new.estimated;
END;
CREATE TRIGGER IF NOT EXISTS run_length_counts_key AFTER UPDATE ON node_length_counts
    WHEN new.tokens IS NOT old.tokens OR new.finish_reason IS NOT old.finish_reason
        OR new.estimated IS NOT old.estimated
BEGIN
    UPDATE run_length_counts SET count = count - old.count
        WHERE tokens = old.tokens AND finish_reason = old.finish_reason AND estimated = old.estimated;
    DELETE FROM run_length_counts
        WHERE tokens = old.tokens AND finish_reason = old.finish_reason AND estimated = old.estimated AND count = 0;
    INSERT INTO run_length_counts VALUES (new.tokens, new.finish_reason, new.estimated, new.count)
        ON CONFLICT (tokens, finish_reason, estimated) DO UPDATE SET count = count + excluded.count;
END;
CREATE TRIGGER IF NOT EXISTS run_length_counts_delete AFTER DELETE ON node_length_counts BEGIN
    UPDATE run_length_counts SET count = count - old.count
        WHERE tokens = old.tokens AND finish_reason = old.finish_reason AND estimated = old.estimated;
    DELETE FROM run_length_counts
        WHERE tokens = old.tokens AND finish_reason = old.finish_reason AND estimated = old.estimated AND count = 0;
END;
DROP INDEX IF EXISTS node_length_counts_by_tokens;
"""


def _to_v11(db: sqlite3.Connection) -> None:
    """run_length_counts (#34 item 1): the run's counts by length, kept by triggers on
    node_length_counts, replacing the covering index node_length_counts_by_tokens. That index
    ordered every node's rows by length, so a poll's ~40 count upserts each rewrote a page of
    its own: 49 of the 82 WAL pages a poll committed at 512 nodes (bench/fleet.py), and a read
    of the run's counts walked every node's rows; this table has one row per (length, reason,
    estimated) of the whole run (a few thousand) and a poll touches about 11 of its pages.
    Numbered 11 in issue 34's plan (10 is the run events' table)."""
    for statement in _statements(_V11_SCHEMA):
        db.execute(statement)


def _to_v12(db: sqlite3.Connection) -> None:
    """polls.prompts and poll_rollup.prompts (#33 item 1): the distinct prompts each poll added to
    the run (prompt IDs not seen before, less those a reset shard took away), so the ETA can be
    taken from the rate of new distinct prompts over the same spans as the completions' rate
    (a retry or a relaunch answers prompts again: completions, not progress). One integer on
    the poll row the collector writes anyway: no new table, no new index; rolled up with the
    other poll deltas (runhealth/store/rollup.py). NULL on the polls from before this step."""
    for table in ("polls", "poll_rollup"):
        if "prompts" not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN prompts INTEGER")


_V13_SCHEMA = """
CREATE TABLE IF NOT EXISTS failed_counts (node TEXT NOT NULL, path TEXT NOT NULL, reason TEXT NOT NULL,
    count INTEGER NOT NULL, PRIMARY KEY (node, path, reason)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS failed_ids (shard INTEGER NOT NULL, hash INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (shard, hash)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS failed_ids_hash ON failed_ids (hash);
"""


def _to_v13(db: sqlite3.Connection) -> None:
    """Failed requests (#39 item 2): `failed_counts` the failed request lines per shard and
    bounded reason (runhealth/store/reasonnames.py's Namer), written with the shard's counts
    and dropped with them on a reset; `failed_ids` the failed lines' prompt-ID hashes per
    field shard (migration 8's ids), apart from `prompt_ids`, so a failed prompt is never an
    answered one and a failed prompt later answered is found as a retried failure."""
    for statement in _statements(_V13_SCHEMA):
        db.execute(statement)


def _to_v14(db: sqlite3.Connection) -> None:
    """node_energy.dropped_steps (#40 item 5): the node's poll intervals whose energy could not be
    trusted (a counter that went back without a reload, a step above the GPUs' power limit x the
    interval, a GPU missing from a poll or back after a gap), dropped with their tokens and
    counted, so joules and tokens stay over the same intervals. polls.interval_s (#40 item 7):
    the collector's monotonic seconds since the node's previous poll by the same process (NULL
    for a process's first poll and for the polls from before this step): the rates' intervals,
    whatever the wall clocks did. Numbered 15 in issue 40's plan; 14 at the merge."""
    if "dropped_steps" not in {r[1] for r in db.execute("PRAGMA table_info(node_energy)")}:
        db.execute("ALTER TABLE node_energy ADD COLUMN dropped_steps INTEGER NOT NULL DEFAULT 0")
    if "interval_s" not in {r[1] for r in db.execute("PRAGMA table_info(polls)")}:
        db.execute("ALTER TABLE polls ADD COLUMN interval_s REAL")


# The scrape's and the group tables' aggregates of the length counts (#42 item 3), kept by
# triggers on node_length_counts and length_counts as run_length_counts is. node_length_groups:
# per (node, finish reason, estimated, bucket) the raw rows in it, their completions and tokens x
# completions, where a row's bucket is the number of `length_splits` bounds below its tokens (the
# bounds a scrape's histogram and cut need: runhealth/store/lengthgroups.py sets them and rebuilds
# the groups when they change; none here: one bucket). A group leaves when its last row does.
# shard_length_totals: per (node, shard, estimated) the rows and completions. The partial
# indexes hold the length-stop rows (the few the ceilings are read from), replacing the covering
# indexes the per-group totals read.
_V15_SCHEMA = """
CREATE TABLE IF NOT EXISTS length_splits (bound INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS node_length_groups (
    node TEXT NOT NULL, finish_reason TEXT NOT NULL, estimated INTEGER NOT NULL, bucket INTEGER NOT NULL,
    raw_rows INTEGER NOT NULL, count INTEGER NOT NULL, tokens INTEGER NOT NULL,
    PRIMARY KEY (node, finish_reason, estimated, bucket)) WITHOUT ROWID;
DELETE FROM length_splits;
DELETE FROM node_length_groups;
INSERT INTO node_length_groups SELECT node, finish_reason, estimated, 0, COUNT(*), SUM(count), SUM(tokens * count)
    FROM node_length_counts GROUP BY 1, 2, 3;
CREATE TRIGGER IF NOT EXISTS node_length_groups_insert AFTER INSERT ON node_length_counts BEGIN
    INSERT INTO node_length_groups VALUES (new.node, new.finish_reason, new.estimated,
        (SELECT COUNT(*) FROM length_splits WHERE bound < new.tokens), 1, new.count, new.tokens * new.count)
        ON CONFLICT (node, finish_reason, estimated, bucket)
        DO UPDATE SET raw_rows = raw_rows + 1, count = count + excluded.count, tokens = tokens + excluded.tokens;
END;
CREATE TRIGGER IF NOT EXISTS node_length_groups_count AFTER UPDATE OF count ON node_length_counts
    WHEN new.node = old.node AND new.tokens = old.tokens AND new.finish_reason = old.finish_reason
        AND new.estimated = old.estimated
BEGIN
    UPDATE node_length_groups SET count = count + new.count - old.count, tokens = tokens + new.tokens * (new.count - old.count)
        WHERE node = new.node AND finish_reason = new.finish_reason AND estimated = new.estimated
        AND bucket = (SELECT COUNT(*) FROM length_splits WHERE bound < new.tokens);
END;
CREATE TRIGGER IF NOT EXISTS node_length_groups_key AFTER UPDATE ON node_length_counts
    WHEN new.node IS NOT old.node OR new.tokens IS NOT old.tokens OR new.finish_reason IS NOT old.finish_reason
        OR new.estimated IS NOT old.estimated
BEGIN
    UPDATE node_length_groups SET raw_rows = raw_rows - 1, count = count - old.count, tokens = tokens - old.tokens * old.count
        WHERE node = old.node AND finish_reason = old.finish_reason AND estimated = old.estimated
        AND bucket = (SELECT COUNT(*) FROM length_splits WHERE bound < old.tokens);
    DELETE FROM node_length_groups WHERE node = old.node AND finish_reason = old.finish_reason
        AND estimated = old.estimated AND bucket = (SELECT COUNT(*) FROM length_splits WHERE bound < old.tokens)
        AND raw_rows = 0;
    INSERT INTO node_length_groups VALUES (new.node, new.finish_reason, new.estimated,
        (SELECT COUNT(*) FROM length_splits WHERE bound < new.tokens), 1, new.count, new.tokens * new.count)
        ON CONFLICT (node, finish_reason, estimated, bucket)
        DO UPDATE SET raw_rows = raw_rows + 1, count = count + excluded.count, tokens = tokens + excluded.tokens;
END;
CREATE TRIGGER IF NOT EXISTS node_length_groups_delete AFTER DELETE ON node_length_counts BEGIN
    UPDATE node_length_groups SET raw_rows = raw_rows - 1, count = count - old.count, tokens = tokens - old.tokens * old.count
        WHERE node = old.node AND finish_reason = old.finish_reason AND estimated = old.estimated
        AND bucket = (SELECT COUNT(*) FROM length_splits WHERE bound < old.tokens);
    DELETE FROM node_length_groups WHERE node = old.node AND finish_reason = old.finish_reason
        AND estimated = old.estimated AND bucket = (SELECT COUNT(*) FROM length_splits WHERE bound < old.tokens)
        AND raw_rows = 0;
END;
CREATE TABLE IF NOT EXISTS shard_length_totals (
    node TEXT NOT NULL, path TEXT NOT NULL, estimated INTEGER NOT NULL, raw_rows INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (node, path, estimated)) WITHOUT ROWID;
DELETE FROM shard_length_totals;
INSERT INTO shard_length_totals SELECT node, path, estimated, COUNT(*), SUM(count) FROM length_counts GROUP BY 1, 2, 3;
CREATE TRIGGER IF NOT EXISTS shard_length_totals_insert AFTER INSERT ON length_counts BEGIN
    INSERT INTO shard_length_totals VALUES (new.node, new.path, new.estimated, 1, new.count)
        ON CONFLICT (node, path, estimated) DO UPDATE SET raw_rows = raw_rows + 1, count = count + excluded.count;
END;
CREATE TRIGGER IF NOT EXISTS shard_length_totals_count AFTER UPDATE OF count ON length_counts
    WHEN new.node = old.node AND new.path = old.path AND new.estimated = old.estimated
BEGIN
    UPDATE shard_length_totals SET count = count + new.count - old.count
        WHERE node = new.node AND path = new.path AND estimated = new.estimated;
END;
CREATE TRIGGER IF NOT EXISTS shard_length_totals_key AFTER UPDATE ON length_counts
    WHEN new.node IS NOT old.node OR new.path IS NOT old.path OR new.estimated IS NOT old.estimated
BEGIN
    UPDATE shard_length_totals SET raw_rows = raw_rows - 1, count = count - old.count
        WHERE node = old.node AND path = old.path AND estimated = old.estimated;
    DELETE FROM shard_length_totals WHERE node = old.node AND path = old.path AND estimated = old.estimated AND raw_rows = 0;
    INSERT INTO shard_length_totals VALUES (new.node, new.path, new.estimated, 1, new.count)
        ON CONFLICT (node, path, estimated) DO UPDATE SET raw_rows = raw_rows + 1, count = count + excluded.count;
END;
CREATE TRIGGER IF NOT EXISTS shard_length_totals_delete AFTER DELETE ON length_counts BEGIN
    UPDATE shard_length_totals SET raw_rows = raw_rows - 1, count = count - old.count
        WHERE node = old.node AND path = old.path AND estimated = old.estimated;
    DELETE FROM shard_length_totals WHERE node = old.node AND path = old.path AND estimated = old.estimated AND raw_rows = 0;
END;
CREATE INDEX IF NOT EXISTS node_length_counts_length ON node_length_counts (node, tokens, estimated, count)
    WHERE finish_reason = 'length';
CREATE INDEX IF NOT EXISTS length_counts_length ON length_counts (node, path, tokens, estimated, count)
    WHERE finish_reason = 'length';
DROP INDEX IF EXISTS node_length_counts_totals;
DROP INDEX IF EXISTS length_counts_totals;
"""


def _to_v15(db: sqlite3.Connection) -> None:
    """node_length_groups, length_splits, shard_length_totals (#42 item 3): the length counts
    aggregated per node (by finish reason, estimated flag and histogram bucket) and per shard,
    kept by triggers, so a /metrics scrape and the page data's group tables read a few thousand
    rows instead of every distinct length of every node (2.8M rows at 1,024 nodes and an hour);
    partial indexes on the length-stop rows for the ceilings. Built here from the counts a store
    holds (one scan of each table); the bounds start empty (lengthgroups.cover sets them)."""
    for statement in _statements(_V15_SCHEMA):
        db.execute(statement)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "the schema when versions began: all tables and indexes; an early store gains "
        "shards.blank_lines, nodes.index_bytes_per_s and the node_length_counts and "
        "metric_latest tables built from its counts and samples",
        _to_v1,
    ),
    Migration(2, "page_data: the pages' payloads precomputed by the collector (#16)", _to_v2),
    Migration(3, "gpu_seen: when each GPU last reported, built from the GPU samples (#16)", _to_v3),
    Migration(4, "alert_state: announced alerts and their start, kept across restarts (#29)", _to_v4),
    Migration(5, "shards.mark and shards.replaced_unix: a shard's content identity (#29)", _to_v5),
    Migration(
        6, "length_hourly, gpu/poll/metric_rollup, webhook_deliveries: tables once created on first use (#31)", _to_v6
    ),
    Migration(7, "alert_history: every alert's start and resolve, kept with the store (#32)", _to_v7),
    Migration(8, "field_shards, prompt_ids, prompt_hashes, field_counts: per-line fields (#33)", _to_v8),
    Migration(9, "gpu_energy, node_energy: GPU energy and the tokens it produced, per poll span (#33)", _to_v9),
    Migration(10, "run_events: collector starts, config changes, relaunches for the charts' markers (#33)", _to_v10),
    Migration(11, "run_length_counts: the run's counts by length, kept by triggers (#34)", _to_v11),
    Migration(12, "polls.prompts, poll_rollup.prompts: new distinct prompts per poll, the prompts ETA (#33)", _to_v12),
    Migration(13, "failed_counts, failed_ids: failed requests by shard and reason, their prompt IDs (#39)", _to_v13),
    Migration(
        14, "node_energy.dropped_steps, polls.interval_s: energy steps dropped, monotonic poll intervals (#40)", _to_v14
    ),
    Migration(15, "node_length_groups, shard_length_totals: the length counts aggregated by triggers (#42)", _to_v15),
)
STORE_VERSION = MIGRATIONS[-1].version


def store_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _refuse_newer(found: int, path: Path | str, ours: int) -> None:
    if found > ours:
        raise StoreError(
            f"history store {path} has schema version {found}, newer than this runhealth's ({ours}): "
            f"it was written by a newer runhealth. Upgrade runhealth, or set [run] store_path to another "
            f"file; the store was left untouched"
        )


def refuse_newer(db: sqlite3.Connection, path: Path | str) -> None:
    """Raise StoreError for a store newer than this code (read only: called before the WAL switch)."""
    _refuse_newer(store_version(db), path, STORE_VERSION)


def migrate(db: sqlite3.Connection, path: Path | str, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the store open on `db` (autocommit mode) up to the newest version; returns it.

    Raises:
        StoreError: the store is newer than this code, or a step failed (the store then keeps
            the version of the last step that succeeded).
    """
    ours = migrations[-1].version
    found = store_version(db)
    _refuse_newer(found, path, ours)
    for step in migrations:
        if step.version <= found:
            continue
        db.execute("BEGIN IMMEDIATE")  # one writer at a time: another process may be migrating too
        try:
            found = store_version(db)  # what it is now that we hold the lock
            _refuse_newer(found, path, ours)
            if step.version > found:
                step.apply(db)
                db.execute(f"PRAGMA user_version = {int(step.version)}")
            db.execute("COMMIT")  # may fail too (a full disk): the version counts only once committed
            found = max(found, step.version)
        except BaseException as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StoreError(
                    f"history store {path}: migration to version {step.version} "
                    f"({step.description.split(':')[0]}) failed, the store stays at version "
                    f"{found}: {fileproblems.problem(path, exc)}"
                ) from None
            raise
    return found
