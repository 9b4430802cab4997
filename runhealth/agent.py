"""runhealth node agent: counts finished generations in JSONL shards, reads GPU telemetry.

One self-contained script that runs on a GPU node. It uses only the standard library,
keeps Python 3.8-compatible syntax, is read-only on the node (shards opened "rb", nothing
written, no shell; the only subprocess is `nvidia-smi` started from an argv list) and speaks
the framed JSON protocol of docs/design.md section 1 on stdin/stdout. It runs as
`python -I -S agent.py` (`__main__`) or exec'd by protocol.BOOTSTRAP (`runhealth_agent`, with
`__modules__` holding sources to register when the node lacks them, e.g. pynvml).
In-process callers (the dashboard, tests) use handle(), scan_file() and read_gpus().

Shard scanning is the hot path. Per shard the agent learns *templates* from lines it parsed
with json.loads: the line's JSON skeleton as a regex (keys and structure literal, scalars
generic, finish_reason / completion_tokens captured) with long text strings left as holes that
are skipped, not decoded: bytes.find for the closing quote, or one C-level regex scan past
escaped quotes. Unlike a bare search for the key bytes, a template also proves the key sits at
the right path (a lone nested "finish_reason" cannot pass for the real one). A line that matches a template has the
same key structure as the line the template came from, so its counts equal json.loads' counts;
any other line (other schema, escapes in finish_reason, no completion_tokens, overrides set)
takes the json.loads path. Limitation: hole contents are not validated, so a line whose text
holds raw control characters or bad escapes (never written by json.dumps, serde or Go) counts
as valid here while json.loads would call it malformed.
"""
from __future__ import annotations

import array
import bisect
import glob
import itertools
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import time
import types

AGENT_VERSION = "1"
SCHEMA_VERSION = 1
CHUNK_BYTES = 16 << 20  # large reads amortise syscalls; memory stays flat in file size
MIN_SHARE_BYTES = 1 << 20  # smallest per-shard slice of the poll budget
MAX_TEMPLATES = 6  # SGLang finish_reason objects differ by type, so allow a few shapes
MAX_TEMPLATE_BUILDS = 24  # per shard: a shard of odd lines must not rebuild forever
TEMPLATE_MAX_LINE_BYTES = 1 << 20
TEMPLATE_MAX_TOKENS = 400  # logprobs-heavy lines: templates would be huge, use json.loads
METRICS_MAX_BYTES = 8 << 20
FULL_TEXT_MAX_CHARS = 1 << 20
TEXT_KEYS = ("text", "completion", "output", "response")
HOLE_KEYS = frozenset(("content", "reasoning_content", "reasoning", "prompt", "input") + TEXT_KEYS)


class _State:
    """Process-wide memory: line-start indexes and templates per (path, inode), NVML handle."""

    def __init__(self):
        self.index = {}  # (path, inode) -> [array('Q') of complete-line starts, indexed_to]
        self.templates = {}  # (path, inode) -> [strict plans, tolerant plans, builds left]
        self.inode_of = {}  # path -> inode last seen
        self.rr_cursor = 0  # round-robin start so no shard starves under a small budget
        self.nvml = None
        self.nvml_error = None
        self.nvml_missing = []  # NVML functions this driver lacks, noted once each
        self.line_stats = {"template": 0, "json": 0}

    def file_index(self, path, inode):
        self._forget_rotated(path, inode)
        return self.index.setdefault((path, inode), [array.array("Q"), 0])

    def file_templates(self, path, inode):
        self._forget_rotated(path, inode)
        return self.templates.setdefault((path, inode), [[], [], MAX_TEMPLATE_BUILDS])

    def _forget_rotated(self, path, inode):
        """Drop what belonged to an earlier file at this path, so memory tracks live shards."""
        old = self.inode_of.get(path)
        if old != inode:
            self.index.pop((path, old), None)
            self.templates.pop((path, old), None)
            self.inode_of[path] = inode


STATE = _State()


# ---------------------------------------------------------------------------- field rules
def _get(obj, path):
    """Follow a key/index path through dicts and lists; None when any step is missing."""
    for part in path:
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and isinstance(part, int) and -len(obj) <= part < len(obj):
            obj = obj[part]
        else:
            return None
    return obj


def _parse_path(dotted):
    """"choices.0.finish_reason" -> ("choices", 0, "finish_reason")."""
    return tuple(int(p) if p.lstrip("-").isdigit() else p for p in dotted.split("."))


