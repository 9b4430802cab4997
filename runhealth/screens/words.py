"""Numbers in words, the one format for tiles, tables, exports' text and the CLI (plain str functions).

Counts carry thousands separators ("1,998"), shares one decimal ("2.6%"), token lengths at a
ceiling read as bounds ("≥ 4,096"), rates in thousands from 1,000 up ("9.4K", "13.0K": a column
never mixes "9,369" with "13.0K"), and anything missing is "N/A". The core words its screen
models with these (runhealth.screens), the CLI its text, and components/format.py re-exports them
for the pages, so a number reads the same on a tile, in a table and in a terminal. Ages are
`runhealth.ages.fmt_age` / `fmt_ago`. CSV and JSON exports keep raw numbers: only text is
formatted here.
"""

from __future__ import annotations

NA = "N/A"


def _missing(x: float | None) -> bool:
    return x is None or x != x  # NaN is the one value not equal to itself


def fmt_window(seconds: float) -> str:
    """A rate window's length in a label: "1 min", "15 min", "30 s"."""
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


def fmt_rate(x: float | None) -> str:
    """Tokens (or anything) per second: "950", "9.4K", "26.1K", "1,250.0K"."""
    if _missing(x):
        return NA
    assert x is not None
    return f"{x / 1000:,.1f}K" if abs(x) >= 1000 else f"{x:,.0f}"


def fmt_count(n: float | None) -> str:
    """A count of things (completions, lines, characters): "1,998"; missing is "N/A"."""
    if _missing(n):
        return NA
    assert n is not None
    return f"{n:,.0f}"


def fmt_share(x: float | None) -> str:
    """A share (0-1) as a percentage with one decimal, everywhere: "2.6%", "18.0%"."""
    if _missing(x):
        return NA
    assert x is not None
    return f"{100 * x:.1f}%"


def fmt_tokens(value: float | None, ceiling: float | None = None) -> str:
    """A token length; "≥ 4,096" when it sits at the run's ceiling, where completions were cut and
    the real value is only known to be at least that (percentiles, the longest one)."""
    if _missing(value):
        return NA
    assert value is not None
    return f"≥ {value:,.0f}" if ceiling is not None and value >= ceiling else f"{value:,.0f}"


def fmt_joules(j: float | None) -> str:
    """Energy with an SI prefix: "950 J", "41.2 kJ", "3.1 MJ", "1.2 GJ"."""
    if _missing(j):
        return NA
    assert j is not None
    for scale, unit in ((1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ")):
        if abs(j) >= scale:
            return f"{j / scale:,.1f} {unit}"
    return f"{j:,.0f} J"


def fmt_plural(n: int, word: str, plural: str | None = None) -> str:
    """A count with its noun, singular for one: "1 run", "3 runs", "1,024 shards"."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "N/A"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# Jargon the screens use, each in plain words for a newcomer (a tile's tooltip, a caption under a
# method line). Keys are matched case-insensitively in the text shown; the words avoid quotes and
# angle brackets, so they read the same inside an HTML title attribute.
GLOSSARY: dict[str, str] = {
    "assuming no loops": (
        "the share of cut completions stuck repeating themselves (which stay cut at any limit) is not "
        "measured yet (fewer than 20 sampled), so the range assumes none; sample more on the Samples page"
    ),
    "that loop": (
        "of the sampled completions cut at max_tokens, how many were repeating the same text over and over; "
        "a looping completion stays cut however high max_tokens goes"
    ),
    "(AIC)": (
        "the length distribution the data fits best among several standard shapes, picked by the Akaike "
        "information criterion (a fit score that penalises extra parameters)"
    ),
    "log-normal": "a standard bell-shaped curve over the logarithm of the length, used to extend the lengths past the cut",
    "back-test": (
        "the method is run on this run with the data cut lower than it really is, and its guess compared "
        "with what the run actually shows: how far off it was says how far to trust it"
    ),
    "Newcombe": "a standard way to put a 95% range on the difference between two shares",
    "Wilson": "a standard 95% range for a share that stays sensible for small counts and shares near 0 or 100%",
    "Welch": "a standard 95% range for the difference between two means that allows each run its own spread",
    "batch means": ("the range for an average rate, from how much the rate varied between groups of consecutive polls"),
    "tok/J": "tokens written per joule of GPU energy: higher is more output for the same power",
    "server says": "the throughput the inference servers report themselves (their /metrics), beside the count from the shards",
    "sw_power_cap": (
        "the GPU driver holds the clocks down to stay within the power limit; normal when a GPU is fully loaded"
    ),
}


def explain(text: str) -> list[str]:
    """ "term: plain words" for each GLOSSARY term found in `text`, in the glossary's order."""
    low = text.lower()
    return [f"{term}: {meaning}" for term, meaning in GLOSSARY.items() if term.lower() in low]


# What each tile's figure is, by the start of its label (the first that matches): its tooltip.
TILE_HELP: tuple[tuple[str, str], ...] = (
    ("Truncated · this sample", "share of the completions sampled in this batch that stopped at max_tokens"),
    ("Truncated · all", "share of every completion counted so far that stopped at max_tokens (exact, from the shards)"),
    ("Truncated that loop", "of the sampled completions cut at max_tokens, the share that repeat themselves"),
    ("Truncated", "share of completions that stopped exactly at max_tokens: their text was cut off mid-way"),
    ("Still truncated", "share of all completions that would still stop at the new max_tokens (an extrapolation)"),
    ("Tokens / s", "output tokens written per second, all nodes together, counted from the shards"),
    (
        "ETA",
        "time until the run is done at the 15-min average: expected_prompts distinct prompts answered when set and"
        " the shards carry prompt IDs (a prompt answered again is no progress), else target_completions written",
    ),
    ("Completions", "completions written to the shards so far (an exact count)"),
    ("Nodes", "nodes polled within the stale limit, out of all configured; stale and down ones named"),
    ("Data age", "how old the newest collected numbers are"),
    ("Numbers", "whether these figures still change (a finished run: they are final)"),
    ("Completed", "when the run wrote its last completion"),
    ("P50", "half of the completions are at most this many tokens long"),
    ("P90", "90% of the completions are at most this many tokens long"),
    ("P99", "99% of the completions are at most this many tokens long"),
    ("Mean / max", "the average completion length, and the longest one, in tokens"),
    ("Extra tokens", "how many more tokens each completion would write, on average, at the new limit"),
    ("ETA change", "how much later the run would reach its target at the new limit"),
)


def tile_help(label: str) -> str:
    """What the tile labelled `label` shows, in plain words ("" for a label not listed)."""
    return next((text for start, text in TILE_HELP if label.startswith(start)), "")
