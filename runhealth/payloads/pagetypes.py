"""The page payloads' types: one frozen dataclass per page_data row the collector writes (#31 item 3).

`pagedata.compute_all` builds these, `pagedata.encode` writes them as `typedjson.dump` does
(dataclasses as objects of their fields, tuples as lists) and `pagedata.get(store, name, Type)`
reads one back typed, checked field by field (`typedjson.load`): a row that does not fit its type
is logged and treated as missing, so the page computes on demand, as for a damaged row. The
JSON keys are the ones the untyped dicts had, so a store written by an earlier version still
reads. Tables stay column-wise (`Table`): their JSON writes and reads itself, shape checked, so
neither the write nor the read walks a fleet's ~10^5 GPU band values one by one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from runhealth.analysis import stats, whatif
from runhealth.records import LengthStopBucket, PollBucket
from runhealth.typedjson import TypedJsonError


class Table:
    """A table column-wise, as pandas takes it: `columns` (their order) and `data` {column: [values]}."""

    def __init__(self, columns: Sequence[str], data: Mapping[str, list[Any]]):
        self._columns = list(columns)
        self._data = data

    @property
    def columns(self) -> list[str]:
        return self._columns

    @property
    def data(self) -> Mapping[str, list[Any]]:
        return self._data

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "data": self.data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        """The table back from `to_json`'s object; ValueError when it is not one (a column
        unnamed, not a list, or of another length)."""
        columns, values = data["columns"], data["data"]
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise ValueError("columns must be a list of names")
        if not isinstance(values, Mapping) or set(values) != set(columns):
            raise ValueError("data must hold exactly the named columns")
        if not all(isinstance(values[c], list) for c in columns) or len({len(values[c]) for c in columns}) > 1:
            raise ValueError("each column must be a list, all of one length")
        return cls(columns, values)

    @classmethod
    def of_rows(cls, rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> Table:
        """Row dicts column-wise (a key a row lacks: None)."""
        return cls(columns, {c: [r.get(c) for r in rows] for c in columns})

    def __len__(self) -> int:
        """Its number of rows."""
        return len(self.data[self.columns[0]]) if self.columns else 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Table) and (self.columns, dict(self.data)) == (other.columns, dict(other.data))

    __hash__ = None  # type: ignore[assignment]  # mutable lists inside

    def __repr__(self) -> str:
        return f"Table({self.columns}, {len(self)} rows)"


@dataclasses.dataclass(frozen=True)
class RunLengths:
    """`run_lengths`: the run's length counts, with the histogram's bins and the CDF's points."""

    ceiling: int | None  # the configured ceiling it was computed for (None: detected)
    rows: stats.LengthHist  # the counts (JSON: its (tokens, finish_reason, estimated, count) rows)
    malformed: int  # lines that did not parse
    bins: tuple[tuple[int, int, int, int, int], ...]  # bin_start, bin_end, stop, at_ceiling, other
    cdf: tuple[tuple[int, float], ...]  # tokens, cum_fraction


GROUP_COLUMNS = ("group", "completions", "at_ceiling", "fraction", "lo", "hi", "ceiling", "drift")


class GroupRow(TypedDict):
    """One node's or shard's share at the ceiling (a row of `GroupTable.table`)."""

    group: str  # "node" or "node:path"
    completions: int
    at_ceiling: int
    fraction: float  # of the exact-length completions (else all)
    lo: float  # Wilson 95% interval
    hi: float
    ceiling: int | None  # its own detected ceiling, else the run's
    drift: bool  # its ceiling differs from the others'


@dataclasses.dataclass(frozen=True)
class GroupTable:
    """`groups:node`, `groups:shard`: truncation per group (GroupRow columns, GROUP_COLUMNS)."""

    ceiling: int | None  # the ceiling the page asks with: configured, else detected
    table: Table


class LengthHour(TypedDict):
    """One hour of `lengthtime.hourly`: its completions, percentiles (bin upper edges) and share at the ceiling."""

    bucket_unix: float
    completions: int
    at_ceiling: int
    backfill: int
    at_ceiling_fraction: float
    p50: int | None
    p90: int | None
    p99: int | None


@dataclasses.dataclass(frozen=True)
class LengthsOverTime:
    """`lengths_over_time`: per hour of the run, at `ceiling`."""

    ceiling: int | None
    rows: tuple[LengthHour, ...]


@dataclasses.dataclass(frozen=True)
class TruncationOverTime:
    """`truncation_over_time`: poll deltas per bucket and the length stops of each split at the ceiling."""

    interval_s: float  # the poll interval it was computed for
    ceiling: int | None
    bucket_s: float  # an hour, or a few polls while the run is short
    polls: tuple[PollBucket, ...]
    split: tuple[LengthStopBucket, ...]


@dataclasses.dataclass(frozen=True)
class WhatIfDefault:
    """`whatif`: the fit the Output lengths page opens with (new limit = 2 x the ceiling)."""

    ceiling: int
    limit: int
    hist_key: str  # stats.hist_digest of the histogram it was fitted to
    loop_sample: tuple[int, int] | None  # (loops, sampled), the fit's loop term
    result: dict[str, Any]  # whatif.WhatIf's to_json object (checked when read: `what_if`)

    def __post_init__(self) -> None:
        """A result that is no WhatIf is caught here, as the row is read (typedjson.load)."""
        try:
            whatif.WhatIf.from_json(self.result)
        except (KeyError, TypeError) as exc:
            raise TypedJsonError("result", f"not a WhatIf: {exc!r}") from exc

    @property
    def what_if(self) -> whatif.WhatIf:
        return whatif.WhatIf.from_json(self.result)


@dataclasses.dataclass(frozen=True)
class GpuWindow:
    """`gpu:<window>`: what the GPU page draws for one window, all nodes: the per-GPU series of a
    small run (`series`), else per-node bands per value and each limit's maximum per node."""

    since: float | None  # the window's start (None: the whole run)
    labels: tuple[str, ...]  # "node/gpu" of every GPU in the window
    series: Table | None  # records.LabelledGpuPoint columns; None: bands
    bands: dict[str, Table] | None  # value -> gpubands.COLUMNS table; None: series
    limits: dict[str, dict[str, float]]  # limit column -> node -> its maximum (bands only)


Payload = RunLengths | GroupTable | LengthsOverTime | TruncationOverTime | WhatIfDefault | GpuWindow
