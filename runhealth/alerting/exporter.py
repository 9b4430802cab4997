"""Prometheus exposition of the run, read from the history store at scrape time.

`StoreMetrics` is a prometheus_client custom collector: each scrape runs a few aggregate
queries over a run's store (counts per node and finish reason, bucketed lengths, the latest GPU
rows) and yields metric families, so the exported figures are the dashboard's figures by
construction and nothing is kept twice in memory; `RunsMetrics` serves every live run at once,
each series labelled with its `run`. Names follow the Prometheus conventions:
base units, `_total` counters, `_ratio` for 0-1 values. `serve()` starts the HTTP endpoint
(`/metrics`) on 127.0.0.1 unless told otherwise; it is read-only and holds no secrets; who may
scrape it and which runs a scrape sees: runhealth/alerting/metricsauth.py.
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from runhealth.alerting import countgroups, exposition, fieldmetrics, metricsauth
from runhealth.analysis import failed as failed_reqs
from runhealth.analysis import stats, tokencost, unknowns
from runhealth.records import LENGTH, GpuNumber
from runhealth.rules import activity, health
from runhealth.screens import fieldmodel, runeta
from runhealth.settings.runsettings import RunSettings
from runhealth.settings.windows import rate_window_s
from runhealth.store import Store
from runhealth.textsafe import escape

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 128  # connections the kernel holds while the server is busy (scrapers, dashboards)
# Throttle reasons exported, each 0 or 1 per GPU, so "not throttled" is a zero, not a missing
# series. The benign ones the agent also reports (gpu_idle, sync_boost, the clock settings) are
# left out: they would add 4 series per GPU (about 16,000 at 512 nodes) and no alert uses them.
THROTTLE_REASONS = (
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
# Bucket bounds as fractions of the ceiling; ceiling - 1 and the ceiling itself are added, so
# "share >= ceiling" is 1 - bucket{le=ceiling-1} / count in PromQL.
_CEILING_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4, 7 / 8, 15 / 16)
_NO_CEILING_BOUNDS = tuple(float(2**k) for k in range(6, 18))  # 64 .. 131072 tokens


def length_buckets(ceiling: int | None) -> list[float]:
    """Finite histogram upper bounds: fractions of the ceiling, ceiling - 1 and the ceiling exactly."""
    if not ceiling:
        return list(_NO_CEILING_BOUNDS)
    bounds = {float(max(1, round(ceiling * f))) for f in _CEILING_FRACTIONS} | {float(ceiling - 1), float(ceiling)}
    return sorted(b for b in bounds if b > 0)


class StoreMetrics:
    """A custom collector: `collect()` reads the store on every scrape."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time):
        self.store = store
        self.clock = clock

    def describe(self) -> list[Metric]:
        return []  # names depend on the store's contents; registering must not query it

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        settings = self.store.run_settings()
        run = settings.name
        memo: dict[tuple, activity.RunRates] = {}  # the stall series and the alerts read the polls once
        try:
            ceiling, estimated = self._ceiling(settings)
            figures = fieldmodel.field_figures(self.store, settings, ceiling)
            # Every node's length counts read once a scrape, in the groups the store keeps
            # (countgroups.py: a few thousand rows, not every length of every node): the completions
            # counter, the histogram, the costs and the failed ratio's denominator are summed from
            # them (#42 item 3).
            bounds = length_buckets(ceiling)
            groups = countgroups.read(self.store, bounds, ceiling)
            done = countgroups.reason_counts(groups)
            known = unknowns.unknown_from(*countgroups.unknown_parts(groups)) is None
            lengths = countgroups.per_node(groups, len(bounds), estimated)
            yield from self._lengths(run, (ceiling, estimated), done, lengths, known)
            yield from self._nodes(run, settings, now, memo, figures["prompts"].get("answered"))
            yield from self._gpus(run, settings.node_names)
            yield from self._costs(run, settings, ceiling, lengths, known)
            yield from self._failed(run, done)
            yield from fieldmetrics.field_families(self.store, run, settings, figures=figures)
            yield from self._alerts(run, settings, now, memo)
        except Exception:  # logged; this scrape fails (HTTP 500), the collector goes on
            log.exception("metrics: reading the store failed")
            raise

    def _alerts(self, run: str, settings: RunSettings, now: float, memo: dict | None = None) -> Iterator[Metric]:
        """`runhealth_alert`: 1 per alert that holds now, the very set the Overview words and the
        webhooks send (health.evaluate); no series when none holds."""
        family = GaugeMetricFamily(
            "runhealth_alert",
            "1 for each alert that holds now (the dashboard's and the webhooks' alert set).",
            labels=["run", "alert", "severity", "node", "gpu"],
        )
        seen = set()
        for a in health.evaluate(self.store, now, settings, memo):
            if a.key not in seen:
                seen.add(a.key)
                gpu = "" if a.gpu is None else str(a.gpu)
                family.add_metric([run, a.name, a.severity, escape(a.node or ""), gpu], 1.0)
        yield family

    # -- completions and lengths ---------------------------------------------------------
    def _lengths(
        self,
        run: str,
        ceiling_of: tuple[int | None, int],
        done: dict[tuple[str, str], int],
        lengths: dict[str, countgroups.NodeLengths],
        known: bool,
    ) -> Iterator[Metric]:
        completions = CounterMetricFamily(
            "runhealth_completions",
            "Completions counted in the shards, exactly.",
            labels=["run", "node", "finish_reason"],
        )
        for (node, reason), n in done.items():
            completions.add_metric([run, node, reason], n)
        yield completions
        ceiling, estimated = ceiling_of
        if ceiling is not None:
            yield _gauge(
                "runhealth_ceiling_tokens", "The max_tokens ceiling (configured, else detected).", run, ceiling
            )
        hist = HistogramMetricFamily(
            "runhealth_completion_length_tokens",
            "Completion lengths in tokens (exact completion_tokens; chars/4 estimates only if no exact ones).",
            labels=["run", "node"],
        )
        bounds = length_buckets(ceiling)
        at_ceiling = CounterMetricFamily(
            "runhealth_completions_at_ceiling",
            "Completions stopped by length at or above the ceiling.",
            labels=["run", "node"],
        )
        total_len = total_at = 0
        for node, got in lengths.items():
            buckets = [(_le(b), c) for b, c in zip(bounds, got.cumulative, strict=True)] + [("+Inf", got.count)]
            hist.add_metric([run, node], buckets, got.tokens)
            if ceiling is not None:
                at_ceiling.add_metric([run, node], got.at_ceiling)
            total_len, total_at = total_len + got.count, total_at + got.at_ceiling
        yield hist
        if ceiling is not None:
            yield at_ceiling
        if ceiling is not None and known:  # unknown: no series, never a calm 0 (#39)
            ratio = GaugeMetricFamily(
                "runhealth_truncated_ratio",
                "Share of completions (with known length) stopped at the ceiling.",
                labels=["run"],
            )
            ratio.add_metric([run], total_at / total_len if total_len else 0.0)
            yield ratio

    def _failed(self, run: str, done: dict[tuple[str, str], int]) -> Iterator[Metric]:
        """Failed requests (#39): a counter per node and bounded reason, and the run's share of
        requests (analysis/failed.py, the one definition), once a request came back."""
        rows = self.store.failed_rows()  # every counted node, as runhealth_completions
        family = CounterMetricFamily(
            "runhealth_failed_requests",
            "Failed requests counted in the shards (error status, error object, expired / canceled), by reason;"
            " not in runhealth_completions.",
            labels=["run", "node", "reason"],
        )
        for r in rows:
            family.add_metric([run, r["node"], r["reason"]], r["count"])
        yield family
        completed = sum(n for n in done.values())
        share = failed_reqs.failed_requests(rows, completed).share
        if share is not None:
            yield _gauge(
                "runhealth_failed_requests_ratio", "Failed requests / (completions + failed requests).", run, share
            )

    def _ceiling(self, settings: RunSettings) -> tuple[int | None, int]:
        """(ceiling, the `estimated` flag of the rows length statistics use), as stats.summarize decides."""
        where, gone = self.store.counted_where()  # a group of the counts is there while a row of it is
        exact = self.store.query(
            f"SELECT EXISTS (SELECT 1 FROM node_length_groups{where} AND estimated = 0) AS e", gone
        )[0]["e"]
        estimated = 0 if exact or not self.store.query(f"SELECT 1 FROM node_length_groups{where} LIMIT 1", gone) else 1
        if settings.max_output_tokens:
            return settings.max_output_tokens, estimated
        rows = self.store.length_counts(by="run", finish_reason=LENGTH)
        hist = stats.LengthHist.from_rows((r["tokens"], r["finish_reason"], r["estimated"], r["count"]) for r in rows)
        return stats.detect_ceiling(hist), estimated

    # -- nodes and the run ---------------------------------------------------------------
    def _nodes(
        self, run: str, settings: RunSettings, now: float, memo: dict | None = None, answered: int | None = None
    ) -> Iterator[Metric]:
        interval_s, stale_after, stall_after = settings.interval_s, settings.stale_after, settings.stall_after
        up = GaugeMetricFamily(
            "runhealth_node_up", "1 if the node's last poll succeeded within stale_after.", labels=["run", "node"]
        )
        age = GaugeMetricFamily(
            "runhealth_last_poll_age_seconds", "Seconds since the node's last successful poll.", labels=["run", "node"]
        )
        stalled = GaugeMetricFamily(
            "runhealth_stalled",
            f"1 if the node is reachable but added no completion for {stall_after:.0f} s.",
            labels=["run", "node"],
        )
        tps = GaugeMetricFamily(
            "runhealth_generation_tokens_per_second",
            f"Generated tokens per second over the last {rate_window_s(interval_s):.0f} s (shard growth;"
            " a minute, or two poll intervals when polls are slower).",
            labels=["run", "node"],
        )
        memo = {} if memo is None else memo
        stalls = health.stalled_nodes(self.store, now, stall_after, memo)
        nodes = self.store.nodes()
        keep = settings.node_names  # a node removed from the config leaves the state series
        done = health.done_nodes([n for n in nodes if keep is None or n["name"] in keep], settings)
        finished = GaugeMetricFamily(
            "runhealth_node_done",
            "1 once the node wrote its share (target / nodes; fixed shares).",
            labels=["run", "node"],
        )
        for n in (n for n in nodes if keep is None or n["name"] in keep):
            state, _why = health.node_status(n, now, stale_after)
            up.add_metric([run, n["name"]], 1.0 if state == "up" else 0.0)
            if n["last_ok_unix"] is not None:
                age.add_metric([run, n["name"]], max(0.0, now - n["last_ok_unix"]))
            quiet = state == "up" and n["name"] in stalls and n["name"] not in done  # a done node is not stalled
            stalled.add_metric([run, n["name"]], 1.0 if quiet else 0.0)
            finished.add_metric([run, n["name"]], 1.0 if n["name"] in done else 0.0)
        for node, rate in self._token_rates(now, stall_after, memo).items():
            if keep is None or node in keep:
                tps.add_metric([run, node], rate)
        yield from (up, age, stalled, finished, tps)
        gone = self.store.superseded_nodes()  # their files are counted again under the current name
        written = sum(n["completions"] for n in nodes if n["name"] not in gone)
        progress = runeta.progress(answered, settings.expected_prompts, written, settings.target_completions)
        if progress is not None:  # the Overview's one progress (runhealth.screens.runeta.progress)
            yield _gauge(
                "runhealth_progress_ratio",
                "Distinct prompts answered / expected_prompts when both are known, else completions / target_completions.",
                run,
                progress.share,
            )

    def _token_rates(self, now: float, stall_after: float, memo: dict[tuple, activity.RunRates]) -> dict[str, float]:
        """Per node, the one live tok/s (runhealth.rules.activity over windows.rate_window_s, ending
        now); none for a node not polled within it. The stall rule's reading (`memo`, filled by
        health.stalled_nodes just before, and read again by the alerts): every node's rates are
        computed once a scrape, over the polls the alerts read (#42 item 3: a second pass over a
        shorter lookback cost ~0.1-0.35 CPU s a scrape at 1,024 nodes, and missed the poll that
        opens the window's first span when a poll was late)."""
        found = activity.read_rates(self.store, now, 2 * stall_after, memo=memo)
        return {node: r.tokens_per_s_1m for node, r in found.per_node.items() if r.tokens_per_s_1m is not None}

    # -- GPUs ----------------------------------------------------------------------------
    def _gpus(self, run: str, keep: set[str] | None) -> Iterator[Metric]:
        labels = ["run", "node", "gpu", "uuid"]
        fields: tuple[tuple[str, str, GpuNumber, float], ...] = (  # (metric, help, store column, scale)
            ("runhealth_gpu_utilization_ratio", "GPU utilization (NVML), 0-1.", "util_pct", 0.01),
            ("runhealth_gpu_power_watts", "GPU power draw.", "power_w", 1.0),
            ("runhealth_gpu_power_limit_watts", "GPU power limit.", "power_limit_w", 1.0),
            ("runhealth_gpu_memory_used_bytes", "GPU memory used.", "mem_used_mib", 1024.0 * 1024.0),
            ("runhealth_gpu_memory_total_bytes", "GPU memory total.", "mem_total_mib", 1024.0 * 1024.0),
            ("runhealth_gpu_temperature_celsius", "GPU core temperature.", "temp_c", 1.0),
        )
        families = {name: GaugeMetricFamily(name, help_, labels=labels) for name, help_, _c, _s in fields}
        throttled = GaugeMetricFamily(
            "runhealth_gpu_throttled", "1 while the clock event reason is active.", labels=[*labels, "reason"]
        )
        for g in self.store.gpu_latest():
            if g.get("error") or (keep is not None and g["node"] not in keep):
                continue
            values = [run, g["node"], str(g["gpu"]), g.get("uuid") or ""]
            for name, _h, column, scale in fields:
                if (value := g[column]) is not None:
                    families[name].add_metric(values, float(value) * scale)
            active = set(g["throttle_reasons"])
            for reason in THROTTLE_REASONS:
                throttled.add_metric([*values, reason], 1.0 if reason in active else 0.0)
        yield from families.values()
        yield throttled

    # -- what the cut cost (#33 item 2) ---------------------------------------------------
    def _costs(
        self,
        run: str,
        settings: RunSettings,
        ceiling: int | None,
        lengths: dict[str, countgroups.NodeLengths],
        known: bool,
    ) -> Iterator[Metric]:
        """Generated tokens per node by kind (all, cut at the ceiling, usable: the Overview's
        exact shares, over the rows stats.summarize uses), GPU energy per node and per source,
        and the run's joules and GPU-seconds per usable token (analysis/tokencost.py)."""
        tokens = CounterMetricFamily(
            "runhealth_generated_tokens",
            "Generated tokens counted in the shards, exactly, by kind: all, cut_at_ceiling (in completions"
            " stopped by length at the ceiling), usable (in completions that stopped naturally).",
            labels=["run", "node", "kind"],
        )
        total = total_cut = 0
        for node, n in lengths.items():
            for kind, t in (("all", n.tokens), ("cut_at_ceiling", n.cut_tokens), ("usable", n.usable_tokens)):
                tokens.add_metric([run, node, kind], t)
            total, total_cut = total + n.tokens, total_cut + n.cut_tokens
        yield tokens
        if ceiling is not None and known:
            yield _gauge(
                "runhealth_truncated_tokens_ratio",
                "Share of generated tokens spent in completions stopped at the ceiling.",
                run,
                total_cut / total if total else 0.0,
            )
        yield from self._energy(run, settings.node_names)

    def _energy(self, run: str, keep: set[str] | None) -> Iterator[Metric]:
        joules = CounterMetricFamily(
            "runhealth_gpu_energy_joules",
            "GPU energy over the polls the collector measured (throughput polls), by source: counter"
            " (NVML's total-energy counter) or power_x_time (integrated power where a GPU has no counter).",
            labels=["run", "node", "source"],
        )
        rows = [r for r in self.store.node_energy() if keep is None or r["node"] in keep]
        for r in rows:
            joules.add_metric([run, r["node"], "counter"], float(r["joules"] - r["integrated_j"]))
            joules.add_metric([run, r["node"], "power_x_time"], float(r["integrated_j"]))
        yield joules
        dropped = CounterMetricFamily(
            "runhealth_gpu_energy_dropped_steps",
            "Poll intervals left out of the energy figures, their tokens with them: a GPU reading was"
            " implausible (a counter gone back without a reload, above the power limit x the interval),"
            " missing, or back after a gap.",
            labels=["run", "node"],
        )
        for r in rows:
            dropped.add_metric([run, r["node"]], float(r["dropped_steps"]))
        yield dropped
        cost = tokencost.energy_cost(rows)
        if cost is not None and cost.usable_tokens and cost.joules:
            yield _gauge(
                "runhealth_energy_per_usable_token_joules",
                "GPU joules per usable token (a natural stop) written over the same polls.",
                run,
                cost.joules / cost.usable_tokens,
            )
            yield _gauge(
                "runhealth_gpu_seconds_per_usable_token",
                "GPU-seconds per usable token written over the polls the energy covers.",
                run,
                cost.gpu_s / cost.usable_tokens,
            )


