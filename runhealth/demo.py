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
import http.server
import json
import math
import os
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from runhealth.settings.config import NodeConfig, RunConfig, RunContext, cache_dir

CEILING = 4096
LOG_MEDIAN = math.log(2326)  # median completion of the seed run
LOG_SIGMA = 0.62  # gives ~18% of true lengths above 4096
WORKERS = 7
TOKENS_PER_S_PER_WORKER = 3500.0
BACKLOG_COMPLETIONS = 4000  # "the run started a while ago"
LOOP_SHARE_OF_TRUNCATED = 0.3

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "ta",
    "ve",
    "zo",
    "pri",
    "sta",
    "qua",
    "den",
    "tor",
    "gal",
    "fen",
    "bis",
    "mor",
    "cal",
    "tri",
    "pho",
]
_CONNECTIVES = ["so", "then", "therefore", "but", "because", "which means", "and", "hence", "now", "first"]


RUN_A, RUN_B = "demo-4096", "demo-8192"  # the seed run (finished) and its relaunch (live)
CEILING_B = 8192
TOKENS_PER_S_B = 3360.0  # longer completions decode a little slower: -4% tok/s per GPU
FINISHED_COMPLETIONS = 4000  # run A as stored: polled in FINISHED_POLLS steps, the last one 10 min ago
FINISHED_POLLS = 8
TARGET = 902087
# Per-line fields (#33): prompt IDs with a few answered twice (a retry) and a few never answered,
# datasets cut at different rates (their log-median shift), reasoning cut before or during the
# answer, a few completions at the ceiling mislabelled, and context-window stops whose prompt
# filled MAX_MODEL_LEN. The Simulator keeps the truth of each (FieldTruth).
MAX_MODEL_LEN = 32768
DATASETS = {"math": 0.2, "code": 0.1, "science": -0.1, "chat": -0.2}
GROUP_PATH = "metadata.dataset"
RETRY_SHARE = 0.01  # a line answers an earlier prompt again
SKIP_SHARE = 0.01  # a prompt is skipped: never answered
NO_ANSWER_SHARE_OF_TRUNCATED = 0.6  # cut while still reasoning; the rest are cut mid-answer
MISLABEL_SHARE_OF_TRUNCATED = 0.01  # at the ceiling, labelled "stop" or "tool_calls"
# Failed requests (#39), OpenAI Batch style: `response.status_code` 500 with an error body, ~0.5% of
# lines. The node agent counts them apart (node/formats.py): not completions, not answered prompts.
FAILED_SHARE = 0.005


def truth(ceiling: int) -> dict[str, float]:
    """What the simulator draws, exactly: the share of true lengths at or above `ceiling` (cut
    there) and the mean of min(length, ceiling) (context-window stops and malformed lines aside)."""
    z = (math.log(ceiling) - LOG_MEDIAN) / LOG_SIGMA
    above = 0.5 * math.erfc(z / math.sqrt(2))
    below_mean = math.exp(LOG_MEDIAN + LOG_SIGMA**2 / 2) * 0.5 * math.erfc(-(z - LOG_SIGMA) / math.sqrt(2))
    return {"cut_fraction": above, "mean_tokens": below_mean + ceiling * above}


def demo_config(
    base: Path | None = None,
    metrics_port: int | None = None,
    *,
    name: str = "demo-run",
    max_output_tokens: int | None = None,
    expected_prompts: int | None = None,
) -> RunConfig:
    """One demo run over the shards in `base`/shards: two local nodes (4 + 3 simulated GPUs).

    With `metrics_port`, node 1 reads an SGLang-style and node 2 a vLLM-style /metrics page
    served by the simulator, so the server-metrics path is exercised too.
    """
    base = base or cache_dir() / "demo"
    shard_dir = base / "shards"
    urls = {i: [f"http://127.0.0.1:{metrics_port}/node{i}/metrics"] if metrics_port else [] for i in (1, 2)}
    nodes = [
        NodeConfig(
            name="demo-node-1",
            host="local",
            shards=[str(shard_dir / "node1-*.jsonl")],
            python=sys.executable,
            gpu="demo",
            metrics_urls=urls[1],
            group_path=GROUP_PATH,
        ),
        NodeConfig(
            name="demo-node-2",
            host="local",
            shards=[str(shard_dir / "node2-*.jsonl")],
            python=sys.executable,
            gpu="demo",
            metrics_urls=urls[2],
            group_path=GROUP_PATH,
        ),
    ]
    return RunConfig(
        name=name,
        nodes=nodes,
        target_completions=TARGET,
        expected_prompts=expected_prompts or TARGET,
        max_model_len=MAX_MODEL_LEN,
        interval_s=5.0,
        max_output_tokens=max_output_tokens,
        store_path=str(base / "demo.sqlite3"),
    )


