"""What the cut cost, in words: the token-waste line and the energy per usable token (#33 item 2).

The Overview, the Nodes page, Compare and `runhealth status` word runhealth.analysis.tokencost's
numbers with these, in words.py's one format, so the line reads the same everywhere; and every
energy figure says where its joules come from (NVML's counter, or power x time where a GPU has
none).
"""

from __future__ import annotations

from runhealth.analysis.tokencost import EnergyCost, Waste
from runhealth.screens.words import NA, fmt_count, fmt_joules, fmt_share

WASTE_HELP = (
    "Exact from the shards' (completion_tokens, finish_reason) counts: the share of completions and of "
    "generated tokens in completions that stopped by length at the ceiling. Loops are estimated from the "
    "latest sample of truncated completions (their share times the tokens at the ceiling). A usable "
    "completion stopped naturally (stop, eos, end_turn, stop_sequence); tokens per usable completion "
    "counts every generated token, cut ones included. Energy: NVML's total-energy counter over the polls "
    "the collector measured, divided by the usable tokens written over the same polls."
)
SOURCE_WORDS = {
    "counter": "NVML energy counter",
    "power x time": "power × time: these GPUs have no energy counter",
    "none": "no energy measured yet",
}


def waste_line(w: Waste) -> str:
    """The Overview's one line: "18.0% of completions, 31.0% of tokens were cut at 4,096; ...".

    The loop part is an estimate from the sample and says its interval and n."""
    if not w.completions:
        return "No completions counted yet."
    if not w.ceiling_tokens:
        return "No max_tokens ceiling found in the data: no completion was cut at one."
    line = (
        f"{fmt_share(w.completion_share)} of completions, {fmt_share(w.token_share)} of tokens "
        f"were cut at {w.ceiling_tokens:,}"
    )
    if w.loops is not None:
        lo = w.loops
        line += (
            f"; ≈ {fmt_share(lo.share)} of tokens in loops (95% CI {fmt_share(lo.low)}–{fmt_share(lo.high)}; "
            f"{fmt_count(lo.loops)} of {fmt_count(lo.n)} sampled cut completions loop)"
        )
    per = w.tokens_per_usable
    return line + (f" · {fmt_count(per)} tokens per usable completion" if per is not None else "")


def energy_source(e: EnergyCost) -> str:
    """Where the joules come from, and the poll intervals dropped as implausible (#40 item 5)."""
    if e.source == "mixed":
        words = f"NVML energy counter; {fmt_share(e.integrated_share)} power × time (GPUs without the counter)"
    else:
        words = SOURCE_WORDS[e.source]
    return words + (f"; {dropped_words(e.dropped_steps)}" if e.dropped_steps else "")


def dropped_words(n: int) -> str:
    """ "3 steps dropped (implausible GPU readings)": the intervals left out, energy and tokens both."""
    return f"{n:,} step{'' if n == 1 else 's'} dropped (implausible or missing GPU readings)"


def per_m_joules(e: EnergyCost | None) -> str:
    return NA if e is None or e.joules_per_m is None else fmt_joules(e.joules_per_m)


def per_m_gpu_hours(e: EnergyCost | None) -> str:
    return NA if e is None or e.gpu_hours_per_m is None else f"{e.gpu_hours_per_m:,.2f} GPU-h"


def energy_line(e: EnergyCost | None) -> str:
    """ "41.2 MJ and 12.30 GPU-h per 1M usable tokens (NVML energy counter)", or why not."""
    if e is None:
        return "Energy per usable token: N/A (no GPU reported energy or power)"
    if e.joules_per_m is None:
        why = "no usable tokens written while energy was measured" if e.joules else energy_source(e)
        return f"Energy per usable token: N/A ({why})"
    resets = f"; energy counter reset {e.resets}× (driver reloaded)" if e.resets else ""
    return f"Energy: {per_m_joules(e)} and {per_m_gpu_hours(e)} per 1M usable tokens ({energy_source(e)}{resets})"
