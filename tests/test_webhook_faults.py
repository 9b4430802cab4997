"""Webhooks under hostile conditions (issue 23, items 6-10), against real loopback servers and
real SQLite files: a store that cannot be written, a receiver that redirects, URLs with control
characters, bad ports or brackets, a receiver that never answers and one that drips its answer."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import threading
import time

import pytest

from runhealth.alerting import notify, webhook
from runhealth.alerting.outputs import start_outbound
from runhealth.rules import health
from runhealth.store import Store
from tests.test_webhooks import RUN_NAME, SECRET, Receiver, _down_url, _wait


def _alert(node: str) -> health.Alert:
    return health.Alert("node_down", "critical", RUN_NAME, f"{node} down", node=node, value=1.0)


class Alerts:
    """An `evaluate` whose answer the test sets: the alerts that hold now."""

    def __init__(self) -> None:
        self.now: list[health.Alert] = []

    def __call__(self, _store: Store, _now: float) -> list[health.Alert]:
        return list(self.now)


def _notifier(store: Store, urls: list[str], alerts: Alerts, **kw) -> notify.Notifier:
    kw = {"retries": 3, "backoff_s": 0.05, **kw}
    return notify.Notifier(
        store, urls, interval_s=0.05, tracker=notify.AlertTracker(clear_s=3600), evaluate=alerts, **kw
    )


def _stored(store: Store) -> str:
    return json.dumps(store.query("SELECT * FROM webhook_deliveries"))


# -- item 6: the store cannot be written -------------------------------------------------------
def test_a_locked_store_never_resends_a_delivered_alert_nor_stops_the_sender(tmp_path, caplog):
    """Another process holds the store's write lock: each alert still goes out exactly once, the
    sender survives, and once the lock is gone the deliveries are recorded again."""
    caplog.set_level(logging.WARNING)
    store = Store(tmp_path / "s.sqlite3", busy_timeout_s=0.05)
    ok, alerts = Receiver(200), Alerts()
    n = _notifier(store, [ok.url()], alerts)
    holder = sqlite3.connect(tmp_path / "s.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # what a stuck writer in another process looks like
    try:
        n.start()
        for i in range(1, 4):
            alerts.now.append(_alert(f"node-{i}"))
            _wait(lambda i=i: len(ok.posts) >= i)
        time.sleep(0.3)  # a re-send, if any, would come within the backoff
        assert [p["node"] for p in ok.posts] == ["node-1", "node-2", "node-3"]
        assert "not recorded in the store" in caplog.text
        holder.execute("ROLLBACK")
        alerts.now.append(_alert("node-4"))
        _wait(lambda: len(ok.posts) == 4)
        _wait(lambda: "node-4" in _stored(store))
        assert ok.hits == 4
    finally:
        n.stop()
        holder.close()
        ok.close()


# -- item 7: a receiver that redirects -----------------------------------------------------------
class Redirector(Receiver):
    """Answers every POST with `status` and a Location on the same server; GETs answer 200."""

    def __init__(self, status: int):
        super().__init__(status)
        self.gets = 0
        receiver = self
        handler = self.server.RequestHandlerClass

        def do_get(self):  # noqa: ANN001 - http.server's handler
            receiver.gets += 1
            self.send_response(200)
            self.end_headers()

        def do_post(self):  # noqa: ANN001
            receiver.hits += 1
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(status)
            self.send_header("Location", f"/moved/{SECRET}-2")
            self.end_headers()

        handler.do_GET = do_get  # type: ignore[attr-defined]
        handler.do_POST = do_post  # type: ignore[attr-defined]


@pytest.mark.parametrize("status", [301, 302])
def test_a_redirect_is_a_failed_delivery_with_the_target_redacted(tmp_path, status):
    store = Store(tmp_path / "s.sqlite3")
    moved, alerts = Redirector(status), Alerts()
    alerts.now = [_alert("node-1")]
    try:
        n = _notifier(store, [moved.url()], alerts, retries=1)
        (event,) = n.check()
        assert n.deliver(moved.url(), event) is False
        (row,) = notify.delivery_status(store, 0)
        assert row["delivered"] == 0 and row["failed"] == 1
        assert row["last_error"].startswith(f"HTTP {status}: redirect to http://127.0.0.1:{moved.server.server_port}/…")
        assert moved.gets == 0  # the alert was not turned into a bodiless GET
        assert SECRET not in _stored(store)
    finally:
        moved.close()


# -- item 8: control characters in a URL ---------------------------------------------------------
def test_two_urls_joined_by_a_newline_are_refused_by_position_without_the_secret():
    joined = f"http://127.0.0.1:9/hooks/{SECRET}\nhttp://127.0.0.1:9/other/{SECRET}"
    urls, refused = webhook.load_urls(environ={webhook.URLS_ENV: f"http://127.0.0.1:9/fine,{joined}"})
    assert urls == ["http://127.0.0.1:9/fine"]
    assert refused == [
        "RUNHEALTH_WEBHOOK_URLS: webhook entry 2 contains a control character or a space (separate several URLs"
        " with commas, not newlines); it is skipped, the other webhooks are used."
    ]
    for bad in (f"http://h/{SECRET}\x1b[2J", f"http://h/{SECRET}\x00", f"http://h/{SECRET} x"):
        assert "control character" in (webhook.url_problem(bad) or "")


def test_every_error_text_is_redacted_even_for_a_url_with_a_newline(tmp_path, caplog):
    """A URL that bypassed loading (passed in directly): the error stored, logged and shown
    carries no part of its path."""
    caplog.set_level(logging.DEBUG)
    store = Store(tmp_path / "s.sqlite3")
    ok, alerts = Receiver(200), Alerts()
    alerts.now = [_alert("node-1")]
    bad = f"http://127.0.0.1:{ok.server.server_port}/hooks/{SECRET}\nhttp://127.0.0.1:9/x/{SECRET}"
    try:
        n = _notifier(store, [bad], alerts, retries=1)
        (event,) = n.check()
        n.deliver(bad, event)
    finally:
        ok.close()
    assert SECRET not in _stored(store) and SECRET[:8] not in caplog.text
    text = webhook.redact_text(f"InvalidURL: can't contain control characters. {bad[30:]!r}", bad)
    assert SECRET not in text and "\n" not in text


# -- item 9: bad port, bad IPv6 ------------------------------------------------------------------
def test_bad_port_and_bad_ipv6_are_refused_at_load_and_the_good_webhook_works(tmp_path, monkeypatch):
    """start_outbound (what `collect` and the dashboard call) with two broken URLs and a good
    one: no traceback, one sentence per broken entry, alerts reach the good receiver."""
    ok = Receiver(200)
    env = f"http://127.0.0.1:99999/{SECRET},http://[::1/{SECRET},{ok.url()}"
    monkeypatch.setenv(webhook.URLS_ENV, env)
    from runhealth.settings.config import parse_config

    config = parse_config({"run": {"name": RUN_NAME}, "nodes": [{"name": "n", "host": "local", "shards": ["/x"]}]})
    store = Store(tmp_path / "s.sqlite3")
    out = start_outbound([(config, store)])
    try:
        assert out.notices == [
            "RUNHEALTH_WEBHOOK_URLS: webhook entry 1 has a port that is not a number from 1 to 65535;"
            " it is skipped, the other webhooks are used.",
            "RUNHEALTH_WEBHOOK_URLS: webhook entry 2 has an unclosed IPv6 bracket;"
            " it is skipped, the other webhooks are used.",
        ]
        (n,) = out.notifiers
        assert n.urls == [ok.url()]
        n.evaluate = Alerts()
        n.evaluate.now = [_alert("node-1")]
        n.check()
        _wait(lambda: len(ok.posts) == 1)
    finally:
        out.stop()
        ok.close()


# -- item 10: a dead receiver and a dripping one ---------------------------------------------------
class Silent:
    """Accepts connections (the kernel's backlog does) and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)

    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hooks/{SECRET}"

    def close(self) -> None:
        self.sock.close()


class Dripper:
    """Reads the request, then answers one byte every `every_s` (an answer that never ends
    within any sane time, while no single read waits long); gives up after `limit_s`."""

    def __init__(self, every_s: float = 0.1, limit_s: float = 8.0) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.every_s, self.limit_s, self.stop = every_s, limit_s, threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hooks/{SECRET}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 4000 + b"\r\nContent-Length: 0\r\n\r\n"
        end = time.monotonic() + self.limit_s
        with conn:
            conn.recv(65536)
            for byte in answer:
                if self.stop.is_set() or time.monotonic() > end:
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(self.every_s)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_one_attempt_ends_at_its_deadline_however_slowly_the_receiver_drips():
    drip = Dripper()
    try:
        t0 = time.monotonic()
        with pytest.raises(webhook.DeliveryError, match="deadline"):
            webhook.post_json(drip.url(), {"x": 1}, deadline_s=0.5)
        assert time.monotonic() - t0 < 1.5
    finally:
        drip.close()


def test_a_dead_and_a_dripping_receiver_never_delay_the_healthy_one(tmp_path):
    """[silent, dripping, down, healthy], three alerts one after another: the healthy receiver
    gets each within a couple of seconds, while the others retry at their own pace."""
    store = Store(tmp_path / "s.sqlite3")
    silent, drip, ok, alerts = Silent(), Dripper(), Receiver(200), Alerts()
    n = _notifier(store, [silent.url(), drip.url(), _down_url(), ok.url()], alerts, deadline_s=1.0)
    try:
        n.start()
        for i in range(1, 4):
            t0 = time.monotonic()
            alerts.now.append(_alert(f"node-{i}"))
            _wait(lambda i=i: len(ok.posts) == i, timeout=10)
            assert time.monotonic() - t0 < 2.0, f"alert {i} reached the healthy receiver late"

        def failed() -> dict[str, str]:
            return {r["target"]: r["last_error"] for r in notify.delivery_status(store, 0) if r["failed"]}

        _wait(lambda: len(failed()) == 3)  # each attempt ended at its 1 s deadline: 3 tries, about 3 s
        for slow in (silent, drip):
            assert failed()[notify.redact(slow.url())] == "no complete answer within the 1 s deadline"
    finally:
        n.stop(timeout_s=3)
        for r in (silent, drip, ok):
            r.close()
