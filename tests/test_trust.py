"""Trust (issue #30): every run behind its own access rule, no open port without auth, and the
files that hold prompts and completions owner-only.

The access rule is checked for every run a page shows: a restricted second run must not open by
`?run=` (every page, in real Chromium over `runhealth dashboard --no-collect`), nor appear in the
run picker or on the Compare page. `runhealth dashboard --address 0.0.0.0` is refused unless
every run is restricted and sign-in is configured, or `--public-without-auth` is given (then every
page says the dashboard is open). New stores, their journals and the collector's lock file are
created 0600 in 0700 folders, and the Nodes page says when a store is readable by others.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import store_fixtures
import streamlit as st
import test_pages
from streamlit.testing.v1 import AppTest
from test_pages import _clear_streamlit_caches  # noqa: F401 (autouse fixture)

from components import access, context
from runhealth.serve import exposure
from runhealth.store import Store, storefile

ROOT = Path(__file__).resolve().parent.parent
SECRET_TEXT = "SECRET-COMPLETION-do-not-show"


def two_runs(tmp: Path, auth_users: bool = True) -> Path:
    """An open finished run and a restricted one (alice only), each with its own store."""
    paths = {}
    for name, scenario in (("open", "healthy"), ("secret", "ceiling_18")):
        folder = tmp / name
        folder.mkdir()
        store, _ = store_fixtures.make_store(folder, scenario)
        if name == "secret":
            batch = store.new_sample_batch(1)
            sample = {"node": "node-1", "path": "/data/out/s.jsonl", "line_no": 1, "tokens": 4096}
            sample |= {"finish_reason": "length", "text": SECRET_TEXT, "prompt": SECRET_TEXT}
            store.finish_sample_batch(batch, [sample], 1, {})
        store.close()
        paths[name] = folder / "x.sqlite3"
    restricted = 'allowed_users = ["alice@example.com"]\n' if auth_users else ""
    config = tmp / "runhealth.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [[runs]]
            name = "open-run"
            finished = true
            max_output_tokens = 4096
            store_path = "{paths["open"]}"

            [[runs]]
            name = "secret-run"
            finished = true
            max_output_tokens = 4096
            store_path = "{paths["secret"]}"
            {restricted}"""
        )
    )
    return config


# -- item 1: every run behind its own rule -----------------------------------------------------------
def handle(name: str, users: list[str]) -> context.RunHandle:
    config = type("C", (), {"name": name, "allowed_users": users})()
    return context.RunHandle(config, None)  # type: ignore[arg-type]


def test_each_run_is_checked_against_its_own_list():
    runs = [handle("open", []), handle("a-only", ["a@x.org"]), handle("b-only", ["b@x.org"])]
    names = lambda viewer: [h.config.name for h in access.visible_runs(runs, viewer)]  # noqa: E731
    assert names(access.Viewer(False)) == ["open"]  # no [auth]: restricted runs fail closed
    assert names(access.Viewer(True)) == ["open"]  # not signed in
    assert names(access.Viewer(True, True, "a@x.org")) == ["open", "a-only"]  # allowed on one, not the other
    assert names(access.Viewer(True, True, "c@x.org")) == ["open"]


