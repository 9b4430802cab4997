"""Tests for runhealth.analysis.loops: synthetic loops vs long varied reasoning text."""

import random

from runhealth.analysis.loops import find_period, loop_score, loop_share

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ter",
    "an",
    "zu",
    "pre",
    "dis",
    "on",
    "ve",
    "rat",
    "sol",
    "qui",
    "bre",
    "ment",
    "ax",
    "ol",
    "ur",
    "fin",
    "gra",
    "ho",
    "ly",
    "tion",
    "es",
]
# Stock phrases real reasoning reuses, so varied text is not unrealistically free of repeats.
_OPENERS = ["let me check the", "so we have", "now consider the", "on the other hand", "this means that"]
_FUNCTION = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "that",
    "for",
    "with",
    "so",
    "we",
    "this",
    "it",
    "as",
    "by",
    "then",
    "but",
    "not",
    "are",
]


def _vocabulary(seed=7, size=4000):
    rng = random.Random(seed)
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(words)


VOCAB = _vocabulary()


def _sentence(rng):
    """A sentence: function words mixed with content pseudo-words, numbers, punctuation."""
    words = []
    for _ in range(rng.randint(6, 22)):
        roll = rng.random()
        if roll < 0.35:
            words.append(rng.choice(_FUNCTION))
        elif roll < 0.9:
            words.append(rng.choice(VOCAB))
        else:
            words.append(str(rng.randint(0, 10 ** rng.randint(1, 5))))
    if rng.random() < 0.3:
        words.insert(rng.randint(1, len(words) - 1), ",")
    if rng.random() < 0.25:
        words.insert(0, rng.choice(_OPENERS))
    text = " ".join(words).replace(" ,", ",")
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "?", ":"])


def varied_text(seed, chars=6000):
    """Long non-repeating reasoning-like text with paragraphs."""
    rng = random.Random(seed)
    parts = []
    while sum(len(p) for p in parts) < chars:
        parts.append(" ".join(_sentence(rng) for _ in range(rng.randint(2, 6))) + "\n\n")
    return "".join(parts)


def paragraph_loop(seed, chars=6000):
    rng = random.Random(seed)
    para = " ".join(_sentence(rng) for _ in range(rng.randint(1, 5))) + "\n\n"
    return varied_text(seed + 1000, 1500) + para * (chars // len(para) + 1)


def varied_sentence_loop(seed, chars=6000):
    """One sentence repeated with a changing number and an occasional swapped word."""
    rng = random.Random(seed)
    words = _sentence(rng).split()
    out = [varied_text(seed + 2000, 1000)]
    while sum(len(p) for p in out) < chars:
        w = list(words)
        w[rng.randrange(len(w))] = str(rng.randint(0, 999))
        if rng.random() < 0.3:
            w[rng.randrange(len(w))] = rng.choice(VOCAB)
        out.append(" ".join(w) + " ")
    return "".join(out)


def reconsider_loop(seed, chars=6000):
    """The "wait, let me reconsider" cycle: same few steps, numbers drifting."""
    rng = random.Random(seed)
    steps = [_sentence(rng) for _ in range(rng.randint(2, 4))]
    out = [varied_text(seed + 3000, 1200)]
    while sum(len(p) for p in out) < chars:
        out.append("Wait, let me reconsider. ")
        for step in steps:
            out.append(step.replace(".", f" {rng.randint(1, 60)}.") + " ")
        out.append(f"So the answer is {rng.randint(1, 99)}. Hmm, that does not look right.\n")
    return "".join(out)


LOOP_MAKERS = (paragraph_loop, varied_sentence_loop, reconsider_loop)


def test_separates_loops_from_varied_text():
    loops = [LOOP_MAKERS[i % 3](i) for i in range(42)]
    varied = [varied_text(100 + i) for i in range(42)]
    caught = sum(loop_score(t)["is_loop"] for t in loops)
    false_alarms = sum(loop_score(t)["is_loop"] for t in varied)
    assert caught >= 0.95 * len(loops), caught
    assert false_alarms <= 0.05 * len(varied), false_alarms


def test_scores_are_in_range_and_explain_the_call():
    loop = loop_score(paragraph_loop(1))
    prose = loop_score(varied_text(1))
    assert loop["compress_ratio"] < prose["compress_ratio"]
    assert loop["repeated_ngram_share"] > 0.5 > prose["repeated_ngram_share"]
    assert 0 < loop["compress_ratio"] <= 1.0 and 0.0 <= prose["repeated_ngram_share"] <= 1.0


def test_period_of_an_exact_paragraph_loop():
    para = "The quick check of step 4 gives 17, so we go back to step 2 and try again. "
    assert find_period(("intro " * 5) + para * 40) == len(para)
    assert loop_score(para * 40)["period_chars"] == len(para)
    assert find_period(varied_text(3)) is None


def test_short_or_empty_text_is_not_a_loop():
    assert loop_score("")["is_loop"] is False
    assert loop_score("ha " * 30)["is_loop"] is False
    assert loop_score(None)["compress_ratio"] == 1.0


def test_loop_share_with_wilson_interval():
    texts = [paragraph_loop(i) for i in range(3)] + [varied_text(i) for i in range(7)]
    share = loop_share(texts)
    assert (share["n"], share["loops"]) == (10, 3)
    assert share["fraction"] == 0.3
    lo, hi = share["interval"]
    assert lo < 0.3 < hi
    assert loop_share([]) == {"n": 0, "loops": 0, "fraction": None, "interval": (0.0, 1.0)}
