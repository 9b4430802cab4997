"""What a poll reply means: the agent's `PollReply` (runhealth/node/wire.py) read into the
typed records the store writes.

The store persists and this module interprets: which shard updates a reply holds and what they
add (completions, tokens, exact-length stops, the hourly length rows), the node's status fields,
the GPU readings and their health/XID part, the server metrics the collector parsed, and the
rule for when a poll is backfill rather than throughput. The store writes one `PollRecord` in
one transaction. This module touches no database, so every rule here is testable on a reply
dict alone.
"""

from __future__ import annotations

import array
import base64
import binascii
import dataclasses
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from runhealth.node.wire import (
    MAX_FAILED_REASONS,
    CountRow,
    DiskEntry,
    FieldCounts,
    GpuDevice,
    HostInfo,
    PollReply,
    ShardEntry,
    count_rows,
)
from runhealth.records import LENGTH

_SURROGATE_RE = re.compile("[\ud800-\udfff]")
HOUR_S = 3600  # length_hourly's bucket
BINS_PER_DOUBLING = 16  # length_hourly's log bins: a bin is at most 4.4% wide


def bin_upper(tokens: int) -> int:
    """The upper edge of the log bin holding `tokens` (exact below 16 tokens)."""
    if tokens < 16:
        return int(tokens)
    return math.ceil(2 ** (math.ceil(math.log2(tokens) * BINS_PER_DOUBLING) / BINS_PER_DOUBLING))


class HourlyLengthRow(NamedTuple):
    """A poll's completions for its hour's `length_hourly` rows (analysis/lengthtime.py reads them).

    Lengths of completions that stopped by length are kept exactly (few distinct values, and the
    share at the ceiling must be exact); other lengths are their log bin's upper edge (`bin_upper`).
    """

    tokens: int
    by_length: int  # 1: finish_reason "length"
    estimated: int
    completions: int


@dataclasses.dataclass(frozen=True)
class FieldUpdate:
    """What one scan's lines said beyond (tokens, finish_reason) (node/fields.py, #33)."""

    id_hashes: tuple[int, ...]  # signed 64-bit, one per line with a prompt ID
    id_fields: tuple[str, ...]  # dotted paths the IDs were found at
    prompt_token_lines: int
    group_field: str | None
    # (label, completions, length stops, ((tokens, length stops), ...) or None: an older agent's)
    groups: tuple[tuple[str, int, int, tuple[tuple[int, int], ...] | None], ...]
    length_prompt_tokens: tuple[tuple[int, int, int], ...]  # (tokens, prompt tokens, length stops)
    no_answer: tuple[tuple[int, int], ...]  # (tokens, length stops that never answered)
    reasoned: tuple[tuple[int, int], ...]  # (tokens, length stops with reasoning)


def _pairs(rows: Any, width: int) -> tuple:
    return tuple(tuple(int(v) for v in r[:width]) for r in rows or [])


def id_hashes(text: str) -> tuple[int, ...]:
    """The base64 hashes of a FieldCounts as signed 64-bit integers (little-endian on the wire)."""
    raw = base64.b64decode(text or "", validate=True)
    if len(raw) % 8:
        raise ValueError(f"prompt ID hashes: {len(raw)} bytes is not a multiple of 8")
    out = array.array("q")
    out.frombytes(raw)
    if sys.byteorder == "big":
        out.byteswap()
    return tuple(out)


def _group_row(g: Any) -> tuple[str, int, int, tuple[tuple[int, int], ...] | None]:
    """One wire group [label, completions, length stops(, [[tokens, stops], ...])]; the 4th, when
    sent, must account for every `length` stop of the group (else the reply is refused)."""
    label, n, stops = utf8_text(str(g[0])), int(g[1]), int(g[2])
    if len(g) < 4 or g[3] is None:
        return label, n, stops, None  # an agent from before #41: the stops' token counts unknown
    by = _pairs(g[3], 2)
    if any(t < 0 or k < 0 for t, k in by) or sum(k for _, k in by) != stops:
        raise ValueError(f"group {label!r}: its length stops by tokens {list(by)!r} do not sum to {stops}")
    return label, n, stops, by


