"""What the store's reads return: one typed row per read shape (runhealth/store/reads.py, rollup.py).

Every read of the history store used to be `list[dict[str, Any]]`, its keys known only from the
SQL and docs/design.md prose. Each shape is declared here once, with the SQL column names
exactly (a `SELECT *` row has its table's columns, runhealth/store/migrations.py; an aggregate row its
`AS` names) and the unit of every column that carries one. tests/test_records.py checks that
each read's real rows have exactly these keys, so a renamed column fails a test, and mypy checks
every `row["key"]` against them.

Why TypedDicts, and not frozen dataclasses or NamedTuples as analysis/stats.Summary is: a
TypedDict is only a type; at run time a row stays the plain dict `sqlite3.Row` gave, so
`pd.DataFrame(rows)`, the JSON page payloads (runhealth/payloads/pagedata.py), the cached loaders
(st.cache_data pickles them) and every `row["key"]` consumer work unchanged, at no cost per
row. A dataclass would have changed every consumer and every DataFrame path, and copied every
row of a 24 h GPU series once more. What a TypedDict gives up: rows are not frozen, and a
consumer that adds keys to a row declares a row type naming them (GpuSeriesPoint ->
LabelledGpuPoint in pagedata.py, filled in place through `widen`). Units: `*_unix` is seconds since the epoch on the dashboard's
clock unless said otherwise; `*_ms`, `*_s`, `*_mib`, `*_bytes`, `*_w`, `*_c`, `*_mhz`, `*_pct` as
named. JSON columns (nodes.loadavg, gpu_latest.processes, ...) are decoded by the read and typed
decoded; their inner shapes are the agent's (runhealth/node/wire.py).

`Store.query()` stays `list[dict[str, Any]]`: raw SQL has no shape the type system can know. A
module whose own SQL returns one of these shapes (rollup.py's reads return a Store read's shape
over more rows) says so with `rows_as`, the one place a query's rows are cast.
"""

# No `from __future__ import annotations` here: TypedDict reads NotRequired[...] from the evaluated
# annotations (as strings, Python 3.11 counts those keys as required, and the key test would lie).
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, TypeVar, cast

from runhealth.node.wire import DiskEntry, GpuHealth, GpuProcess, HostInfo

LENGTH = "length"  # the finish_reason of a completion stopped by max_tokens (or the context window)

R = TypeVar("R")
M = TypeVar("M", bound=Mapping[str, Any])


def rows_as(row_type: type[R], rows: list[dict[str, Any]]) -> list[R]:
    """`rows` (a query's, its JSON columns decoded) declared as `row_type`: no copy, no check
    at run time (tests/test_records.py checks each read's keys against its row type)."""
    return cast(list[R], rows)


def widen(rows: list[M]) -> list[dict[str, Any]]:
    """The same dicts as plain ones, for a reader that adds its own keys in place (no copy: a
    copy of a fleet's GPU series costs more than the work it feeds); declare the result with
    `rows_as` and the row type that names those keys (e.g. LabelledGpuPoint)."""
    return cast(list[dict[str, Any]], rows)


