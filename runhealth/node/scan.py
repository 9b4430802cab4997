"""runhealth node agent, shard scanning: counts finished generations per (tokens, finish_reason).

Part of the node agent (runhealth/node/, shipped together with agent.py): it runs on the GPU
node, imports only the standard library, keeps Python 3.8-compatible syntax and is read-only
there (shards are opened "rb", nothing is written). It holds the field rules that say where a
record keeps finish_reason, completion_tokens and its text (locate(): node/formats.py's entries,
one per output format, with each format's label map applied where the label is read, and
failed requests counted apart, never as lines); the template engine; and
scan_file(), which counts the complete lines of one shard from an offset within a byte budget,
with its per-shard template memory kept here.

A line longer than MAX_LINE_BYTES (64 MiB; the environment variable RUNHEALTH_MAX_LINE_BYTES,
seen by the agent process, lowers it for tests) is skipped as malformed without being held in
memory, and an unterminated tail is searched for its newline only once: TAILS remembers how far
a file is known to hold no newline, so a shard with no newline is not re-read on every poll, and
a search that reaches the poll's deadline stops there and resumes next poll (Reader).
Text taken from a line (finish_reason, sample text) has lone surrogates (a JSON "\\ud800"
escape) replaced by U+FFFD (clean_text), so every reply encodes as UTF-8 on the dashboard side.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import re
import sys
import time
from collections import Counter
from typing import Any

if __package__:  # imported as runhealth.node.scan; shipped or run as a script, agent.py sets them
    from . import fields, formats
else:
    fields = formats = None  # type: ignore[assignment]

CHUNK_BYTES = 1 << 20  # fits in cache, so the scan reads what the read just copied (measured: 1 MiB beat 16 MiB)
FIRST_TIMED_STEP = 1 << 20  # under a deadline: the first read is small, later ones fit the speed seen
MAX_TEMPLATES = 6  # SGLang finish_reason objects differ by type, so allow a few shapes
MAX_TEMPLATE_BUILDS = 24  # per shard: a shard of odd lines must not rebuild forever
# A template's tolerant plan (any JSON whitespace, any scalar type: for lines its strict plan misses)
# takes ~3x the strict one's time to compile, ~2.5 ms of a 16 MB shard's ~20; most shards never
# miss, so the tolerant plans are compiled once this many completion lines have (#39 item 4).
TOLERANT_AFTER_MISSES = 8
TEMPLATE_MAX_LINE_BYTES = 1 << 20
TEMPLATE_MAX_TOKENS = 400  # logprobs-heavy lines: templates would be huge, use json.loads
# No completion has 10^12 tokens; under this bound even 8M such lines sum within SQLite's
# signed 64-bit INTEGER, so the store can always add up what the scanner counted.
MAX_COUNT = 1 << 40
# One line is held in memory at most this big; a longer one is skipped as malformed. Never
# below CHUNK_BYTES: a line within one read is counted as read.
DEFAULT_MAX_LINE_BYTES = 64 << 20


def _line_bound():
    """MAX_LINE_BYTES: the default, or RUNHEALTH_MAX_LINE_BYTES (tests) when it is a number."""
    try:
        return max(CHUNK_BYTES, int(os.environ.get("RUNHEALTH_MAX_LINE_BYTES") or DEFAULT_MAX_LINE_BYTES))
    except ValueError:
        return DEFAULT_MAX_LINE_BYTES


MAX_LINE_BYTES = _line_bound()
JSON_SPACE = b" \t\r"  # a line holding only these is blank (jq and pandas skip it), not malformed
TEXT_KEYS = ("text", "completion", "output", "response")
HOLE_KEYS = frozenset(
    ("content", "reasoning_content", "reasoning", "prompt", "input", "thinking", "generated_text") + TEXT_KEYS
)
MARK_BYTES = 256  # a content mark hashes a shard's first and its last MARK_BYTES bytes before an offset
SHORT_MARK = "short"  # the mark of a file that now ends before the offset: equals no real mark


class PerFile:
    """Memory per shard keyed by (path, inode); a rotated path forgets its earlier file's entry."""

    def __init__(self, new):
        self.new = new  # makes the entry for a file not seen before
        self.entries = {}  # (path, inode) -> entry
        self.inode_of = {}  # path -> inode last seen

    def get(self, path, inode):
        old = self.inode_of.get(path)
        if old != inode:  # so memory tracks live shards
            self.entries.pop((path, old), None)
            self.inode_of[path] = inode
        return self.entries.setdefault((path, inode), self.new())

    def forget(self, path):
        """Drop the memory of `path` (its content was replaced under the same inode)."""
        self.entries.pop((path, self.inode_of.pop(path, None)), None)


def content_mark(fd, offset, head=None):
    """A short hash of what the open file `fd` holds before `offset`: its first and its last
    MARK_BYTES bytes up to there (all of them when fewer). Inode and size cannot tell a file
    rewritten under the same inode (ext4 reuses a freed inode at once; open(path, "w") keeps
    it) from the same file grown; its counted bytes can. Two small preads, read-only; one when
    `head` (the file's first MARK_BYTES bytes, read by the caller for several marks) is given.

    Returns None at offset 0 (nothing counted, nothing to check), SHORT_MARK when the file now
    ends before offset.
    """
    if offset <= 0:
        return None
    if offset <= 2 * MARK_BYTES:
        want, data = offset, os.pread(fd, offset, 0)
    else:
        head = os.pread(fd, MARK_BYTES, 0) if head is None else head
        want, data = 2 * MARK_BYTES, head + os.pread(fd, MARK_BYTES, offset - MARK_BYTES)
    if len(data) != want:
        return SHORT_MARK
    return hashlib.blake2b(data, digest_size=8).hexdigest()


# [strict plans, tolerant plans, builds left, per-line fields: None (off) or the FieldSpec key they use]
# per shard: [strict plans, tolerant plans, template builds left, fields key, completion lines that
# missed the strict plans (the tolerant ones are compiled at TOLERANT_AFTER_MISSES, _tolerant_on)]
TEMPLATES = PerFile(lambda: [[], [], MAX_TEMPLATE_BUILDS, None, 0])
LINE_STATS = {"template": 0, "json": 0}  # lines counted by each path, process-wide
TAILS = PerFile(lambda: [-1, -1])  # [line start, offset]: no newline from the start up to offset
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def clean_text(text):
    """`text` with every lone surrogate (JSON "\\ud800", which json.loads accepts, or an
    undecodable byte kept by surrogateescape) as U+FFFD, so it encodes as UTF-8 (SQLite, pages)."""
    if text.isascii():
        return text
    return _SURROGATE_RE.sub("\ufffd", text)


