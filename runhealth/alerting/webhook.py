"""Webhook URLs and one delivery attempt: checked when loaded, redacted everywhere, sent under a deadline.

Webhook URLs are secrets (a Slack URL is a write credential): they come only from
`.streamlit/secrets.toml` (`[alerts] webhook_urls = [...]`) or `RUNHEALTH_WEBHOOK_URLS`
(comma-separated). Each is checked once, when loaded (`check_urls`): printable ASCII only (two
URLs joined by a newline would otherwise post to a garbled path and echo it in errors), an
http(s) scheme, a host, a port from 1 to 65535, closed IPv6 brackets. A bad entry is refused
in one sentence that names its position, never its text, and the others are used.

Only `redact(url)` (scheme, host, port) is ever logged, stored or shown, and every error text
goes through `redact_text()`, which removes the URL and its secret parts (path, query, user)
wherever the error echoes them.

`post_json` makes one attempt under a total deadline: a watchdog shuts the socket when the
deadline passes, so a receiver that drips its answer a byte a second cannot hold the attempt
past it (a socket timeout bounds each read, not the whole). Redirects are not followed: a 3xx
is a failed delivery naming the (redacted) target. Following one would send the alert, and the
run's details, to an address nobody configured, and 301/302 are answered with a GET by most
clients, which loses the body; a receiver that moved is fixed by configuring its new URL,
which the failure says.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runhealth.errors import ConfigError, RunhealthError
from runhealth.settings.config import SECRETS_PATH
from runhealth.settings.tomlfile import read_secrets
from runhealth.textsafe import escape

URLS_ENV = "RUNHEALTH_WEBHOOK_URLS"
SCHEMES = ("http", "https", "slack+http", "slack+https")
DEADLINE_S = 5.0  # one attempt, connect to last byte read
ERROR_CHARS = 300
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")


class DeliveryError(RunhealthError):
    """The receiver answered, but not with a 2xx, or not within the deadline."""


# -- loading and checking ---------------------------------------------------------------------
def load_urls(
    secrets_path: Path = SECRETS_PATH, environ: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Webhook URLs from RUNHEALTH_WEBHOOK_URLS if set, else secrets.toml [alerts] webhook_urls.

    Returns:
        (the usable URLs, one sentence per refused entry); see `check_urls`.

    Raises:
        ConfigError: the secrets file cannot be read, or webhook_urls is not a list.
    """
    environ = os.environ if environ is None else environ
    if environ.get(URLS_ENV, "").strip():
        return check_urls([u.strip() for u in environ[URLS_ENV].split(",") if u.strip()], URLS_ENV)
    where = f"{secrets_path} [alerts] webhook_urls"
    urls = (read_secrets(Path(secrets_path)).get("alerts") or {}).get("webhook_urls") or []
    if not isinstance(urls, list):
        raise ConfigError(f"{where} must be a list of URLs")
    return check_urls(urls, where)


def check_urls(urls: Sequence[object], where: str) -> tuple[list[str], list[str]]:
    """(the entries that are usable URLs, a sentence per other entry naming `where` and its position)."""
    good, refused = [], []
    for i, url in enumerate(urls, start=1):
        why = url_problem(url)
        if why is None:
            good.append(str(url))
        else:
            refused.append(f"{where}: webhook entry {i} {why}; it is skipped, the other webhooks are used.")
    return good, refused


def url_problem(url: object) -> str | None:
    """Why `url` cannot be a webhook (words that never quote it), or None when it can."""
    if not isinstance(url, str):
        return "is not a string"
    if any(not c.isprintable() or c.isspace() for c in url):
        return "contains a control character or a space (separate several URLs with commas, not newlines)"
    if not url.isascii():
        return "contains a non-ASCII character (percent-encode it)"
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError as exc:
        return (
            "has an unclosed IPv6 bracket" if "IPv6" in str(exc) else "has a port that is not a number from 1 to 65535"
        )
    if parsed.scheme not in SCHEMES:
        return "is not an http(s) URL"
    if not parsed.hostname:
        return "has no host"
    if port == 0:
        return "has a port that is not a number from 1 to 65535"
    return None


