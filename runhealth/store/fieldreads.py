"""The store's reads of the per-line fields (#33): one function per question, typed.

What the collector wrote from node/fields.py's counts (migration 8's tables): prompts answered
and answered more than once (from the prompt-ID hashes), the groups' cut shares, the prompt
tokens of `length` stops, and the cuts that never answered. `field_totals` gathers them into
one analysis.prompts.FieldTotals (a node's or the run's), which the screens and the CLI turn
into figures; `prompt_overlap` compares two runs' prompt sets. Superseded nodes are left out,
as in every total (StoreReads.counted_where).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, TypedDict

from runhealth.store.lifecycle import StoreFile


class PromptCounts(TypedDict):
    distinct_prompts: int  # distinct prompt-ID hashes
    answered_more_than_once: int  # of those, the ones seen on two lines or more
    id_lines: int  # lines that had a prompt ID


class NodeFieldCountRow(TypedDict):
    node: str
    kind: str  # 'no_answer', 'reasoned' or 'length_prompt_tokens' (migration 8's field_counts kinds)
    tokens: int
    prompt_tokens: int
    count: int


class PromptSummary(TypedDict):
    distinct_prompts: int  # over every node in the store (superseded ones included)
    answered_more_than_once: int
    id_lines: int
    nodes: list[str]  # the nodes with per-line field data
    ids_since: dict[str, Any] | None  # meta 'prompt_ids_since': IDs counted only since an upgrade (#40)


class FieldPresence(TypedDict):
    node: str
    id_lines: int
    prompt_token_lines: int
    group_field: str | None
    id_fields: list[str]  # dotted paths the prompt IDs were found at


class GroupCountRow(TypedDict):
    group: str
    completions: int
    length_stops: int
    length_by_tokens: dict[int, int]  # of those stops, by token count: all of them only when the agents sent it


class LengthPromptRow(TypedDict):
    tokens: int
    prompt_tokens: int
    count: int  # `length` stops with this (tokens, prompt tokens)


class UnansweredRow(TypedDict):
    tokens: int
    no_answer: int  # `length` stops that never answered
    reasoned: int  # `length` stops with reasoning text or a <think>


class PromptOverlap(TypedDict):
    a_prompts: int
    b_prompts: int
    in_both: int


class StoreFieldReads(StoreFile):
    """Reads of the per-line field tables (pages, the CLI and the exporter use these)."""

    def _shards_where(self, node: str | None) -> tuple[str, tuple[str, ...]]:
        """A WHERE on field_shards (alias s) for one node, or every counted node."""
        if node is not None:
            return " WHERE s.node = ?", (node,)
        where, params = self.counted_where()  # type: ignore[attr-defined]  # StoreReads, in Store
        return where.replace("node", "s.node", 1), params

    def prompt_counts(self, node: str | None = None) -> PromptCounts:
        """Distinct prompts answered and those answered more than once, for `node` or the run.

        The run without superseded nodes reads prompt_summary (one row, kept with every write);
        a node (or a run with superseded nodes) sums its shards' hashes first (a read that grows
        with the node's prompts).
        """
        where, params = self._shards_where(node)
        id_lines = self.cursor(f"SELECT COALESCE(SUM(id_lines), 0) FROM field_shards s{where}", params).fetchone()[0]
        if node is None and not params:
            row = self.cursor("SELECT distinct_prompts, answered_twice FROM prompt_summary").fetchone()
        else:
            row = self.cursor(
                "SELECT COUNT(*), COALESCE(SUM(n > 1), 0) FROM (SELECT p.hash, SUM(p.count) AS n FROM prompt_ids p"
                f" JOIN field_shards s ON s.id = p.shard{where} GROUP BY p.hash)",
                params,
            ).fetchone()
        return {"distinct_prompts": row[0], "answered_more_than_once": row[1], "id_lines": id_lines}

    def prompt_counts_by_node(self) -> dict[str, PromptCounts]:
        """Every node's distinct prompts and those answered more than once, in one statement (the
        Nodes page's read: its cost does not grow with the nodes). A prompt answered on two nodes
        counts on each, so these do not sum to the run's.

        Grouping every (node, hash) sorts all the hashes (0.75-1.0 s for 1M over 8 nodes x 8
        shards); only a hash the run holds more than once (prompt_hashes.count > 1, kept with
        every write) can come twice within a node, so this counts each node's rows in node order
        and groups only those few (0.23-0.45 s, same counts; `+p.hash` keeps it one scan of
        prompt_ids, not a lookup per shard per such hash).
        """
        rows = self.cursor(
            "WITH dup AS (SELECT hash FROM prompt_hashes WHERE count > 1),"
            " d AS (SELECT s.node AS node, COUNT(*) - 1 AS extra, SUM(p.count) > 1 AS twice FROM prompt_ids p"
            " JOIN field_shards s ON s.id = p.shard WHERE +p.hash IN dup GROUP BY s.node, p.hash),"
            " dn AS (SELECT node, SUM(extra) AS extra, SUM(twice) AS twice FROM d GROUP BY node),"
            " t AS (SELECT s.node AS node, COUNT(*) AS hashes, SUM(p.count) AS lines FROM prompt_ids p"
            " JOIN field_shards s ON s.id = p.shard GROUP BY s.node)"
            " SELECT t.node, t.hashes - COALESCE(dn.extra, 0), COALESCE(dn.twice, 0), t.lines"
            " FROM t LEFT JOIN dn ON dn.node = t.node"
        ).fetchall()
        return {r[0]: {"distinct_prompts": r[1], "answered_more_than_once": r[2], "id_lines": r[3]} for r in rows}

    def field_counts_by_node(self) -> list[NodeFieldCountRow]:
        """Every node's cuts that never answered / that reasoned and its `length` stops by prompt
        tokens, in one grouped statement (the Nodes page's per-node figures)."""
        rows = self.cursor(
            "SELECT s.node, c.kind, c.tokens, c.prompt_tokens, SUM(c.count) FROM field_counts c"
            " JOIN field_shards s ON s.id = c.shard WHERE c.kind IN ('no_answer', 'reasoned', 'length_prompt_tokens')"
            " GROUP BY s.node, c.kind, c.tokens, c.prompt_tokens"
        ).fetchall()
        return [{"node": r[0], "kind": r[1], "tokens": r[2], "prompt_tokens": r[3], "count": r[4]} for r in rows]

    def prompt_summary(self) -> PromptSummary:
        """The run's prompt counts as kept with every write, in one statement (the Overview's
        read); `nodes` lets the caller see whether a node outside its config holds any (then
        prompt_counts, which leaves superseded nodes out, is the exact read)."""
        row = self.cursor(
            "SELECT distinct_prompts, answered_twice, (SELECT COALESCE(SUM(id_lines), 0) FROM field_shards),"
            " (SELECT GROUP_CONCAT(node, char(31)) FROM (SELECT DISTINCT node FROM field_shards)),"
            " (SELECT value FROM meta WHERE key = 'prompt_ids_since') FROM prompt_summary"
        ).fetchone()
        return {
            "distinct_prompts": row[0],
            "answered_more_than_once": row[1],
            "id_lines": row[2],
            "nodes": sorted(row[3].split("\x1f")) if row[3] else [],
            "ids_since": json.loads(row[4]) if row[4] else None,
        }

    def field_presence(self) -> list[FieldPresence]:
        """Per node: lines with a prompt ID / prompt tokens, its group field and its ID paths."""
        out: dict[str, FieldPresence] = {}
        for r in self.query("SELECT node, id_lines, prompt_token_lines, group_field, id_fields FROM field_shards"):
            p = out.setdefault(
                r["node"],
                {"node": r["node"], "id_lines": 0, "prompt_token_lines": 0, "group_field": None, "id_fields": []},
            )
            p["id_lines"] += r["id_lines"]
            p["prompt_token_lines"] += r["prompt_token_lines"]
            p["group_field"] = p["group_field"] or r["group_field"]
            p["id_fields"] = sorted(set(p["id_fields"]) | set(json.loads(r["id_fields"]) if r["id_fields"] else []))
        return [out[k] for k in sorted(out)]

    def _field_counts(self, kinds: tuple[str, ...], node: str | None, cols: str) -> list[dict]:
        where, params = self._shards_where(node)
        marks = ",".join("?" * len(kinds))
        return self.query(
            f"SELECT c.kind, {cols}, SUM(c.count) AS count FROM field_counts c JOIN field_shards s ON s.id = c.shard"
            f"{where} AND c.kind IN ({marks}) GROUP BY c.kind, {cols}",
            (*params, *kinds),
        )

    def group_counts(self, node: str | None = None) -> list[GroupCountRow]:
        """Completions and `length` stops per group (the configured field's values, or prompt-token
        bins), with those stops by token count where the agents sent them (#41: an older agent's
        are missing from `length_by_tokens`, whose sum is then below `length_stops`)."""
        acc: dict[str, GroupCountRow] = {}
        rows = self._field_counts(("group", "group_length", "group_length_tokens"), node, "c.key, c.tokens")
        for r in rows:
            row = acc.setdefault(
                r["key"], {"group": r["key"], "completions": 0, "length_stops": 0, "length_by_tokens": {}}
            )
            if r["kind"] == "group_length_tokens":
                row["length_by_tokens"][r["tokens"]] = r["count"]
            else:
                row["completions" if r["kind"] == "group" else "length_stops"] += r["count"]
        return [acc[k] for k in sorted(acc)]

    def length_prompt_tokens(self, node: str | None = None) -> list[LengthPromptRow]:
        """`length` stops by (tokens, prompt tokens), where the prompt's token count is known."""
        rows = self._field_counts(("length_prompt_tokens",), node, "c.tokens, c.prompt_tokens")
        return [{"tokens": r["tokens"], "prompt_tokens": r["prompt_tokens"], "count": r["count"]} for r in rows]

    def unanswered_counts(self, node: str | None = None) -> list[UnansweredRow]:
        """Per token count: `length` stops that never answered, and those with reasoning at all."""
        acc: dict[int, UnansweredRow] = {}
        for r in self._field_counts(("no_answer", "reasoned"), node, "c.tokens"):
            row = acc.setdefault(r["tokens"], {"tokens": r["tokens"], "no_answer": 0, "reasoned": 0})
            row["no_answer" if r["kind"] == "no_answer" else "reasoned"] += r["count"]
        return [acc[k] for k in sorted(acc)]

    def prompt_overlap(self, other: str | Path) -> PromptOverlap:
        """This run's (A's) distinct prompts, the other store's (B's), and how many are in both:
        one read-only join of the two prompt_hashes tables (no hash set held in memory)."""
        db = sqlite3.connect(f"file:{Path(self.path)}?mode=ro", uri=True)
        try:
            db.execute("ATTACH DATABASE ? AS b", (f"file:{Path(other)}?mode=ro",))
            a = db.execute("SELECT COUNT(*) FROM main.prompt_hashes").fetchone()[0]
            b = db.execute("SELECT COUNT(*) FROM b.prompt_hashes").fetchone()[0]
            both = db.execute(
                "SELECT COUNT(*) FROM main.prompt_hashes x WHERE EXISTS (SELECT 1 FROM b.prompt_hashes y"
                " WHERE y.hash = x.hash)"
            ).fetchone()[0]
        finally:
            db.close()
        return {"a_prompts": a, "b_prompts": b, "in_both": both}
