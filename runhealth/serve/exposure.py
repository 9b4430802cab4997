"""Who can reach the dashboard: a non-loopback address is served only behind a sign-in.

Pages show sample texts, the continuation download holds whole prompts and completions, and
"Re-sample" starts SSH work on the nodes. So `runhealth dashboard --address 0.0.0.0` (or any
address other than this machine's loopback) is refused unless every run is restricted
(`allowed_users`) and sign-in exists (`[auth]` in .streamlit/secrets.toml, where Streamlit reads
it: the working directory's, then the home folder's), or `--public-without-auth` says, loudly,
that the dashboard is meant to be open to anyone; then every page says so (components/page.py
reads the address Streamlit serves on and the same rule). The standard library and the one TOML
reader (runhealth.settings.tomlfile); nothing here imports Streamlit.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable
from pathlib import Path

from runhealth.errors import ConfigError
from runhealth.settings.tomlfile import read_secrets

FLAG = "--public-without-auth"


@functools.lru_cache(maxsize=64)
def is_loopback(address: str) -> bool:
    """True when `address` (an IP or a host name) reaches only this machine."""
    text = address.strip().strip("[]")
    if not text:
        return False  # Streamlit's empty address: every interface
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(text, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def secrets_paths(cwd: Path | None = None) -> list[Path]:
    return [(cwd or Path.cwd()) / ".streamlit" / "secrets.toml", Path.home() / ".streamlit" / "secrets.toml"]


def auth_configured(paths: Iterable[Path] | None = None) -> bool:
    """True when a secrets file Streamlit reads has an [auth] table (sign-in is possible)."""
    for path in secrets_paths() if paths is None else paths:
        try:
            if isinstance(read_secrets(path).get("auth"), dict):
                return True
        except ConfigError:
            continue  # Streamlit cannot sign anyone in with an unreadable file either
    return False


def open_runs(allowed_users_per_run: Iterable[list[str]], auth: bool) -> bool:
    """True when some run would be shown to anyone who reaches the page (no allow-list or no sign-in)."""
    lists = list(allowed_users_per_run)
    return not auth or not lists or any(not users for users in lists)


def refusal(address: str, allowed_users_per_run: Iterable[list[str]] | None, auth: bool) -> str | None:
    """Why the dashboard must not serve on `address` (None when it may).

    `allowed_users_per_run` None: the config did not load, so nothing proves the runs restricted.
    """
    if is_loopback(address):
        return None
    if allowed_users_per_run is not None and not open_runs(allowed_users_per_run, auth):
        return None
    why = (
        "no [auth] section in .streamlit/secrets.toml (nobody can sign in)"
        if not auth
        else "a run without allowed_users"
        if allowed_users_per_run is not None
        else "the config does not load, so no run is known to be restricted"
    )
    return (
        f"refusing to serve on {address}, which other machines can reach, with {why}: anyone who reaches "
        "the port could read sampled prompts and completions, download the continuation JSONL and start "
        "sampling over SSH. Set allowed_users on every run and [auth] in .streamlit/secrets.toml, serve "
        f"on 127.0.0.1 behind an SSH tunnel, or pass {FLAG} to serve it open to anyone (every page then says so)."
    )


def open_banner(address: str, port: int | str) -> str:
    return (
        f"This dashboard is open to anyone who can reach {address}:{port}: no sign-in protects it "
        f"(started with {FLAG}, or a run without allowed_users). Sample texts and downloads are public."
    )
