"""Configuration: one TOML file describing the run and its nodes.

The file is `--config`, else the path in `RUNHEALTH_CONFIG`, else `runhealth.toml` in the
working directory (see `find_config_path`). Every key is declared once, below, as a dataclass
field with a `spec(...)` (runhealth.settings.configspec): its TOML types, its rules, its default and its
README text. The checks, the defaults and the README's key table (`python -m runhealth.settings.config
--markdown`) all come from those declarations. Every value is checked here, once, so the rest of
the code can trust it; a wrong value fails fast with a message naming the file, the node and the
field. The loaded config is frozen.

Secrets (passphrases, passwords) never live in this file: they come from `.streamlit/secrets.toml`
(`[nodes.<name>] passphrase = "..."`) or from ssh-agent, are held as `Secret` (prints as '***')
and `NodeConfig.public_dict()` is the only view of a node that pages may show. Facts about how a
config is used rather than what the file says (where it came from, the demo) are a `RunContext`,
passed alongside.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from runhealth.errors import ConfigError
from runhealth.settings.configspec import Rule as _Rule
from runhealth.settings.configspec import (
    Secret,
    between,
    check_keys,
    check_table,
    markdown_table,
    matches,
    one_of,
    positive,
    spec,
    spec_of,
)
from runhealth.settings.tomlfile import TOML_SYNTAX, read_secrets, read_toml
from runhealth.settings.windows import RAW_KEEP_S, STALE_MIN_S, STALL_MIN_S, WINDOW_POLLS, stale_after_s, stall_after_s

CONFIG_ENV = "RUNHEALTH_CONFIG"
DEFAULT_CONFIG_NAME = "runhealth.toml"
SECRETS_PATH = Path(".streamlit") / "secrets.toml"
# The node interpreter rule; protocol.py checks the launch argv against it too.
PYTHON_RE = re.compile(r"^[A-Za-z0-9_./+-]+$")
_TOML_AT = re.compile(r"\(at line (\d+), column (\d+)\)")  # tomllib's "(at line 3, column 5)"
_NAME_RE = r"^[A-Za-z0-9_.@:-]{1,64}$"
_NAME_MUST = "must be 1-64 letters, digits, '_.@:-'"


def _text_without_spaces(v: str) -> bool:
    return bool(v) and not any(c.isspace() for c in v)


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """One node: where to reach it and what to read there."""

    name: str = field(
        metadata=spec(
            str,
            required=True,
            rules=[matches(_NAME_RE, _NAME_MUST)],
            doc="node name (same rules as the run name), unique",
        )
    )
    host: str = field(
        metadata=spec(
            str,
            required=True,
            rules=[
                _Rule(
                    lambda v: _text_without_spaces(v) and not v.startswith("-"),
                    "must be a host name, address or ssh alias",
                )
            ],
            doc='host name, address or `~/.ssh/config` alias; `"local"` = this machine, no SSH',
        )
    )
    shards: list[str] = field(
        metadata=spec(
            list,
            required=True,
            rules=[
                _Rule(
                    lambda v: bool(v) and all(isinstance(s, str) and s for s in v),
                    "must be a non-empty list of path globs",
                ),
                _Rule(lambda v: all(s.startswith(("/", "~")) for s in v), "must hold absolute paths (or ~/...)"),
            ],
            doc="absolute path globs (or `~/...`), expanded on the node",
        )
    )
    port: int | None = field(
        default=None,
        metadata=spec(int, rules=[between(1, 65535)], default_doc="`~/.ssh/config`, else 22", doc="SSH port"),
    )
    user: str | None = field(
        default=None, metadata=spec(str, default_doc="`~/.ssh/config`, else your user name", doc="SSH user")
    )
    identity_file: str | None = field(
        default=None, metadata=spec(str, default_doc="`~/.ssh/config`, ssh-agent, default keys", doc="private key")
    )
    known_hosts: str | None = field(
        default=None,
        metadata=spec(
            str,
            default_doc="`~/.ssh/config`'s `UserKnownHostsFile`, else `~/.ssh/known_hosts`",
            doc="host keys to trust",
        ),
    )
    accept_new_host_key: bool = field(
        default=False,
        metadata=spec(bool, doc="record an unknown host's key on first contact (a changed key is still refused)"),
    )
    metrics_urls: list[str] = field(
        default_factory=list,
        metadata=spec(
            list,
            rules=[
                _Rule(
                    lambda v: all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in v),
                    "must be a list of http(s) URLs",
                )
            ],
            doc="SGLang/vLLM Prometheus endpoints, fetched on the node",
        ),
    )
    python: str = field(
        default="python3",
        metadata=spec(
            str,
            rules=[matches(PYTHON_RE, "must be a program name or path without spaces or shell characters")],
            doc="the node's interpreter (3.8+)",
        ),
    )
    gpu: str = field(
        default="auto",
        metadata=spec(
            str,
            rules=[one_of("auto", "off", "demo")],
            doc='`"auto"` (NVML, else `nvidia-smi`), `"off"`, or `"demo"` (simulated GPUs, as the built-in demo uses)',
        ),
    )
    finish_reason_path: str | None = field(
        default=None,
        metadata=spec(str, default_doc="detected", doc="dotted path to the finish reason, when your schema is unusual"),
    )
    completion_tokens_path: str | None = field(
        default=None,
        metadata=spec(
            str, default_doc="detected", doc="dotted path to the completion token count, when your schema is unusual"
        ),
    )
    prompt_id_path: str | None = field(
        default=None,
        metadata=spec(
            str,
            default_doc="detected",
            doc="dotted path to the prompt's ID (detected: `custom_id`, `prompt_id`, `metadata.id`, `id`, "
            "`request_id`, `key`), for prompts answered / missing / answered twice",
        ),
    )
    prompt_tokens_path: str | None = field(
        default=None,
        metadata=spec(
            str,
            default_doc="detected",
            doc="dotted path to the prompt's token count (detected: each format's, e.g. `usage.prompt_tokens`, "
            "`usage.input_tokens`, `usageMetadata.promptTokenCount`, `prompt_eval_count`, `meta_info.prompt_tokens`)",
        ),
    )
    group_path: str | None = field(
        default=None,
        metadata=spec(
            str,
            default_doc="prompt-token bins",
            doc="dotted path to a grouping field (dataset, source, category): the share cut per group",
        ),
    )
    prompt_path: str | None = field(
        default=None,
        metadata=spec(
            str,
            default_doc="detected",
            doc="dotted path to the prompt (e.g. `request.messages`); standard chat-completion output has none, "
            "and continuation batches need it",
        ),
    )
    connect_timeout_s: float = field(
        default=10.0, metadata=spec(int, float, rules=[between(0, 600, "s", above=True)], doc="SSH connect timeout")
    )
    command_timeout_s: float = field(
        default=30.0,
        metadata=spec(int, float, rules=[between(0, 600, "s", above=True)], doc="one agent request's timeout"),
    )
    scan_workers: int | None = field(
        default=None,
        metadata=spec(
            int,
            rules=[between(1, 8, hint=" (leave it out for a quarter of the node's cores)")],
            default_doc="a quarter of the node's cores",
            doc="worker processes for the node's first scan of a large backlog, at lowered priority; "
            "`1` keeps it to the agent's one process",
        ),
    )
    # Secrets: filled from secrets.toml, never from the config file, never shown.
    passphrase: Secret | None = field(
        default=None,
        metadata=spec(str, in_file=False, secret=True, doc="the identity file's passphrase (secrets.toml)"),
    )
    password: Secret | None = field(
        default=None, metadata=spec(str, in_file=False, secret=True, doc="SSH password login (secrets.toml)")
    )

    def __post_init__(self) -> None:
        # A node built in code with a plain string (tests, tools) gets the same protection.
        for name in ("passphrase", "password"):
            value: object = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Secret(value))

    @property
    def is_local(self) -> bool:
        return self.host == "local"

    def public_dict(self) -> dict[str, Any]:
        """The node's settings with every secret left out (safe to display or store)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in SECRET_FIELDS:
                out[f"{f.name}_set"] = value is not None
            else:
                out[f.name] = list(value) if isinstance(value, list) else value
        return out


