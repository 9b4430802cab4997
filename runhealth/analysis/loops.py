"""Repetition-loop detector for the tails of truncated completions.

A model stuck in a loop repeats a paragraph, a sentence with small variations, or a
"wait, let me reconsider" cycle until max_tokens cuts it off; raising the limit never helps
those.  Two cheap signals on the last few thousand characters separate loops from long
non-repeating reasoning: zlib compressibility (a repeated block compresses to almost nothing)
and the share of word n-grams that already occurred earlier in the tail.  A rough period is
found by searching the text's final characters earlier in the tail.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from runhealth.analysis.stats import wilson_interval

NGRAM = 4
# Varied prose compresses to ~0.35-0.5 of its size with zlib and repeats few 4-grams.  A tail
# that compresses below LOOP_RATIO is a loop on that alone; up to MIXED_RATIO it also needs
# MIXED_NGRAM_SHARE of its 4-grams repeated (a sentence looping with small variations).
LOOP_RATIO = 0.20
MIXED_RATIO = 0.30
MIXED_NGRAM_SHARE = 0.30
MIN_TAIL_CHARS = 200
_WORD = re.compile(r"\w+", re.UNICODE)


def compress_ratio(text: str) -> float:
    """zlib-compressed size / raw size of the UTF-8 text (1.0 for empty text)."""
    raw = text.encode("utf-8", "replace")
    if not raw:
        return 1.0
    return len(zlib.compress(raw, 9)) / len(raw)


def repeated_ngram_share(text: str, n: int = NGRAM) -> float:
    """Share of word n-grams (lower-cased) that already occurred earlier in the text."""
    words = [w.lower() for w in _WORD.findall(text)]
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def find_period(text: str, probe_chars: int = 48) -> int | None:
    """Distance in characters back to the previous occurrence of the text's last characters.

    Returns:
        The period of an exact repetition of the final ``probe_chars`` characters, or None.
    """
    if len(text) < 2 * probe_chars:
        return None
    probe = text[-probe_chars:]
    pos = text.rfind(probe, 0, len(text) - 1)
    return (len(text) - probe_chars) - pos if pos >= 0 else None


def loop_score(text: str, tail_chars: int = 4000) -> dict:
    """Score the tail of a completion for repetition loops.

    Args:
        text: the completion text (or its tail).
        tail_chars: how many trailing characters to examine.

    Returns:
        ``{"is_loop": bool, "compress_ratio": float, "repeated_ngram_share": float,
        "period_chars": int | None}``; tails under 200 characters are never called loops.
    """
    tail = (text or "")[-tail_chars:]
    ratio = compress_ratio(tail)
    share = repeated_ngram_share(tail)
    looping = ratio <= LOOP_RATIO or (ratio <= MIXED_RATIO and share >= MIXED_NGRAM_SHARE)
    return {
        "is_loop": len(tail) >= MIN_TAIL_CHARS and looping,
        "compress_ratio": ratio,
        "repeated_ngram_share": share,
        "period_chars": find_period(tail),
    }


def loop_share(texts: Iterable[str]) -> dict:
    """Share of texts that are loops, with a 95% Wilson interval.

    Returns:
        ``{"n", "loops", "fraction" (None when n == 0), "interval": (lo, hi)}``.
    """
    flags = [loop_score(t)["is_loop"] for t in texts]
    n, loops = len(flags), sum(flags)
    return {"n": n, "loops": loops, "fraction": (loops / n) if n else None, "interval": wilson_interval(loops, n)}


def loop_sample(batch: Mapping[str, Any] | None) -> tuple[int, int]:
    """``(loops, sampled)`` among the truncated completions of a sample batch (a `SampleBatch`):
    the what-if's loop term (whatif.for_run)."""
    cut = [s for s in (batch["samples"] if batch else []) if s.get("finish_reason") == "length"]
    return sum(bool(s.get("is_loop")) for s in cut), len(cut)