def _locate(obj):
    """Paths of (finish_reason, completion_tokens, [completion text parts]) for one record."""
    body = _get(obj, ("response", "body"))
    root = ("response", "body") if isinstance(obj.get("response"), dict) and isinstance(body, dict) else ()
    rec = body if root else obj
    choices = rec.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c0 = root + ("choices", 0)
        if isinstance(choices[0].get("message"), dict):
            msg = choices[0]["message"]
            why = "reasoning_content" if isinstance(msg.get("reasoning_content"), str) else "reasoning"
            texts = [c0 + ("message", why), c0 + ("message", "content")]
        else:
            texts = [c0 + ("text",)]
        return c0 + ("finish_reason",), root + ("usage", "completion_tokens"), texts
    meta = rec.get("meta_info")
    if isinstance(meta, dict):
        fr = ("meta_info", "finish_reason")
        fr = fr + ("type",) if isinstance(meta.get("finish_reason"), dict) else fr
        return fr, ("meta_info", "completion_tokens"), [("text",)]
    usage = rec.get("usage")
    ct = ("usage", "completion_tokens") if isinstance(usage, dict) and "completion_tokens" in usage else ("completion_tokens",)
    text = next((k for k in TEXT_KEYS if isinstance(rec.get(k), str)), "text")
    return ("finish_reason",), ct, [(text,)]


