"""Pure table and record builders: store reads in, pandas DataFrames (or flat dicts) out.

No Streamlit calls, so each is tested directly; cards and pages place what they return. The
numbers behind the Overview's headline (ETA, tokens per joule, node counts) come from
`runhealth.screens.derived.standup`, the same ones the tiles show.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Collection, Mapping
from typing import Any

import pandas as pd

from components.format import fmt_bytes, fmt_count, fmt_number, fmt_rate, fmt_share
from runhealth.ages import fmt_age, fmt_ago
from runhealth.records import HostReading, NodeRow, StoredSample
from runhealth.screens.gpus import gpu_state
from runhealth.screens.lengths import Summary, WhatIf, wilson_interval
from runhealth.screens.nodestates import NodeRate, indexing_progress, state_at
from runhealth.settings.windows import NOTICE_S

STATE_BADGE = {
    "up": "UP",
    "done": "DONE",
    "stale": "STALE",
    "down": "DOWN",
    "pending": "PENDING",
    "finished": "FINISHED",
}
REPLACED_NOTICE_S = NOTICE_S  # a shard replaced within this is named above the table (which always says it)
REPLACED_NAMED = 5  # shards a replacement notice names; the rest are counted


def finished_line(node: NodeRow) -> str:
    """A finished run's node in words: when it was last polled (its age only grows)."""
    ok = node.get("last_ok_unix")
    return f"last polled {time.strftime('%Y-%m-%d %H:%M', time.localtime(ok))}" if ok else "never polled"


def short_group_labels(df: pd.DataFrame, top_n: int = 25) -> pd.DataFrame:
    """Groups with short labels (the common folder prefix removed; `group` keeps the full name)
    and, when there are more than top_n, the top_n by truncation plus one row summing the rest."""
    if df.empty:
        return df.assign(label=[])
    names = df["group"].tolist()
    cut = len(os.path.commonprefix(names)) if len(names) > 1 else 0
    # Only whole path parts go: node names stay whole ("node-1", not "1", which read as a number).
    cut = names[0].rfind("/", 0, cut) + 1 if "/" in names[0][:cut] else 0
    out = df.assign(label=[n[cut:] or n for n in names]).sort_values("fraction", ascending=False, kind="stable")
    if len(out) <= top_n:
        return out
    top, rest = out.iloc[:top_n], out.iloc[top_n:]
    n, at = int(rest["completions"].sum()), int(rest["at_ceiling"].sum())
    lo, hi = wilson_interval(at, n)
    other = {
        "group": f"{len(rest):,} other groups",
        "label": f"{len(rest):,} others",
        "completions": n,
        "at_ceiling": at,
        "fraction": at / n if n else 0.0,
        "lo": lo,
        "hi": hi,
        "ceiling": None,
        "drift": False,
    }
    return pd.concat([top, pd.DataFrame([other])], ignore_index=True)


def group_table(df: pd.DataFrame) -> pd.DataFrame:
    """The truncation-by-group table as shown: highest share cut first, counts and shares as text
    in the one number format (the chart and the export keep the raw numbers)."""
    out = df.drop(columns=["lo", "hi"]).sort_values("fraction", ascending=False, kind="stable")
    return out.assign(
        completions=out["completions"].map(fmt_count),
        at_ceiling=out["at_ceiling"].map(fmt_count),
        fraction=out["fraction"].map(fmt_share),
        ceiling=out["ceiling"].map(fmt_count),
    )


