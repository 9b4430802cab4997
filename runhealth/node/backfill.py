"""runhealth node agent, parallel backfill: a big scan split over worker processes.

Part of the node agent (runhealth/node/, shipped together with agent.py):
standard library only, Python 3.8-compatible syntax, read-only on the node. A node's first scan
of a long run is the one time scanning speed is felt, so when a poll has a backlog the agent
cuts each shard's planned byte range into line-aligned pieces and scans them in worker
processes (scan_jobs); small polls stay in the agent's own process.

Why the "fork" start method, explicitly: the agent is usually exec'd from protocol.BOOTSTRAP
(`python -c`), so its modules exist only in sys.modules, not as files. "spawn" and
"forkserver" start a fresh interpreter that must import the worker function by module name,
which fails for exec'd code; "fork" copies the running process, shipped modules included.
Python 3.14 makes "forkserver" Linux's default, hence no reliance on the default. The agent is
single-threaded when it forks. Where "fork" does not exist the scan stays in one process.

Workers run at lowered priority (os.nice) so GPU-serving processes keep their CPU. Each piece
is a plain scan.scan_file() call on a byte range that starts and ends at line starts,
and the content rule makes a line's outcome independent of which process counted it, so the
merged result equals the one-process scan exactly (tests/test_backfill.py). The caller gives a
byte budget per shard and an optional deadline: pieces not started by the deadline are left,
cut points are not searched for past it, the last piece's search for the newline of an
unfinished line stops at it, and each shard reports the exact offset up to which its pieces are
all done. Planning reads each byte at most once and records a long line at the range's start in
scan.TAILS, which the workers inherit, so neither re-reads a line an earlier search crossed.
"""

from __future__ import annotations

import base64
import collections
import os
import time
from typing import Any

PIECE_MAX_BYTES = 32 << 20  # ~50-100 ms of scanning: the deadline's granularity
PIECE_MIN_BYTES = 4 << 20  # smaller pieces would pay more for opening and learning than they save
PARALLEL_MIN_BYTES = 64 << 20  # below this a poll is not a backlog: one process, no fork
WORKER_NICE = 10  # added to the agent's niceness in every worker
MAX_WORKERS = 8
ALIGN_READ_BYTES = 64 << 10
PIECE_TIMEOUT_S = 300  # a 32 MB piece takes well under a second; only a dead worker waits this long

SCAN: Any = None  # the agent_scan module; bind() sets it before any fork
LAST_RUN: dict[str, Any] = {"workers": 0, "pids": set(), "nice": set()}  # the last parallel scan, for tests


def bind(scan_module):
    """Give this module the scanner (agent.py does this; workers inherit it through fork)."""
    global SCAN
    SCAN = scan_module


def default_workers(cpus=None):
    """A quarter of the node's cores, at least 1 and at most 8."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(MAX_WORKERS, cpus // 4))


def resolve_workers(value):
    """The worker count for a request value: None means the node's default; clamped 1..8."""
    if value is None:
        return default_workers()
    return max(1, min(MAX_WORKERS, int(value)))


def can_fork():
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


# ---------------------------------------------------------------------------- planning
def line_start_at_or_after(f, pos, limit, deadline=None):
    """(the first line start >= pos, at most limit; how far from pos - 1 no newline was seen).

    A line starts at 0 or just after a newline. Past the deadline (after one read) the search
    gives up and answers limit: no more cut points, the rest of the range is one piece.
    """
    if pos <= 0:
        return 0, 0
    at = pos - 1  # the byte before pos may be the newline that ends the previous line
    while at < limit:
        f.seek(at)
        block = f.read(min(ALIGN_READ_BYTES, limit - at))
        if not block:
            break
        nl = block.find(b"\n")
        if nl >= 0:
            return min(limit, at + nl + 1), at + nl
        at += len(block)
        if deadline is not None and time.monotonic() >= deadline:
            break
    return limit, at


