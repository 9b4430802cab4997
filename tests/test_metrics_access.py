"""/metrics obeys access and never opens publicly without auth (issue #40 item 2).

A real `runhealth collect` over an open run and a restricted one (allowed_users), scraped with a
real HTTP client: without a token a scrape sees only the open run; with `--metrics-token-file`
a request without the token gets 401 and one with it sees both runs; a non-loopback metrics bind
without a token is refused (exit 2, saying why and how) for `collect` and for `dashboard`'s
`[run] metrics_address`, unless `--public-without-auth`. A real Prometheus scrapes with the
token from its `credentials_file`, over HTTPS (`--metrics-tls-cert-file`, `tls_config: {ca_file}`).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from shardgen import truth_rows, write_shard
from test_prometheus import PROMETHEUS, _free_port
from test_trust import dashboard

from runhealth.alerting import metricsauth
from runhealth.alerting.outputs import start_outbound
from runhealth.serve import exposure
from runhealth.settings import runs
from runhealth.store import Store

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "c2VjcmV0LXRva2VuLWZvci1tZXRyaWNz-0123456789abcdef"  # what `openssl rand` might give


def write_config(tmp: Path, port: int | None = None, address: str | None = None) -> Path:
    """public-run (open, 40 lines) and secret-run (alice only, 77 lines), both live."""
    text = ""
    for name, n, extra in (("public-run", 40, ""), ("secret-run", 77, 'allowed_users = ["alice@example.com"]')):
        (tmp / name).mkdir(exist_ok=True)
        write_shard(tmp / name / "a.jsonl", truth_rows(n, 3))
        metrics = (f"metrics_port = {port}\n" if port else "") + (f'metrics_address = "{address}"\n' if address else "")
        text += (
            textwrap.dedent(f"""
            [[runs]]
            name = "{name}"
            interval_s = 0.5
            max_output_tokens = 4096
            store_path = "{tmp / "stores" / f"{name}.sqlite3"}"
            {extra}
            """)
            + (metrics if name == "public-run" else "")
            + textwrap.dedent(f"""
            [[runs.nodes]]
            name = "n1"
            host = "local"
            shards = ["{tmp / name / "*.jsonl"}"]
            python = "{sys.executable}"
            gpu = "off"
            """)
        )
    config = tmp / "runhealth.toml"
    config.write_text(text)
    return config


def token_file(tmp: Path, text: str = TOKEN + "\n") -> Path:
    path = tmp / "metrics.token"
    path.write_text(text)
    path.chmod(0o600)
    return path


def env(tmp: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp), "XDG_CACHE_HOME": str(tmp / "cache")}


def collect(tmp: Path, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "runhealth", "collect", "--config", str(tmp / "runhealth.toml"), *args]
    return subprocess.Popen(argv, cwd=tmp, env=env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl, as an operator would make one)."""
    cert, key = tmp / "metrics.crt", tmp / "metrics.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def get(url: str, token: str | None = None, cafile: Path | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def completions_by_run(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "runhealth_completions_total":
                out[s.labels["run"]] = out.get(s.labels["run"], 0) + s.value
    return out


def scrape_until(
    url: str, want: dict[str, float], proc: subprocess.Popen, token: str | None = None, cafile: Path | None = None
) -> str:
    """The scrape once it shows `want` (completions per run), or the last one after 60 s."""
    deadline, body = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            status, body = get(url, token, cafile)
        except OSError:
            status = 0
        if status == 200 and completions_by_run(body) == want:
            break
        time.sleep(0.3)
    return body


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    return err


def test_an_anonymous_scrape_leaves_the_restricted_run_out(tmp_path):
    port = _free_port()
    write_config(tmp_path)
    proc = collect(tmp_path, "--metrics-port", str(port))
    try:
        body = scrape_until(f"http://127.0.0.1:{port}/metrics", {"public-run": 40}, proc)
        with contextlib.closing(Store(tmp_path / "stores" / "secret-run.sqlite3")) as store:  # collected all the same
            deadline = time.monotonic() + 60
            while sum(n["completions"] for n in store.nodes()) != 77:
                assert time.monotonic() < deadline
                time.sleep(0.3)
        body = get(f"http://127.0.0.1:{port}/metrics")[1]
    finally:
        err = stop(proc)
    assert completions_by_run(body) == {"public-run": 40}
    assert "secret-run" not in body and "alice" not in body
    assert "anonymous scrape leaves out 1 run(s) with allowed_users" in err


