"""Ages in words: "3 min", "1.2 h", "3 min ago", and a time after now said as a clock step.

One wording for every surface: the node states and the alerts' sentences (runhealth.rules),
the screen models (runhealth.screens) and the components show ages with these two, so "stale
for 4 min" reads the same on the Nodes page, in a webhook and on the Overview. Stdlib only, a
leaf below the rules and the screens (it was in rules/health.py, where components/ may not
reach: issue #41).
"""

from __future__ import annotations

import math

FUTURE_TOLERANCE_S = 1.0  # a time this little after now is rounding between two processes, not a step


def fmt_age(seconds: float | None) -> str:
    """A duration in words: "45 s" under 90 s, then minutes, hours under two days, then days;
    "N/A" for a missing one (never "0 s"); a negative one counts as 0."""
    if seconds is None or math.isnan(seconds):
        return "N/A"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def fmt_ago(seconds: float | None) -> str:
    """How long ago, as a phrase ("3 min ago"). A time after now (`seconds` < 0: it was stamped
    before a clock stepped back) says so instead of "0 s ago": "60 min ahead of this host's
    clock: a clock moved back"."""
    if seconds is None or math.isnan(seconds):
        return "N/A"
    if seconds < -FUTURE_TOLERANCE_S:
        return f"{fmt_age(-seconds)} ahead of this host's clock: a clock moved back"
    return f"{fmt_age(seconds)} ago"
