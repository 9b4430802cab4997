"""The running dashboard follows its config file: no change to the config needs a restart.

`components.context.get_runtime` compares the file's (path, mtime, size) with what its runtime
was built from; a change rebuilds the runtime (collector restarted with the new nodes, store
kept). Checked on the page (AppTest: a config error clears once the file is fixed) and on the
runtime itself with a real collector reading local shards.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import streamlit as st
from shardgen import truth_rows, write_shard
from streamlit.testing.v1 import AppTest

from components import context

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_runtime():
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    runtime = context._holder().runtime
    if runtime is not None and runtime.collector is not None:
        runtime.collector.stop()
    st.cache_resource.clear()


def write(path: Path, text: str) -> None:
    """Write and move the mtime on by a second, so even a coarse-mtime file system sees the change."""
    stamp = path.stat().st_mtime_ns + 1_000_000_000 if path.exists() else None
    path.write_text(text)
    if stamp is not None:
        os.utime(path, ns=(stamp, stamp))


def config_text(tmp_path: Path, interval: str = "10", nodes: tuple[str, ...] = ("n1",)) -> str:
    text = f'[run]\nname = "reload-run"\ninterval_s = {interval}\nstore_path = "{tmp_path / "r.sqlite3"}"\n'
    for name in nodes:
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        write_shard(folder / "a.jsonl", truth_rows(50, len(name)))
        text += (
            f'[[nodes]]\nname = "{name}"\nhost = "local"\nshards = ["{folder}/*.jsonl"]\n'
            f'gpu = "off"\npython = "{sys.executable}"\n'
        )
    return text


def test_fixed_config_error_clears_without_restart(tmp_path, monkeypatch):
    path = tmp_path / "runhealth.toml"
    write(path, config_text(tmp_path, interval="0"))
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(path))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30).run()
    assert any("interval_s" in e.value for e in at.error)
    assert any("no restart needed" in i.value for i in at.info)
    write(path, config_text(tmp_path, interval="10"))
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.title[0].value == "reload-run"
    assert any(f"Config: {path}" in c.value.replace("\\", "") for c in at.sidebar.caption)


def test_config_change_restarts_the_collector_and_keeps_the_store(tmp_path, monkeypatch):
    path = tmp_path / "runhealth.toml"
    write(path, config_text(tmp_path, interval="0.5"))
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(path))
    first = context.get_runtime()
    assert context.get_runtime() is first  # unchanged file: no rebuild
    assert first.collector is not None and first.collector.running
    write(path, config_text(tmp_path, interval="0.5", nodes=("n1", "n22")))
    second = context.get_runtime()
    assert second is not first and second.store is first.store
    assert not first.collector.running
    assert second.collector.running and set(second.collector.pollers) == {"n1", "n22"}
    deadline = time.monotonic() + 30
    while node_counts(second.store).get("n22", 0) < 50 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert node_counts(second.store) == {"n1": 50, "n22": 50}


def node_counts(store) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in store.length_counts(by="node"):
        out[row["node"]] = out.get(row["node"], 0) + row["count"]
    return out


def test_a_config_created_later_replaces_the_demo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    demo = context.get_runtime()
    assert demo.demo and demo.config_path is None
    write(tmp_path / "runhealth.toml", config_text(tmp_path))
    real = context.get_runtime()
    assert not real.demo and real.config.name == "reload-run"
    assert real.config_path == tmp_path / "runhealth.toml"


def test_is_stale_only_for_the_runtime_that_follows_the_file(tmp_path, monkeypatch):
    path = tmp_path / "runhealth.toml"
    write(path, config_text(tmp_path))
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(path))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    held, loose = context.get_runtime(), context.build_runtime()
    assert not context.is_stale(held) and not context.is_stale(loose)
    write(path, config_text(tmp_path, interval="20"))
    assert context.is_stale(held)  # the sidebar's fragment then reruns the page
    assert not context.is_stale(loose)  # a runtime a test built by hand never triggers reruns
    assert not context.is_stale(context.get_runtime())
