"""Finish reasons as a bounded set of names: what a label, a table row or a stored key may hold.

A finish_reason is shard data and can be anything: 100,000 distinct values once gave /metrics
100,001 series (10.8 MB, 3.2 s a scrape, 1.5 GB of collector memory). Wherever a reason becomes
a name (a /metrics label, a key of the store's length tables, a row of the finish-reason table,
the CLI's list), it goes through here:

- the reasons the code knows (`KNOWN`) keep their names;
- any other is cut to `MAX_REASON_CHARS` with its control characters made visible (`clean`);
- of those others, the store keeps the first `MAX_STORED_OTHERS` it meets (`Namer`, at write
  time, when the counts to rank them by are not known yet) and a view keeps the `MAX_SHOWN_OTHERS`
  most frequent (`bounded`, `shown_names`);
- everything else is counted as `OTHER`, so totals stay exact: "other" carries what it replaces.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

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
MISSING = "missing"  # no finish_reason in the record (stored as "")
OTHER = "other"
MAX_REASON_CHARS = 40
MAX_STORED_OTHERS = 32  # distinct unknown reasons the store keeps apart
MAX_SHOWN_OTHERS = 8  # distinct unknown reasons a label set, table or list shows


def clean(reason: str) -> str:
    """`reason` with control characters made visible, cut to MAX_REASON_CHARS ("…" marks a cut)."""
    if reason in KNOWN:
        return reason
    text = escape(reason)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def shown_names(totals: Mapping[str, int], keep: int = MAX_SHOWN_OTHERS) -> dict[str, str]:
    """Raw reason -> the name shown, for the known reasons, `MISSING` and the `keep` most
    frequent others (ties by name); a reason absent from the answer counts as OTHER."""
    names = {r: (MISSING if r == "" else r) for r in totals if r in KNOWN or r in ("", MISSING, OTHER)}
    others = sorted((r for r in totals if r not in names), key=lambda r: (-totals[r], r))
    names.update((r, clean(r)) for r in others[:keep])
    return names


def bounded(counts: Mapping[str, int], keep: int = MAX_SHOWN_OTHERS) -> dict[str, int]:
    """`counts` (reason -> completions) with at most `keep` unknown reasons, the rest summed into
    OTHER; the total is unchanged. Most frequent first."""
    names = shown_names(counts, keep)
    out: Counter = Counter()
    for reason, n in counts.items():
        out[names.get(reason, OTHER)] += n
    return dict(out.most_common())


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
