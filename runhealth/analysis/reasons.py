"""Finish reasons as a bounded set of names: what a label, a table row or a stored key may hold.

A finish_reason is shard data and can be anything: 100,000 distinct values once gave /metrics
100,001 series (10.8 MB, 3.2 s a scrape, 1.5 GB of collector memory). Wherever a reason becomes
a name (a /metrics label, a key of the store's length tables, a row of the finish-reason table,
the CLI's list), it goes through here:

- the reasons the code knows (`KNOWN`) keep their names;
- any other is cut to `MAX_REASON_CHARS` with its control characters made visible (`clean`);
- of those others, the store keeps the first `MAX_STORED_OTHERS` it meets (`Namer`, at write
  time, when the counts to rank them by are not known yet) and a view keeps the `MAX_SHOWN_OTHERS`
  most frequent (`bounded`, `shown_names`);
- everything else is counted as `OTHER`, so totals stay exact: "other" carries what it replaces.

The store's part (`KNOWN`, `clean`, `Namer`) lives in runhealth/store/reasonnames.py, below the store
(which imports nothing from analysis); it is re-exported here, so the views use one module.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping

from runhealth.store.reasonnames import KNOWN, MAX_REASON_CHARS, MAX_STORED_OTHERS, MISSING, OTHER, Namer, clean

# Names of runhealth.store.reasonnames (the store's side, below the store) read here by the views.
__all__ = [
    "KNOWN",
    "MAX_REASON_CHARS",
    "MAX_SHOWN_OTHERS",
    "MAX_STORED_OTHERS",
    "MISSING",
    "OTHER",
    "Namer",
    "bounded",
    "clean",
    "shown_names",
]

MAX_SHOWN_OTHERS = 8  # distinct unknown reasons a label set, table or list shows


def shown_names(totals: Mapping[str, int], keep: int = MAX_SHOWN_OTHERS) -> dict[str, str]:
    """Raw reason -> the name shown, for the known reasons, `MISSING` and the `keep` most
    frequent others (ties by name); a reason absent from the answer counts as OTHER."""
    names = {r: (MISSING if r == "" else r) for r in totals if r in KNOWN or r in ("", MISSING, OTHER)}
    # the `keep` first of them all sorted by (-total, name), in one pass (a store of 100,000 reasons)
    others = heapq.nsmallest(keep, ((-n, r) for r, n in totals.items() if r not in names))
    names.update((r, clean(r)) for _n, r in others)
    return names


def bounded(counts: Mapping[str, int], keep: int = MAX_SHOWN_OTHERS) -> dict[str, int]:
    """`counts` (reason -> completions) with at most `keep` unknown reasons, the rest summed into
    OTHER; the total is unchanged. Most frequent first."""
    names = shown_names(counts, keep)
    out: Counter = Counter()
    for reason, n in counts.items():
        out[names.get(reason, OTHER)] += n
    return dict(out.most_common())
