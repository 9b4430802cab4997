"""Numbers and remote text made ready for the screen: clock times, byte sizes, rates, windows, and
markdown escaping for text that comes from the nodes.

Ages ("3 min", "1.2 h") are `runhealth.ages.fmt_age`: the core words node states with it, so
there is one definition. Nothing here calls Streamlit; every function is a plain str -> str.
"""

from __future__ import annotations

import re
import time

from runhealth.ages import fmt_age as fmt_age
from runhealth.ages import fmt_ago as fmt_ago
from runhealth.screens.nodestates import DOWN_AFTER_STALE as DOWN_AFTER_STALE  # node states: one rule, the core's
from runhealth.screens.words import fmt_bytes as fmt_bytes  # the core words tiles with these
from runhealth.screens.words import fmt_count as fmt_count
from runhealth.screens.words import fmt_plural as fmt_plural
from runhealth.screens.words import fmt_rate as fmt_rate
from runhealth.screens.words import fmt_share as fmt_share
from runhealth.screens.words import fmt_tokens as fmt_tokens
from runhealth.screens.words import fmt_window as fmt_window


def fmt_clock(ts: float) -> str:
    """A wall-clock time for "since when" sentences (the dashboard host's time zone)."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def fmt_number(x: float | None) -> str:
    """A plain number for a table cell: whole numbers without decimals ("5", "1,024"), others to
    three significant digits ("0.873", "12.5"); missing (None, NaN) is "N/A", never "None"."""
    if x is None or x != x:  # NaN is the one value not equal to itself
        return "N/A"
    if float(x).is_integer() or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def fmt_percentile_tokens(value: int | None, ceiling: int | None) -> str:
    """A length percentile; "≥ 8,192" when it sits at the run's ceiling, where the completions
    were cut and the real percentile is only known to be at least that."""
    return "—" if value is None else fmt_tokens(value, ceiling)


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#|~$])")


def md_escape(text: str) -> str:
    """Make remote text inert in st.markdown / st.error (no links, no formatting, no HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))
