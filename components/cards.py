"""render_* pieces the screens are made of: big tiles, one-sentence alerts, node cards, samples.

Text that comes from the nodes (errors, completions, prompts) is never rendered as markdown or
HTML: tiles escape everything they interpolate, alerts are markdown-escaped, and sample text
goes through `st.code` / `st.text` only, so a completion holding `<script>` or a
`[link](javascript:...)` shows literally.
"""

from __future__ import annotations

import html
import re
import time
from typing import Any

import pandas as pd
import streamlit as st

from components import loaders
from runhealth.analysis.stats import Summary
from runhealth.config import SECRET_KEYS

STATE_BADGE = {"up": "UP", "stale": "STALE", "down": "DOWN", "pending": "PENDING"}
STATE_COLOUR = {"UP": "#1B5E20", "STALE": "#8A5A00", "DOWN": "#8B1A1A", "PENDING": "#3A3F4B"}
STATE_MD = {"up": ":green[UP]", "stale": ":orange[STALE]", "down": ":red[DOWN]", "pending": ":gray[PENDING]"}
MIN_SAMPLE_N = 20  # below this many samples a share is shown, never coloured as an alarm
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#|~$])")


def md_escape(text: str) -> str:
    """Make remote text inert in st.markdown / st.error (no links, no formatting, no HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def tile(label: str, value: str, sub: str = "", level: str = "ok") -> dict[str, str]:
    return {"label": label, "value": value, "sub": sub, "level": level}


def render_tiles(tiles: list[dict[str, str]]) -> None:
    """A row of big-number tiles (readable across a room); level ok / warn / alert / muted."""
    for col, t in zip(st.columns(len(tiles)), tiles, strict=False):
        col.markdown(
            f'<div class="rh-tile {html.escape(t["level"])}"><div class="rh-label">{html.escape(t["label"])}</div>'
            f'<div class="rh-value">{html.escape(t["value"])}</div><div class="rh-sub">{html.escape(t["sub"])}</div></div>',
            unsafe_allow_html=True,
        )


def render_alerts(alerts: list[tuple[str, str]]) -> None:
    if not alerts:
        st.success("All nodes reporting and writing, truncation below the warning threshold.")
    for level, text in alerts[:8]:
        (st.error if level == "error" else st.warning)(md_escape(text))
    if len(alerts) > 8:
        st.caption(f"… and {len(alerts) - 8} more on the Nodes page.")


def render_problems(problems: list[tuple[str, str]], title: str = "GPUs and hosts") -> None:
    """GPU and host problems named in words (errors, warnings, then information)."""
    if not problems:
        return
    st.markdown(f"**{html.escape(title)}**")
    show = {"error": st.error, "warning": st.warning, "info": st.info}
    for level, text in problems:
        show.get(level, st.info)(md_escape(text))


def truncation_tile(summary: Summary, warn: float, alert: float) -> dict[str, str]:
    if not summary.completions:
        return tile("Truncated", "—", "no completions counted yet", "muted")
    if not summary.ceiling_tokens:
        return tile("Truncated", "none", "no max_tokens ceiling found in the data", "ok")
    frac = summary.at_ceiling_fraction
    lo, hi = summary.at_ceiling_interval
    level = "alert" if frac >= alert else "warn" if frac >= warn else "ok"
    src = "exact" if summary.length_source == "completion_tokens" else "chars/4 estimate"
    return tile("Truncated", f"{frac:.1%}", f"at the {summary.ceiling_tokens:,} ceiling · 95% CI {lo:.1%}–{hi:.1%} · {src} · "
                f"{summary.at_ceiling:,} of {summary.length_count:,}", level)


def node_table(nodes: list[dict[str, Any]], stale_after: float, now: float | None = None,
               per_node: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per node; with `per_node` (load_health's NodeRate map) its tok/s over the last
    minute and when its shards last grew."""
    now = now or time.time()
    rows = []
    for n in nodes:
        state, why = loaders.node_status(n, now, stale_after)
        free = [d.get("free_bytes") for d in (n.get("disk") or {}).values() if d.get("free_bytes") is not None]
        rows.append({"node": n["name"], "status": STATE_BADGE[state], "detail": why,
                     "last seen": loaders.fmt_age(now - n["last_ok_unix"]) if n.get("last_ok_unix") else "never",
                     "GPUs": n.get("gpus_found"), "shards": n.get("shards_matched"),
                     "disk free": loaders.fmt_bytes(min(free)) if free else "N/A",
                     "SSH RTT ms": n.get("rtt_ms")})
        if per_node is not None:
            r = per_node.get(n["name"])
            rows[-1]["tok/s (1 min)"] = loaders.fmt_rate(r.tokens_per_s_1m) if r and r.tokens_per_s_1m is not None else "N/A"
            grown = r.last_growth_unix if r else None
            rows[-1]["last new"] = f"{loaders.fmt_age(now - grown)} ago" if grown else "N/A"
    return pd.DataFrame(rows)


