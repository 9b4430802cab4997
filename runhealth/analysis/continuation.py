"""Continuation batches: measure what a higher max_tokens buys instead of modelling it.

Truncated completions, drawn uniformly from the shards with their full text, become OpenAI
Batch lines that ask the server to continue each partial answer up to the new limit
(``continue_final_message`` / ``add_generation_prompt`` as vLLM and SGLang take them). The
prompt must be in the shard line: standard chat-completion *output* has none, so a node can
say where its generator keeps it (``[[nodes]] prompt_path``, dotted, e.g. "request.messages"
or "metadata.prompt"); a missing prompt is reported by name, never silently skipped.
"""

from __future__ import annotations

from typing import Any

DEFAULT_PROMPT_FIELDS = '"prompt", "input", the last user message of "messages", or the same under "request" / "body"'


def messages_for(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat message list from a prompt string or an already-made message list."""
    if isinstance(prompt, list):
        return [dict(m) for m in prompt]
    return [{"role": "user", "content": prompt}]


def build(
    samples: list[dict[str, Any]],
    new_limit: int,
    ceiling: int,
    model: str | None,
    prompt_paths: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """Batch lines for the samples that have both prompt and text, and why the others do not.

    Args:
        samples: agent samples with full text (``prompt`` str or message list, ``text``, node,
            path, line_no).
        new_limit: the limit to measure; ``max_tokens`` of each request is new_limit - ceiling.
        model: the model name to request (``[run] continuation_model``); None leaves "" and says so.
        prompt_paths: node -> its configured prompt_path (for the message naming the field).

    Returns:
        ``{"lines": [...], "missing_prompt": {node: count}, "problems": [sentence, ...]}``;
        ``custom_id`` is ``node:path:line`` (unique across nodes with the same paths).
    """
    budget = int(new_limit) - int(ceiling)
    out: dict[str, Any] = {"lines": [], "missing_prompt": {}, "problems": []}
    if budget <= 0:
        out["problems"].append(
            f"The new limit {new_limit:,} is not above the ceiling {ceiling:,}: nothing to continue."
        )
        return out
    seen: set[str] = set()
    for s in samples:
        if s.get("prompt") is None or s.get("text") is None:
            node = str(s.get("node"))
            out["missing_prompt"][node] = out["missing_prompt"].get(node, 0) + 1
            continue
        custom_id = f"{s.get('node')}:{s.get('path')}:{s.get('line_no')}"
        if custom_id in seen:  # the same line drawn twice: one request is enough
            continue
        seen.add(custom_id)
        body = {
            "model": model or "",
            "messages": messages_for(s["prompt"]) + [{"role": "assistant", "content": s["text"]}],
            "max_tokens": budget,
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        out["lines"].append({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})
    paths = prompt_paths or {}
    for node, n in sorted(out["missing_prompt"].items()):
        where = (
            f'prompt_path = "{paths[node]}" found nothing there'
            if paths.get(node)
            else f"no prompt in the line (looked for {DEFAULT_PROMPT_FIELDS}); set [[nodes]] prompt_path "
            "to where your generator keeps it"
        )
        out["problems"].append(f"{node}: {n} truncated sample(s) left out: {where}.")
    if not model:
        out["problems"].append('No [run] continuation_model set: each body has "model": "" to fill in.')
    return out
