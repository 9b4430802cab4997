"""Alert webhooks against real local HTTP receivers: one that works, one that is down, one that
answers 500. Also: start/resolve/repeat logic, secrets handling, and that delivery never blocks."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
from pathlib import Path

import pytest
from store_fixtures import write_reply

from runhealth.alerting import notify
from runhealth.errors import ConfigError
from runhealth.rules import health
from runhealth.settings.config import parse_config
from runhealth.store import Store
from tests.store_fixtures import CEILING, RUN_NAME, build_run

SECRET = "T000/B000/XXXXXXXXsecretpath"


class Receiver:
    """A real HTTP server on loopback that records POSTed JSON and answers `status`."""

    def __init__(self, status: int = 200, hold: threading.Event | None = None):
        self.posts: list[dict] = []
        self.hits = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                receiver.hits += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if hold is not None:
                    hold.wait(10)
                receiver.posts.append(json.loads(body))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, prefix: str = "http") -> str:
        return f"{prefix}://127.0.0.1:{self.server.server_port}/hooks/{SECRET}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _down_url() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hooks/{SECRET}"


def _alert(name: str = "node_down", node: str | None = "node-3", value: float = 1.0) -> health.Alert:
    return health.Alert(name, "critical", RUN_NAME, f"{node} down", node=node, value=value)


def test_tracker_starts_once_repeats_hourly_and_resolves_after_the_clear_time():
    tracker = notify.AlertTracker(renotify_s=3600, clear_s=60)
    a = _alert()
    assert [e.kind for e in tracker.update([a], 0)] == ["start"]
    assert tracker.update([a], 10) == []  # no repeat while it holds
    assert tracker.update([], 50) == []  # 40 s of absence is a blip, not a resolve (hysteresis)
    assert tracker.update([a], 60) == [] and tracker.update([a], 3599) == []  # back: the same alert
    repeat = tracker.update([a], 3600)
    assert [e.kind for e in repeat] == ["repeat"] and repeat[0].since == 0
    assert tracker.update([], 3659) == []
    resolve = tracker.update([], 3660)
    assert [(e.kind, e.since) for e in resolve] == [("resolve", 0)]
    assert [e.kind for e in tracker.update([a], 3800)] == ["start"]  # a new episode


def test_the_tracker_times_clear_and_repeat_on_the_monotonic_clock_not_the_wall_clock():
    """Issue 29 item 6: the wall clock stepping back an hour must neither mute the hourly repeat
    nor hold a resolve for an hour; the messages keep their wall-clock `since`."""
    tracker = notify.AlertTracker(renotify_s=3600, clear_s=60)
    a, t0 = _alert(), 1_800_000_000.0
    assert [e.kind for e in tracker.update([a], t0, mono=100)] == ["start"]
    repeat = tracker.update([a], t0 - 3600 + 3600, mono=100 + 3600)  # the wall clock went back an hour
    assert [(e.kind, e.since) for e in repeat] == [("repeat", t0)]
    assert tracker.update([], t0 - 3600 + 3650, mono=100 + 3650) == []
    assert [e.kind for e in tracker.update([], t0 - 3600 + 3710, mono=100 + 3710)] == ["resolve"]


def test_payload_shapes():
    event = notify.Event("start", _alert(value=605.0), since=1_700_000_000, at=1_700_000_605)
    assert event.generic() == {
        "alert": "node_down",
        "severity": "critical",
        "run": RUN_NAME,
        "node": "node-3",
        "gpu": None,
        "value": 605.0,
        "since": 1_700_000_000,
        "resolved": False,
        "repeat": False,
        "summary": "node-3 down",
        "time": 1_700_000_605,
    }
    text = event.slack()["text"]
    assert "CRITICAL" in text and "node_down" in text and "2023-11-14 22:13:20 UTC" in text
    assert "RESOLVED" in notify.Event("resolve", _alert(), 0, 1).slack()["text"]


def _notifier(store: Store, urls: list[str], **kw) -> notify.Notifier:
    return notify.Notifier(
        store,
        urls,
        interval_s=0.05,
        retries=3,
        backoff_s=0.05,
        deadline_s=2,
        tracker=notify.AlertTracker(clear_s=0),
        **kw,
    )


def test_real_receivers_ok_down_and_500(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    store = Store(tmp_path / "s.sqlite3")  # node-3 never reached, node-2 silent for 65 s
    build_run(store, now=time.time() - 65, trunc_frac=0.01, nodes=3, polls=3, down={"node-3": 600})
    write_reply(store, "node-1", {"time_unix": time.time(), "shards": {"files": {}}, "gpus": {}}, time.time(), 5.0)
    store.set_meta(
        "run", {"name": RUN_NAME, "max_output_tokens": CEILING, "interval_s": 10, "truncation_alert_fraction": 0.05}
    )
    ok, slack, failing = Receiver(200), Receiver(200), Receiver(500)
    urls = [ok.url(), slack.url("slack+http"), _down_url(), failing.url()]
    try:
        n = _notifier(store, urls)
        events = n.check()
        assert {(e.kind, e.alert.name, e.alert.node) for e in events} == {
            ("start", "node_down", "node-3"),
            ("start", "node_stale", "node-2"),
        }
        for url, q in n.queues.items():
            while not q.empty():
                n.deliver(url, q.get_nowait())
        assert sorted(p["node"] for p in ok.posts) == ["node-2", "node-3"]
        assert all(set(p) >= {"alert", "severity", "run", "node", "value", "since", "resolved"} for p in ok.posts)
        assert len(slack.posts) == 2 and all(set(p) == {"text"} for p in slack.posts)
        assert sorted("node-3" in p["text"] for p in slack.posts) == [False, True]
        assert failing.hits == 2 * 3  # every message tried `retries` times, then given up
        status = {s["target"]: s for s in notify.delivery_status(store, 0)}
        assert status[notify.redact(ok.url())]["delivered"] == 2 and status[notify.redact(ok.url())]["failed"] == 0
        assert status[notify.redact(failing.url())]["failed"] == 2
        assert status[notify.redact(failing.url())]["last_error"] == "HTTP 500"
        down = status[notify.redact(urls[2])]
        assert down["failed"] == 2 and "refused" in down["last_error"].lower()
    finally:
        for r in (ok, slack, failing):
            r.close()
    stored = json.dumps(store.query("SELECT * FROM webhook_deliveries"))
    assert SECRET not in stored and SECRET not in caplog.text  # only scheme://host/… is ever kept


def test_resolve_message_reaches_the_receiver(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    ok = Receiver(200)
    current = [[_alert()]]
    try:
        n = _notifier(store, [ok.url()], evaluate=lambda _s, _now: current[0])
        n.start()
        _wait(lambda: len(ok.posts) == 1)
        current[0] = []
        _wait(lambda: len(ok.posts) == 2)
        n.stop()
        assert [p["resolved"] for p in ok.posts] == [False, True]
        assert ok.posts[0]["since"] == ok.posts[1]["since"]
    finally:
        ok.close()


def test_a_hanging_webhook_never_blocks_evaluation(tmp_path):
    """The check loop keeps evaluating while the only receiver holds its answer."""
    store = Store(tmp_path / "s.sqlite3")
    hold = threading.Event()
    slow = Receiver(200, hold=hold)
    calls = []

    def evaluate(_store, now):
        calls.append(now)
        return [_alert()]

    try:
        n = _notifier(store, [slow.url()], evaluate=evaluate)
        n.start()
        _wait(lambda: slow.hits == 1)
        seen = len(calls)
        _wait(lambda: len(calls) >= seen + 3)  # evaluation goes on while the POST hangs
        assert slow.posts == []
        hold.set()
        _wait(lambda: len(slow.posts) == 1)
        n.stop()
    finally:
        hold.set()
        slow.close()


def _wait(cond, timeout: float = 15.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.02)


def test_urls_come_from_secrets_or_environment_never_the_config(tmp_path):
    secrets = tmp_path / "secrets.toml"
    assert notify.load_urls(secrets, {}) == ([], [])
    secrets.write_text(f'[alerts]\nwebhook_urls = ["https://hooks.slack.com/services/{SECRET}", "http://h:81/x"]\n')
    assert notify.load_urls(secrets, {}) == ([f"https://hooks.slack.com/services/{SECRET}", "http://h:81/x"], [])
    env = {notify.URLS_ENV: f" https://a.example/{SECRET} ,http://b.example/y "}
    assert notify.load_urls(secrets, env) == ([f"https://a.example/{SECRET}", "http://b.example/y"], [])
    urls, refused = notify.load_urls(secrets, {notify.URLS_ENV: f"ftp://x/{SECRET},http://b.example/y"})
    assert urls == ["http://b.example/y"] and len(refused) == 1
    assert "entry 1 is not an http(s) URL" in refused[0] and SECRET not in refused[0]
    secrets.write_text("[alerts]\nwebhook_urls = 'http://a.example/x'\n")
    with pytest.raises(ConfigError, match="must be a list"):
        notify.load_urls(secrets, {})
    assert notify.redact(f"https://hooks.slack.com/services/{SECRET}") == "https://hooks.slack.com/…"
    assert notify.is_slack("https://hooks.slack.com/services/x") and not notify.is_slack("https://a.example/x")
    with pytest.raises(ConfigError, match="secrets.toml"):
        parse_config(
            {
                "run": {"name": "r"},
                "nodes": [{"name": "n", "host": "local", "shards": ["/x"]}],
                "alerts": {"webhook_urls": [f"https://a.example/{SECRET}"]},
            }
        )


def test_delivery_status_keeps_only_the_redacted_target(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    event = notify.Event("start", _alert(), 0, 1)
    url = f"https://hooks.example.com/{SECRET}"
    notify.record_delivery(store, url, event, False, 5, "HTTP 500", time.time())
    rows = notify.delivery_status(store, 0)
    assert rows == [
        {
            "target": "https://hooks.example.com/…",
            "delivered": 0,
            "failed": 1,
            "last_ok_unix": None,
            "last_failure_unix": rows[0]["last_failure_unix"],
            "last_error": "HTTP 500",
        }
    ]
    assert Path(store.path).read_bytes().find(SECRET.encode()) == -1


def test_nodes_page_shows_webhook_failures_without_the_url(tmp_path, monkeypatch):
    import streamlit as st

    from tests.store_fixtures import make_store
    from tests.test_pages import assert_clean, run_page, texts

    st.cache_data.clear()
    st.cache_resource.clear()
    store, config = make_store(tmp_path, "empty")
    event = notify.Event("start", _alert(), 0, 1)
    notify.record_delivery(store, f"https://ok.example.com/{SECRET}", event, True, 1, None, time.time() - 120)
    notify.record_delivery(store, f"https://hooks.example.com/{SECRET}", event, False, 5, "HTTP 500", time.time() - 60)
    store.close()
    at = run_page("nodes", config, monkeypatch)
    assert_clean(at)
    shown = texts(at)
    assert any(
        "Webhook https://hooks.example.com/…: last delivery failed" in e.value and "HTTP 500" in e.value
        for e in at.error
    ), [e.value for e in at.error]
    assert "https://ok.example.com/…" in shown and SECRET not in shown
    st.cache_data.clear()
    st.cache_resource.clear()


def test_a_store_write_failure_is_an_alert(tmp_path):
    """The store marks a node whose poll it could not write (`store_error`, #12); that is an alert."""

    class FailingStore(Store):
        def nodes(self):
            return [dict(n, store_error="the disk holding the history store is full") for n in super().nodes()]

    store = FailingStore(tmp_path / "s.sqlite3")
    store.register_node("node-1", {"name": "node-1"})
    got = [a for a in health.evaluate(store) if a.name == "store_write_failure"]
    assert [(a.node, a.severity) for a in got] == [("node-1", "critical")] and "disk" in got[0].summary
