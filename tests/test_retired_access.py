"""A retired run keeps its access rule (issue #40 item 1).

The README retires a run by deleting its `[[runs]]` table: its store is then found beside the
others' and shown as finished. The allow-list used to live only in the config, so the retired
run opened to anyone by `?run=`. Now the collector records `allowed_users` in the store's run
meta, the dashboard reads it back for a store it finds, and a found store that records no rule
(written before it was kept there) is shown to no one. The stores here are written by a real
`runhealth collect` process; the pages are AppTests and one real Chromium over `runhealth dashboard`.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import textwrap
import time
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard
from test_pages import _clear_streamlit_caches  # noqa: F401 (autouse fixture)
from test_trust import open_app, shown

from components import access, context
from runhealth.serve import supervise
from runhealth.settings import runs
from runhealth.store import Store

ROOT = Path(__file__).resolve().parent.parent
SECRET_COMPLETIONS = 777  # the secret run's shard


def run_table(tmp: Path, name: str, extra: str = "") -> str:
    return textwrap.dedent(f"""
        [[runs]]
        name = "{name}"
        interval_s = 0.5
        max_output_tokens = 4096
        store_path = "{tmp / "stores" / f"{name}.sqlite3"}"
        {extra}
        [[runs.nodes]]
        name = "n1"
        host = "local"
        shards = ["{tmp / name / "*.jsonl"}"]
        python = "{sys.executable}"
        gpu = "off"
        """)


def collect_two_runs(tmp: Path) -> Path:
    """`runhealth collect` over public-run and secret-run (alice only) until both stores hold their
    shards' counts, then SIGTERM; returns the config, both runs still in it."""
    for name, n in (("public-run", 40), ("secret-run", SECRET_COMPLETIONS)):
        (tmp / name).mkdir()
        write_shard(tmp / name / "a.jsonl", truth_rows(n, 3))
    config = tmp / "runhealth.toml"
    config.write_text(
        run_table(tmp, "public-run") + run_table(tmp, "secret-run", 'allowed_users = ["alice@example.com"]')
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp), "XDG_CACHE_HOME": str(tmp / "cache")}
    proc = supervise.start_collector([sys.executable, "-m", "runhealth", "collect", "--config", str(config)], env)
    try:
        deadline = time.monotonic() + 90
        while completions(tmp / "stores" / "secret-run.sqlite3") != SECRET_COMPLETIONS or not completions(
            tmp / "stores" / "public-run.sqlite3"
        ):
            assert proc.poll() is None and time.monotonic() < deadline, "the collector never counted both runs"
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return config


