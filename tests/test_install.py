"""The fresh-machine check: build the wheel, install it into a new venv, use it from elsewhere.

The venv is made from /usr/bin/python3 when it exists (Debian's own, "externally managed"),
else from this interpreter, with no access to the checkout: no PYTHONPATH, a scratch working
directory. pip installs the runtime dependencies from PyPI (or its cache). Then, from that
scratch folder, `runhealth scan --json` must give the exact counts of generated shards and
`runhealth dashboard --port N` must answer its health endpoint and show the DEMO in Chromium.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard
from test_browser import CHROMIUM, CHROMIUM_ARGS, free_port

import runhealth

ROOT = Path(__file__).resolve().parent.parent
BASE_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
GENERIC_NAMES = {"app", "app.py", "pages", "components", "bench", "tests", "scripts"}

pytestmark = pytest.mark.install
# In a process of its own: test_browser's session may hold this process's sync Playwright open.
SEES_DEMO = """
import json, sys
from playwright.sync_api import sync_playwright
url, chromium, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=args)
    page = browser.new_page()
    page.goto(url, wait_until="domcontentloaded")
    page.get_by_text("DEMO — simulated run").first.wait_for(timeout=60_000)
    browser.close()
print("saw DEMO")
"""


def run(argv, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin folder, scratch folder, clean environment) with the wheel installed."""
    tmp = tmp_path_factory.mktemp("install")
    # hatchling comes with the dev extra: no build backend fetched, the wheel built from the checkout.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(ROOT),
        ],
        timeout=120,
    )
    wheel = next((tmp / "dist").glob("runhealth-*.whl"))
    run([BASE_PYTHON, "-m", "venv", str(tmp / "venv")], timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{tmp / 'venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    run(
        [
            str(tmp / "venv" / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "--disable-pip-version-check",
            str(wheel),
        ],
        timeout=300,
        env=env,
    )
    scratch = tmp / "scratch"
    scratch.mkdir()
    return tmp / "venv" / "bin", scratch, env


def test_wheel_puts_only_runhealth_in_site_packages(installed):
    bin_dir, _, env = installed
    purelib = run(
        [str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env=env
    ).stdout.strip()
    record = next(Path(purelib).glob("runhealth-*.dist-info")) / "RECORD"
    tops = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines()}
    # ".." holds the console script (../../../bin/runhealth).
    assert {t for t in tops if not t.endswith(".dist-info")} == {"runhealth", ".."}, tops
    assert not GENERIC_NAMES & {p.name for p in Path(purelib).iterdir()}
    assert (Path(purelib) / "runhealth" / "_app" / "app.py").is_file()
    assert Path(purelib) != Path(sysconfig.get_path("purelib"))  # a venv of its own, not this one


def test_runhealth_scan_from_any_directory(installed):
    bin_dir, scratch, env = installed
    rows = truth_rows(400, 21) + truth_rows(100, 22)
    write_shard(scratch / "a.jsonl", rows[:400])
    write_shard(scratch / "b.jsonl", rows[400:])
    assert (
        run([str(bin_dir / "runhealth"), "--version"], cwd=scratch, env=env).stdout.strip()
        == f"runhealth {runhealth.__version__}"
    )
    got = json.loads(
        run(
            [str(bin_dir / "runhealth"), "scan", "--json", str(scratch / "*.jsonl")], cwd=scratch, env=env, timeout=120
        ).stdout
    )
    length = sum(1 for t, f in rows if f == "length")
    assert got["completions"] == 500 and got["unparseable"] == 0
    assert got["finish_reasons"] == {"stop": 500 - length, "length": length}
    assert got["ceiling"] == 4096 and got["at_ceiling"] == length


def test_runhealth_dashboard_serves_the_demo(installed):
    bin_dir, scratch, env = installed
    port = free_port()
    env = {**env, "HOME": str(scratch), "XDG_CACHE_HOME": str(scratch / "cache")}
    with open(scratch / "dashboard.log", "wb") as log:
        proc = subprocess.Popen(
            [str(bin_dir / "runhealth"), "dashboard", "--port", str(port)],
            cwd=scratch,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                    if reply.status == 200 and reply.read() == b"ok":
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (scratch / "dashboard.log").read_text()
            time.sleep(0.3)
        assert Path(CHROMIUM).exists(), "install chromium: apt-get install -y chromium"
        seen = run([sys.executable, "-c", SEES_DEMO, url, CHROMIUM, json.dumps(CHROMIUM_ARGS)], timeout=120)
        assert seen.stdout.strip() == "saw DEMO"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    log = (scratch / "dashboard.log").read_text()
    assert "no config found: the demo run" in log and str(ROOT) not in log