def test_with_a_token_file_a_scrape_needs_the_token_and_then_sees_every_run(tmp_path):
    port = _free_port()
    write_config(tmp_path)
    proc = collect(tmp_path, "--metrics-port", str(port), "--metrics-token-file", str(token_file(tmp_path)))
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        body = scrape_until(url, {"public-run": 40, "secret-run": 77}, proc, TOKEN)
        refusals = [get(url), get(url, "wrong-token-0123456789"), get(url, TOKEN[:-1]), get(url, TOKEN + "x")]
        basic = urllib.request.Request(url, headers={"Authorization": f"Basic {TOKEN}"})
        with pytest.raises(urllib.error.HTTPError) as basic_refused:
            urllib.request.urlopen(basic, timeout=5)
    finally:
        err = stop(proc)
    assert completions_by_run(body) == {"public-run": 40, "secret-run": 77}
    for status, text in refusals:
        assert status == 401 and "runhealth_" not in text
    assert basic_refused.value.code == 401
    assert basic_refused.value.headers["WWW-Authenticate"].startswith("Bearer")
    assert TOKEN not in err  # never logged


def test_with_tls_the_token_never_crosses_in_clear(tmp_path):
    port = _free_port()
    write_config(tmp_path)
    cert, key = self_signed(tmp_path)
    args = ("--metrics-port", str(port), "--metrics-token-file", str(token_file(tmp_path)))
    proc = collect(tmp_path, *args, "--metrics-tls-cert-file", str(cert), "--metrics-tls-key-file", str(key))
    url = f"https://127.0.0.1:{port}/metrics"
    try:
        body = scrape_until(url, {"public-run": 40, "secret-run": 77}, proc, TOKEN, cert)
        with socket.create_connection(("127.0.0.1", port)):  # connects, never says hello: others go on
            assert get(url, TOKEN, cert)[0] == 200
            anonymous = get(url, None, cert)[0]
        with pytest.raises((OSError, http.client.HTTPException)):
            get(f"http://127.0.0.1:{port}/metrics", TOKEN)  # plain HTTP is not answered
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            get(url, TOKEN)  # a client that does not trust the certificate stops before sending
    finally:
        err = stop(proc)
    assert completions_by_run(body) == {"public-run": 40, "secret-run": 77} and anonymous == 401
    assert f"/metrics on https://127.0.0.1:{port}/metrics" in err and TOKEN not in err


def test_a_tls_certificate_without_its_key_is_refused(tmp_path):
    write_config(tmp_path, port=_free_port())
    cert, _key = self_signed(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "runhealth", "collect", "--config", str(tmp_path / "runhealth.toml")]
        + ["--metrics-tls-cert-file", str(cert)],
        cwd=tmp_path,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "needs a key file too" in done.stderr, done.stderr


