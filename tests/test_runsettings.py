"""RunSettings (runhealth/settings/runsettings.py): the one reader of the run meta a store holds.

The alerts, /metrics, the screens, the rates and a finished run's rediscovery each read the meta
"run" key with their own `meta.get("interval_s") or 10.0` before (issue 31 item 3). These check
that one record decides every default: a store without meta, with the collector's meta, and with
an older or damaged one, as each consumer sees it.
"""

from __future__ import annotations

import dataclasses

import pytest

from runhealth.alerting.exporter import StoreMetrics
from runhealth.collect.collector import run_meta
from runhealth.records import RunMeta
from runhealth.rules import activity, health
from runhealth.settings.config import RunConfig, RunContext, parse_config
from runhealth.settings.runsettings import DEFAULT_INTERVAL_S, RunSettings
from runhealth.settings.windows import STALE_MIN_S, STALL_MIN_S
from runhealth.store import Store


def config(tmp_path, **run) -> RunConfig:
    return parse_config(
        {
            "run": {"name": "gen-a", "store_path": str(tmp_path / "a.sqlite3"), **run},
            "nodes": [
                {"name": "n1", "host": "local", "shards": ["/x/*.jsonl"]},
                {"name": "n2", "host": "local", "shards": ["/y/*.jsonl"]},
            ],
        }
    )


def test_a_store_without_meta_gives_the_defaults(tmp_path):
    store = Store(tmp_path / "bare.sqlite3")
    got = store.run_settings()
    assert got == RunSettings()
    assert (got.name, got.interval_s, got.nodes, got.node_names) == ("run", 10.0, None, None)
    assert got.stale_after == STALE_MIN_S and got.stall_after == STALL_MIN_S  # max(3 x 10 s, the floor)
    assert (got.target_completions, got.max_output_tokens, got.truncation_alert_fraction) == (None, None, None)
    # every consumer reads that one record
    assert activity.run_interval_s(store) == 10.0
    reading = health.read(store)
    assert reading.settings == got and reading.stale_after == STALE_MIN_S
    assert store.superseded_nodes() == {}  # no node list: no node is superseded
    store.close()


def test_a_store_with_the_collectors_meta_gives_its_settings(tmp_path):
    cfg = config(
        tmp_path,
        interval_s=60,
        target_completions=5000,
        max_output_tokens=4096,
        truncation_warn_fraction=0.1,
        truncation_alert_fraction=0.2,
    )
    store = Store(cfg.resolved_store_path())
    store.set_meta("run", run_meta(cfg, RunContext(demo=True)))
    got = store.run_settings()
    assert got == RunSettings.from_config(cfg, demo=True)
    assert (got.name, got.interval_s, got.target_completions, got.max_output_tokens) == ("gen-a", 60.0, 5000, 4096)
    assert (got.truncation_warn_fraction, got.truncation_alert_fraction, got.demo) == (0.1, 0.2, True)
    assert got.stale_after == 180.0 and got.stall_after == 180.0  # 3 polls of 60 s, above both floors
    assert got.node_names == {"n1", "n2"}
    assert activity.run_interval_s(store) == 60.0
    reading = health.read(store)
    assert reading.settings == got and (reading.stale_after, reading.stall_after) == (180.0, 180.0)
    store.close()


def test_the_meta_round_trips_and_keeps_its_json_keys(tmp_path):
    """What the collector writes is what it wrote before RunSettings (a store from an older
    version and a newer dashboard read one another)."""
    cfg = config(tmp_path, stall_after_s=900)
    meta = run_meta(cfg, RunContext())
    assert set(meta) == {
        "name",
        "target_completions",
        "max_output_tokens",
        "interval_s",
        "stall_after_s",
        "demo",
        "truncation_warn_fraction",
        "truncation_alert_fraction",
        "stale_after_s",
        "nodes",
        "expected_prompts",  # since #33's per-line fields: /metrics' prompts not answered
        "max_model_len",  # ... and its context-window stops
        "shared_queue",  # #41: fixed shares (false) or one shared queue
        "failed_warn_share",  # since #39: the failed-requests alert's thresholds
        "failed_crit_share",
        "allowed_users",  # since #40: a run retired from the config keeps its access rule
    }
    assert set(meta) == RunMeta.__required_keys__  # the declared shape (runhealth/records.py) is the written one
    assert meta["stall_after_s"] == 900 and meta["nodes"] == ["n1", "n2"]
    assert RunSettings.from_meta(meta) == RunSettings.from_config(cfg)


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"name": "old"}, RunSettings(name="old")),  # an older store: only its name
        (
            {"name": "", "interval_s": "10", "target_completions": True, "nodes": "n1", "demo": 1},
            RunSettings(),  # wrong types: each key its default, never a crash or a bool as a count
        ),
        ({"interval_s": 0, "stale_after_s": -5, "max_output_tokens": 4096.5}, RunSettings()),
        ({"interval_s": 2.5, "nodes": []}, RunSettings(interval_s=2.5, nodes=())),
        (["not", "a", "mapping"], RunSettings()),
        # #40: the access rule; unknown (None) unless a list of strings: fails closed on the pages
        ({"allowed_users": ["a@x.org"]}, RunSettings(allowed_users=("a@x.org",))),
        ({"allowed_users": []}, RunSettings(allowed_users=())),
        ({"allowed_users": "a@x.org"}, RunSettings(allowed_users=None)),
        ({"allowed_users": [1]}, RunSettings(allowed_users=None)),
    ],
)
def test_an_older_or_damaged_meta_takes_the_defaults(meta, expected):
    assert RunSettings.from_meta(meta) == expected


def test_no_node_list_and_an_empty_one_differ():
    """None: the store does not say (every node counts); (): the config names no node."""
    assert RunSettings.from_meta({}).node_names is None
    assert RunSettings.from_meta({"nodes": []}).node_names == set()


def test_the_default_interval_is_the_configs():
    default = next(f.default for f in dataclasses.fields(RunConfig) if f.name == "interval_s")
    assert DEFAULT_INTERVAL_S == default


def test_metrics_read_the_same_settings(tmp_path):
    """/metrics names the run and words its stall window from the stored settings."""
    cfg = config(tmp_path, interval_s=60, stall_after_s=600)
    store = Store(cfg.resolved_store_path())
    store.set_meta("run", run_meta(cfg, RunContext()))
    families = {m.name: m for m in StoreMetrics(store, clock=lambda: 1e9).collect()}
    assert "600 s" in families["runhealth_stalled"].documentation
    bare = Store(tmp_path / "bare.sqlite3")
    bare_families = {m.name: m for m in StoreMetrics(bare, clock=lambda: 1e9).collect()}
    assert f"{STALL_MIN_S:.0f} s" in bare_families["runhealth_stalled"].documentation
    store.close()
    bare.close()