def gpu_bands(df: pd.DataFrame, value: str, points: int = 240) -> pd.DataFrame:
    """Per node and time step: median, min and max of `value` across the node's GPUs."""
    if df.empty:
        return pd.DataFrame(columns=["node", "t_unix", "median", "min", "max", "gpus"])
    span = float(df["ts_unix"].max() - df["ts_unix"].min()) or 1.0
    step = max(span / points, 1.0)
    t = (df["ts_unix"] // step) * step
    g = df.assign(t_unix=t).groupby(["node", "t_unix"])[value]
    out = g.agg(["median", "min", "max"]).join(
        df.assign(t_unix=t).groupby(["node", "t_unix"])["gpu"].nunique().rename("gpus")
    )
    return out.reset_index()


def whatif_curve(result: WhatIf) -> pd.DataFrame:
    """Projected share still truncated against the limit, starting at today's share at the ceiling:
    the calibrated interval (lo, hi) and the spread across the models (band_lo, band_hi)."""
    now = result.current_truncated_fraction
    rows = [{"limit": result.ceiling_tokens, "fraction": now, "lo": now, "hi": now, "band_lo": now, "band_hi": now}]
    for point in result.curve:
        band = list(point["band"].values())
        rows.append(
            {
                "limit": point["limit"],
                "fraction": point["truncated_fraction"],
                "lo": point["interval"][0],
                "hi": point["interval"][1],
                "band_lo": min(band),
                "band_hi": min(now, max(band)),
            }
        )
    return pd.DataFrame(rows, columns=["limit", "fraction", "lo", "hi", "band_lo", "band_hi"])


def node_table(
    nodes: list[NodeRow],
    stale_after: float,
    now: float | None = None,
    per_node: Mapping[str, NodeRate] | None = None,
    finished: bool = False,
    eta: Mapping[str, str] | None = None,
    done: Collection[str] = (),
) -> pd.DataFrame:
    """One row per node; with `per_node` (the rates' NodeRate map: runhealth.rules.activity) its tok/s over the last
    minute and when its shards last grew; with `eta` (the Nodes model's eta_cells) its ETA to its share;
    `done` (the model's done_nodes) the nodes that wrote their share: "DONE". A finished run's nodes are "FINISHED" (not polled any
    more), with when they were last polled: no up / stale wording."""
    now = now or time.time()
    rows = []
    for n in nodes:
        state, why = state_at(n, now, stale_after, done)
        if finished:
            state, why = "finished", finished_line(n)
        free = [f for d in (n.get("disk") or {}).values() if (f := d.get("free_bytes")) is not None]
        rows.append(
            {
                "node": n["name"],
                "status": STATE_BADGE[state],
                "detail": why,
                "last seen": fmt_age(now - ok) if (ok := n.get("last_ok_unix")) else "never",
                # Text cells, units in them: a numeric column with a gap became floats ("5.000000",
                # "None") on screen; a node never reached has "N/A" here.
                "GPUs": fmt_number(n.get("gpus_found")),
                "shards": fmt_number(n.get("shards_matched")),
                "disk free": fmt_bytes(min(free)) if free else "N/A",
                "SSH RTT": f"{rtt:.0f} ms" if (rtt := n.get("rtt_ms")) is not None else "N/A",
            }
        )
        if per_node is not None:
            r = per_node.get(n["name"])
            rows[-1]["tok/s (1 min)"] = fmt_rate(r.tokens_per_s_1m) if r and r.tokens_per_s_1m is not None else "N/A"
            grown = r.last_growth_unix if r else None
            # A polled node that never wrote is waiting for its first completion, not stalled.
            rows[-1]["last new"] = fmt_ago(now - grown) if grown else "waiting for first completion" if r else "N/A"
        if eta:
            rows[-1]["ETA (its share)"] = eta.get(n["name"], "N/A")
    return pd.DataFrame(rows)


def server_metrics_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """loaders.metrics_frame (metric x node) as text: "N/A" where a node has no value."""
    return metrics.apply(lambda col: col.map(fmt_number)).reset_index().rename(columns={"name": "metric"})


def last_error_line(node: NodeRow, now: float) -> str:
    """The last error with its age, and whether a successful poll came after it (then it is history)."""
    err_at, ok_at = node.get("last_error_unix"), node.get("last_ok_unix")
    when = fmt_ago(now - err_at) if err_at else "time unknown"
    if err_at is not None and ok_at is not None and ok_at > err_at:
        return f"Last error ({when}; resolved — polled fine {fmt_ago(now - ok_at)}): " + str(node["last_error"])
    return f"Last error ({when}): " + str(node["last_error"])


STATE_RANK = {"down": 0, "stale": 1, "pending": 2, "up": 3, "done": 3}  # worst first


def node_issues(node: NodeRow, now: float, stale_after: float, unreadable: list[tuple[str, str]]) -> list:
    """[(problem, detail)] for one node: not up, an unresolved last error, globs matching
    nothing, GPU telemetry or server-metrics errors, shards it cannot read (path, error)."""
    state, why = state_at(node, now, stale_after)
    out = [] if state == "up" else [("not up", why)]
    err_at, ok_at = node.get("last_error_unix"), node.get("last_ok_unix")
    if node.get("last_error") and state == "up" and (ok_at is None or err_at is None or err_at >= ok_at):
        out.append(("last poll failed", last_error_line(node, now)))
    out += [("no shard matched", glob) for glob in node.get("unmatched_globs") or []]
    if node.get("gpu_error"):
        out.append(("GPU telemetry", str(node["gpu_error"])))
    out += [("server metrics", f"{url}: {err}") for url, err in (node.get("metrics_errors") or {}).items()]
    return out + [("cannot read shard", f"{path}: {err}") for path, err in unreadable]


def node_problems(
    nodes: list[NodeRow], shards: pd.DataFrame, stale_after: float, now: float
) -> tuple[pd.DataFrame, list[str]]:
    """Every node's problems in one table (a row per problem, worst node first) and every node's
    name, worst first: not up (down, stale, pending; the longest silent first), then up with a
    problem, then the rest by name (node-2 before node-10). At fleet size this replaces a card per troubled node."""
    broken = shards[shards["error"].notna()] if len(shards) else shards
    unreadable: dict[str, list[tuple[str, str]]] = {}
    for node, path, err in zip(broken.get("node", []), broken.get("path", []), broken.get("error", []), strict=True):
        unreadable.setdefault(node, []).append((path, err))
    keyed, rows = [], []
    for n in nodes:
        state = state_at(n, now, stale_after)[0]
        issues = node_issues(n, now, stale_after, unreadable.get(n["name"], []))
        seen = n.get("last_ok_unix")
        natural = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n["name"])]  # node-2 before node-10
        keyed.append(((STATE_RANK[state], not issues, seen if seen is not None else -1.0, natural), n, state, issues))
    keyed.sort(key=lambda k: k[0])
    for _, n, state, issues in keyed:
        seen = n.get("last_ok_unix")
        for problem, detail in issues:
            rows.append(
                {
                    "node": n["name"],
                    "status": STATE_BADGE[state],
                    "last seen": fmt_ago(now - seen) if seen else "never",
                    "problem": problem,
                    "detail": detail,
                }
            )
    columns = ["node", "status", "last seen", "problem", "detail"]
    return pd.DataFrame(rows, columns=columns), [k[1]["name"] for k in keyed]


