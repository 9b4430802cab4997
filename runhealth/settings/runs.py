"""Several runs: the `[[runs]]` config layer and the registry of runs a dashboard shows.

A config file either describes one run (today's `[run]` + `[[nodes]]`, still valid) or several:

    [[runs]]
    name = "gen-4096"
    finished = true            # no collector: read from its store only
    max_output_tokens = 4096

    [[runs]]
    name = "gen-8192"
    max_output_tokens = 8192
    [[runs.nodes]]
    name = "node-1"
    host = "gpu-1"
    shards = ["/data/out8k/*.jsonl"]

Each `[[runs]]` table holds today's `[run]` keys plus its own `[[runs.nodes]]`; it is split out
and checked by the single-run validator (`runhealth.settings.config.parse_config`), so every rule has
one definition and an error names the run: "<file>: run 'b': node 'x': field 'y' ...". A run
with `finished = true` may list no nodes (they are gone); it is never polled.

Every run has its own store file (`RunConfig.resolved_store_path`: its `store_path`, else one
file per run name in the cache folder), so the store's schema does not know about runs. A run
whose config entry was removed is not forgotten: `discover_finished` finds store files next to
the configured ones whose run is not configured any more and lists them as finished, under the
access rule its collector recorded in the store (`allowed_users` in the run meta); a store that
records none (written before the rule was kept there) is listed with `access_known = False`,
which the pages show to no one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

from runhealth.errors import ConfigError
from runhealth.settings.config import SECRETS_PATH, RunConfig, apply_secrets, cache_dir, load_config, parse_config
from runhealth.settings.runsettings import RunSettings
from runhealth.settings.tomlfile import read_toml

STORE_SUFFIX = ".sqlite3"
# Validates a finished run that lists no nodes (the single-run validator requires one); the
# placeholder is dropped right after and never polled.
_NO_NODE = {"name": "none", "host": "local", "shards": ["/nonexistent/*.jsonl"]}


@dataclasses.dataclass
class RunEntry:
    """One run the dashboard knows: its settings and whether it is finished (never polled)."""

    config: RunConfig
    finished: bool = False
    # False for a store found beside the others whose run does not record its allowed_users (a
    # store written before #40): nobody knows who may see it, so the pages show it to no one.
    access_known: bool = True


def load_runs(path: str | os.PathLike, secrets_path: Path | None = None) -> list[RunEntry]:
    """Every run a config file describes: one for a single-run file, one per `[[runs]]` table.

    Raises:
        ConfigError: as `load_config`, the message naming the run as well.
    """
    path = Path(path)
    raw = read_toml(path)
    if "runs" not in raw:
        return [RunEntry(load_config(path, secrets_path))]
    secrets = secrets_path if secrets_path is not None else SECRETS_PATH
    return [RunEntry(apply_secrets(e.config, secrets), e.finished) for e in parse_runs(raw, str(path))]


def parse_runs(raw: dict[str, Any], source: str) -> list[RunEntry]:
    """Validate a `[[runs]]` document: each run through the single-run validator."""
    other = sorted(set(raw) - {"runs"})
    if other:
        raise ConfigError(
            f"{source}: [[runs]] describes every run; move {other[0]!r} into a run "
            "(or use [run] + [[nodes]] for a single run)"
        )
    tables = raw["runs"]
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{source}: [[runs]] must be one or more tables")
    entries = [_parse_run(t, i, source) for i, t in enumerate(tables)]
    _check_unique(entries, source)
    return entries


def _parse_run(table: dict[str, Any], index: int, source: str) -> RunEntry:
    name = table.get("name")
    where = f"{source}: run {name!r}" if isinstance(name, str) else f"{source}: runs[{index}]"
    table = dict(table)
    finished = table.pop("finished", False)
    if not isinstance(finished, bool):
        raise ConfigError(f"{where}: field 'finished' must be true or false, got {type(finished).__name__}")
    nodes = table.pop("nodes", None)
    if nodes is None and finished:
        config = parse_config({"run": table, "nodes": [_NO_NODE]}, source=where)
        return RunEntry(dataclasses.replace(config, nodes=[]), finished=True)
    if nodes is None:
        raise ConfigError(f"{where}: no [[runs.nodes]] defined (at least one node, or finished = true)")
    return RunEntry(parse_config({"run": table, "nodes": nodes}, source=where), finished=finished)


def _check_unique(entries: list[RunEntry], source: str) -> None:
    seen: dict[str, str] = {}
    for entry in entries:
        name = entry.config.name
        if name in seen.values():
            raise ConfigError(f"{source}: run {name!r}: field 'name' is used by another run")
        # Resolved: `sub/../a.sqlite3` is run a's store too (two collectors would fight over it).
        store = str(entry.config.resolved_store_path().expanduser().resolve())
        if store in seen:
            raise ConfigError(
                f"{source}: run {name!r}: field 'store_path' is run {seen[store]!r}'s store (each run needs its own)"
            )
        seen[store] = name


def store_run_settings(path: Path) -> RunSettings | None:
    """The run settings a store file recorded (`meta.run`), read-only; None if it has none."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
        finally:
            db.close()
        value = json.loads(row[0]) if row else None
    except (sqlite3.Error, ValueError):
        return None
    named = isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"]
    return RunSettings.from_meta(value) if named else None