# How the demo configs are used: named as the built-in demo, 4 + 3 simulated GPUs, no webhooks.
DEMO_CONTEXT = RunContext(source="<built-in demo>", demo=True, demo_gpus={"demo-node-1": 4, "demo-node-2": 3})


def run_dir(name: str, base: Path | None = None) -> Path:
    """The demo run's folder: its shards and its store (one store file per run)."""
    return (base or cache_dir() / "demo") / "runs" / name


def demo_runs(base: Path | None = None, metrics_port: int | None = None) -> list[tuple[RunConfig, bool]]:
    """The built-in demo's two runs, as (config, finished): the live 8,192 relaunch first (the
    run pages open on), then the finished 4,096 run it replaced."""
    live = demo_config(run_dir(RUN_B, base), metrics_port, name=RUN_B, max_output_tokens=CEILING_B)
    done = demo_config(
        run_dir(RUN_A, base), name=RUN_A, max_output_tokens=CEILING, expected_prompts=FINISHED_COMPLETIONS
    )
    return [(live, False), (done, True)]


def live_simulator(base: Path | None = None, seed: int | None = None, speedup: float = 1.0) -> Simulator:
    """The simulator writing run B (the relaunch at 8,192)."""
    return Simulator(run_dir(RUN_B, base), seed=seed, speedup=speedup, ceiling=CEILING_B, tokens_per_s=TOKENS_PER_S_B)


