"""Who may scrape /metrics, from where, over what, and which runs a scrape sees.

/metrics carries every live run's series (node names, GPU UUIDs, finish reasons, progress), so
it follows the dashboard's rules. Authentication is a bearer token read from a file
(`--metrics-token-file` / `[run] metrics_token_file`, never a command-line value, never logged);
Prometheus sends it with `authorization: {credentials_file: ...}`, which trims the file the same
way. `--metrics-tls-cert-file` / `--metrics-tls-key-file` (or the `[run]` keys) serve it over
HTTPS, so the token does not cross the network in clear. With a token every request without `Authorization: Bearer <token>` gets 401, and a scrape
that carries it sees every live run. Without a token a scrape is anonymous: it sees only the runs
without `allowed_users` (a restricted run is left out whatever the address, loopback included:
any local account can reach 127.0.0.1), and an address other machines can reach is refused
unless `--public-without-auth` says the open endpoint is meant.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import ssl
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from runhealth.errors import ConfigError
from runhealth.serve.exposure import FLAG as FLAG  # re-exported: the refusal names it
from runhealth.serve.exposure import is_loopback as is_loopback
from runhealth.settings.config import RunConfig

MIN_TOKEN_CHARS = 16  # `openssl rand -hex 32` gives 64
MAX_TOKEN_BYTES = 4096
TOKEN_KEY = "metrics_token_file"
HOW_TO_MAKE = (
    f"(e.g. `openssl rand -hex 32 > FILE; chmod 600 FILE`, then --metrics-token-file FILE or [run] {TOKEN_KEY})"
)


@dataclasses.dataclass(frozen=True)
class MetricsAccess:
    """/metrics' access options from the command line (each None: the first live run's `[run]` key)."""

    token_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    public: bool = False  # --public-without-auth: an anonymous non-loopback bind is meant

    def resolved(self, config: RunConfig | None) -> MetricsAccess:
        """The command line's values, else `config`'s."""
        if config is None:
            return self
        return dataclasses.replace(
            self,
            token_file=self.token_file or config.metrics_token_file,
            tls_cert_file=self.tls_cert_file or config.metrics_tls_cert_file,
            tls_key_file=self.tls_key_file or config.metrics_tls_key_file,
        )


@dataclasses.dataclass(frozen=True)
class Guard:
    """What /metrics is served with: the token (None: anonymous) and the TLS context (None: HTTP)."""

    token: str | None
    tls: ssl.SSLContext | None


def guard(access: MetricsAccess, address: str) -> Guard:
    """The token and TLS context `access` asks for, checked.

    Raises:
        ConfigError: a file that does not read or does not fit (naming it, never its content), a
            certificate without its key or the reverse, or an anonymous non-loopback bind
            without `public` (`refusal`'s words).
    """
    token = read_token(access.token_file) if access.token_file else None
    tls = tls_context(access.tls_cert_file, access.tls_key_file)
    refused = None if access.public else refusal(address, token is not None)
    if refused is not None:
        raise ConfigError(refused)
    return Guard(token, tls)


def tls_context(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """A server TLS context from a PEM certificate (chain) and its key; None when neither is set."""
    if not cert_file and not key_file:
        return None
    if not cert_file or not key_file:
        given, missing = ("certificate", "key") if cert_file else ("key", "certificate")
        raise ConfigError(f"/metrics TLS needs a {missing} file too (only the {given} is set)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(Path(cert_file).expanduser()), str(Path(key_file).expanduser()))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{cert_file}, {key_file}: cannot load the /metrics TLS certificate and key: {exc.strerror or exc}"
        ) from exc
    return context


def read_token(path: str | os.PathLike) -> str:
    """The token in `path`, whitespace at either end trimmed (as Prometheus's credentials_file).

    Raises:
        ConfigError: the file is missing, unreadable, too large, empty, shorter than
            MIN_TOKEN_CHARS or holds whitespace inside; the message names the file, never the content.
    """
    where = Path(path).expanduser()
    try:
        with open(where, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the /metrics token file: {exc.strerror or exc}") from exc
    if len(raw) > MAX_TOKEN_BYTES:
        raise ConfigError(f"{where}: the /metrics token file is over {MAX_TOKEN_BYTES} bytes: not a token")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: the /metrics token must be printable ASCII {HOW_TO_MAKE}") from None
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or any(c.isspace() for c in token):
        raise ConfigError(
            f"{where}: the /metrics token must be one word of at least {MIN_TOKEN_CHARS} printable characters"
            f" {HOW_TO_MAKE}"
        )
    return token


def refusal(address: str, token: bool) -> str | None:
    """Why /metrics must not be served anonymously on `address` (None when it may)."""
    if token or is_loopback(address):
        return None
    return (
        f"refusing to serve /metrics on {address}, which other machines can reach, without authentication:"
        " anyone who reaches the port could read every open run's node names, GPUs and progress. Give it a"
        f" bearer token {HOW_TO_MAKE}, serve it on 127.0.0.1, or pass {FLAG} to serve the open runs to anyone"
    )


def authorized(header: str | None, token: str) -> bool:
    """True when an Authorization header carries `token` (compared in constant time)."""
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode("utf-8", "replace"), token.encode("ascii"))


def guarded(app: Callable[..., list[bytes]], token: str) -> Callable[..., list[bytes]]:
    """`app` behind the token: any request without it gets 401 and no data."""

    def check(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if authorized(environ.get("HTTP_AUTHORIZATION"), token):
            return app(environ, start_response)
        body = b"401 Unauthorized: /metrics needs 'Authorization: Bearer <token>'\n"
        headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("WWW-Authenticate", 'Bearer realm="runhealth /metrics"'),
        ]
        start_response("401 Unauthorized", headers)
        return [body]

    return check


def anonymous_runs(allowed_users_per_run: Iterable[list[str]]) -> list[bool]:
    """For each run, whether an anonymous scrape may see it: only a run without allowed_users."""
    return [not users for users in allowed_users_per_run]
