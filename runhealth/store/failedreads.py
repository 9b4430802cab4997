"""The store's reads of failed requests (#39 item 2): what migration 13's tables hold, typed.

`failed_counts` holds the failed request lines per node, shard and bounded reason (written by
writes.py with the shard's counts, dropped with them on a reset); `failed_ids` their prompt-ID
hashes. Superseded nodes are left out, as in every total (StoreReads.counted_where). What the
counts mean (the share of requests, the alert, the words) is runhealth/analysis/failed.py's.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TypedDict

from runhealth.store.lifecycle import StoreFile


class FailedRow(TypedDict):
    node: str
    reason: str  # the store's bounded name (reasonnames.Namer): an error type or code, or "other"
    count: int  # failed request lines


class FailedPrompts(TypedDict):
    failed_prompts: int  # distinct prompt IDs on failed lines
    retried: int  # of those, prompts also answered (a failed request retried with success)


class StoreFailedReads(StoreFile):
    """The failed-request reads, mixed into Store."""

    def failed_rows(self, gone: Collection[str] | None = None) -> list[FailedRow]:
        """Failed request lines by node and reason over the counted nodes (one statement);
        `gone`: the superseded nodes when the caller has read them already."""
        if gone is None:
            where, params = self.counted_where()  # type: ignore[attr-defined]  # StoreReads, in Store
        else:
            params = tuple(gone)
            where = f" WHERE node NOT IN ({','.join('?' * len(params))})"
        rows = self.cursor(
            f"SELECT node, reason, SUM(count) FROM failed_counts{where} GROUP BY node, reason HAVING SUM(count) > 0"
            " ORDER BY node, reason",
            params,
        ).fetchall()
        return [{"node": r[0], "reason": r[1], "count": int(r[2])} for r in rows]

    def failed_prompts(self, node: str | None = None) -> FailedPrompts:
        """Distinct failed prompt IDs (of `node`, else the counted nodes) and how many of them
        were answered too (on any node: a retry may land elsewhere). Failed lines are few; the
        read walks them, not the answered prompts."""
        if node is not None:
            where, params = " WHERE s.node = ?", (node,)
        else:
            where, params = self.counted_where()  # type: ignore[attr-defined]
            where = where.replace("node", "s.node", 1)
        row = self.cursor(
            "SELECT COUNT(*), COALESCE(SUM(EXISTS (SELECT 1 FROM prompt_hashes h WHERE h.hash = f.hash)), 0)"
            f" FROM (SELECT DISTINCT i.hash AS hash FROM failed_ids i JOIN field_shards s ON s.id = i.shard{where}) f",
            params,
        ).fetchone()
        return {"failed_prompts": int(row[0]), "retried": int(row[1])}