def render_node_table(nodes: list[dict[str, Any]], stale_after: float, compact: bool = False,
                      per_node: dict[str, Any] | None = None) -> None:
    if not nodes:
        st.info("No nodes configured.")
        return
    table = node_table(nodes, stale_after, per_node=per_node)
    if compact:
        extra = ["tok/s (1 min)", "last new"] if per_node is not None else ["GPUs"]
        table = table[["node", "status", "last seen", *extra, "disk free", "SSH RTT ms"]]
    styled = table.style.map(lambda v: f"background-color: {STATE_COLOUR.get(v, '')}; color: white; font-weight: bold"
                             if v in STATE_COLOUR else "", subset=["status"]).format(precision=1, subset=["SSH RTT ms"])
    st.dataframe(styled, hide_index=True, width="stretch")


def indexing_progress(nodes: list[dict[str, Any]]) -> tuple[float, str] | None:
    """(share done, sentence) while a backlog is being indexed: bytes done of total, speed, time left."""
    done = sum(n.get("bytes_indexed") or 0 for n in nodes)
    total = sum(n.get("bytes_total") or 0 for n in nodes)
    pending = sum(n.get("pending_bytes") or 0 for n in nodes)
    total = max(total, done + pending)
    if not (pending > 0 or done < total):
        return None
    busy = [n for n in nodes if n.get("pending_bytes")]
    rate = sum(n.get("index_bytes_per_s") or 0 for n in busy)
    lefts = [n["pending_bytes"] / n["index_bytes_per_s"] for n in busy if n.get("index_bytes_per_s")]
    speed = f" · {loaders.fmt_bytes(rate)}/s" if rate else ""
    eta = f" · about {loaders.fmt_age(max(lefts))} left" if lefts and len(lefts) == len(busy) else ""
    return (done / total if total else 0.0,
            f"Indexing the backlog: {loaders.fmt_bytes(done)} of {loaders.fmt_bytes(total)}{speed}{eta}"
            " — numbers will grow")


def render_indexing(nodes: list[dict[str, Any]]) -> None:
    """A progress bar while a backlog (first scan, rescan, a burst of output) is being indexed."""
    progress = indexing_progress(nodes)
    if progress is not None:
        st.progress(*progress)


def render_store_incident(store: Any) -> None:
    """Say so when the history store file was deleted, truncated or replaced under this dashboard."""
    incident = store.check_file()  # page reads are cached: look at the file itself
    if incident is not None and time.time() - incident[1] < 24 * 3600:
        st.warning(md_escape(incident[0]))


def render_sample(sample: dict[str, Any]) -> None:
    """One sample: where it came from, its prompt head and the END of its text, all literal."""
    est = " (chars/4 estimate)" if sample.get("estimated") else ""
    st.text(f"{sample.get('node')} · {sample.get('path')} line {sample.get('line_no')} · "
            f"{sample.get('tokens')} tokens{est} · finish_reason={sample.get('finish_reason')} · "
            f"{sample.get('text_chars')} chars")
    st.caption("Prompt (start)")
    st.code(sample.get("prompt_head") or "(no prompt in this line)", language=None, wrap_lines=True)
    st.caption("Completion — last characters (where a truncated one was cut)")
    st.code(sample.get("text_tail") or "(empty completion)", language=None, wrap_lines=True, height=320)