def _count_key(obj, overrides):
    """(tokens, finish_reason, estimated) of one parsed record, the reference semantics."""
    fr_path, ct_path, texts = _locate(obj)
    fr = _get(obj, overrides[0] or fr_path)
    ct = _get(obj, overrides[1] or ct_path)
    if isinstance(ct, int) and not isinstance(ct, bool) and ct >= 0:
        return ct, fr if isinstance(fr, str) else None, 0
    chars = sum(len(t) for t in (_get(obj, p) for p in texts) if isinstance(t, str))
    return -(-chars // 4), fr if isinstance(fr, str) else None, 1


def _load_line(raw):
    """json.loads one line (strict UTF-8); None when it is not a JSON object."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


# ---------------------------------------------------------------------------- templates
_TOKEN_RE = re.compile(
    rb'([ \t\r]*)(?:("(?:[^"\\]|\\.)*")|(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)'
    rb'|(true|false|null)|([{}\[\]:,]))'
)
_WS = rb"[ \t\r]*"
_STR = rb'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"'
_NUM = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_LIT = rb"true|false|null"
_SCALARS = {  # any JSON scalar; the type seen in the template's line is tried first (speed only)
    "s": b"(?:" + _STR + b"|" + _NUM + b"|" + _LIT + b")",
    "n": b"(?:" + _NUM + b"|" + _STR + b"|" + _LIT + b")",
    "l": b"(?:" + _LIT + b"|" + _STR + b"|" + _NUM + b")",
}
_FR = rb'(?:"(?P<fr>[^"\\\x00-\x1f]*)"|null)'
_CT = rb"(?P<ct>0|[1-9][0-9]*)"


class _TemplateError(Exception):
    """The line cannot be turned into a template (too big, duplicate keys, odd token)."""


class _Builder:
    """Walks one line's tokens and emits regex pieces, split into segments at string holes.

    A piece is (whitespace seen before the token, pattern). The strict variant keeps that
    whitespace literally (fast, the usual case: one writer, one style); the tolerant variant
    accepts any JSON whitespace there.
    """

    def __init__(self, raw, fr_path, ct_path):
        self.tokens = [m.groups() for m in _TOKEN_RE.finditer(raw)]
        if len(self.tokens) > TEMPLATE_MAX_TOKENS:
            raise _TemplateError("too many tokens")
        self.i = 0
        self.fr_path, self.ct_path = fr_path, ct_path
        self.segments, self.cur = [], []

    def next(self):
        if self.i >= len(self.tokens):
            raise _TemplateError("truncated")
        self.i += 1
        return self.tokens[self.i - 1]

    def emit(self, tok, pattern):
        self.cur.append((tok[0], pattern))

    def value(self, path):
        tok = self.next()
        ws, s, num, lit, punct = tok
        if punct in (b"{", b"["):
            return self.container(tok, path)
        if path == self.ct_path:
            if num is None or not num.isdigit():
                raise _TemplateError("completion_tokens is not a count")
            return self.emit(tok, _CT)
        if path == self.fr_path:
            if s is None and lit != b"null":  # json.loads would give None, a template could not
                raise _TemplateError("finish_reason is not a string")
            return self.emit(tok, _FR)
        if s is not None and (len(s) > 64 or (path and path[-1] in HOLE_KEYS)):
            self.emit(tok, b'"')  # the hole starts just after this opening quote
            self.segments.append(self.cur)
            self.cur = []
            return None
        if punct is not None:
            raise _TemplateError("unexpected %r" % punct)
        return self.emit(tok, _SCALARS["s" if s else "n" if num else "l"])

    def container(self, tok, path):
        close = b"}" if tok[4] == b"{" else b"]"
        self.emit(tok, re.escape(tok[4]))
        keys, k = set(), 0
        while True:
            if self.i < len(self.tokens) and self.tokens[self.i][4] == close:
                return self.emit(self.next(), re.escape(close))
            if k:
                comma = self.next()
                if comma[4] != b",":
                    raise _TemplateError("expected ,")
                self.emit(comma, b",")
            if close == b"}":
                key, colon = self.next(), self.next()
                name = json.loads(key[1].decode("utf-8")) if key[1] else None
                if name is None or name in keys or colon[4] != b":":
                    raise _TemplateError("bad or duplicate key")
                keys.add(name)
                self.emit(key, re.escape(key[1]))
                self.emit(colon, b":")
                self.value(path + (name,))
            else:
                self.value(path + (k,))
            k += 1

    def compile(self, strict):
        """Compiled segments; the last one must reach the end of the line."""
        out = []
        for seg in self.segments + [self.cur + [(b"", _WS + rb"\Z")]]:
            parts = ((re.escape(ws) if strict else _WS) + pat for ws, pat in seg)
            rx = re.compile(b"".join(parts), re.DOTALL)
            groups = ("ct" in rx.groupindex) | ("fr" in rx.groupindex) << 1
            out.append((rx.match, groups, len(out) < len(self.segments)))
        return out


def _build_template(raw, obj):
    """(strict, tolerant) regex segment lists for lines shaped like `raw`, or None."""
    fr_path, ct_path, _ = _locate(obj)
    if not isinstance(_get(obj, ct_path), int) or len(raw) > TEMPLATE_MAX_LINE_BYTES:
        return None
    try:
        b = _Builder(raw, fr_path, ct_path)
        b.value(())
        if b.i != len(b.tokens):
            raise _TemplateError("trailing tokens")
    except (_TemplateError, ValueError, RecursionError):
        return None
    return b.compile(True), b.compile(False)


def _skip_string(buf, pos, end):
    """Offset just past the closing quote of the JSON string whose body starts at pos."""
    while True:
        q = buf.find(b'"', pos, end)
        if q < 0 or buf[q - 1] != 92:  # 92 is the backslash
            return q + 1 if q >= 0 else -1
        b = q - 1
        while buf[b] == 92:
            b -= 1
        if (q - 1 - b) % 2 == 0:  # an even run of backslashes escapes itself, not the quote
            return q + 1
        pos = q + 1


def _match_template(plan, buf, pos, end):
    """(ct_bytes, fr_bytes) when the line buf[pos:end] matches the template plan, else None."""
    ct = fr = None
    for match, groups, hole in plan:
        m = match(buf, pos, end)
        if m is None:
            return None
        if groups:
            if groups & 1:
                ct = m.group("ct")
            if groups & 2:
                fr = m.group("fr")
        pos = m.end()
        if hole:
            pos = _hole_end(buf, pos, end)
            if pos < 0:
                return None
    return ct, fr


# A quote not preceded by exactly one backslash: unescaped, or after a run of 2+ (ambiguous).
_QUOTE_RE = re.compile(rb'"(?<![^\\]\\")')


def _hole_end(buf, pos, end):
    """Offset just past the closing quote of the string whose body starts at pos, or -1."""
    q = buf.find(b'"', pos, end)
    if q >= 0 and buf[q - 1] != 92:
        return q + 1  # the usual case: no escaped quote before the end
    m = _QUOTE_RE.search(buf, pos, end)  # skips every \" in one C-level scan
    if m is None:
        return -1
    q = m.start()
    return q + 1 if buf[q - 1] != 92 else _skip_string(buf, pos, end)


# ---------------------------------------------------------------------------- shard scanning
class _Tally:
    """Counts of one scan: template hits keyed by raw bytes, json.loads hits by value."""

    def __init__(self):
        self.fast, self.slow, self.malformed, self.lines = {}, {}, 0, 0

    def rows(self):
        merged = dict(self.slow)
        for (ct, fr), n in self.fast.items():
            key = (int(ct), None if fr is None else fr.decode("utf-8"), 0)
            merged[key] = merged.get(key, 0) + n
        rows = [[t, fr, est, n] for (t, fr, est), n in merged.items()]
        rows.sort(key=lambda r: (r[0], r[1] is not None, r[1] or "", r[2]))  # None before ""
        return rows


def _learn(tmpl_state, raw, obj):
    """Try to add a template built from a line json.loads just parsed."""
    tmpl_state[2] -= 1
    plans = _build_template(raw, obj)
    if plans is not None and _match_template(plans[1], raw, 0, len(raw)) is not None:
        for plans_list, plan in zip(tmpl_state, plans):
            plans_list.append(plan)
            del plans_list[:-MAX_TEMPLATES]


def _match_any(plans, buf, pos, end):
    for plan in plans:
        hit = _match_template(plan, buf, pos, end)
        if hit is not None:
            return hit
    return None


def _scan_chunk(buf, end, tally, tmpl_state, overrides, starts, base):
    """Count the complete lines buf[:end] (end is just past a newline)."""
    learn = overrides == (None, None)  # overrides force json.loads on every line
    if learn and not buf.isascii():
        try:
            str(memoryview(buf)[:end], "utf-8")
        except UnicodeDecodeError:
            learn = False  # json.loads path checks every line's UTF-8
    find, fast, strict = buf.find, tally.fast, tmpl_state[0]
    append = starts.append if starts is not None else None
    pos = lines = 0
    while pos < end:
        nl = find(b"\n", pos, end)
        lines += 1
        if append is not None:
            append(base + pos)
        hit = None
        if learn:
            for plan in strict:
                hit = _match_template(plan, buf, pos, nl)
                if hit is not None:
                    break
            else:
                hit = _match_any(tmpl_state[1], buf, pos, nl)
        if hit is not None:
            fast[hit] = fast.get(hit, 0) + 1
        else:
            _count_slow(buf[pos:nl], tally, tmpl_state, overrides, learn)
        pos = nl + 1
    tally.lines += lines


def _count_slow(raw, tally, tmpl_state, overrides, learn):
    """The json.loads path for one line; may learn a template from it."""
    obj = _load_line(raw)
    if obj is None:
        tally.malformed += 1
        return
    key = _count_key(obj, overrides)
    tally.slow[key] = tally.slow.get(key, 0) + 1
    if learn and tmpl_state[2] > 0 and key[2] == 0:
        _learn(tmpl_state, bytes(raw), obj)


class _Reader:
    """Reads runs of complete lines; full-size chunks reuse one buffer (no page-fault churn)."""

    def __init__(self, f, size, cap_bytes):
        self.f, self.size = f, size
        self.buf = bytearray(max(1, min(CHUNK_BYTES, cap_bytes)))

    def lines(self, pos, want):
        """(buf, end): buf[:end] are complete lines from pos, about `want` bytes of them.

        end == 0 when only a half-written line remains. Reads past `want` only to finish a
        line longer than the budget or the chunk.
        """
        n = max(1, min(want, self.size - pos, CHUNK_BYTES))
        self.f.seek(pos)
        if n == len(self.buf):
            got = self.f.readinto(self.buf)
            buf = self.buf if got == n else bytes(self.buf[:got])  # shrank while we read
        else:
            buf = self.f.read(n)
        end = buf.rfind(b"\n") + 1
        if end or pos + len(buf) >= self.size:
            return buf, end
        return self._long_line(pos, bytearray(buf))

    def _long_line(self, pos, grow):
        while pos + len(grow) < self.size:
            more = self.f.read(min(CHUNK_BYTES, self.size - pos - len(grow)))
            if not more:
                break
            cut = more.find(b"\n")
            if cut >= 0:
                grow += more[: cut + 1]
                return grow, len(grow)
            grow += more
        return b"", 0


def _overrides(paths):
    paths = paths or {}
    fr, ct = paths.get("finish_reason_path"), paths.get("completion_tokens_path")
    return (_parse_path(fr) if fr else None, _parse_path(ct) if ct else None)


def scan_file(path, inode, offset, budget_bytes, paths=None):
    """Count the complete lines of one shard from (inode, offset), about budget_bytes of them.

    Args:
        path: shard path (a literal string; never passed to a shell).
        inode: inode the caller last saw, or None for a shard not scanned before.
        offset: byte offset just after the last line the caller counted (0 if new).
        budget_bytes: bytes to scan at most in this call (a longer single line is still read).
        paths: optional {"finish_reason_path": "a.b.0", "completion_tokens_path": ...}.

    Returns:
        The per-file entry of the poll reply (design.md section 1) plus "pending_bytes".
    """
    entry = {"inode": inode, "size": None, "offset_from": offset or 0, "offset": offset or 0,
             "reset": False, "lines": 0, "malformed": 0, "tokens": 0, "counts": [],
             "error": None, "pending_bytes": 0}
    try:
        with open(path, "rb", buffering=0) as f:
            _scan_open_file(f, path, entry, budget_bytes, _overrides(paths))
    except (OSError, ValueError) as exc:
        entry["error"] = "%s: %s" % (type(exc).__name__, exc)
    return entry


def _scan_open_file(f, path, entry, budget_bytes, overrides):
    st = os.fstat(f.fileno())
    start, size = entry["offset"], st.st_size
    if (entry["inode"] is not None and st.st_ino != entry["inode"]) or size < start:
        start, entry["reset"] = 0, True  # rotated or truncated: the caller drops old counts
    entry.update(inode=st.st_ino, size=size, offset_from=start, offset=start)
    idx = STATE.file_index(path, st.st_ino)
    if start == 0 and idx[1] > 0:
        idx[0], idx[1] = array.array("Q"), 0
    tmpl_state = STATE.file_templates(path, st.st_ino)
    tally, pos, stop = _Tally(), start, start + max(0, int(budget_bytes))
    reader = _Reader(f, size, min(size, stop) - start)
    while pos < size and pos < stop:
        buf, end = reader.lines(pos, stop - pos)
        if end == 0:
            break  # a half-written last line stays for the next poll
        starts = idx[0] if idx[1] == pos else None  # extend the index only when contiguous
        _scan_chunk(buf, end, tally, tmpl_state, overrides, starts, pos)
        pos += end
        if starts is not None:
            idx[1] = pos
    STATE.line_stats["template"] += sum(tally.fast.values())
    STATE.line_stats["json"] += tally.lines - sum(tally.fast.values())
    rows = tally.rows()
    entry.update(offset=pos, lines=tally.lines, malformed=tally.malformed, counts=rows,
                 tokens=sum(r[0] * r[3] for r in rows),
                 pending_bytes=size - pos if pos >= stop and pos < size else 0)


# ---------------------------------------------------------------------------- globs and poll
def expand_globs(globs):
    """(sorted regular files matched by any glob, globs that matched nothing)."""
    files, unmatched = set(), []
    for pattern in globs:
        hits = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
        files.update(hits)
        if not hits:
            unmatched.append(pattern)
    return sorted(files), unmatched


def _plan_budget(needs, budget_bytes):
    """Split the poll budget over shards with work: water-filling, round-robin past the limit."""
    paths = sorted(p for p, need in needs.items() if need > 0)
    if not paths:
        return {}
    k = STATE.rr_cursor % len(paths)
    paths = paths[k:] + paths[:k]
    slots = max(1, min(len(paths), budget_bytes // MIN_SHARE_BYTES))
    STATE.rr_cursor += slots if slots < len(paths) else 0
    chosen, plan, left = paths[:slots], {}, budget_bytes
    for i, p in enumerate(sorted(chosen, key=needs.get)):
        plan[p] = min(needs[p], left // (len(chosen) - i))
        left -= plan[p]
    return plan


def _poll_shards(req):
    files, unmatched = expand_globs(req.get("globs") or [])
    state = req.get("state") or {}
    budget = 256 << 20 if req.get("budget_bytes") is None else int(req["budget_bytes"])
    needs = {}
    for p in files:
        prev = state.get(p) or {}
        try:
            st = os.stat(p)
        except OSError:
            continue
        off = int(prev.get("offset") or 0)
        moved = prev.get("inode") not in (None, st.st_ino) or st.st_size < off
        needs[p] = st.st_size - (0 if moved else off)
    plan = _plan_budget(needs, budget)
    out = {}
    for p in files:
        prev = state.get(p) or {}
        out[p] = scan_file(p, prev.get("inode"), int(prev.get("offset") or 0), plan.get(p, 0), req)
    pending = sum(e.pop("pending_bytes") for e in out.values())
    return {"matched": len(files), "unmatched_globs": unmatched, "pending_bytes": pending,
            "files": out}, files


def _disk(files):
    """statvfs of each shard folder, one entry per filesystem (st_dev)."""
    out, seen = {}, set()
    for folder in sorted({os.path.dirname(os.path.abspath(p)) for p in files}):
        try:
            dev = os.stat(folder).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            vfs = os.statvfs(folder)
            out[folder] = {"free_bytes": vfs.f_bavail * vfs.f_frsize,
                           "total_bytes": vfs.f_blocks * vfs.f_frsize, "error": None}
        except OSError as exc:
            out[folder] = {"free_bytes": None, "total_bytes": None, "error": str(exc)}
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


def _op_poll(req):
    shards, files = _poll_shards(req.get("shards") or {})
    try:
        load = list(os.getloadavg())
    except (AttributeError, OSError):
        load = None
    return {"hostname": socket.gethostname(), "loadavg": load,
            "gpus": read_gpus(req.get("gpu", "auto"), int(req.get("demo_gpus", 8))),
            "shards": shards, "disk": _disk(files),
            "metrics": _fetch_metrics(req.get("metrics_urls") or [],
                                      float(req.get("metrics_timeout_s", 2.0)))}


def _op_hello(req):
    return {"agent_version": AGENT_VERSION, "python": "%d.%d.%d" % sys.version_info[:3],
            "hostname": socket.gethostname(), "pid": os.getpid()}


# ---------------------------------------------------------------------------- sampling
def _extend_index(f, idx, size):
    """Append the starts of complete lines after idx[1] with a fast newline split pass."""
    pos, reader = idx[1], _Reader(f, size, size - idx[1])
    while pos < size:
        buf, end = reader.lines(pos, CHUNK_BYTES)
        if end == 0:
            break
        parts = buf[:end].split(b"\n")
        starts = itertools.accumulate(map((1).__add__, map(len, parts)), initial=pos)
        idx[0].extend(itertools.islice(starts, len(parts) - 1))
        pos += end
        idx[1] = pos


def _text_parts(obj):
    return [t for t in (_get(obj, p) for p in _locate(obj)[2]) if isinstance(t, str)]


def _message_text(msg):
    content = msg.get("content") if isinstance(msg, dict) else None
    if isinstance(content, list):  # multimodal parts: keep the text ones
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else None


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
    f.seek(start)
    obj = _load_line(f.read(stop - start).rstrip(b"\n"))
    out = {"path": path, "line_no": line_no, "offset": start, "tokens": None, "estimated": None,
           "finish_reason": None, "prompt_head": None, "text_head": "", "text_tail": "",
           "text_chars": 0, "prompt": None, "text": None, "error": None}
    if obj is None:
        out["error"] = "malformed line (not a JSON object)"
        return out
    out["tokens"], out["finish_reason"], out["estimated"] = _count_key(obj, overrides)
    text, prompt = "\n\n".join(_text_parts(obj)), _prompt_text(obj)
    head, tail = int(req.get("head_chars", 400)), int(req.get("tail_chars", 4000))
    out.update(text_head=text[:head], text_tail=text[-tail:] if tail else "",
               text_chars=len(text), prompt_head=None if prompt is None else prompt[:head])
    if req.get("full_text"):
        out.update(text=text[:FULL_TEXT_MAX_CHARS],
                   prompt=None if prompt is None else prompt[:FULL_TEXT_MAX_CHARS])
    return out


def _op_sample(req):
    files, unmatched = expand_globs(req.get("globs") or [])  # only files the globs match
    overrides, handles, tables = _overrides(req), {}, []
    try:
        for p in files:
            try:
                f = handles[p] = open(p, "rb", buffering=0)
            except OSError:
                continue
            st = os.fstat(f.fileno())
            idx = STATE.file_index(p, st.st_ino)
            if st.st_size < idx[1]:
                idx[0], idx[1] = array.array("Q"), 0
            _extend_index(f, idx, st.st_size)
            tables.append((p, f, idx[0], len(idx[0]), idx[1]))  # snapshot: polls may extend it
        return _draw(tables, req, overrides, unmatched)
    finally:
        for f in handles.values():
            f.close()


def _draw(tables, req, overrides, unmatched):
    """Uniform draws among complete lines, without replacement, optional finish_reason filter."""
    cum = list(itertools.accumulate(t[3] for t in tables))
    population = cum[-1] if cum else 0
    rng, n, want = random.Random(req.get("seed")), min(int(req.get("n", 50)), 10000), req.get("finish_reason")
    cap = max(1000, 200 * n) if want is not None else 4 * n + 100
    chosen, samples, attempts = set(), [], 0
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
        if want is None or s["finish_reason"] == want:
            samples.append(s)
    return {"population": population, "attempts": attempts, "unmatched_globs": unmatched,
            "samples": samples}


# ---------------------------------------------------------------------------- GPUs: NVML
_THROTTLE_NAMES = (  # nvmlClocksThrottleReason<X> bit -> name shown on screen
    ("GpuIdle", 0x1, "gpu_idle"), ("ApplicationsClocksSetting", 0x2, "applications_clocks"),
    ("SwPowerCap", 0x4, "sw_power_cap"), ("HwSlowdown", 0x8, "hw_slowdown"),
    ("SyncBoost", 0x10, "sync_boost"), ("SwThermalSlowdown", 0x20, "sw_thermal_slowdown"),
    ("HwThermalSlowdown", 0x40, "hw_thermal_slowdown"),
    ("HwPowerBrakeSlowdown", 0x80, "hw_power_brake_slowdown"),
    ("DisplayClockSetting", 0x100, "display_clock_setting"),
)


def _import_pynvml():
    """The node's pynvml, else the copy the dashboard shipped in __modules__ (registered lazily)."""
    try:
        import pynvml
        return pynvml
    except ImportError:
        source = globals().get("__modules__", {}).get("pynvml")
        if not source:
            raise
    mod = types.ModuleType("pynvml")
    sys.modules["pynvml"] = mod  # pynvml looks itself up in sys.modules while it loads
    try:
        exec(compile(source, "pynvml.py", "exec"), mod.__dict__)
    except BaseException:
        del sys.modules["pynvml"]
        raise
    return mod


def _nvml():
    """Initialised pynvml module or None (nvmlInit is tried once per process)."""
    if STATE.nvml is None and STATE.nvml_error is None:
        try:
            mod = _import_pynvml()
            mod.nvmlInit()
            STATE.nvml = mod
        except Exception as exc:
            STATE.nvml_error = "NVML: %s: %s" % (type(exc).__name__, exc)
    return STATE.nvml


def _nv(name, *args):
    """The one choke point for NVML calls: unsupported or missing -> None, others raise."""
    nv = STATE.nvml
    fn = getattr(nv, name, None)
    if fn is None:
        return _note_missing(name)
    soft = tuple(c for c in (getattr(nv, "NVMLError_NotSupported", None),
                             getattr(nv, "NVMLError_FunctionNotFound", None)) if c)
    try:
        return fn(*args)
    except soft as exc:
        if type(exc).__name__ == "NVMLError_FunctionNotFound":
            _note_missing(name)
        return None


def _note_missing(name):
    if name not in STATE.nvml_missing:
        STATE.nvml_missing.append(name)  # noted once; stderr stays quiet
    return None


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _util_pct(h):
    """nvidia-smi utilization.gpu [%]."""
    rates = _nv("nvmlDeviceGetUtilizationRates", h)
    return None if rates is None else rates.gpu


def _mem_mib(h):
    """nvidia-smi memory.used, memory.total [MiB] (NVML reports bytes)."""
    mem = _nv("nvmlDeviceGetMemoryInfo", h)
    return (None, None) if mem is None else (mem.used >> 20, mem.total >> 20)


def _power_w(h):
    """nvidia-smi power.draw [W] (NVML reports mW)."""
    mw = _nv("nvmlDeviceGetPowerUsage", h)
    return None if mw is None else mw / 1000.0


def _power_limit_w(h):
    """nvidia-smi enforced.power.limit [W] (NVML reports mW)."""
    mw = _nv("nvmlDeviceGetEnforcedPowerLimit", h)
    return None if mw is None else mw / 1000.0


def _temp_c(h):
    """nvidia-smi temperature.gpu [C]."""
    return _nv("nvmlDeviceGetTemperature", h, getattr(STATE.nvml, "NVML_TEMPERATURE_GPU", 0))


def _sm_clock_mhz(h):
    """nvidia-smi clocks.sm [MHz]."""
    return _nv("nvmlDeviceGetClockInfo", h, getattr(STATE.nvml, "NVML_CLOCK_SM", 1))


def _throttle_reasons(h):
    """nvidia-smi clocks_event_reasons.active (bitmask) as names; newer drivers say "event"."""
    mask = _nv("nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:
        mask = _nv("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    if mask is None:
        return None
    bits = ((getattr(STATE.nvml, "nvmlClocksThrottleReason" + c, v), n) for c, v, n in _THROTTLE_NAMES)
    return [name for bit, name in bits if mask & bit]


def _processes(h):
    """nvidia-smi --query-compute-apps=pid,used_memory [MiB]; the name comes from /proc."""
    procs = _nv("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is None:
        return None
    return [{"pid": p.pid, "name": _proc_name(p.pid),
             "mem_used_mib": None if p.usedGpuMemory is None else p.usedGpuMemory >> 20}
            for p in procs]


def _proc_name(pid):
    try:
        with open("/proc/%d/comm" % pid, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None  # another PID namespace (containers): NVML sees it, /proc does not


def _nvml_device(i):
    """One GPU's readings; a GPU that errors (e.g. fell off the bus) becomes an error entry."""
    try:
        h = STATE.nvml.nvmlDeviceGetHandleByIndex(i)
        used, total = _mem_mib(h)
        return {"index": i, "name": _text(_nv("nvmlDeviceGetName", h)),
                "uuid": _text(_nv("nvmlDeviceGetUUID", h)), "util_pct": _util_pct(h),
                "mem_used_mib": used, "mem_total_mib": total, "power_w": _power_w(h),
                "power_limit_w": _power_limit_w(h), "temp_c": _temp_c(h),
                "sm_clock_mhz": _sm_clock_mhz(h), "throttle_reasons": _throttle_reasons(h),
                "processes": _processes(h), "error": None}
    except Exception as exc:
        return {"index": i, "error": str(exc) or type(exc).__name__}


def _nvml_devices():
    nv = _nvml()
    if nv is None:
        return None
    return [_nvml_device(i) for i in range(nv.nvmlDeviceGetCount())]


# ---------------------------------------------------------------------------- GPUs: other sources
SMI_FIELDS = ("index", "name", "uuid", "utilization.gpu", "memory.used", "memory.total",
              "power.draw", "power.limit", "temperature.gpu", "clocks.sm")
SMI_ARGV = ["nvidia-smi", "--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits"]


def _smi_number(text, kind):
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None  # "[N/A]", "[Not Supported]", "[Unknown Error]"
    try:
        return kind(float(text)) if kind is int else kind(text)
    except ValueError:
        return None


def parse_smi_csv(text):
    """Devices from `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`."""
    devices = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(SMI_FIELDS):
            continue
        kinds = (int, int, int, float, float, int, int)
        num = [_smi_number(cols[3 + j], kind) for j, kind in enumerate(kinds)]
        devices.append({"index": _smi_number(cols[0], int), "name": cols[1], "uuid": cols[2],
                        "util_pct": num[0], "mem_used_mib": num[1], "mem_total_mib": num[2],
                        "power_w": num[3], "power_limit_w": num[4], "temp_c": num[5],
                        "sm_clock_mhz": num[6], "throttle_reasons": None, "processes": None,
                        "error": None})
    return devices


def _smi_devices():
    """(devices, None) from nvidia-smi, or (None, why not)."""
    try:
        done = subprocess.run(SMI_ARGV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "nvidia-smi: %s" % (exc.strerror if isinstance(exc, OSError) else exc)
    if done.returncode != 0:
        return None, "nvidia-smi exit %d: %s" % (done.returncode, done.stderr.decode("utf-8", "replace").strip()[:300])
    return parse_smi_csv(done.stdout.decode("utf-8", "replace")), None


def _demo_devices(count):
    """Simulated B200-like readings that move smoothly with the clock (for demos and charts)."""
    t = time.time()
    devices = []
    for i in range(count):
        wave = 0.5 + 0.5 * math.sin(t / 9.0 + i * 0.9)
        power_w = round(805.0 + 180.0 * wave + 5.0 * math.sin(t / 2.3 + i), 1)  # 800-990 W
        mem_used_mib = int(174080 + 2048 * math.sin(t / 31.0 + i))
        devices.append({"index": i, "name": "NVIDIA B200", "uuid": "GPU-demo-0000-0000-%04d" % i,
                        "util_pct": int(90 + 9 * wave), "mem_used_mib": mem_used_mib,
                        "mem_total_mib": 187392, "power_w": power_w, "power_limit_w": 1000.0,
                        "temp_c": int(55 + 15 * wave), "sm_clock_mhz": int(1965 - 120 * wave),
                        "throttle_reasons": ["sw_power_cap"] if power_w > 975 else [],
                        "processes": [{"pid": 4200 + i, "name": "python3",
                                       "mem_used_mib": mem_used_mib - 600}],
                        "error": None})
    return devices


def read_gpus(mode, demo_gpus=8):
    """GPU telemetry for the poll reply.

    Args:
        mode: "auto" (NVML through pynvml, else nvidia-smi), "demo" (simulated), "off".
        demo_gpus: how many simulated GPUs "demo" reports.

    Returns:
        {"source", "error", "simulated", "reason", "devices"}; source is None when there is
        no telemetry, with the cause in "error" (or in "reason" when it is switched off).
    """
    out = {"source": None, "error": None, "simulated": False, "reason": None, "devices": []}
    if mode == "off":
        out["reason"] = 'GPU telemetry is off (gpu = "off")'
    elif mode == "demo":
        out.update(source="demo", simulated=True, devices=_demo_devices(int(demo_gpus)))
    elif mode != "auto":
        out["error"] = "unknown gpu mode %r (auto, demo, off)" % (mode,)
    else:
        try:
            devices = _nvml_devices()
        except Exception as exc:  # nvmlDeviceGetCount itself failed
            devices, STATE.nvml_error = None, "NVML: %s" % exc
        if devices is not None:
            out.update(source="nvml", devices=devices)
        else:
            devices, why = _smi_devices()
            if devices is not None:
                out.update(source="nvidia-smi", devices=devices)
            else:
                out["error"] = "no GPU telemetry: %s; %s" % (STATE.nvml_error, why)
    return out


# ---------------------------------------------------------------------------- requests and serving
_OPS = {"hello": _op_hello, "poll": _op_poll, "sample": _op_sample}


def handle(request):
    """Answer one request dict (op hello / poll / sample); failures become ok:false replies."""
    t0 = time.time()
    try:
        op = _OPS.get(request.get("op")) if isinstance(request, dict) else None
        if op is None:
            raise ValueError("unknown op %r" % (request.get("op") if isinstance(request, dict) else request,))
        reply = {"schema_version": SCHEMA_VERSION, "ok": True}
        reply.update(op(request))
    except Exception as exc:
        return {"schema_version": SCHEMA_VERSION, "ok": False,
                "error": "%s: %s" % (type(exc).__name__, exc)}
    reply["time_unix"] = time.time()
    reply["agent_ms"] = round((time.time() - t0) * 1000.0, 3)
    return reply


def _read_frame(inp):
    """The next request dict; None at EOF; raises ValueError for a bad frame."""
    header = inp.readline()
    if not header:
        return None
    n = int(header.strip())
    body = inp.read(n)
    if len(body) != n:
        return None  # the pipe closed mid-frame: treat as EOF
    return json.loads(body.decode("utf-8"))


def _write_frame(out, reply):
    try:
        data = json.dumps(reply, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        data = json.dumps({"schema_version": SCHEMA_VERSION, "ok": False,
                           "error": "reply is not JSON: %s" % exc}).encode("utf-8")
    out.write(b"%d\n" % len(data) + data)
    out.flush()


def serve(inp, out):
    """Serve frames until EOF; a bad request gets an ok:false reply and serving goes on."""
    while True:
        try:
            request = _read_frame(inp)
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
