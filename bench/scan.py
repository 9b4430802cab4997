"""Benchmark the agent's shard scanner against json.loads and jq on warm page cache, every style.

    python bench/scan.py --mb 128            # all styles, one table
    python bench/scan.py --mb 256 --style utf8
    python bench/scan.py --mb 16 --repeat 2 --style formats   # every output format vs the chat styles

For each style (see make_shard: ASCII-escaped prose/quotes/mixed, raw-UTF-8 utf8/utf8-quotes,
adversarial flat records) it writes --mb MB of ~10 KB lines into a temp dir, reads them once to
warm the page cache, then times in the same run, as CPU time (user + system of the process that
does the work, so the figures are per core and hold on a shared machine): raw reads, `for line in f: json.loads(line)`,
jq extracting the two fields (if installed; not required), and runhealth.node.agent.scan_file in a
fresh subprocess (which also reports its peak RSS). Each method runs --repeat times; the best
run counts. Goals per core: >= 4x json.loads and >= 10x jq on every style. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROSE = (
    "the model then\nwrote über naïve 中文 tokens reasoning answer because therefore loop again "
    "length stop first we note that x + y = 3 so"
).split(" ")
QUOTES = PROSE + ['said "hello"', 'print("x")', '{"a": 1}']
# Raw-UTF-8 text as multilingual and math generations write it: CJK, accents, Cyrillic, emoji.
UTF8 = (
    "模型 然后 写了 中文 推理 答案 因为 所以 über naïve café résumé привет мир ∑ √ ≤ ∞ "
    "😀 🚀 the answer is x + y = 3 so length stop\n"
).split(" ")
UTF8_QUOTES = UTF8 + ['他说 "你好"', 'print("é")', '{"a": "ü"}']
# Text that carries the keys' own bytes (escaped in the line) and backslash runs.
ADVERSARIAL = PROSE + [
    '"finish_reason": "length"',
    '"completion_tokens": 4096',
    "C:\\dir\\",
    '\\"',
    '\\"',
    "中文",
    "😀",
]
# A broken writer (one that does not escape): its clean twin's lines, byte for byte the same
# length, with raw control characters (a TAB, BEL, ESC) in every line's text, or with invalid
# UTF-8 (a bad continuation byte, a cut emoji) in every line's raw-UTF-8 text. Lone surrogates
# are written as the bytes they stand for (surrogateescape).
BROKEN_DAMAGE = {
    "broken-ctrl": ((" the ", "\tthe\x07"), (" so ", "\x1bso ")),
    "broken-utf8": (("ü", "\udcc3("), ("😀", "\udcf0\udc9f\udc98!")),
}
BROKEN = {"broken-ctrl": "quotes", "broken-utf8": "utf8-quotes"}  # style -> its clean twin
# One style per published output format (#39), written by tests/formatgen.py's writers (each from
# its provider's docs) around the same texts: "fmt-NAME" as mixed (ASCII-escaped), "fmt-NAME-utf8"
# as utf8 (raw UTF-8); each is compared with that chat style in the same run (format_ratios).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import formatgen  # noqa: E402

FORMAT_STYLES = tuple(f"fmt-{n}{v}" for n in formatgen.FORMATS for v in ("", "-utf8"))
STYLES = ("mixed", "prose", "quotes", "utf8", "utf8-quotes", "adversarial") + tuple(BROKEN) + FORMAT_STYLES

# argv[1] is the code root to time (this checkout, or --other DIR: an older scanner, same run)
SCAN_CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from runhealth.node import agent
t0 = time.process_time()
e = agent.scan_file(sys.argv[2], None, 0, 1 << 62)
dt = time.process_time() - t0
print(json.dumps({"s": dt, "lines": e["lines"], "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "template_lines": agent.STATE.line_stats["template"]}))
"""


# The chat styles carry an `id` and `usage.prompt_tokens`, so the scan counts per-line fields
# (#33: prompt-ID hashes, prompt-token bins); --no-fields writes the same lines without them.
CHAT_FIELDS = {"on": True}