def why_empty(nodes: list[NodeRow], what: str = "completions") -> str:
    """One sentence saying why there is nothing to show yet."""
    if not nodes:
        return "No nodes configured."
    if all(n.get("last_ok_unix") is None for n in nodes):
        errors = [f"{n['name']}: {n['last_error']}" for n in nodes if n.get("last_error")]
        return "Waiting for first poll" + (f" ({'; '.join(errors[:3])})" if errors else ".")
    misses = [f"no shard matched {g} on {n['name']}" for n in nodes for g in n.get("unmatched_globs") or []]
    if misses and not any(n.get("shards_matched") for n in nodes):
        return "No " + what + " yet: " + "; ".join(misses[:3]) + "."
    return f"No {what} counted yet: the shards matched hold no complete lines so far."


def finish_reason_table(summary: Summary) -> pd.DataFrame:
    """Finish reasons, with "length" split into at-the-ceiling and below-it (context window)."""
    reasons = dict(summary.finish_reasons)
    length = reasons.pop("length", 0)
    rows = [(r, n) for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    ceiling = summary.ceiling_tokens
    if length:
        rows.append(
            (
                f"length at the ceiling ({ceiling:,}) = truncated" if ceiling else "length at the ceiling = truncated",
                summary.at_ceiling,
            )
        )
        rows.append(("length — below the ceiling (context window)", summary.length_below_ceiling))
        rest = length - summary.at_ceiling - summary.length_below_ceiling
        if rest:
            rows.append(("length — estimated lengths (not split)", rest))
    total = summary.completions or 1
    return pd.DataFrame(
        [{"finish reason": r, "completions": fmt_count(n), "share": fmt_share(n / total)} for r, n in rows]
    )


EXPORT_TAIL_CHARS = 1000  # of each completion's end in the Samples CSV (where truncated ones were cut)


def samples_export(samples: list[StoredSample]) -> pd.DataFrame:
    """The Samples CSV: where each sample came from AND what it says (prompt head, text head, the
    last EXPORT_TAIL_CHARS characters). A CSV is data, never rendered: no escaping needed here."""
    return pd.DataFrame(
        [
            {
                "node": s.get("node"),
                "path": s.get("path"),
                "line": s.get("line_no"),
                "tokens": s.get("tokens"),
                "estimated": bool(s.get("estimated")),
                "finish reason": s.get("finish_reason"),
                "loop": bool(s.get("is_loop")),
                "text chars": s.get("text_chars"),
                "prompt head": s.get("prompt_head"),
                "text head": s.get("text_head"),
                "text tail": (s.get("text_tail") or "")[-EXPORT_TAIL_CHARS:],
            }
            for s in samples
        ],
        columns=[
            "node",
            "path",
            "line",
            "tokens",
            "estimated",
            "finish reason",
            "loop",
            "text chars",
            "prompt head",
            "text head",
            "text tail",
        ],
    )


def gpu_table(gpus: pd.DataFrame, run_writing: bool = True) -> pd.DataFrame:
    """The GPUs now, in the words of the one GPU rule (runhealth.rules.hardware.gpu_state): the ones
    that need a look ("⚠ ...") first, then information (at the power cap), then "ok"."""
    # zip over columns, not iterrows: iterrows builds a Series per GPU (0.1 s for 512 GPUs).
    errors = gpus["error"] if "error" in gpus else [None] * len(gpus)
    readings = zip(errors, gpus["util_pct"], gpus["temp_c"], gpus["throttle_reasons"], strict=True)
    flags = [
        gpu_state({"error": e, "util_pct": u, "temp_c": t, "throttle_reasons": r}, run_writing)
        for e, u, t, r in readings
    ]
    out = pd.DataFrame(
        {
            "GPU": gpus["label"],
            "model": gpus["name"],
            "state": flags,
            "util %": gpus["util_pct"],
            "power W": gpus["power_w"],
            "limit W": gpus["power_limit_w"],
            "mem GiB": gpus["mem_used_mib"] / 1024,
            "of GiB": gpus["mem_total_mib"] / 1024,
            "temp °C": gpus["temp_c"],
            "SM MHz": gpus["sm_clock_mhz"],
            "processes": [len(p) for p in gpus["processes"]],
        },
        index=gpus.index,
    )
    return out.sort_values(
        "state", key=lambda s: s.map(lambda v: 0 if v.startswith("⚠") else 2 if v == "ok" else 1), kind="stable"
    )


def gpu_processes(gpus: pd.DataFrame) -> pd.DataFrame:
    rows = [
        {
            "GPU": label,
            "pid": p.get("pid"),
            "process": p.get("name"),
            "mem GiB": (p.get("mem_used_mib") or 0) / 1024,
        }
        for label, procs in zip(gpus["label"], gpus["processes"], strict=True)
        for p in procs
    ]
    return pd.DataFrame(rows, columns=["GPU", "pid", "process", "mem GiB"])


def host_memory(host: HostReading | None) -> tuple[str, str]:
    """("RAM 61% used of 2.0 TiB", "swap 0% of 8.0 GiB") from the agent's /proc reading."""

    def used(total: int | None, left: int | None) -> str:
        if not total or left is None:
            return "N/A"
        return f"{1 - left / total:.0%} used of {total / 2**30:,.1f} GiB"

    h: Mapping[str, Any] = host or {}  # the kernel's fields may be absent (HostInfo)
    return (
        used(h.get("mem_total_bytes"), h.get("mem_available_bytes")),
        used(h.get("swap_total_bytes"), h.get("swap_free_bytes"))
        if h.get("swap_total_bytes")
        else "no swap"
        if "swap_total_bytes" in h
        else "N/A",
    )


def node_details(node: NodeRow, now: float, host: HostReading | None = None, finished: bool = False) -> pd.DataFrame:
    """Every status field of one node, in words (a finished run's: no clock skew, which compared
    the node's clock with a dashboard that was not watching)."""

    def when(ts: float | None) -> str:
        return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({fmt_ago(now - ts)})" if ts else "never"

    skew = node.get("skew_s")
    disk = (
        "; ".join(
            f"{p}: {fmt_bytes(d.get('free_bytes'))} free of {fmt_bytes(d.get('total_bytes'))}"
            for p, d in (node.get("disk") or {}).items()
        )
        or "N/A"
    )
    gpu_src = (node.get("gpu_source") or "none") + (" (simulated)" if node.get("gpu_simulated") else "")
    rows = [
        ("last success", when(node.get("last_ok_unix"))),
        ("last attempt", when(node.get("last_attempt_unix"))),
        ("last error", last_error_line(node, now) if node.get("last_error") else "none"),
        ("failing since", when(node.get("failing_since_unix")) if node.get("failing_since_unix") else "not failing"),
        ("SSH round-trip", f"{node['rtt_ms']:.0f} ms" if node.get("rtt_ms") is not None else "N/A"),
        ("agent time", f"{node['agent_ms']:.1f} ms" if node.get("agent_ms") is not None else "N/A"),
        ("clock skew (node − dashboard)", f"{skew:+.2f} s" if skew is not None else "N/A"),
        ("hostname", node.get("hostname") or "N/A"),
        ("load average", ", ".join(f"{x:.2f}" for x in node.get("loadavg") or []) or "N/A"),
        ("CPUs", str((host.get("cpus") if host else None) or "N/A")),
        *(
            [("host readings", "simulated (demo): not this machine's load or RAM")]
            if host and host.get("simulated")
            else []
        ),
        ("RAM", host_memory(host)[0]),
        ("swap", host_memory(host)[1]),
        ("GPUs found", f"{node.get('gpus_found') or 0} via {gpu_src}"),
        ("GPU telemetry error", node.get("gpu_error") or "none"),
        ("shards matched", str(node.get("shards_matched") or 0)),
        (
            "indexed",
            (
                indexing_progress([node])
                or (1.0, f"{fmt_bytes(node.get('bytes_indexed'))} of {fmt_bytes(node.get('bytes_total'))}")
            )[1],
        ),
        ("completions counted", f"{node.get('completions') or 0:,}"),
        ("malformed lines", f"{node.get('malformed') or 0:,}"),
        ("blank lines (skipped, not malformed)", f"{node.get('blank_lines') or 0:,}"),
        ("unmatched globs", ", ".join(node.get("unmatched_globs") or []) or "none"),
        ("disk", disk),
    ]
    if finished:
        rows = [r for r in rows if not r[0].startswith("clock skew")]
    return pd.DataFrame(rows, columns=["field", "value"])


def replaced_when(ts: float, now: float) -> str:
    """When a shard was found replaced, with its age (a time after `now`, from a stepped
    clock, reads as now: never a time in the future)."""
    ts = min(ts, now)
    return f"{time.strftime('%H:%M:%S', time.localtime(ts))} ({fmt_age(now - ts)} ago)"


def replaced_notice(node: str, shards: pd.DataFrame, now: float) -> str | None:
    """One sentence naming `node`'s shards found rewritten under the same inode within
    REPLACED_NOTICE_S, newest first (their old counts left the totals, the new content was
    counted from byte 0); None when none was. `shards`: load_shards' rows of that node."""
    when = shards["replaced_unix"] if "replaced_unix" in shards else pd.Series(dtype=float)
    recent = shards[when.notna() & (now - when < REPLACED_NOTICE_S)].sort_values("replaced_unix", ascending=False)
    if recent.empty:
        return None
    named = [
        f"{path} at {replaced_when(ts, now)}"
        for path, ts in zip(recent["path"][:REPLACED_NAMED], recent["replaced_unix"][:REPLACED_NAMED], strict=True)
    ]
    more = f" and {len(recent) - REPLACED_NAMED:,} more" if len(recent) > REPLACED_NAMED else ""
    return (
        f"{node}: {len(recent):,} shard(s) replaced (content changed under the same inode), "
        f"old counts dropped and recounted from byte 0: {'; '.join(named)}{more}."
    )