def _bounds(f, start, stop, cuts, tail, deadline):
    """Piece bounds: start, then each cut moved to the next line start (ascending, < stop).

    The line at start is searched first, from where `tail` (the file's scan.TAILS entry) says
    an earlier search stopped; when it is long or does not end in the range, the tail keeps
    how far it was searched (the workers inherit it: they do not search those bytes again).
    Each byte is read at most once: a cut inside a region an earlier search found free of
    newlines has that search's answer (before, every cut re-read the rest of such a region).
    """
    known = tail[1] if tail[0] == start < tail[1] else start  # no newline from start to here
    bounds, found = [start], start
    if known < stop:
        found, clear_to = line_start_at_or_after(f, known + 1, stop, deadline)
        if found == stop or clear_to - start >= SCAN.CHUNK_BYTES:  # a long line: the scan resumes there
            tail[:] = [start, max(known, clear_to)]
    for c in sorted(cuts):
        if c <= found or not start < c < stop:
            continue
        found = line_start_at_or_after(f, c, stop, deadline)[0]
        if bounds[-1] < found < stop:
            bounds.append(found)
    return bounds


def shard_pieces(path, inode, offset, budget, workers, cuts=None, deadline=None):
    """(start info, [(path, inode, a, b), ...]) for one shard, or None when it cannot be opened.

    The range is what a one-process scan_file(path, inode, offset, budget) would cover: from
    the offset (0 after a rotation or truncation) to start + budget. Cut points (evenly spaced,
    or `cuts` as given by tests) are moved to the next line start, so no piece splits a line;
    the last piece ends where the range does and, like scan_file, finishes the line crossing it.
    Past the deadline no more cut points are searched for (_bounds).
    """
    try:
        with open(path, "rb", buffering=0) as f:
            st = os.fstat(f.fileno())
            start, reset = offset or 0, False
            if (inode is not None and st.st_ino != inode) or st.st_size < start:
                start, reset = 0, True
            stop = min(st.st_size, start + max(0, int(budget)))
            if cuts is None:
                n = max(1, min(workers * 4, (stop - start) // PIECE_MIN_BYTES))
                step = max(-(-(stop - start) // n), 1)
                step = min(step, PIECE_MAX_BYTES)
                cuts = range(start + step, stop, step)
            tail = SCAN.TAILS.get(path, st.st_ino)
            if reset:
                tail[:] = [-1, -1]  # truncated: what was searched before is gone
            bounds = _bounds(f, start, stop, cuts, tail, deadline)
    except OSError:
        return None
    ends = bounds[1:] + [stop]
    pieces = [(path, st.st_ino, a, b, i == len(bounds) - 1) for i, (a, b) in enumerate(zip(bounds, ends))]
    return {
        "inode": st.st_ino,
        "size": st.st_size,
        "start": start,
        "reset": reset,
        "stop": stop,
        "budget_stop": start + max(0, int(budget)),
    }, pieces


# ---------------------------------------------------------------------------- workers
def _lower_priority():
    try:
        os.nice(WORKER_NICE)
    except (AttributeError, OSError):
        pass  # no nice on this platform: scan at normal priority


def field_paths(req):
    """The request's configured field paths, all a worker needs of it (sent to it by pickling)."""
    req = req or {}
    keys = ("finish_reason_path", "completion_tokens_path", "prompt_id_path", "prompt_tokens_path", "group_path")
    return {k: req.get(k) for k in keys}


def scan_piece(piece, paths=None, deadline=None):
    """Count the complete lines of one piece (in a worker, or in-process for tests), with the
    configured field paths (`paths`, as scan_file takes them), exactly as one process would.

    Only the last piece may search past its end for a newline (up to the file's end), so that
    search stops at the poll's deadline and resumes next poll; other pieces end at line starts.
    """
    path, inode, a, b, last = piece
    before = SCAN.LINE_STATS["template"]
    entry = SCAN.scan_file(path, inode, a, b - a, paths, search_deadline=deadline if last else None)
    entry["template_lines"] = SCAN.LINE_STATS["template"] - before
    entry["worker"] = (os.getpid(), os.nice(0) if hasattr(os, "nice") else None)
    return entry


def _run_pieces(pieces, workers, deadline, runner, paths):
    """[(piece, entry)] in piece order; pieces not started by the deadline are left out."""
    LAST_RUN.update(workers=0 if runner is not None else workers, pids=set(), nice=set())
    if runner is not None:  # in-process, for tests of the splitting and merging
        return [(p, runner(p, paths, deadline)) for p in pieces]
    try:
        done = _pool_run(pieces, workers, deadline, paths)
    except Exception:  # no fork (limits), a worker killed (OOM): never a poll that cannot progress
        LAST_RUN["workers"] = 0
        return _in_process(pieces, deadline, paths)
    for _, e in done:
        LAST_RUN["pids"].add(e["worker"][0])
        LAST_RUN["nice"].add(e["worker"][1])
    return done


def _pool_run(pieces, workers, deadline, paths):
    import multiprocessing  # here, not at the top: most polls never start a worker

    done, inflight, queue = [], collections.deque(), collections.deque(pieces)  # type: list, collections.deque, collections.deque
    with multiprocessing.get_context("fork").Pool(workers, initializer=_lower_priority) as pool:
        first = True
        while queue or inflight:
            while queue and len(inflight) < 2 * workers and (first or deadline is None or time.monotonic() < deadline):
                piece = queue.popleft()
                inflight.append((piece, pool.apply_async(scan_piece, (piece, paths, deadline))))
            first = False  # the first batch always runs, so every poll makes progress
            if not inflight:
                break
            piece, result = inflight.popleft()
            done.append((piece, result.get(PIECE_TIMEOUT_S)))  # a killed worker's piece never returns
    return done


def _in_process(pieces, deadline, paths):
    done: list = []
    for piece in pieces:
        if done and deadline is not None and time.monotonic() >= deadline:
            break
        done.append((piece, scan_piece(piece, paths, deadline)))
    return done


# ---------------------------------------------------------------------------- merging
_NOT_SUMMED = frozenset(("inode", "size", "offset_from", "offset", "pending_bytes", "tokens", "template_lines"))


def _merge(info, results):
    """One poll-reply entry for a shard from its pieces' entries (an exact prefix of them)."""
    entry = {
        "inode": info["inode"],
        "size": info["size"],
        "offset_from": info["start"],
        "offset": info["start"],
        "reset": info["reset"],
        "lines": 0,
        "malformed": 0,
        "tokens": 0,
        "counts": [],
        "error": None,
        "problem": None,
        "pending_bytes": 0,
        "tail": None,
        "by_workers": True,
    }  # agent.py pops this: its line-start index was not extended
    counts, pos, finished, template_lines = {}, info["start"], False, 0  # type: dict, int, bool, int
    for piece, e in results:
        e.pop("worker", None)
        if e["error"] is not None or e["reset"] or e["inode"] != info["inode"] or e["offset_from"] != pos:
            if pos == info["start"] and e["error"] is not None:
                entry["error"] = e["error"]  # nothing counted: report why, like scan_file
            break  # the file changed under the workers: keep the exact prefix
        for t, fr, est, n in e["counts"]:
            counts[(t, fr, est)] = counts.get((t, fr, est), 0) + n
        if e.get("fields"):
            entry["fields"] = SCAN.fields.merge(entry.get("fields"), e["fields"])
        _merge_failed(entry, e)
        for key, value in e.items():  # lines, malformed and any other per-line tally scan_file keeps
            if key not in _NOT_SUMMED and isinstance(value, int) and not isinstance(value, bool):
                entry[key] = entry.get(key, 0) + value
        template_lines += e.get("template_lines", 0)
        entry["problem"] = e.get("problem") or entry.get("problem")  # text: carried, not summed
        entry["tail"] = e.get("tail")  # the last piece's unfinished line, as scan_file reports it
        pos = e["offset"]
        finished = piece[4] and not e["pending_bytes"]  # the last piece ran out of time: more to do
        if e["offset"] < piece[3] and not piece[4]:
            break  # a piece stopped short of its end (the file shrank): later pieces do not continue it
    rows = [[t, fr, est, n] for (t, fr, est), n in counts.items()]
    rows.sort(key=lambda r: (r[0], r[1] is not None, r[1] or "", r[2]))  # as scan.py's _Tally
    size = max(info["size"], pos)
    budget_hit = pos >= info["budget_stop"] or not finished
    entry.update(
        offset=pos,
        counts=rows,
        tokens=sum(r[0] * r[3] for r in rows),
        pending_bytes=size - pos if budget_hit and pos < size else 0,
    )
    return entry, template_lines


def _merge_failed(entry, e):
    """A piece's failed requests (wire.ShardEntry.failed, failed_ids) added to the entry's."""
    if e.get("failed"):
        acc = dict(entry.get("failed") or ())
        for reason, n in e["failed"]:
            acc[reason] = acc.get(reason, 0) + n
        entry["failed"] = SCAN.formats.bound_reasons(acc)
    if e.get("failed_ids"):
        joined = base64.b64decode(entry.get("failed_ids") or "") + base64.b64decode(e["failed_ids"])
        entry["failed_ids"] = base64.b64encode(joined).decode("ascii")


def worth_parallel(jobs, workers):
    """Whether the poll is a backlog worth workers: more than one, fork available, enough bytes."""
    return workers > 1 and can_fork() and sum(max(0, j[3]) for j in jobs) >= PARALLEL_MIN_BYTES


def scan_jobs(jobs, workers, scan_one, deadline=None, runner=None, cuts=None, paths=None):
    """Scan [(path, inode, offset, budget)], shards with a backlog in up to `workers` processes.

    Returns {path: entry}, each entry what scan_file() returns for that shard (design.md
    section 1, plus pending_bytes), with the counts one process would give. `scan_one(path,
    inode, offset, budget)` scans in this process: every shard when the poll is no backlog
    (worth_parallel), else the shards with less than PIECE_MIN_BYTES to do. deadline is a
    time.monotonic() value: pieces not started by then are left, and a shard cut short reports
    pending_bytes and the exact offset after its last counted line. paths: the request's
    finish_reason_path / completion_tokens_path (the workers count with them, as scan_one
    does). runner and cuts are for tests: run the pieces in-process with `runner`, cut shards
    at the byte offsets cuts[path].
    """
    if runner is None and not worth_parallel(jobs, workers):
        return {p: scan_one(p, inode, offset, budget) for p, inode, offset, budget in jobs}
    big = [j for j in jobs if j[3] >= PIECE_MIN_BYTES or (cuts and j[0] in cuts)]
    plans, pieces = {}, []
    for path, inode, offset, budget in big:
        planned = shard_pieces(path, inode, offset, budget, workers, (cuts or {}).get(path), deadline)
        if planned is not None:  # vanished or unreadable: scan_one reports the error below
            plans[path] = planned[0]
            pieces.extend(planned[1])
    results = collections.defaultdict(list)
    for piece, entry in _run_pieces(pieces, workers, deadline, runner, field_paths(paths)):
        results[piece[0]].append((piece, entry))
    out = {}
    for path, inode, offset, budget in jobs:
        if path not in plans:
            out[path] = scan_one(path, inode, offset, budget)
            continue
        out[path], template_lines = _merge(plans[path], results[path])
        if runner is None:  # the workers' own line stats went away with them
            SCAN.LINE_STATS["template"] += template_lines
            SCAN.LINE_STATS["json"] += out[path]["lines"] - template_lines
    return out