def render_node_card(node: dict[str, Any], stale_after: float, now: float) -> None:
    state, why = loaders.node_status(node, now, stale_after)
    with st.container(border=True):
        st.markdown(f"#### {STATE_MD[state]} {md_escape(node['name'])}")
        st.text(why)
        if node.get("last_error"):
            st.text(last_error_line(node, now))
        for glob in node.get("unmatched_globs") or []:
            st.text(f"No shard matched {glob} on {node['name']}")
        if node.get("gpu_error"):
            st.text(f"GPU telemetry error: {node['gpu_error']}")
        for url, err in (node.get("metrics_errors") or {}).items():
            st.text(f"Server metrics {url}: {err}")


def last_error_line(node: dict[str, Any], now: float) -> str:
    """The last error with its age, and whether a successful poll came after it (then it is history)."""
    err_at, ok_at = node.get("last_error_unix"), node.get("last_ok_unix")
    when = f"{loaders.fmt_age(now - err_at)} ago" if err_at else "time unknown"
    resolved = err_at is not None and ok_at is not None and ok_at > err_at
    return (f"Last error ({when}; resolved — polled fine {loaders.fmt_age(now - ok_at)} ago): " if resolved
            else f"Last error ({when}): ") + str(node["last_error"])


def overview_tiles(summary: Summary, thr: dict, nodes: list[dict], gpus: pd.DataFrame, target: int | None,
                   last: float | None, cfg: Any, now: float, health: dict | None = None) -> list[dict[str, str]]:
    """The six standup tiles: done, throughput (last minute, 15-min average beside it), ETA (from
    the 15-min average, stated), truncation, nodes, data age."""
    from runhealth.analysis import rates

    done = summary.completions
    health = health or {}
    tps, tps_15 = health.get("tokens_per_s_1m"), health.get("tokens_per_s_15m")
    cps = health.get("completions_per_s_15m")
    share = rates.progress(done, target) if target else None
    done_sub = f"of {target:,} target ({share:.1%})" if share is not None else "no target_completions set"
    server = thr.get("server_tokens_per_s")
    n_gpus = len(gpus) or sum(n.get("gpus_found") or 0 for n in nodes)
    tpj = rates.tokens_per_joule(tps, float(gpus["power_w"].sum()) if len(gpus) else None)
    tps_sub = (f"15-min avg {loaders.fmt_rate(tps_15)}" if tps_15 is not None else "15-min avg —") + (
        f" · {loaders.fmt_rate(tps / n_gpus)} per GPU" if tps and n_gpus else "") + (
        f" · {tpj:.1f} tok/J" if tpj else "") + (
        f" · server says {loaders.fmt_rate(server)}" if server is not None else "")
    eta = rates.eta_seconds(done, target, cps) if target else None
    states = [loaders.node_status(n, now, cfg.stale_after)[0] for n in nodes]
    up, stale, down = states.count("up"), states.count("stale"), states.count("down")
    free = [d.get("free_bytes") for n in nodes for d in (n.get("disk") or {}).values() if d.get("free_bytes")]
    age = now - last if last is not None else None
    return [
        tile("Completions", f"{done:,}", done_sub, "ok" if done else "muted"),
        tile("Tokens / s · last 1 min", loaders.fmt_rate(tps) if tps is not None else "—", tps_sub if tps is not None
             else "waiting for two polls", "ok" if tps else "warn" if tps == 0 else "muted"),
        tile("ETA", "done" if eta == 0 else loaders.fmt_age(eta) if eta is not None else "—",
             "target reached" if eta == 0 else "needs target_completions in the config" if not target
             else f"at the 15-min average, {cps:,.1f} completions/s" if cps else "needs a rate",
             "muted" if eta is None else "ok"),
        truncation_tile(summary, cfg.truncation_warn_fraction, cfg.truncation_alert_fraction),
        tile("Nodes up", f"{up} / {len(nodes)}", f"{stale} stale · {down} down"
             + (f" · disk free ≥ {loaders.fmt_bytes(min(free))}" if free else ""),
             "alert" if down else "warn" if stale or not up else "ok"),
        tile("Data age", loaders.fmt_age(age) if age is not None else "—",
             "waiting for first poll" if age is None else f"stale after {loaders.fmt_age(cfg.stale_after)}",
             "muted" if age is None else "alert" if age > cfg.stale_after else "ok"),
    ]


