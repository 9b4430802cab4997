"""runhealth node agent: serves poll / sample / hello requests over framed JSON on stdin/stdout.

One program of seven modules that runs on a GPU node, the package runhealth/node/: this one
(serving, the poll op, sampling and the line-start index), scan.py (shard scanning), fields.py
(per-line fields), formats.py (the output formats read, as data),
backfill.py (a backlog scanned by worker processes), gpu.py (GPU telemetry) and wire.py (the
request/reply shapes, SCHEMA_VERSION, size caps and framing). All of them use only the standard
library, keep Python 3.8-compatible syntax and are read-only on the node (shards opened "rb",
nothing written, no shell; the only subprocess is `nvidia-smi` started from an argv list). It
speaks the protocol of runhealth/node/wire.py (docs/design.md section 1) and starts three ways:
exec'd by remote/protocol.BOOTSTRAP (`runhealth_agent`, with `__modules__` holding the sources
of the other modules and optionally pynvml), as `python -I -S agent.py` (`__main__`), or
imported as `runhealth.node.agent`; import_part() finds the other modules in each case.
In-process callers (the dashboard, tests) use handle(), scan_file() and read_gpus().
"""

from __future__ import annotations

import array
import bisect
import collections
import fnmatch
import glob
import importlib
import itertools
import math
import os
import random
import socket
import stat as _stat
import sys
import time
import types

AGENT_VERSION = "1"
MIN_SHARE_BYTES = 1 << 20  # smallest per-shard slice of the poll budget
SHIPPED_PREFIX = "runhealth_node_"  # a part's name in the bootstrap's __modules__: + "scan" etc.


def import_part(name):
    """The node module `name` ("scan", "gpu", "backfill", "wire"), however this agent was started."""
    shipped = globals().get("__modules__") or {}
    source = shipped.get(SHIPPED_PREFIX + name)
    if source is not None:  # exec'd by BOOTSTRAP: the dashboard sent the source along
        mod = types.ModuleType(SHIPPED_PREFIX + name)
        mod.__dict__["__modules__"] = shipped  # gpu.py registers the shipped pynvml from it when needed
        sys.modules[mod.__name__] = mod
        exec(compile(source, mod.__name__ + ".py", "exec"), mod.__dict__)
        return mod
    package = globals().get("__package__")
    if package:  # imported as runhealth.node.agent
        return importlib.import_module(package + "." + name)
    path = globals().get("__file__")
    if not path:
        raise ImportError("%s: not shipped in __modules__ and no __file__ to look beside" % name)
    folder = os.path.dirname(os.path.abspath(path))  # `python -I` leaves it off sys.path
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


wire = import_part("wire")
scan = import_part("scan")
if scan.fields is None:  # shipped or run as a script: scan.py cannot import its siblings itself
    scan.fields = import_part("fields")
if scan.formats is None:
    scan.formats = scan.fields.formats = import_part("formats")
gpu = import_part("gpu")
backfill = import_part("backfill")
backfill.bind(scan)
SCHEMA_VERSION, METRICS_MAX_BYTES = wire.SCHEMA_VERSION, wire.METRICS_MAX_BYTES
FULL_TEXT_MAX_CHARS = wire.FULL_TEXT_MAX_CHARS
parse_smi_csv, read_gpus = gpu.parse_smi_csv, gpu.read_gpus  # public names, re-exported


class _State:
    """Process-wide memory of the serving side: line-start indexes per (path, inode), poll cursor."""

    def __init__(self):
        # [complete-line starts, indexed_to, (offset, content mark there) or None]
        self.index = scan.PerFile(lambda: [array.array("Q"), 0, None])
        self.rr_cursor = 0  # round-robin start so no shard starves under a small budget
        self.line_stats = scan.LINE_STATS  # lines counted by templates vs json.loads
        self.skip_notes = scan.PerFile(lambda: [None])  # the last "skipped a too-long line" note per file
        # path -> (stat key, offset, content mark): the mark this agent made or verified at that
        # offset while the file's inode, size, mtime and ctime were as in the key
        self.marked = {}  # type: dict
        self.dirs = {}  # type: dict  # folder -> ((dev, inode, mtime_ns), listing) of `**` walks

    def file_index(self, path, inode):
        return self.index.get(path, inode)

    def forget(self, path):
        """Drop everything remembered of `path` (its content was replaced under the same inode):
        line index, skip note, and scan.py's unfinished-line tail and templates."""
        for memory in (self.index, self.skip_notes, scan.TAILS, scan.TEMPLATES):
            memory.forget(path)
        self.marked.pop(path, None)