# Node keys that hold secrets (never in the config file, never shown), plus key names refused in
# the file because they would be secrets too. The one list: cards and the wire read it from here.
SECRET_FIELDS = frozenset(f.name for f in dataclasses.fields(NodeConfig) if (s := spec_of(f)) and s.secret)
SECRET_KEYS = SECRET_FIELDS | {"private_key"}

_FRACTION = _Rule(lambda v: 0 <= v <= 1, "must be a fraction between 0 and 1")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run as a whole: the file's `[run]` table and its nodes."""

    name: str = field(
        metadata=spec(
            str, required=True, rules=[matches(_NAME_RE, _NAME_MUST)], doc="run name: 1–64 letters, digits, `_.@:-`"
        )
    )
    nodes: list[NodeConfig] = field(default_factory=list)  # the [[nodes]] tables, checked apart
    target_completions: int | None = field(
        default=None, metadata=spec(int, rules=[positive()], doc="enables progress and ETA")
    )
    max_output_tokens: int | None = field(
        default=None,
        metadata=spec(
            int,
            rules=[positive()],
            default_doc="detected",
            doc="the `max_tokens` ceiling (detected from a pile-up of `finish_reason=length`)",
        ),
    )
    shared_queue: bool = field(
        default=False,
        metadata=spec(
            bool,
            doc="the nodes take work from one shared queue: the run's ETA is the run rate's; false: each node "
            "holds a fixed share (target / nodes), the run ends when its last node does, and a node that wrote "
            "its share is done, not stalled",
        ),
    )
    expected_prompts: int | None = field(
        default=None,
        metadata=spec(
            int,
            rules=[positive()],
            doc="how many distinct prompts the run should answer (prompts missing, progress and ETA)",
        ),
    )
    max_model_len: int | None = field(
        default=None,
        metadata=spec(
            int,
            rules=[positive()],
            doc="the server's context window: `length` stops below the ceiling that filled it are counted apart",
        ),
    )
    interval_s: float = field(
        default=10.0, metadata=spec(int, float, rules=[between(0.5, 3600, "s")], doc="poll period")
    )
    cut_labels: list[str] = field(
        default_factory=list,
        metadata=spec(
            list,
            rules=[
                _Rule(
                    lambda v: all(isinstance(x, str) and 0 < len(x) <= 64 for x in v),
                    "must be a list of finish-reason labels (strings of 1-64 characters)",
                )
            ],
            default_doc="`[]`",
            doc="finish reasons that mean cut at the token limit, besides each format's own (`length`, "
            "`max_tokens`, `MAX_TOKENS`, …): for a `finish_reason_path` whose labels are not known",
        ),
    )
    store_path: str | None = field(
        default=None,
        metadata=spec(
            str, default_doc="`~/.cache/runhealth/<name>.sqlite3`", doc="history store (`$XDG_CACHE_HOME` honoured)"
        ),
    )
    truncation_warn_fraction: float = field(
        default=0.02,
        metadata=spec(int, float, rules=[_FRACTION], doc="share of completions at the ceiling that raises a warning"),
    )
    truncation_alert_fraction: float = field(
        default=0.05, metadata=spec(int, float, rules=[_FRACTION], doc="… that raises an alert")
    )
    failed_warn_share: float = field(
        default=0.01,
        metadata=spec(
            int, float, rules=[_FRACTION], doc="share of requests that failed (errors, expired) that raises a warning"
        ),
    )
    failed_crit_share: float = field(
        default=0.05, metadata=spec(int, float, rules=[_FRACTION], doc="… that raises a critical alert")
    )
    stale_after_s: float | None = field(
        default=None,
        metadata=spec(
            int,
            float,
            default_doc=f"`max({WINDOW_POLLS} × interval_s, {STALE_MIN_S:g})`",
            doc="seconds without a successful poll before a node or number counts as stale",
        ),
    )
    stall_after_s: float | None = field(
        default=None,
        metadata=spec(
            int,
            float,
            rules=[between(1, 86400, "s")],
            default_doc=f"`max({WINDOW_POLLS} × interval_s, {STALL_MIN_S:g})`",
            doc='no new completions for this long raises "no new completions" on the Overview, for the run or per node',
        ),
    )
    kiosk_rotate_s: float = field(
        default=20.0,
        metadata=spec(int, float, rules=[between(1, 86400, "s")], doc="seconds per page in kiosk mode (`?kiosk=1`)"),
    )
    continuation_model: str | None = field(
        default=None, metadata=spec(str, doc="the model continuation requests ask for")
    )
    allowed_users: list[str] = field(
        default_factory=list,
        metadata=spec(
            list,
            rules=[_Rule(lambda v: all(isinstance(u, str) for u in v), "must be a list of strings")],
            default_doc="`[]` (everyone who can reach it)",
            doc="e-mails allowed in, with Streamlit's OIDC login (below)",
        ),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=spec(
            int,
            rules=[between(1, 65535)],
            doc="serve Prometheus `/metrics` on this port from the process that collects",
        ),
    )
    metrics_address: str = field(
        default="127.0.0.1",
        metadata=spec(
            str, rules=[_Rule(_text_without_spaces, "must be an IP address or host name")], doc="address for `/metrics`"
        ),
    )
    metrics_token_file: str | None = field(
        default=None,
        metadata=spec(
            str,
            doc="a file holding the bearer token `/metrics` requires (then a scrape sees every live run;"
            " without one only the runs without `allowed_users`, and only on loopback unless"
            " `--public-without-auth`)",
        ),
    )
    metrics_tls_cert_file: str | None = field(
        default=None,
        metadata=spec(str, doc="PEM certificate (chain): serve `/metrics` over HTTPS (with `metrics_tls_key_file`)"),
    )
    metrics_tls_key_file: str | None = field(
        default=None, metadata=spec(str, doc="the PEM private key of `metrics_tls_cert_file`")
    )
    raw_keep_h: float = field(
        default=RAW_KEEP_S / 3600,
        metadata=spec(
            int,
            float,
            rules=[between(1, 24 * 14, "h")],
            doc="hours of raw 10 s history; older rows are rolled up to 1-min rows for 7 days, 10-min rows after",
        ),
    )

    @property
    def stale_after(self) -> float:
        """Seconds without a successful poll before a node counts as stale (health's one rule)."""
        return stale_after_s(self.interval_s, self.stale_after_s)

    @property
    def stall_after(self) -> float:
        """Seconds without new completions before the Overview calls the run (or a node) stalled."""
        return stall_after_s(self.interval_s, self.stall_after_s)

    def resolved_store_path(self) -> Path:
        if self.store_path:
            return Path(self.store_path).expanduser()
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)
        return cache_dir() / f"{slug}.sqlite3"