# -- redaction ----------------------------------------------------------------------------------
def redact(url: str) -> str:
    """What may be shown of a webhook URL: its scheme, host and port (the path is the secret)."""
    try:
        parsed = urllib.parse.urlsplit(url)
        port = f":{parsed.port}" if parsed.port else ""
        host = parsed.hostname or "?"
    except ValueError:
        return "<invalid URL>"
    host = f"[{host}]" if ":" in host else host
    return escape(f"{parsed.scheme}://{host}{port}/…")


def redact_text(text: str, url: str) -> str:
    """`text` (an error) without `url` or its secret parts, other URLs in it reduced to
    scheme://host/…, control characters made visible, at most ERROR_CHARS long."""
    for whole in sorted({url, target(url)}, key=len, reverse=True):
        text = text.replace(whole, redact(url))
    text = _URL_RE.sub(lambda m: redact(m.group(0)), text)
    for secret in sorted(_secret_parts(url), key=len, reverse=True):
        text = text.replace(secret, "…")
    return escape(text)[:ERROR_CHARS]


def _secret_parts(url: str) -> set[str]:
    """The path, query, fragment and user info as written (no parsing that drops characters),
    and each of their control-character-free pieces, as an error may quote them."""
    rest = url.split("://", 1)[-1]
    netloc, sep, tail = rest.partition("/")
    parts = {sep + tail} if tail else set()
    if "@" in netloc:
        parts.add(netloc.rsplit("@", 1)[0])
    for part in list(parts):
        parts.update(p for p in re.split(r"[\x00-\x20\x7f]+", part) if len(p) > 1)
    return {p for p in parts if len(p) > 1}


def target(url: str) -> str:
    """The http(s) URL a webhook URL posts to (`slack+https://` is https with Slack's format)."""
    return url.split("+", 1)[1] if url.startswith("slack+") else url


def is_slack(url: str) -> bool:
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme.startswith("slack+") or (parsed.hostname or "").endswith("hooks.slack.com")


def describe_error(exc: BaseException, url: str) -> str:
    """One line for the Nodes page and the log: what went wrong, the URL's secrets removed."""
    if isinstance(exc, DeliveryError):
        text = str(exc)
    else:
        detail = str(exc).strip()
        text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return redact_text(text, url)


# -- one attempt ---------------------------------------------------------------------------------
class _Watchdog:
    """Shuts the connection's socket when the deadline passes (a blocked read then returns)."""

    def __init__(self, conn: http.client.HTTPConnection, deadline_s: float):
        self.conn, self.fired = conn, False
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sock = self.conn.sock
        if sock is not None:
            try:  # the plain socket's shutdown, also under TLS: it wakes a thread blocked in recv
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def check(self) -> None:
        with self._lock:  # after connect(): a later _fire sees the socket and shuts it
            if self.fired:
                raise TimeoutError

    def cancel(self) -> None:
        self._timer.cancel()


def _redirect_target(url: str, location: str | None) -> str:
    if not location:
        return "nowhere (no Location header)"
    try:
        return redact(urllib.parse.urljoin(target(url), location))
    except ValueError:
        return "<invalid URL>"


def post_json(url: str, payload: dict[str, Any], deadline_s: float = DEADLINE_S) -> None:
    """POST `payload` as JSON to `url`, done or abandoned within `deadline_s`.

    Raises:
        DeliveryError: a non-2xx answer (a 3xx included: redirects are not followed), or no
            complete answer before the deadline.
        OSError, http.client.HTTPException: the connection failed.
    """
    parts = urllib.parse.urlsplit(target(url))
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=deadline_s)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    watchdog = _Watchdog(conn, deadline_s)
    try:
        conn.connect()
        watchdog.check()
        body = json.dumps(payload).encode()
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", "User-Agent": "runhealth"})
        resp = conn.getresponse()
        resp.read(1024)
        status, location = resp.status, resp.getheader("Location")
    except Exception as exc:
        # The socket's own timeout (deadline_s of silence) may beat the watchdog by a hair: the
        # same event, so the same words.
        if watchdog.fired or isinstance(exc, TimeoutError):
            raise DeliveryError(f"no complete answer within the {deadline_s:g} s deadline") from None
        raise
    finally:
        watchdog.cancel()
        conn.close()
    if 300 <= status < 400:
        where = _redirect_target(url, location)
        raise DeliveryError(
            f"HTTP {status}: redirect to {where} not followed, the alert was not delivered"
            " (set the webhook URL to the address it redirects to)"
        )
    if not 200 <= status < 300:
        raise DeliveryError(f"HTTP {status}")
