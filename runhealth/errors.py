"""The one exception family of runhealth's core.

Every error the core raises on purpose is a `RunhealthError` with a plain one-line message a
user can act on ("connection refused by 127.0.0.2:2222"); pages show ``str(exc)`` on the
affected node's card. Messages never carry passphrases, passwords or key material.
"""

from __future__ import annotations


class RunhealthError(Exception):
    """Base of every error raised on purpose by runhealth."""


class ConfigError(RunhealthError):
    """The configuration is invalid; the message names the file, node and field."""


class TransportError(RunhealthError):
    """The link to a node's agent failed (SSH, subprocess, or the agent process died)."""


class HostKeyError(TransportError):
    """The node's SSH host key is unknown or has changed; the connection was refused."""


class AuthError(TransportError):
    """SSH authentication failed, or the private key could not be loaded."""


class ConnectError(TransportError):
    """The node could not be reached: DNS, refused, unreachable, no SSH banner, jump host."""


class CommandTimeout(TransportError):
    """The agent did not answer a request before its deadline."""


class AgentError(RunhealthError):
    """The agent answered, but with an error, garbage, or an unexpected schema."""


class StoreError(RunhealthError):
    """The history store could not be read or written."""


class StoreBusyError(StoreError):
    """Another process holds the store's collector lock: it collects, this one may only read."""


class StoreLockedError(StoreError):
    """SQLite said the store is locked (SQLITE_BUSY / SQLITE_LOCKED) past the busy timeout: another
    connection's write held it. Nothing is wrong with the file; trying again later may succeed."""


def one_line(exc: BaseException) -> str:
    """A one-line, user-facing description of a failure (its first line, at most 500 characters)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:500]


__all__ = [
    "AgentError",
    "AuthError",
    "CommandTimeout",
    "ConfigError",
    "ConnectError",
    "HostKeyError",
    "RunhealthError",
    "StoreBusyError",
    "StoreError",
    "TransportError",
    "one_line",
]
