"""Benchmark the agent's shard scanner against json.loads and jq on warm page cache.

    python bench/scan.py --mb 256

Writes --mb MB of ~10 KB OpenAI chat-completion lines (half plain prose, half dialogue/code
with many escaped quotes; newlines and unicode throughout) into a temp dir, reads it once to warm the page cache, then times:
raw reads, `for line in f: json.loads(line)`, jq extracting the two fields (if installed), and
runhealth.agent.scan_file in a fresh subprocess (which also reports its peak RSS). Each method
runs --repeat times; the best run counts. Goals: >= 8x json.loads, >= 20x jq.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROSE = ("the model then\nwrote über naïve 中文 tokens reasoning answer because therefore loop again "
         "length stop first we note that x + y = 3 so").split(" ")
QUOTES = PROSE + ['said "hello"', 'print("x")', '{"a": 1}']

SCAN_CHILD = """
import json, resource, sys, time
from runhealth import agent
t0 = time.perf_counter()
e = agent.scan_file(sys.argv[1], None, 0, 1 << 62)
dt = time.perf_counter() - t0
print(json.dumps({"s": dt, "lines": e["lines"], "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "template_lines": agent.STATE.line_stats["template"]}))
"""


def make_shard(path: Path, mb: int, style: str = "mixed") -> int:
    """Write about `mb` MB of chat-completion lines; returns the line count."""
    rng = random.Random(0)
    # "mixed" is like real completions: half prose (no quotes), half dialogue/code (~150 quotes a line).
    vocab = {"mixed": (PROSE, QUOTES), "prose": (PROSE, PROSE), "quotes": (QUOTES, QUOTES)}[style]
    contents = [" ".join(rng.choice(vocab[i % 2]) for _ in range(rng.randint(1300, 1900))) for i in range(64)]
    lines, written = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < mb * 1_000_000:
            ct = rng.randint(1, 4096)
            rec = {"id": f"chatcmpl-{lines:012x}", "object": "chat.completion", "created": 1764690000 + lines,
                   "model": "Qwen/Qwen3-8B",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": rng.choice(contents),
                                                         "reasoning_content": None, "tool_calls": []},
                                "logprobs": None, "finish_reason": "length" if ct == 4096 else "stop",
                                "stop_reason": None}],
                   "usage": {"prompt_tokens": 211, "total_tokens": 211 + ct, "completion_tokens": ct}}
            line = json.dumps(rec) + "\n"
            f.write(line)
            written += len(line.encode())
            lines += 1
    return lines


def best_of(repeat, fn):
    return min(fn() for _ in range(repeat))


def time_read(path):
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass
    return time.perf_counter() - t0


def time_json(path):
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
    return time.perf_counter() - t0


def time_jq(path):
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        subprocess.run(["jq", "-c", "[.choices[0].finish_reason, .usage.completion_tokens]"],
                       stdin=f, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def run_scan(path):
    out = subprocess.run([sys.executable, "-c", SCAN_CHILD, str(path)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--style", choices=("mixed", "prose", "quotes"), default="mixed")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="runhealth-bench-") as tmp:
        path = Path(tmp) / "shard.jsonl"
        lines = make_shard(path, args.mb, args.style)
        size_mb = path.stat().st_size / 1e6
        time_read(path)  # warm the page cache
        results = {"raw read": best_of(args.repeat, lambda: time_read(path)),
                   "json.loads per line": best_of(args.repeat, lambda: time_json(path))}
        if shutil.which("jq"):
            results["jq"] = best_of(max(1, args.repeat - 1), lambda: time_jq(path))
        scans = [run_scan(path) for _ in range(args.repeat)]
        scan = min(scans, key=lambda s: s["s"])
        assert scan["lines"] == lines, (scan, lines)
        results["runhealth scan_file"] = scan["s"]
        print(f"{args.style}: {size_mb:.0f} MB, {lines} lines of ~{size_mb * 1e6 / lines / 1000:.1f} KB, "
              f"best of {args.repeat}; scan_file peak RSS {scan['rss_mib']:.0f} MiB, "
              f"{scan['template_lines']} of {lines} lines on the template path")
        print(f"{'method':<22}{'MB/s':>9}{'lines/s':>12}{'x json.loads':>14}{'x jq':>8}")
        for name, secs in results.items():
            vs_jq = f"{results['jq'] / secs:.1f}" if "jq" in results else "-"
            print(f"{name:<22}{size_mb / secs:>9.0f}{lines / secs:>12.0f}"
                  f"{results['json.loads per line'] / secs:>14.1f}{vs_jq:>8}")


if __name__ == "__main__":
    main()
