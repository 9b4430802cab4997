"""Command-line interface: `python -m runhealth scan|poll`.

`scan` answers "what's the max completion length, and are we maxing out?" for local shard
files with no dashboard at all; `poll` runs one full collection over every configured node.
Both print a human summary, or with `--json` the objects the tests and benchmarks rely on.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
from typing import Any

from runhealth import agent, stats, whatif
from runhealth.collector import Collector
from runhealth.config import find_config_path, load_config
from runhealth.errors import RunhealthError
from runhealth.outbound import start_outbound
from runhealth.store import Store


def scan_paths(patterns: list[str]) -> tuple[stats.LengthHist, int, list[str]]:
    """Count every complete line of the local shards matching `patterns`.

    Returns the length histogram, the number of malformed lines, and the patterns that
    matched nothing. Uses the node agent's own scanner, in-process.
    """
    state: dict[str, dict[str, int]] = {}
    hist, malformed, unmatched = stats.LengthHist(), 0, None
    while True:
        reply = agent.handle({"op": "poll", "gpu": "off", "metrics_urls": [],
                              "shards": {"globs": patterns, "state": state, "budget_bytes": 1 << 30}})
        if not reply.get("ok"):
            raise RunhealthError(reply.get("error") or "scan failed")
        shards = reply["shards"]
        unmatched = shards.get("unmatched_globs") or []
        for path, entry in shards["files"].items():
            if entry.get("error"):
                print(f"warning: {path}: {entry['error']}", file=sys.stderr)
            for tokens, finish, estimated, count in entry.get("counts") or []:
                hist.add(tokens, finish, estimated, count)
            malformed += int(entry.get("malformed") or 0)
            state[path] = {"inode": entry.get("inode"), "offset": entry.get("offset", 0)}
        if not shards.get("pending_bytes"):
            return hist, malformed, unmatched


def cmd_scan(args: argparse.Namespace) -> int:
    hist, malformed, unmatched = scan_paths(args.paths)
    for pattern in unmatched:
        print(f"warning: nothing matched {pattern}", file=sys.stderr)
    summary = stats.summarize(hist, ceiling=args.ceiling, unparseable=malformed)
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
        print("error: no config: pass --config, set RUNHEALTH_CONFIG, or create runhealth.toml", file=sys.stderr)
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
    lines = [f"completions: {s['completions']:,}  (malformed lines: {s['unparseable']:,})"]
    if s["completions"]:
        lines.append(f"tokens: mean {t['mean']:.0f}  p50 {t['p50']}  p90 {t['p90']}  p99 {t['p99']}  max {t['max']}")
    lines.append("finish reasons: " + ", ".join(f"{k} {v:,}" for k, v in s["finish_reasons"].items()))
    if s["ceiling"] is not None:
        lines.append(f"ceiling: {s['ceiling']} ({s['ceiling_source']}); at the ceiling: {s['at_ceiling']:,}"
                     f" ({100 * s['at_ceiling_fraction']:.1f}%), length stops below it: {s['length_below_ceiling']:,}")
    else:
        lines.append("ceiling: none detected (no pile-up of finish_reason=length)")
    if s.get("whatif"):
        w = s["whatif"]
        lines.append(f"what-if limit {w['limit']}: {100 * w['truncated_fraction']:.1f}% still truncated"
                     f" (interval {100 * w['interval'][0]:.1f}-{100 * w['interval'][1]:.1f}%, {w['model']});"
                     f" +{w['extra_tokens_per_completion']:.0f} tokens per completion — extrapolation")
    return "\n".join(lines)


def format_poll(report: dict[str, Any]) -> str:
    out = []
    for n in report["nodes"]:
        status = "ok" if n["ok"] else f"FAILED: {n['error']}"
        out.append(f"== {n['name']}: {status}; {len(n['gpus'])} GPUs")
        out.append("   " + format_summary(n["lengths"]).replace("\n", "\n   "))
    out.append("== all nodes")
    out.append(format_summary(report["lengths"]))
    return "\n".join(out)


def cmd_collect(args: argparse.Namespace) -> int:
    """Collect into the run's store until SIGTERM/SIGINT, serving /metrics and webhooks if set."""
    path = find_config_path(args.config)
    if path is None:
        print("error: no config: pass --config, set RUNHEALTH_CONFIG, or create runhealth.toml", file=sys.stderr)
        return 2
    config = load_config(path)
    store = Store(config.resolved_store_path())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with Collector(config, store) as collector:
        collector.start()
        outbound = start_outbound(config, store, args.metrics_port, args.metrics_address)
        where = f"; /metrics on {outbound.metrics_url}" if outbound.metrics_url else ""
        print(f"collecting {len(config.nodes)} node(s) of {config.name} every {config.interval_s:g} s"
              f" into {store.path}{where}", file=sys.stderr, flush=True)
        try:
            while not stop.wait(1.0):
                pass
        finally:
            outbound.stop()
    store.close()
    return 0


def add_collect(sub) -> None:
    p = sub.add_parser("collect", help="run the collector alone, headless, until SIGTERM/SIGINT")
    p.add_argument("--config", help="config file (default: $RUNHEALTH_CONFIG or ./runhealth.toml)")
    p.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-address", metavar="ADDR",
                   help="address for /metrics (default: [run] metrics_address, else 127.0.0.1)")
    p.set_defaults(func=cmd_collect)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runhealth", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    scan = sub.add_parser("scan", help="length summary of local JSONL shards")
    scan.add_argument("paths", nargs="+", metavar="PATH_OR_GLOB")
    scan.add_argument("--ceiling", type=int, help="the max_tokens limit (detected when absent)")
    scan.add_argument("--whatif", type=int, metavar="LIMIT", help="project the effect of raising the limit")
    scan.add_argument("--json", action="store_true")
    scan.set_defaults(func=cmd_scan)
    poll = sub.add_parser("poll", help="one collection over every configured node")
    poll.add_argument("--config", help="config file (default: $RUNHEALTH_CONFIG or ./runhealth.toml)")
    poll.add_argument("--json", action="store_true")
    poll.set_defaults(func=cmd_poll)
    add_collect(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RunhealthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
