"""`runhealth dashboard`: find the Streamlit app and build the `streamlit run` command for it.

Installed from a wheel, the app (app.py, pages/, components/, .streamlit/config.toml) lives
inside the package as runhealth/_app/; in a checkout (or an editable install) it is the
repository's own app.py. Streamlit reads `.streamlit/config.toml` only from the working
directory and the home folder, and the caller's working directory is kept (that is where
./runhealth.toml and .streamlit/secrets.toml are looked up), so the app's own settings are
passed as command-line options instead. Nothing here imports Streamlit.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from runhealth.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parent


def app_dir() -> Path:
    """The folder holding app.py: the packaged copy, else the checkout's."""
    for folder in (PACKAGE_DIR / "_app", PACKAGE_DIR.parent):
        if (folder / "app.py").is_file() and (folder / "components").is_dir():
            return folder
    raise ConfigError(f"the dashboard app is missing: no app.py in {PACKAGE_DIR / '_app'} or {PACKAGE_DIR.parent}")


def streamlit_options(folder: Path) -> list[str]:
    """The app's .streamlit/config.toml as `--section.key value` options."""
    path = folder / ".streamlit" / "config.toml"
    raw = tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    options = []
    for section, values in raw.items():
        for key, value in values.items():
            if f"{section}.{key}" in ("server.port", "server.address"):
                continue  # `runhealth dashboard --port/--address` decide these
            text = str(value).lower() if isinstance(value, bool) else str(value)
            options += [f"--{section}.{key}", text]
    return options


def dashboard_command(config: Path | None, port: int, address: str, collect: bool) -> tuple[list[str], dict[str, str]]:
    """argv and environment for `streamlit run` (the config passed on as an absolute path)."""
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
    if not collect:
        env["RUNHEALTH_COLLECTOR"] = "off"
    return argv, env
