"""The package and its command: one dependency list, one version, `runhealth dashboard|collect`.

The wheel itself is built and installed in tests/test_install.py; these are the fast checks:
requirements files equal to pyproject's lists, the launcher's streamlit command, and the
headless collector run as a real process that stops cleanly on SIGTERM and SIGINT.
"""

import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard

import runhealth
import runhealth.errors
from runhealth import cli
from runhealth.serve import launch
from runhealth.store import Store

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement_lines(path: Path) -> list[str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return [line.replace(" ", "") for line in lines if line and not line.startswith("-r")]


def test_requirements_files_equal_pyproject():
    project = PYPROJECT["project"]
    assert requirement_lines(ROOT / "requirements.txt") == project["dependencies"]
    assert requirement_lines(ROOT / "requirements-dev.txt") == project["optional-dependencies"]["dev"]


def test_one_version_source():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "runhealth/__init__.py"
    assert re.fullmatch(r"\d+\.\d+\.\d+", runhealth.__version__)
    assert project["scripts"]["runhealth"] == "runhealth.cli:main"


def test_changelog_keeps_the_keep_a_changelog_form():
    """[Unreleased] first, then dated versions (newest first), the five section names only."""
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (.*)$", text, flags=re.M)
    assert versions[0] == "[Unreleased]", versions[:1]
    dated = [re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})", v) for v in versions[1:]]
    assert all(dated), [v for v, m in zip(versions[1:], dated, strict=True) if not m]
    numbers = [tuple(map(int, m.group(1).split("."))) for m in dated if m]
    assert numbers == sorted(numbers, reverse=True) and runhealth.__version__ in [m.group(1) for m in dated if m]
    sections = set(re.findall(r"^### (.*)$", text, flags=re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Fixed", "Removed", "Security"}, sections
    assert "keepachangelog.com" in text and "semver.org" in text


def test_pytest_has_no_pythonpath_hack():
    assert "pythonpath" not in PYPROJECT["tool"]["pytest"]["ini_options"]


def test_app_dir_in_a_checkout_is_the_repository():
    assert launch.app_dir() == ROOT


def test_streamlit_options_come_from_the_apps_config(tmp_path):
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "config.toml").write_text(
        '[server]\naddress = "0.0.0.0"\nheadless = true\n[client]\ntoolbarMode = "minimal"\n'
    )
    assert launch.streamlit_options(tmp_path) == ["--server.headless", "true", "--client.toolbarMode", "minimal"]


def test_the_served_app_watches_no_sources_and_skips_the_collection_after_each_run():
    """A dashboard, not a dev server (#42): Streamlit's source watcher walked every loaded module
    on each run and its gc.collect() followed every run, more than half of a cold page's server
    time between them (bench/README.md). The options reach `streamlit run` under names this
    Streamlit knows (a renamed option would be ignored with a warning, and the cost back)."""
    from streamlit import config

    options = launch.streamlit_options(ROOT, {})
    pairs = dict(zip(options[::2], options[1::2], strict=True))
    assert pairs["--server.fileWatcherType"] == "none"
    assert pairs["--runner.postScriptGC"] == "false"
    known = config._config_options_template  # noqa: SLF001 - the names Streamlit accepts
    assert {k[2:] for k in pairs} <= set(known), {k[2:] for k in pairs} - set(known)
    assert "none" in known["server.fileWatcherType"].description


def test_dashboard_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, env = launch.dashboard_command(Path("cfg.toml"), 8611, "127.0.0.1")
    assert argv[:5] == [sys.executable, "-P", str(ROOT / "components" / "serve.py"), "run", str(ROOT / "app.py")]
    assert argv[-4:] == ["--server.port", "8611", "--server.address", "127.0.0.1"]
    assert "--client.toolbarMode" in argv and argv.count("--server.address") == 1
    assert env["RUNHEALTH_CONFIG"] == str(tmp_path / "cfg.toml")  # absolute: streamlit may chdir
    assert env["RUNHEALTH_COLLECTOR"] == "off"  # the viewer only reads: the collector is its own process
    _, env = launch.dashboard_command(None, 8611, "127.0.0.1")
    assert "RUNHEALTH_CONFIG" not in env and env["RUNHEALTH_COLLECTOR"] == "off"
    argv, _ = launch.collector_command(Path("cfg.toml"))
    assert argv[-4:] == ["collect", "--config", str(tmp_path / "cfg.toml"), "--wait-for-config"]
    assert launch.collector_command(None)[0][-3:] == ["collect", "--demo", "--wait-for-config"]


def test_streamlit_variables_win_over_the_apps_config(monkeypatch):
    """STREAMLIT_* variables are honoured as under `streamlit run` (issue 24 item 4)."""
    env = {"STREAMLIT_SERVER_PORT": "8733", "STREAMLIT_SERVER_ADDRESS": "127.0.0.5", "STREAMLIT_THEME_BASE": "light"}
    assert launch.listen_on(None, None, env) == (8733, "127.0.0.5")
    assert launch.listen_on(9000, "0.0.0.0", env) == (9000, "0.0.0.0")  # the command line wins
    assert launch.listen_on(None, None, {}) == (8501, "127.0.0.1")
    with pytest.raises(runhealth.errors.ConfigError, match="STREAMLIT_SERVER_PORT"):
        launch.listen_on(None, None, {"STREAMLIT_SERVER_PORT": "http"})
    options = launch.streamlit_options(ROOT, env)
    assert "--theme.base" not in options and "--theme.primaryColor" in options  # the variable is not overridden
    assert launch.env_var("server.runOnSave") == "STREAMLIT_SERVER_RUN_ON_SAVE"


def test_parser_has_every_subcommand_and_flag():
    parser = cli.build_parser()
    args = parser.parse_args(
        ["dashboard", "--config", "x.toml", "--port", "9000", "--address", "0.0.0.0", "--no-collect"]
    )
    assert (args.config, args.port, args.address, args.no_collect) == ("x.toml", 9000, "0.0.0.0", True)
    args = parser.parse_args(["dashboard"])
    assert (args.port, args.address, args.no_collect) == (None, None, False)  # launch.listen_on decides
    assert parser.parse_args(["collect", "--config", "c.toml"]).func is cli.cmd_collect


def test_dashboard_refuses_a_missing_config(tmp_path, capsys):
    assert cli.main(["dashboard", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def write_local_config(tmp_path: Path, rows: int, extra_node: bool = False) -> Path:
    text = f'[run]\nname = "svc"\ninterval_s = 0.5\nstore_path = "{tmp_path / "svc.sqlite3"}"\n'
    for name, n, seed in [("n1", rows, 5)] + ([("n2", 100, 6)] if extra_node else []):
        shards = tmp_path / name
        if not shards.exists():
            shards.mkdir()
            write_shard(shards / "a.jsonl", truth_rows(n, seed))
        text += (
            f'[[nodes]]\nname = "{name}"\nhost = "local"\nshards = ["{shards}/*.jsonl"]\n'
            f'gpu = "off"\npython = "{sys.executable}"\n'
        )
    config = tmp_path / "run.toml"
    stamp = config.stat().st_mtime_ns + 10**9 if config.exists() else None
    config.write_text(text)
    if stamp:
        os.utime(config, ns=(stamp, stamp))
    return config


class CollectProcess(subprocess.Popen):
    """`runhealth collect` in a process of its own, its stderr read by a thread as it comes.

    A test waits for what the collector says it did (`wait_for_log`: an event) rather than
    sleeping for as long as that might take on a loaded machine: after the wait the check it
    guards has happened, so a "nothing changed" assertion that follows cannot pass vacuously.
    `communicate()` waits for the exit and returns (None, all of stderr)."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        super().__init__(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._said: list[str] = []
        self._eof = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.stderr is not None
        for line in self.stderr:
            with self._changed:
                self._said.append(line)
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def said(self) -> str:
        """Its stderr so far."""
        with self._changed:
            return "".join(self._said)

    def wait_for_log(self, text: str, count: int = 1, timeout_s: float = 30) -> None:
        """Until stderr holds `text` `count` times (fails at `timeout_s` or when the process exits)."""
        with self._changed:
            self._changed.wait_for(lambda: "".join(self._said).count(text) >= count or self._eof, timeout_s)
        said = self.said()
        assert said.count(text) >= count, f"not said {count} time(s) within {timeout_s} s: {text!r}; stderr:\n{said}"

    def communicate(self, input=None, timeout=None):  # noqa: A002 - Popen's signature
        self.wait(timeout)
        self._reader.join(timeout)
        return None, self.said()


def start_collect(config: Path, extra_env: dict[str, str] | None = None) -> CollectProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra_env or {})}
    return CollectProcess([sys.executable, "-m", "runhealth", "collect", "--config", str(config)], env)


def wait_for_count(proc: CollectProcess, store_path: Path, want: int) -> None:
    counted, deadline = 0, time.monotonic() + 30
    while counted < want and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        if store_path.exists():
            counted = stored_count(store_path)
    assert counted == want, proc.said() if proc.poll() is not None else f"store holds {counted}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_collect_runs_headless_and_stops_cleanly(tmp_path, sig):
    proc = start_collect(write_local_config(tmp_path, 300))
    try:
        wait_for_count(proc, tmp_path / "svc.sqlite3", 300)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "collecting 1 node(s) of svc" in err and err.rstrip().endswith("collector stopped")
    with open(tmp_path / "svc.sqlite3.collector.lock", "w") as lock:  # released: a new collector may start
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert stored_count(tmp_path / "svc.sqlite3") == 300


def test_collect_follows_config_changes(tmp_path):
    config = write_local_config(tmp_path, 300)
    proc = start_collect(config)
    try:
        wait_for_count(proc, tmp_path / "svc.sqlite3", 300)
        text = config.read_text()
        config.write_text(text.replace("interval_s = 0.5", "interval_s = 0"))  # broken: keeps collecting
        proc.wait_for_log("does not load, still collecting with the previous one")
        assert proc.poll() is None
        write_local_config(tmp_path, 300, extra_node=True)
        wait_for_count(proc, tmp_path / "svc.sqlite3", 400)
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "does not load, still collecting with the previous one" in err and "interval_s" in err
    assert "config changed: restarted svc (changed)" in err and "collecting 2 node(s) of svc" in err


def wait_for_polls(store_path: Path, n: int = 1, timeout_s: float = 30) -> None:
    """Until the collector has written `n` more successful polls into the store (a row each)."""

    def polls() -> int:
        store = Store(store_path)
        try:
            return store.query("SELECT COUNT(*) AS n FROM polls")[0]["n"]
        finally:
            store.close()

    want, deadline = polls() + n, time.monotonic() + timeout_s
    while polls() < want:
        assert time.monotonic() < deadline, f"no {n} more poll(s) within {timeout_s} s"
        time.sleep(0.1)


def stored_count(path: Path) -> int:
    store = Store(path)
    try:
        return sum(r["count"] for r in store.length_counts())
    finally:
        store.close()


def test_readme_installs_only_from_folders_pip_can_install():
    """`pip install ./runhealth` (the package folder, no pyproject.toml there) fails; `.` works."""
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "runhealth-collect.service").read_text()
    paths = re.findall(r"pip install (\.[^\s`]*)", text)
    assert paths, "README.md lost its install line"
    assert all((ROOT / p / "pyproject.toml").is_file() for p in paths), paths
