"""Configuration: one TOML file describing the run and its nodes.

The file is `--config`, else the path in `RUNHEALTH_CONFIG`, else `runhealth.toml` in the
working directory (see `find_config_path`). Every value is checked here, once, so the rest of the code can trust it; a wrong
value fails fast with a message naming the file, the node and the field. Secrets
(passphrases, passwords) never live in this file: they come from `.streamlit/secrets.toml`
(`[nodes.<name>] passphrase = "..."`) or from ssh-agent, and `NodeConfig.public_dict()` is
the only view of a node that pages may show.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from runhealth.errors import ConfigError

CONFIG_ENV = "RUNHEALTH_CONFIG"
DEFAULT_CONFIG_NAME = "runhealth.toml"
SECRETS_PATH = Path(".streamlit") / "secrets.toml"
_PYTHON_RE = re.compile(r"^[A-Za-z0-9_./+-]+$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.@:-]{1,64}$")


@dataclasses.dataclass
class NodeConfig:
    """One node: where to reach it and what to read there."""

    name: str
    host: str
    shards: list[str]
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    metrics_urls: list[str] = dataclasses.field(default_factory=list)
    python: str = "python3"
    gpu: str = "auto"
    finish_reason_path: str | None = None
    completion_tokens_path: str | None = None
    prompt_path: str | None = None  # where the prompt lives in a line (dotted), for continuation batches
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 30.0
    scan_workers: int | None = None  # None: a quarter of the node's cores, 1..8 (decided on the node)
    demo_gpus: int = 0
    # Secrets: filled from secrets.toml, never from the config file, never shown.
    passphrase: str | None = dataclasses.field(default=None, repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)

    @property
    def is_local(self) -> bool:
        return self.host == "local"

    def public_dict(self) -> dict[str, Any]:
        """The node's settings with every secret left out (safe to display or store)."""
        out = dataclasses.asdict(self)
        for key in ("passphrase", "password"):
            out.pop(key)
            out[f"{key}_set"] = getattr(self, key) is not None
        return out


@dataclasses.dataclass
class RunConfig:
    """The run as a whole."""

    name: str
    nodes: list[NodeConfig]
    target_completions: int | None = None
    max_output_tokens: int | None = None
    interval_s: float = 10.0
    store_path: str | None = None
    truncation_warn_fraction: float = 0.02
    truncation_alert_fraction: float = 0.05
    stale_after_s: float | None = None
    stall_after_s: float | None = None  # default max(3 x interval_s, 120 s): see runhealth.health
    kiosk_rotate_s: float = 20.0
    continuation_model: str | None = None  # the model name continuation batch requests ask for
    allowed_users: list[str] = dataclasses.field(default_factory=list)
    metrics_port: int | None = None  # serve Prometheus /metrics from the collecting process
    metrics_address: str = "127.0.0.1"
    raw_keep_h: float = 24.0  # raw 10 s history kept this long, then rolled up (runhealth.rollup)
    source: str = "<built-in>"
    demo: bool = False

    @property
    def stale_after(self) -> float:
        """Seconds without a successful poll before a node counts as stale."""
        from runhealth.health import stale_after_s  # the one rule; imported here, config loads first

        return stale_after_s(self.interval_s, self.stale_after_s)

    @property
    def stall_after(self) -> float:
        """Seconds without new completions before the Overview calls the run (or a node) stalled."""
        return self.stall_after_s if self.stall_after_s else max(3 * self.interval_s, 120.0)

    def resolved_store_path(self) -> Path:
        if self.store_path:
            return Path(self.store_path).expanduser()
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)
        return cache_dir() / f"{slug}.sqlite3"