@dataclasses.dataclass(frozen=True)
class RunContext:
    """How a config is being used, as opposed to what its file says: decided by the caller.

    `source` names where the config came from (a path, or "<built-in demo>"); `demo` marks the
    built-in demo run (every page says DEMO, webhooks stay off); `demo_gpus` is how many GPUs
    the agent simulates per node name when that node has `gpu = "demo"`.
    """

    source: str = "<config>"
    demo: bool = False
    demo_gpus: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "demo_gpus", MappingProxyType(dict(self.demo_gpus)))

    @classmethod
    def for_file(cls, path: str | os.PathLike) -> RunContext:
        return cls(source=str(path))


def cache_dir() -> Path:
    """The user's cache folder for runhealth (XDG_CACHE_HOME honoured)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runhealth"


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
    """Read and validate a config file, with its secrets filled in.

    Raises:
        ConfigError: the file is missing or unreadable, or a field is wrong (the message
            names the file, the node and the field).
    """
    path = Path(path)
    config = parse_config(read_toml(path), source=str(path))
    return apply_secrets(config, secrets_path if secrets_path is not None else SECRETS_PATH)


def fix_hint(error: str, path: str | os.PathLike | None) -> str:
    """What to do about config error `error` (a ConfigError's text) in file `path`, in one
    clause for the line under the error: a syntax error names its line and column (there is no
    field to name), a missing file says how to point at one, any other error names a field."""
    where = str(path or "the config file")
    if TOML_SYNTAX in error:
        at = _TOML_AT.search(error)
        return (
            f"Fix the TOML syntax at line {at[1]}, column {at[2]} of {where}"
            if at
            else f"Fix the TOML syntax in {where}"
        )
    if "config file not found" in error:
        return f"Create {where} (or point --config / {CONFIG_ENV} at your config)"
    return f"Fix the field named above in {where}"


def parse_config(raw: dict[str, Any], source: str = "<config>") -> RunConfig:
    """Validate an already-parsed TOML document (see `load_config`); `source` names it in errors."""
    if "alerts" in raw:  # webhook URLs are credentials: never in the (shareable) config file
        raise ConfigError(
            f"{source}: [alerts] must not be in the config file; put webhook_urls in "
            f"{SECRETS_PATH} under [alerts] or in RUNHEALTH_WEBHOOK_URLS"
        )
    check_keys(raw, {"run", "nodes"}, source)
    run = raw.get("run")
    if not isinstance(run, dict):
        raise ConfigError(f"{source}: missing [run] table")
    run_values = check_table(run, RunConfig, f"{source}: [run]", f"{source}: [run]")
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    warn, crit = (run_values.get(k, defaults[k]) for k in ("failed_warn_share", "failed_crit_share"))
    if warn > crit:
        raise ConfigError(
            f"{source}: [run]: field 'failed_warn_share' ({warn:g}) must not exceed field 'failed_crit_share' ({crit:g})"
        )
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError(f"{source}: no [[nodes]] defined (at least one node is required)")
    nodes = [_parse_node(n, i, source) for i, n in enumerate(nodes_raw)]
    names = [n.name for n in nodes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{source}: node name {dupes[0]!r} is used twice (field 'name')")
    return RunConfig(nodes=nodes, **run_values)


def _parse_node(raw: Any, index: int, source: str) -> NodeConfig:
    where = f"{source}: nodes[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: each [[nodes]] entry must be a table")
    if isinstance(raw.get("name"), str):
        where = f"{source}: node {raw['name']!r}"
    secret = sorted(SECRET_KEYS & set(raw))
    if secret:
        raise ConfigError(
            f"{where}: field {secret[0]!r} must not be in the config file; put it in "
            f"{SECRETS_PATH} under [nodes.{raw.get('name', '<name>')}] or use ssh-agent"
        )
    return NodeConfig(**check_table(raw, NodeConfig, where, f"{where}:"))


def apply_secrets(config: RunConfig, secrets_path: Path) -> RunConfig:
    """`config` with node passphrases/passwords from Streamlit's secrets file, if it has any."""
    per_node = read_secrets(secrets_path).get("nodes", {})
    if not isinstance(per_node, dict):
        return config
    nodes = []
    for node in config.nodes:
        entry = per_node.get(node.name, {})
        if isinstance(entry, dict):
            node = dataclasses.replace(
                node, passphrase=_secret(entry, "passphrase"), password=_secret(entry, "password")
            )
        nodes.append(node)
    return dataclasses.replace(config, nodes=nodes)


def _secret(entry: dict, key: str) -> Secret | None:
    value = entry.get(key)
    return Secret(value) if isinstance(value, str) else None


def reveal(secret: Secret | None) -> str | None:
    """The secret's text, or None: for the one call that hands it to paramiko."""
    return secret.reveal() if secret is not None else None


def markdown() -> str:
    """The README's two key tables, generated from the declarations above."""
    return markdown_table(RunConfig, "`[run]` key") + "\n\n" + markdown_table(NodeConfig, "`[[nodes]]` key")


if __name__ == "__main__":  # python -m runhealth.settings.config --markdown
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m runhealth.settings.config --markdown   (prints the README's config key tables)")
    print(markdown())