def _chat(rng, lines, content, ensure_ascii):
    ct = rng.randint(1, 4096)
    rec = {
        "id": f"chatcmpl-{lines:012x}",
        "object": "chat.completion",
        "created": 1764690000 + lines,
        "model": "Qwen/Qwen3-8B",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "reasoning_content": None, "tool_calls": []},
                "logprobs": None,
                "finish_reason": "length" if ct == 4096 else "stop",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 211, "total_tokens": 211 + ct, "completion_tokens": ct},
    }
    if not CHAT_FIELDS["on"]:  # same keys' bytes, none a per-line field: "ref" and "input_tokens"
        rec["ref"] = rec.pop("id")
        rec["usage"] = {"input_tokens": 211, "total_tokens": 211 + ct, "completion_tokens": ct}
    return json.dumps(rec, ensure_ascii=ensure_ascii)


def _flat(rng, lines, content, _ensure_ascii):
    """The adversarial style: flat records, every other line raw UTF-8, the text before the keys."""
    ct = rng.randint(1, 4096)
    rec = {
        "prompt": content[:200],
        "text": content,
        "finish_reason": "length" if ct == 4096 else "stop",
        "completion_tokens": ct,
    }
    return json.dumps(rec, ensure_ascii=bool(lines % 2))


def _format_line(rng, lines, content, ensure_ascii, name):
    """One line of format `name` (formatgen's writer), its tokens and finish reason drawn as the chat
    styles draw them (cut when 4096), ~2% failed requests where the format has them; (line, False
    for a failed request, which is no line the scan counts)."""
    fmt = formatgen.FORMATS[name]
    ct = rng.randint(1, 4096)
    kind = "failed" if fmt.failures and rng.random() < 0.02 else "cut" if ct == 4096 else "stop"
    ct = 4096 if kind == "cut" else 0 if kind == "failed" else ct
    reason = fmt.failures[0] if kind == "failed" else ""
    o = formatgen.Outcome(kind, ct, 211, f"req-{lines:012x}", "", content, reason)
    return json.dumps(fmt.write(o, lines), ensure_ascii=ensure_ascii), kind != "failed"


def make_shard(path: Path, mb: int, style: str = "mixed") -> int:
    """Write about `mb` MB of generation lines in `style`; returns the line count.

    mixed: like real completions, half prose (no quotes), half dialogue/code (~150 quotes a
    line); prose / quotes: all one kind. Those three are json.dumps' default (ASCII, \\uXXXX
    escapes). utf8 / utf8-quotes: the same with ensure_ascii=False (raw UTF-8: CJK, accents,
    emoji), as most generation pipelines write. adversarial: flat records whose text holds the
    keys' own bytes (escaped `\\"finish_reason\\": \\"length\\"`) and backslash runs, every
    other line raw UTF-8. broken-ctrl / broken-utf8: quotes / utf8-quotes as a writer that does not
    escape writes them (BROKEN_DAMAGE): the same lines, the same lengths, but every line holds raw
    control characters / invalid UTF-8 in its text, so no line is valid JSON.
    """
    rng = random.Random(0)
    vocab = {
        "mixed": (PROSE, QUOTES),
        "prose": (PROSE, PROSE),
        "quotes": (QUOTES, QUOTES),
        "utf8": (UTF8, UTF8),
        "utf8-quotes": (UTF8_QUOTES, UTF8_QUOTES),
        "adversarial": (ADVERSARIAL, ADVERSARIAL),
    }[_vocab_style(style)]
    contents = [" ".join(rng.choice(vocab[i % 2]) for _ in range(rng.randint(1300, 1900))) for i in range(64)]
    make = _flat if style == "adversarial" else _chat
    if style.startswith("fmt-"):
        name = style[4:].removesuffix("-utf8")
        make = lambda rng, i, content, ea: _format_line(rng, i, content, ea, name)  # noqa: E731
    ensure_ascii = not _vocab_style(style).startswith("utf8")
    damage = BROKEN_DAMAGE.get(style, ())
    lines, written, counted = 0, 0, 0
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        while written < mb * 1_000_000:
            made = make(rng, lines, rng.choice(contents), ensure_ascii)
            line, counts = made if isinstance(made, tuple) else (made, True)
            line += "\n"
            for clean, broken in damage:
                line = line.replace(clean, broken)
            f.write(line)
            written += len(line.encode("utf-8", "surrogateescape"))
            lines += 1
            counted += counts
    return counted


def _vocab_style(style: str) -> str:
    """The chat style whose texts `style` carries (a broken style's clean twin; a format's mixed or utf8)."""
    if style.startswith("fmt-"):
        return "utf8" if style.endswith("-utf8") else "mixed"
    return BROKEN.get(style, style)


def best_of(repeat, fn):
    return min(fn() for _ in range(repeat))


def time_read(path):
    t0 = time.process_time()
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass
    return time.process_time() - t0


def time_json(path):
    t0 = time.process_time()
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
    return time.process_time() - t0


def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


JQ_FILTERS = {"adversarial": "[.finish_reason, .completion_tokens]"}


def time_jq(path, style):
    jq_filter = JQ_FILTERS.get(style, "[.choices[0].finish_reason, .usage.completion_tokens]")
    t0 = children_cpu()
    with open(path, "rb") as f:
        subprocess.run(["jq", "-c", jq_filter], stdin=f, stdout=subprocess.DEVNULL, check=True)
    return children_cpu() - t0


def run_scan(path, root=ROOT):
    out = subprocess.run(
        [sys.executable, "-c", SCAN_CHILD, str(root), str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def bench_style(
    tmp: Path, style: str, mb: int, repeat: int, other: Path | None = None, twin: dict | None = None
) -> dict:
    """Seconds per method for one style (best of `repeat`), all on the same warm file.

    A broken style (`twin`: its clean twin's row, timed in the same run) has no json.loads or jq
    figure of its own, as both reject its lines: its baseline is json.loads on the twin at the
    twin's MB/s, and `clean` is the scanner's MB/s on the twin.
    """
    path = tmp / f"{style}.jsonl"
    lines = make_shard(path, mb, style)
    time_read(path)  # warm the page cache
    mb_size = path.stat().st_size / 1e6
    out = {"style": style, "mb": mb_size, "lines": lines, "read": best_of(repeat, lambda: time_read(path))}
    if twin is None:
        out["json"] = best_of(repeat, lambda: time_json(path))
        out["jq"] = best_of(max(1, repeat - 1), lambda: time_jq(path, style)) if shutil.which("jq") else None
    else:  # seconds json.loads would take for these MB at the clean twin's MB/s
        out.update(json=twin["json"] * mb_size / twin["mb"], jq=None, clean=twin["mb"] / twin["scan"])
    scans = [run_scan(path) for _ in range(repeat)]
    scan = min(scans, key=lambda s: s["s"])
    assert scan["lines"] == lines, (scan, lines)
    out.update(scan=scan["s"], rss_mib=scan["rss_mib"], template_lines=scan["template_lines"])
    if other is not None:  # another checkout's scanner on the same file, e.g. before a change
        out["other"] = min(run_scan(path, other)["s"] for _ in range(repeat))
    path.unlink()
    return out


def bench_styles(tmp: Path, styles, mb: int, repeat: int, other: Path | None = None) -> list[dict]:
    """Rows for `styles`; a broken style's clean twin is timed first (once) and shown too."""
    rows: dict[str, dict] = {}
    for style in styles:
        twin_style = BROKEN.get(style)
        if twin_style is not None and twin_style not in rows:
            rows[twin_style] = bench_style(tmp, twin_style, mb, repeat, other)
        if style not in rows:
            twin = rows[twin_style] if twin_style else None
            rows[style] = bench_style(tmp, style, mb, repeat, other, twin)
    return list(rows.values())


def print_table(rows: list[dict]) -> None:
    print(
        f"{'style':<13}{'MB':>5}{'KB/line':>8}{'read':>7}{'json.loads':>11}{'jq':>6}{'runhealth':>10}"
        f"{'x json':>8}{'x jq':>6}{'RSS MiB':>8}{'template':>9}" + ("   other  x json" if "other" in rows[0] else "")
    )
    for r in rows:
        mbs = {k: r["mb"] / r[k] if r[k] else None for k in ("read", "json", "jq", "scan")}
        jq = f"{mbs['jq']:>6.0f}" if mbs["jq"] else f"{'-':>6}"
        x_jq = f"{r['jq'] / r['scan']:>6.1f}" if r["jq"] else f"{'-':>6}"
        print(
            f"{r['style']:<13}{r['mb']:>5.0f}{r['mb'] * 1e3 / r['lines']:>8.1f}{mbs['read']:>7.0f}"
            f"{mbs['json']:>11.0f}{jq}{mbs['scan']:>10.0f}{r['json'] / r['scan']:>8.1f}{x_jq}"
            f"{r['rss_mib']:>8.0f}{r['template_lines'] / r['lines']:>9.0%}"
            + (f"{r['mb'] / r['other']:>8.0f}{r['json'] / r['other']:>8.1f}" if "other" in r else "")
        )
    for r in rows:
        if "clean" in r:
            print(
                f"{r['style']}: {r['mb'] / r['scan']:.0f} MB/s = {r['mb'] / r['scan'] / r['clean']:.2f}x the scanner "
                f"on its clean twin {BROKEN[r['style']]} ({r['clean']:.0f} MB/s), "
                f"{r['json'] / r['scan']:.1f}x json.loads on that twin"
            )


def format_ratios(rows: list[dict]) -> None:
    """Each format style's MB/s over its chat style's (mixed or utf8), same run (#39: >= 0.85)."""
    by = {r["style"]: r for r in rows}
    for r in rows:
        base = by.get(_vocab_style(r["style"])) if r["style"].startswith("fmt-") else None
        if base is not None:
            mbs, base_mbs = r["mb"] / r["scan"], base["mb"] / base["scan"]
            print(f"{r['style']}: {mbs:.0f} MB/s = {mbs / base_mbs:.2f}x {base['style']} ({base_mbs:.0f} MB/s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=128, help="MB per style")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--style", choices=STYLES + ("all", "formats"), default="all", help="formats: mixed, utf8 and every format"
    )
    ap.add_argument(
        "--other",
        type=Path,
        metavar="DIR",
        help="also time the scanner of another checkout (e.g. `git archive` of an older commit)",
    )
    ap.add_argument("--no-fields", action="store_true", help="chat lines without an ID or prompt tokens (#33)")
    args = ap.parse_args()
    CHAT_FIELDS["on"] = not args.no_fields
    styles = STYLES if args.style == "all" else (args.style,)
    if args.style == "formats":
        styles = ("mixed", "utf8") + FORMAT_STYLES
    with tempfile.TemporaryDirectory(prefix="runhealth-bench-") as tmp:
        rows = bench_styles(Path(tmp), styles, args.mb, args.repeat, args.other)
    print(
        f"MB per CPU second (user+sys of the process doing the work: per core, robust to a busy machine), "
        f"warm page cache, best of {args.repeat}; Python "
        f"{sys.version.split()[0]}; jq {'found' if shutil.which('jq') else 'not installed (column blank)'}"
    )
    print_table(rows)
    format_ratios(rows)
    print(
        "Goals per core: >= 4x json.loads and >= 10x jq on every style; a broken writer's style at least "
        "as fast as its clean twin. 'template': share of lines counted on the template path (the rest "
        "went through json.loads)."
    )


if __name__ == "__main__":
    main()
