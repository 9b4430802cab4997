"""Only the process holding a store's collector lock writes to it (issue 29 item 8).

Real processes only. A second `runhealth collect` with another config on a running collector's
store used to write its run settings and node list before it tried the lock, then exit: the
running collector's /metrics lost its node and showed the other file's nodes down, and its
thresholds became the other file's. Now it writes nothing and exits saying who collects. A
second `runhealth dashboard` on that store is a viewer of the running collector and says so,
and its collector takes over within about one interval once the first collector stops, however
it stops (SIGTERM, or SIGKILL with no chance to clean up).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard
from test_dashboard import start_dashboard, wait_gone
from test_packaging import start_collect, stored_count, wait_for_count, wait_for_polls

from runhealth.store import Store
from tests.test_collect_outbound import _scrape
from tests.test_prometheus import _free_port


def _config(tmp_path: Path, name: str, store: Path, nodes: list[str], target: int, metrics_port: int | None) -> Path:
    """A run over tmp's shards; its first node local, any others on a port nothing answers."""
    folder = tmp_path / name
    folder.mkdir()
    text = (
        f'[run]\nname = "{name}"\nstore_path = "{store}"\ninterval_s = 1\ntarget_completions = {target}\n'
        f"truncation_alert_fraction = {0.9 if name == 'ghost' else 0.3}\n"
        + (f"metrics_port = {metrics_port}\n" if metrics_port else "")
        + f'\n[[nodes]]\nname = "{nodes[0]}"\nhost = "local"\nshards = ["{tmp_path / "*.jsonl"}"]\n'
        f'python = "{sys.executable}"\ngpu = "off"\n'
    )
    for node in nodes[1:]:
        text += f'\n[[nodes]]\nname = "{node}"\nhost = "127.0.0.1"\nport = 1\nshards = ["/x/*.jsonl"]\n'
    path = folder / "runhealth.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _what_others_see(store_path: Path, metrics_url: str) -> tuple:
    """The run settings, the node list and /metrics' per-node series of a store."""
    store = Store(store_path)
    try:
        meta = store.meta("run")
        nodes = {r["name"]: json.dumps(r["config"], sort_keys=True) for r in store.nodes()}
    finally:
        store.close()
    scraped = _scrape(metrics_url)
    per_node = sorted(k for k in scraped if dict(k[1]).get("node"))
    progress = [v for (name, _labels), v in scraped.items() if name == "runhealth_progress_ratio"]
    return meta, nodes, per_node, progress


def test_a_second_collector_with_another_config_writes_nothing_and_says_who_collects(tmp_path):
    write_shard(tmp_path / "a.jsonl", truth_rows(200, 3))
    store, port = tmp_path / "shared.sqlite3", _free_port()
    first = start_collect(_config(tmp_path, "real", store, ["node-a"], 1000, port))
    try:
        wait_for_count(first, store, 200)
        wait_for_polls(store)  # a poll after the count: every node's status settled
        before = _what_others_see(store, f"http://127.0.0.1:{port}/metrics")
        assert before[2] and before[3] == [0.2], before  # 200 of 1000
        second = subprocess.run(
            [sys.executable, "-m", "runhealth", "collect", "--config"]
            + [str(_config(tmp_path, "ghost", store, ["ghost-1", "ghost-2"], 20_000_000, None))],
            capture_output=True,
            text=True,
            timeout=60,
        )
        wait_for_polls(store)  # a poll and a scrape later: what the second one wrote would show now
        after = _what_others_see(store, f"http://127.0.0.1:{port}/metrics")
        assert first.poll() is None
    finally:
        first.terminate()
        first.communicate(timeout=30)
    assert after == before  # settings, thresholds, node list and /metrics: the first one's
    assert "ghost" not in json.dumps(after)
    assert second.returncode == 2, second.stderr
    assert f"another runhealth process is already collecting into {store} (pid {first.pid} on " in second.stderr
    assert "Traceback" not in second.stderr


def _seconds_until_counted(store: Path, want: int, timeout_s: float) -> float:
    """Seconds until the store counts `want` completions (inf past `timeout_s`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if stored_count(store) == want:
            return time.monotonic() - start
        time.sleep(0.1)
    return float("inf")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_second_dashboard_is_a_viewer_and_collects_once_the_first_collector_stops(tmp_path, sig):
    write_shard(tmp_path / "a.jsonl", truth_rows(100, 4))
    store = tmp_path / "shared.sqlite3"
    config = _config(tmp_path, "real", store, ["node-a"], 1000, None)
    first = start_collect(config)
    dashboard = start_dashboard(tmp_path, ["--config", str(config), "--port", str(_free_port())])
    log = tmp_path / "dashboard.log"
    try:
        wait_for_count(first, store, 100)
        deadline = time.monotonic() + 60
        while "runhealth dashboard on" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        said = log.read_text()
        first.send_signal(sig)
        assert wait_gone([first.pid], 20) == [] and first.wait(timeout=20) is not None
        write_shard(tmp_path / "a.jsonl", truth_rows(50, 5), mode="a")
        took_s = _seconds_until_counted(store, 150, 20)
        print(f"taken over and counted in {took_s:.2f} s")
        assert dashboard.poll() is None, log.read_text()
    finally:
        for proc in (first, dashboard):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    # One interval (1 s) to notice the lock is free, the first poll at once, an agent to start:
    # well inside 5 s. Before the fix it never collected.
    assert took_s < 5, log.read_text()
    assert "the store is free again: this process collects now" in log.read_text()
    assert "viewer of the collector that already runs on this store" in said, said
    assert f"not collecting: another runhealth process is already collecting into {store}" in said, said
    assert "collector running" not in said
