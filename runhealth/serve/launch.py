"""`runhealth dashboard`: find the Streamlit app and build the `streamlit run` command for it.

The dashboard is two processes (runhealth/serve/supervise.py starts and stops them together): the
collector (`python -m runhealth collect`) and Streamlit as a pure viewer of the stores
(RUNHEALTH_COLLECTOR=off). A `STREAMLIT_*` environment variable wins over the app's own
config.toml (as it would under `streamlit run`); `--port`/`--address` win over both.

Installed from a wheel, the app (app.py, pages/, components/, .streamlit/config.toml) lives
inside the package as runhealth/_app/; in a checkout (or an editable install) it is the
repository's own app.py. Streamlit reads `.streamlit/config.toml` only from the working
directory and the home folder, and the caller's working directory is kept (that is where
./runhealth.toml and .streamlit/secrets.toml are looked up), so the app's own settings are
passed as command-line options instead. Nothing here imports Streamlit.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from runhealth.errors import ConfigError
from runhealth.serve import exposure
from runhealth.settings.tomlfile import read_toml

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # runhealth/ (this file is runhealth/serve/launch.py)
DEFAULT_PORT = 8501
DEFAULT_ADDRESS = "127.0.0.1"


def env_var(option: str) -> str:
    """Streamlit's environment variable for `section.key` (server.runOnSave -> STREAMLIT_SERVER_RUN_ON_SAVE)."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", option.replace(".", "_"))
    return "STREAMLIT_" + re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).upper()


def listen_on(port: int | None, address: str | None, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """The port and address to serve on: the command line, else STREAMLIT_SERVER_PORT/_ADDRESS, else defaults.

    Raises:
        ConfigError: STREAMLIT_SERVER_PORT is not a port number.
    """
    env = os.environ if env is None else env
    if port is None:
        text = env.get(env_var("server.port"), str(DEFAULT_PORT))
        if not text.strip().isdigit() or not 0 < int(text) < 65536:
            raise ConfigError(f"STREAMLIT_SERVER_PORT={text!r} is not a port number (1-65535)")
        port = int(text)
    return port, address or env.get(env_var("server.address")) or DEFAULT_ADDRESS


def app_dir() -> Path:
    """The folder holding app.py: the packaged copy, else the checkout's."""
    for folder in (PACKAGE_DIR / "_app", PACKAGE_DIR.parent):
        if (folder / "app.py").is_file() and (folder / "components").is_dir():
            return folder
    raise ConfigError(f"the dashboard app is missing: no app.py in {PACKAGE_DIR / '_app'} or {PACKAGE_DIR.parent}")


def streamlit_options(folder: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """The app's .streamlit/config.toml as `--section.key value` options (those not set by a
    STREAMLIT_* variable in `env`: a command-line option would override the variable)."""
    env = os.environ if env is None else env
    path = folder / ".streamlit" / "config.toml"
    raw = read_toml(path) if path.is_file() else {}
    options = []
    for section, values in raw.items():
        for key, value in values.items():
            if f"{section}.{key}" in ("server.port", "server.address") or env_var(f"{section}.{key}") in env:
                continue  # `runhealth dashboard --port/--address` decide these; the variable wins
            text = str(value).lower() if isinstance(value, bool) else str(value)
            options += [f"--{section}.{key}", text]
    return options


def dashboard_command(config: Path | None, port: int, address: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment for `streamlit run` as a viewer of the stores (the config passed on
    as an absolute path; RUNHEALTH_COLLECTOR=off: the collector is a process of its own)."""
    folder = app_dir()
    # -P: the caller's working directory stays off sys.path (a stray ./timeit.py must not shadow the stdlib).
    # components/serve.py is `python -m streamlit` with pages/ auto-discovery off from the first session.
    argv = [
        sys.executable,
        "-P",
        str(folder / "components" / "serve.py"),
        "run",
        str(folder / "app.py"),
        *streamlit_options(folder),
        "--server.port",
        str(port),
        "--server.address",
        address,
    ]
    env = dict(os.environ)
    if config is not None:
        env["RUNHEALTH_CONFIG"] = str(config.expanduser().absolute())
    env["RUNHEALTH_COLLECTOR"] = "off"
    return argv, env


def collector_command(config: Path | None, public: bool = False) -> tuple[list[str], dict[str, str]]:
    """argv and environment for the dashboard's collector: `runhealth collect` over the same
    config (absolute), or the demo; it waits for a config that does not load yet. `public`: the
    dashboard's --public-without-auth, passed on (it also opens an anonymous non-loopback /metrics)."""
    where = ["--config", str(config.expanduser().absolute())] if config is not None else ["--demo"]
    env = {k: v for k, v in os.environ.items() if k != "RUNHEALTH_COLLECTOR_PID"}
    # -P keeps the caller's folder off sys.path; the package is found where this one was.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_DIR.parent), env.get("PYTHONPATH")) if p)
    flag = [exposure.FLAG] if public else []
    return [sys.executable, "-P", "-m", "runhealth", "collect", *where, "--wait-for-config", *flag], env
