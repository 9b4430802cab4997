"""Shard files with known ground truth, in the schema a generation script writes."""

import json
import random


def chat_line(tokens: int, finish: str | None, text: str | None = None) -> str:
    """One OpenAI chat-completion line with `tokens` completion tokens."""
    choice = {"index": 0, "message": {"role": "assistant", "content": text if text is not None else "x" * 40}}
    if finish is not None:
        choice["finish_reason"] = finish
    return (
        json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "choices": [choice],
                "usage": {"prompt_tokens": 12, "completion_tokens": tokens},
            }
        )
        + "\n"
    )


def truth_rows(n: int, seed: int, ceiling: int = 4096, trunc_share: float = 0.18) -> list[tuple[int, str]]:
    """(tokens, finish_reason) rows: ~trunc_share at the ceiling, the rest stopped below it."""
    rng = random.Random(seed)
    return [
        (ceiling, "length") if rng.random() < trunc_share else (rng.randint(1, ceiling - 1), "stop") for _ in range(n)
    ]


def write_shard(path, rows, mode="w") -> None:
    with open(path, mode, encoding="utf-8") as f:
        f.writelines(chat_line(t, r) for t, r in rows)
