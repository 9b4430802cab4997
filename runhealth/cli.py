"""Command-line interface: `runhealth dashboard|collect|scan|poll` (also `python -m runhealth`).

`dashboard` serves the Streamlit app; `collect` runs the collector alone, headless, for a
service next to read-only dashboards; `scan` answers "what's the max completion length, and
are we maxing out?" for local shard files with no dashboard at all; `poll` runs one full
collection over every configured node. `scan` and `poll` print a human summary, or with
`--json` the objects the tests and benchmarks rely on. Each subcommand is one `add_*` parser
function and one `cmd_*` function.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from runhealth import __version__, agent, launch, service, stats, whatif
from runhealth.collector import Collector
from runhealth.config import find_config_path, load_config
from runhealth.errors import RunhealthError
from runhealth.store import Store
from runhealth.textsafe import escape

NO_CONFIG = "error: no config: pass --config, set RUNHEALTH_CONFIG, or create runhealth.toml"
CONFIG_HELP = "config file (default: $RUNHEALTH_CONFIG, else ./runhealth.toml)"


def scan_paths(patterns: list[str], totals: dict[str, int] | None = None,
               workers: int | None = None) -> tuple[stats.LengthHist, int, list[str]]:
    """Count every complete line of the local shards matching `patterns`.

    Returns the length histogram, the number of malformed lines, and the patterns that
    matched nothing. Uses the node agent's own scanner, in-process, with up to `workers`
    worker processes for a backlog (None: a quarter of the cores, 1..8; 1: one process).
    `totals`, when given, receives "blank_lines" (whitespace-only lines: skipped, not malformed).
    """
    state: dict[str, dict[str, int]] = {}
    hist, malformed, unmatched = stats.LengthHist(), 0, None
    while True:
        reply = agent.handle({"op": "poll", "gpu": "off", "metrics_urls": [],
                              "shards": {"globs": patterns, "state": state, "budget_bytes": 1 << 30,
                                         "scan_workers": workers}})
        if not reply.get("ok"):
            raise RunhealthError(reply.get("error") or "scan failed")
        shards = reply["shards"]
        unmatched = shards.get("unmatched_globs") or []
        for path, entry in shards["files"].items():
            if entry.get("error"):
                print(f"warning: {escape(path)}: {escape(entry['error'])}", file=sys.stderr)
            for tokens, finish, estimated, count in entry.get("counts") or []:
                hist.add(tokens, finish, estimated, count)
            malformed += int(entry.get("malformed") or 0)
            if totals is not None:
                totals["blank_lines"] = totals.get("blank_lines", 0) + int(entry.get("blank_lines") or 0)
            state[path] = {"inode": entry.get("inode"), "offset": entry.get("offset", 0)}
        if not shards.get("pending_bytes"):
            return hist, malformed, unmatched


def cmd_scan(args: argparse.Namespace) -> int:
    totals: dict[str, int] = {}
    hist, malformed, unmatched = scan_paths(args.paths, totals, args.workers)
    for pattern in unmatched:
        print(f"warning: nothing matched {escape(pattern)}", file=sys.stderr)
    summary = stats.summarize(hist, ceiling=args.ceiling, unparseable=malformed)
    summary["blank_lines"] = totals.get("blank_lines", 0)
    if args.whatif:
        if summary["ceiling"] is None:
            print("error: --whatif needs a ceiling (none given and none detected)", file=sys.stderr)
            return 2
        summary["whatif"] = whatif.what_if(hist, summary["ceiling"], args.whatif)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0 if summary["completions"] or not unmatched else 1


def cmd_poll(args: argparse.Namespace) -> int:
    path = find_config_path(args.config)
    if path is None:
        print(NO_CONFIG, file=sys.stderr)
        return 2
    config = load_config(path)
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
    print(json.dumps(report, indent=2) if args.json else format_poll(report))
    return 0 if all(n["ok"] for n in report["nodes"]) else 1


def poll_report(config, store: Store, results: dict[str, Any]) -> dict[str, Any]:
    """The `poll --json` object: every node (failed ones included) and the merged lengths."""
    by_node: dict[str, stats.LengthHist] = {n.name: stats.LengthHist() for n in config.nodes}
    for row in store.length_counts(by="node"):
        by_node[row["node"]].add(row["tokens"], row["finish_reason"], row["estimated"], row["count"])
    malformed = {r["name"]: r["malformed"] for r in store.nodes()}
    nodes, merged = [], stats.LengthHist()
    for node in config.nodes:
        result = results.get(node.name)
        ok = isinstance(result, dict)
        merged = merged.merge(by_node[node.name])
        nodes.append({
            "name": node.name, "ok": ok, "error": None if ok else str(result),
            "gpus": (result.get("gpus") or {}).get("devices", []) if ok else [],
            "lengths": stats.summarize(by_node[node.name], config.max_output_tokens, malformed.get(node.name, 0)),
        })
    total_malformed = sum(malformed.values())
    return {"nodes": nodes, "lengths": stats.summarize(merged, config.max_output_tokens, total_malformed)}


def format_summary(s: dict[str, Any]) -> str:
    t = s["tokens"]
    blank = f", blank lines skipped: {s['blank_lines']:,}" if s.get("blank_lines") else ""
    lines = [f"completions: {s['completions']:,}  (malformed lines: {s['unparseable']:,}{blank})"]
    if s["completions"]:
        lines.append(f"tokens: mean {t['mean']:.0f}  p50 {t['p50']}  p90 {t['p90']}  p99 {t['p99']}  max {t['max']}")
    lines.append("finish reasons: " + ", ".join(f"{escape(k)} {v:,}" for k, v in s["finish_reasons"].items()))
    if s["ceiling"] is not None:
        lines.append(f"ceiling: {s['ceiling']} ({s['ceiling_source']}); at the ceiling: {s['at_ceiling']:,}"
                     f" ({100 * s['at_ceiling_fraction']:.1f}%), length stops below it: {s['length_below_ceiling']:,}")
    else:
        lines.append("ceiling: none detected (no pile-up of finish_reason=length)")
    if s.get("whatif"):
        lines.extend(format_whatif(s["whatif"]))
    return "\n".join(lines)


def format_whatif(w: dict[str, Any]) -> list[str]:
    """The what-if in words: estimate and interval, the headline model, the back-test check."""
    if w["truncated_fraction"] is None:
        return [f"what-if limit {w['limit']}: between {100 * w['interval'][0]:.1f}% and {100 * w['interval'][1]:.1f}%"
                f" still truncated (hard bounds only) — {w['note']}"]
    out = [f"what-if limit {w['limit']}: {100 * w['truncated_fraction']:.1f}% still truncated"
           f" (95% {100 * w['interval'][0]:.1f}-{100 * w['interval'][1]:.1f}%, {w['model']});"
           f" {w['extra_tokens_per_completion']:+.0f} tokens per completion"
           f" ({w['extra_tokens_interval'][0]:.0f}-{w['extra_tokens_interval'][1]:.0f}) — extrapolation"]
    checks = [c for c in ((w.get("backtest") or {}).get("checks") or []) if c.get("predicted") is not None]
    if checks:
        c = checks[0]
        out.append(f"  checked on this run: cut at {c['cut']}, it would have said {100 * c['predicted']:.1f}%"
                   f" above {c['limit']}; the truth is {100 * c['truth']:.1f}%")
    elif w.get("model_reason"):
        out.append(f"  {w['model_reason']}")
    return out


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
    argv, env = launch.dashboard_command(path, args.port, args.address, collect=not args.no_collect)
    where = f"config {path.expanduser().absolute()}" if path else "no config found: the demo run"
    print(f"runhealth dashboard on http://{args.address}:{args.port} ({where})", file=sys.stderr)
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # streamlit takes over this process (and its signals)
    return 0  # not reached


def cmd_collect(args: argparse.Namespace) -> int:
    path = find_config_path(args.config)
    if path is None:
        print(NO_CONFIG, file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    service.run_collector(Path(path), stop, args.metrics_port, args.metrics_address)
    print("collector stopped", file=sys.stderr)
    return 0


def add_dashboard(sub) -> None:
    p = sub.add_parser("dashboard", help="serve the dashboard (the demo run when no config is found)")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--no-collect", action="store_true",
                   help="only read the store (another process, e.g. `runhealth collect`, collects)")
    p.set_defaults(func=cmd_dashboard)


def add_collect(sub) -> None:
    p = sub.add_parser("collect", help="run the collector alone, headless, until SIGTERM/SIGINT")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-address", metavar="ADDR",
                   help="address for /metrics (default: [run] metrics_address, else 127.0.0.1)")
    p.set_defaults(func=cmd_collect)


def add_scan(sub) -> None:
    scan = sub.add_parser("scan", help="length summary of local JSONL shards")
    scan.add_argument("paths", nargs="+", metavar="PATH_OR_GLOB")
    scan.add_argument("--ceiling", type=int, help="the max_tokens limit (detected when absent)")
    scan.add_argument("--whatif", type=int, metavar="LIMIT", help="project the effect of raising the limit")
    scan.add_argument("--workers", type=int, choices=range(1, 9), metavar="N",
                      help="worker processes for a large scan, 1-8 (default: a quarter of the cores)")
    scan.add_argument("--json", action="store_true")
    scan.set_defaults(func=cmd_scan)


def add_poll(sub) -> None:
    poll = sub.add_parser("poll", help="one collection over every configured node")
    poll.add_argument("--config", help=CONFIG_HELP)
    poll.add_argument("--json", action="store_true")
    poll.set_defaults(func=cmd_poll)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runhealth", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"runhealth {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_dashboard, add_collect, add_scan, add_poll):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RunhealthError as exc:
        print(f"error: {escape(exc)}", file=sys.stderr)
        return 2
