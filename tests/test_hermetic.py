"""No test reads the user's config, secrets or ssh config (tests/conftest.py's session fixture).

`test_canary` checks what a test sees: no config found, an empty HOME, a scratch working
directory, the demo on the Overview. `test_a_poisoned_environment_changes_no_result` runs the
canary and the config suite in a copy of the checkout whose root holds a
runhealth.toml and .streamlit/secrets.toml, with RUNHEALTH_CONFIG, RUNHEALTH_COLLECTOR and
HOME (~/.ssh/config, ~/.streamlit/) all poisoned: every test must still pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

from runhealth.settings.config import SECRETS_PATH, find_config_path, load_config

ROOT = Path(__file__).resolve().parent.parent
POISON = "POISONED-by-test_hermetic"
POISON_TOML = f'[run]\nname = "{POISON}"\n[[nodes]]\nname = "p"\nhost = "poison.invalid"\nshards = ["/p/*.jsonl"]\n'
POISON_SECRETS = f'[nodes.n1]\npassword = "{POISON}"\n[auth]\nredirect_uri = "http://{POISON}"\n'


def test_canary(tmp_path):
    assert find_config_path() is None
    assert not any(name.startswith("RUNHEALTH_") for name in os.environ)
    assert "SSH_AUTH_SOCK" not in os.environ
    home = Path.home()
    assert not (home / ".ssh" / "config").exists() and not (home / ".streamlit").exists()
    assert not Path.cwd().samefile(ROOT) and not SECRETS_PATH.exists()
    config = tmp_path / "c.toml"
    config.write_text(f'[run]\nname = "x"\n[[nodes]]\nname = "n1"\nhost = "h"\nshards = ["{tmp_path}/*.jsonl"]\n')
    assert load_config(config).nodes[0].password is None  # no secrets.toml read from anywhere
    st.cache_resource.clear()
    os.environ["RUNHEALTH_COLLECTOR"] = "off"
    try:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30).run()
    finally:
        del os.environ["RUNHEALTH_COLLECTOR"]
        st.cache_resource.clear()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("DEMO" in m.value for m in at.markdown)
    assert POISON not in at.title[0].value


def copy_checkout(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "artifacts", "*.sqlite3*")
    for name in ("runhealth", "components", "pages", "tests", ".streamlit"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("app.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


def test_a_poisoned_environment_changes_no_result(tmp_path):
    repo = copy_checkout(tmp_path / "repo")
    (repo / "runhealth.toml").write_text(POISON_TOML)
    (repo / ".streamlit" / "secrets.toml").write_text(POISON_SECRETS)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(f"Host *\n  HostName {POISON}.invalid\n  Port 1\n")
    (home / ".streamlit").mkdir()
    (home / ".streamlit" / "secrets.toml").write_text(POISON_SECRETS)
    (home / ".streamlit" / "config.toml").write_text("[server]\nport = 1\n")
    (tmp_path / "env.toml").write_text(POISON_TOML)
    env = {
        **os.environ,
        "HOME": str(home),
        "RUNHEALTH_CONFIG": str(tmp_path / "env.toml"),
        "RUNHEALTH_COLLECTOR": "off",
        "PYTHONPATH": str(repo),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            "tests/test_hermetic.py::test_canary",
            "tests/test_config.py",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout
