"""Benchmark what content marks (issue 29 item 4) cost a poll over many shards.

Each poll checks every shard with a stored offset: open, two small preads, a blake2b of 512
bytes (agent._replaced; a shard not written since this agent marked it is not read), and marks
the shards whose offset moved (agent._mark_entries).
This times the agent's poll op in-process over N shards of 10 lines, with marks and with both
steps switched off (the baseline, in the same run), for polls with no new data ("idle"), with
8 live shards grown by 200 lines each ("live") and with every shard grown by one line ("grow",
the worst case: each grown shard is read for its check and again for its new mark).

Usage: python bench/marks.py [--files 2000] [--rounds 15]
Goal: idle and live polls within a few percent of the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from shardgen import chat_line  # noqa: E402

from runhealth.node import agent  # noqa: E402


def make_shards(folder: Path, files: int) -> None:
    for i in range(files):
        (folder / f"s{i:06d}.jsonl").write_text("".join(chat_line(100 + j, "stop") for j in range(10)))


def poll(folder: Path, state: dict) -> dict:
    req = {"op": "poll", "gpu": "off", "shards": {"globs": [str(folder / "*.jsonl")], "state": state}}
    reply = agent.handle(req)
    assert reply["ok"], reply
    return reply["shards"]["files"]


def cursors(files: dict, state: dict) -> dict:
    """The next poll's state, as the store keeps it: an entry without a mark keeps the last one
    when its offset did not move (else it has none: the baseline's polls make no marks)."""
    out = {}
    for p, e in files.items():
        before = state.get(p) or {}
        kept = before.get("mark") if before.get("offset") == e["offset"] and not e["reset"] else None
        out[p] = {"inode": e["inode"], "offset": e["offset"], "mark": e.get("mark", kept)}
    return out


GROWS = {"idle": (0, 0), "live": (8, 200), "grow": (None, 1)}  # (shards that grow, None: all; lines each)


def timed(folder: Path, state: dict, rounds: int, kind: str) -> tuple[float, dict]:
    """Median CPU seconds of a poll from `state` (which each poll advances). CPU time, not wall:
    the poll runs in this process (no workers at this size), and CPU time is what other
    processes on a busy machine do not inflate."""
    times = []
    for _ in range(rounds):
        growing, lines = GROWS[kind]
        for p in sorted(state)[:growing]:
            with open(p, "a", encoding="utf-8") as f:
                f.write(chat_line(7, "length") * lines)
        t0 = time.process_time()
        files = poll(folder, state)
        times.append(time.process_time() - t0)
        state = cursors(files, state)
    return statistics.median(times), state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="runhealth-marks-") as tmp:
        folder = Path(tmp)
        make_shards(folder, args.files)
        state = {}
        while True:  # index everything first (a poll scans about 256 new shards at most)
            files = poll(folder, state)
            if len(state) == args.files and all(e["offset"] == e["size"] for e in files.values()):
                break
            state = cursors(files, state)
        check, mark = agent._replaced, agent._mark_entries
        results = {}
        for kind in GROWS:
            for name in ("baseline", "marks", "baseline", "marks"):  # interleaved: drift hits both
                agent._replaced, agent._mark_entries = (
                    (check, mark) if name == "marks" else ((lambda *a: False), (lambda *a: None))
                )
                median, state = timed(folder, state, args.rounds, kind)
                results.setdefault((kind, name), []).append(median)
        agent._replaced, agent._mark_entries = check, mark
    print(f"{args.files} shards x 10 lines, CPU time, median of {args.rounds} polls (twice each, the better kept)")
    rows = {}
    for kind in GROWS:
        base, marked = min(results[(kind, "baseline")]), min(results[(kind, "marks")])
        rows[kind] = {"baseline_ms": round(base * 1000, 1), "marks_ms": round(marked * 1000, 1)}
        rows[kind]["ratio"] = round(marked / base, 3)
        print(f"{kind:5s} baseline {base * 1000:8.1f} ms   marks {marked * 1000:8.1f} ms   ratio {marked / base:.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
