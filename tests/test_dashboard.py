"""`runhealth dashboard` is two processes: the collector collects with no page open (issue 24).

Real processes only: the launcher starts `runhealth collect` and Streamlit; before any browser
connects, the store is written, /metrics served and a webhook delivered to a receiver on
loopback. Stopping the launcher (SIGTERM, or SIGKILL) leaves no child behind. A busy port, or a
STREAMLIT_SERVER_PORT naming one, fails before any URL is printed or anything is started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from shardgen import truth_rows, write_shard
from test_packaging import stored_count

from tests.test_prometheus import _free_port
from tests.test_webhooks import SECRET, Receiver

ROOT = Path(__file__).resolve().parent.parent


def local_config(tmp_path: Path, metrics_port: int, rows: int = 250) -> Path:
    """One local node over a shard in tmp, and one node nothing answers for (its alert is the webhook)."""
    write_shard(tmp_path / "a.jsonl", truth_rows(rows, 7))
    config = tmp_path / "runhealth.toml"
    config.write_text(
        f'[run]\nname = "dash-test"\nstore_path = "{tmp_path / "store.sqlite3"}"\ninterval_s = 1\n'
        f"metrics_port = {metrics_port}\n\n"
        f'[[nodes]]\nname = "localhost"\nhost = "local"\nshards = ["{tmp_path / "*.jsonl"}"]\n'
        f'python = "{sys.executable}"\ngpu = "off"\n\n'
        '[[nodes]]\nname = "down"\nhost = "127.0.0.1"\nport = 1\nshards = ["/x/*.jsonl"]\nconnect_timeout_s = 2\n',
        encoding="utf-8",
    )
    return config


def start_dashboard(tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(tmp_path / "dashboard.log", "wb")  # noqa: SIM115 - a file, not a pipe: a full pipe stalls the server
    return subprocess.Popen(
        [sys.executable, "-m", "runhealth", "dashboard", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache"), **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def children(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if fields[0] != b"Z":
                    parents[int(entry)] = int(fields[1])
            except (OSError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        kids = [p for p, pp in parents.items() if pp == todo[0]]
        out += kids
        todo = todo[1:] + kids
    return out


def wait_gone(pids: list[int], timeout_s: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return False


def metrics_total(url: str) -> float:
    try:
        text = urllib.request.urlopen(url, timeout=3).read().decode()
    except OSError:
        return -1
    lines = [line for line in text.splitlines() if line.startswith("runhealth_completions_total")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def healthy(url: str, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def test_collects_serves_metrics_and_sends_webhooks_with_no_page_open(tmp_path):
    metrics_port, port, receiver = _free_port(), _free_port(), Receiver(200)
    config = local_config(tmp_path, metrics_port)
    proc = start_dashboard(
        tmp_path, ["--config", str(config), "--port", str(port)], {"RUNHEALTH_WEBHOOK_URLS": receiver.url()}
    )
    try:
        deadline, total = time.monotonic() + 60, -1.0
        store = tmp_path / "store.sqlite3"
        # No browser connects to `port` here: a session-started collector would leave all three empty.
        while time.monotonic() < deadline:
            total = metrics_total(f"http://127.0.0.1:{metrics_port}/metrics")
            if total == 250 and any(p.get("node") == "down" for p in receiver.posts):
                break
            assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()
            time.sleep(0.3)
        log = (tmp_path / "dashboard.log").read_text()
        assert total == 250, log
        assert stored_count(store) == 250
        alert = next(p for p in receiver.posts if p["node"] == "down")
        assert alert["run"] == "dash-test" and alert["alert"] == "node_down", alert
        assert f"runhealth dashboard on http://127.0.0.1:{port}" in log and SECRET not in log
        assert healthy(f"http://127.0.0.1:{port}/_stcore/health"), log  # the viewer comes up too
        kids = children(proc.pid)
        assert len(kids) >= 2, kids
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert wait_gone(kids) == [], "a child of the dashboard outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.close()


def test_a_killed_launcher_leaves_no_collector_behind(tmp_path):
    """SIGKILL gives the launcher no chance to clean up: the children go by themselves."""
    config = local_config(tmp_path, _free_port())
    proc = start_dashboard(tmp_path, ["--config", str(config), "--port", str(_free_port())])
    try:
        deadline = time.monotonic() + 60
        while len(children(proc.pid)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()
            time.sleep(0.2)
        kids = children(proc.pid)
        assert len(kids) >= 2, kids  # the collector and streamlit
        proc.kill()
        proc.wait(timeout=10)
        assert wait_gone(kids) == [], "orphans: " + ", ".join(map(str, kids))
    finally:
        if proc.poll() is None:
            proc.kill()


def test_when_the_collector_dies_the_dashboard_ends_too(tmp_path):
    """Exit of either child ends both: a viewer with no collector behind it would look healthy."""
    config = local_config(tmp_path, _free_port())
    proc = start_dashboard(tmp_path, ["--config", str(config), "--port", str(_free_port())])
    try:
        deadline = time.monotonic() + 60
        while len(direct := direct_children(proc.pid)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()
            time.sleep(0.2)
        kids = children(proc.pid)
        collector = next(p for p in direct if b"collect" in Path(f"/proc/{p}/cmdline").read_bytes())
        os.kill(collector, signal.SIGKILL)
        assert proc.wait(timeout=30) != 0
        assert wait_gone(kids) == []
        assert "the collector exited" in (tmp_path / "dashboard.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def direct_children(pid: int) -> list[int]:
    return [p for p in children(pid) if _ppid(p) == pid]


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError):
        return None


def test_a_busy_port_fails_before_the_url_and_starts_nothing(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for args, env in (
            (["--port", str(port)], {}),
            ([], {"STREAMLIT_SERVER_PORT": str(port)}),  # honoured when --port is not given
        ):
            proc = start_dashboard(tmp_path, ["--config", str(local_config(tmp_path, _free_port())), *args], env)
            try:
                code = proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
            log = (tmp_path / "dashboard.log").read_text()
            assert code == 2, log
            assert f"cannot serve on 127.0.0.1:{port}" in log and "http://" not in log, log
            assert not (tmp_path / "store.sqlite3").exists()  # no collector was started