def clean_value(value):
    """clean_text through strings, lists and dicts (a sampled message list)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [clean_value(v) for v in value]
    if isinstance(value, dict):
        return {clean_value(k): clean_value(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------- field rules
def parse_path(dotted):
    """ "choices.0.finish_reason" -> ("choices", 0, "finish_reason")."""
    return tuple(int(p) if p.lstrip("-").isdigit() else p for p in dotted.split("."))


def locate(obj):
    """Where one record keeps its figures (formats.locate: the format entry's paths): a
    formats.Located with the finish-reason path, the token-count path, the answer and
    reasoning text paths, the body's format entry, the keys a template matches literally and
    the label map."""
    return formats.locate(obj)


def text_paths(loc, obj):
    """The sample's text paths: the first string among the reasoning candidates, then among the answer's."""
    out = []
    for paths in (loc.reasoning, loc.answer):
        p = next((p for p in paths if isinstance(formats.get_at(obj, p), str)), None)
        if p is not None:
            out.append(p)
    return out


def valid_count(ct):
    """The one rule for a token count: an int (not bool, not float) from 0 to MAX_COUNT.

    Every path (json.loads, templates, sampling) calls this, so one absurd number is one
    malformed line, never a poll the store cannot apply.
    """
    return type(ct) is int and 0 <= ct <= MAX_COUNT


def count_key(obj, overrides):
    """(tokens, finish_reason, estimated) of one parsed record, the reference semantics.

    None when the record holds a token count that is not a valid count (the line is malformed);
    a record with no count at all gets the chars/4 estimate.
    """
    loc = locate(obj)
    fr = formats.get_at(obj, overrides[0] or loc.finish)
    fr = loc.labels.get(fr, fr) if isinstance(fr, str) else None  # the format's label, in the one vocabulary
    ct = formats.get_at(obj, overrides[1] or loc.tokens)
    if loc.body.count == "len" and not overrides[1] and isinstance(ct, list):
        ct = len(ct)  # vLLM's dump: the token IDs themselves
    plus = None if overrides[1] or loc.tokens_plus is None else formats.get_at(obj, loc.tokens_plus)
    if plus is not None:  # Gemini's thoughtsTokenCount: part of what max_output_tokens bounds
        if not valid_count(plus):
            return None
        if valid_count(ct):
            ct += plus
    if valid_count(ct):
        return ct, fr, 0
    if ct is not None:
        return None
    chars = sum(len(t) for t in (formats.get_at(obj, p) for p in text_paths(loc, obj)) if isinstance(t, str))
    return -(-chars // 4), fr, 1


def load_line(raw):
    """json.loads one line (strict UTF-8); None when it is not a JSON object."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


# A backslash that starts no valid JSON escape; the content rule takes it literally.
_BAD_ESCAPE_RE = re.compile(r'\\(?:u[0-9a-fA-F]{4}|["\\/bfnrt])|(\\)')


def _load_counted_line(raw):
    """(object or None, repaired) for counting, under the content rule (README "Exactness").

    Strict json.loads first. Failing that, the line is read again with three repairs that only
    touch what strings hold, never where they end: invalid UTF-8 bytes become placeholders
    (surrogateescape), raw control characters are allowed (strict=False), and a backslash that
    starts no valid escape stands for itself. So a line's outcome never depends on whether a
    template had been learned before it (sequential and parallel scans agree), and a template
    never accepts a line this rejects. The escape repair runs only when strict=False alone
    fails: a line it parses holds no bad escape, so the repair would not change it.
    """
    obj = load_line(raw)
    if obj is not None:
        return obj, False
    text = bytes(raw).decode("utf-8", "surrogateescape")
    try:  # no bad escape (the usual broken writer: raw TABs, invalid UTF-8): nothing to repair
        obj = json.loads(text, strict=False)
    except (ValueError, RecursionError):
        try:
            text = _BAD_ESCAPE_RE.sub(_repair_escape, text)
            obj = json.loads(text, strict=False)
        except (ValueError, RecursionError):
            return None, True
    return (obj if isinstance(obj, dict) else None), True


def _repair_escape(m):
    """A lone backslash doubled (it stands for itself); a valid escape kept."""
    return "\\\\" if m.group(1) else m.group(0)


# ---------------------------------------------------------------------------- templates
# Shard scanning is the hot path. Per shard the scanner learns *templates* from lines it parsed
# with json.loads: the line's JSON skeleton as a regex (keys and structure literal, scalars
# generic, finish_reason / completion_tokens captured) with long text strings left as holes that
# are skipped, not decoded: bytes.find for the closing quote, or one C-level regex scan past
# escaped quotes. Unlike a bare search for the key bytes, a template also proves the key sits at
# the right path (a lone nested "finish_reason" cannot pass for the real one). A line that
# matches a template has the same key structure as the line the template came from, so its
# counts equal json.loads' counts; any other line (other schema, escapes in finish_reason, no
# completion_tokens, overrides set) takes the json.loads path.
# The content rule (README "Exactness"): a template checks everything that decides structure
# (keys, punctuation, where each string ends, the two fields' values; finish_reason must be
# ASCII) but not what string values hold. Invalid UTF-8 inside a string value, and raw control
# characters or bad escapes inside a long text string, only come from a broken writer (never
# json.dumps, serde or Go) and leave the line's counts alone, so such a line counts here; the
# json.loads path counts it too, with the same content repaired (_load_counted_line), so the
# two paths agree. Not decoding the text is what keeps raw UTF-8 fast. A repaired line teaches
# templates too (they check structure only, and the repair never moves where a string ends), so
# a broken writer's shard, where no line is valid JSON, is not left on the json.loads path.
# A string is the unrolled loop "[^"\\]*(?:\\.[^"\\]*)*": the same strings as "(?:[^"\\]|\\.)*", its
# runs taken by one charset loop, not an alternation per byte (~4x faster on a 10 KB line). A
# list of integers is one token (group 5), the one _collapse_int_lists would make of its tokens
# (a vLLM line: ~30 tokens, not thousands).
_TOKEN_RE = re.compile(
    rb'([ \t\r]*)(?:("[^"\\]*(?:\\.[^"\\]*)*")|(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)'
    rb"|(true|false|null)|(\[[ \t\r]*-?(?:0|[1-9][0-9]*)(?:[ \t\r]*,[ \t\r]*-?(?:0|[1-9][0-9]*))*[ \t\r]*\])"
    rb"|([{}\[\]:,]))"
)
_WS = rb"[ \t\r]*"
# json.loads refuses an integer of more digits than sys.get_int_max_str_digits(), and the line is
# malformed: every integer a template matches is bounded so (as fields.MORE_DIGITS; this module
# is loaded before its siblings when shipped, so it cannot read theirs at import)
INT_MAX_DIGITS = getattr(sys, "get_int_max_str_digits", int)()  # 0: no limit (int() is 0: before the limit)
MORE_DIGITS = b"[0-9]{0,%d}" % (INT_MAX_DIGITS - 1) if INT_MAX_DIGITS > 0 else b"[0-9]*"
_STR = rb'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"'
_NUM = b"-?(?:0|[1-9]" + MORE_DIGITS + rb")(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_LIT = rb"true|false|null"
_SCALARS = {  # any JSON scalar; the type seen in the template's line is tried first (speed only)
    "s": b"(?:" + _STR + b"|" + _NUM + b"|" + _LIT + b")",
    "n": b"(?:" + _NUM + b"|" + _STR + b"|" + _LIT + b")",
    "l": b"(?:" + _LIT + b"|" + _STR + b"|" + _NUM + b")",
}
_P = b"+" if sys.version_info >= (3, 11) else b""  # possessive: no backtracking (3.11+)
_ONLY = {  # a strict template accepts only the type seen; other types take the tolerant one
    "s": _STR.replace(b"]*", b"]*" + _P).replace(b")*", b")*" + _P),
    "n": _NUM,
    "i": b"-?(?:0|[1-9]" + MORE_DIGITS + _P + b")",  # an integer was seen: fewer branches (a float goes tolerant)
    "l": b"(?:" + _LIT + b")",
}
_FR = rb'(?:"(?P<fr>[^"\\\x00-\x1f\x80-\xff]*)"|null)'  # ASCII only: others take json.loads
_CT = b"(?P<ct>0|[1-9]" + MORE_DIGITS + b")"
_CT2 = b"(?P<ct2>0|[1-9]" + MORE_DIGITS + b")"  # a second count added to ct (formats' tokens_plus), in ct's segment
# A list of integers (token IDs), collapsed to one token by the builder (_collapse_int_lists), is
# a hole like a long string: its end is the first "]" after it, and _list_items checks its body
# with C-level bytes methods (a regex walk of thousands of integers ran at 30-90 MB/s); where it
# is the token count (formats "len", vLLM's token_ids) the count is its items (hole kind 3).
# No possessive quantifier here: CPython 3.11.2's `(?:...)*+` let "[1,]" match (a trailing comma).
_INT = b"-?(?:0|[1-9]" + MORE_DIGITS + b")"
_INT_ITEMS = _INT + rb"(?:[ \t\r]*,[ \t\r]*" + _INT + b")*"
_INT_LIST_BODY = re.compile(rb"[ \t\r]*(?:" + _INT_ITEMS + rb")?[ \t\r]*")
_LIST_TOKEN = b"[#]"  # the builder's token for a collapsed list of integers


class _TemplateError(Exception):
    """The line cannot be turned into a template (too big, duplicate keys, odd token)."""


class _Builder:
    """Walks one line's tokens and emits regex pieces, split into segments at string holes.

    A piece is (whitespace seen before the token, pattern). The strict variant keeps that
    whitespace literally (fast, the usual case: one writer, one style); the tolerant variant
    accepts any JSON whitespace there.
    """

    def __init__(self, raw, loc, extra=None):
        self.tokens = _collapse_int_lists(_tokens(raw))
        if len(self.tokens) > TEMPLATE_MAX_TOKENS:
            raise _TemplateError("too many tokens")
        self.i = 0
        self.fr_path, self.ct_path, self.ct2_path = loc.finish, loc.tokens, loc.tokens_plus
        self.count_len = loc.body.count == "len"
        self.literal = loc.literal  # keys whose scalar values the template matches as they are
        self.segments, self.cur = [], []
        # extra: {path: capture pattern} of the per-line fields (fields.py's FieldSpec) and the
        # answer / reasoning text paths, whose holes are remembered (hole_paths) for no-answer checks
        self.extra = extra or {}
        self.hole_paths = []
        self.hole_kinds = []  # per hole: 1 a string, 2 a list of integers, 3 the counted one
        self.kinds = {}  # path -> the kind of token a captured field held in this line ("s", "i", "l", "n")

    def next(self):
        if self.i >= len(self.tokens):
            raise _TemplateError("truncated")
        self.i += 1
        return self.tokens[self.i - 1]

    def emit(self, tok, pattern, lit=None, tolerant=None):
        """Add a piece: `lit` is its literal bytes (None for scalars); `tolerant` its loose pattern."""
        self.cur.append((tok[0], pattern, tolerant or pattern, lit))

    def value(self, path):
        tok = self.next()
        ws, s, num, lit, punct = tok
        if punct == _LIST_TOKEN:  # a list of integers: a hole after its "["
            self.emit(tok, rb"\[", b"[")
            return self._hole(path, 3 if path == self.ct_path and self.count_len else 2)
        if path == self.ct_path and self.count_len:
            raise _TemplateError("the token IDs are not a list of integers")
        if punct in (b"{", b"["):
            return self.container(tok, path)
        if path == self.ct_path or path == self.ct2_path:
            if num is None or not num.isdigit():
                raise _TemplateError("completion_tokens is not a count")
            return self.emit(tok, _CT if path == self.ct_path else _CT2)
        if path and path[-1] in self.literal and punct is None:
            return self._literal(tok, path)
        if path == self.fr_path:
            if s is None and lit != b"null":  # json.loads would give None, a template could not
                raise _TemplateError("finish_reason is not a string")
            return self.emit(tok, _FR)
        if self.extra and path in self.extra:
            return self._extra_value(tok, path)
        if s is not None and (len(s) > 64 or (path and path[-1] in HOLE_KEYS)):
            self.emit(tok, b'"', b'"')  # the hole starts just after this opening quote
            return self._hole(path, 1)
        if punct is not None:
            raise _TemplateError("unexpected %r" % punct)
        kind = "s" if s else "n" if num else "l"
        strict = "i" if kind == "n" and num.lstrip(b"-").isdigit() else kind
        return self.emit(tok, _ONLY[strict], tolerant=_SCALARS[kind])

    def _hole(self, path, kind):
        """End the segment at a hole of `kind` (hole_kinds) at `path`."""
        self.hole_paths.append(path)
        self.hole_kinds.append(kind)
        self.segments.append(self.cur)
        self.cur = []

    def _literal(self, tok, path):
        """A value the format's reading depends on (a `type`, `status`, `status_code`): matched
        as it is, so a line with another value there takes another template or json.loads."""
        ws, s, num, lit, punct = tok
        raw = s or num or lit
        if b"\\" in raw or not raw.isascii():
            raise _TemplateError("a literal value with an escape")
        if path == self.fr_path:
            if s is None:
                raise _TemplateError("finish_reason is not a string")
            return self.emit(tok, b'"(?P<fr>' + re.escape(s[1:-1]) + b')"')
        return self.emit(tok, re.escape(raw), raw)

    def _extra_value(self, tok, path):
        """A per-line field (prompt ID, prompt tokens, group: captured; a container takes
        json.loads) or an answer / reasoning text (a string is a hole whose place is remembered,
        any other value matches only its own kind, so the template proves which text is there)."""
        pattern = self.extra[path]
        ws, s, num, lit, punct = tok
        if punct in (b"{", b"["):
            if pattern is not None:
                raise _TemplateError("a per-line field holds a container")
            return self.container(tok, path)
        if pattern is not None:  # (tolerant, {kind: strict}): the strict one for this token's kind
            # "s" a non-empty string, "e" an empty one, "l" null/true/false, "i" an integer, "n" another number
            kind = "l" if lit is not None else "n" if s is None else "s" if s != b'""' else "e"
            kind = "i" if kind == "n" and num.lstrip(b"-").isdigit() else kind
            self.kinds[path] = kind
            return self.emit(tok, pattern[1].get(kind, pattern[0]), tolerant=pattern[0])
        if s is not None:
            self.emit(tok, b'"', b'"')
            return self._hole(path, 1)
        if punct is not None:
            raise _TemplateError("unexpected %r" % punct)
        return self.emit(tok, fields.text_scalar("n" if num else "l"))

    def container(self, tok, path):
        close = b"}" if tok[4] == b"{" else b"]"
        self.emit(tok, re.escape(tok[4]), tok[4])
        keys, k = set(), 0
        while True:
            if self.i < len(self.tokens) and self.tokens[self.i][4] == close:
                return self.emit(self.next(), re.escape(close), close)
            if k:
                comma = self.next()
                if comma[4] != b",":
                    raise _TemplateError("expected ,")
                self.emit(comma, b",", b",")
            if close == b"}":
                key, colon = self.next(), self.next()
                name = json.loads(key[1].decode("utf-8")) if key[1] else None
                if name is None or name in keys or colon[4] != b":":
                    raise _TemplateError("bad or duplicate key")
                keys.add(name)
                self.emit(key, re.escape(key[1]), key[1])
                self.emit(colon, b":", b":")
                self.value(path + (name,))
            else:
                self.value(path + (k,))
            k += 1

    def compile(self, strict):
        """Compiled segments (match, groups, hole, lead, backward); the last reaches the line end.
        `groups`: 1 ct, 2 fr, 8 ct2 (added to ct), 4 per-line fields (bits 4+: which such segment).

        In the strict variant a segment that follows a hole starts with literal bytes (the
        hole's closing quote, then keys and punctuation up to the first scalar): that `lead` is
        checked with startswith or, for the last hole, found with one bytes.rfind from the
        line's end, and the segment's regex starts after it. The tolerant variant (any
        whitespace) matches every piece by regex.
        """
        segs = self.segments + [self.cur + [(b"", _WS + rb"\Z", _WS + rb"\Z", None)]]
        leads = [None] * len(segs)  # type: list
        if strict:
            for i, seg in enumerate(segs):
                n = next((j for j, piece in enumerate(seg) if piece[3] is None), len(seg))
                close = (b'"' if self.hole_kinds[i - 1] == 1 else b"]") if i else b""
                leads[i] = close + b"".join(ws + lit for ws, _, _, lit in seg[:n])
                if i:
                    segs[i] = seg[n:]
        out = []
        k = 0  # field-capturing segments so far: bits 3+ of `groups` say which one this is
        for i, seg in enumerate(segs):
            parts = (re.escape(ws) + pat if strict else _WS + loose for ws, pat, loose, _ in seg)
            rx = re.compile(b"".join(parts), re.DOTALL)
            groups = ("ct" in rx.groupindex) | ("fr" in rx.groupindex) << 1 | ("ct2" in rx.groupindex) << 3
            if groups & 9 == 8:
                raise _TemplateError("the second count is not in the first one's segment")
            if set(rx.groupindex) - {"ct", "fr", "ct2"}:
                groups |= 4 | k << 4
                k += 1
            hole = self.hole_kinds[i] if i < len(self.segments) else 0
            lead = leads[i + 1] if hole and strict else None
            out.append((rx.match, groups, hole, lead, hole == 1 and i == len(self.segments) - 1))
        plan = _Plan(out)
        plan.ms = [None] * k
        return plan


def _tokens(raw):
    """The line's tokens (whitespace before, string, number, literal, punctuation); a list of
    integers matched whole (_TOKEN_RE's group 5) is one _LIST_TOKEN."""
    return [
        (ws, s, num, lit, punct) if ints is None else (ws, None, None, None, _LIST_TOKEN)
        for ws, s, num, lit, ints, punct in (m.groups() for m in _TOKEN_RE.finditer(raw))
    ]


def _collapse_int_lists(tokens):
    """`tokens` with each list of integers as one _LIST_TOKEN (token IDs: vLLM's `token_ids` and
    `prompt_token_ids`, Ollama's `context`), so such a line stays within TEMPLATE_MAX_TOKENS."""
    out, i, n = [], 0, len(tokens)
    while i < n:
        t = tokens[i]
        if t[4] == b"[" and i + 1 < n and _is_int(tokens[i + 1]):
            j = i + 2
            while j + 1 < n and tokens[j][4] == b"," and _is_int(tokens[j + 1]):
                j += 2
            if j < n and tokens[j][4] == b"]":
                out.append((t[0], None, None, None, _LIST_TOKEN))
                i = j + 1
                continue
        out.append(t)
        i += 1
    return out


def _is_int(tok):
    return tok[2] is not None and tok[2].lstrip(b"-").isdigit()


def _list_items(buf, s, e, count=True):
    """How many integers the JSON list whose body (between its brackets) is buf[s:e] holds, or
    -1 when json.loads would not read it as a list of integers (with count=False: 0 or more
    for such a list, the items not counted: a list only checked).

    The usual body (json.dumps: IDs from 1 up, ", " between them) takes one pair check, no
    regex and no per-byte Python work: each byte becomes a code (_ID_PAIRS: its class in the
    low nibble, the classes it forbids next in the high one), the codes one big integer, and
    one shift and two ANDs find any byte whose class its predecessor forbids. With the body
    starting 1-9 and ending with a digit, no forbidden pair means [1-9][0-9]*(, [1-9][0-9]*)*:
    every comma has its space, every space a comma before and an item 1-9 after, no item is
    empty, none starts with 0 and there is no other byte; the items are then the commas plus
    one. The commas are counted from the codes' bits, with no mask: a digit's code has 2 bits
    set, a comma's and a space's 4 each, so a body of n bytes and k ", " holds 2n + 4k bits. A
    body that starts with 0, holds an item 0 (a token ID 0) or is written otherwise takes
    _list_items_sep."""
    n = e - s
    if n <= 0:
        return 0 if n == 0 else -1
    if 49 <= buf[s] <= 57 and 48 <= buf[e - 1] <= 57 and n <= TEMPLATE_MAX_LINE_BYTES:
        size, low = _ID_MASKS if n <= _ID_MASKS[0] else _id_masks(n)
        x = int.from_bytes(buf[s:e].translate(_ID_PAIRS), "big")
        if not (x >> 12) & x & low:  # byte i's high nibble lands on byte i + 1's low one
            if n > INT_MAX_DIGITS > 0 and _long_item(buf, s, e):
                return -1
            if not count:
                return 0
            return ((x.bit_count() - 2 * n) >> 2) + 1 if _BIT_COUNT else buf.count(b",", s, e) + 1
    return _list_items_sep(bytes(buf[s:e]))


def _long_item(buf, s, e, before=b" "):
    """Whether the list body buf[s:e] (items, each after `before`: ", " or "," between them)
    holds an item of more digits than json.loads reads (INT_MAX_DIGITS): such an item spans one
    of the points INT_MAX_DIGITS apart, so two short searches at each point find it (~0.2 us a
    point; a body under the limit has none)."""
    step = INT_MAX_DIGITS
    for c in range(s + step, e, step):
        if buf[c] != 32 and buf[c] != 44:  # inside an item: its ends are the nearest separators
            left, right = buf.rfind(before, s, c), buf.find(b",", c, e)
            if (right if right >= 0 else e) - (left if left >= 0 else s - 1) - 1 > step:
                return True
    return False


def _pair_code(b):
    """_ID_PAIRS' code of byte b: classes 1 " ", 2 a digit 1-9, 4 ",", 8 "0"; 15 any other byte
    (which no class may precede: every code forbids some class, so no pair with it passes). A
    digit's code has 2 bits set, a comma's and a space's 4: _list_items counts the commas by them."""
    if 49 <= b <= 57:
        return 0x12  # 1-9: anything but " " next
    if b == 48:
        return 0x18  # 0: likewise (an item that starts with 0 is refused by the " " before it)
    if b == 44:
        return 0xE4  # ",": only " " next
    if b == 32:
        return 0xD1  # " ": only 1-9 next
    return 0xFF


_ID_PAIRS = bytes(_pair_code(b) for b in range(256))
# int.bit_count (Python 3.10+) counts the codes' bits at ~0.5 ns a list byte; before it, a C-level
# count of the commas (~1 ns; bin(x).count("1") would take ~20)
_BIT_COUNT = hasattr(int, "bit_count")


def _id_masks(n):
    """(bytes covered, 0x0F in every byte) for bodies of up to n bytes: the mask grows
    (doubling, from 64 KiB, to TEMPLATE_MAX_LINE_BYTES) with the longest list seen; one tuple,
    swapped whole (another thread reads the old one or the new)."""
    global _ID_MASKS
    size = _ID_MASKS[0]
    if n > size:
        size = max(1 << 16, 1 << (n - 1).bit_length())
        _ID_MASKS = (size, int.from_bytes(b"\x0f" * size, "big"))
    return _ID_MASKS


_ID_MASKS = (0, 0)
_id_masks(1)


def _list_items_sep(body):
    """_list_items for a body its class pass did not take: the separators left without the
    digits must be all ", " (or all ","), each comma followed by its space, no item empty and
    none with a leading zero; any other body takes one regex match (_INT_LIST_BODY)."""
    if not (49 <= body[0] <= 57 and 48 <= body[-1] <= 57):  # starts 1-9, ends with a digit
        return _list_items_slow(body)
    seps = body.translate(None, b"0123456789")
    k = len(seps)
    if seps == b", " * (k >> 1) and not k & 1 and body.count(b", ") == k >> 1:  # each space after a comma
        if b", ," in body or not _zeros_alone(body, b" 0"):  # an empty item; a leading zero
            return -1
        if len(body) > INT_MAX_DIGITS > 0 and _long_item(body, 0, len(body)):
            return -1
        return (k >> 1) + 1
    if seps == b"," * k:
        if b",," in body or not _zeros_alone(body, b",0"):
            return -1
        if len(body) > INT_MAX_DIGITS > 0 and _long_item(body, 0, len(body), b","):
            return -1
        return k + 1
    return _list_items_slow(body)


def _zeros_alone(body, mark):
    """Whether every item of the list body that starts with 0 (after `mark`'s separator) is 0
    itself: json.loads rejects a leading zero."""
    i = body.find(mark)
    while i >= 0:
        if body[i + 2 : i + 3] not in (b",", b""):
            return False
        i = body.find(mark, i + 2)
    return True


def _list_items_slow(body):
    if _INT_LIST_BODY.fullmatch(body) is None:
        return -1
    items = body.strip(JSON_SPACE)
    return items.count(b",") + 1 if items else 0


def _fixer(labels):
    """(ct, fr) of a template hit as the json.loads path reads them: the format's label map
    applied (formats.LABELS); None when the map is empty."""
    bl = {k.encode("utf-8"): v.encode("utf-8") for k, v in labels.items()}
    if bl:
        return lambda ct, fr: (ct, bl.get(fr, fr))
    return None


class _Plan(list):
    """A template's compiled segments; `fields` is its per-line field layout (fields.TemplateFields)
    when the shard has per-line fields, else None; `ms` holds the last match of each
    field-capturing segment (_match_fields fills it; read right after, in the same thread)."""

    fields: Any = None
    ms: Any = None
    inline: Any = None  # for _scan_chunk_fields' inline path (see fields.TemplateFields.plain)
    walk: Any = None  # for _scan_chunk_fields' inline walk (_walk)
    tolerant: Any = None  # a strict plan's: builds its tolerant plan (or None), until _tolerant_on calls it
    fix: Any = None  # _fixer: the format's label map / token-ID count, applied to each hit
    labels: Any = None  # the label map as bytes, for a walk that applies it inline (no count to fix)


def _build_template(raw, obj, xspec=None):
    """The strict plan (regex segments) for lines shaped like `raw`, or None; its `tolerant`
    builds the tolerant plan when first needed (_tolerant_on).

    With `xspec` (the shard's per-line fields are on, fields.FieldSpec) the templates capture
    the prompt ID, prompt tokens and group, and remember which holes hold the answer and the
    reasoning text."""
    loc = locate(obj)
    ct = formats.get_at(obj, loc.tokens)
    if not isinstance(ct, list if loc.body.count == "len" else int) or len(raw) > TEMPLATE_MAX_LINE_BYTES:
        return None
    extra = layout = None
    if xspec is not None:
        layout = fields.TemplateFields(xspec, loc)
        extra = layout.captures
    try:
        b = _Builder(raw, loc, extra)
        b.value(())
        if b.i != len(b.tokens):
            raise _TemplateError("trailing tokens")
    except (_TemplateError, ValueError, RecursionError):
        return None
    try:
        strict = b.compile(True)
    except _TemplateError:
        return None
    b.tokens = None  # the line's tokens: the tolerant plan needs only the segments
    fix = strict.fix = _fixer(loc.labels)
    if fix is not None:  # the walk maps the labels inline
        strict.labels = {k.encode("utf-8"): v.encode("utf-8") for k, v in loc.labels.items()}
    if layout is not None:
        layout.with_holes(b.hole_paths)
        _bind(strict, layout)
        strict.walk = _walk(strict, b.kinds)

    def tolerant():
        try:
            plan = b.compile(False)
        except _TemplateError:
            return None
        plan.fix = fix
        if layout is not None:
            _bind(plan, layout)
        return plan

    strict.tolerant = tolerant
    return strict


def _bind(plan, layout):
    """Set `plan`'s per-line field layout (fields.TemplateFields.bind) and its inline getters."""
    plan.fields = tf = layout.bind(plan)
    if tf.plain:  # (ID segment, group, prompt-token segment, group); -1: none
        plan.inline = (*(tf.id1 or (-1, 0)), *(tf.pt1 or (-1, 0)))


def _walk(plan, kinds):
    """(plan, segments, ID group, prompt-token group, label map or None, post) for
    _scan_chunk_fields' inline walk of a strict plan, or None. Each segment is (match, take,
    hole, lead, len(lead), backward, mark), `take` saying what it captures: 1 ct and fr
    together, 2 the ID (group number: the ID group), 4 the prompt tokens, 8 fr alone, 16 ct
    alone; group 0: none. A hole of kind 3 (a counted list of token IDs) gives ct. `post`: the
    line's key is built after the walk (ct and fr from two places, or a label map to apply).
    It qualifies with a finish reason and a count, one prompt-token capture at most and no
    group field; the rest take _match_fields.

    The ID read is the first candidate captured whose strict capture accepts only IDs (`kinds`,
    the builder's: "s" a non-empty string, "i" an integer; fields._SCALAR_STRICT): the
    candidates tried before it accept only null, true or false ("l"), so on every line this plan
    matches it is the ID fields.line_values picks, and no line needs the check."""
    tf = plan.fields
    if (
        (plan.fix is not None and plan.labels is None)
        or any(seg[1] & 8 for seg in plan)  # a second count to add: _match_fields
        or len(tf.pt_get) > 1
        or tf.spec.group_path is not None
        or not any(seg[1] & 2 for seg in plan)
        or not any(seg[1] & 1 or seg[2] == 3 for seg in plan)
    ):
        return None
    split = not any(seg[1] & 3 == 3 for seg in plan)
    ki, gi = -1, 0
    for path, getter in zip(tf.id_got, tf.id_get):
        if kinds.get(path) in ("s", "i"):
            ki, gi = getter
            tf.id_seen = (fields.dotted(path),)  # where this plan's IDs are (the reply's id_fields)
            break
        if kinds.get(path) != "l":
            return None
    kp, gp = tf.pt1 or (-1, 0)
    segs, h = [], 0
    for match, groups, hole, lead, backward in plan:
        if hole and lead is None:
            return None
        k = groups >> 4 if groups & 4 else -1
        take = 1 if groups & 3 == 3 else (8 if groups & 2 else 0) | (16 if groups & 1 else 0)
        take |= (2 if k == ki >= 0 else 0) | (4 if k == kp >= 0 else 0)
        mark = 0  # 1: the answer text's hole, 2: the reasoning text's (kept for a `length` stop)
        if hole:
            mark = 1 if h == tf.ans_hole else 2 if h == tf.rsn_hole else 0
            h += 1
        segs.append((match, take, hole, lead, len(lead) if hole else 0, backward, mark))
    post = split or plan.labels is not None
    return plan, tuple(segs), gi if ki >= 0 else 0, gp if kp >= 0 else 0, plan.labels, post


def _match_template(plan, buf, pos, end):
    """(ct_bytes, fr_bytes) when the line buf[pos:end] matches the template plan, else None."""
    ct = fr = None
    for match, groups, hole, lead, backward in plan:  # the hot loop: calls kept inline
        m = match(buf, pos, end)
        if m is None:
            return None
        if groups:
            if groups & 1:
                ct = m.group("ct")
                if groups & 8:  # Gemini's thoughts: part of the count
                    ct = b"%d" % (int(ct) + int(m.group("ct2")))
            if groups & 2:
                fr = m.group("fr")
        if hole:
            pos = m.end()
            if hole > 1:  # a list of integers: it ends at the first "]"
                q = buf.find(b"]", pos, end)
                n = _list_items(buf, pos, q, hole == 3) if q >= 0 else -1
                if n < 0 or (lead is not None and not buf.startswith(lead, q)):
                    return None
                if hole == 3:
                    ct = b"%d" % n
                pos = q + (1 if lead is None else len(lead))
                continue
            if backward and lead is not None:  # last hole: its end found from the line's end
                q = buf.rfind(lead, pos, end)
                # exact only if no quote inside could have closed the string first
                if q < 0 or ((buf[q - 1] == 92 or buf.find(b'"', pos, q) >= 0) and hole_end(buf, pos, end) != q + 1):
                    return None
            else:
                q = hole_end(buf, pos, end) - 1
                if q < 0 or (lead is not None and not buf.startswith(lead, q)):
                    return None
            pos = q + (1 if lead is None else len(lead))
    fix = plan.fix
    return (ct, fr) if fix is None else fix(ct, fr)  # None: a token-ID list json.loads reads otherwise


def _match_fields(plan, buf, pos, end):
    """_match_template for a shard with per-line fields: (ct, fr, plan.ms), plan.ms holding the
    matches of the segments that captured fields."""
    ct = fr = None
    ex = plan.ms
    for match, groups, hole, lead, backward in plan:
        m = match(buf, pos, end)
        if m is None:
            return None
        if groups:
            if groups & 1:
                ct = m.group("ct")
                if groups & 8:  # Gemini's thoughts: part of the count
                    ct = b"%d" % (int(ct) + int(m.group("ct2")))
            if groups & 2:
                fr = m.group("fr")
            if groups & 4:
                ex[groups >> 4] = m
        if hole:
            pos = m.end()
            if hole > 1:  # a list of integers, as _match_template
                q = buf.find(b"]", pos, end)
                n = _list_items(buf, pos, q, hole == 3) if q >= 0 else -1
                if n < 0 or (lead is not None and not buf.startswith(lead, q)):
                    return None
                if hole == 3:
                    ct = b"%d" % n
                pos = q + (1 if lead is None else len(lead))
                continue
            if backward and lead is not None:
                q = buf.rfind(lead, pos, end)
                if q < 0 or ((buf[q - 1] == 92 or buf.find(b'"', pos, q) >= 0) and hole_end(buf, pos, end) != q + 1):
                    return None
            else:
                q = hole_end(buf, pos, end) - 1
                if q < 0 or (lead is not None and not buf.startswith(lead, q)):
                    return None
            pos = q + (1 if lead is None else len(lead))
    if plan.fix is not None:
        fixed = plan.fix(ct, fr)
        if fixed is None:
            return None
        ct, fr = fixed
    return ct, fr, ex


def hole_spans(plan, buf, pos, end):
    """[(start, end)] of each hole's string body in the line buf[pos:end] that matches `plan`
    (as _match_template walks it; called again only for the few lines whose text is checked)."""
    spans = []
    for match, _groups, hole, lead, backward in plan:
        m = match(buf, pos, end)
        if m is None:
            return None
        if hole:
            pos = m.end()
            if hole > 1:  # a list of integers (as _match_template)
                q = buf.find(b"]", pos, end)
                if q < 0 or _list_items(buf, pos, q, False) < 0 or (lead is not None and not buf.startswith(lead, q)):
                    return None
            elif backward and lead is not None:
                q = buf.rfind(lead, pos, end)
                if q < 0 or ((buf[q - 1] == 92 or buf.find(b'"', pos, q) >= 0) and hole_end(buf, pos, end) != q + 1):
                    return None
            else:
                q = hole_end(buf, pos, end) - 1
                if q < 0 or (lead is not None and not buf.startswith(lead, q)):
                    return None
            spans.append((pos, q))
            pos = q + (1 if lead is None else len(lead))
    return spans


# A quote not preceded by a run of exactly 1, 3 or 5 backslashes (those escape it): unescaped,
# after an even run, or after an odd run of 7+ (rare; hole_end counts that run).
_QUOTE_RE = re.compile(rb'"(?<![^\\]\\")(?<![^\\]\\\\\\")(?<![^\\]\\\\\\\\\\")')


def hole_end(buf, pos, end):
    """Offset just past the closing quote of the string whose body starts at pos, or -1.

    Exact on structure: a quote closes the string unless an odd run of backslashes precedes
    it. One C-level search skips every quote behind a run of 1, 3 or 5 backslashes; only a
    quote behind two or more (rare: an escaped backslash) costs a look back at the run.
    """
    q = buf.find(b'"', pos, end)
    if q >= 0 and buf[q - 1] != 92:  # 92 is the backslash
        return q + 1  # the usual case: no escaped quote before the end
    search = _QUOTE_RE.search
    while True:
        m = search(buf, pos, end)
        if m is None:
            return -1
        q = m.start()
        if buf[q - 1] != 92:
            return q + 1
        b = q - 2  # the run stops at the string's opening quote at the latest
        while buf[b] == 92:
            b -= 1
        if (q - b) % 2 == 1:  # q - 1 - b backslashes: an even run escapes itself, not the quote
            return q + 1
        pos = q + 1


# ---------------------------------------------------------------------------- shard scanning
class _Tally:
    """Counts of one scan: template hits keyed by raw bytes, json.loads hits by value."""

    def __init__(self):
        self.fast, self.slow, self.malformed, self.lines, self.blank = {}, {}, 0, 0, 0
        self.failed = {}  # failure reason -> failed requests (formats.failure; not completions)
        self.failed_lines = 0

    def add_failed(self, reason):
        if reason not in self.failed and len(self.failed) >= formats.MAX_FAILED_REASONS - 1:
            reason = "other"  # the last slot holds every reason past the bound
        self.failed[reason] = self.failed.get(reason, 0) + 1
        self.failed_lines += 1

    def rows(self):
        merged = dict(self.slow)
        for (ct, fr), n in self.fast.items():
            if not valid_count(int(ct)):  # a template's digits can exceed the 64-bit range
                self.malformed += n
                continue
            key = (int(ct), None if fr is None else fr.decode("utf-8"), 0)
            merged[key] = merged.get(key, 0) + n
        rows = [[t, fr, est, n] for (t, fr, est), n in merged.items()]
        rows.sort(key=lambda r: (r[0], r[1] is not None, r[1] or "", r[2]))  # None before ""
        return rows


def _learn(tmpl_state, raw, obj, xspec=None):
    """Try to add a template built from a line json.loads just parsed."""
    tmpl_state[2] -= 1
    plan = _build_template(raw, obj, xspec)
    if plan is not None and _match_template(plan, raw, 0, len(raw)) is not None:
        tmpl_state[0].append(plan)
        del tmpl_state[0][:-MAX_TEMPLATES]
        if tmpl_state[4] >= TOLERANT_AFTER_MISSES:
            _tolerant_on(tmpl_state)


def _tolerant_on(tmpl_state):
    """Compile the tolerant plans of the strict plans that have none yet (the latest
    MAX_TEMPLATES kept): the shard has completion lines its strict plans miss."""
    tolerant = tmpl_state[1]
    for strict in tmpl_state[0]:
        build, strict.tolerant = strict.tolerant, None
        plan = build() if build is not None else None
        if plan is not None:
            tolerant.append(plan)
    del tolerant[:-MAX_TEMPLATES]


def _match_any(plans, buf, pos, end):
    for plan in plans:
        hit = _match_template(plan, buf, pos, end)
        if hit is not None:
            return hit
    return None


def _scan_chunk(buf, end, tally, tmpl_state, overrides, starts, base, ft):
    """Count the complete lines buf[:end] (end is just past a newline)."""
    if tmpl_state[3] is not None:
        return _scan_chunk_fields(buf, end, tally, tmpl_state, overrides, starts, base, ft, 0)
    learn = overrides == (None, None)  # overrides force json.loads on every line
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
            _count_slow(buf[pos:nl], tally, tmpl_state, overrides, learn, ft)
            if tmpl_state[3] is not None:  # this line turned the shard's per-line fields on
                tally.lines += lines
                return _scan_chunk_fields(buf, end, tally, tmpl_state, overrides, starts, base, ft, nl + 1)
        pos = nl + 1
    tally.lines += lines
    return None


def _scan_chunk_fields(buf, end, tally, tmpl_state, overrides, starts, base, ft, pos):
    """_scan_chunk for a shard with per-line fields (fields.py), from pos: a template hit also
    gives its prompt ID, prompt tokens and group, and a `length` stop's texts are looked at.

    The hot path: strict plans with a walk (_walk) are matched inline, _match_fields' steps
    without its call, and the usual line (not a `length` stop) is counted inline; the other
    plans take _match_fields and fields.Tally.template_line (the same rules)."""
    learn = overrides == (None, None)
    find, rfind, startswith, fast = buf.find, buf.rfind, buf.startswith, tally.fast
    append = starts.append if starts is not None else None
    ids_append, raw_pt, plain_line = ft.raw_ids.append, ft.raw_pt_stop, ft.plain_line
    walks, others = _walks(tmpl_state) if learn else ((), ())
    keys = []  # type: list  # (ct, fr) of each line the walk counted
    pts = []  # type: list  # its prompt-token digits (or None), not at length
    keys_append, pts_append = keys.append, pts.append
    lines = 0
    while pos < end:
        nl = find(b"\n", pos, end)
        lines += 1
        if append is not None:
            append(base + pos)
        for plan, segs, gi, gp, lm, post in walks:
            p = pos
            for match, take, hole, lead, n_lead, backward, mark in segs:
                m = match(buf, p, nl)
                if m is None:
                    break
                if take:  # == on small ints is the interpreter's fast path (& is not)
                    if take == 5:  # the usual last segment: ct, fr and the prompt tokens
                        ct, fr = key = m.group("ct", "fr")
                        ptt = m[gp]
                    elif take == 2:  # the usual first one: the ID
                        idt = m[gi]
                    elif take == 8:  # fr in a segment of its own (ct after a list, Ollama's)
                        fr = m.group("fr")
                    elif take == 20:  # ct and the prompt tokens, fr before them (Responses, Ollama)
                        ct = m.group("ct")
                        ptt = m[gp]
                    elif take == 10:  # the ID and fr (Responses' first segment)
                        fr = m.group("fr")
                        idt = m[gi]
                    else:
                        if take & 1:
                            ct, fr = key = m.group("ct", "fr")
                        if take & 2:
                            idt = m[gi]
                        if take & 4:
                            ptt = m[gp]
                        if take & 8:
                            fr = m.group("fr")
                        if take & 16:
                            ct = m.group("ct")
                if hole:
                    p = m.end()
                    if hole > 1:  # a list of integers (as _match_template)
                        q = find(b"]", p, nl)
                        n = _list_items(buf, p, q, hole == 3) if q >= 0 else -1
                        if n < 0 or not startswith(lead, q):
                            break
                        if hole == 3:
                            ct = b"%d" % n
                        p = q + n_lead
                        continue
                    if backward:  # as _match_fields: the last hole's end found from the line's end
                        q = rfind(lead, p, nl)
                        if q < 0 or ((buf[q - 1] == 92 or find(b'"', p, q) >= 0) and hole_end(buf, p, nl) != q + 1):
                            break
                    else:  # hole_end's usual case inline: the first quote closes the string
                        q = find(b'"', p, nl)
                        if q < 0 or buf[q - 1] == 92:
                            q = hole_end(buf, p, nl) - 1
                        if q < 0 or not startswith(lead, q):
                            break
                    if mark:  # no tuple per line: the spans are built for a length stop only
                        if mark == 1:
                            a0, a1 = p, q
                        else:
                            r0, r1 = p, q
                    p = q + n_lead
            else:
                if post:  # ct and fr from two places, or the format's label map (_fixer's) to apply
                    if lm is not None:
                        fr = lm.get(fr, fr)
                    key = (ct, fr)
                keys_append(key)  # counted in C at the chunk's end, as pts
                if fr != b"length" and len(ct) <= 12:  # the usual line
                    if gi:
                        ids_append(idt)  # hashed in bulk (fields.Tally.hash_ids)
                    if gp:
                        pts_append(ptt)  # None (not a count) among them, dropped below
                elif len(ct) <= 12 or valid_count(int(ct)):  # else malformed (_Tally.rows)
                    tf = plan.fields
                    texts = (
                        (a0, a1) if tf.ans_hole is not None else None,
                        (r0, r1) if tf.rsn_hole is not None else None,
                    )
                    plain_line(tf, ct, fr, idt if gi else None, ptt if gp else None, plan, buf, pos, nl, texts)
                break
        else:
            if not _match_others(others, tally, ft, buf, pos, nl):
                _count_slow(buf[pos:nl], tally, tmpl_state, overrides, learn, ft)
                walks, others = _walks(tmpl_state) if learn else ((), ())
        pos = nl + 1
    tally.lines += lines
    Counter.update(fast, keys)  # collections' C-level counting, into the plain dicts
    if pts:
        Counter.update(raw_pt, pts)
        raw_pt.pop(None, None)
    ft.bound_memory()


def _walks(tmpl_state):
    """(inline walks of the strict plans that have one, the other plans: strict, then tolerant)."""
    strict = tmpl_state[0]
    return [p.walk for p in strict if p.walk is not None], [p for p in strict if p.walk is None] + tmpl_state[1]


def _match_others(plans, tally, ft, buf, pos, nl):
    """Count the line buf[pos:nl] when one of `plans` matches it (_match_fields); False if none."""
    for plan in plans:
        hit = _match_fields(plan, buf, pos, nl)
        if hit is not None:
            break
    else:
        return False
    ct, fr, ex = hit
    tally.fast[ct, fr] = tally.fast.get((ct, fr), 0) + 1
    inline = plan.inline
    if inline is not None and fr != b"length" and len(ct) <= 12:  # as template_line, inline
        ki, gi, kp, gp = inline
        idt = ex[ki][gi] if ki >= 0 else None
        if idt is not None and (len(idt) > 2 if idt[0] == 34 else idt[0] not in fields.NOT_ID):
            ft.raw_ids.append(idt)
            ft.id_paths.add(plan.fields.id_names[0])
        if kp >= 0 and ex[kp][gp] is not None:
            ft.raw_pt_stop[ex[kp][gp]] = ft.raw_pt_stop.get(ex[kp][gp], 0) + 1
    elif len(ct) <= 12 or valid_count(int(ct)):  # else malformed (_Tally.rows)
        ft.template_line(plan.fields, ct, fr, ex, plan, buf, pos, nl)
    return True


def _count_slow(raw, tally, tmpl_state, overrides, learn, ft=None):
    """The json.loads path for one line; may learn a template from it, and may turn the
    shard's per-line fields on (the first line that has any)."""
    obj, repaired = _load_counted_line(raw)
    if obj is not None:
        reason = formats.failure(obj)
        if reason is not None:  # a failed request: counted apart, never a completion
            tally.add_failed(reason)
            if ft is not None:
                _failed_id(obj, tmpl_state, ft)
            return
    key = None if obj is None else count_key(obj, overrides)
    if key is None or (repaired and key[1] is not None and _has_placeholder(key[1])):
        # the one place a line is called blank or malformed (an invalid UTF-8 byte in
        # finish_reason is malformed too: its value is unknown)
        if key is None and not raw.strip(JSON_SPACE):
            tally.blank += 1
        else:
            tally.malformed += 1
        return
    if key[1] is not None and not key[1].isascii():
        key = (key[0], clean_text(key[1]), key[2])  # a "\\ud800" escape: counted as U+FFFD
    tally.slow[key] = tally.slow.get(key, 0) + 1
    if tmpl_state[0] and tmpl_state[4] < TOLERANT_AFTER_MISSES:  # a completion the strict plans missed
        tmpl_state[4] += 1
        if tmpl_state[4] == TOLERANT_AFTER_MISSES:
            _tolerant_on(tmpl_state)
    if ft is not None:
        texts = locate(obj)
        if tmpl_state[3] is None and fields.has_fields(obj, ft.spec, texts):
            tmpl_state[3] = ft.spec.key()
            del tmpl_state[0][:], tmpl_state[1][:]  # relearned with the fields captured
        if tmpl_state[3] is not None:
            ft.json_line(obj, texts, key[0], key[1])
    if learn and tmpl_state[2] > 0 and key[2] == 0:
        _learn(tmpl_state, bytes(raw), obj, ft.spec if ft is not None and tmpl_state[3] is not None else None)


def _failed_id(obj, tmpl_state, ft):
    """Keep a failed request's prompt ID (failed_ids); its ID turns the shard's fields on."""
    idb = fields.line_values(obj, ft.spec)[1]
    if idb is None:
        return
    if tmpl_state[3] is None:
        tmpl_state[3] = ft.spec.key()
        del tmpl_state[0][:], tmpl_state[1][:]  # relearned with the fields captured
    ft.failed_raw.append(idb)


def _has_placeholder(text):
    """Whether text holds an invalid UTF-8 byte that surrogateescape kept as U+DC80..U+DCFF."""
    return any("\udc80" <= c <= "\udcff" for c in text)


class Reader:
    """Reads runs of complete lines; full-size chunks reuse one buffer (no page-fault churn).

    `tail` is the file's TAILS entry [line start, offset]: no newline lies from that line start
    up to that offset, so an unterminated line is searched from where the last search ended.
    `deadline` (time.monotonic()) bounds that search: past it the search stops after one read,
    TAILS keeps how far it got, and `cut_short` tells the scan the line may still end.
    """

    def __init__(self, f, size, cap_bytes, tail=None, deadline=None):
        self.f, self.size = f, size
        self.buf = bytearray(max(1, min(CHUNK_BYTES, cap_bytes)))
        self.tail = tail if tail is not None else [-1, -1]
        self.deadline, self.cut_short = deadline, False

    def lines(self, pos, want):
        """(buf, end): buf[:end] are complete lines from pos, about `want` bytes of them.

        end == 0 when only a half-written line remains. Reads past `want` only to finish a
        line longer than the budget or the chunk. buf is None when the line at pos is longer
        than MAX_LINE_BYTES: it was not read, end is its length (newline included).
        """
        if self.tail[0] == pos < self.tail[1] <= self.size:
            return self._long_line(pos, self.tail[1])  # searched before: only new bytes are read
        n = max(1, min(want, self.size - pos, CHUNK_BYTES))
        self.f.seek(pos)
        if n == len(self.buf):
            got = self.f.readinto(self.buf)
            buf = self.buf if got == n else bytes(self.buf[:got])  # shrank while we read
        else:
            buf = self.f.read(n)
        end = buf.rfind(b"\n") + 1
        if end or pos + len(buf) >= self.size:
            if not end:
                self.tail[:] = [pos, pos + len(buf)]
            return buf, end
        return self._long_line(pos, pos + len(buf))

    def _long_line(self, pos, search_from):
        """The line at pos, whose newline lies at or after search_from: found first, then read
        whole only when it is within MAX_LINE_BYTES, so memory stays bounded."""
        nl = self._find_newline(pos, search_from)
        if nl < 0:
            return b"", 0
        length = nl + 1 - pos
        if length > MAX_LINE_BYTES:
            return None, length
        self.f.seek(pos)
        line = self.f.read(length)
        if len(line) != length or not line.endswith(b"\n"):
            return b"", 0  # rewritten under us: the next poll reads it again
        return line, length

    def _find_newline(self, pos, at):
        """Offset of the first newline from `at` up to the size, or -1 (then TAILS remembers how
        far it looked: the next call resumes there, so no byte is searched twice)."""
        first = True
        while at < self.size:
            if not first and self.deadline is not None and time.monotonic() >= self.deadline:
                self.cut_short = True  # a slow disk: the rest waits for the next poll
                break
            first = False
            self.f.seek(at)
            more = self.f.read(min(CHUNK_BYTES, self.size - at))
            if not more:
                break
            k = more.find(b"\n")
            if k >= 0:
                return at + k
            at += len(more)
        self.tail[:] = [pos, at]
        return -1


def parse_overrides(paths):
    paths = paths or {}
    fr, ct = paths.get("finish_reason_path"), paths.get("completion_tokens_path")
    return (parse_path(fr) if fr else None, parse_path(ct) if ct else None)


def empty_entry(inode, offset, error=None):
    """A per-file entry that has counted nothing yet (scan_file fills it in; the agent sends one
    with `error` set for a file it does not count)."""
    return {
        "inode": inode,
        "size": None,
        "offset_from": offset or 0,
        "offset": offset or 0,
        "reset": False,
        "lines": 0,
        "malformed": 0,
        "blank_lines": 0,
        "tokens": 0,
        "counts": [],
        "error": error,
        "problem": None,
        "pending_bytes": 0,
        "tail": None,  # [offset, up to]: no newline in between (the line at offset is unfinished)
    }


def scan_file(path, inode, offset, budget_bytes, paths=None, line_index=None, deadline=None, search_deadline=None):
    """Count the complete lines of one shard from (inode, offset), about budget_bytes of them.

    Args:
        path: shard path (a literal string; never passed to a shell).
        inode: inode the caller last saw, or None for a shard not scanned before.
        offset: byte offset just after the last line the caller counted (0 if new).
        budget_bytes: bytes to scan at most in this call (a longer single line is still read).
        paths: optional {"finish_reason_path": "a.b.0", "completion_tokens_path": ...,
            "prompt_id_path", "prompt_tokens_path", "group_path"} (fields.FieldSpec).
        line_index: optional callable (path, inode) -> [array('Q') of line starts, indexed_to];
            the starts of the lines counted here are appended when they continue that index
            (the agent's sampling op reuses it). None keeps no index.
        deadline: optional time.monotonic() value: no new read starts after it, and reads are
            sized to the speed measured so far, so a slow disk or CPU returns partial work
            (with pending_bytes) instead of outliving the caller's timeout.
        search_deadline: when the search for the newline of an unfinished line stops (after
            one read at least; the next call resumes it where it stopped). None: `deadline`.

    Returns:
        The per-file entry of the poll reply (design.md section 1) plus "pending_bytes".
    """
    entry = empty_entry(inode, offset)
    try:
        with open(path, "rb", buffering=0) as f:
            _scan_open_file(
                f, path, entry, budget_bytes, parse_overrides(paths), line_index, (deadline, search_deadline), paths
            )
    except (OSError, ValueError) as exc:
        entry["error"] = "%s: %s" % (type(exc).__name__, exc)
    return entry


def _timed_want(want, done, t0, deadline):
    """Bytes to read next so the scan ends near `deadline` (half the time left at the speed seen)."""
    now = time.monotonic()
    if done == 0 or now <= t0:
        return min(want, FIRST_TIMED_STEP)
    return min(want, max(64 << 10, int(done / (now - t0) * (deadline - now) / 2)))


def _scan_open_file(f, path, entry, budget_bytes, overrides, line_index, deadlines=(None, None), paths=None):
    st = os.fstat(f.fileno())
    start, size = entry["offset"], st.st_size
    if (entry["inode"] is not None and st.st_ino != entry["inode"]) or size < start:
        start, entry["reset"] = 0, True  # rotated or truncated: the caller drops old counts
    entry.update(inode=st.st_ino, size=size, offset_from=start, offset=start)
    idx = line_index(path, st.st_ino) if line_index else [None, -1]  # type: list  # -1: never contiguous
    if start == 0 and idx[1] > 0:
        idx[0], idx[1] = array.array("Q"), 0
    tally, stop, tail = _Tally(), start + max(0, int(budget_bytes)), TAILS.get(path, st.st_ino)
    tmpl_state, ft = _field_state(path, st.st_ino, paths)
    if entry["reset"]:
        tail[:] = [-1, -1]  # truncated: what was searched before is gone
    deadline, search_deadline = deadlines
    reader = Reader(f, size, min(size, stop) - start, tail, deadline if search_deadline is None else search_deadline)
    pos, timed_out, skipped = _scan_range(reader, start, stop, deadline, tally, tmpl_state, overrides, idx, ft)
    LINE_STATS["template"] += sum(tally.fast.values())
    LINE_STATS["json"] += tally.lines - sum(tally.fast.values())
    rows = tally.rows()
    entry.update(
        offset=pos,
        lines=tally.lines - tally.failed_lines,
        malformed=tally.malformed,
        blank_lines=tally.blank,
        counts=rows,
        tokens=sum(r[0] * r[3] for r in rows),
        pending_bytes=size - pos if (pos >= stop or timed_out) and pos < size else 0,
        tail=list(reader.tail) if reader.tail[0] == pos else None,  # agent.py keeps it, pops it
    )
    entry["problem"] = _problem(skipped, pos, entry["tail"])
    if tally.failed:  # wire.ShardEntry: failed requests by reason, and their prompt IDs
        entry["failed"] = formats.bound_reasons(tally.failed)
    failed_ids = ft.failed_ids()
    if failed_ids:
        entry["failed_ids"] = failed_ids
    found = ft.entry()
    if found is not None:  # only a shard with per-line fields carries them (wire.ShardEntry)
        entry["fields"] = found


def _field_state(path, inode, paths):
    """The shard's template memory and a fields.Tally for this scan; per-line fields are on from
    the start when a path is configured, and templates learned under other paths are dropped."""
    if formats.set_cut_labels((paths or {}).get("cut_labels")):
        TEMPLATES.entries.clear()  # their lines were read under the old label maps
    tmpl_state = TEMPLATES.get(path, inode)
    spec = fields.FieldSpec(paths)
    fields.hole_spans = hole_spans  # the template walk is this module's
    if tmpl_state[3] is not None and tmpl_state[3] != spec.key():
        tmpl_state[:] = [[], [], MAX_TEMPLATE_BUILDS, None, 0]  # the configured paths changed
    if spec.configured and tmpl_state[3] is None:
        del tmpl_state[0][:], tmpl_state[1][:]
        tmpl_state[3] = spec.key()
    return tmpl_state, fields.Tally(spec, tmpl_state[0])


def _scan_range(reader, start, stop, deadline, tally, tmpl_state, overrides, idx, ft):
    """Count lines from start to about stop: (offset reached, timed out, [(offset, length)]
    of lines skipped as longer than MAX_LINE_BYTES)."""
    pos, size, skipped = start, reader.size, []
    t0, timed_out = time.monotonic(), False
    while pos < size and pos < stop:
        if deadline is not None and time.monotonic() >= deadline:
            timed_out = True
            break
        want = stop - pos if deadline is None else _timed_want(stop - pos, pos - start, t0, deadline)
        buf, end = reader.lines(pos, want)
        starts = idx[0] if idx[1] == pos else None  # extend the index only when contiguous
        if buf is None:  # too long to hold: one malformed line, skipped unread
            tally.lines, tally.malformed = tally.lines + 1, tally.malformed + 1
            skipped.append((pos, end))
            if starts is not None:
                starts.append(pos)
        elif end == 0:
            timed_out = reader.cut_short  # else a half-written last line stays for the next poll
            break
        else:
            _scan_chunk(buf, end, tally, tmpl_state, overrides, starts, pos, ft)
        pos += end
        if starts is not None:
            idx[1] = pos
    return pos, timed_out, skipped


def _problem(skipped, pos, tail):
    """What the screen says about a shard that still counts: lines skipped as too long, or an
    unterminated line at pos known (tail) to run past MAX_LINE_BYTES (not counted yet)."""
    if skipped:
        at, length = skipped[-1]
        text = (
            "skipped %d line(s) longer than the %d-byte line bound as malformed (the last: %d bytes at byte offset %d)"
        )
        return text % (len(skipped), MAX_LINE_BYTES, length, at)
    if tail is not None and tail[1] - pos > MAX_LINE_BYTES:
        text = "unterminated line: %d bytes from byte offset %d have no newline (more than the %d-byte line bound)"
        return text % (tail[1] - pos, pos, MAX_LINE_BYTES)
    return None