class RunsMetrics:
    """Every live run's metrics in one exposition: each family once, its series told apart by
    the `run` label (a family repeated per run would be an invalid exposition)."""

    def __init__(self, stores: Sequence[Store], clock: Callable[[], float] = time.time):
        self.runs = [StoreMetrics(store, clock) for store in stores]

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for run in self.runs:
            for family in run.collect():
                _escape_labels(family)
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        yield from merged.values()


def _escape_labels(family: Metric) -> None:
    """Label values from the data (finish reasons, GPU UUIDs, names) with their control characters
    made visible: prometheus_client escapes only backslash, quote and newline, so ESC or NUL
    would reach the exposition (and whoever reads it in a terminal) raw. Each distinct value is
    checked once (a family of 4,096 GPUs repeats a few hundred names)."""
    values = {v for s in family.samples for v in s.labels.values()}
    if all(v.isprintable() for v in values):
        return
    family.samples = [
        s if all(v.isprintable() for v in s.labels.values()) else s._replace(labels=_escaped(s.labels))
        for s in family.samples
    ]


def _escaped(labels: dict[str, str]) -> dict[str, str]:
    return {k: escape(v) for k, v in labels.items()}


def _le(bound: float) -> str:
    return str(int(bound)) + ".0"


def _gauge(name: str, help_: str, run: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_, labels=["run"])
    family.add_metric([run], value)
    return family