def cache_dir() -> Path:
    """The user's cache folder for runhealth (XDG_CACHE_HOME honoured)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runhealth"


# field name -> (type(s), required)
_RUN_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "name": ((str,), True),
    "target_completions": ((int,), False),
    "max_output_tokens": ((int,), False),
    "interval_s": ((int, float), False),
    "store_path": ((str,), False),
    "truncation_warn_fraction": ((int, float), False),
    "truncation_alert_fraction": ((int, float), False),
    "stale_after_s": ((int, float), False),
    "stall_after_s": ((int, float), False),
    "kiosk_rotate_s": ((int, float), False),
    "continuation_model": ((str,), False),
    "allowed_users": ((list,), False),
    "metrics_port": ((int,), False),
    "metrics_address": ((str,), False),
    "raw_keep_h": ((int, float), False),
}
_NODE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "name": ((str,), True),
    "host": ((str,), True),
    "shards": ((list,), True),
    "port": ((int,), False),
    "user": ((str,), False),
    "identity_file": ((str,), False),
    "known_hosts": ((str,), False),
    "accept_new_host_key": ((bool,), False),
    "metrics_urls": ((list,), False),
    "python": ((str,), False),
    "gpu": ((str,), False),
    "finish_reason_path": ((str,), False),
    "completion_tokens_path": ((str,), False),
    "prompt_path": ((str,), False),
    "connect_timeout_s": ((int, float), False),
    "command_timeout_s": ((int, float), False),
    "scan_workers": ((int,), False),
}
_SECRET_KEYS = {"passphrase", "password", "private_key"}


def find_config_path(explicit: str | os.PathLike | None = None) -> Path | None:
    """The config file to use, or None for the built-in demo."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    local = Path(DEFAULT_CONFIG_NAME)
    return local if local.exists() else None


