"""Time to finish the run now, and with the extra tokens per completion a what-if predicts.

The what-if model (`whatif.py`) says how many tokens a higher max_tokens adds per completion;
this turns that into seconds at the run's measured throughput. Kept apart from the model: it
is arithmetic on a measured rate, not a fit.
"""

from __future__ import annotations


def eta_change(
    remaining_completions: int,
    tokens_per_s: float | None,
    mean_tokens_now: float,
    extra_tokens_per_completion: float,
    extra_tokens_interval: list[float] | None = None,
) -> dict:
    """Time to finish the run now and with the extra tokens per completion.

    The change is linear in the extra tokens, so its interval is the extra tokens' calibrated
    interval scaled (the throughput is taken as known; it is measured, not modelled).

    Returns:
        ``{"eta_s_now", "eta_s_new", "delta_s", "delta_s_interval"}`` in seconds (None without
        a throughput).
    """
    if not tokens_per_s or tokens_per_s <= 0 or mean_tokens_now is None:
        return {"eta_s_now": None, "eta_s_new": None, "delta_s": None, "delta_s_interval": None}
    remaining = max(0, remaining_completions)
    extra = extra_tokens_per_completion or 0.0
    now = remaining * mean_tokens_now / tokens_per_s
    new = remaining * (mean_tokens_now + extra) / tokens_per_s
    lo, hi = extra_tokens_interval or (extra, extra)
    return {
        "eta_s_now": now,
        "eta_s_new": new,
        "delta_s": new - now,
        "delta_s_interval": [remaining * lo / tokens_per_s, remaining * hi / tokens_per_s],
    }