def headline(summary: Summary, health: dict, nodes: list[dict], cfg: Any, now: float,
             last: float | None) -> dict[str, Any]:
    """The standup figures as one flat record (the Overview's download), rounded for people."""
    from runhealth.analysis import rates

    lo, hi = summary.at_ceiling_interval
    cps = health.get("completions_per_s_15m")
    eta = rates.eta_seconds(summary.completions, cfg.target_completions, cps) if cfg.target_completions else None
    states = [loaders.node_status(n, now, cfg.stale_after)[0] for n in nodes]

    def r(x, nd=1):
        return None if x is None else round(float(x), nd)

    return {
        "run": cfg.name, "numbers_as_of": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last)) if last else None,
        "completions": summary.completions, "target_completions": cfg.target_completions,
        "ceiling_tokens": summary.ceiling_tokens,
        "truncated_pct": r(100 * summary.at_ceiling_fraction, 2) if summary.completions else None,
        "truncated_pct_95ci_low": r(100 * lo, 2) if lo is not None and summary.completions else None,
        "truncated_pct_95ci_high": r(100 * hi, 2) if hi is not None and summary.completions else None,
        "truncated_count": summary.at_ceiling, "truncated_of": summary.length_count,
        "length_stops_below_ceiling": summary.length_below_ceiling,
        "tokens_per_s_last_1_min": r(health.get("tokens_per_s_1m"), 0),
        "tokens_per_s_15_min_avg": r(health.get("tokens_per_s_15m"), 0),
        "eta_hours_at_15_min_avg": r(eta / 3600, 2) if eta is not None else None,
        "nodes_up": states.count("up"), "nodes_stale": states.count("stale"), "nodes_down": states.count("down"),
        "nodes": len(nodes),
    }


def why_empty(nodes: list[dict[str, Any]], what: str = "completions") -> str:
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


def render_nothing_yet(nodes: list[dict[str, Any]], what: str = "completions") -> None:
    st.info(md_escape(why_empty(nodes, what)))


