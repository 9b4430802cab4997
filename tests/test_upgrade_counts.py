"""An upgrade keeps every count (#40 item 4). tests/fixtures/stores/v3_678c66d_custom_id.sql is the
store that commit 678c66d's own `runhealth collect` wrote (store version 3, before prompt IDs
were counted) from a real shard of 5,000 lines with `custom_id` (`shard_lines` rebuilds the same
bytes; paths are placeholders). Today's `runhealth collect` then reads 500 lines more. On main
every consumer showed "prompts answered 500", with expected_prompts = 5,500 "500 of 5,500 prompts
answered", 5,000 missing and the ETA on prompts, for a run whose 5,500 prompts are all answered.
The 5,000 earlier lines are not read again for their IDs (the migration cannot reach the nodes),
so the figure is marked as counted since the upgrade on every consumer instead.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_packaging import wait_for_count

from runhealth.alerting import exporter
from runhealth.collect.collector import Collector
from runhealth.screens import compare, lengths, nodes, overview
from runhealth.settings.config import load_config, parse_config
from runhealth.store import Store

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "stores" / "v3_678c66d_custom_id.sql"


def shard_lines(start: int, stop: int) -> str:
    """Chat completions with `custom_id` prompt-<i>: every fifth cut at 4,096 (the fixture's bytes)."""
    out = []
    for i in range(start, stop):
        tokens = 4096 if i % 5 == 0 else 100 + (i % 7) * 50
        line = {
            "custom_id": f"prompt-{i}",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "x" * 40},
                    "finish_reason": "length" if tokens == 4096 else "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": tokens},
        }
        out.append(json.dumps(line) + "\n")
    return "".join(out)


def old_store(tmp_path: Path) -> tuple[Path, Path]:
    """The 678c66d store beside its shard, as on the machine that wrote it (same path, same file)."""
    shards = tmp_path / "shards"
    shards.mkdir()
    shard = shards / "a.jsonl"
    shard.write_text(shard_lines(0, 5000))
    store_path = tmp_path / "old.sqlite3"
    sql = FIXTURE.read_text().replace("@SHARDS@", str(shards)).replace("@STORE@", str(store_path))
    with sqlite3.connect(store_path) as db:
        db.executescript(sql.replace("@CONFIG@", str(tmp_path / "run.toml")).replace("@DIR@", str(tmp_path)))
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
        (offset,) = db.execute("SELECT offset FROM shards").fetchone()
        assert offset == shard.stat().st_size  # the same bytes the old collector counted
        db.execute("UPDATE shards SET inode = ?", (shard.stat().st_ino,))  # the same file
    db.close()
    return store_path, shard


def config_text(tmp_path: Path, store_path: Path) -> Path:
    config = tmp_path / "run.toml"
    config.write_text(
        f'[run]\nname = "old"\ninterval_s = 0.5\nstore_path = "{store_path}"\nmax_output_tokens = 4096\n'
        f"expected_prompts = 5500\n"
        f'[[nodes]]\nname = "n1"\nhost = "local"\nshards = ["{tmp_path / "shards"}/*.jsonl"]\ngpu = "off"\n'
        f'python = "{sys.executable}"\n'
    )
    return config


def test_a_store_from_678c66d_says_prompts_are_counted_since_the_upgrade_on_every_consumer(tmp_path):
    store_path, shard = old_store(tmp_path)
    with open(shard, "a", encoding="utf-8") as f:
        f.write(shard_lines(5000, 5500))
    config = config_text(tmp_path, store_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runhealth", "collect", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_count(proc, store_path, 5500)  # every count kept across the upgrade
        time.sleep(1.5)  # the published Overview follows the poll
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    status = subprocess.run(
        [sys.executable, "-m", "runhealth", "status", "--json", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    got = json.loads(status.stdout)
    record = got[0] if isinstance(got, list) else got
    # status --json: never "500 of 5,500" nor 5,000 missing; the count says what it covers.
    assert record["prompts_missing"] is None, record
    assert record["prompts_counted_since_unix"] is not None
    assert record["prompts_completions_before_counting"] == 5000
    assert "since the store upgrade" in record["prompts_line"] and "5,000 completions" in record["prompts_line"]
    assert record["eta_basis"] == "completions" and "upgraded mid-run" in record["eta_basis_note"]

    run_config = load_config(config)
    store = Store(store_path)
    try:
        now = time.time()
        o = overview.overview(store, run_config, now)
        assert o.prompts is not None and o.prompts["missing"] is None
        assert o.progress is None or "prompts answered" not in o.progress[1]  # no "500 of 5,500 prompts"
        assert o.run_eta is not None and o.run_eta.basis == "completions"
        assert "upgraded mid-run" in o.run_eta.note
        assert "since the store upgrade" in o.prompts["line"]  # the Overview's prompts line
        assert "since the store upgrade" in nodes.nodes(store, run_config, now).fields_caption  # Nodes page
        page = lengths.lengths(store, run_config, now)  # Output lengths
        assert page.run_eta is not None and page.run_eta.basis == "completions"
        fams = {
            f.name: f for f in text_string_to_metric_families(generate_latest(exporter.registry_for(store)).decode())
        }
        assert "runhealth_prompts_missing" not in fams and "runhealth_prompts_answered" not in fams
        assert fams["runhealth_prompts_answered_since_upgrade"].samples[0].value == 500
        assert fams["runhealth_prompts_counted_since_timestamp_seconds"].samples[0].value > 0
        fresh = counted_from_the_start(tmp_path, shard)  # Compare against a run counted from its first line
        try:
            o2 = compare.prompt_overlap(store, fresh)  # on main: "B answered 100% of A's 500 prompts"
            assert o2.share is None and o2.missing_from_b is None and "upgraded mid-run" in o2.line, o2.line
            assert compare.prompt_overlap(fresh, fresh).share == 1.0  # a run counted from its start compares
        finally:
            fresh.close()
    finally:
        store.close()


def counted_from_the_start(tmp_path: Path, shard: Path) -> Store:
    """The same 5,500 lines collected by today's code from the first line (in this process)."""
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "a.jsonl").write_bytes(shard.read_bytes())
    config = parse_config(
        {
            "run": {"name": "b", "store_path": str(tmp_path / "b.sqlite3")},
            "nodes": [{"name": "n1", "host": "local", "shards": [str(tmp_path / "b" / "a.jsonl")], "gpu": "off"}],
        }
    )
    store = Store(tmp_path / "b.sqlite3")
    collector = Collector(config, store)
    collector.poll_once()
    collector.stop()
    assert sum(r["count"] for r in store.length_counts()) == 5500
    return store


def test_a_store_counted_from_its_start_has_no_upgrade_mark(tmp_path):
    """An empty store that reaches version 8 has nothing uncounted: its figures are the run's."""
    store = Store(tmp_path / "new.sqlite3")
    try:
        assert store.meta("prompt_ids_since") is None
    finally:
        store.close()
