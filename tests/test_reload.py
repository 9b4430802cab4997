"""The running dashboard follows its config file: no change to the config needs a restart.

`components.context.get_runtime` compares the file's (path, mtime, size) with what its runtime
was built from; a good edit rebuilds the runtime (store kept), a bad one keeps the last good
runtime under a banner on every page (issue 24 item 1). Checked on the page (AppTest) and on the
runtime itself, with the collector that `streamlit run app.py` alone runs in a thread reading
local shards.
"""

from __future__ import annotations

import os
import sqlite3
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
    inprocess = context._holder().inprocess
    if inprocess is not None:
        inprocess.stop.set()  # the in-process collector thread (`streamlit run app.py` alone)
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
    """RUNHEALTH_COLLECTOR unset (`streamlit run app.py` alone): this process collects, in a thread."""
    path = tmp_path / "runhealth.toml"
    write(path, config_text(tmp_path, interval="0.5"))
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(path))
    first = context.get_runtime()
    assert context.get_runtime() is first  # unchanged file: no rebuild
    assert context._holder().inprocess is not None
    wait_for(first.store, {"n1": 50})
    write(path, config_text(tmp_path, interval="0.5", nodes=("n1", "n22")))
    second = context.get_runtime()
    assert second is not first and second.store is first.store
    assert [n.name for n in second.config.nodes] == ["n1", "n22"]
    wait_for(second.store, {"n1": 50, "n22": 50})


def test_a_store_locked_at_the_collectors_start_is_tried_again_without_an_edit(tmp_path, monkeypatch, capfd):
    """SQLite answering "database is locked" when the in-process collector first opens its store
    (another connection's write held it past the busy timeout; CI once saw it from two connections
    switching a new file to WAL at once) used to leave the dashboard not collecting until someone
    edited the config file. Now the lock is tried again every interval, like a collector lock (three
    refusals here, an interval apart)."""
    from runhealth.collect import service
    from runhealth.store import fileproblems

    real, refused = service.Store, []

    def locked_thrice(path, *args, **kwargs):
        if len(refused) < 3:
            refused.append(time.monotonic())
            exc = sqlite3.OperationalError("database is locked")
            exc.sqlite_errorcode = 5  # SQLITE_BUSY, as sqlite3 sets it
            raise fileproblems.refusal(path, exc)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(service, "Store", locked_thrice)
    path = tmp_path / "runhealth.toml"
    write(path, config_text(tmp_path, interval="0.5"))
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(path))
    runtime = context.get_runtime()
    wait_for(runtime.store, {"n1": 50})  # the config file untouched
    said = capfd.readouterr().err
    assert len(refused) == 3 and "is locked by another process (database is locked)" in said, said
    gaps = [b - a for a, b in zip(refused, refused[1:], strict=False)]
    assert all(0.45 <= g < 5 for g in gaps), gaps  # once an interval (0.5 s), not in a loop
    assert "tried again when the config file changes" not in said, said
    assert "the store is free again: this process collects now" in said, said


def wait_for(store, counts: dict[str, int]) -> None:
    deadline = time.monotonic() + 30
    while node_counts(store) != counts and time.monotonic() < deadline:
        time.sleep(0.2)
    assert node_counts(store) == counts


def test_a_bad_edit_keeps_the_last_good_runs_with_a_banner_on_every_page(tmp_path, monkeypatch):
    path = tmp_path / "runhealth.toml"
    good_text = config_text(tmp_path)
    typo = good_text.replace("interval_s = 10", "interval_s = 10\nintervall_s = 5")
    write(path, good_text)
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(path))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    good = context.get_runtime()
    write(path, typo)
    kept = context.get_runtime()
    assert kept.config == good.config and kept.store is good.store  # the last good run
    assert kept.config_error and "intervall_s" in kept.config_error and str(path) in kept.config_error
    assert not context.is_stale(kept)  # no rerun loop on a file that stays broken
    for screen in ("overview", "lengths", "gpus", "samples", "nodes", "compare"):
        write(path, good_text)
        at = AppTest.from_function(_open, args=(screen,), default_timeout=30).run()
        assert not banner(at), screen
        write(path, typo)
        at.run()
        assert not at.exception, (screen, [e.value for e in at.exception])
        shown = banner(at)
        assert shown and "intervall_s" in shown[0] and str(path) in shown[0], (screen, [e.value for e in at.error])
        assert at.title, screen  # the page itself is drawn under the banner
        write(path, good_text.replace("interval_s = 10", "interval_s = 20"))  # fixed
        at.run()
        assert not banner(at) and not at.exception, screen
    assert context.get_runtime().config.interval_s == 20


def banner(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if 'class="rh-config-banner"' in m.value]


def _open(screen: str) -> None:
    import app

    app.main(screen)


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


def test_refresh_now_in_the_viewer_asks_the_collector_process(tmp_path, monkeypatch):
    """`runhealth dashboard` names its collector in RUNHEALTH_COLLECTOR_PID: the viewer's "Refresh
    now" (rt.collector.request_refresh) makes that process poll at once, long before its interval."""
    from test_packaging import start_collect, stored_count

    path = tmp_path / "runhealth.toml"
    write(path, config_text(tmp_path, interval="60"))
    proc = start_collect(path)
    try:
        store = tmp_path / "r.sqlite3"
        deadline = time.monotonic() + 30
        while not (store.exists() and stored_count(store) == 50) and time.monotonic() < deadline:
            time.sleep(0.2)
        write_shard(tmp_path / "n1" / "a.jsonl", truth_rows(20, 4), mode="a")
        monkeypatch.setenv("RUNHEALTH_CONFIG", str(path))
        monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
        monkeypatch.setenv("RUNHEALTH_COLLECTOR_PID", str(proc.pid))
        context.get_runtime().collector.request_refresh()
        deadline = time.monotonic() + 20
        while stored_count(store) < 70 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stored_count(store) == 70
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