def open_app(page: str, config: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    return test_pages.open_app(page)


def shown(at: AppTest) -> str:
    kinds = ("markdown", "caption", "text", "code", "error", "warning", "info", "title", "subheader", "selectbox")
    parts = []
    for kind in kinds:
        for el in getattr(at, kind):
            parts.append(str(getattr(el, "value", "")))
            parts.extend(str(o) for o in getattr(el, "options", []) or [])
    return " ".join(parts)


def test_with_auth_a_signed_out_viewer_gets_the_open_run_and_a_way_in(tmp_path, monkeypatch):
    at = open_app("overview", two_runs(tmp_path), monkeypatch)
    at.secrets["auth"] = {"redirect_uri": "http://127.0.0.1:8501/oauth2callback", "cookie_secret": "x"}
    at.query_params["run"] = "secret-run"
    at.run()
    assert not at.exception
    text = shown(at)
    assert "open-run" in text and "1 more run needs a sign-in" in text
    assert "Run: secret-run" not in text and "### secret-run" not in text
    assert any(b.label == "Log in" for b in at.button)


@pytest.mark.browser
@pytest.mark.parametrize("page", ["overview", "lengths", "gpus", "samples", "nodes", "compare"])
def test_a_restricted_run_does_not_open_by_its_url(page, restricted_dashboard, browser_page):
    import test_browser as tb

    browser_page.goto(f"{restricted_dashboard}/{tb.PAGES[page]}?run=secret-run", wait_until="domcontentloaded")
    browser_page.wait_for_selector("h1", timeout=60_000)
    browser_page.wait_for_function(
        "document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0", timeout=60_000
    )
    browser_page.wait_for_timeout(2500)  # the live fragments draw after the frame
    want = "Only one run (open-run)" if page == "compare" else "open-run"
    # the page's text once it names the run shown (a live part redrawn for a publication meanwhile
    # left CI's read between two draws with no text at all)
    body = browser_page.wait_for_function(
        "want => { const t = document.body.innerText; return t.includes(want) ? t : false }", arg=want, timeout=30_000
    ).json_value()
    assert want in body
    assert SECRET_TEXT not in body
    # The name may be echoed only in "No run named 'secret-run' here" (it came from the URL).
    assert "secret-run" not in body.replace("No run named 'secret-run' here", "")
    browser_page.screenshot(path=str(tb.ARTIFACTS / f"trust_{page}.png"))


@pytest.fixture(scope="module")
def restricted_dashboard(tmp_path_factory):
    import test_browser as tb

    tmp = tmp_path_factory.mktemp("restricted")
    config = two_runs(tmp)
    with tb.streamlit_server(tmp, extra_env={"RUNHEALTH_CONFIG": str(config)}, collect=False) as url:
        yield url


# -- item 2: no open port without auth ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.0.0.5", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("", False)],
)
def test_loopback_addresses(address, loopback):
    assert exposure.is_loopback(address) is loopback


def test_refusal_rules(tmp_path):
    assert exposure.refusal("127.0.0.1", [[]], auth=False) is None
    assert "no [auth]" in exposure.refusal("0.0.0.0", [["a@x.org"]], auth=False)
    assert "a run without allowed_users" in exposure.refusal("0.0.0.0", [["a@x.org"], []], auth=True)
    assert "does not load" in exposure.refusal("0.0.0.0", None, auth=True)
    assert exposure.refusal("0.0.0.0", [["a@x.org"]], auth=True) is None
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('[auth]\nredirect_uri = "x"\n')
    assert exposure.auth_configured([tmp_path / "none.toml", secrets])
    secrets.write_text("[other]\nx = 1\n")
    assert not exposure.auth_configured([secrets])


