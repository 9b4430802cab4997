"""Never a silent zero (#39 item 3): when the share at the ceiling is unknown, and the words why.

The share at the ceiling counts `length` stops among completions with a real token count. When
the finish reason is missing, or the token count is a chars/4 estimate (no token field found),
on more than `UNKNOWN_SHARE` of a run's completions, that share would read as a calm 0%: instead
every surface (the Overview's tile and banner, Output lengths, /metrics, `status --json`,
webhooks) says "unknown", with these words naming the fields looked for and the config keys to
set. The one rule is `unknown_of(summary)`.
"""

from __future__ import annotations

import dataclasses

from runhealth.analysis.stats import MISSING, Summary
from runhealth.node import formats

UNKNOWN_SHARE = 0.01  # above this share of completions without a finish reason / token count
# The fields the agent looks for, named for people: every format entry's (node/formats.py), so a
# format added there is named here with no second list.
FINISH_FIELDS = formats.looked_for("finish")
TOKEN_FIELDS = formats.looked_for("tokens")
REASON_KEYS = ("finish_reason_path", "cut_labels")
TOKEN_KEYS = ("completion_tokens_path",)


@dataclasses.dataclass(frozen=True)
class Unknown:
    """Why the share at the ceiling is unknown: the completions without a finish reason and
    those with an estimated length, of `completions`."""

    completions: int
    missing_reason: int
    estimated: int

    @property
    def reason_unknown(self) -> bool:
        return self.missing_reason > UNKNOWN_SHARE * self.completions

    @property
    def tokens_unknown(self) -> bool:
        return self.estimated > UNKNOWN_SHARE * self.completions

    @property
    def short(self) -> str:
        """The tile's words: "no finish reason on 100.0% of completions" (and / or the token count)."""
        parts = []
        if self.reason_unknown:
            parts.append(f"no finish reason on {self.missing_reason / self.completions:.1%}")
        if self.tokens_unknown:
            parts.append(f"no token count on {self.estimated / self.completions:.1%}")
        return " · ".join(parts) + " of completions"

    @property
    def text(self) -> str:
        """One sentence per missing field: what share, where we looked, what to set in [run]."""
        parts = []
        if self.reason_unknown:
            parts.append(
                f"No finish reason on {self.missing_reason / self.completions:.1%} of completions"
                f" (looked for {', '.join(FINISH_FIELDS)}): set [run] {' / '.join(REASON_KEYS)}."
            )
        if self.tokens_unknown:
            parts.append(
                f"No token count on {self.estimated / self.completions:.1%} of completions, estimated as chars/4"
                f" (looked for {', '.join(TOKEN_FIELDS)}): set [run] {' / '.join(TOKEN_KEYS)}."
            )
        return " ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {
            "why": self.text,
            "missing_finish_reason": self.missing_reason,
            "estimated_tokens": self.estimated,
            "completions": self.completions,
        }


def unknown_from(completions: int, missing_reason: int, estimated: int) -> Unknown | None:
    """The one rule: None while the share at the ceiling can be known (no completions yet is
    not "unknown": it is "no data"), else why it cannot."""
    if not completions:
        return None
    found = Unknown(completions, missing_reason, estimated)
    return found if found.reason_unknown or found.tokens_unknown else None


def unknown_of(summary: Summary) -> Unknown | None:
    """`unknown_from` over a run's (or a node's) Summary."""
    return unknown_from(summary.completions, summary.finish_reasons.get(MISSING, 0), summary.estimated_count)