# -- nodes and shards ------------------------------------------------------------------------------
class NodeRow(TypedDict):
    """`Store.nodes()`: a `nodes` row (JSON columns decoded; None before the first poll) with its
    shards summed (0 when it has none)."""

    name: str
    last_ok_unix: float | None  # the last successful poll
    last_attempt_unix: float | None
    last_error: str | None  # the last failed poll's error, kept after the node recovers
    last_error_unix: float | None
    failing_since_unix: float | None  # None while polls succeed
    rtt_ms: float | None  # the last poll's round trip
    agent_ms: float | None  # time the agent spent on it
    skew_s: float | None  # node clock minus dashboard clock
    hostname: str | None
    loadavg: list[float] | None  # 1, 5, 15 min
    gpus_found: int | None
    gpu_source: str | None  # "nvml", "nvidia-smi", "demo", or None: no telemetry
    gpu_error: str | None
    gpu_simulated: int | None  # 0/1
    shards_matched: int | None
    unmatched_globs: list[str] | None
    pending_bytes: int | None  # left to scan after the last poll (bytes)
    disk: dict[str, DiskEntry] | None  # per shard folder
    metrics_errors: dict[str, str] | None  # URL -> why its /metrics could not be read
    config: dict[str, Any] | None  # the node's public config (no secrets), from register_node
    index_bytes_per_s: float | None  # indexing speed while backfilling (bytes per second of poll)
    shards: int  # shard files known
    bytes_indexed: int  # sum of shards.offset
    bytes_total: int  # sum of shards.size
    completions: int  # completions counted (the shards' `lines` column; on the wire `lines` is every line)
    malformed: int  # lines that are not a completion record
    blank_lines: int
    shard_errors: int  # shards whose last read failed
    store_error: NotRequired[str]  # only while this process cannot write the node's polls


class ShardRow(TypedDict):
    """`Store.shards()`: a `shards` row (one output file on a node)."""

    node: str
    path: str
    inode: int | None
    offset: int  # bytes counted up to (where the agent resumes)
    size: int  # bytes, as of the last poll
    completions: int  # completions counted (the `lines` column)
    malformed: int
    tokens: int  # output tokens counted
    resets: int  # times the file was found rotated or truncated and counted afresh
    error: str | None  # the last read's error
    updated_unix: float | None
    blank_lines: int
    mark: str | None  # content mark at offset (node/scan.content_mark); None in an older store's rows
    replaced_unix: float | None  # when it was last found rewritten under the same inode and recounted


# -- length counts ---------------------------------------------------------------------------------
class LengthCountRow(TypedDict):
    """`Store.length_counts(by)`: completions of one exact length and finish reason."""

    node: NotRequired[str]  # by="node" and by="shard"
    path: NotRequired[str]  # by="shard"
    tokens: int  # output tokens
    finish_reason: str | None  # None: the record had none
    estimated: int  # 1: tokens estimated from the text's length, 0: exact
    count: int  # completions


class GroupTotalRow(TypedDict):
    """`Store.group_totals(by)`: one node's (or shard's) completions counted."""

    node: str
    path: NotRequired[str]  # by="shard"
    completions: int
    exact: int  # of them with exact token counts


# -- polls -----------------------------------------------------------------------------------------
class PollRow(TypedDict):
    """`Store.polls()`: a `polls` row, one successful poll's deltas."""

    ts_unix: float  # when the poll was made
    node: str
    node_ts_unix: float | None  # the node's own clock at the poll
    completions: int  # completions new since the previous poll
    tokens: int  # output tokens new since the previous poll
    length_stops: int  # of the new completions, those with finish_reason "length"
    malformed: int
    backfill: int  # 1: this poll counted history (first poll, catching up, a reset), not live output
    rtt_ms: float | None
    prompts: int | None  # distinct prompts new to the run in this poll (#33; None: a store before migration 12)
    # the collector's monotonic seconds since the node's previous poll by the same process (#40 item 7;
    # None: a process's first poll, a scripted clock, or a poll from before migration 14)
    interval_s: float | None


class PollBucket(TypedDict):
    """`Store.polls_by_bucket()` and rollup.poll_history(): poll deltas summed per time bucket."""

    bucket_unix: float  # the bucket's start
    completions: int
    tokens: int
    length_stops: int
    malformed: int
    backfill: int  # 1: every poll in the bucket was a backfill; else the sums are over its live polls


class LengthStopBucket(TypedDict):
    """`Store.length_stops_by_bucket()`: exact-length stops per time bucket, split at the ceiling."""

    bucket_unix: float
    backfill: int  # 1: stops counted by backfill polls (a bucket can have a live and a backfill row)
    at_ceiling: int  # tokens >= ceiling (truncated)
    below_ceiling: int  # stopped by the context window or another limit below it


