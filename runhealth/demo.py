"""The demo run: what `streamlit run app.py` shows when nothing is configured.

A simulator thread writes JSONL shards into the cache folder the way a real generation
script would (OpenAI chat-completion lines with reasoning text, ~2.4K tokens mean, ~18% cut
at a 4096-token ceiling, some of those stuck in repetition loops, a few context-window stops
and malformed lines), at the rate of 7 GPUs making ~25K tok/s together. runhealth then reads
those shards through the same agent and local transport a real node uses; only the GPU
telemetry is simulated (the agent's `gpu = "demo"` mode), and every page says DEMO.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import sys
import threading
import time
from pathlib import Path

from runhealth.config import NodeConfig, RunConfig, cache_dir

CEILING = 4096
LOG_MEDIAN = math.log(2326)  # median completion of the seed run
LOG_SIGMA = 0.62  # gives ~18% of true lengths above 4096
WORKERS = 7
TOKENS_PER_S_PER_WORKER = 3500.0
BACKLOG_COMPLETIONS = 4000  # "the run started a while ago"
LOOP_SHARE_OF_TRUNCATED = 0.3

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "ve", "zo", "pri", "sta", "qua", "den", "tor", "gal", "fen",
              "bis", "mor", "cal", "tri", "pho"]
_CONNECTIVES = ["so", "then", "therefore", "but", "because", "which means", "and", "hence", "now", "first"]


def demo_config(base: Path | None = None) -> RunConfig:
    """The built-in demo run: two local nodes (4 + 3 simulated GPUs) over the simulator's shards."""
    base = base or cache_dir() / "demo"
    shard_dir = base / "shards"
    nodes = [
        NodeConfig(name="demo-node-1", host="local", shards=[str(shard_dir / "node1-*.jsonl")],
                   python=sys.executable, gpu="demo", demo_gpus=4),
        NodeConfig(name="demo-node-2", host="local", shards=[str(shard_dir / "node2-*.jsonl")],
                   python=sys.executable, gpu="demo", demo_gpus=3),
    ]
    return RunConfig(name="demo-run", nodes=nodes, target_completions=902087, interval_s=5.0,
                     store_path=str(base / "demo.sqlite3"), source="<built-in demo>", demo=True)


class Simulator:
    """Appends completions to the demo shards from a background thread."""

    def __init__(self, base: Path | None = None, seed: int | None = None, speedup: float = 1.0):
        self.shard_dir = (base or cache_dir() / "demo") / "shards"
        self.rng = random.Random(seed)
        self.speedup = speedup
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_file = None
        self._counter = 0
        self._pool: list[str] = []

    def start(self) -> bool:
        """Start writing; False when another process already simulates into this folder."""
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.shard_dir.parent / "simulator.lock", "w")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        if not any(self.shard_dir.glob("*.jsonl")):
            self.write_backlog(BACKLOG_COMPLETIONS)
        self._thread = threading.Thread(target=self._run, name="runhealth-demo-sim", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def shard_path(self, worker: int) -> Path:
        node = 1 if worker < 4 else 2
        return self.shard_dir / f"node{node}-gpu{worker}.jsonl"

    def write_backlog(self, n: int) -> None:
        per_worker = [[] for _ in range(WORKERS)]
        for _ in range(n):
            per_worker[self.rng.randrange(WORKERS)].append(self.completion_line())
        for worker, lines in enumerate(per_worker):
            with open(self.shard_path(worker), "a", encoding="utf-8") as f:
                f.writelines(lines)

    def _run(self) -> None:
        # Each worker finishes a completion every mean_tokens / tok_s seconds on average.
        rate_per_worker = TOKENS_PER_S_PER_WORKER / 2400.0 * self.speedup
        last = time.monotonic()
        while not self._stop.wait(0.5):
            now = time.monotonic()
            elapsed, last = now - last, now
            for worker in range(WORKERS):
                n = _poisson(self.rng, rate_per_worker * elapsed)
                if n:
                    with open(self.shard_path(worker), "a", encoding="utf-8") as f:
                        f.writelines(self.completion_line() for _ in range(n))

    def completion_line(self) -> str:
        """One JSONL line as a generation script would write it."""
        self._counter += 1
        rng = self.rng
        if rng.random() < 0.0005:
            return '{"id": "broken", "choices": [{"message": {"content": "half a rec\n'  # malformed
        true_len = int(math.exp(rng.gauss(LOG_MEDIAN, LOG_SIGMA)))
        finish, tokens = ("stop", max(true_len, 8))
        if true_len >= CEILING:
            finish, tokens = "length", CEILING
        elif rng.random() < 0.003:
            finish = "length"  # the prompt filled the context window before the ceiling
        looping = finish == "length" and tokens == CEILING and rng.random() < LOOP_SHARE_OF_TRUNCATED
        reasoning = self.text(tokens * 3 // 4, looping)
        answer = "" if finish == "length" else self.text(tokens // 4, False)
        record = {
            "id": f"gen-{os.getpid()}-{self._counter}",
            "object": "chat.completion",
            "model": "Qwen3.6-27B",
            "prompt": self.text(rng.randint(20, 120), False),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer,
                                                 "reasoning_content": reasoning},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": rng.randint(40, 900), "completion_tokens": tokens},
        }
        return json.dumps(record) + "\n"

    def text(self, tokens: int, looping: bool) -> str:
        """About 4 characters per token of varied pseudo-prose; a loop repeats one passage."""
        target_chars = tokens * 4
        if looping:
            head = self._prose(target_chars // 2)
            passage = "Wait, let me reconsider the " + self._prose(160) + " "
            return head + " " + passage * max(1, (target_chars - len(head)) // len(passage))
        return self._prose(target_chars)

    def _prose(self, chars: int) -> str:
        # Drawing from a pool of pre-made sentences keeps the writer cheap (~10 KB per line).
        if not self._pool:
            self._pool = [self._sentence() for _ in range(6000)]
        out, size = [], 0
        while size < chars:
            batch = self.rng.choices(self._pool, k=max(1, (chars - size) // 60 + 1))
            out.extend(batch)
            size += sum(map(len, batch))
        return "".join(out)[:chars]

    def _sentence(self) -> str:
        rng = self.rng
        words = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 3))) for _ in range(rng.randint(5, 14))]
        words.insert(rng.randrange(len(words)), rng.choice(_CONNECTIVES))
        if rng.random() < 0.3:
            words.append(str(rng.randint(2, 9999)))
        return " ".join(words).capitalize() + rng.choice([". ", ". ", "? ", ": "])


def _poisson(rng: random.Random, lam: float) -> int:
    """Knuth's method: fine for the small rates here."""
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
