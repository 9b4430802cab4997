"""Where the scanner's time goes, per style: each step's cost per line against json.loads.

    python bench/primitives.py --mb 32            # every bench/scan.py style
    python bench/primitives.py --mb 64 --style quotes

For each style this writes a bench/scan.py shard, lets the scanner learn its template, then
times in one run (CPU time, best of --repeat) the steps an exact scan of a line is made of:

- read: copying the shard from the page cache in CHUNK_BYTES reads (what scan_file does);
- newline: finding each line's end (memchr);
- skeleton: the template's regexes over the line's keys and scalars (everything but the holes);
- hole walk: finding where each long text string ends (_hole_end: memchr when the text holds
  no quote, else the exact C-level walk past escaped quotes) — the step that proves structure;
- the whole scan (scan_file), and per-line json.loads, the baseline.

- two other exact ways to prove where a text string ends (quotes escaped by bytes.replace then
  memchr; json's own C string scanner), timed on the same holes.

The rows before "scan_file" are parts of it; their sum against the scan_file row shows the
per-line Python overhead. Also printed: the stdlib building blocks' speeds that bound any exact
stdlib scanner (isascii, decode, the quote counts), and the floor: read + newline + the cheapest
hole proof, with no skeleton and no per-line loop at all, as the best ratio to json.loads any
exact stdlib scanner could reach on that style. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from json.decoder import scanstring  # type: ignore[attr-defined]
from pathlib import Path

from scan import STYLES, make_shard

from runhealth.node import scan as agent_scan


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def learned_plan(path):
    """The strict template the scanner learned for this shard (scan it once)."""
    agent_scan.TEMPLATES.entries.clear()
    agent_scan.TEMPLATES.inode_of.clear()
    agent_scan.scan_file(str(path), None, 0, 1 << 40)
    state = agent_scan.TEMPLATES.get(str(path), os.stat(path).st_ino)
    return state[0][0]


def positions(plan, buf, spans):
    """Per line: where each template segment's regex starts, and where each hole starts."""
    segs, holes = [], []
    for a, b in spans:
        seg, starts, pos = [], [], a
        for match, _, hole, lead, _ in plan:
            seg.append(pos)
            m = match(buf, pos, b)
            if m is None or not hole:
                break
            q = agent_scan.hole_end(buf, m.end(), b) - 1
            starts.append((m.end(), q))
            pos = q + (1 if lead is None else len(lead))
        segs.append(seg)
        holes.append(starts)
    return segs, holes


def read_all(path):
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(agent_scan.CHUNK_BYTES)
        while f.readinto(buf):
            pass


def style_rows(path, repeat):
    buf = path.read_bytes()
    lines = buf.split(b"\n")[:-1]
    spans, pos = [], 0
    for line in lines:
        spans.append((pos, pos + len(line)))
        pos += len(line) + 1
    plan = learned_plan(path)
    segs, holes = positions(plan, buf, spans)
    find, hole_end = buf.find, agent_scan.hole_end

    def skeleton():  # every segment's regex at its known place; the holes are not walked
        for (_, b), seg in zip(spans, segs, strict=True):
            for (match, *_), pos in zip(plan, seg, strict=False):
                match(buf, pos, b)

    def hole_walk():
        for (_, b), starts in zip(spans, holes, strict=True):
            for h, _ in starts:
                hole_end(buf, h, b)

    # Other exact stdlib ways to prove where a text string ends, timed on the same holes: the
    # scanner uses the cheapest; with read and newline it bounds any stdlib scanner from below.
    def alt_replace():  # escaped quotes blanked (same length), then memchr for a bare one
        for starts in holes:
            for h, q in starts:
                region = buf[h : q + 1]
                if b"\\\\" in region:
                    region = region.replace(b"\\\\", b"__")
                region.replace(b'\\"', b"__").find(b'"')

    def alt_scanstring():  # json's own C string scanner over a latin-1 view (same offsets)
        for (a, b), starts in zip(spans, holes, strict=True):
            text = buf[a:b].decode("latin-1")
            for h, _ in starts:
                scanstring(text, h - a, False)

    blocks = {
        "read (page cache)": lambda: read_all(path),
        "newline (memchr)": lambda: [find(b"\n", a) for a, _ in spans],
        "skeleton regexes": skeleton,
        "hole walk (_hole_end)": hole_walk,
        "  alt: replace + memchr": alt_replace,
        "  alt: json scanstring": alt_scanstring,
        "scan_file (all of it)": lambda: agent_scan.scan_file(str(path), None, 0, 1 << 40),
        "json.loads per line": lambda: [json.loads(x) for x in lines],
        "block: isascii (whole)": buf.isascii,  # stops at the first non-ASCII byte
        "block: UTF-8 decode": lambda: buf.decode("utf-8", "surrogateescape"),
        'block: count " and \\"': lambda: [buf.count(b'"', a, b) - buf.count(b'\\"', a, b) for a, b in spans],
    }
    secs = {name: best(fn, repeat) for name, fn in blocks.items()}
    quotes = buf.count(b'"') / len(lines)
    return {
        "mb": len(buf) / 1e6,
        "lines": len(lines),
        "quotes": quotes,
        "holes": sum(map(len, holes)) / len(lines),
        "secs": secs,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--style", choices=STYLES + ("all",), default="all")
    args = ap.parse_args()
    styles = STYLES if args.style == "all" else (args.style,)
    print(
        f"CPU time per line, best of {args.repeat}; Python {sys.version.split()[0]}; CHUNK_BYTES "
        f"{agent_scan.CHUNK_BYTES >> 10} KiB"
    )
    with tempfile.TemporaryDirectory(prefix="runhealth-bench-") as tmp:
        for style in styles:
            path = Path(tmp) / f"{style}.jsonl"
            make_shard(path, args.mb, style)
            r = style_rows(path, args.repeat)
            path.unlink()
            n, base = r["lines"], r["secs"]["json.loads per line"]
            print(
                f"\n{style}: {r['mb']:.0f} MB, {n} lines of {r['mb'] * 1e3 / n:.1f} KB, {r['quotes']:.0f} quotes "
                f"and {r['holes']:.0f} holes a line"
            )
            print(f"{'step':<26}{'us/line':>9}{'MB/s':>8}{'x json.loads':>14}")
            for name, s in r["secs"].items():
                if s * 1e6 < n:  # under a microsecond for the whole shard: a stop at the first byte
                    print(f"{name:<26}{'<0.01':>9}{'-':>8}{'-':>14}")
                    continue
                print(f"{name:<26}{s / n * 1e6:>9.2f}{r['mb'] / s:>8.0f}{base / s:>14.1f}")
            print(f"4x json.loads leaves {base / 4 / n * 1e6:.2f} us a line for everything.")
            sec = r["secs"]
            hole = min(sec["hole walk (_hole_end)"], sec["  alt: replace + memchr"], sec["  alt: json scanstring"])
            floor = sec["read (page cache)"] + sec["newline (memchr)"] + hole
            print(
                f"Floor (read + newline + the cheapest hole proof, no skeleton, no loop): {floor / n * 1e6:.2f} us "
                f"a line, so an exact stdlib scan can reach at most {base / floor:.1f}x json.loads on this style."
            )


if __name__ == "__main__":
    main()
