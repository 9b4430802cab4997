"""The background collector: one per dashboard process, polling nodes on a bounded pool.

Each node has its own persistent agent connection and its own schedule; polls run on at
most 32 worker threads (`runhealth.collect.scheduler`), so a slow or dead node never delays the
others, never blocks a page, and 512 nodes do not need 512 threads. Every
successful poll is folded into the `Store` whole (its offsets with its counts), in the
transaction of the polls that landed with it (runhealth.collect.groupwriter); a failed one is
recorded as that node's last error while its counts and offsets stay put. Pages only ever call
`request_refresh()` and `request_sample()`, which wake the threads and return at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, cast

from runhealth import ingest, textsafe
from runhealth.alerting import alerthistory
from runhealth.analysis.servermetrics import merge_endpoints as merge_metrics
from runhealth.collect import changes, groupwriter, publisher, sampling, scheduler, storelock
from runhealth.collect.storelock import check_store_free as check_store_free  # the service imports it here
from runhealth.errors import AgentError, StoreError
from runhealth.errors import one_line as _plain
from runhealth.node.wire import PollReply, ShardCursor
from runhealth.payloads import pagedata
from runhealth.records import RunMeta
from runhealth.remote import make_transport
from runhealth.remote.base import Transport, fan_out_calls
from runhealth.settings.config import NodeConfig, RunConfig, RunContext
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store, rollup, runevents

log = textsafe.get_logger(__name__)

SCAN_BUDGET_BYTES = 256 * 1024 * 1024  # per poll call at most: a 10 GB shard is indexed over ~40 calls
MIN_SCAN_BUDGET_BYTES = 1 << 20
GPU_HISTORY_KEEP_S = 14 * 24 * 3600
HOUSEKEEPING_EVERY_S = 3600.0  # prune and rollup, at most this often per store
HOUSEKEEPING_KEY = "housekeeping"  # run meta: {"last_unix": when prune and rollup last ran on the store}
HOUSEKEEPING_RECHECK_S = 60.0  # the schedule is read from the store again at least this often
# A poll due this soon after the last one ended belongs to the same round (first polls are
# staggered 1 / connects_per_s apart, 31 ms by default, and keep that spacing): what follows a
# round (the Overview, the page data) waits for it (_polls_busy).
ROUND_GAP_S = 0.1
HOUSEKEEPING_STOP_WAIT_S = 10.0  # stop() waits this long for a fold in progress (one chunk: ~2 s)


def scan_budget_s(node: NodeConfig) -> float:
    """Time one poll may spend scanning: a quarter of the command timeout (at most 5 s), so the
    reply, GPU reading and metrics fetch still fit inside it on a slow disk or a busy node."""
    return max(0.1, min(5.0, node.command_timeout_s / 4))


def poll_request(
    node: NodeConfig,
    state: dict[str, ShardCursor],
    budget_bytes: int = SCAN_BUDGET_BYTES,
    demo_gpus: int = 0,
    now_unix: float | None = None,
    cut_labels: Sequence[str] = (),
) -> dict[str, Any]:
    """The agent request for one poll of `node`, resuming from the stored shard offsets.

    `demo_gpus`: how many GPUs the agent simulates when the node has `gpu = "demo"` (RunContext);
    `now_unix`: the poller's clock, which simulated GPUs follow (their energy counters must agree
    with the poll times the store keeps, also when a finished demo run is filled poll by poll).
    """
    demo_clock = {"demo_time_unix": now_unix} if node.gpu == "demo" and now_unix is not None else {}
    # Each simulated node its own GPU readings; in the built-in demo (demo_gpus from its RunContext)
    # a simulated host too: the real machine's CPU load and RAM are not the simulated run's (#41).
    demo = (
        {"demo_seed": zlib.crc32(node.name.encode()) & 0xFFFF, "demo_host": demo_gpus > 0} if node.gpu == "demo" else {}
    )
    return {
        **demo_clock,
        **demo,
        "op": "poll",
        "shards": {
            "globs": node.shards,
            "state": state,
            "budget_bytes": budget_bytes,
            "budget_s": scan_budget_s(node),
            "finish_reason_path": node.finish_reason_path,
            "completion_tokens_path": node.completion_tokens_path,
            "prompt_id_path": node.prompt_id_path,
            "prompt_tokens_path": node.prompt_tokens_path,
            "group_path": node.group_path,
            "cut_labels": list(cut_labels),  # the run's: labels read as "length" (node/formats.py)
            "scan_workers": node.scan_workers,
        },
        "gpu": node.gpu,
        "demo_gpus": demo_gpus,
        "metrics_urls": node.metrics_urls,
        "metrics_timeout_s": min(2.0, node.command_timeout_s / 4),
    }


class NodePoller:
    """Polls one node when the scheduler says so; owns that node's transport."""

    def __init__(
        self,
        node: NodeConfig,
        store: Store,
        interval_s: float,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.time,
        demo_gpus: int = 0,
        cut_labels: Sequence[str] = (),
        writer: groupwriter.GroupWriter | None = None,
    ):
        """`writer`: the collector's, writing polls in groups (None: each in its own transaction)."""
        self.node = node
        self.writer = writer
        self.demo_gpus = demo_gpus
        self.cut_labels = tuple(cut_labels)  # the run's [run] cut_labels, sent with each poll
        self.store = store
        self.interval_s = interval_s
        self.transport = transport if transport is not None else make_transport(node)
        self.clock = clock
        self.lock = threading.Lock()  # one request at a time on the agent pipe
        self.budget_bytes = SCAN_BUDGET_BYTES  # adapted to the scan speed this node shows
        self.slow_globs: list[str] = []  # `**` globs whose walk the last poll cut short
        # Poll intervals on the monotonic clock (#40 item 7): a wall-clock step never lengthens or
        # reverses one. Only on the real clock: a test's scripted clock has no monotonic twin.
        self.monotonic: Callable[[], float] | None = time.monotonic if clock is time.time else None
        self._last_written_mono: float | None = None  # this process's previous written poll of the node

    def _adapt_budget(self, shards: dict[str, Any]) -> None:
        """Next poll's byte budget: what this node scanned per second, times the time budget.
        The time the agent spent globbing and stat-ing (`walk_s`) is not scan speed: with many
        small shards it would shrink the budget to its floor and leave it there."""
        scanned = sum(
            max(0, int(e.get("offset") or 0) - int(e.get("offset_from") or 0))
            for e in (shards.get("files") or {}).values()
        )
        seconds = float(shards.get("scan_s") or 0) - float(shards.get("walk_s") or 0)
        if scanned > 0 and seconds > 0.01 and shards.get("pending_bytes"):
            fit = int(scanned / seconds * scan_budget_s(self.node))
            self.budget_bytes = max(MIN_SCAN_BUDGET_BYTES, min(SCAN_BUDGET_BYTES, fit))

    def request(self, obj: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """Send one request; returns the reply and the round-trip time in ms."""
        with self.lock:
            start = time.perf_counter()
            reply = self.transport.request(obj, self.node.command_timeout_s)
            return reply, (time.perf_counter() - start) * 1000

    def poll(self) -> dict[str, Any]:
        """One poll: send offsets, fold the reply into the store. Raises on failure (recorded)."""
        with self.writer.polling() if self.writer is not None else contextlib.nullcontext():
            return self._poll()

    def _poll(self) -> dict[str, Any]:
        try:
            sent, sent_mono = self.clock(), self.monotonic() if self.monotonic else None
            request = poll_request(
                self.node,
                self.store.shard_state(self.node.name),
                self.budget_bytes,
                self.demo_gpus,
                sent,
                self.cut_labels,
            )
            reply, rtt_ms = self.request(request)
        except Exception as exc:  # any failure is this node's problem only
            self.store.record_failure(self.node.name, _plain(exc), self.clock())
            raise
        self._adapt_budget(reply.get("shards") or {})
        # The reply describes the node at about the middle of the round trip; simulated GPUs were
        # read at exactly `sent` (their energy must cover the poll times the store keeps, whatever
        # the round trip: a slow first agent start made the demo's joules per second drift).
        ts_unix = sent if "demo_time_unix" in request else sent + rtt_ms / 2000
        mono = None if sent_mono is None else sent_mono + (0.0 if "demo_time_unix" in request else rtt_ms / 2000)
        last, interval_s = self._last_written_mono, None
        if mono is not None and last is not None:
            interval_s = mono - last
        try:  # a reply that breaks the wire contract is the agent's fault, not the store's
            record = ingest.read_poll(cast(PollReply, reply), merge_metrics(reply))
        except ingest.ReplyError as exc:
            message = f"the agent's reply breaks the wire contract: {exc}"
            self.store.record_failure(self.node.name, message, self.clock())
            raise AgentError(message) from None
        try:  # the reply as one record (counts, GPU rows, hourly lengths, server metrics): one transaction
            write = self.writer.write_poll if self.writer is not None else self.store.write_poll
            write(self.node.name, record, ts_unix, rtt_ms, interval_s)
            self._last_written_mono = mono
        except Exception as exc:  # disk full, lock, overflow: the node's error, on screen
            message = self.store.note_write_failure(self.node.name, exc, self.clock())
            log.warning("node %s: %s (%s)", self.node.name, message, _plain(exc))
            raise StoreError(message) from None
        return reply

    def poll_until_indexed(
        self, stop: threading.Event | None = None, progress: Callable[[str, int], None] | None = None
    ) -> dict[str, Any]:
        """Poll again at once while the node has work left that a poll can do now: unscanned
        bytes, or a `**` walk cut short by the time budget (`slow_globs`). A poll that got no
        further (nothing scanned, no walk left) ends the catch-up: the next one waits for the
        interval, so re-polling is bounded by the work there is."""
        while True:
            reply = self.poll()
            shards = reply.get("shards") or {}
            pending = int(shards.get("pending_bytes") or 0)
            slow = shards.get("slow_globs") or {}
            if sorted(slow) != self.slow_globs:  # said once per change, naming the glob
                for why in slow.values():
                    log.warning("node %s: %s", self.node.name, textsafe.escape(why))
                self.slow_globs = sorted(slow)
            if progress:
                progress(self.node.name, pending)
            further = bool(slow) or any(
                int(e.get("offset") or 0) > int(e.get("offset_from") or 0) for e in (shards.get("files") or {}).values()
            )
            if (pending <= 0 and not slow) or not further or (stop is not None and stop.is_set()):
                return reply

    def close(self) -> None:
        with self.lock:
            self.transport.close()


class Collector:
    """Polls every node of a run concurrently and keeps the store up to date."""

    def __init__(
        self,
        config: RunConfig,
        store: Store,
        transports: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
        context: RunContext | None = None,
        register: bool = True,
    ):
        """`register=False`: a viewer's sampler over a store another process collects into (it
        leaves the run's and nodes' recorded settings to that process). Nothing is written to
        the store here: the run's settings and nodes are recorded by `claim()`, once this
        process holds the store's collector lock."""
        self.config = config
        self.context = context = context or RunContext()
        self.store = store
        self.clock = clock
        transports = transports or {}
        # Polls that land together are written in one transaction (#42 item 3).
        self.writer = groupwriter.GroupWriter(store)
        self.pollers = {
            n.name: NodePoller(
                n,
                store,
                config.interval_s,
                transports.get(n.name),
                clock,
                context.demo_gpus.get(n.name, 0),
                config.cut_labels,
                self.writer,
            )
            for n in config.nodes
        }
        self._stop = threading.Event()
        self._sample_lock = threading.Lock()
        self._sampling: int | None = None
        self._lock: storelock.StoreLock | None = None
        self._housekeeper: threading.Thread | None = None
        self._register, self._registered = register, False
        # What the pages show, recomputed in the background after polls (#16: pages only read).
        # At most once per poll interval: the Overview's counts must move with every poll.
        # The Overview, built after polls and read by every viewer (#31: one read a render).
        self._polls_running = 0  # polls in progress (_poll_node): both wait for a round's last
        self._polls_lock = threading.Lock()
        self.pagedata = pagedata.Refresher(
            store,
            config.max_output_tokens,
            config.interval_s,
            min_interval_s=config.interval_s,
            clock=clock,
            busy=self._polls_busy,
        )
        self.publisher = publisher.Publisher(store, config, clock=clock, busy=self._polls_busy)
        # The alert history (#32): evaluated every poll interval by the collecting process, webhooks or none.
        # Its alerts are the published Overview's while that holds (one evaluation an instant).
        self.alert_history = alerthistory.AlertHistory(
            store, config.interval_s, clock=clock, evaluate=self.publisher.alerts_at
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start polling every node on the bounded pool (first polls staggered).

        Raises:
            StoreError: another process is already collecting into this store (two
                collectors would poll every node twice for nothing); nothing was written.
        """
        self.claim()
        if getattr(self, "_scheduler", None) is None:
            self._scheduler = scheduler.PollScheduler(list(self.pollers), self._poll_node, self.config.interval_s)
            self._scheduler.start()
        if self._housekeeper is None:  # start() is idempotent: one pruning thread per collector
            self._housekeeper = threading.Thread(target=self._housekeeping, name="runhealth-prune", daemon=True)
            self._housekeeper.start()
        self.alert_history.start()  # idempotent: one thread per collector

    def claim(self) -> None:
        """Take the store's collector lock, then record the run's settings and nodes in it.

        The lock comes first: a process that does not get it writes nothing, so a second
        collector with another config never replaces the running one's settings or node list.

        Raises:
            StoreBusyError: another process holds the lock (the message names its pid).
        """
        self._claim_store()
        if self._register and not self._registered:
            recorded, settings = self.store.meta("run"), run_meta(self.config, self.context)
            self.store.set_meta("run", settings)
            # What this start changed against the settings last recorded: markers on the time charts.
            runevents.record(self.store, self.clock(), changes.on_claim(recorded, settings))
            for node in self.config.nodes:
                self.store.register_node(node.name, node.public_dict())
            self._registered = True

    def _claim_store(self) -> None:
        if self._lock is None:
            self._lock = storelock.StoreLock.acquire(self.store.path)
            self.store.writer_check = self._lock.check

    def watch_lock(self) -> None:
        """Check the store's lock (the service calls this every half second): a lock file deleted
        or replaced is locked again and recorded as a run event, the store itself looked at
        (deleted or replaced: reopened, and said, by the store).

        Raises:
            StoreBusyError: another process took the store: this one must stop (it writes nothing more).
        """
        if self._lock is None:
            return
        self._lock.check()
        self.store.check_file()
        while self._lock.events:
            detail = self._lock.events.pop(0)
            runevents.record(self.store, self.clock(), [("store_lock_replaced", detail)])

    def stop(self) -> None:
        self._stop.set()
        pool = getattr(self, "_scheduler", None)
        if pool is not None:
            pool.stop(timeout_s=max(n.command_timeout_s for n in self.config.nodes) + 1)
        for poller in self.pollers.values():
            poller.close()
        self.writer.stop(timeout_s=HOUSEKEEPING_STOP_WAIT_S)  # what is queued is written first
        self.alert_history.stop()  # its writes too
        self.publisher.stop(timeout_s=HOUSEKEEPING_STOP_WAIT_S)
        self.pagedata.stop()  # no computation owed after the stop
        if self._lock is not None:  # what the page data keeps, for the next start (#42 item 4)
            self.pagedata.save_on_stop(timeout_s=HOUSEKEEPING_STOP_WAIT_S)
        if self._housekeeper is not None:  # its writes must end before the lock is let go
            self._housekeeper.join(timeout=HOUSEKEEPING_STOP_WAIT_S)
        if self._lock is not None:
            if self._lock.lost is None:  # a lost one keeps refusing this process's late writes
                self.store.writer_check = None
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        pool = getattr(self, "_scheduler", None)
        return pool is not None and pool.running and not self._stop.is_set()

    def _poll_node(self, name: str) -> None:
        """One scheduled turn of a node: poll it (until indexed); failures are recorded by poll()."""
        if not self._stop.is_set():  # pages follow a long catch-up too (after_poll is rate-limited)
            with self._polls_lock:
                self._polls_running += 1
            try:
                self.pollers[name].poll_until_indexed(self._stop, self._after_catch_up_poll)
            finally:
                ended = self.pagedata.monotonic()  # its rows are written (or it failed)
                with self._polls_lock:
                    self._polls_running -= 1
            self._after_poll(ended)  # after the count: the publisher sees this poll ended

    def _polls_busy(self) -> bool:
        """Whether a round of polls is still going: a poll running, or the next one due within
        ROUND_GAP_S. The scheduler staggers first polls 1 / connects_per_s (31 ms) apart and keeps
        that spacing, so a round of fast polls (the demo's, 3 ms each) ran one at a time: counting
        only the polls running, the page data was computed after the first node's and the second
        node's waited for the next computation (#42 item 2)."""
        if self._polls_running > 0:
            return True
        pool = getattr(self, "_scheduler", None)
        return pool is not None and pool.due_in() <= ROUND_GAP_S

    def _after_catch_up_poll(self, _name: str, _pending: int) -> None:
        self._after_poll()

    def _after_poll(self, ended: float | None = None) -> None:
        """What follows a poll, each rate-limited in its own thread: never delays the next poll
        (`ended`: when the poll ended, on the page data's monotonic clock; default now)."""
        self.publisher.after_poll()
        self.pagedata.after_poll(ended)

    def _housekeeping(self) -> None:
        """Prune and roll up once the store's last housekeeping is HOUSEKEEPING_EVERY_S old.

        Scheduled from the time recorded in the store, not from this collector's start: a
        collector restarted more often than hourly (config edits) still keeps the store small.
        """
        while not self._stop.is_set():
            try:
                wait_s = housekeeping_due_in_s(self.store, time.time())
                if wait_s <= 0:
                    self.housekeep()
                    continue
            except Exception as exc:  # a store that cannot be read or pruned now: try again later
                log.warning("history housekeeping failed: %s", exc)
                wait_s = HOUSEKEEPING_RECHECK_S
            self._stop.wait(min(wait_s, HOUSEKEEPING_RECHECK_S))

    def housekeep(self) -> None:
        """Prune old time series and fold raw rows into rollups; record when, in the store."""
        now = time.time()  # wall clock: stored, and read by the next process on this store
        self.store.prune(GPU_HISTORY_KEEP_S, now)
        try:  # raw rows older than the raw window become 1-min, later 10-min rows
            rollup.rollup(self.store, now, self.config.raw_keep_h * 3600, should_stop=self._stop.is_set)
        except Exception as exc:  # a failed fold loses nothing: raw rows stay until the next hour
            log.warning("history rollup failed: %s", exc)
        if not self._stop.is_set():  # a fold cut short by stop() is finished by the next process
            self.store.set_meta(HOUSEKEEPING_KEY, {"last_unix": now})

    # -- what pages call -------------------------------------------------------------------
    def request_refresh(self) -> None:
        """Wake every node's poller now, skipping any reconnect backoff (returns at once)."""
        for poller in self.pollers.values():
            retry_now = getattr(poller.transport, "retry_now", None)
            if retry_now is not None:
                retry_now()
        pool = getattr(self, "_scheduler", None)
        if pool is not None:
            pool.wake_all()

    def request_sample(self, n: int, finish_reason: str | None = None) -> int:
        """Start a fresh uniform sample of `n` completions in the background; returns its batch.

        A request made while another is still running joins that one (two tabs clicking
        Re-sample at once cost one sample, not two).
        """
        with self._sample_lock:
            if self._sampling is not None:
                return self._sampling
            batch = self.store.new_sample_batch(n, self.clock())
            self._sampling = batch
        threading.Thread(
            target=self._sample_batch, args=(batch, n, finish_reason), name="runhealth-sample", daemon=True
        ).start()
        return batch

    def _sample_batch(self, batch: int, n: int, finish_reason: str | None) -> None:
        try:
            samples, population, errors = self.sample_now(n, finish_reason)
            sampling.score_loops(samples)
            self.store.finish_sample_batch(batch, samples, population, errors, self.clock())
        except Exception as exc:
            self.store.finish_sample_batch(batch, [], 0, {"*": _plain(exc)}, self.clock())
        finally:
            with self._sample_lock:
                self._sampling = None

    def sample_now(
        self, n: int, finish_reason: str | None = None, full_text: bool = False, seed: int | None = None
    ) -> tuple[list[dict], int, dict[str, str]]:
        """Draw `n` completions uniformly across all nodes and shards (blocking).

        Lines are split between nodes in proportion to the lines each has counted, then each
        node draws its share uniformly among its own complete lines. The population returned
        (and stored with the batch) counts completions: malformed, blank and failed lines are not.
        """
        rows = [r for r in self.store.nodes() if r["name"] in self.pollers]
        weights = {r["name"]: r["completions"] + r["malformed"] for r in rows}
        # The agent draws among every complete line; the batch says how many were completions:
        # malformed, blank and failed request lines (#39) are not.
        failed: dict[str, int] = {}
        for f in self.store.failed_rows():
            failed[f["node"]] = failed.get(f["node"], 0) + f["count"]
        not_completions = {
            r["name"]: (r["malformed"] or 0) + (r["blank_lines"] or 0) + failed.get(r["name"], 0) for r in rows
        }
        return sampling.draw(
            {name: p.node for name, p in self.pollers.items()},
            weights,
            lambda name, req: self.pollers[name].request({**req, "cut_labels": list(self.config.cut_labels)})[0],
            n,
            finish_reason,
            full_text,
            seed,
            not_completions,
        )

    def poll_once(self, progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
        """One full collection over every node, concurrently: name -> reply or exception.

        Raises:
            StoreBusyError: another process collects into the store (see `claim`).
        """
        self.claim()

        def one(poller: NodePoller) -> Callable[[], dict[str, Any]]:
            return lambda: poller.poll_until_indexed(progress=progress)

        calls = {name: one(poller) for name, poller in self.pollers.items()}
        return dict(fan_out_calls(calls, scheduler.pool_size(len(self.pollers))))


def housekeeping_due_in_s(store: Store, now_unix: float) -> float:
    """Seconds until the store's next housekeeping (<= 0: due now). Due when it never ran, ran
    HOUSEKEEPING_EVERY_S ago, or its recorded time lies ahead of `now_unix` (the clock stepped back)."""
    got = store.meta(HOUSEKEEPING_KEY)
    last = got.get("last_unix") if isinstance(got, dict) else None
    if not isinstance(last, int | float) or last > now_unix:
        return 0.0
    return float(last) + HOUSEKEEPING_EVERY_S - now_unix


def run_meta(config: RunConfig, context: RunContext) -> RunMeta:
    """The run's settings as the collector saves them (`store.meta("run")`): what the alerts,
    the exporter and a later dashboard over a finished run's store (runs.py) read back
    (`RunSettings.from_meta`)."""
    return RunSettings.from_config(config, demo=context.demo).to_meta()
