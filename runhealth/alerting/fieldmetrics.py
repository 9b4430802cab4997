"""The per-line field figures (#33) as Prometheus gauges, for the exporter (/metrics).

`field_families(store, run, meta, ceiling)` reads the run's figures once
(screens/fieldmodel.field_figures: the numbers the pages and `poll --json` show) and yields one
gauge per figure the shards carry: prompts answered, missing (only with [run] expected_prompts),
answered more than once, cuts that never answered and cut mid-answer, mislabelled completions
and context-window stops (only with [run] max_model_len), and per group its completions and cut
ones (group_families). A figure whose field the shards lack yields no series at all: a missing
field is never exported as a zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from runhealth.screens import fieldmodel
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store

# (name, help, figure, key): each exported when the figure's value is not None.
GAUGES = (
    ("runhealth_prompts_answered", "Distinct prompts answered (by hashed prompt ID).", "prompts", "answered"),
    ("runhealth_prompts_missing", "Expected prompts not answered yet ([run] expected_prompts).", "prompts", "missing"),
    (
        "runhealth_prompts_answered_more_than_once",
        "Distinct prompts answered on two lines or more (a retry or a relaunch).",
        "prompts",
        "answered_more_than_once",
    ),
    (
        "runhealth_truncated_never_answered",
        "Completions cut at the ceiling whose answer part is empty (the budget went to reasoning).",
        "unanswered",
        "never_answered",
    ),
    (
        "runhealth_truncated_mid_answer",
        "Completions cut at the ceiling after their answer had begun.",
        "unanswered",
        "cut_mid_answer",
    ),
    (
        "runhealth_mislabelled_completions",
        "Completions at or above the ceiling whose finish_reason is not length.",
        "mislabelled",
        "count",
    ),
    (
        "runhealth_context_window_stops",
        "Length stops below the ceiling whose prompt and completion filled max_model_len.",
        "context_stops",
        "count",
    ),
)


def field_families(
    store: Store, run: str, settings: RunSettings, ceiling: int | None = None, figures: dict[str, Any] | None = None
) -> Iterator[Metric]:
    """One gauge family per figure the shards carry (nothing for a field they lack). `settings`
    are the store's run settings: expected_prompts and max_model_len when the run set them;
    `figures`: fieldmodel.field_figures at `ceiling` when the caller has them."""
    figures = fieldmodel.field_figures(store, settings, ceiling) if figures is None else figures
    since = figures["prompts"].get("counted_since_unix")
    for name, help_, figure, key in GAUGES:
        value = figures[figure].get(key)
        if value is None or (since is not None and name == "runhealth_prompts_answered"):
            continue  # counted only since an upgrade: not the run's total (its own series below)
        family = GaugeMetricFamily(name, help_, labels=["run"])
        family.add_metric([run], float(value))
        yield family
    yield from group_families(run, figures["groups"])
    if since is not None:  # #40 item 4: prompt IDs counted since a store upgrade, not over the run
        for name, help_, value in (
            (
                "runhealth_prompts_counted_since_timestamp_seconds",
                "When prompt IDs began to be read: the store was upgraded mid-run and the completions"
                " counted before were not read for them (runhealth_prompts_answered is then left out).",
                since,
            ),
            (
                "runhealth_prompts_answered_since_upgrade",
                "Distinct prompts answered in the lines read since the store upgrade.",
                figures["prompts"]["answered"],
            ),
        ):
            family = GaugeMetricFamily(name, help_, labels=["run"])
            family.add_metric([run], float(value))
            yield family


def group_families(run: str, groups: dict[str, Any]) -> Iterator[Metric]:
    """Per group (the configured group field's values, or prompt-token bins): completions and the
    cut ones by the headline's rule (stopped by `length` at or above the ceiling, stats.is_cut),
    with the `length` stops below the ceiling apart (#41); where the stops cannot be split at the
    ceiling (no ceiling known, or an older agent), only their total, under its own name."""
    rows = groups.get("rows") or []
    if not rows:
        return
    split = groups.get("counts") == "cut"
    fams = [
        (
            "runhealth_group_completions",
            "Completions per group (group_path's values, or prompt-token bins).",
            "completions",
        ),
    ]
    if split:
        fams += [
            (
                "runhealth_group_truncated",
                "Completions per group cut at the max_tokens ceiling (stopped by length at or above it, as the"
                " headline counts them).",
                "cut",
            ),
            (
                "runhealth_group_length_stops_below_ceiling",
                "Length stops per group below the ceiling (the context window's), not counted as cut.",
                "below_ceiling",
            ),
        ]
    else:
        fams.append(
            (
                "runhealth_group_length_stops",
                "Length stops per group, not split at the ceiling (no ceiling known, or an agent that predates"
                " the split): context-window stops included.",
                "length_stops",
            )
        )
    for name, help_, key in fams:
        family = GaugeMetricFamily(name, help_, labels=["run", "group"])
        for r in rows:
            family.add_metric([run, str(r["group"])], float(r[key]))
        yield family