def finish_reason_table(summary: Summary) -> pd.DataFrame:
    """Finish reasons, with "length" split into at-the-ceiling and below-it (context window)."""
    reasons = dict(summary.finish_reasons)
    length = reasons.pop("length", 0)
    rows = [(r, n) for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    ceiling = summary.ceiling_tokens
    if length:
        rows.append((f"length at the ceiling ({ceiling:,}) = truncated" if ceiling else "length at the ceiling = truncated",
                     summary.at_ceiling))
        rows.append(("length — below the ceiling (context window)", summary.length_below_ceiling))
        rest = length - summary.at_ceiling - summary.length_below_ceiling
        if rest:
            rows.append(("length — estimated lengths (not split)", rest))
    total = summary.completions or 1
    return pd.DataFrame([{"finish reason": r, "completions": n, "share": f"{n / total:.2%}"} for r, n in rows])


EXPORT_TAIL_CHARS = 1000  # of each completion's end in the Samples CSV (where truncated ones were cut)


def samples_export(samples: list[dict[str, Any]]) -> pd.DataFrame:
    """The Samples CSV: where each sample came from AND what it says (prompt head, text head, the
    last EXPORT_TAIL_CHARS characters). A CSV is data, never rendered: no escaping needed here."""
    return pd.DataFrame([{
        "node": s.get("node"), "path": s.get("path"), "line": s.get("line_no"), "tokens": s.get("tokens"),
        "estimated": bool(s.get("estimated")), "finish reason": s.get("finish_reason"), "loop": bool(s.get("is_loop")),
        "text chars": s.get("text_chars"), "prompt head": s.get("prompt_head"), "text head": s.get("text_head"),
        "text tail": (s.get("text_tail") or "")[-EXPORT_TAIL_CHARS:]} for s in samples],
        columns=["node", "path", "line", "tokens", "estimated", "finish reason", "loop", "text chars", "prompt head",
                 "text head", "text tail"])


def gpu_table(gpus: pd.DataFrame) -> pd.DataFrame:
    """The GPUs now, with idle (<10% util) and throttled ones flagged first."""
    flags = []
    for _, g in gpus.iterrows():
        notes = []
        if isinstance(g.get("error"), str) and g["error"]:  # pandas makes a missing error NaN
            notes.append(f"error: {g['error']}")
        if pd.notna(g["util_pct"]) and g["util_pct"] < 10:
            notes.append("idle")
        if g["throttle_reasons"]:
            notes.append("throttled: " + ", ".join(g["throttle_reasons"]))
        flags.append("⚠ " + "; ".join(notes) if notes else "ok")
    out = pd.DataFrame({
        "GPU": gpus["label"], "model": gpus["name"], "state": flags, "util %": gpus["util_pct"],
        "power W": gpus["power_w"], "limit W": gpus["power_limit_w"], "mem GiB": gpus["mem_used_mib"] / 1024,
        "of GiB": gpus["mem_total_mib"] / 1024, "temp °C": gpus["temp_c"], "SM MHz": gpus["sm_clock_mhz"],
        "processes": [len(p) for p in gpus["processes"]],
    })
    return out.sort_values("state", key=lambda s: s == "ok", kind="stable")


def gpu_processes(gpus: pd.DataFrame) -> pd.DataFrame:
    rows = [{"GPU": g["label"], "pid": p.get("pid"), "process": p.get("name"), "mem GiB": (p.get("mem_used_mib") or 0) / 1024}
            for _, g in gpus.iterrows() for p in g["processes"]]
    return pd.DataFrame(rows, columns=["GPU", "pid", "process", "mem GiB"])


_SECRET_WORDS = (*sorted(SECRET_KEYS), "secret", "token")  # substrings of keys never shown


def safe_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A node's effective config for display: secret values never shown, only whether they are set."""
    out = {}
    for key, value in (config or {}).items():
        if any(w in key.lower() for w in _SECRET_WORDS):
            if key.endswith("_set"):
                out[key.removesuffix("_set")] = "set" if value else "not set"
            continue
        out[key] = value
    return out


def host_memory(host: dict[str, Any] | None) -> tuple[str, str]:
    """("RAM 61% used of 2.0 TiB", "swap 0% of 8.0 GiB") from the agent's /proc reading."""
    def used(total, left):
        if not total or left is None:
            return "N/A"
        return f"{1 - left / total:.0%} used of {total / 2**30:,.1f} GiB"

    host = host or {}
    return (used(host.get("mem_total_bytes"), host.get("mem_available_bytes")),
            used(host.get("swap_total_bytes"), host.get("swap_free_bytes")) if host.get("swap_total_bytes")
            else "no swap" if "swap_total_bytes" in host else "N/A")


def node_details(node: dict[str, Any], now: float, host: dict[str, Any] | None = None) -> pd.DataFrame:
    """Every status field of one node, in words."""
    def when(ts):
        return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({loaders.fmt_age(now - ts)} ago)" if ts else "never"

    skew = node.get("skew_s")
    disk = "; ".join(f"{p}: {loaders.fmt_bytes(d.get('free_bytes'))} free of {loaders.fmt_bytes(d.get('total_bytes'))}"
                     for p, d in (node.get("disk") or {}).items()) or "N/A"
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
        ("CPUs", str((host or {}).get("cpus") or "N/A")),
        ("RAM", host_memory(host)[0]),
        ("swap", host_memory(host)[1]),
        ("GPUs found", f"{node.get('gpus_found') or 0} via {gpu_src}"),
        ("GPU telemetry error", node.get("gpu_error") or "none"),
        ("shards matched", str(node.get("shards_matched") or 0)),
        ("indexed", (indexing_progress([node]) or (1.0, f"{loaders.fmt_bytes(node.get('bytes_indexed'))} of "
                                                         f"{loaders.fmt_bytes(node.get('bytes_total'))}"))[1]),
        ("lines counted", f"{node.get('lines') or 0:,}"),
        ("malformed lines", f"{node.get('malformed') or 0:,}"),
        ("blank lines (skipped, not malformed)", f"{node.get('blank_lines') or 0:,}"),
        ("unmatched globs", ", ".join(node.get("unmatched_globs") or []) or "none"),
        ("disk", disk),
    ]
    return pd.DataFrame(rows, columns=["field", "value"])