# -- GPUs and hosts --------------------------------------------------------------------------------
class GpuRow(TypedDict):
    """`Store.gpu_latest()`: a GPU's latest reading (numbers None for a GPU that errors)."""

    node: str
    gpu: int  # the GPU's index on its node
    ts_unix: float | None
    name: str | None
    uuid: str | None
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None
    throttle_reasons: list[str]
    processes: list[GpuProcess]
    error: str | None  # e.g. "GPU is lost"


# The numeric columns gpu_latest and gpu_samples share, for a reader that picks one by name.
GpuNumber = Literal["util_pct", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w", "temp_c", "sm_clock_mhz"]


class GpuSeriesPoint(TypedDict):
    """`Store.gpu_series()` and rollup.gpu_history(): one GPU's readings averaged over a bucket."""

    node: str
    gpu: int
    ts_unix: float  # the bucket's first reading
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None
    throttled: int | None  # 1: throttled at some reading in the bucket


class LabelledGpuPoint(GpuSeriesPoint):
    """pagedata.gpu_series(): a GpuSeriesPoint with what the GPU page draws by."""

    label: str  # "node/gpu"
    mem_used_gib: float | None


class GpuHealthReading(TypedDict):
    """`Store.gpu_health()`: a GPU's latest health readings (the agent's dict, decoded)."""

    node: str
    gpu: int
    ts_unix: float | None
    health: GpuHealth  # {} when none was reported


class GpuEventRow(TypedDict):
    """`Store.gpu_events()`: an XID event as the poll that saw it reported it."""

    ts_unix: float  # the poll that reported it
    node: str
    gpu: int  # the columns allow NULL; the store writes the agent's GPU index and XID number
    xid: int


class HostReading(HostInfo):
    """`Store.host_latest()` values: a node's latest host reading (the agent's dict) and its time."""

    ts_unix: float | None


# -- alert history ---------------------------------------------------------------------------------
class AlertEpisodeRow(TypedDict):
    """`Store.alert_episodes()`: one alert episode (runhealth/alerting/alerthistory.py), from when it
    started to when it stopped holding (None: it still held at the last evaluation)."""

    id: int
    name: str  # health.Alert.name: truncation_high, node_down, run_stalled, ...
    severity: str  # the worst it reached: "critical" | "warning"
    node: str | None
    gpu: int | None
    started_unix: float  # wall clock: the evaluation that first saw it
    resolved_unix: float | None  # the first evaluation it no longer held (confirmed clear_s later)
    last_seen_unix: float  # the last evaluation it held
    # Open, but the last evaluation no longer saw it: when it stopped holding (it is resolved at
    # this time once it stays clear for notify.CLEAR_S; seen again, this is cleared). None: it held.
    absent_unix: float | None
    summary_start: str
    summary_end: str | None  # its wording at the last evaluation it held
    value_start: float | None
    value_end: float | None


# -- server metrics --------------------------------------------------------------------------------
class MetricRow(TypedDict):
    """`Store.metric_latest()`: the newest value of one server metric on one node."""

    node: str
    name: str  # the Prometheus metric name, e.g. "sglang:gen_throughput"
    value: float  # in the metric's own unit (the column allows NULL; record_metrics writes none)
    ts_unix: float


class EnergyRow(TypedDict):
    """`Store.node_energy()`: one node's GPU energy and the tokens it produced over the same
    throughput polls (migration 9, runhealth/store/energymeter.py); a node with GPUs but no measured
    span yet has zeros and since_unix None."""

    node: str
    gpus: int  # GPUs with an energy row
    joules: float  # over every GPU of the node
    integrated_j: float  # of those, from power x time (no energy counter)
    gpu_s: float  # GPU-seconds the joules cover
    resets: int  # energy-counter resets seen (driver reloads)
    counter_gpus: int  # GPUs whose last reading had NVML's energy counter
    since_unix: float | None  # the first measured poll
    last_unix: float | None
    tokens: int  # exact tokens the shards gained over those polls
    usable_tokens: int  # of those, in completions that stopped naturally
    usable_completions: int
    dropped_steps: int  # the node's poll intervals dropped as implausible, tokens and all (#40)


class MetricPoint(TypedDict):
    """`Store.metric_series(name)`: one sample of that metric."""

    ts_unix: float
    node: str
    value: float  # as in MetricRow


# -- samples ---------------------------------------------------------------------------------------
class StoredSample(TypedDict):
    """A `samples` row: one completion drawn for reading (not the agent's wire.SampleRow)."""

    batch: int
    node: str | None
    path: str | None
    line_no: int | None  # from 1
    offset: int | None  # byte offset of the line
    tokens: int | None
    estimated: int | None
    finish_reason: str | None
    prompt_head: str | None
    text_head: str | None
    text_tail: str | None
    text_chars: int | None
    is_loop: int | None  # 1: analysis/loops.py called it a loop


class PendingSampleBatch(TypedDict):
    """`Store.pending_sample_batch()`: a `sample_batches` row still being drawn."""

    batch: int
    requested_unix: float | None
    done_unix: float | None  # None until it is finished
    requested_n: int | None
    population: int | None  # completions among the lines the draw was among (malformed and blank not counted)
    errors: str | None  # JSON, node -> error (None until finished)


class SampleBatch(TypedDict):
    """`Store.latest_sample_batch()`: a finished batch, its errors decoded, with its samples."""

    batch: int
    requested_unix: float | None
    done_unix: float
    requested_n: int | None
    population: int | None
    errors: dict[str, str]  # node -> why it gave no samples
    samples: list[StoredSample]  # by node, path, line_no


# -- the collecting process ------------------------------------------------------------------------
class RunMeta(TypedDict):
    """The run meta key "run": the run's settings as the collector saves them
    (`RunSettings.to_meta`, runhealth/settings/runsettings.py). Read back only through
    `RunSettings.from_meta`, which gives each key an older store lacks its default."""

    name: str
    target_completions: int | None
    max_output_tokens: int | None
    interval_s: float
    stall_after_s: float  # resolved (configured, or the default rule of runhealth.settings.windows)
    demo: bool
    truncation_warn_fraction: float | None
    truncation_alert_fraction: float | None
    failed_warn_share: float | None
    failed_crit_share: float | None
    stale_after_s: float  # resolved, as stall_after_s
    nodes: list[str] | None  # the nodes the config names now
    expected_prompts: int | None  # [run] expected_prompts (#33)
    max_model_len: int | None  # [run] max_model_len (#33)
    shared_queue: bool  # [run] shared_queue (#41): the nodes share one queue (absent in older stores: false)
    allowed_users: list[str] | None  # [run] allowed_users (#40): the rule a retired run keeps; None: unknown


class CollectorStatus(TypedDict):
    """`outbound.read_status(store)`: the collecting process's own status, the run meta key
    "collector" (runhealth/alerting/outputs.py), written when it (re)starts its outbound and again every
    HEARTBEAT_S, so a viewer in another process shows what that process serves and whether it runs.
    Never a webhook URL: targets only as `webhook.redact()` gives them (scheme://host:port/…)."""

    pid: int
    host: str  # socket.gethostname() of the collecting process
    started_unix: float  # when this outbound started (the collector's start or latest restart)
    written_unix: float  # the latest heartbeat
    stopped_unix: float | None  # set when the process stopped cleanly
    metrics_url: str | None  # where /metrics is served; None: not served (metrics_off says why)
    metrics_off: str | None
    notices: list[str]  # a refused webhook entry, a busy /metrics port, ... (Outbound.notices)
    webhook_receivers: int  # the webhook URLs alerts are sent to
    webhook_targets: list[str]  # the same, redacted
