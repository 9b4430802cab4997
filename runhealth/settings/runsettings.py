"""The run's settings as every reader of a store sees them: one frozen `RunSettings`, one place for defaults.

The collector saves its run's settings in the store (meta key "run", `RunSettings.to_meta`); the
alerts, /metrics, the screens and a dashboard over a finished run's store read them back. They
used to read that JSON as a dict, each with its own `meta.get("interval_s") or 10.0`; now
`RunSettings.from_meta` is the one reader: a key an older store lacks, or one of the wrong type
(the file is not ours to trust), takes the default here. A live dashboard builds the same record
from its config (`RunSettings.from_config`), so both paths give one type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from runhealth.records import RunMeta
from runhealth.settings.windows import stale_after_s, stall_after_s

if TYPE_CHECKING:  # the store reads these too, and need not load the config machinery for it
    from runhealth.settings.config import RunConfig

DEFAULT_NAME = "run"  # a store whose meta names no run
DEFAULT_INTERVAL_S = 10.0  # RunConfig.interval_s's default (tests/test_runsettings.py holds them equal)


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What the alerts, /metrics and the screens need to know of a run (`store.meta("run")`).

    `stale_after_s` / `stall_after_s` are as configured (None: the default rule of
    runhealth.settings.windows); `stale_after` / `stall_after` resolve them. `nodes`: the
    nodes the config names now, None for a store that does not say (then every node counts).
    """

    name: str = DEFAULT_NAME
    target_completions: int | None = None
    max_output_tokens: int | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    stale_after_s: float | None = None
    stall_after_s: float | None = None
    truncation_warn_fraction: float | None = None  # None (a store without them): no truncation alert
    truncation_alert_fraction: float | None = None
    failed_warn_share: float | None = None  # None (a store without them): no failed-requests alert
    failed_crit_share: float | None = None
    demo: bool = False
    nodes: tuple[str, ...] | None = None
    expected_prompts: int | None = None  # distinct prompts the run should answer (#33: prompts not answered)
    max_model_len: int | None = None  # the server's context window (#33: context-window stops)
    shared_queue: bool = False  # the nodes share one queue (else fixed shares: runhealth.screens.runeta)
    # Who may see the run (`[run] allowed_users`, () for everyone), recorded with the store so a run
    # retired from the config keeps its rule (#40); None: a store written before it was recorded.
    allowed_users: tuple[str, ...] | None = None

    @property
    def stale_after(self) -> float:
        """Seconds without a successful poll before a node (or the collection) counts as stale."""
        return stale_after_s(self.interval_s, self.stale_after_s)

    @property
    def stall_after(self) -> float:
        """Seconds an up node (or the run) may add no completions before it counts as stalled."""
        return stall_after_s(self.interval_s, self.stall_after_s)

    @property
    def node_names(self) -> set[str] | None:
        """`nodes` as a set for membership tests; None when the store does not say."""
        return None if self.nodes is None else set(self.nodes)

    @classmethod
    def from_config(cls, config: RunConfig, demo: bool = False) -> RunSettings:
        """A config's settings (the live dashboard's, and what the collector saves)."""
        return cls(
            name=config.name,
            target_completions=config.target_completions,
            max_output_tokens=config.max_output_tokens,
            interval_s=config.interval_s,
            stale_after_s=config.stale_after,
            stall_after_s=config.stall_after,
            truncation_warn_fraction=config.truncation_warn_fraction,
            truncation_alert_fraction=config.truncation_alert_fraction,
            failed_warn_share=config.failed_warn_share,
            failed_crit_share=config.failed_crit_share,
            demo=demo,
            nodes=tuple(n.name for n in config.nodes),
            expected_prompts=config.expected_prompts,
            max_model_len=config.max_model_len,
            shared_queue=config.shared_queue,
            allowed_users=tuple(config.allowed_users),
        )

    @classmethod
    def from_meta(cls, meta: Mapping[str, object] | None) -> RunSettings:
        """The settings a store recorded (`store.meta("run")`, None when it has none): each key
        it lacks, or holds with the wrong type, takes its default."""
        m: Mapping[str, object] = meta if isinstance(meta, Mapping) else {}
        name, nodes, users = m.get("name"), m.get("nodes"), m.get("allowed_users")
        return cls(
            name=name if isinstance(name, str) and name else DEFAULT_NAME,
            target_completions=_positive_int(m.get("target_completions")),
            max_output_tokens=_positive_int(m.get("max_output_tokens")),
            interval_s=_positive(m.get("interval_s")) or DEFAULT_INTERVAL_S,
            stale_after_s=_positive(m.get("stale_after_s")),
            stall_after_s=_positive(m.get("stall_after_s")),
            truncation_warn_fraction=_number(m.get("truncation_warn_fraction")),
            truncation_alert_fraction=_number(m.get("truncation_alert_fraction")),
            failed_warn_share=_number(m.get("failed_warn_share")),
            failed_crit_share=_number(m.get("failed_crit_share")),
            demo=m.get("demo") is True,
            nodes=tuple(str(n) for n in nodes) if isinstance(nodes, list | tuple) else None,
            expected_prompts=_positive_int(m.get("expected_prompts")),
            max_model_len=_positive_int(m.get("max_model_len")),
            shared_queue=m.get("shared_queue") is True,
            allowed_users=_strings(users),
        )

    def to_meta(self) -> RunMeta:
        """The JSON the collector saves as `store.meta("run")` (resolved windows, as before)."""
        return {
            "name": self.name,
            "target_completions": self.target_completions,
            "max_output_tokens": self.max_output_tokens,
            "interval_s": self.interval_s,
            "stall_after_s": self.stall_after,
            "demo": self.demo,
            "truncation_warn_fraction": self.truncation_warn_fraction,
            "truncation_alert_fraction": self.truncation_alert_fraction,
            "failed_warn_share": self.failed_warn_share,
            "failed_crit_share": self.failed_crit_share,
            "stale_after_s": self.stale_after,
            "nodes": None if self.nodes is None else list(self.nodes),
            "expected_prompts": self.expected_prompts,
            "max_model_len": self.max_model_len,
            "shared_queue": self.shared_queue,
            "allowed_users": None if self.allowed_users is None else list(self.allowed_users),
        }


def _strings(value: object) -> tuple[str, ...] | None:
    """A JSON list of strings as a tuple; anything else (absent, or not ours to trust) None: unknown."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _number(value: object) -> float | None:
    """A JSON number (not a bool, which is an int to Python), else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _positive(value: object) -> float | None:
    number = _number(value)
    return number if number is not None and number > 0 else None


def _positive_int(value: object) -> int | None:
    number = _positive(value)
    return int(number) if number is not None and number == int(number) else None