def registry_for(stores: Store | Sequence[Store], clock: Callable[[], float] = time.time) -> CollectorRegistry:
    """A registry holding only the runs' metrics (no process or Python GC series): one store, or
    every live run's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsMetrics([stores] if isinstance(stores, Store) else stores, clock))
    return registry


def scrape_text(stores: Store | Sequence[Store], clock: Callable[[], float] = time.time) -> bytes:
    """What /metrics serves in the text format: the runs' families through exposition.text
    (prometheus_client's generate_latest, byte for byte, at a fraction of its CPU)."""
    return exposition.text(registry_for(stores, clock).collect())


class _QuietHandler(WSGIRequestHandler):
    def setup(self) -> None:
        super().setup()
        self.wfile = _ClientGoneWriter(self.wfile)  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per scrape on stderr is noise


class _ClientGoneWriter:
    """A response stream on which a TLS client that hung up mid-response (ssl.SSLEOFError, e.g. a
    Prometheus stopped while it scraped) raises the ConnectionAbortedError wsgiref already takes
    for a client gone, instead of an SSLError it prints a traceback for on stderr."""

    def __init__(self, raw: Any):
        self._raw = raw

    def write(self, data: bytes) -> Any:
        try:
            return self._raw.write(data)
        except ssl.SSLError as exc:
            raise ConnectionAbortedError(f"the client hung up: {exc}") from exc

    def flush(self) -> None:
        try:
            self._raw.flush()
        except ssl.SSLError as exc:
            raise ConnectionAbortedError(f"the client hung up: {exc}") from exc

    def __getattr__(self, name: str) -> Any:  # closed, close: the stream's own
        return getattr(self._raw, name)


def serve(
    stores: Store | Sequence[Store],
    port: int,
    address: str = "127.0.0.1",
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> Any:
    """Serve `/metrics` on `address:port` from a daemon thread; returns the server (call `.shutdown()`).

    prometheus_client's start_http_server, with a listen backlog of LISTEN_BACKLOG instead of
    socketserver's 5, past which a concurrent scrape waited for the kernel's SYN retry (1 s, 3 s).
    `token`: every request must carry `Authorization: Bearer <token>` (metricsauth.guarded), else 401;
    `tls`: served over HTTPS (as prometheus_client's start_http_server with certfile: the listening
    socket wrapped); the server's `scheme` says which.
    Which runs `stores` holds is the caller's choice (runhealth/alerting/outputs.py: an anonymous
    scrape gets only the open runs).
    """

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        request_queue_size = LISTEN_BACKLOG
        scheme = "http"  # "https" once the listening socket is wrapped

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A client that drops or fails the TLS handshake (plain HTTP to HTTPS, a certificate it
            does not trust) is its own problem: one debug line, not a traceback on stderr."""
            if isinstance(sys.exc_info()[1], ssl.SSLError | ConnectionError | TimeoutError):
                log.debug("metrics: client %s: %s", client_address, sys.exc_info()[1])
                return
            super().handle_error(request, client_address)

    app = exposition.wsgi_app(registry_for(stores))
    server = make_server(
        address, port, app if token is None else metricsauth.guarded(app, token), Server, handler_class=_QuietHandler
    )
    if tls is not None:
        # The handshake in the request's thread (SSL_read does it), not in accept(): a client that
        # connects and says nothing must not stop every other scrape.
        server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        server.scheme = "https"
    threading.Thread(target=server.serve_forever, name="runhealth-metrics", daemon=True).start()
    log.info("serving Prometheus metrics on %s://%s:%d/metrics", server.scheme, address, server.server_port)
    return server