def test_collect_refuses_a_public_metrics_bind_without_a_token(tmp_path):
    write_config(tmp_path)
    port = _free_port()
    done = subprocess.run(
        [sys.executable, "-m", "runhealth", "collect", "--config", str(tmp_path / "runhealth.toml")]
        + ["--metrics-port", str(port), "--metrics-address", "0.0.0.0"],
        cwd=tmp_path,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refusing to serve /metrics on 0.0.0.0" in done.stderr
    assert "--metrics-token-file" in done.stderr and exposure.FLAG in done.stderr
    assert not (tmp_path / "stores").exists()  # refused before anything started


def test_public_without_auth_serves_only_the_open_run_and_says_so(tmp_path):
    port = _free_port()
    write_config(tmp_path)
    proc = collect(tmp_path, "--metrics-port", str(port), "--metrics-address", "0.0.0.0", exposure.FLAG)
    try:
        body = scrape_until(f"http://127.0.0.1:{port}/metrics", {"public-run": 40}, proc)
    finally:
        err = stop(proc)
    assert completions_by_run(body) == {"public-run": 40} and "secret-run" not in body
    assert f"/metrics is open to anyone who reaches 0.0.0.0:{port}" in err


def test_a_token_allows_a_public_bind(tmp_path):
    port = _free_port()
    write_config(tmp_path)
    args = ("--metrics-port", str(port), "--metrics-address", "0.0.0.0")
    proc = collect(tmp_path, *args, "--metrics-token-file", str(token_file(tmp_path)))
    try:
        body = scrape_until(f"http://127.0.0.1:{port}/metrics", {"public-run": 40, "secret-run": 77}, proc, TOKEN)
        anonymous = get(f"http://127.0.0.1:{port}/metrics")[0]
    finally:
        stop(proc)
    assert completions_by_run(body) == {"public-run": 40, "secret-run": 77} and anonymous == 401


@pytest.mark.parametrize(
    ("content", "words"),
    [(None, "cannot read the /metrics token file"), ("short\n", "at least 16"), ("two words here!!\n", "one word")],
)
def test_a_bad_token_file_is_refused_naming_the_file_never_its_content(tmp_path, content, words):
    write_config(tmp_path, port=_free_port())
    path = tmp_path / "metrics.token"
    if content is not None:
        token_file(tmp_path, content)
    done = subprocess.run(
        [sys.executable, "-m", "runhealth", "collect", "--config", str(tmp_path / "runhealth.toml")]
        + ["--metrics-token-file", str(path)],
        cwd=tmp_path,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and str(path) in done.stderr and words in done.stderr, done.stderr
    assert content is None or content.strip() not in done.stderr


def test_dashboard_refuses_a_public_metrics_address_in_the_config(tmp_path):
    config = write_config(tmp_path, port=_free_port(), address="0.0.0.0")
    done = dashboard(tmp_path, "--config", str(config), "--port", "1")
    assert done.returncode == 2, done.stderr
    assert "refusing to serve /metrics on 0.0.0.0" in done.stderr and exposure.FLAG in done.stderr
    text = config.read_text().replace('metrics_address = "0.0.0.0"', 'metrics_address = "127.0.0.1"')
    config.write_text(text)  # loopback: no refusal (the busy port is then what stops it)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done = dashboard(tmp_path, "--config", str(config), "--port", str(busy.getsockname()[1]))
    assert done.returncode == 2 and "refusing" not in done.stderr and "cannot serve on" in done.stderr


def test_an_edit_to_a_public_address_while_running_is_refused_as_a_notice(tmp_path):
    """The config is followed while collecting: an edit that moves /metrics to 0.0.0.0 without a
    token must not open it (the running collector cannot exit 2, so it says so and serves nothing)."""
    config = write_config(tmp_path, port=_free_port(), address="0.0.0.0")
    entries = runs.load_runs(config)
    stores = [Store(e.config.resolved_store_path()) for e in entries]
    out = start_outbound([(e.config, s) for e, s in zip(entries, stores, strict=True)], webhook_urls=[])
    try:
        assert out.metrics_server is None and out.metrics_url is None
        assert out.metrics_off is not None and "refusing to serve /metrics on 0.0.0.0" in out.metrics_off
        assert any("refusing" in n for n in out.notices)
    finally:
        out.stop()
        for s in stores:
            s.close()


def test_authorized_compares_the_whole_token():
    assert metricsauth.authorized(f"Bearer {TOKEN}", TOKEN)
    assert metricsauth.authorized(f"bearer  {TOKEN} ", TOKEN)
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}0", "Bearer é"):
        assert not metricsauth.authorized(header, TOKEN), header


@pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason="prometheus missing: apt-get install prometheus")
def test_real_prometheus_scrapes_over_tls_with_the_token_and_without_it_is_refused(tmp_path):
    port, prom_port = _free_port(), _free_port()
    write_config(tmp_path)
    token, (cert, key) = token_file(tmp_path), self_signed(tmp_path)
    tls = ("--metrics-tls-cert-file", str(cert), "--metrics-tls-key-file", str(key))
    proc = collect(tmp_path, "--metrics-port", str(port), "--metrics-token-file", str(token), *tls)
    config = tmp_path / "prometheus.yml"
    target = f"    scheme: https\n    tls_config: {{ca_file: {cert}}}\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n"
        f"  - job_name: with-token\n    authorization: {{credentials_file: {token}}}\n{target}"
        f"  - job_name: anonymous\n{target}"
    )
    log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
        + [f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def query(q: str) -> dict[str, float]:
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        reply = json.loads(urllib.request.urlopen(url, timeout=5).read())
        return {"/".join(r["metric"].values()): float(r["value"][1]) for r in reply["data"]["result"]}

    try:
        deadline, runs_seen, up = time.monotonic() + 90, {}, {}
        while time.monotonic() < deadline:
            try:
                runs_seen = query('sum by (run) (runhealth_completions_total{job="with-token"})')
                up = query("sum by (job) (up)")
            except OSError:
                pass
            if runs_seen == {"public-run": 40, "secret-run": 77} and len(up) == 2:
                break
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.5)
        anonymous = query('count(runhealth_completions_total{job="anonymous"})')
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()
        stop(proc)
    assert runs_seen == {"public-run": 40, "secret-run": 77}
    assert up == {"with-token": 1.0, "anonymous": 0.0}  # the scrape without credentials got 401
    assert anonymous == {}


class _HungUp(io.BytesIO):
    """A TLS response stream whose client is gone: every write fails as ssl's does then."""

    def write(self, data):  # type: ignore[override]
        raise ssl.SSLEOFError(8, "EOF occurred in violation of protocol")


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_client_that_hangs_up_mid_response_over_tls_prints_no_traceback(wrapped):
    """CI saw it: Prometheus stopped while it scraped over HTTPS, wsgiref printed the SSLEOFError's
    traceback on the collector's stderr. The response stream turns it into the client gone that
    wsgiref drops quietly (the bare stream shows the traceback this guards against)."""
    from wsgiref.handlers import SimpleHandler

    from runhealth.alerting.exporter import _ClientGoneWriter

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"x 1\n"]

    err = io.StringIO()
    environ = {"REQUEST_METHOD": "GET", "SERVER_PROTOCOL": "HTTP/1.1"}
    SimpleHandler(io.BytesIO(), _ClientGoneWriter(_HungUp()) if wrapped else _HungUp(), err, environ).run(app)
    assert ("SSLEOFError" in err.getvalue()) is not wrapped, err.getvalue()