def dashboard(tmp_path: Path, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNHEALTH_", "STREAMLIT_"))}
    env |= {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "runhealth", "dashboard", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_dashboard_refuses_a_public_address_without_auth(tmp_path):
    done = dashboard(tmp_path, "--address", "0.0.0.0", "--port", "1")  # refused before the port is looked at
    assert done.returncode == 2
    assert "refusing to serve on 0.0.0.0" in done.stderr and exposure.FLAG in done.stderr
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text('[auth]\nredirect_uri = "http://x/oauth2callback"\n')
    config = two_runs(tmp_path)  # sign-in exists, but open-run has no allowed_users
    done = dashboard(tmp_path, "--config", str(config), "--address", "0.0.0.0", "--port", "1")
    assert done.returncode == 2 and "a run without allowed_users" in done.stderr
    text = config.read_text().replace('name = "open-run"', 'name = "open-run"\nallowed_users = ["bob@example.com"]')
    config.write_text(text)  # every run restricted and sign-in configured: allowed (the busy port is then refused)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = dashboard(tmp_path, "--config", str(config), "--address", "0.0.0.0", "--port", str(port))
    assert done.returncode == 2 and "refusing" not in done.stderr and f"cannot serve on 0.0.0.0:{port}" in done.stderr


def test_public_without_auth_is_said_on_every_page(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "healthy")
    store.close()
    from components import page as frame

    monkeypatch.setattr(frame, "served_address", lambda: "0.0.0.0")
    for page in ("overview", "nodes"):
        at = open_app(page, config, monkeypatch)
        at.run()
        assert any("open to anyone who can reach 0.0.0.0" in e.value for e in at.error), page
    monkeypatch.setattr(frame, "served_address", lambda: "127.0.0.1")
    at = open_app("overview", config, monkeypatch)
    at.run()
    assert not any("open to anyone" in e.value for e in at.error)


# -- item 3: files holding prompts and completions ----------------------------------------------------
def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_store_its_journals_and_folders_are_owner_only(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "a" / "b" / "run.sqlite3"
        store = Store(path)
        store.set_meta("probe", {"x": 1})
        assert mode(path) == 0o600
        assert mode(Path(f"{path}-wal")) == 0o600 and mode(Path(f"{path}-shm")) == 0o600
        assert mode(tmp_path / "a") == 0o700 and mode(tmp_path / "a" / "b") == 0o700
        assert storefile.readable_by_others(path) == []
        with storefile.open_private(f"{path}.collector.lock") as f:
            f.write("")
        assert mode(Path(f"{path}.collector.lock")) == 0o600
        store.close()
    finally:
        os.umask(old)


def test_nodes_page_says_when_a_store_is_readable_by_others(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "healthy")
    store.close()
    at = open_app("nodes", config, monkeypatch)
    at.run()
    assert not any("readable by other users" in w.value for w in at.warning)
    os.chmod(store.path, 0o644)
    st.cache_data.clear()
    at = open_app("nodes", config, monkeypatch)
    at.run()
    assert any("readable by other users" in w.value and "(644)" in w.value for w in at.warning)


# -- item 6: say who is at fault --------------------------------------------------------------------
def test_a_stopped_collector_is_named_not_the_nodes_and_refresh_says_why_it_cannot(tmp_path, monkeypatch):
    """SIGSTOP the real collector: the Overview's alert names it (pid, last heartbeat) instead of
    calling its nodes stale, the Nodes page says it still holds the lock, and "Refresh now" is
    disabled with the reason."""
    import signal
    import time

    from shardgen import truth_rows, write_shard

    from runhealth import heartbeat
    from runhealth.serve import supervise

    write_shard(tmp_path / "a.jsonl", truth_rows(50, 3))
    config = tmp_path / "runhealth.toml"
    config.write_text(
        textwrap.dedent(f"""
            [run]
            name = "stop-test"
            store_path = "{tmp_path / "store.sqlite3"}"
            interval_s = 0.5
            stale_after_s = 2

            [[nodes]]
            name = "n1"
            host = "local"
            shards = ["{tmp_path / "*.jsonl"}"]
            python = "{sys.executable}"
            gpu = "off"
            """)
    )
    monkeypatch.setattr(heartbeat, "HEARTBEAT_S", 0.5)  # the viewer's reading: gone after 2 s of silence
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = supervise.start_collector([sys.executable, "-m", "runhealth", "collect", "--config", str(config)], env)
    try:
        store = Store(tmp_path / "store.sqlite3")
        deadline = time.monotonic() + 60
        while not (store.last_collection_unix() and heartbeat.read_status(store)):
            assert time.monotonic() < deadline and proc.poll() is None, "the collector never polled"
            time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(3.5)  # past stale_after_s and the silent time
        st.cache_data.clear()
        at = open_app("overview", config, monkeypatch)
        at.run()
        red = [e.value for e in at.error]
        assert any(f"pid {proc.pid}" in e and "stopped or hung" in e for e in red), red
        assert not any("n1 stale" in e or "n1 down" in e for e in red + [w.value for w in at.warning]), red
        button = at.button(key="overview_refresh_button")
        assert button.disabled and f"kill -CONT {proc.pid}" in (button.help or "")
        at = open_app("nodes", config, monkeypatch)
        at.run()
        assert any("another collector would be refused" in w.value for w in at.warning)
        store.close()
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=30)