def field_update(part: FieldCounts | None) -> FieldUpdate | None:
    """A reply entry's "fields" part as a FieldUpdate (None when it has none)."""
    if not part:
        return None
    try:
        hashes = id_hashes(part.get("ids") or "")
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"prompt ID hashes: {exc}") from None
    return FieldUpdate(
        id_hashes=hashes,
        id_fields=tuple(utf8_text(str(k)) for k in part.get("id_fields") or []),
        prompt_token_lines=int(part.get("prompt_token_lines") or 0),
        group_field=_opt_text(part.get("group_field")),
        groups=tuple(_group_row(g) for g in part.get("groups") or []),
        length_prompt_tokens=_pairs(part.get("length_prompt_tokens"), 3),
        no_answer=_pairs(part.get("no_answer"), 2),
        reasoned=_pairs(part.get("reasoned"), 2),
    )


@dataclasses.dataclass(frozen=True)
class ShardUpdate:
    """One shard's scan result in a poll reply.

    offset_from is None when the reply does not say where the scan started (then it is taken
    to continue the stored counts); the store applies an update only when it continues them
    or is a reset (docs/design.md section 2).
    """

    path: str
    reset: bool
    offset_from: int | None
    inode: int | None
    offset: int
    size: int | None
    malformed: int
    blank_lines: int
    tokens: int
    error: str | None
    counts: tuple[CountRow, ...]
    problem: str | None = None  # the shard counts, but something in it is skipped or stuck
    mark: str | None = None  # the content mark at `offset` (sent back so the agent can check it)
    replaced: bool = False  # a reset because the content changed under the same inode
    fields: FieldUpdate | None = None  # per-line fields, from a shard whose lines have them
    # Failed requests of this scan (#39): (reason, count) and the failed lines' prompt-ID hashes;
    # none of them is in `counts`, `tokens` or `fields`.
    failed: tuple[tuple[str, int], ...] = ()
    failed_ids: tuple[int, ...] = ()

    @property
    def failed_total(self) -> int:
        return sum(n for _r, n in self.failed)

    @property
    def shown_error(self) -> str | None:
        """What the shard row's error column holds: why it cannot be read, else its problem."""
        return self.error or self.problem

    @property
    def completions(self) -> int:
        return sum(r.count for r in self.counts)

    @property
    def length_stops(self) -> int:
        """Completions that stopped at the token limit (estimated token counts included)."""
        return sum(r.count for r in self.counts if r.finish_reason == LENGTH)

    def hourly_rows(self) -> dict[tuple[int, int, int], int]:
        """(tokens or bin edge, by_length, estimated) -> completions: this update's HourlyLengthRows."""
        out: dict[tuple[int, int, int], int] = {}
        for r in self.counts:
            by_length = int(r.finish_reason == LENGTH)
            key = (r.tokens if by_length else bin_upper(r.tokens), by_length, int(bool(r.estimated)))
            out[key] = out.get(key, 0) + r.count
        return out

    def exact_length_stops(self) -> dict[int, int]:
        """Token count -> `length` stops with an exact (not estimated) token count."""
        out: dict[int, int] = {}
        for r in self.counts:
            if r.finish_reason == LENGTH and not r.estimated:
                out[r.tokens] = out.get(r.tokens, 0) + r.count
        return out


def utf8_text(text: str) -> str:
    """`text` with any lone surrogate as U+FFFD. The agent sends none (it escapes file names and
    cleans line text); this keeps a reply from another agent from failing the whole poll."""
    return text if text.isascii() else _SURROGATE_RE.sub("\ufffd", text)


def _opt_text(text: str | None) -> str | None:
    return None if text is None else utf8_text(text)


class ReplyError(ValueError):
    """A poll reply that does not keep the wire contract (runhealth/node/wire.py): the poll is refused."""


