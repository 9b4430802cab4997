"""Numbers in words for tiles and the CLI: rates, windows and byte sizes (plain str functions).

The core words its screen models with these (runhealth.screens); components/format.py
re-exports them for the pages, so a rate reads the same on a tile, in a table and in a terminal.
"""

from __future__ import annotations


def fmt_window(seconds: float) -> str:
    """A rate window's length in a label: "1 min", "15 min", "30 s"."""
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "N/A"
    return f"{x / 1000:,.1f}K" if x >= 10_000 else f"{x:,.0f}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "N/A"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