STATE = _State()


def scan_file(path, inode, offset, budget_bytes, paths=None, deadline=None):
    """scan.scan_file, also extending the line-start index that sampling draws from."""
    return scan.scan_file(path, inode, offset, budget_bytes, paths, STATE.file_index, deadline)


# ---------------------------------------------------------------------------- globs and poll
def expand_globs(globs, deadline=None, slow=None):
    """(sorted regular files matched by any glob, globs that matched nothing).

    A file is listed once however many paths reach it (symlinks, overlapping globs): files are
    keyed by (st_dev, st_ino), and of several paths the one through no symlink is kept.
    `deadline` (time.monotonic()) bounds the listing of `**` trees (_glob_files); a glob whose
    walk it cut short is not called unmatched, and `slow` (a dict) gets glob -> what was left.
    """
    by_id, unmatched, visited = {}, [], set()  # type: dict, list, set
    for pattern in globs:
        hits, left = 0, []  # type: int, list
        for p in _glob_files(pattern, deadline, left, visited):
            try:
                st = os.stat(p)
            except OSError:
                continue
            if not _stat.S_ISREG(st.st_mode):
                continue
            hits += 1
            key, old = (st.st_dev, st.st_ino), by_id.get((st.st_dev, st.st_ino))
            if old is None or _path_rank(p) < _path_rank(old):
                by_id[key] = p
        if left and slow is not None:
            slow[pattern] = left[0]
        elif not hits:
            unmatched.append(pattern)
    if not (slow or {}) and any("**" in g for g in globs):  # a whole walk: forget folders gone from it
        for gone in set(STATE.dirs) - visited:
            del STATE.dirs[gone]
    return sorted(by_id.values()), unmatched


def _path_rank(path):
    """Prefer the real path (no symlink in it), then the shorter, then the first in order."""
    return (os.path.realpath(path) != os.path.abspath(path), len(path), path)


