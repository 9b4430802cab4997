"""Figures derived from what the store holds, for the screens and their downloads (no Streamlit).

`final()` is a finished run's figures (average tok/s over its life, when it completed, its
duration), which its Overview shows instead of live placeholders. `standup()` computes the
Overview's headline numbers once (progress, the per-GPU rate, tokens
per joule, the ETA at the 15-minute average, node counts, data age): the tiles and the headline
download word the same record. `public_config()` is the secret-free view of a node's effective
configuration that the Nodes page shows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runhealth.analysis import rates
from runhealth.records import NodeRow
from runhealth.rules.activity import RunRates
from runhealth.rules.health import node_status
from runhealth.screens import runfigures
from runhealth.settings.config import SECRET_FIELDS, NodeConfig
from runhealth.settings.configspec import default_text, spec_of
from runhealth.settings.windows import RATE_WINDOW_S
from runhealth.store import Store

# Key fragments that mark a config value as secret: never shown, only whether it is set.
SECRET_WORDS = ("passphrase", "password", "secret", "private_key", "token")


@dataclasses.dataclass(frozen=True)
class Standup:
    """The Overview's numbers at one instant (None: not known yet)."""

    completions: int
    target: int | None
    tokens_per_s_1m: float | None
    tokens_per_s_15m: float | None
    completions_per_s_15m: float | None
    tokens_per_s_per_gpu: float | None  # last minute's rate over the GPUs reporting
    tokens_per_joule: float | None  # last minute's rate over the GPUs' summed power draw
    nodes: int
    nodes_up: int
    nodes_stale: int
    nodes_down: int
    min_disk_free_bytes: float | None
    data_age_s: float | None
    rate_window_s: float = RATE_WINDOW_S  # the live rate's window (a minute, or two poll intervals)


def standup(
    completions: int,
    target: int | None,
    health: RunRates | None,
    nodes: list[NodeRow],
    gpus: int,
    power_w: float | None,
    stale_after: float,
    now: float,
    last: float | None,
) -> Standup:
    """The headline numbers. `health` is the run's rate reading (runhealth.rules.activity.read_rates),
    `gpus` the GPUs reporting (else the nodes' gpus_found), `power_w` their summed draw."""
    tps = health.tokens_per_s_1m if health else None
    cps = health.completions_per_s_15m if health else None
    states = [node_status(n, now, stale_after)[0] for n in nodes]
    free = [f for n in nodes for d in (n.get("disk") or {}).values() if (f := d.get("free_bytes"))]
    return Standup(
        completions=completions,
        target=target,
        tokens_per_s_1m=tps,
        tokens_per_s_15m=health.tokens_per_s_15m if health else None,
        completions_per_s_15m=cps,
        tokens_per_s_per_gpu=tps / gpus if tps and gpus else None,
        tokens_per_joule=rates.tokens_per_joule(tps, power_w),
        nodes=len(nodes),
        nodes_up=states.count("up"),
        nodes_stale=states.count("stale"),
        nodes_down=states.count("down"),
        min_disk_free_bytes=min(free) if free else None,
        data_age_s=now - last if last is not None else None,
        rate_window_s=health.window_s if health else RATE_WINDOW_S,
    )


@dataclasses.dataclass(frozen=True)
class Final:
    """A finished run's figures: what it did over its life, not what it does now (None: unknown)."""

    completions: int
    tokens_per_s_life: float | None  # average over its collected life (runfigures.life_rates)
    started_unix: float | None  # its first poll
    completed_unix: float | None  # its last new completion
    last_poll_unix: float | None

    @property
    def duration_s(self) -> float | None:
        """From the first poll to the last new completion."""
        if self.started_unix is None or self.completed_unix is None:
            return None
        return max(0.0, self.completed_unix - self.started_unix)


def final(store: Store, completions: int) -> Final:
    """The final figures of a finished run's store (the Overview shows these, not live tiles):
    the poll history's part computed once and kept in the store (runfigures.finished_life)."""
    figures = runfigures.finished_life(store)
    return Final(
        completions=completions,
        tokens_per_s_life=figures.life.tokens_per_s,
        started_unix=figures.started_unix,
        completed_unix=figures.completed_unix,
        last_poll_unix=store.last_collection_unix(),
    )


def public_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A node's effective config for display: secret values never shown, only whether they are set;
    every setting of a node listed (one a store from an older version lacks included), and an
    unset one in words ("detected", "not set"), never a bare null."""
    config = config or {}
    known = [f.name for f in dataclasses.fields(NodeConfig) if f.name not in SECRET_FIELDS]
    out: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(NodeConfig)}
    for key in [*known, *(k for k in config if k not in known)]:
        value = config.get(key)
        # A known setting is never a secret by its name (completion_tokens_path holds "token").
        if key not in known and any(w in key.lower() for w in SECRET_WORDS):
            if key.endswith("_set"):
                out[key.removesuffix("_set")] = "set" if value else "not set"
            continue
        if value is None and key in fields and (s := spec_of(fields[key])) is not None:
            value = "default: " + default_text(fields[key], s).replace("`", "")
        out[key] = "not set" if value is None else value
    return out