def failed_part(path: str, entry: ShardEntry) -> tuple[tuple[tuple[str, int], ...], tuple[int, ...]]:
    """A file entry's failed requests (#39): ((reason, count), ...) and the failed prompt-ID hashes.

    An older agent sends neither key: no failed requests. A malformed value raises ReplyError
    naming the shard and the key (the poll then writes nothing, so no count is half applied).
    """
    rows = entry.get("failed")
    if rows is None:
        rows = []
    if not isinstance(rows, list):
        raise ReplyError(f"shard {path}: 'failed' must be a list of [reason, count] pairs, not {type(rows).__name__}")
    out: dict[str, int] = {}
    for row in rows:
        ok = isinstance(row, list | tuple) and len(row) == 2 and isinstance(row[0], str) and row[0]
        count = row[1] if ok else None
        if not ok or not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ReplyError(f"shard {path}: 'failed' holds {row!r}: each must be [reason text, count >= 0]")
        reason = utf8_text(row[0])
        out[reason] = out.get(reason, 0) + count
    if len(out) > MAX_FAILED_REASONS + 1:  # the agent's reasons and its "other"
        raise ReplyError(f"shard {path}: 'failed' has {len(out)} reasons, more than {MAX_FAILED_REASONS} and 'other'")
    ids = entry.get("failed_ids")
    if ids is not None and not isinstance(ids, str):
        raise ReplyError(f"shard {path}: 'failed_ids' must be base64 text, not {type(ids).__name__}")
    try:
        hashes = id_hashes(ids or "")
    except (binascii.Error, ValueError) as exc:
        raise ReplyError(f"shard {path}: 'failed_ids': {exc}") from None
    if len(hashes) > sum(out.values()):
        raise ReplyError(f"shard {path}: 'failed_ids' holds {len(hashes)} IDs for {sum(out.values())} failed lines")
    return tuple((r, n) for r, n in out.items() if n), hashes


def shard_update(path: str, entry: ShardEntry) -> ShardUpdate:
    """A reply's file entry as a ShardUpdate (count fields as integers, as the store adds them)."""
    failed, failed_ids = failed_part(path, entry)
    return ShardUpdate(
        failed=failed,
        failed_ids=failed_ids,
        path=utf8_text(path),
        reset=bool(entry.get("reset")),
        offset_from=entry.get("offset_from"),
        inode=entry.get("inode"),
        offset=entry.get("offset", 0),
        size=entry.get("size", 0),
        malformed=int(entry.get("malformed") or 0),
        blank_lines=int(entry.get("blank_lines") or 0),
        tokens=int(entry.get("tokens") or 0),
        error=_opt_text(entry.get("error")),
        problem=_opt_text(entry.get("problem")),
        mark=entry.get("mark"),
        replaced=bool(entry.get("replaced")),
        fields=field_update(entry.get("fields")),
        counts=tuple(
            CountRow(int(r.tokens), _opt_text(r.finish_reason), int(r.estimated), int(r.count))
            for r in count_rows(entry.get("counts") or [])
        ),
    )


def with_reason_names(record: PollRecord, name: Callable[[str | None], str | None]) -> PollRecord:
    """`record` with every count row's finish_reason replaced by `name(reason)` (the store's
    bounded names, runhealth.store.reasonnames.Namer); counts unchanged."""
    shards = tuple(
        dataclasses.replace(u, counts=tuple(r._replace(finish_reason=name(r.finish_reason)) for r in u.counts))
        for u in record.shards
    )
    return dataclasses.replace(record, shards=shards)


def hourly_length_rows(updates: Iterable[ShardUpdate]) -> list[HourlyLengthRow]:
    """The hourly length rows of the shard updates a poll applied, summed over them."""
    total: dict[tuple[int, int, int], int] = {}
    for update in updates:
        for key, n in update.hourly_rows().items():
            total[key] = total.get(key, 0) + n
    return [HourlyLengthRow(*key, n) for key, n in total.items()]


def scanned_bytes(entry: ShardEntry) -> int:
    """Bytes the agent read for this shard in this poll."""
    return max(0, int(entry.get("offset") or 0) - int(entry.get("offset_from") or 0))


@dataclasses.dataclass(frozen=True)
class GpuHealthRow:
    """One GPU's health readings (without XIDs) and the critical XIDs since the last poll."""

    index: int | None
    health: dict[str, Any]
    xids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    """The node-level fields of a successful poll, as the node's status row holds them."""

    agent_ms: float | None
    node_time_unix: float | None
    hostname: str | None
    loadavg: list[float] | None
    gpus_found: int
    gpu_source: str | None
    gpu_error: str | None
    gpu_simulated: bool
    shards_matched: int | None
    unmatched_globs: list[str]
    pending_bytes: int
    disk: dict[str, DiskEntry]
    metrics_errors: dict[str, str]  # URL -> why its /metrics could not be read


@dataclasses.dataclass(frozen=True)
class PollRecord:
    """Everything the store writes for one successful poll reply."""

    shards: tuple[ShardUpdate, ...]
    gpus: tuple[GpuDevice, ...]
    health: tuple[GpuHealthRow, ...]
    host: HostInfo | None
    status: NodeStatus
    scanned_bytes: int  # over every file entry, for the node's indexing speed
    # The node's inference-server metrics (name -> value, endpoints merged), parsed by the
    # collector (analysis/servermetrics.py); empty when it has none or they were not parsed.
    server_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def pending_bytes(self) -> int:
        return self.status.pending_bytes


