"""Shards in each published output format (issue #39), written from each provider's public docs.

Every line is built from a generated outcome (finish kind, token count, prompt tokens, ID,
reasoning and answer text, failure reason); the truth (completions, cut stops, failed requests
by reason, token sums, finish reasons in the product's vocabulary, prompt IDs) is added up from
those outcomes, never by reading the lines back. Each writer names the documentation its shape
follows; the field names are the ones those pages give.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

CEILING = 512  # max_tokens of the generated runs: a cut completion has exactly this many tokens
WORDS = 'the model wrote a long answer "quoted" here, then x + y = 3 so über naïve 中文 😀 length stop'.split(" ")


@dataclasses.dataclass
class Outcome:
    kind: str  # "stop", "cut", "filter" or "failed"
    tokens: int
    prompt_tokens: int
    pid: str
    reasoning: str
    answer: str
    reason: str = ""  # of a failed request: the label the scan must report


@dataclasses.dataclass
class Truth:
    completions: int = 0
    cut: int = 0
    tokens: int = 0
    finish: Counter = dataclasses.field(default_factory=Counter)  # mapped label -> completions
    failed: Counter = dataclasses.field(default_factory=Counter)  # reason -> failed requests
    ids: list = dataclasses.field(default_factory=list)  # IDs of completions (when the format has one)
    reasoned: int = 0  # cut completions with reasoning text
    never_answered: int = 0  # of those, with an empty answer
    failed_ids: list = dataclasses.field(default_factory=list)

    def add(self, other: Truth) -> None:
        self.completions += other.completions
        self.cut += other.cut
        self.tokens += other.tokens
        self.finish.update(other.finish)
        self.failed.update(other.failed)
        self.ids += other.ids
        self.reasoned += other.reasoned
        self.never_answered += other.never_answered
        self.failed_ids += other.failed_ids


@dataclasses.dataclass(frozen=True)
class Format:
    name: str
    doc: str
    write: Callable[[Outcome, int], dict[str, Any]]
    labels: dict[str, tuple[str, str]]  # kind -> (the format's own label, the product's label)
    failures: tuple[str, ...] = ()  # failure reasons the writer can produce
    has_id: bool = True
    has_reasoning: bool = False  # the writer puts the reasoning text where the format keeps it


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


# ---------------------------------------------------------------------------- writers
def _chat_body(o: Outcome, i: int, label: str) -> dict[str, Any]:
    return {
        "id": o.pid if o.pid.startswith("chatcmpl") else f"chatcmpl-{i:08x}",
        "object": "chat.completion",
        "created": 1764690000 + i,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": o.answer, "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": label,
            }
        ],
        "usage": {
            "prompt_tokens": o.prompt_tokens,
            "completion_tokens": o.tokens,
            "total_tokens": o.prompt_tokens + o.tokens,
        },
    }


def openai_chat(o: Outcome, i: int) -> dict[str, Any]:
    # https://platform.openai.com/docs/api-reference/chat/object
    return _chat_body(o, i, FORMATS["openai-chat"].labels[o.kind][0])


def openai_batch(o: Outcome, i: int) -> dict[str, Any]:
    # https://platform.openai.com/docs/guides/batch (output file: id, custom_id, response{status_code, request_id, body}, error)
    line: dict[str, Any] = {"id": f"batch_req_{i:08x}", "custom_id": o.pid}
    if o.kind != "failed":
        body = _chat_body(o, i, FORMATS["openai-batch"].labels[o.kind][0])
        return line | {"response": {"status_code": 200, "request_id": f"req_{i:08x}", "body": body}, "error": None}
    if o.reason == "rate_limit_exceeded":  # no response at all: the error object
        return line | {"response": None, "error": {"code": "rate_limit_exceeded", "message": "Rate limit reached"}}
    if o.reason == "server_error":
        err = {"message": "The server had an error", "type": "server_error", "param": None, "code": None}
        return line | {
            "response": {"status_code": 500, "request_id": f"req_{i:08x}", "body": {"error": err}},
            "error": None,
        }
    body = {"error": {"message": "Bad gateway"}}  # http_502: no code, no type in the body
    return line | {"response": {"status_code": 502, "request_id": f"req_{i:08x}", "body": body}, "error": None}


def _responses_body(o: Outcome, i: int) -> dict[str, Any]:
    # https://platform.openai.com/docs/api-reference/responses/object
    status = {"stop": "completed", "cut": "incomplete", "filter": "incomplete", "failed": "failed"}[o.kind]
    out: list[dict[str, Any]] = []
    if o.reasoning:
        out.append(
            {"id": f"rs_{i:08x}", "type": "reasoning", "summary": [{"type": "summary_text", "text": o.reasoning}]}
        )
    if o.kind != "failed":
        content = [{"type": "output_text", "text": o.answer, "annotations": []}]
        out.append({"id": f"msg_{i:08x}", "type": "message", "status": status, "role": "assistant", "content": content})
    incomplete = (
        {"reason": "max_output_tokens" if o.kind == "cut" else "content_filter"} if status == "incomplete" else None
    )
    usage = {
        "input_tokens": o.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": o.tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": o.prompt_tokens + o.tokens,
    }
    return {
        "id": o.pid if o.pid.startswith("resp_") else f"resp_{i:08x}",
        "object": "response",
        "created_at": 1764690000 + i,
        "status": status,
        "error": {"code": o.reason, "message": "failed"} if o.kind == "failed" else None,
        "incomplete_details": incomplete,
        "model": "gpt-5-mini",
        "output": out,
        "usage": None if o.kind == "failed" else usage,
    }


def openai_responses(o: Outcome, i: int) -> dict[str, Any]:
    return _responses_body(o, i)


def openai_batch_responses(o: Outcome, i: int) -> dict[str, Any]:
    # the Batch API's output for url /v1/responses: the Response object as response.body
    body = _responses_body(o, i)
    code = 500 if o.kind == "failed" else 200
    if o.kind == "failed":
        body = {"error": {"message": "failed", "type": "server_error", "code": o.reason}}
    return {
        "id": f"batch_req_{i:08x}",
        "custom_id": o.pid,
        "response": {"status_code": code, "request_id": f"r{i}", "body": body},
        "error": None,
    }


def _anthropic_message(o: Outcome, i: int) -> dict[str, Any]:
    # https://docs.anthropic.com/en/api/messages (content blocks: thinking, text; stop_reason; usage)
    content: list[dict[str, Any]] = []
    if o.reasoning:
        content.append({"type": "thinking", "thinking": o.reasoning, "signature": "EqQBCgIYAhIM" + "x" * 40})
    content.append({"type": "text", "text": o.answer})
    return {
        "id": o.pid if o.pid.startswith("msg_") else f"msg_{i:012x}",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": FORMATS["anthropic-messages"].labels[o.kind][0],
        "stop_sequence": None,
        "usage": {
            "input_tokens": o.prompt_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": o.tokens,
        },
    }


def anthropic_messages(o: Outcome, i: int) -> dict[str, Any]:
    return _anthropic_message(o, i)


def anthropic_batch(o: Outcome, i: int) -> dict[str, Any]:
    # https://docs.anthropic.com/en/api/retrieving-message-batch-results (custom_id, result.type)
    if o.kind != "failed":
        return {"custom_id": o.pid, "result": {"type": "succeeded", "message": _anthropic_message(o, i)}}
    if o.reason in ("expired", "canceled"):
        return {"custom_id": o.pid, "result": {"type": o.reason}}
    err = {"type": "error", "error": {"type": o.reason, "message": "Overloaded"}}
    return {"custom_id": o.pid, "result": {"type": "errored", "error": err}}


def gemini_batch(o: Outcome, i: int) -> dict[str, Any]:
    # https://ai.google.dev/gemini-api/docs/batch-mode (output lines: key, response | error)
    # https://ai.google.dev/api/generate-content#generatecontentresponse (candidates, usageMetadata)
    if o.kind == "failed":
        code = {"RESOURCE_EXHAUSTED": 429, "INTERNAL": 500}[o.reason]
        return {"key": o.pid, "error": {"code": code, "message": "failed", "status": o.reason}}
    parts: list[dict[str, Any]] = []
    if o.reasoning:
        parts.append({"text": o.reasoning, "thought": True})
    parts.append({"text": o.answer})
    # a thinking model: its thoughts count against maxOutputTokens, apart from the candidates'
    thoughts = o.tokens // 3 if o.reasoning else 0
    usage = {
        "promptTokenCount": o.prompt_tokens,
        "candidatesTokenCount": o.tokens - thoughts,
        "totalTokenCount": o.prompt_tokens + o.tokens,
    }
    if o.reasoning:
        usage["thoughtsTokenCount"] = thoughts
    cand = {
        "content": {"parts": parts, "role": "model"},
        "finishReason": FORMATS["gemini-batch"].labels[o.kind][0],
        "index": 0,
    }
    return {
        "key": o.pid,
        "response": {"candidates": [cand], "usageMetadata": usage, "modelVersion": "gemini-2.5-flash"},
    }


def gemini_vertex(o: Outcome, i: int) -> dict[str, Any]:
    # https://cloud.google.com/vertex-ai/generative-ai/docs/multimodal/batch-prediction-from-cloud-storage
    # (output lines: status "" on success, else the error; processed_time, request, response)
    request = {"contents": [{"role": "user", "parts": [{"text": f"Solve {i}"}]}]}
    line = {"status": "", "processed_time": "2024-11-01T18:13:16.826+00:00", "request": request}
    if o.kind == "failed":
        return line | {"status": 'Bad Request: {"error": {"code": 400, "message": "invalid"}}'}
    body = gemini_batch(o, i)["response"]
    body["candidates"][0]["finishReason"] = FORMATS["gemini-vertex"].labels[o.kind][0]
    return line | {"response": body}


def vllm_offline(o: Outcome, i: int) -> dict[str, Any]:
    # https://docs.vllm.ai/en/latest/api/vllm/outputs.html (RequestOutput / CompletionOutput as dicts)
    rng = random.Random(i)
    return {
        "request_id": o.pid,
        "prompt": "Solve the problem " + str(i),
        "prompt_token_ids": [rng.randrange(150000) for _ in range(o.prompt_tokens)],
        "outputs": [
            {
                "index": 0,
                "text": o.answer,
                "token_ids": [rng.randrange(150000) for _ in range(o.tokens)],
                "cumulative_logprob": None,
                "logprobs": None,
                "finish_reason": FORMATS["vllm-offline"].labels[o.kind][0],
                "stop_reason": None,
            }
        ],
        "finished": True,
    }


def tgi(o: Outcome, i: int) -> dict[str, Any]:
    # https://huggingface.github.io/text-generation-inference/ (POST /generate with details: true)
    details = {
        "finish_reason": FORMATS["tgi"].labels[o.kind][0],
        "generated_tokens": o.tokens,
        "seed": None,
        "prefill": [],
    }
    return {"generated_text": o.answer, "details": details}


def ollama(o: Outcome, i: int) -> dict[str, Any]:
    # https://github.com/ollama/ollama/blob/main/docs/api.md (/api/generate and /api/chat, final response)
    line: dict[str, Any] = {"model": "qwen3:8b", "created_at": "2025-10-04T19:22:45.499127Z"}
    if i % 2:
        line["message"] = {"role": "assistant", "content": o.answer, "thinking": o.reasoning}
    else:
        line |= {"response": o.answer, "thinking": o.reasoning}
    return line | {
        "done": True,
        "done_reason": FORMATS["ollama"].labels[o.kind][0],
        "context": [1, 2, 3, i] if not i % 2 else [],
        "total_duration": 10706818083,
        "load_duration": 6338219291,
        "prompt_eval_count": o.prompt_tokens,
        "prompt_eval_duration": 130079000,
        "eval_count": o.tokens,
        "eval_duration": 4232710000,
    }


def llama_cpp(o: Outcome, i: int) -> dict[str, Any]:
    # https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md (POST /completion)
    label = FORMATS["llama.cpp"].labels[o.kind][0]
    return {
        "index": 0,
        "content": o.answer,
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": "qwen3-8b-q4_k_m.gguf",
        "tokens_predicted": o.tokens,
        "tokens_evaluated": o.prompt_tokens,
        "generation_settings": {"n_predict": CEILING, "temperature": 0.8},
        "prompt": "<|im_start|>user\nSolve",
        "has_new_line": True,
        "truncated": False,
        "stop_type": label,
        "stopping_word": "</s>" if label == "word" else "",
        "tokens_cached": o.prompt_tokens + o.tokens,
        "timings": {"prompt_n": o.prompt_tokens, "predicted_n": o.tokens, "predicted_ms": 1234.5},
    }


def sglang(o: Outcome, i: int) -> dict[str, Any]:
    # https://docs.sglang.ai/basic_usage/native_api.html (/generate: text, meta_info)
    fr = {"type": "length", "length": CEILING} if o.kind == "cut" else {"type": "stop", "matched": 151645}
    meta = {"id": o.pid, "finish_reason": fr, "prompt_tokens": o.prompt_tokens, "completion_tokens": o.tokens}
    return {"text": o.answer, "meta_info": meta}


_STOP_CUT = {"stop": ("stop", "stop"), "cut": ("length", "length")}
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            "openai-chat",
            "https://platform.openai.com/docs/api-reference/chat/object",
            openai_chat,
            _STOP_CUT | {"filter": ("content_filter", "content_filter")},
        ),
        Format(
            "openai-batch",
            "https://platform.openai.com/docs/guides/batch",
            openai_batch,
            _STOP_CUT,
            ("rate_limit_exceeded", "server_error", "http_502"),
        ),
        Format(
            "openai-responses",
            "https://platform.openai.com/docs/api-reference/responses/object",
            openai_responses,
            {
                "stop": ("completed", "stop"),
                "cut": ("max_output_tokens", "length"),
                "filter": ("content_filter", "content_filter"),
            },
            ("server_error", "rate_limit_exceeded"),
            has_reasoning=True,
        ),
        Format(
            "openai-batch-responses",
            "https://platform.openai.com/docs/guides/batch",
            openai_batch_responses,
            {"stop": ("completed", "stop"), "cut": ("max_output_tokens", "length")},
            ("server_error",),
            has_reasoning=True,
        ),
        Format(
            "anthropic-messages",
            "https://docs.anthropic.com/en/api/messages",
            anthropic_messages,
            {
                "stop": ("end_turn", "end_turn"),
                "cut": ("max_tokens", "length"),
                "filter": ("stop_sequence", "stop_sequence"),
            },
            has_reasoning=True,
        ),
        Format(
            "anthropic-batch",
            "https://docs.anthropic.com/en/api/retrieving-message-batch-results",
            anthropic_batch,
            {"stop": ("end_turn", "end_turn"), "cut": ("max_tokens", "length")},
            ("overloaded_error", "expired", "canceled"),
            has_reasoning=True,
        ),
        Format(
            "gemini-batch",
            "https://ai.google.dev/gemini-api/docs/batch-mode",
            gemini_batch,
            {"stop": ("STOP", "stop"), "cut": ("MAX_TOKENS", "length"), "filter": ("SAFETY", "content_filter")},
            ("RESOURCE_EXHAUSTED", "INTERNAL"),
            has_reasoning=True,
        ),
        Format(
            "gemini-vertex",
            "https://cloud.google.com/vertex-ai/generative-ai/docs/multimodal/batch-prediction-from-cloud-storage",
            gemini_vertex,
            {"stop": ("STOP", "stop"), "cut": ("MAX_TOKENS", "length"), "filter": ("RECITATION", "content_filter")},
            ("status_error",),
            has_id=False,
            has_reasoning=True,
        ),
        Format("vllm-offline", "https://docs.vllm.ai/en/latest/api/vllm/outputs.html", vllm_offline, _STOP_CUT),
        Format(
            "tgi",
            "https://huggingface.github.io/text-generation-inference/",
            tgi,
            {"stop": ("eos_token", "stop"), "cut": ("length", "length"), "filter": ("stop_sequence", "stop_sequence")},
            has_id=False,
        ),
        Format(
            "ollama",
            "https://github.com/ollama/ollama/blob/main/docs/api.md",
            ollama,
            _STOP_CUT,
            has_id=False,
            has_reasoning=True,
        ),
        Format(
            "llama.cpp",
            "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md",
            llama_cpp,
            {"stop": ("eos", "stop"), "cut": ("limit", "length"), "filter": ("word", "stop")},
            has_id=False,
        ),
        Format("sglang", "https://docs.sglang.ai/basic_usage/native_api.html", sglang, _STOP_CUT, has_id=False),
    )
}
ID_PREFIX = {"openai-chat": "chatcmpl-", "openai-responses": "resp_", "anthropic-messages": "msg_"}


def outcomes(fmt: Format, n: int, seed: int) -> list[Outcome]:
    """`n` outcomes: ~20% cut at CEILING, some filtered (where the format has a filter label),
    ~5% failed (where it has failures), the rest natural stops; some with reasoning text."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if fmt.failures and r < 0.06:
            kind = "failed"
        elif r < 0.26:
            kind = "cut"
        elif "filter" in fmt.labels and r < 0.30:
            kind = "filter"
        else:
            kind = "stop"
        tokens = CEILING if kind == "cut" else 0 if kind == "failed" else rng.randint(1, CEILING - 1)
        pid = ID_PREFIX.get(fmt.name, "req-") + f"{seed}-{i:06d}"
        reasoning = _text(rng, rng.randint(3, 30)) if rng.random() < 0.5 else ""
        answer = "" if kind == "cut" and reasoning and rng.random() < 0.5 else _text(rng, rng.randint(2, 60))
        reason = rng.choice(fmt.failures) if kind == "failed" else ""
        out.append(Outcome(kind, tokens, rng.randint(5, 40), pid, reasoning, answer, reason))
    return out


def truth_of(fmt: Format, outs: list[Outcome]) -> Truth:
    t = Truth()
    for o in outs:
        if o.kind == "failed":
            t.failed[o.reason] += 1
            if fmt.has_id:
                t.failed_ids.append(o.pid)
            continue
        t.completions += 1
        t.tokens += o.tokens
        t.cut += o.kind == "cut"
        if o.kind == "cut" and fmt.has_reasoning and o.reasoning:
            t.reasoned += 1
            t.never_answered += not o.answer
        t.finish[fmt.labels[o.kind][1]] += 1
        if fmt.has_id:
            t.ids.append(o.pid)
    return t


def lines(fmt: Format, outs: list[Outcome]) -> list[str]:
    """The JSON lines, every third one raw UTF-8 (ensure_ascii=False), the rest json's default."""
    return [json.dumps(fmt.write(o, i), ensure_ascii=bool(i % 3)) for i, o in enumerate(outs)]


def write_shard(path: Path, name: str, n: int, seed: int = 1) -> Truth:
    fmt = FORMATS[name]
    outs = outcomes(fmt, n, seed)
    path.write_text("".join(line + "\n" for line in lines(fmt, outs)), encoding="utf-8")
    return truth_of(fmt, outs)
