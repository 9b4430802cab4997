"""The run's one ETA and what it is taken from (#33 item 1): distinct prompts, or completions.

With [run] expected_prompts and a prompt-ID field in the shards, progress is distinct prompts
answered (a retry or a relaunch that answers a prompt again is no progress: counting it made the
completions ETA too early), so the ETA is the prompts still to answer over the rate of new
distinct prompts at the 15-min average (rules/activity.py `prompts_rate`: the same spans, window
and backfill rule as the completions' rate, from each poll's `prompts`, migration 12). Without
either, it stays completions still to write to [run] target_completions at the completions' rate,
and says why. The Overview's ETA tile and headline (`runhealth status --json`), the Output
lengths page's ETA change and the Compare page's ETA row all take `run_eta`: one ETA, one basis.
The run-state rule (no ETA for a stalled or stale run, none before the average holds the run's
writing) stays the Overview's (screens/overview.py).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from runhealth.analysis import rates
from runhealth.rules.activity import RunRates
from runhealth.rules.health import fmt_age

Basis = Literal["prompts", "completions"]
NO_ID_NOTE = (
    "on completions: expected_prompts is set but the shards carry no prompt ID "
    "(set prompt_id_path on the nodes; looked for id, custom_id, prompt_id, request_id, metadata.id)"
)
UPGRADE_NOTE = (
    "on completions: the store was upgraded mid-run and read prompt IDs only from then on, so the"
    " distinct prompts answered over the whole run are unknown"
)

# The stragglers (screens/etas.py) compare each node's share of target_completions: with the ETA on
# prompts their clock times are on another basis, and the line says so rather than contradict it.
STRAGGLERS_NOTE = " (nodes' shares of target_completions; the ETA is from distinct prompts)"


@dataclasses.dataclass(frozen=True)
class RunEta:
    """The ETA on its basis (before the Overview's run-state rule) and the rate it divides by."""

    basis: Basis
    eta_s: float | None  # 0: the goal is reached; None: no goal or no positive rate
    per_s: float | None  # new distinct prompts / s, or completions / s, at the 15-min average
    done: int | None  # distinct prompts answered, or completions
    goal: int | None  # [run] expected_prompts, or target_completions
    note: str = ""  # why the ETA is on completions although expected_prompts is set
    prompts_per_s: float | None = None  # new distinct prompts / s at the 15-min average, whichever the basis

    @property
    def unit(self) -> str:
        return "prompts" if self.basis == "prompts" else "completions"

    def rate_words(self) -> str:
        """ "4.1 prompts/s" (the tile's and the line's wording of the rate)."""
        return f"{self.per_s:,.1f} {self.unit}/s" if self.per_s is not None else f"no {self.unit} rate"


def run_eta(
    completions: int,
    target: int | None,
    run_rates: RunRates | None,
    answered: int | None,
    expected: int | None,
    ids_since_upgrade: bool = False,
) -> RunEta:
    """The run's ETA: from distinct prompts when `expected` (expected_prompts) is set and the shards
    carry prompt IDs (`answered` is not None), else from completions to `target`.
    `ids_since_upgrade`: prompt IDs were counted only since a store upgrade (#40 item 4): the
    prompts are never the basis then, and the note says why."""
    if ids_since_upgrade:
        answered = None
    pps = run_rates.prompts_per_s_15m if run_rates else None
    if expected and answered is not None:
        return RunEta("prompts", rates.eta_seconds(answered, expected, pps), pps, answered, expected, "", pps)
    cps = run_rates.completions_per_s_15m if run_rates else None
    eta = rates.eta_seconds(completions, target, cps) if target else None
    note = (UPGRADE_NOTE if ids_since_upgrade else NO_ID_NOTE) if expected and completions else ""
    return RunEta("completions", eta, cps, completions, target, note, pps)


def enough_for_eta(r: RunRates, now: float) -> bool:
    """Whether the average's window holds enough of the run's writing for an ETA: its first live
    completion at least the window, less the live window, ago (a younger run's "average" is mostly
    the time before it wrote: #31)."""
    wrote = [  # on the rates' clock where known: a wall-clock step is not writing time (#40 item 7)
        n.first_live_bridged if n.first_live_bridged is not None else n.first_live_growth_unix
        for n in r.per_node.values()
        if n.first_live_growth_unix is not None
    ]
    return bool(wrote) and now - min(wrote) >= r.average_s - r.window_s


def shown_eta(e: RunEta, writing: bool, enough: bool) -> float | None:
    """The ETA every screen shows: e's only while the run writes (not stalled, not stale, not
    finished) and its average holds enough of the writing, or once the goal is reached (0)."""
    if e.eta_s == 0:
        return 0.0 if writing else None
    return e.eta_s if writing and enough else None


def tile_words(e: RunEta, eta_s: float | None, average_label: str, enough: bool, window: str) -> tuple[str, str, str]:
    """The live ETA tile's (value, sub, level) once the run writes: `eta_s` is the ETA shown (None:
    withheld), `enough` whether the average holds the run's writing, `window` the average's width."""
    note = f" · {e.note}" if e.note else ""
    if e.eta_s == 0:
        reached = "all expected prompts answered" if e.basis == "prompts" else "target reached"
        return "done", reached, "ok"
    if not e.goal:
        return "—", "needs target_completions (or expected_prompts) in the config", "muted"
    if eta_s is not None:
        return fmt_age(eta_s), f"at the {average_label}, {e.rate_words()}{note}", "ok"
    if e.per_s and not enough:
        return "—", f"after {window} of writing (the average needs a full window)", "muted"
    if e.basis == "prompts" and e.per_s is not None:
        return "—", f"no new prompts at the {average_label}: completions answer prompts again", "warn"
    return "—", "needs a rate" + note, "muted"


def to_json(e: RunEta | None) -> dict:
    """The ETA's basis and rates for the headline record (`status --json`, the Overview download)."""
    if e is None:
        return {"eta_basis": None, "eta_rate_per_s": None, "eta_basis_note": "", "prompts_per_s_15_min_avg": None}
    return {
        "eta_basis": e.basis,  # "prompts" | "completions"
        "eta_rate_per_s": None if e.per_s is None else round(e.per_s, 3),  # in the basis's unit
        "eta_basis_note": e.note,
        "prompts_per_s_15_min_avg": None if e.prompts_per_s is None else round(e.prompts_per_s, 3),
    }


def straggler_line(line: str, e: RunEta | None) -> str:
    """The stragglers' line, its basis named when the run's ETA is on prompts and theirs is not."""
    return line + STRAGGLERS_NOTE if line and e is not None and e.basis == "prompts" else line