def read_poll(reply: PollReply, server_metrics: Mapping[str, float] | None = None) -> PollRecord:
    """Interpret one ok poll reply (a missing part reads as empty, as older agents send);
    `server_metrics`: its /metrics texts as values (the collector parses them)."""
    shards, gpus = reply.get("shards"), reply.get("gpus")
    files: dict[str, ShardEntry] = (shards.get("files") if shards else None) or {}
    devices = tuple(gpu_device((gpus.get("devices") if gpus else None) or []))
    return PollRecord(
        shards=tuple(shard_update(path, entry) for path, entry in files.items()),
        gpus=devices,
        health=tuple(_health_rows(devices)),
        host=reply.get("host") or None,
        status=_node_status(reply),
        scanned_bytes=sum(scanned_bytes(e) for e in files.values()),
        server_metrics=dict(server_metrics or {}),
    )


INT64_MAX = 2**63 - 1  # SQLite's INTEGER; NVML's "invalid" is all ones (2^64 - 1 for a 64-bit field)


def gpu_value(value: Any) -> Any:
    """One GPU reading as the store can hold it: an integer outside SQLite's 64 bits (NVML's
    all-ones "invalid", a faulty read) or a float that is not finite reads as None (N/A), in
    lists and dicts too; anything else unchanged."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -INT64_MAX - 1 <= value <= INT64_MAX else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [v for v in (gpu_value(x) for x in value) if v is not None]
    if isinstance(value, dict):
        return {k: gpu_value(v) for k, v in value.items()}
    return value


def gpu_device(devices: Iterable[Any]) -> Iterable[GpuDevice]:
    """The devices with every reading the store could not hold as None (#40 item 5): a bad GPU
    value costs that value, never the node's poll (its shard counts are in the same write). A
    negative energy counter is no reading either; a device without a usable index is left out."""
    for d in devices:
        if not isinstance(d, dict):
            continue
        out: dict[str, Any] = {k: gpu_value(v) for k, v in d.items()}
        energy = out.get("energy_mj")
        if energy is not None and (not isinstance(energy, int) or isinstance(energy, bool) or energy < 0):
            out["energy_mj"] = None
        if isinstance(out.get("index"), int) and not isinstance(out.get("index"), bool):
            yield out  # type: ignore[misc]  # the wire's shape, values cleaned


def _health_rows(devices: tuple[GpuDevice, ...]) -> list[GpuHealthRow]:
    rows = []
    for d in devices:
        health: dict[str, Any] = dict(d.get("health") or {})
        xids = tuple(int(x) for x in health.pop("xid", None) or [])
        rows.append(GpuHealthRow(d.get("index"), health, xids))
    return rows


def _node_status(reply: PollReply) -> NodeStatus:
    gpus: Mapping[str, Any] = reply.get("gpus") or {}  # older agents may leave a part out
    shards: Mapping[str, Any] = reply.get("shards") or {}
    return NodeStatus(
        agent_ms=reply.get("agent_ms"),
        node_time_unix=reply.get("time_unix"),
        hostname=reply.get("hostname"),
        loadavg=reply.get("loadavg"),
        gpus_found=len(gpus.get("devices") or []),
        gpu_source=gpus.get("source"),
        gpu_error=gpus.get("error"),
        gpu_simulated=bool(gpus.get("simulated")),
        shards_matched=shards.get("matched"),
        unmatched_globs=shards.get("unmatched_globs") or [],
        pending_bytes=shards.get("pending_bytes") or 0,
        disk=reply.get("disk") or {},
        metrics_errors={u: e for u, m in (reply.get("metrics") or {}).items() for e in [m.get("error")] if e},
    )


def is_backfill(first_index: bool, catching_up: bool, resets: int, pending_bytes: int) -> bool:
    """Catch-up work is not throughput, and it is a property of this node's own bytes: a poll is
    backfill when it is the node's first and counted bytes already on disk (`first_index`; a
    glob that matches nothing yet, or empty files, is no backlog), follows one that left bytes
    (`catching_up`), rescanned a shard, or itself leaves bytes unscanned."""
    return first_index or catching_up or resets > 0 or pending_bytes > 0