def load_config(path: str | os.PathLike, secrets_path: Path | None = None) -> RunConfig:
    """Read and validate a config file.

    Raises:
        ConfigError: the file is missing or unreadable, or a field is wrong (the message
            names the file, the node and the field).
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    config = parse_config(raw, source=str(path))
    apply_secrets(config, secrets_path if secrets_path is not None else SECRETS_PATH)
    return config


def parse_config(raw: dict[str, Any], source: str = "<config>") -> RunConfig:
    """Validate an already-parsed TOML document (see `load_config`)."""
    if "alerts" in raw:  # webhook URLs are credentials: never in the (shareable) config file
        raise ConfigError(f"{source}: [alerts] must not be in the config file; put webhook_urls in "
                          f"{SECRETS_PATH} under [alerts] or in RUNHEALTH_WEBHOOK_URLS")
    _check_keys(raw, {"run", "nodes"}, source)
    run = raw.get("run")
    if not isinstance(run, dict):
        raise ConfigError(f"{source}: missing [run] table")
    run_values = _check_table(run, _RUN_FIELDS, f"{source}: [run]")
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError(f"{source}: no [[nodes]] defined (at least one node is required)")
    nodes = [_parse_node(n, i, source) for i, n in enumerate(nodes_raw)]
    names = [n.name for n in nodes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{source}: node name {dupes[0]!r} is used twice (field 'name')")
    config = RunConfig(nodes=nodes, source=source, **run_values)
    _check_run_values(config, source)
    return config


def _parse_node(raw: Any, index: int, source: str) -> NodeConfig:
    where = f"{source}: nodes[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: each [[nodes]] entry must be a table")
    if isinstance(raw.get("name"), str):
        where = f"{source}: node {raw['name']!r}"
    secret = sorted(_SECRET_KEYS & set(raw))
    if secret:
        raise ConfigError(
            f"{where}: field {secret[0]!r} must not be in the config file; put it in "
            f"{SECRETS_PATH} under [nodes.{raw.get('name', '<name>')}] or use ssh-agent"
        )
    values = _check_table(raw, _NODE_FIELDS, where)
    node = NodeConfig(**values)
    _check_node_values(node, where)
    return node


def _check_keys(table: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _check_table(table: dict, fields: dict, where: str) -> dict[str, Any]:
    _check_keys(table, set(fields), where)
    out = {}
    for key, (types, required) in fields.items():
        if key not in table:
            if required:
                raise ConfigError(f"{where}: missing required field {key!r}")
            continue
        value = table[key]
        # bool is an int subclass: `port = true` must not pass as a number.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
        out[key] = value
    return out


def _check_run_values(config: RunConfig, where: str) -> None:
    if not _NAME_RE.match(config.name):
        raise ConfigError(f"{where}: [run] field 'name' must be 1-64 letters, digits, '_.@:-'")
    for field in ("target_completions", "max_output_tokens"):
        value = getattr(config, field)
        if value is not None and value <= 0:
            raise ConfigError(f"{where}: [run] field {field!r} must be positive")
    if not 0.5 <= config.interval_s <= 3600:
        raise ConfigError(f"{where}: [run] field 'interval_s' must be between 0.5 and 3600")
    for field in ("stall_after_s", "kiosk_rotate_s"):
        value = getattr(config, field)
        if value is not None and not 1 <= value <= 86400:
            raise ConfigError(f"{where}: [run] field {field!r} must be between 1 and 86400 seconds")
    for field in ("truncation_warn_fraction", "truncation_alert_fraction"):
        if not 0 <= getattr(config, field) <= 1:
            raise ConfigError(f"{where}: [run] field {field!r} must be a fraction between 0 and 1")
    if config.metrics_port is not None and not 0 < config.metrics_port < 65536:
        raise ConfigError(f"{where}: [run] field 'metrics_port' must be between 1 and 65535")
    if not config.metrics_address or any(c.isspace() for c in config.metrics_address):
        raise ConfigError(f"{where}: [run] field 'metrics_address' must be an IP address or host name")
    if not 1 <= config.raw_keep_h <= 24 * 14:
        raise ConfigError(f"{where}: [run] field 'raw_keep_h' must be between 1 and 336 hours")
    if not all(isinstance(u, str) for u in config.allowed_users):
        raise ConfigError(f"{where}: [run] field 'allowed_users' must be a list of strings")


def _check_node_values(node: NodeConfig, where: str) -> None:
    if not _NAME_RE.match(node.name):
        raise ConfigError(f"{where}: field 'name' must be 1-64 letters, digits, '_.@:-'")
    if not node.host or any(c.isspace() for c in node.host) or node.host.startswith("-"):
        raise ConfigError(f"{where}: field 'host' must be a host name, address or ssh alias")
    if not node.shards or not all(isinstance(s, str) and s for s in node.shards):
        raise ConfigError(f"{where}: field 'shards' must be a non-empty list of path globs")
    if not all(s.startswith(("/", "~")) for s in node.shards):
        raise ConfigError(f"{where}: field 'shards' must hold absolute paths (or ~/...)")
    if not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in node.metrics_urls):
        raise ConfigError(f"{where}: field 'metrics_urls' must be a list of http(s) URLs")
    if node.port is not None and not 0 < node.port < 65536:
        raise ConfigError(f"{where}: field 'port' must be between 1 and 65535")
    if not _PYTHON_RE.match(node.python):
        raise ConfigError(f"{where}: field 'python' must be a program name or path without spaces or shell characters")
    if node.gpu not in ("auto", "off", "demo"):
        raise ConfigError(f"{where}: field 'gpu' must be one of 'auto', 'off', 'demo'")
    if node.scan_workers is not None and not 1 <= node.scan_workers <= 8:
        raise ConfigError(f"{where}: field 'scan_workers' must be between 1 and 8 (leave it out for a quarter of the node's cores)")
    for field in ("connect_timeout_s", "command_timeout_s"):
        if not 0 < getattr(node, field) <= 600:
            raise ConfigError(f"{where}: field {field!r} must be between 0 and 600 seconds")


def apply_secrets(config: RunConfig, secrets_path: Path) -> None:
    """Fill node passphrases/passwords from Streamlit's secrets file, if it has any."""
    try:
        raw = tomllib.loads(Path(secrets_path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        # The exception text may quote the file's content: name the file only.
        raise ConfigError(f"{secrets_path}: cannot read secrets file ({type(exc).__name__})") from None
    per_node = raw.get("nodes", {})
    if not isinstance(per_node, dict):
        return
    for node in config.nodes:
        entry = per_node.get(node.name, {})
        if isinstance(entry, dict):
            node.passphrase = entry.get("passphrase") if isinstance(entry.get("passphrase"), str) else None
            node.password = entry.get("password") if isinstance(entry.get("password"), str) else None
