"""The run's one ETA and what it is taken from (#33 item 1): distinct prompts, or completions.

With [run] expected_prompts and a prompt-ID field in the shards, progress is distinct prompts
answered (a retry or a relaunch that answers a prompt again is no progress: counting it made the
completions ETA too early), so the ETA is the prompts still to answer over the rate of new
distinct prompts at the 15-min average (rules/activity.py `prompts_rate`: the same spans, window
and backfill rule as the completions' rate, from each poll's `prompts`, migration 12). Without
either, it stays completions still to write to [run] target_completions at the completions' rate,
and says why. The Overview's ETA tile and headline (`runhealth status --json`), the Output
lengths page's ETA change and the Compare page's ETA row all take `run_eta`: one ETA, one basis.
The completions ETA at a rate (`rate_eta`: the run's, and the stragglers' run ETA with its
interval, `node_shares`) and the run state (`run_state`: writing / stalled / stale / finished, from
the alerts) are computed here and nowhere else (#41): the Overview, Output lengths, Compare, the
Nodes page and `status --json` all take them from this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Literal, NamedTuple, cast

from runhealth.ages import fmt_age
from runhealth.analysis import rates, stats
from runhealth.analysis.stragglers import Stragglers, stragglers
from runhealth.records import NodeRow
from runhealth.rules import activity, health
from runhealth.rules.activity import RunRates
from runhealth.screens.words import fmt_window
from runhealth.settings import windows
from runhealth.store import Store

Basis = Literal["prompts", "completions"]
RunState = Literal["writing", "stalled", "stale", "finished"]
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
# A node named late stays named until its ETA interval has overlapped the run's for this many polls
# (while its ETA still lies after the run's): the line came and went between polls (#41).
LATE_HOLD_POLLS = 3
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
    # Fixed shares (the default; [run] shared_queue = false): the node whose share ends the run,
    # when its ETA is later than the run rate's (then eta_s is that node's); "" otherwise.
    last_node: str = ""

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
    shares: Stragglers | None = None,
    ids_since_upgrade: bool = False,
) -> RunEta:
    """The run's ETA: from distinct prompts when `expected` (expected_prompts) is set and the shards
    carry prompt IDs (`answered` is not None), else from completions to `target`. `shares`: each
    node's ETA to its fixed share (screens/etas.py; None: the nodes share one queue, or no target):
    the run ends when its last node does, so a node's later ETA is the run's, and it is named.
    `ids_since_upgrade`: prompt IDs were counted only since a store upgrade (#40 item 4): the
    prompts are never the basis then, and the note says why."""
    if ids_since_upgrade:
        answered = None
    pps = run_rates.prompts_per_s_15m if run_rates else None
    if expected and answered is not None:
        e = RunEta("prompts", rate_eta(answered, expected, pps)[0], pps, answered, expected, "", pps)
    else:
        cps = run_rates.completions_per_s_15m if run_rates else None
        eta = rate_eta(completions, target, cps)[0]
        note = (UPGRADE_NOTE if ids_since_upgrade else NO_ID_NOTE) if expected and completions else ""
        e = RunEta("completions", eta, cps, completions, target, note, pps)
    return last_share(e, shares)


def rate_eta(
    done: int, goal: int | None, per_s: float | None, variance: float | None = None
) -> tuple[float | None, tuple[float, float] | None]:
    """The one ETA at a rate: (seconds to `goal` from `done` at `per_s`, its 95% interval from the
    rate's batch-means `variance`); (None, None) without a goal, 0 once it is reached."""
    if not goal:
        return None, None
    return rates.eta_seconds(done, goal, per_s), rates.eta_interval(done, goal, per_s, variance)


def node_shares(
    target: int | None,
    done: int,
    found: RunRates | None,
    nodes: Sequence[NodeRow],
    held: Collection[str] = (),
) -> Stragglers | None:
    """Each configured node's ETA to its fixed share beside the run's (its `rate_eta` at the 15-min
    average, with its interval), and the late ones (analysis/stragglers.py; `held`: `late_before`'s
    nodes, which stay named while their ETA lies after the run's); None without a target or rates."""
    if found is None or not nodes or not target:
        return None
    per_node = {}
    for n in nodes:
        r = found.per_node.get(n["name"])
        per_node[n["name"]] = (
            n["completions"],
            r.completions_per_s_15m if r else None,
            r.completions_var_15m if r else None,
        )
    eta, interval = rate_eta(done, target, found.completions_per_s_15m, found.completions_var_15m)
    return stragglers(target, eta, interval, per_node, held)


def holdable(s: Stragglers) -> frozenset[str]:
    """The nodes a hold could keep named: not late now, their ETA after the run's."""
    run = s.run_eta_s
    late = {n.node for n in s.late}  # names: a node's dataclass compared with each late one was n x late
    return frozenset(n.node for n in s.nodes if n.node not in late and run and n.eta_s is not None and n.eta_s > run)


def late_before(
    store: Store, target: int | None, done: int, nodes: Sequence[NodeRow], now: float, interval_s: float
) -> frozenset[str]:
    """The nodes the late rule named at one of the LATE_HOLD_POLLS - 1 poll instants before `now`,
    from the store's polls as they stood then (the rates and each node's completions at each
    instant): a straggler stays named until its interval has overlapped the run's for
    LATE_HOLD_POLLS polls, so the line no longer comes and goes between polls (#41)."""
    if not target or not nodes:
        return frozenset()
    window_s, average_s = windows.rate_window_s(interval_s), windows.average_window_s(interval_s)
    rows = activity.poll_rows(
        store, now, windows.rates_lookback_s(interval_s, average_s) + LATE_HOLD_POLLS * interval_s
    )
    named: set[str] = set()
    for k in range(1, LATE_HOLD_POLLS):
        t = now - k * interval_s
        upto = {n: [r for r in rs if r[0] <= t] for n, rs in rows.items()}
        later = {n: sum(r[2] or 0 for r in rs if r[0] > t) for n, rs in rows.items()}
        then = [cast(NodeRow, {**n, "completions": n["completions"] - later.get(n["name"], 0)}) for n in nodes]
        s = node_shares(target, done - sum(later.values()), activity.run_rates(upto, t, window_s, average_s), then)
        named |= {n.node for n in s.late} if s else set()
    return frozenset(named)


def run_state(alerts: Sequence[health.Alert], finished: bool) -> RunState:
    """The one run state every tile, the banner, the export and every page's ETA follow: from the
    alerts (the collector gone or collection stale: stale; run_stalled, which spares a run that
    reached its target and the nodes that wrote their shares: stalled)."""
    if finished:
        return "finished"
    names = {a.name for a in alerts}
    if names & {"collector_down", "collection_stale"}:
        return "stale"
    return "stalled" if "run_stalled" in names else "writing"


def last_share(e: RunEta, shares: Stragglers | None) -> RunEta:
    """`e` with fixed shares: the latest node's ETA to its share when it is later than `e`'s (the
    run is not over before its last node is), that node named; `e` unchanged when it is reached (0),
    has no rate, or no node is later."""
    if shares is None or not e.eta_s:
        return e
    timed = [n for n in shares.nodes if n.eta_s]
    last = max(timed, key=lambda n: n.eta_s or 0.0, default=None)
    if last is None or (last.eta_s or 0.0) <= e.eta_s:
        return e
    return dataclasses.replace(e, eta_s=last.eta_s, last_node=last.node)


def progress(answered: int | None, expected: int | None, completions: int, target: int | None) -> Progress | None:
    """The run's one progress (the bar, the Completions tile, the headline, /metrics): distinct
    prompts answered of [run] expected_prompts when both are known (a retry is no progress, #33),
    else completions of target_completions; None without either."""
    if expected and answered is not None:
        return Progress(min(1.0, answered / expected), f"{answered:,} of {expected:,} prompts answered", "prompts")
    if not target:
        return None
    return Progress(min(1.0, completions / target), f"{completions:,} of {target:,} completions", "completions")


class Progress(NamedTuple):
    share: float  # 0-1
    words: str  # "930 of 1,000 prompts answered"
    basis: Basis


def store_eta(store: Store, summary: stats.Summary, target: int | None, now: float) -> tuple[RunEta, str]:
    """A live run's ETA from its store (the Compare page's and Output lengths' ETA) on the
    Overview's basis and under its rule (shown_eta: none while the run is stalled or stale, or its
    average too young; the run's end at its last node's share unless the nodes share one queue),
    with why there is none (short words for a table cell; "" when there is one). `summary`: the
    run's length summary the screen counted at `now` (read once: its completions are the count)."""
    settings = store.run_settings()
    expected = settings.expected_prompts
    counted = store.prompt_counts() if expected else None
    answered = counted["distinct_prompts"] if counted and counted["id_lines"] else None
    reading = health.read(store, now, dataclasses.replace(settings, target_completions=target), summary=summary)
    state = run_state(health.alerts_of(reading), False)
    live = live_eta(
        store, reading, summary.completions, answered, store.meta("prompt_ids_since") is not None, state, hold=False
    )
    return dataclasses.replace(live.basis, eta_s=live.eta_s), live.withheld


@dataclasses.dataclass(frozen=True)
class LiveEta:
    """A live run's ETA as every screen shows it, with each node's ETA to its share."""

    basis: RunEta  # before the run-state rule
    eta_s: float | None  # shown_eta: None while stalled, stale or too young
    shares: Stragglers | None  # each node's ETA to its share (fixed shares or not: the Nodes table)
    withheld: str  # why there is no ETA, in a few words ("" when there is one)

    @property
    def shown_shares(self) -> Stragglers | None:
        """The node ETAs the screens show: only beside a run ETA (the Overview's rule, #41: the
        Nodes page gave per-node ETAs in a run's first 15 min while the Overview refused one)."""
        return self.shares if self.eta_s else None


def live_eta(
    store: Store,
    reading: health.Reading,
    done: int,
    answered: int | None,
    ids_since_upgrade: bool,
    state: RunState,
    hold: bool = True,
) -> LiveEta:
    """The run's ETA, shown or withheld, and the nodes' ETAs, from one reading at its instant
    (the Overview, the Nodes page, store_eta): one rule for all. `hold`: keep a straggler named
    for LATE_HOLD_POLLS polls (`late_before`; the ETA alone does not need it)."""
    s, now, found = reading.settings, reading.now, reading.rates
    target, nodes = s.target_completions, reading.nodes
    shares = node_shares(target, done, found, nodes)
    if hold and shares is not None and (maybe := holdable(shares)):  # the earlier polls only when they can matter
        shares = node_shares(
            target, done, found, nodes, maybe & late_before(store, target, done, nodes, now, s.interval_s)
        )
    e = run_eta(
        done, target, found, answered, s.expected_prompts, None if s.shared_queue else shares, ids_since_upgrade
    )
    shown = shown_eta(e, state == "writing", enough_for_eta(found, now))
    why = ""
    if shown is None:
        why = {"stale": "numbers stale", "stalled": "run stalled", "finished": "run finished"}.get(state, "")
        why = why or ("no target or rate" if e.eta_s is None else f"after {fmt_window(found.average_s)} of writing")
    return LiveEta(e, shown, shares, why)


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
    if eta_s is not None and e.last_node:
        return fmt_age(eta_s), f"{e.last_node}'s share ends the run (its own 15-min avg){note}", "ok"
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
        return {
            "eta_basis": None,
            "eta_rate_per_s": None,
            "eta_basis_note": "",
            "eta_last_node": None,
            "prompts_per_s_15_min_avg": None,
        }
    return {
        "eta_basis": e.basis,  # "prompts" | "completions"
        "eta_rate_per_s": None if e.per_s is None else round(e.per_s, 3),  # in the basis's unit
        "eta_basis_note": e.note,
        "eta_last_node": e.last_node or None,  # fixed shares: the node whose share ends the run
        "prompts_per_s_15_min_avg": None if e.prompts_per_s is None else round(e.prompts_per_s, 3),
    }


def straggler_line(line: str, e: RunEta | None) -> str:
    """The stragglers' line, its basis named when the run's ETA is on prompts and theirs is not."""
    return line + STRAGGLERS_NOTE if line and e is not None and e.basis == "prompts" else line