class Simulator:
    """Appends completions to the demo shards from a background thread."""

    def __init__(
        self,
        base: Path | None = None,
        seed: int | None = None,
        speedup: float = 1.0,
        ceiling: int = CEILING,
        tokens_per_s: float = TOKENS_PER_S_PER_WORKER,
    ):
        self.shard_dir = (base or cache_dir() / "demo") / "shards"
        self.rng = random.Random(seed)
        self.speedup = speedup
        self.ceiling = ceiling
        self.tokens_per_s = tokens_per_s  # per worker (GPU)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_file: TextIO | None = None
        self._server: http.server.ThreadingHTTPServer | None = None
        self._counter = 0
        self.metrics_port: int | None = None
        # Per simulated node: tokens generated and requests finished, by finish reason.
        self.tokens_total = {1: 0, 2: 0}
        self.finished = {1: {"stop": 0, "length": 0}, 2: {"stop": 0, "length": 0}}
        self.lengths: dict[int, Counter] = {1: Counter(), 2: Counter()}  # generated tokens -> requests
        self.rate_tok_s = {1: tokens_per_s * 4, 2: tokens_per_s * 3}
        self._last_tokens = {1: 0, 2: 0}
        self._pool: list[str] = []
        self.fields = FieldTruth()

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
        self._serve_metrics()
        self._thread = threading.Thread(target=self._run, name="runhealth-demo-sim", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _serve_metrics(self) -> None:
        simulator = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                node = {"/node1/metrics": 1, "/node2/metrics": 2}.get(self.path)
                if node is None:
                    self.send_error(404)
                    return
                body = simulator.metrics_text(node).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # keep the dashboard's log quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.metrics_port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="runhealth-demo-metrics", daemon=True).start()

    def metrics_text(self, node: int) -> str:
        """Node 1 speaks SGLang's metric names, node 2 vLLM's."""
        label = 'model_name="Qwen3.6-27B"'
        if node == 1:
            return (
                "# HELP sglang:gen_throughput The generation throughput (token/s).\n"
                "# TYPE sglang:gen_throughput gauge\n"
                f"sglang:gen_throughput{{{label}}} {self.rate_tok_s[1]:.1f}\n"
                "# TYPE sglang:num_running_reqs gauge\n"
                f"sglang:num_running_reqs{{{label}}} {40 * 4}\n"
                "# TYPE sglang:num_queue_reqs gauge\n"
                f"sglang:num_queue_reqs{{{label}}} 12\n"
                "# TYPE sglang:token_usage gauge\n"
                f"sglang:token_usage{{{label}}} 0.87\n"
                "# TYPE sglang:generation_tokens_total counter\n"
                f"sglang:generation_tokens_total{{{label}}} {self.tokens_total[1]}\n"
                # As started with --collect-tokens-histogram --generation-tokens-buckets custom ... (README).
                + self._histogram("sglang:generation_tokens_histogram", 1, self.sglang_edges(), label)
            )
        done = self.finished[2]
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{label}}} {40 * 3}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{label}}} 7\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{label}}} 0.91\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{{{label}}} {self.tokens_total[2]}\n"
            "# TYPE vllm:request_success_total counter\n"
            + "".join(f'vllm:request_success_total{{finished_reason="{r}",{label}}} {n}\n' for r, n in done.items())
            + self._histogram("vllm:request_generation_tokens", 2, VLLM_EDGES, label)
            + self._histogram("vllm:request_max_num_generation_tokens", 2, VLLM_EDGES, label, asked=self.ceiling)
        )

    def sglang_edges(self) -> tuple[int, ...]:
        """SGLang's buckets as the README advises: edges at the ceiling - 1 and the ceiling."""
        return tuple(sorted({100, 500, 1000, 2000, self.ceiling // 2, self.ceiling - 1, self.ceiling}))

    def _histogram(self, name: str, node: int, edges: tuple[int, ...], label: str, asked: int | None = None) -> str:
        """A Prometheus histogram of the node's generated tokens per request (or, with `asked`,
        of the max_tokens every request asked for)."""
        now = dict.copy(self.lengths[node])  # one C call: the writer thread adds to it meanwhile
        lengths = {asked: sum(now.values())} if asked else now
        total = sum(lengths.values())
        lines = [f"# TYPE {name} histogram\n"]
        for edge in edges:
            below = sum(n for t, n in lengths.items() if t <= edge)
            lines.append(f'{name}_bucket{{le="{float(edge)}",{label}}} {below}\n')
        lines.append(f'{name}_bucket{{le="+Inf",{label}}} {total}\n')
        lines.append(f"{name}_count{{{label}}} {total}\n")
        lines.append(f"{name}_sum{{{label}}} {sum(t * n for t, n in lengths.items())}\n")
        return "".join(lines)

    def completions_per_s(self) -> float:
        """Completions per second of all workers together: their tok/s over the true mean length."""
        return WORKERS * self.tokens_per_s / truth(self.ceiling)["mean_tokens"]

    def shard_path(self, worker: int) -> Path:
        node = 1 if worker < 4 else 2
        return self.shard_dir / f"node{node}-gpu{worker}.jsonl"

    def write_backlog(self, n: int) -> None:
        per_worker: list[list[str]] = [[] for _ in range(WORKERS)]
        for _ in range(n):
            per_worker[self.rng.randrange(WORKERS)].append(self.completion_line())
        for worker, lines in enumerate(per_worker):
            with open(self.shard_path(worker), "a", encoding="utf-8") as f:
                f.writelines(lines)

    def _run(self) -> None:
        # Each worker finishes a completion every mean_tokens / tok_s seconds on average.
        rate_per_worker = self.completions_per_s() / WORKERS * self.speedup
        last = time.monotonic()
        while not self._stop.wait(0.5):
            now = time.monotonic()
            elapsed, last = now - last, now
            written = {1: 0, 2: 0}
            for worker in range(WORKERS):
                n = _poisson(self.rng, rate_per_worker * elapsed)
                if n:
                    node = 1 if worker < 4 else 2
                    lines = [self.completion_line(node) for _ in range(n)]
                    with open(self.shard_path(worker), "a", encoding="utf-8") as f:
                        f.writelines(lines)
            for node in (1, 2):
                written[node] = self.tokens_total[node] - self._last_tokens[node]
                self._last_tokens[node] = self.tokens_total[node]
                # An SGLang-style smoothed gauge over roughly the last 10 s.
                self.rate_tok_s[node] += 0.05 * (written[node] / max(elapsed, 1e-3) - self.rate_tok_s[node])

    def completion_line(self, node: int | None = None) -> str:
        """One JSONL line as a generation script would write it (counted for node's metrics)."""
        self._counter += 1
        rng = self.rng
        if rng.random() < 0.0005:
            return '{"id": "broken", "choices": [{"message": {"content": "half a rec\n'  # malformed
        if rng.random() < FAILED_SHARE:
            return self.failed_line()
        dataset = rng.choice(list(DATASETS))
        true_len = int(math.exp(rng.gauss(LOG_MEDIAN + DATASETS[dataset], LOG_SIGMA)))
        finish, tokens = ("stop", max(true_len, 8))
        prompt_tokens = rng.randint(40, 900)
        if true_len >= self.ceiling:
            finish, tokens = "length", self.ceiling
        elif rng.random() < 0.003:
            finish = "length"  # the prompt filled the context window before the ceiling
            prompt_tokens = MAX_MODEL_LEN - tokens
        looping = finish == "length" and tokens == self.ceiling and rng.random() < LOOP_SHARE_OF_TRUNCATED
        if node is not None:
            self.tokens_total[node] += tokens
            self.finished[node][finish] += 1
            self.lengths[node][tokens] += 1
        reasoning = self.text(tokens * 3 // 4, looping)
        answer = self.text(tokens // 4, False)
        if finish == "length" and rng.random() < NO_ANSWER_SHARE_OF_TRUNCATED:
            answer = ""  # cut while reasoning: it never answered
        if finish == "length" and tokens == self.ceiling and rng.random() < MISLABEL_SHARE_OF_TRUNCATED:
            finish = rng.choice(["stop", "tool_calls"])  # a server that mislabels the cut
        record = {
            "id": f"gen-{os.getpid()}-{self._counter}",
            "custom_id": self.fields.next_prompt(rng),
            "object": "chat.completion",
            "model": "Qwen3.6-27B",
            "prompt": self.text(rng.randint(20, 120), False),
            "metadata": {"dataset": dataset},
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer, "reasoning_content": reasoning},
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens},
        }
        self.fields.count(record, self.ceiling)
        return json.dumps(record) + "\n"

    def failed_line(self) -> str:
        """A failed request as OpenAI's Batch API writes it: status 500, an error body, no choices."""
        pid = self.fields.next_prompt(self.rng)
        self.fields.failed.append(pid)
        record = {
            "id": f"batch_req_{os.getpid()}_{self._counter}",
            "custom_id": pid,
            "response": {
                "status_code": 500,
                "request_id": f"req_{self._counter:08d}",
                "body": {
                    "error": {
                        "message": "The server had an error processing your request.",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                },
            },
            "error": None,
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


VLLM_EDGES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)  # vLLM's 1-2-5 defaults


class FieldTruth:
    """What the simulator wrote in the per-line fields, exactly (tests compare the store to it)."""

    def __init__(self) -> None:
        self.issued = 0  # prompt IDs handed out, the skipped ones included
        self.answers: dict[str, int] = {}  # prompt ID -> lines
        self.groups: dict[str, list[int]] = {}  # dataset -> [completions, length stops]
        self.group_cuts: dict[str, int] = {}  # dataset -> length stops at the ceiling (cut, stats.is_cut)
        self.never_answered = 0  # length stops at the ceiling with reasoning and no answer
        self.reasoned_at_ceiling = 0
        self.length_at_ceiling = 0
        self.mislabelled = 0
        self.context_stops = 0
        self.recent: list[str] = []  # the last prompts handed out, which a retry draws from
        self.failed: list[str] = []  # prompt IDs of failed requests (FAILED_SHARE), in order

    def next_prompt(self, rng: random.Random) -> str:
        if self.recent and rng.random() < RETRY_SHARE:
            return rng.choice(self.recent)  # a retry answers a recent prompt again
        if rng.random() < SKIP_SHARE:
            self.issued += 1  # this prompt is never answered
        self.issued += 1
        pid = f"prompt-{self.issued:07d}"
        self.recent = [*self.recent[-511:], pid]
        return pid

    def count(self, record: dict, ceiling: int) -> None:
        choice, usage = record["choices"][0], record["usage"]
        self.answers[record["custom_id"]] = self.answers.get(record["custom_id"], 0) + 1
        tokens, finish = usage["completion_tokens"], choice["finish_reason"]
        g = self.groups.setdefault(record["metadata"]["dataset"], [0, 0])
        g[0] += 1
        g[1] += finish == "length"
        if tokens >= ceiling and finish != "length":
            self.mislabelled += 1
        self.group_cuts.setdefault(record["metadata"]["dataset"], 0)
        if finish == "length" and tokens >= ceiling:
            self.length_at_ceiling += 1
            self.group_cuts[record["metadata"]["dataset"]] += 1
            self.reasoned_at_ceiling += 1  # every demo completion reasons
            self.never_answered += choice["message"]["content"] == ""
        if finish == "length" and tokens < ceiling and tokens + usage["prompt_tokens"] >= MAX_MODEL_LEN:
            self.context_stops += 1

    @property
    def answered(self) -> int:
        return len(self.answers)

    @property
    def answered_twice(self) -> int:
        return sum(1 for n in self.answers.values() if n > 1)


def _poisson(rng: random.Random, lam: float) -> int:
    """Knuth's method: fine for the small rates here."""
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