def completions(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return int(db.execute("SELECT COALESCE(SUM(lines), 0) FROM shards").fetchone()[0])
    except sqlite3.Error:
        return 0


def retire(config: Path, name: str) -> None:
    """Delete the run's [[runs]] table: the README's way to retire a run."""
    tables = config.read_text().split("[[runs]]")
    config.write_text("[[runs]]".join(t for t in tables if f'name = "{name}"' not in t))


@pytest.fixture(scope="module")
def retired(tmp_path_factory) -> Path:
    """The two runs collected by a real process, then secret-run retired from the config."""
    tmp = tmp_path_factory.mktemp("retired")
    config = collect_two_runs(tmp)
    retire(config, "secret-run")
    assert "secret-run" not in config.read_text()
    return config


def test_the_collector_records_the_rule_in_the_store(retired):
    store = Store(retired.parent / "stores" / "secret-run.sqlite3")
    assert store.run_settings().allowed_users == ("alice@example.com",)
    store.close()
    found = runs.discover_finished(runs.load_runs(retired))
    assert [(e.config.name, e.config.allowed_users, e.access_known) for e in found] == [
        ("secret-run", ["alice@example.com"], True)
    ]


@pytest.mark.parametrize("page", ["overview", "lengths", "samples", "nodes"])
def test_a_retired_restricted_run_does_not_open_by_its_url(page, retired, monkeypatch):
    at = open_app(page, retired, monkeypatch)
    at.query_params["run"] = "secret-run"
    at.run()
    assert not at.exception
    text = shown(at)
    assert "public-run" in text
    assert "secret-run" not in text.replace("No run named 'secret-run' here", ""), text
    assert not any("secret-run" in str(o) for box in at.selectbox for o in box.options)  # the run picker


def test_a_retired_restricted_run_opens_for_its_signed_in_viewer(retired, monkeypatch):
    """The rule is the store's allow-list, not "hide every retired run": alice sees it."""
    runtime = access.restrict(
        _runtime(retired), access.Viewer(auth_configured=True, logged_in=True, email="alice@example.com")
    )
    assert [h.config.name for h in runtime.runs] == ["public-run", "secret-run"]
    runtime = access.restrict(_runtime(retired), access.Viewer(auth_configured=True, logged_in=True, email="eve@x.org"))
    assert [h.config.name for h in runtime.runs] == ["public-run"]


def _runtime(config: Path) -> context.Runtime:
    return context.build_runtime_for(config)


def test_the_compare_page_does_not_offer_a_retired_restricted_run(retired, monkeypatch):
    at = open_app("compare", retired, monkeypatch)
    at.run()
    assert not at.exception
    text = shown(at)
    assert "Only one run (public-run)" in text and "secret-run" not in text


def forget_rule(store_path: Path) -> None:
    """The store as an older runhealth left it: its run meta without allowed_users."""
    with sqlite3.connect(store_path) as db:
        meta = json.loads(db.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()[0])
        meta.pop("allowed_users")
        db.execute("UPDATE meta SET value = ? WHERE key = 'run'", (json.dumps(meta),))


def test_a_retired_store_that_records_no_rule_is_shown_to_no_one(tmp_path, monkeypatch):
    config = collect_two_runs(tmp_path)
    retire(config, "secret-run")
    forget_rule(tmp_path / "stores" / "secret-run.sqlite3")
    for viewer in (access.Viewer(False), access.Viewer(True, True, "alice@example.com")):
        assert [h.config.name for h in access.restrict(_runtime(config), viewer).runs] == ["public-run"]
    at = open_app("overview", config, monkeypatch)
    at.query_params["run"] = "secret-run"
    at.run()
    text = shown(at)
    assert "secret-run" not in text.replace("No run named 'secret-run' here", "")
    assert "1 run was found beside the configured stores" in text and "add it back to the config" in text


def test_a_retired_open_run_is_still_shown(tmp_path, monkeypatch):
    config = collect_two_runs(tmp_path)
    retire(config, "public-run")
    at = open_app("overview", config, monkeypatch)
    at.query_params["run"] = "public-run"
    at.run()
    assert not at.exception
    # secret-run (live, alice only, no [auth]) is hidden, so public-run is the one run shown: no picker
    assert "No run named" not in shown(at) and "n=40" in shown(at)  # its 40 completions


@pytest.mark.browser
def test_a_retired_restricted_run_does_not_open_in_the_browser(retired, browser_page, tmp_path):
    import test_browser as tb

    with tb.streamlit_server(tmp_path, extra_env={"RUNHEALTH_CONFIG": str(retired)}, collect=False) as url:
        browser_page.goto(f"{url}/?run=secret-run", wait_until="domcontentloaded")
        browser_page.wait_for_selector("h1", timeout=60_000)
        browser_page.wait_for_function(
            "document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0", timeout=60_000
        )
        browser_page.wait_for_timeout(2500)  # the live fragments draw after the frame
        body = browser_page.inner_text("body")
        browser_page.screenshot(path=str(tb.ARTIFACTS / "trust_retired_run.png"))
    assert "public-run" in body
    assert "secret-run" not in body.replace("No run named 'secret-run' here", ""), body


def test_a_rule_changed_on_a_finished_run_reaches_its_store_before_it_is_retired(tmp_path):
    """No collector claims a finished run's store, so the collect service records the rule the
    config gives it now: a run restricted after it finished keeps that rule once retired."""
    config = collect_two_runs(tmp_path)  # secret-run collected while alice's
    text = config.read_text().replace(
        'allowed_users = ["alice@example.com"]', 'finished = true\nallowed_users = ["bob@example.com"]'
    )
    config.write_text(text)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = supervise.start_collector([sys.executable, "-m", "runhealth", "collect", "--config", str(config)], env)
    try:
        deadline = time.monotonic() + 60
        while runs.store_run_settings(tmp_path / "stores" / "secret-run.sqlite3").allowed_users != ("bob@example.com",):
            assert proc.poll() is None and time.monotonic() < deadline, "the rule never reached the store"
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    retire(config, "secret-run")
    for email, names in (("alice@example.com", ["public-run"]), ("bob@example.com", ["public-run", "secret-run"])):
        viewer = access.Viewer(auth_configured=True, logged_in=True, email=email)
        assert [h.config.name for h in access.restrict(_runtime(config), viewer).runs] == names