def discover_finished(entries: list[RunEntry]) -> list[RunEntry]:
    """Runs no longer configured whose store files sit beside a configured run's store."""
    known = {str(e.config.resolved_store_path().expanduser().resolve()) for e in entries}
    names = {e.config.name for e in entries}
    folders = sorted({str(Path(p).parent) for p in known})
    found = []
    for folder in folders:
        for path in sorted(Path(folder).glob(f"*{STORE_SUFFIX}")):
            if str(path.resolve()) in known:
                continue
            settings = store_run_settings(path)
            if settings is None or settings.name in names:
                continue
            names.add(settings.name)
            rule_known = settings.allowed_users is not None
            found.append(RunEntry(_config_from_settings(settings, path), finished=True, access_known=rule_known))
    return found


_NAMED = re.compile(r"""^\s*(name|store_path)\s*=\s*["']([^"'\n]+)["']""", re.M)


def stored_runs(path: Path) -> list[RunEntry]:
    """The runs a config file that does not load still names, found from their stores: read-only
    (finished, no nodes), for a dashboard or `runhealth status` that starts on a broken file
    (#41: it showed the error alone). A run is the store at a `store_path` its text holds, or a
    store in those stores' folders or the default one whose run is a `name` its text holds."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    names = {v for k, v in _NAMED.findall(text) if k == "name"}
    paths = {Path(v).expanduser().resolve() for k, v in _NAMED.findall(text) if k == "store_path"}
    folders = sorted({p.parent for p in paths} | {cache_dir()})
    found: list[RunEntry] = []
    seen: set[str] = set()
    for folder in folders:
        for store in sorted(folder.glob(f"*{STORE_SUFFIX}")) if folder.is_dir() else []:
            settings = store_run_settings(store)
            named = store.resolve() in paths or (settings is not None and settings.name in names)
            if settings is None or not named or settings.name in seen:
                continue
            seen.add(settings.name)
            found.append(RunEntry(_config_from_settings(settings, store), finished=True))
    return found


def _config_from_settings(settings: RunSettings, path: Path) -> RunConfig:
    return RunConfig(
        name=settings.name,
        nodes=[],
        target_completions=settings.target_completions,
        max_output_tokens=settings.max_output_tokens,
        interval_s=settings.interval_s,
        store_path=str(path),
        allowed_users=list(settings.allowed_users or ()),  # unknown (None): hidden by access_known
    )  # its file is the store found, not a config
