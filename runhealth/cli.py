"""Command-line interface: `runhealth dashboard|collect|scan|poll|compare` (also `python -m runhealth`).

`dashboard` serves the Streamlit app; `collect` runs the collector alone, headless, for a
service next to read-only dashboards; `scan` answers "what's the max completion length, and
are we maxing out?" for local shard files with no dashboard at all; `poll` runs one full
collection over every configured node; `compare` puts two runs' local shards side by side
(A, then `--`, then B) and checks A's what-if forecast against B. `scan`, `poll` and `compare` print a human summary, or with
`--json` the objects the tests and benchmarks rely on. Each subcommand is one `add_*` parser
function and one `cmd_*` function.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import sqlite3
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from runhealth import __version__, ingest
from runhealth.alerting import metricsauth
from runhealth.alerting.metricsauth import MetricsAccess
from runhealth.analysis import failed as failed_reqs
from runhealth.analysis import fieldfigures, runcompare, stats, unknowns, whatif
from runhealth.collect import runprocs, service
from runhealth.collect.collector import Collector
from runhealth.errors import ConfigError, RunhealthError
from runhealth.node import agent
from runhealth.node.wire import count_rows
from runhealth.screens import fieldmodel
from runhealth.screens.words import fmt_count, fmt_share, fmt_tokens
from runhealth.serve import exposure, launch, supervise
from runhealth.settings import runs
from runhealth.settings.config import RunConfig, find_config_path
from runhealth.store import Store, fileproblems
from runhealth.textsafe import escape

if TYPE_CHECKING:  # what add_subparsers returns (argparse names it privately): each command adds its parser
    from argparse import _SubParsersAction

    Subparsers: TypeAlias = _SubParsersAction[argparse.ArgumentParser]

NO_CONFIG = "error: no config: pass --config, set RUNHEALTH_CONFIG, or create runhealth.toml"
CONFIG_HELP = "config file (default: $RUNHEALTH_CONFIG, else ./runhealth.toml)"


def scan_paths(
    patterns: list[str],
    totals: dict[str, int] | None = None,
    workers: int | None = None,
    field_paths: dict[str, str | None] | None = None,
    field_totals: fieldfigures.FieldTotals | None = None,
    failed: dict[str, int] | None = None,
) -> tuple[stats.LengthHist, int, list[str]]:
    """Count every complete line of the local shards matching `patterns`.

    Returns the length histogram, the number of malformed lines, and the patterns that
    matched nothing. Uses the node agent's own scanner, in-process, with up to `workers`
    worker processes for a backlog (None: a quarter of the cores, 1..8; 1: one process).
    `totals`, when given, receives "blank_lines" (whitespace-only lines: skipped, not malformed)
    and "failed:<reason>" per reason of the failed requests (lines that are no completion, #39).
    `field_totals`, when given, receives the per-line fields (prompt IDs, groups, ...), found
    with `field_paths` (prompt_id_path, prompt_tokens_path, group_path; None: detected).
    `failed`, when given, receives the failed requests by reason (#39; not in the histogram).
    """
    state: dict[str, dict[str, int]] = {}
    hashes: dict[int, int] = {}
    hist, malformed, unmatched = stats.LengthHist(), 0, None
    while True:
        reply = agent.handle(
            {
                "op": "poll",
                "gpu": "off",
                "metrics_urls": [],
                "shards": {
                    "globs": patterns,
                    "state": state,
                    "budget_bytes": 1 << 30,
                    "scan_workers": workers,
                    **(field_paths or {}),
                },
            }
        )
        if not reply.get("ok"):
            raise RunhealthError(reply.get("error") or "scan failed")
        shards = reply["shards"]
        unmatched = shards.get("unmatched_globs") or []
        for path, entry in shards["files"].items():
            if entry.get("error"):
                print(f"warning: {escape(path)}: {escape(entry['error'])}", file=sys.stderr)
            for row in count_rows(entry.get("counts") or []):
                hist.add(row.tokens, row.finish_reason, row.estimated, row.count)
            malformed += int(entry.get("malformed") or 0)
            if failed is not None:
                for reason, n in ingest.failed_part(path, entry)[0]:
                    failed[reason] = failed.get(reason, 0) + n
            if field_totals is not None:
                update = ingest.shard_update(path, entry)
                field_totals.completions += update.completions
                if update.fields is not None:
                    fieldfigures.add_update(field_totals, update.fields, hashes)
            if totals is not None:
                totals["blank_lines"] = totals.get("blank_lines", 0) + int(entry.get("blank_lines") or 0)
                for reason, n in entry.get("failed") or ():
                    totals["failed:" + reason] = totals.get("failed:" + reason, 0) + int(n)
            state[path] = {"inode": entry.get("inode"), "offset": entry.get("offset", 0)}
        if not shards.get("pending_bytes"):
            if field_totals is not None:
                field_totals.distinct_prompts, field_totals.answered_more_than_once = fieldfigures.hash_totals(hashes)
            return hist, malformed, unmatched


def cmd_scan(args: argparse.Namespace) -> int:
    field_args = {
        "prompt_id_path": args.prompt_id_path,
        "prompt_tokens_path": args.prompt_tokens_path,
        "group_path": args.group_path,
    }
    extra = (field_args, args.expected_prompts, args.max_model_len)
    hist, summary, report, unmatched = scan_summary(args.paths, args.ceiling, args.workers, extra)
    if args.whatif:
        if summary.ceiling_tokens is None:
            print("error: --whatif needs a ceiling (none given and none detected)", file=sys.stderr)
            return 2
        report["whatif"] = whatif.for_run(hist, summary.ceiling_tokens, args.whatif, None).to_json()
    print(json.dumps(report, indent=2) if args.json else format_summary(report))
    return 0 if summary.completions or not unmatched else 1


def scan_summary(
    patterns: list[str], ceiling: int | None, workers: int | None, fields: tuple | None = None
) -> tuple[stats.LengthHist, stats.Summary, dict[str, Any], list[str]]:
    """The histogram, summary and `scan --json` object (the summary's JSON plus ``blank_lines``
    and, with `fields` = (field paths, expected prompts, max_model_len), the per-line field
    figures under ``fields``) for `patterns`, and the globs that matched nothing (each warned
    about on stderr)."""
    totals: dict[str, int] = {}
    failed: dict[str, int] = {}
    field_totals = fieldfigures.FieldTotals() if fields is not None else None
    hist, malformed, unmatched = scan_paths(
        patterns, totals, workers, fields[0] if fields else None, field_totals, failed
    )
    for pattern in unmatched:
        print(f"warning: nothing matched {escape(pattern)}", file=sys.stderr)
    summary = stats.summarize(hist, ceiling=ceiling, unparseable=malformed)
    report = summary.to_json()
    report["blank_lines"] = totals.get("blank_lines", 0)
    report.update(request_figures(summary, [{"node": "", "reason": r, "count": n} for r, n in failed.items()]))
    if fields is not None and field_totals is not None:
        rows = [{"tokens": t, "finish_reason": fr, "estimated": est, "count": n} for t, fr, est, n in hist.rows()]
        report["fields"] = fieldfigures.figures(field_totals, rows, summary.ceiling_tokens, fields[1], fields[2])
    return hist, summary, report, unmatched


def cmd_compare(args: argparse.Namespace) -> int:
    if not args.paths or not args.b_paths:
        print("error: usage: runhealth compare [options] A_GLOBS... -- B_GLOBS...", file=sys.stderr)
        return 2
    # The fields as `scan` finds them by default (detected paths), so "a" and "b" are its --json.
    fields = ({"prompt_id_path": None, "prompt_tokens_path": None, "group_path": None}, None, None)
    hist_a, sum_a, json_a, _ = scan_summary(args.paths, args.ceiling_a, args.workers, fields)
    hist_b, sum_b, json_b, _ = scan_summary(args.b_paths, args.ceiling_b, args.workers, fields)
    diffs = runcompare.differences(hist_a, sum_a, hist_b, sum_b)
    forecast, note = runcompare.forecast_check(hist_a, sum_a, hist_b, sum_b)
    report = {
        "a": json_a,
        "b": json_b,
        "forecast": forecast,
        "forecast_note": note,
        "differences": diffs,
        "summary": runcompare.headline(sum_a, sum_b, diffs),
    }
    print(json.dumps(report, indent=2) if args.json else format_compare(report))
    return 0 if sum_a.completions and sum_b.completions else 1


def format_compare(r: dict[str, Any]) -> str:
    """Both summaries, the differences with their intervals, and the forecast check, in words."""
    out = [
        "B vs A: " + escape(r["summary"]),
        "== A",
        format_summary(r["a"]),
        "== B",
        format_summary(r["b"]),
        "== B - A (95% intervals)",
    ]
    d = r["differences"]
    share = d["truncated_fraction"]
    out.append(
        f"still cut at each run's ceiling: {100 * share['difference']:+.1f} points"
        f" ({100 * share['interval'][0]:+.1f} to {100 * share['interval'][1]:+.1f}, Newcombe)"
    )
    if d["mean_tokens"]:
        m = d["mean_tokens"]
        rel = f", {100 * m['relative']:+.0f}%" if m["relative"] is not None else ""
        out.append(
            f"mean tokens per completion: {m['difference']:+.0f} ({m['interval'][0]:+.0f} to"
            f" {m['interval'][1]:+.0f}{rel})"
        )
    for name in ("p50", "p90", "p99"):
        if d[name]:
            p = d[name]
            cut = (
                f"; {' and '.join(x.upper() for x in p['at_ceiling'])} at the ceiling: a lower bound"
                if p["at_ceiling"]
                else ""
            )
            diff, interval = runcompare.percentile_texts(p)
            out.append(f"{name}: {fmt_count(p['a'])} -> {fmt_count(p['b'])} ({diff}; {interval}{cut})")
    out.extend(format_forecast(r["forecast"]))
    out.append(escape(r["forecast_note"]))
    return "\n".join(out)


def format_forecast(f: dict[str, Any] | None) -> list[str]:
    """The forecast check in words (nothing when there is none: the note says why)."""
    if f is None:
        return []
    out = []
    verdict = "inside" if f["inside"] else "OUTSIDE"
    out.append(
        f"forecast check at {f['limit']:,}: A's what-if predicted {100 * f['predicted_fraction']:.1f}%"
        f" still cut (95% {100 * f['interval'][0]:.1f}-{100 * f['interval'][1]:.1f}%{f.get('interval_note', '')},"
        f" {escape(f['model'])});"
        f" B measured {100 * f['measured_fraction']:.1f}% ({100 * f['measured_interval'][0]:.1f}-"
        f"{100 * f['measured_interval'][1]:.1f}%): {verdict} the predicted interval"
    )
    if f["predicted_extra_tokens"] is not None and f["measured_extra_tokens"] is not None:
        lo, hi = f["predicted_extra_tokens_interval"]
        out.append(
            f"  extra tokens per completion: predicted {f['predicted_extra_tokens']:+.0f} ({lo:.0f}-{hi:.0f}),"
            f" measured {f['measured_extra_tokens']:+.0f} (B's mean minus A's)"
        )
    return out


def request_figures(summary: stats.Summary, failed_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What `scan --json` and `poll --json` add to a summary (#39): the failed requests beside
    its completions (analysis/failed.py) and, when the share at the ceiling is unknown
    (analysis/unknowns.py), why: `at_ceiling_fraction` is then null, never a calm 0."""
    out = failed_reqs.failed_requests(failed_rows, summary.completions).to_json()
    unknown = unknowns.unknown_of(summary)
    out["truncated_unknown"] = unknown.to_json() if unknown is not None else None
    if unknown is not None:
        out["at_ceiling_fraction"] = None
        out["at_ceiling_interval"] = None
    return out


def cmd_poll(args: argparse.Namespace) -> int:
    path = find_config_path(args.config)
    if path is None:
        print(NO_CONFIG, file=sys.stderr)
        return 2
    live = [e.config for e in runs.load_runs(path) if not e.finished]  # a finished run is not polled
    reports = [poll_run(config) for config in live]
    if len(reports) == 1:  # one run: the report as it always was
        print(json.dumps(reports[0], indent=2) if args.json else format_poll(reports[0]))
    elif args.json:
        print(json.dumps({"runs": [{"name": c.name, **r} for c, r in zip(live, reports, strict=True)]}, indent=2))
    else:
        print("\n".join(f"#### run {escape(c.name)}\n{format_poll(r)}" for c, r in zip(live, reports, strict=True)))
    return 0 if all(n["ok"] for r in reports for n in r["nodes"]) else 1


def poll_run(config: RunConfig) -> dict[str, Any]:
    """One run's nodes polled once into a throwaway store: the `poll --json` object for it."""
    with tempfile.TemporaryDirectory(prefix="runhealth-poll-") as tmp:
        store = Store(f"{tmp}/poll.sqlite3")

        def progress(node: str, pending: int) -> None:
            if pending:
                print(f"{node}: {pending / 1e9:.2f} GB left to index", file=sys.stderr)

        with Collector(config, store) as collector:
            results = collector.poll_once(progress)
        report = poll_report(config, store, results)
        for node in store.nodes():  # as scan does: a glob that matched nothing is worth a line
            for pattern in node.get("unmatched_globs") or []:
                print(f"warning: nothing matched {escape(pattern)} on {escape(node['name'])}", file=sys.stderr)
        store.close()
    return report


def poll_report(config: RunConfig, store: Store, results: dict[str, Any]) -> dict[str, Any]:
    """The `poll --json` object: every node (failed ones included) and the merged lengths."""
    by_node: dict[str, stats.LengthHist] = {n.name: stats.LengthHist() for n in config.nodes}
    for row in store.length_counts(by="node"):
        by_node[row["node"]].add(row["tokens"], row["finish_reason"], row["estimated"], row["count"])
    malformed = {r["name"]: r["malformed"] for r in store.nodes()}
    nodes, merged = [], stats.LengthHist()
    failed_rows = [dict(r) for r in store.failed_rows()]
    for node in config.nodes:
        result = results.get(node.name)
        ok = isinstance(result, dict)
        merged = merged.merge(by_node[node.name])
        node_summary = stats.summarize(by_node[node.name], config.max_output_tokens, malformed.get(node.name, 0))
        mine = [r for r in failed_rows if r["node"] == node.name]
        nodes.append(
            {
                "name": node.name,
                "ok": ok,
                "error": None if ok else str(result),
                "gpus": (result.get("gpus") or {}).get("devices", []) if isinstance(result, dict) else [],
                "lengths": {**node_summary.to_json(), **request_figures(node_summary, mine)},
            }
        )
    total_malformed = sum(malformed.values())
    lengths = stats.summarize(merged, config.max_output_tokens, total_malformed)
    for n in nodes:
        ceiling = n["lengths"]["ceiling"]
        n["lengths"]["fields"] = fieldmodel.field_figures(store, config, ceiling, n["name"])
    report = {**lengths.to_json(), **request_figures(lengths, failed_rows)}
    report["fields"] = fieldmodel.field_figures(store, config, lengths.ceiling_tokens)
    return {"nodes": nodes, "lengths": report}


def format_summary(s: dict[str, Any]) -> str:
    """A `scan --json` object (`Summary.to_json()` and what the CLI adds) in words."""
    t = s["tokens"]
    blank = f", blank lines skipped: {fmt_count(s['blank_lines'])}" if s.get("blank_lines") else ""
    # "unparseable", the JSON's own key: the text and `--json` name the same count the same way.
    lines = [f"completions: {fmt_count(s['completions'])}  (unparseable lines: {fmt_count(s['unparseable'])}{blank})"]
    if s["completions"]:
        cut = s["ceiling"]  # a percentile at the ceiling is a lower bound: "≥ 4,096", as on the pages
        lines.append(
            f"tokens: mean {fmt_count(t['mean'])}  "
            + "  ".join(f"{k} {fmt_tokens(t[k], cut)}" for k in ("p50", "p90", "p99", "max"))
        )
    lines.append("finish reasons: " + ", ".join(f"{escape(k)} {fmt_count(v)}" for k, v in s["finish_reasons"].items()))
    if s.get("truncated_unknown"):  # never a calm 0% (#39): why the share is unknown
        lines.append(f"at the ceiling: unknown. {s['truncated_unknown']['why']}")
    elif s["ceiling"] is not None:
        lines.append(
            f"ceiling: {fmt_count(s['ceiling'])} ({s['ceiling_source']}); at the ceiling: {fmt_count(s['at_ceiling'])}"
            f" ({fmt_share(s['at_ceiling_fraction'])}), length stops below it: {fmt_count(s['length_below_ceiling'])}"
        )
    else:
        lines.append("ceiling: none detected (no pile-up of finish_reason=length)")
    if s.get("failed_line") and s.get("failed_requests"):
        lines.append(escape(s["failed_line"]))
    if s.get("fields"):
        lines.extend(format_fields(s["fields"]))
    if s.get("whatif"):
        lines.extend(format_whatif(s["whatif"]))
    return "\n".join(lines)


def format_fields(f: dict[str, Any]) -> list[str]:
    """The per-line field figures in words; a figure whose field is missing says which."""
    out = [escape(f["prompts"]["line"])]
    u = f["unanswered"]
    out.append(
        escape(u["message"])
        if u["never_answered"] is None
        else f"cut at the ceiling: {fmt_count(u['never_answered'])} never answered (still reasoning),"
        f" {fmt_count(u['cut_mid_answer'])} cut mid-answer"
    )
    m = f["mislabelled"]
    if m["count"] is not None:
        by = ", ".join(f"{escape(k)} {fmt_count(v)}" for k, v in m["by_reason"].items())
        out.append(
            f"at or above the ceiling but not labelled length: {fmt_count(m['count'])}" + (f" ({by})" if by else "")
        )
    c = f["context_stops"]
    out.append(
        escape(c["message"])
        if c["count"] is None
        else f"length stops below the ceiling that filled the context window ({fmt_count(c['max_model_len'])}):"
        f" {fmt_count(c['count'])}"
    )
    g = f["groups"]
    if g["rows"]:
        top = "; ".join(
            f"{escape(r['group'])} {fmt_share(r['share'])} of {fmt_count(r['completions'])}" for r in g["rows"][:5]
        )
        what = "cut at the ceiling" if g.get("counts") == "cut" else "stopped by length (not split at the ceiling)"
        out.append(f"{what} by {escape(g['field'] or 'group')}: {top}")
    else:
        out.append(escape(g["message"]))
    return out


def format_whatif(w: dict[str, Any]) -> list[str]:
    """The what-if in words: estimate and interval, the headline model, the back-test check."""
    if w["truncated_fraction"] is None:
        return [
            f"what-if limit {fmt_count(w['limit'])}: between {100 * w['interval'][0]:.1f}% and {100 * w['interval'][1]:.1f}%"
            f" still truncated (hard bounds only) — {w['note']}"
        ]
    out = [
        f"what-if limit {fmt_count(w['limit'])}: {100 * w['truncated_fraction']:.1f}% still truncated"
        f" (95% {100 * w['interval'][0]:.1f}-{100 * w['interval'][1]:.1f}%{_loop_note(w)}, {w['model']});"
        f" {w['extra_tokens_per_completion']:+.0f} tokens per completion"
        f" ({w['extra_tokens_interval'][0]:.0f}-{w['extra_tokens_interval'][1]:.0f}) — extrapolation"
    ]
    checks = [c for c in ((w.get("backtest") or {}).get("checks") or []) if c.get("predicted") is not None]
    if checks:
        c = checks[0]
        out.append(
            f"  checked on this run: cut at {fmt_count(c['cut'])}, it would have said {fmt_share(c['predicted'])}"
            f" above {fmt_count(c['limit'])}; the truth is {fmt_share(c['truth'])}"
        )
    elif w.get("model_reason"):
        out.append(f"  {w['model_reason']}")
    return out


def _loop_note(w: dict[str, Any]) -> str:
    """whatif.loop_note on the JSON object (beside the interval, as on the Output lengths page)."""
    return whatif.loop_note(whatif.WhatIf.from_json(w))


def format_poll(report: dict[str, Any]) -> str:
    out = []
    for n in report["nodes"]:
        status = "ok" if n["ok"] else f"FAILED: {escape(n['error'])}"
        out.append(f"== {escape(n['name'])}: {status}; {len(n['gpus'])} GPUs")
        out.append("   " + format_summary(n["lengths"]).replace("\n", "\n   "))
    out.append("== all nodes")
    out.append(format_summary(report["lengths"]))
    return "\n".join(out)


def cmd_dashboard(args: argparse.Namespace) -> int:
    path = find_config_path(args.config)
    if path is not None and not path.expanduser().is_file():
        print(f"error: {path}: config file not found", file=sys.stderr)
        return 2
    port, address = launch.listen_on(args.port, args.address)
    refused = (
        None if args.public_without_auth else exposure.refusal(address, _allow_lists(path), exposure.auth_configured())
    )
    refused = refused or (
        None if args.no_collect else _metrics_refusal(path, None, None, MetricsAccess(public=args.public_without_auth))
    )
    if refused is not None:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    if args.public_without_auth and not exposure.is_loopback(address):
        print(f"WARNING: {exposure.open_banner(address, port)}", file=sys.stderr, flush=True)
    problem = supervise.port_problem(port, address)
    if problem is not None:  # before anything starts or any URL is printed
        print(f"error: {problem}", file=sys.stderr)
        return 2
    viewer = launch.dashboard_command(path, port, address)
    collector = None if args.no_collect else launch.collector_command(path, public=args.public_without_auth)
    where = f"config {path.expanduser().absolute()}" if path else "no config found: the demo run"
    hows = {
        "collecting": "collector running",
        "viewer": "viewer of the collector that already runs on this store; collects once it stops",
        "waiting": "collector waiting for a config that loads",
    }

    def announce(state: str) -> None:
        how = "viewer only (--no-collect)" if args.no_collect else hows.get(state, "collector not started")
        print(f"runhealth dashboard on http://{address}:{port} ({where}; {how})", file=sys.stderr, flush=True)

    return supervise.run_dashboard(viewer, collector, announce)


def _allow_lists(path: Path | None) -> list[list[str]] | None:
    """Each run's allowed_users (the demo: one open run), the retired runs found beside the stores
    included (one whose store records no rule is shown to no one: left out); None when the config
    does not load."""
    if path is None:
        return [[]]
    try:
        entries = runs.load_runs(path)
    except RunhealthError:
        return None
    return [e.config.allowed_users for e in entries + runs.discover_finished(entries) if e.access_known]


def _metrics_refusal(path: Path | None, port: int | None, address: str | None, access: MetricsAccess) -> str | None:
    """Why the /metrics a collector would serve must not start (runhealth/alerting/metricsauth.py):
    a token or TLS file that does not read, or an anonymous non-loopback bind without
    --public-without-auth. The command line's values win over the first live run's; None when it
    may start (or there is no port, or the config does not load: the collector then says so itself)."""
    first = None
    with contextlib.suppress(RunhealthError):
        first = next((e.config for e in runs.load_runs(path) if not e.finished), None) if path else None
    port = port if port is not None else first.metrics_port if first else None
    if port is None:
        return None
    try:
        metricsauth.guard(access.resolved(first), address or (first.metrics_address if first else "127.0.0.1"))
    except ConfigError as exc:
        return str(exc)
    return None


def cmd_collect(args: argparse.Namespace) -> int:
    path = None if args.demo else find_config_path(args.config)
    if path is None and not args.demo:
        print(NO_CONFIG, file=sys.stderr)
        return 2
    path = Path(path) if path is not None else None
    access = MetricsAccess(
        args.metrics_token_file, args.metrics_tls_cert_file, args.metrics_tls_key_file, args.public_without_auth
    )
    refused = (
        None
        if args.metrics_elsewhere is not None
        else _metrics_refusal(path, args.metrics_port, args.metrics_address, access)
    )
    if refused is not None:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    stop, refresh = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: refresh.set())  # the dashboard's "Refresh now"
    ready = functools.partial(_say_ready, args.ready_fd)
    if args.supervisor_pid is not None and os.getppid() != args.supervisor_pid:
        # Its supervisor died before the kernel was told to stop this child with it (runprocs.py).
        print("collector not started: its supervising process is gone", file=sys.stderr)
        return 0
    if args.run is None and path is not None and runprocs.several_live_runs(path):
        runprocs.run_supervisor(
            path, stop, refresh, args.metrics_port, args.metrics_address, access, ready, args.wait_for_config
        )
        print("collector stopped", file=sys.stderr)
        return 0
    service.run_collector(
        path,
        stop,
        args.metrics_port,
        args.metrics_address,
        refresh=refresh,
        wait_for_config=args.wait_for_config,
        ready=ready,
        metrics_access=access,
        only_run=args.run,
        metrics_elsewhere=args.metrics_elsewhere,
    )
    print("collector stopped", file=sys.stderr)
    return 0


def _say_ready(fd: int | None, state: str) -> None:
    """Tell `runhealth dashboard` (one word on its pipe) that collection started, or why not
    (runhealth.collect.service.run_collector's `ready` states)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, state.encode())
            os.close(fd)


def add_dashboard(sub: Subparsers) -> None:
    p = sub.add_parser(
        "dashboard",
        help="start the collector and serve the dashboard over its stores (the demo run when no config is found)",
    )
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--port", type=int, help="port to serve on (default: $STREAMLIT_SERVER_PORT, else 8501)")
    p.add_argument(
        "--address",
        help="address to bind (default: $STREAMLIT_SERVER_ADDRESS, else 127.0.0.1, this machine only)",
    )
    p.add_argument(
        "--no-collect",
        action="store_true",
        help="do not start the collector: only read the stores (e.g. next to the runhealth-collect systemd unit)",
    )
    p.add_argument(
        exposure.FLAG,
        action="store_true",
        help="serve on a non-loopback --address with no sign-in: ANYONE who reaches the port reads prompts and"
        " completions (refused without this flag unless every run has allowed_users and [auth] is configured);"
        " also lets the collector serve /metrics without a token on a non-loopback [run] metrics_address",
    )
    p.set_defaults(func=cmd_dashboard)


def add_collect(sub: Subparsers) -> None:
    p = sub.add_parser("collect", help="run the collector alone, headless, until SIGTERM/SIGINT")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus /metrics on this port")
    p.add_argument(
        "--metrics-address",
        metavar="ADDR",
        help="address for /metrics (default: [run] metrics_address, else 127.0.0.1); another than loopback"
        " needs --metrics-token-file or --public-without-auth",
    )
    p.add_argument(
        "--metrics-token-file",
        metavar="FILE",
        help="/metrics requires 'Authorization: Bearer <the token in FILE>' and then serves every live run"
        " (default: [run] metrics_token_file; without one an anonymous scrape sees only the runs without"
        " allowed_users)",
    )
    p.add_argument(
        "--metrics-tls-cert-file", metavar="FILE", help="serve /metrics over HTTPS with this PEM certificate"
    )
    p.add_argument("--metrics-tls-key-file", metavar="FILE", help="the PEM private key of --metrics-tls-cert-file")
    p.add_argument(
        exposure.FLAG,
        action="store_true",
        help="serve /metrics without a token on a non-loopback --metrics-address: ANYONE who reaches the port"
        " reads the runs without allowed_users (the restricted ones are never in an anonymous scrape)",
    )
    # Used by `runhealth dashboard` for its collector child, not meant to be typed.
    p.add_argument("--demo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--wait-for-config", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    # Used by the supervisor of one collector process per run (runhealth/collect/runprocs.py).
    p.add_argument("--run", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument("--metrics-elsewhere", help=argparse.SUPPRESS)
    p.add_argument("--supervisor-pid", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_collect)


def tokens_arg(text: str) -> int:
    """argparse type of --ceiling/--whatif: a whole number of tokens, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of tokens, at least 1 (got {text})")
    return value


def add_scan(sub: Subparsers) -> None:
    scan = sub.add_parser("scan", help="length summary of local JSONL shards")
    scan.add_argument("paths", nargs="+", metavar="PATH_OR_GLOB")
    scan.add_argument("--ceiling", type=tokens_arg, help="the max_tokens limit (detected when absent)")
    scan.add_argument("--whatif", type=tokens_arg, metavar="LIMIT", help="project the effect of raising the limit")
    scan.add_argument(
        "--workers",
        type=int,
        choices=range(1, 9),
        metavar="N",
        help="worker processes for a large scan, 1-8 (default: a quarter of the cores)",
    )
    scan.add_argument("--prompt-id-path", help="dotted path to the prompt ID (detected when absent)")
    scan.add_argument("--prompt-tokens-path", help="dotted path to the prompt's token count (detected when absent)")
    scan.add_argument("--group-path", help="dotted path to a grouping field (prompt-token bins when absent)")
    scan.add_argument("--expected-prompts", type=tokens_arg, metavar="N", help="how many prompts the run should answer")
    scan.add_argument("--max-model-len", type=tokens_arg, metavar="N", help="the server's context window")
    scan.add_argument("--json", action="store_true")
    scan.set_defaults(func=cmd_scan)


def add_compare(sub: Subparsers) -> None:
    p = sub.add_parser(
        "compare",
        help="two runs' local shards side by side: A_GLOBS... -- B_GLOBS...",
        description="Compare run B with run A (local shards). Options go before the `--`;"
        " everything after it is B's paths or globs.",
    )
    p.add_argument("paths", nargs="*", metavar="A_GLOBS")
    p.add_argument("--ceiling-a", type=tokens_arg, metavar="N", help="run A's max_tokens (detected when absent)")
    p.add_argument("--ceiling-b", type=tokens_arg, metavar="N", help="run B's max_tokens (detected when absent)")
    p.add_argument(
        "--workers",
        type=int,
        choices=range(1, 9),
        metavar="N",
        help="worker processes for a large scan, 1-8 (default: a quarter of the cores)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare, b_paths=[])


def cmd_status(args: argparse.Namespace) -> int:
    """Each run's Overview model (runhealth.screens.overview), as the dashboard's tiles show it:
    a few lines each, or with --json the headline record and tiles. Exit 1 when a live run is
    stalled or its numbers are stale; 2 when there is no config or no store yet."""
    from runhealth.screens import published

    path = find_config_path(args.config)
    if path is None:
        print(NO_CONFIG, file=sys.stderr)
        return 2
    try:
        entries, config_error = runs.load_runs(path), None
    except ConfigError as exc:  # #41: the error, and the runs the file names from their stores
        entries, config_error = runs.stored_runs(path), str(exc)
        print(f"error: {escape(config_error)}", file=sys.stderr)
        if entries:
            print("showing the runs it names from their stores, read-only", file=sys.stderr)
    models = []
    for entry in entries:
        store_path = entry.config.resolved_store_path()
        if not store_path.exists():
            print(f"error: run {escape(entry.config.name)}: no store at {escape(store_path)} yet", file=sys.stderr)
            return 2
        store = Store(store_path)
        try:
            models.append(published.shown(store, entry.config, finished=entry.finished))  # as the page shows it
        except (sqlite3.Error, OSError) as exc:  # a damaged store: refused in words, naming it
            raise fileproblems.refusal(store_path, exc) from None
        finally:
            store.close()
    if args.json:
        records = [m.to_json() for m in models]
        out = {"config_error": config_error, "runs": records} if config_error else None
        print(json.dumps(out or (records[0] if len(records) == 1 else {"runs": records}), indent=2))
    else:
        print("\n".join(escape(line) for m in models for line in m.text().splitlines()))
    if config_error:
        return 2
    return 1 if any(m.state in ("stalled", "stale") for m in models) else 0


def add_status(sub: Subparsers) -> None:
    p = sub.add_parser("status", help="each run's Overview as the dashboard shows it (tiles, run state, alerts)")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--json", action="store_true", help="the headline record and tiles as JSON")
    p.set_defaults(func=cmd_status)


def add_poll(sub: Subparsers) -> None:
    poll = sub.add_parser("poll", help="one collection over every configured node")
    poll.add_argument("--config", help=CONFIG_HELP)
    poll.add_argument("--json", action="store_true")
    poll.set_defaults(func=cmd_poll)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runhealth", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"runhealth {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_dashboard, add_collect, add_scan, add_poll, add_compare, add_status):
        add(sub)
    return parser


def split_compare(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`compare`'s B paths are everything after its `--` (argparse's own `--` handling differs
    between Python versions, so the split is made before parsing)."""
    words = [i for i, a in enumerate(argv) if not a.startswith("-")]
    if not words or argv[words[0]] != "compare" or "--" not in argv[words[0] :]:
        return argv, None
    cut = argv.index("--", words[0])
    return argv[:cut], argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv, b_paths = split_compare(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    if b_paths is not None:
        args.b_paths = b_paths
    try:
        return args.func(args)
    except RunhealthError as exc:
        print(f"error: {escape(exc)}", file=sys.stderr)
        return 2
