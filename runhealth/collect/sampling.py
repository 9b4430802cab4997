"""Uniform samples of completions across the fleet, and loop scoring of what was drawn.

The collector owns the node connections; this module decides how many lines each node draws
(in proportion to the lines it has counted, so the sample is uniform over the whole run),
builds each node's sample request, gathers the answers concurrently, and scores every drawn
tail for repetition loops (`runhealth.analysis.loops`) before a batch is stored.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from runhealth.analysis import loops
from runhealth.collect import scheduler
from runhealth.errors import one_line
from runhealth.remote.base import fan_out_calls
from runhealth.settings.config import NodeConfig

HEAD_CHARS = 400  # of each drawn completion's text: enough to recognise the answer
TAIL_CHARS = 4000  # enough for the loop scorer to see several periods of a long loop


def split_shares(weights: Mapping[str, int], n: int, rng: random.Random) -> dict[str, int]:
    """How many of `n` draws each node makes: multinomial in proportion to its counted lines."""
    names = [name for name, w in weights.items() if w > 0]
    shares = dict.fromkeys(names, 0)
    for name in rng.choices(names, weights=[weights[x] for x in names], k=n) if names else []:
        shares[name] += 1
    return shares


def sample_request(node: NodeConfig, n: int, seed: int, finish_reason: str | None, full_text: bool) -> dict[str, Any]:
    """The agent request drawing `n` complete lines of `node` uniformly."""
    return {
        "op": "sample",
        "globs": node.shards,
        "n": n,
        "seed": seed,
        "finish_reason": finish_reason,
        "full_text": full_text,
        "head_chars": HEAD_CHARS,
        "tail_chars": TAIL_CHARS,
        "prompt_path": node.prompt_path,
        "finish_reason_path": node.finish_reason_path,
        "completion_tokens_path": node.completion_tokens_path,
    }


def _call(
    request: Callable[[str, dict[str, Any]], dict[str, Any]], name: str, req: dict[str, Any]
) -> Callable[[], dict[str, Any]]:
    return lambda: request(name, req)


def draw(
    nodes: Mapping[str, NodeConfig],
    weights: Mapping[str, int],
    request: Callable[[str, dict[str, Any]], dict[str, Any]],
    n: int,
    finish_reason: str | None = None,
    full_text: bool = False,
    seed: int | None = None,
    not_completions: Mapping[str, int] | None = None,
) -> tuple[list[dict], int, dict[str, str]]:
    """Draw `n` completions uniformly across `nodes` (blocking; one request per node, concurrently).

    Args:
        nodes: name -> node config of every node that may be asked.
        weights: name -> lines the node has counted (complete and malformed).
        request: sends one request to a node and returns its reply (raises on failure).
        not_completions: name -> the node's counted lines that are no completion (malformed,
            blank and failed requests), taken off the lines its agent drew among.

    Returns:
        ``(samples, population, errors)``: each sample tagged with its node, the completions
        among the lines the nodes drew from (an agent's population counts every complete line;
        lines written since the last poll count as completions until a poll says otherwise),
        and name -> one-line error for nodes that failed.
    """
    rng = random.Random(seed)
    shares = split_shares(weights, n, rng)
    # Seeds are drawn here, in node order, so a seeded draw is repeatable (not in the threads).
    calls = {
        name: _call(request, name, sample_request(nodes[name], k, rng.randrange(2**31), finish_reason, full_text))
        for name, k in shares.items()
        if k > 0
    }
    results = fan_out_calls(calls, scheduler.pool_size(len(shares)))
    samples: list[dict] = []
    errors: dict[str, str] = {}
    population = 0
    for name, result in results.items():
        if isinstance(result, Exception):
            errors[name] = one_line(result)
            continue
        lines = int(result.get("population") or 0)
        population += max(0, lines - (not_completions or {}).get(name, 0))
        samples.extend(dict(s, node=name) for s in result.get("samples") or [])
    return samples, population, errors


def score_loops(samples: list[dict]) -> None:
    """Mark every sample ``is_loop`` (0/1) from the loop score of its text tail, in place."""
    for s in samples:
        s["is_loop"] = int(loops.loop_score(s.get("text_tail") or "")["is_loop"])
