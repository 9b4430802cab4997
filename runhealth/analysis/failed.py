"""Failed requests as one figure (#39 item 2): the one definition every surface shows.

A failed request (an HTTP status other than 200, an `error` object, a batch result errored /
expired / canceled) is counted by the node agent apart from the completions: it is in no length
statistic and answers no prompt. Its share is of *requests*, completions + failed: the Overview's
line, the Nodes page, /metrics, webhooks, `status/compare --json` and Compare all read
`failed_requests` and word it with `FailedRequests.line`; the alert (runhealth/rules/health.py)
applies the one `level` rule to `share`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class FailedRequests:
    """A run's (or a node's) failed requests beside its completions."""

    failed: int
    completions: int
    by_reason: tuple[tuple[str, int], ...]  # most first, then by name
    failed_prompts: int = 0  # distinct prompt IDs on failed lines (0 without IDs)
    retried: int = 0  # of those, answered too: a retried failure, answered once

    @property
    def requests(self) -> int:
        """Requests that came back: completions + failed."""
        return self.completions + self.failed

    @property
    def share(self) -> float | None:
        """Failed of requests; None before any request came back."""
        return self.failed / self.requests if self.requests else None

    @property
    def reasons_text(self) -> str:
        """ "server_error 10, http_500 2" (the first few reasons), or ""."""
        shown = [f"{r} {n:,}" for r, n in self.by_reason[:4]]
        more = len(self.by_reason) - len(shown)
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    @property
    def value(self) -> str:
        """The tile's number: "12 (0.5% of requests)", "0" with requests, "—" without."""
        if self.share is None:
            return "—"
        return f"{self.failed:,} ({self.share:.1%} of requests)" if self.failed else "0"

    @property
    def line(self) -> str:
        """ "Failed requests 12 (0.5% of requests) · server_error 10, http_500 2 · 3 retried and answered"."""
        parts = [f"Failed requests {self.value}"]
        if self.failed:
            parts.append(self.reasons_text)
        if self.retried:
            parts.append(f"{self.retried:,} retried and answered")
        return " · ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The keys `status --json`, `compare --json` and the Nodes download carry."""
        share = self.share
        return {
            "failed_requests": self.failed,
            "failed_pct": None if share is None else round(100 * share, 3),
            "failed_by_reason": dict(self.by_reason),
            "failed_prompts": self.failed_prompts,
            "failed_retried": self.retried,
            "failed_line": self.line,
        }


def failed_requests(
    rows: Iterable[Mapping[str, Any]],
    completions: int,
    node: str | None = None,
    prompts: Mapping[str, Any] | None = None,
) -> FailedRequests:
    """The failed requests of the run (or of `node`) from the store's rows ({node, reason, count},
    Store.failed_rows) beside its `completions`; `prompts`: Store.failed_prompts' counts."""
    by: dict[str, int] = {}
    for r in rows:
        if node is None or r["node"] == node:
            by[r["reason"]] = by.get(r["reason"], 0) + int(r["count"])
    p = prompts or {}
    return FailedRequests(
        failed=sum(by.values()),
        completions=int(completions),
        by_reason=tuple(sorted(((r, n) for r, n in by.items() if n), key=lambda x: (-x[1], x[0]))),
        failed_prompts=int(p.get("failed_prompts") or 0),
        retried=int(p.get("retried") or 0),
    )
