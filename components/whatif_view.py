"""Words for the what-if on the Output lengths page: the back-test line, the headline model and
why, and the loop share with its n.  Plain functions of the `whatif.what_if` result (no
Streamlit calls), so they are tested directly and the page only places them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from runhealth.collect.collector import Collector
from runhealth.screens.lengths import MIN_LOOP_SAMPLES, WhatIf, loop_note
from runhealth.screens.samples import continuation
from runhealth.settings.config import RunConfig

BACKTEST_FAIL = 0.25  # the headline model off by more than this on its own back-test: the tile says so


def backtest_miss(r: WhatIf) -> float | None:
    """How far off the headline model was on this run's back-test (0.53 = 53% off, scaled to the
    asked limit, as the fine print's "smallest back-test error" says); None when not checked."""
    err = ((r.backtest or {}).get("errors") or {}).get(r.model)
    return None if err is None else math.expm1(err)


def failed_backtest(r: WhatIf) -> str:
    """ "failed its own back-test (53% off on this run): a rough guess" for the tile, or "" when the
    method passed (or could not be checked: the fine print says so)."""
    miss = backtest_miss(r)
    if miss is None or miss <= BACKTEST_FAIL:
        return ""
    off = f"{miss:.0%} off" if math.isfinite(miss) else "far off"
    return f"failed its own back-test ({off} on this run): a rough guess"


def backtest_line(r: WhatIf) -> str:
    """ "Checked on this run: cut at 2,048, this method would have said 29% above 4,096; the truth is 19%."."""
    checks = [c for c in ((r.backtest or {}).get("checks") or []) if c.get("predicted") is not None]
    if not checks:
        return (
            "Not checked on this run: too few completions finished below a lower cut to back-test the "
            "extrapolation, so the interval is the spread across all models."
        )
    c = checks[0]
    return (
        f"Checked on this run: cut at {c['cut']:,}, this method would have said {c['predicted']:.1%} above "
        f"{c['limit']:,}; the truth is {c['truth']:.1%} ({c['predicted_extra']:,.0f} vs {c['truth_extra']:,.0f} "
        "extra tokens per completion)."
    )


def model_line(r: WhatIf) -> str:
    """Which model the headline uses and why, and every member's value."""
    band = " · ".join(f"{m} {v:.1%}" for m, v in r.band.items())
    return f"Headline: {r.model}, {r.model_reason}. Models: {band}."


interval_note = loop_note  # one wording: Compare and the CLI say it beside the interval too


def loops_line(r: WhatIf) -> str:
    """The loop share used, with its n and interval, or how many samples it still needs."""
    loops = r.loops or {}
    if loops.get("sampled") is None:
        return f"Loop share {r.loop_fraction:.0%} (given)."
    k, n = loops["loops"], loops["sampled"]
    if not loops["used"]:
        seen = f"{k} of {n} sampled truncated completions" if n else "no truncated completion sampled yet"
        return (
            f"Repetition loops: {seen}; the estimate needs "
            f"{MIN_LOOP_SAMPLES} (sample {loops['needed']} more on the Samples page), so the estimate and its "
            "interval assume no loops (a loop stays cut at any limit: the real share can be higher)."
        )
    lo, hi = loops["interval"]
    return (
        f"Repetition loops: {k} of {n} sampled truncated completions ({k / n:.0%}, 95% {lo:.0%}–{hi:.0%}); "
        "loops stay cut at any limit, and the interval carries this share's uncertainty."
    )


def continuation_job(
    collector: Collector | None, config: RunConfig, limit: int, ceiling: int, n: int
) -> dict[str, Any]:
    """Runs in the background (components/jobs.py): sample `n` truncated completions with their
    full text from every node and build the continuation batch (runhealth.analysis.continuation).
    A finished run has no collector (its button is disabled): the job says so as its error."""
    if collector is None:
        raise RuntimeError("a finished run has no collector to sample its nodes")
    samples, _pop, errors = collector.sample_now(n=n, finish_reason="length", full_text=True)
    built = continuation.build(
        samples, limit, ceiling, config.continuation_model, {node.name: node.prompt_path for node in config.nodes}
    )
    return {
        "body": "".join(json.dumps(q) + "\n" for q in built["lines"]),
        "n": len(built["lines"]),
        "sampled": len(samples),
        "errors": errors,
        "problems": built["problems"],
        "limit": limit,
    }