def wire_name(path):
    """The name a path travels under: itself, or for a file name that is not UTF-8 (os.fsdecode
    keeps the bytes as lone surrogates, which no UTF-8 text can hold) its bytes with each
    undecodable one written as \\xNN. The dashboard keys its offsets by this name and sends it
    back, and the agent matches it against the same function of what its globs find."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")


def _by_wire_name(files):
    """{wire name: path}; of two files with one wire name (a literal "\\xff" beside a real 0xff
    byte) the second is left out and returned apart, so neither is counted twice."""
    named, clashes = {}, []  # type: dict, list
    for p in files:
        key = wire_name(p)
        if key in named:
            clashes.append(p)
        else:
            named[key] = p
    return named, clashes


def _glob_files(pattern, deadline=None, left=None, visited=None):
    """Paths matching `pattern`; `**` (any depth, hidden names excluded as glob does) walks the
    tree, following directory symlinks but entering no directory (st_dev, st_ino) twice,
    so a link back to an ancestor ends instead of looping. Directories reached without a
    symlink are walked before linked ones, so a file's real path is the one found.

    The walk is incremental: a directory's listing is kept (STATE.dirs) with its mtime and
    listed again only when that changed (an entry added, removed or renamed in it), so a
    tree that did not change costs one stat per directory. Past `deadline` no directory is
    listed anew (one at least per walk, so a walk spread over polls always gets further);
    then `left` (a list) gets what was not listed, and the files found so far are returned.
    """
    if "**" not in pattern:
        return glob.glob(pattern)
    parts = pattern.split(os.sep)
    k = next(i for i, c in enumerate(parts) if glob.has_magic(c))
    base = os.sep.join(parts[:k]) or (os.sep if k else "")
    rest, out, seen = parts[k:], [], set()
    hidden_ok = any(c.startswith(".") for c in rest)
    real, linked = collections.deque([(base or os.curdir, [])]), collections.deque()  # type: collections.deque, collections.deque
    unlisted, fresh = 0, [False]  # fresh[0]: a folder was listed anew in this walk
    while real or linked:
        folder, names = (real or linked).popleft()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = _dir_entries(folder, st, deadline if fresh[0] else None, fresh)
        except OSError:
            continue
        if entries is None:  # past the deadline and not listed before (or changed since)
            unlisted += 1
            continue
        if visited is not None:
            visited.add(folder)
        for name, is_dir, is_link in entries:
            if name.startswith(".") and not hidden_ok:
                continue
            path = os.path.join(folder, name)
            if is_link:  # where a link points may change without its folder's mtime changing
                is_dir = os.path.isdir(path)
            if is_dir:
                (linked if is_link else real).append((path, names + [name]))
            elif _glob_match(names + [name], rest):
                out.append(path if base else os.path.join(*names, name))
    if unlisted and left is not None:
        left.append(
            "walking %s did not finish within the scan's time budget: at least %d folder(s) not listed yet "
            "(the walk resumes next poll; folders that did not change are not listed again)" % (pattern, unlisted)
        )
    return out


RACY_MTIME_S = 2.0  # a folder changed this recently may change again within its mtime's tick


def _dir_entries(folder, st, deadline, fresh):
    """[(name, is_dir, is_symlink)] of `folder` by name, from STATE.dirs when its (dev, inode,
    mtime) did not change since it was listed; None when it needs listing and `deadline` passed.
    Listing it anew sets fresh[0].
    A folder listed within RACY_MTIME_S of its mtime is listed again next time (an entry made
    in the same mtime tick would not change the mtime)."""
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)
    known = STATE.dirs.get(folder)
    if known is not None and known[0] == key:
        return known[1]
    if deadline is not None and time.monotonic() >= deadline:
        return None
    entries, fresh[0] = [], True
    with os.scandir(folder) as it:
        for e in it:
            try:
                entries.append((e.name, e.is_dir(), e.is_symlink()))
            except OSError:
                continue
    entries.sort()
    if time.time() - st.st_mtime >= RACY_MTIME_S:
        STATE.dirs[folder] = (key, entries)
    else:
        STATE.dirs.pop(folder, None)
    return entries


def _glob_match(names, pats):
    """Path components against pattern components; "**" takes zero or more non-hidden ones."""
    if not pats:
        return not names
    if pats[0] == "**":
        for i in range(len(names) + 1):
            if _glob_match(names[i:], pats[1:]):
                return True
            if i < len(names) and names[i].startswith("."):
                return False
        return False
    if not names or (names[0].startswith(".") and not pats[0].startswith(".")):
        return False
    return fnmatch.fnmatchcase(names[0], pats[0]) and _glob_match(names[1:], pats[1:])


def _plan_budget(needs, budget_bytes):
    """Split the poll budget over shards with work. A shard is taken in (round-robin order, so
    none starves) while the budget still holds what it needs up to MIN_SHARE_BYTES, so thousands
    of small shards share one budget instead of taking a 1 MB slot each; the budget is then
    water-filled over those taken: each gets what it needs or an even share of what is left."""
    paths = sorted(p for p, need in needs.items() if need > 0)
    if not paths:
        return {}
    k = STATE.rr_cursor % len(paths)
    paths = paths[k:] + paths[:k]
    chosen, cost, skipped = [], 0, 0  # type: list, int, int
    for i, p in enumerate(paths):
        c = min(needs[p], MIN_SHARE_BYTES)
        if chosen and cost + c > budget_bytes:
            skipped = skipped or i  # i > 0: the first shard is always taken
            continue
        chosen.append(p)
        cost += c
    STATE.rr_cursor += skipped  # the first shard left out goes first next time
    plan, left = {}, budget_bytes
    for i, p in enumerate(sorted(chosen, key=needs.get)):
        plan[p] = min(needs[p], left // (len(chosen) - i))
        left -= plan[p]
    return plan


def _poll_shards(req):
    t0 = time.monotonic()  # "budget_s": time limit of walk + scan, kept well inside the caller's timeout
    deadline = None if req.get("budget_s") is None else t0 + float(req["budget_s"])
    slow = {}  # type: dict  # glob -> why its walk is not complete: it may use half the time at most
    found, unmatched = expand_globs(req.get("globs") or [], None if deadline is None else (t0 + deadline) / 2, slow)
    named, clashes = _by_wire_name(found)
    files = list(named.values())
    wire_state = req.get("state") or {}
    state = {p: wire_state.get(k) for k, p in named.items()}  # keyed by the real path from here
    budget = wire.DEFAULT_BUDGET_BYTES if req.get("budget_bytes") is None else int(req["budget_bytes"])
    needs, searched, seen = {}, {}, {}  # type: dict, dict, dict
    replaced, verified = set(), {}  # type: set, dict  # content marks: see _replaced
    for p in files:
        prev = state.get(p) or {}
        try:
            st = os.stat(p)
        except OSError:
            continue
        if _replaced(p, prev, st, verified):  # rewritten under the same inode: counted from byte 0
            replaced.add(p)
            prev = state[p] = {"inode": st.st_ino, "offset": 0}
        off = int(prev.get("offset") or 0)
        moved = prev.get("inode") not in (None, st.st_ino) or st.st_size < off
        searched[p] = 0 if moved else _searched_to(p, st, off) - off  # not read again: not in the budget
        needs[p] = st.st_size - off - searched[p]
        seen[p] = st.st_size
    walk_s = time.monotonic() - t0  # globbing and stat-ing: not scan speed (the collector's budget)
    workers = backfill.resolve_workers(req.get("scan_workers"))
    if backfill.worth_parallel([(p, None, 0, n) for p, n in needs.items()], workers):
        budget *= workers  # budget_bytes is per worker: a backlog goes `workers` times as fast
    plan = _plan_budget(needs, budget)
    jobs = [
        (p, (state.get(p) or {}).get("inode"), int((state.get(p) or {}).get("offset") or 0), _share(plan, searched, p))
        for p in files
    ]

    def scan_one(p, inode, offset, share):
        late = deadline is not None and time.monotonic() >= deadline  # then only sizes are taken
        return scan_file(p, inode, offset, 0 if late else share, req, deadline)

    out = backfill.scan_jobs(jobs, workers, scan_one, deadline=deadline, paths=req)
    _mark_entries(out, replaced, verified)
    for p, e in out.items():
        if e.get("by_workers") and e["reset"]:  # sampling rebuilds a reset shard's line index
            idx = STATE.file_index(p, e["inode"])
            idx[0], idx[1] = array.array("Q"), 0
    pending = sum(_pending(e, seen.get(p)) for p, e in out.items())
    by_workers = [e.pop("by_workers", False) for e in out.values()]
    used = backfill.LAST_RUN["workers"] if any(by_workers) else 0
    for p, e in out.items():
        e["problem"] = _sticky_problem(p, e)
        tail = e.pop("tail", None)
        if tail is not None and e.get("inode") is not None:  # kept here too when a worker found it
            scan.TAILS.get(p, e["inode"])[:] = tail
    replies = {wire_name(p): e for p, e in out.items()}
    for p in clashes:  # named on screen, counted by neither path
        replies[wire_name(p) + " (second file)"] = _clash_entry(p)
    return {
        "matched": len(files),
        "unmatched_globs": unmatched,
        "pending_bytes": pending,
        "scan_s": round(time.monotonic() - t0, 4),
        "walk_s": round(walk_s, 4),
        "slow_globs": slow,
        "scan_workers": used,
        "files": replies,
    }, files


def _replaced(path, prev, st, verified):
    """Whether the file's bytes before its stored offset no longer hash to the stored mark: it
    was rewritten under the same inode (a relaunch: `rm` + create on ext4, or open(path, "w")),
    so the caller counts it from byte 0 as a reset; the agent forgets it here. A cursor without
    a mark (a store from before marks) is trusted on inode and size, as before; so is one whose
    inode or size already says reset (the scan sees that itself). A file not written since this
    agent marked it (same inode, size, mtime and ctime as `st`, taken before any read) is not
    read again: an idle shard costs a dict lookup. A verified mark goes into `verified`."""
    off, mark = int(prev.get("offset") or 0), prev.get("mark")
    if off <= 0 or not mark or st.st_ino != prev.get("inode") or st.st_size < off:
        return False
    if STATE.marked.get(path) != (_stat_key(st), off, mark):
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())  # before the read: a write after it changes the key
                if st.st_ino != prev.get("inode"):
                    return False  # rotated just now: the scan sees the new inode
                same = scan.content_mark(f.fileno(), off) == mark
        except OSError:
            return False  # vanished or unreadable: the scan reports it
        if not same:
            STATE.forget(path)
            return True
        STATE.marked[path] = (_stat_key(st), off, mark)
    verified[path] = (off, mark)
    return False


def _stat_key(st):
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _mark_entries(out, replaced, verified):
    """Give each entry whose offset moved the content mark there (the collector stores it and
    sends it back; an entry without one keeps the stored mark, so idle shards send none), and
    make each replaced file's entry a reset. A file rewritten while it was scanned (its verified
    bytes changed since the check) gets SHORT_MARK, which no mark equals, so the next poll
    recounts it from byte 0 rather than keep counts read across the rewrite."""
    for p, e in out.items():
        if p in replaced:
            e["reset"] = e["replaced"] = True
        off, known = e["offset"], verified.get(p)
        if (known is not None and known[0] == off) or e["error"] is not None:
            continue  # nothing new counted: the stored mark stands
        e["mark"] = _mark_after_scan(p, e, off, known) if off > 0 else None
        idx = STATE.index.entries.get((p, e["inode"]))
        if idx is not None and idx[1] == off and e["mark"] is not None:
            idx[2] = (off, e["mark"])  # lets sampling check the index before a poll does


def _mark_after_scan(path, entry, offset, known):
    """The mark at the offset a scan reached: None when the file is gone or another inode now;
    SHORT_MARK when the bytes verified before the scan (`known`: offset, mark) changed since.
    The new mark is read before the old one is checked again, so a rewrite at any moment shows
    in one of them."""
    try:
        with open(path, "rb", buffering=0) as f:
            fd = f.fileno()
            st = os.fstat(fd)
            if st.st_ino != entry.get("inode"):
                return None  # rotated since: the inode says reset next poll
            head = os.pread(fd, scan.MARK_BYTES, 0)
            mark = scan.content_mark(fd, offset, head)
            if known is not None and scan.content_mark(fd, known[0], head) != known[1]:
                return scan.SHORT_MARK
    except OSError:
        return None
    if mark != scan.SHORT_MARK:
        STATE.marked[path] = (_stat_key(st), offset, mark)
    return mark


def _pending(entry, seen_size):
    """The entry's bytes left (popped from it) that a poll could have counted: past the budget
    or the deadline, of the bytes there when this poll looked (`seen_size`: what was written
    since is the next poll's, not a backlog), less an unfinished line's bytes already searched
    for a newline (its tail). A stalled half-written last line is no work left: it cannot end
    until its writer writes."""
    pending, tail, offset = entry.pop("pending_bytes"), entry.get("tail"), entry.get("offset") or 0
    if not pending:
        return 0
    size = entry.get("size") if seen_size is None else min(seen_size, entry.get("size") or seen_size)
    done = max(offset, tail[1]) if tail is not None and tail[0] == offset else offset
    return max(0, min(pending, size - done)) if size is not None else pending


def _share(plan, searched, path):
    """A shard's byte budget from its offset: its share of the poll's, plus what an earlier
    search found free of newlines (skipped, not read again), so the share starts past it."""
    share = plan.get(path, 0)
    return share + searched.get(path, 0) if share else 0


def _searched_to(path, st, offset):
    """Where the work on a shard starts: its offset, or past an unfinished line at that offset
    as far as an earlier search found no newline (only bytes added since need a look)."""
    tail = scan.TAILS.entries.get((path, st.st_ino))
    if tail is not None and tail[0] == offset and tail[1] <= st.st_size:
        return tail[1]
    return offset


def _sticky_problem(path, entry):
    """The entry's problem, else the last too-long line this agent skipped in this file: that
    line is behind the offset and never scanned again, so the note would vanish next poll."""
    note = STATE.skip_notes.get(path, entry.get("inode"))
    if entry.get("reset"):
        note[0] = None
    problem = entry.get("problem")
    if problem and problem.startswith("skipped"):
        note[0] = problem
    return problem or note[0]


CLASH_ERROR = "not counted: its name, shown with \\xNN for bytes that are not UTF-8, is another file's"


def _clash_entry(path):
    """A file entry that counts nothing and says why (its wire name is another file's)."""
    entry = scan.empty_entry(None, 0, CLASH_ERROR)
    del entry["pending_bytes"], entry["tail"]  # as the other entries leave poll (counted, popped)
    return entry


def _disk(files):
    """statvfs of each shard folder, one entry per filesystem (st_dev)."""
    out, seen = {}, set()  # type: dict, set
    for folder in sorted({os.path.dirname(os.path.abspath(p)) for p in files}):
        try:
            dev = os.stat(folder).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            vfs = os.statvfs(folder)
            out[wire_name(folder)] = {
                "free_bytes": vfs.f_bavail * vfs.f_frsize,
                "total_bytes": vfs.f_blocks * vfs.f_frsize,
                "error": None,
            }
        except OSError as exc:
            out[wire_name(folder)] = {"free_bytes": None, "total_bytes": None, "error": str(exc)}
    return out


def _fetch_metrics(urls, timeout_s):
    """Raw Prometheus text per URL (http/https only), at most METRICS_MAX_BYTES each."""
    import urllib.parse
    import urllib.request

    # No proxies: metrics endpoints are node-local and a node's http_proxy would break them.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    out = {}
    for url in urls:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            out[url] = {"text": None, "error": "only http/https metrics URLs are allowed"}
            continue
        try:
            with opener.open(url, timeout=timeout_s) as resp:
                data = resp.read(METRICS_MAX_BYTES + 1)
            error = "truncated at %d bytes" % METRICS_MAX_BYTES if len(data) > METRICS_MAX_BYTES else None
            out[url] = {"text": data[:METRICS_MAX_BYTES].decode("utf-8", "replace"), "error": error}
        except Exception as exc:  # a dead endpoint is a card on screen, not a failed poll
            out[url] = {"text": None, "error": "%s: %s" % (type(exc).__name__, exc)}
    return out


def read_host(meminfo="/proc/meminfo"):
    """CPUs and RAM / swap in bytes from /proc/meminfo (MemAvailable, as `free` shows it);
    a field the kernel does not report is left out."""
    out = {"cpus": os.cpu_count()}
    keys = {
        "MemTotal": "mem_total_bytes",
        "MemAvailable": "mem_available_bytes",
        "SwapTotal": "swap_total_bytes",
        "SwapFree": "swap_free_bytes",
    }
    try:
        with open(meminfo, "rb") as f:
            for line in f.read().decode("ascii", "replace").splitlines():
                name, _, rest = line.partition(":")
                if name in keys and rest.split():
                    out[keys[name]] = int(rest.split()[0]) * 1024  # the kernel writes kB
    except (OSError, ValueError):
        pass
    return out


def demo_host(t, seed):
    """A simulated run's host (the built-in demo: `demo_host` in the request): a 64-CPU, 2 TiB node
    at a calm load, marked simulated. The demo runs on the dashboard's own machine, whose real
    CPU load and RAM warnings do not belong to a simulated run (#41)."""
    load = 12.0 + 4.0 * math.sin(t / 60.0 + seed)
    host = {
        "cpus": 64,
        "mem_total_bytes": 2 << 40,
        "mem_available_bytes": int((1.3 + 0.1 * math.sin(t / 90.0)) * (1 << 40)),
    }
    host.update(swap_total_bytes=0, swap_free_bytes=0, simulated=True)
    return [round(load, 2), round(load * 0.95, 2), round(load * 0.9, 2)], host


def _op_poll(req):
    shards, files = _poll_shards(req.get("shards") or {})
    try:
        load = list(os.getloadavg())
    except (AttributeError, OSError):
        load = None
    host = read_host()
    seed = int(req.get("demo_seed", 0))
    if req.get("demo_host"):
        load, host = demo_host(float(req.get("demo_time_unix") or time.time()), seed)
    return {
        "hostname": socket.gethostname(),
        "loadavg": load,
        "host": host,
        "gpus": read_gpus(req.get("gpu", "auto"), int(req.get("demo_gpus", 8)), req.get("demo_time_unix"), seed),
        "shards": shards,
        "disk": _disk(files),
        "metrics": _fetch_metrics(req.get("metrics_urls") or [], float(req.get("metrics_timeout_s", 2.0))),
    }


def _op_hello(req):
    return {
        "agent_version": AGENT_VERSION,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
    }


# ---------------------------------------------------------------------------- sampling
def _extend_index(f, idx, size, tail=None):
    """Append the starts of complete lines after idx[1] with a fast newline split pass."""
    pos, reader = idx[1], scan.Reader(f, size, size - idx[1], tail)
    while pos < size:
        buf, end = reader.lines(pos, scan.CHUNK_BYTES)
        if buf is None:  # a line too long to hold: indexed (line numbers stay right), never read
            idx[0].append(pos)
            pos += end
            idx[1] = pos
            continue
        if end == 0:
            break
        parts = buf[:end].split(b"\n")
        starts = itertools.accumulate(map((1).__add__, map(len, parts)), initial=pos)
        idx[0].extend(itertools.islice(starts, len(parts) - 1))
        pos += end
        idx[1] = pos


def _text_parts(obj):
    """The record's reasoning text, then its answer (where its format keeps them)."""
    loc = scan.locate(obj)
    return [t for t in (scan.formats.get_at(obj, p) for p in scan.text_paths(loc, obj)) if isinstance(t, str)]


def _message_text(msg):
    content = msg.get("content") if isinstance(msg, dict) else None
    if isinstance(content, list):  # multimodal parts: keep the text ones
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else None


def _prompt_at(obj, dotted):
    """The prompt at a configured dotted path: a string, or a list of chat messages."""
    found = scan.formats.get_at(obj, scan.parse_path(dotted))
    if isinstance(found, str):
        return found
    if isinstance(found, list) and all(isinstance(m, dict) and "role" in m for m in found):
        return found
    return None


def _prompt_text(obj):
    """Prompt of a record: "prompt", last user message of "messages", or the same in "request"."""
    for holder in (obj, obj.get("request"), obj.get("body")):
        if not isinstance(holder, dict):
            continue
        prompt = holder.get("prompt", holder.get("input"))
        if isinstance(prompt, str):
            return prompt
        msgs = holder.get("messages")
        if isinstance(msgs, list):
            users = [m for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
            text = _message_text(users[-1]) if users else None
            if text is not None:
                return text
    return None


def _sample_line(f, path, line_no, start, stop, req, overrides):
    """One sample dict for the line f[start:stop] (line_no counts from 1)."""
    out = {
        "path": wire_name(path),
        "line_no": line_no,
        "offset": start,
        "tokens": None,
        "estimated": None,
        "finish_reason": None,
        "prompt_head": None,
        "text_head": "",
        "text_tail": "",
        "text_chars": 0,
        "prompt": None,
        "text": None,
        "error": None,
    }
    if stop - start > scan.MAX_LINE_BYTES:
        out["error"] = "line of %d bytes, longer than the %d-byte line bound: not read" % (
            stop - start,
            scan.MAX_LINE_BYTES,
        )
        return out
    f.seek(start)
    obj = scan.load_line(f.read(stop - start).rstrip(b"\n"))
    if obj is not None and scan.formats.failure(obj) is not None:
        return None  # a failed request is no completion: never a sample (_draw draws again)
    key = None if obj is None else scan.count_key(obj, overrides)
    if key is None:
        out["error"] = "malformed line (not a JSON object, or an invalid token count)"
        return out
    out["tokens"], out["finish_reason"], out["estimated"] = key[0], scan.clean_value(key[1]), key[2]
    _sample_text(out, obj, req)
    return out


def _sample_text(out, obj, req):
    """The sample's prompt and completion text (heads, tails, whole with full_text), every
    lone surrogate as U+FFFD so the batch can be stored."""
    text = scan.clean_text("\n\n".join(_text_parts(obj)))
    full = scan.clean_value(_prompt_at(obj, req["prompt_path"]) if req.get("prompt_path") else _prompt_text(obj))
    # A message list (prompt_path to "request.messages") is kept whole for continuations.
    prompt = (
        full
        if not isinstance(full, list)
        else ([_message_text(m) for m in full if m.get("role") == "user"] or [None])[-1]
    )
    head, tail = int(req.get("head_chars", 400)), int(req.get("tail_chars", 4000))
    out.update(
        text_head=text[:head],
        text_tail=text[-tail:] if tail else "",
        text_chars=len(text),
        prompt_head=None if prompt is None else prompt[:head],
    )
    if req.get("full_text"):
        out.update(
            text=text[:FULL_TEXT_MAX_CHARS],
            prompt=full if isinstance(full, list) else None if full is None else full[:FULL_TEXT_MAX_CHARS],
        )


def _op_sample(req):
    if scan.formats.set_cut_labels(req.get("cut_labels")):
        scan.TEMPLATES.entries.clear()  # learned under the old label maps
    files, unmatched = expand_globs(req.get("globs") or [])  # only files the globs match
    overrides, handles, tables = scan.parse_overrides(req), {}, []
    try:
        for p in files:
            try:
                f = handles[p] = open(p, "rb", buffering=0)
            except OSError:
                continue
            st = os.fstat(f.fileno())
            idx = _checked_index(p, f, st)
            _extend_index(f, idx, st.st_size, scan.TAILS.get(p, st.st_ino))
            if idx[1] > 0 and (idx[2] is None or idx[2][0] != idx[1]):
                idx[2] = (idx[1], scan.content_mark(f.fileno(), idx[1]))
            tables.append((p, f, idx[0], len(idx[0]), idx[1]))  # snapshot: polls may extend it
        return _draw(tables, req, overrides, unmatched)
    finally:
        for f in handles.values():
            f.close()


def _checked_index(path, f, st):
    """The file's line-start index, or a fresh one when the file shrank below it or its bytes
    before a marked offset changed (rewritten under the same inode: the old starts would
    point into the new content)."""
    idx = STATE.file_index(path, st.st_ino)
    mark = idx[2]
    if mark is not None and st.st_size >= mark[0] and scan.content_mark(f.fileno(), mark[0]) != mark[1]:
        STATE.forget(path)
        return STATE.file_index(path, st.st_ino)
    if st.st_size < idx[1]:
        idx[0], idx[1], idx[2] = array.array("Q"), 0, None
    return idx


def _draw(tables, req, overrides, unmatched):
    """Uniform draws among complete lines, without replacement, optional finish_reason filter."""
    cum = list(itertools.accumulate(t[3] for t in tables))
    population = cum[-1] if cum else 0
    rng, n, want = (
        random.Random(req.get("seed")),
        min(int(req.get("n", 50)), wire.MAX_SAMPLE_N),
        req.get("finish_reason"),
    )
    cap = max(1000, 200 * n) if want is not None else 4 * n + 100
    chosen, samples, attempts = set(), [], 0  # type: set, list, int
    while len(samples) < n and attempts < cap and len(chosen) < population:
        attempts += 1
        g = rng.randrange(population)
        if g in chosen:
            continue
        chosen.add(g)
        fi = bisect.bisect_right(cum, g)
        path, f, starts, count, indexed_to = tables[fi]
        k = g - (cum[fi - 1] if fi else 0)
        stop = starts[k + 1] if k + 1 < count else indexed_to
        s = _sample_line(f, path, k + 1, starts[k], stop, req, overrides)
        if s is not None and (want is None or s["finish_reason"] == want):
            samples.append(s)
    return {"population": population, "attempts": attempts, "unmatched_globs": unmatched, "samples": samples}


# ---------------------------------------------------------------------------- requests and serving
_OPS = {"hello": _op_hello, "poll": _op_poll, "sample": _op_sample}  # type: dict


def handle(request):
    """Answer one request dict (op hello / poll / sample); failures become ok:false replies."""
    t0 = time.time()
    try:
        op = _OPS.get(request.get("op")) if isinstance(request, dict) else None
        if op is None:
            raise ValueError("unknown op %r" % (request.get("op") if isinstance(request, dict) else request,))
        reply = {"schema_version": SCHEMA_VERSION, "ok": True}  # type: dict
        reply.update(op(request))
    except Exception as exc:
        return {"schema_version": SCHEMA_VERSION, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    reply["time_unix"] = time.time()
    reply["agent_ms"] = round((time.time() - t0) * 1000.0, 3)
    return reply


def _write_frame(out, reply):
    try:
        data = wire.encode_frame(reply, sync=True)
    except (TypeError, ValueError) as exc:
        data = wire.encode_frame(
            {"schema_version": SCHEMA_VERSION, "ok": False, "error": "reply is not JSON: %s" % exc}, sync=True
        )
    out.write(data)
    out.flush()


def serve(inp, out):
    """Serve frames until EOF; a bad request gets an ok:false reply and serving goes on."""
    while True:
        try:
            request = wire.read_frame(inp)
        except (ValueError, UnicodeDecodeError) as exc:
            request = {"op": None, "_error": "bad frame: %s" % exc}
        if request is None:
            return 0
        if "_error" in request:
            reply = {"schema_version": SCHEMA_VERSION, "ok": False, "error": request["_error"]}
        else:
            reply = handle(request)
        _write_frame(out, reply)


def _main():
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt a frame
    try:
        return serve(inp, out)
    except BrokenPipeError:
        return 0  # the dashboard went away
    except Exception as exc:  # cannot produce JSON any more
        sys.stderr.write("runhealth agent: %s: %s\n" % (type(exc).__name__, exc))
        return 2


if __name__ in ("__main__", "runhealth_agent"):
    sys.exit(_main())
