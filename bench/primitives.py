"""What an exact stdlib scanner can cost: each building block's speed against json.loads.

    python bench/primitives.py --mb 64 --style mixed

Issue #6 asks for a shard scan >= 8x per-line json.loads while staying exact. This measures,
in one run over the same bench/scan.py shard, the stdlib operations such a scanner is made of,
as MB/s over the whole shard and as a multiple of per-line json.loads:

- what every exact scan must pay: finding newlines (memchr) and checking UTF-8 (isascii, or a
  decode when the window is not ASCII);
- ways to find where a long JSON string ends, i.e. its first quote not escaped by a
  backslash: a plain memchr (right only when the string holds no quote), the C-level regex walk
  the scanner uses (_QUOTE_RE), and the two counts that would prove "no unescaped quote";
- the bare key search of the issue's rule (bytes.find of `"finish_reason"` across the line).

A scanner's time per line is at least the sum of the blocks it needs, so the table shows which
combinations can reach 8x on this machine. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from scan import make_shard

from runhealth import agent_scan


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def body_spans(buf, lines):
    """(start, end) of each line's message content string (the long hole)."""
    spans, pos = [], 0
    for line in lines:
        a = line.find(b'"content": "') + 12
        spans.append((pos + a, pos + line.rfind(b'", "reasoning_content"')))
        pos += len(line) + 1
    return spans


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--style", choices=("mixed", "prose", "quotes"), default="mixed")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="runhealth-bench-") as tmp:
        path = Path(tmp) / "shard.jsonl"
        make_shard(path, args.mb, args.style)
        buf = path.read_bytes()
    lines = buf.split(b"\n")[:-1]
    spans = body_spans(buf, lines)
    find, qre = buf.find, agent_scan._QUOTE_RE.search
    blocks = {
        "json.loads per line": lambda: [json.loads(x) for x in lines],
        "newlines (memchr per line)": lambda: [find(b"\n", a) for a, _ in spans],
        "UTF-8: isascii": buf.isascii,
        "UTF-8: decode": lambda: buf.decode("utf-8"),
        "string end: memchr quote": lambda: [find(b'"', a, b) for a, b in spans],
        "string end: _QUOTE_RE walk": lambda: [qre(buf, a, b) for a, b in spans],
        "no unescaped quote: 2 counts": lambda: [buf.count(b'"', a, b) - buf.count(b'\\"', a, b)
                                                 for a, b in spans],
        'key rule: find "finish_reason"': lambda: [find(b'"finish_reason"', a, b) for a, b in spans],
    }
    secs = {name: best(fn, args.repeat) for name, fn in blocks.items()}
    mb, base = len(buf) / 1e6, secs["json.loads per line"]
    quotes = buf.count(b'"') / len(lines)
    print(f"{args.style}: {mb:.0f} MB, {len(lines)} lines, {quotes:.0f} quotes a line; "
          f"best of {args.repeat}; Python {sys.version.split()[0]}")
    print(f"{'block':<34}{'MB/s':>9}{'us/line':>9}{'x json.loads':>14}")
    for name, s in secs.items():
        print(f"{name:<34}{mb / s:>9.0f}{s / len(lines) * 1e6:>9.2f}{base / s:>14.1f}")
    print(f"8x json.loads leaves {base / 8 / len(lines) * 1e6:.2f} us a line for everything.")


if __name__ == "__main__":
    main()
