"""Finish reasons as the store names them: a bounded set of names for its length tables.

A finish_reason is shard data and can be anything: 100,000 distinct values once gave /metrics
100,001 series. The store keeps the reasons the code knows (`KNOWN`) under their names, any
other cut to `MAX_REASON_CHARS` with its control characters made visible (`clean`), the first
`MAX_STORED_OTHERS` of those others it meets (`Namer`, at write time), and counts the rest as
`OTHER`, so totals stay exact. A leaf module (textsafe only): the store imports it, and
runhealth/analysis/reasons.py builds the views' bounds on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from runhealth.textsafe import escape

# stop / length: OpenAI-style servers (vLLM, SGLang); abort: vLLM's and SGLang's third reason;
# the rest: tool calls, filters and other APIs' spellings of "stopped" / "hit the limit".
KNOWN = (
    "stop",
    "length",
    "abort",
    "eos",
    "tool_calls",
    "function_call",
    "content_filter",
    "max_tokens",
    "end_turn",
    "stop_sequence",
)
# The reasons that mean "stopped naturally" (the model ended it): a usable completion (#33).
NATURAL = ("stop", "eos", "end_turn", "stop_sequence")
MISSING = "missing"  # no finish_reason in the record (stored as "")
OTHER = "other"
MAX_REASON_CHARS = 40
MAX_STORED_OTHERS = 32  # distinct unknown reasons the store keeps apart


def clean(reason: str) -> str:
    """`reason` with control characters made visible, cut to MAX_REASON_CHARS ("…" marks a cut)."""
    if reason in KNOWN:
        return reason
    text = escape(reason)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


class Namer:
    """The store's names for reasons: known ones and the first MAX_STORED_OTHERS others as they
    come (cleaned), OTHER for the rest. `stored` is what the store already holds: names kept
    earlier stay (a store written before this bound may hold more; nothing new joins them)."""

    def __init__(self, stored: Iterable[str], limit: int = MAX_STORED_OTHERS):
        self.limit = limit
        self.kept = {r for r in stored if r not in KNOWN and r not in ("", OTHER)}

    def name(self, reason: str | None) -> str | None:
        if reason is None or reason in KNOWN:
            return reason
        name = clean(reason)
        if name in self.kept or name == OTHER:
            return name
        if len(self.kept) < self.limit:
            self.kept.add(name)
            return name
        return OTHER
