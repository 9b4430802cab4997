"""runhealth node agent, per-line fields: prompt IDs, prompt tokens, groups and unanswered cuts (#33).

Part of the node agent (runhealth/node/, shipped with agent.py): standard library only, Python
3.8-compatible syntax, read-only. scan.py counts (tokens, finish_reason) per line; this module
holds what a line can say beyond that, with one reference rule per figure (the json.loads
path) that the templates reproduce exactly:

- prompt ID: the configured dotted path, else the first of formats.ID_FIELDS holding a usable ID (a
  non-empty string or an integer). Sent as 64-bit BLAKE2b hashes of the ID's UTF-8 bytes
  (quoted, as the JSON token; an integer as its decimal digits), 8 bytes a line, base64 in the reply. The hash is two
  CRC-32s, of the ID's bytes and of them reversed (id_hash): C-level and 3x cheaper than a
  BLAKE2b per line (measured: 0.25 vs 0.8 us), which keeps the scan within its speed budget.
  It is linear, not cryptographic: two IDs of equal length that differ only within 4
  consecutive bytes never collide (CRC-32 detects every burst up to 32 bits); for unrelated
  IDs a pair collides with probability about 2^-64, so among 10M distinct IDs the chance that
  any pair shares a hash is about n^2 / 2^65 = 2.7e-6 (birthday bound): exact in practice.
- prompt tokens: the configured path, else the first of formats.PROMPT_TOKEN_FIELDS (every
  format's prompt-token field, node/formats.py) holding a count.
- group: the configured path's value (a string, an integer, or "(none)"), else, where prompt
  tokens are known, the prompt-token bin (powers of two); at most MAX_GROUPS a scan, the rest
  are counted under OTHER. Per group: lines, `length` stops, and those stops by token count
  (few distinct values: most sit at the ceiling), so the dashboard counts a group's cuts with
  the headline's rule (at the ceiling) and its context-window stops apart (#41).
- answered or not (only for `length` stops): no answer when the answer text (the first string
  among the format's answer paths: a message's `content`, a text block, ...) is empty beside a
  non-empty reasoning text (the format's: `reasoning_content`, a thinking block, a thought
  part, ...), or holds a `<think>` with no `</think>` after it.

A shard's fields are "on" once a configured path is set or a parsed line holds any of these;
until then the scan does no per-line work for them (scan.py keeps the switch per shard).
Memory: a scan holds 8 bytes per counted line for the hashes plus small dicts; nothing
is kept between polls.
"""

from __future__ import annotations

import array
import base64
import json
import operator
import re
import sys
import zlib
from typing import Any

if __package__:  # imported as runhealth.node.fields; shipped or run as a script, agent.py sets it
    from . import formats
else:
    formats = None  # type: ignore[assignment]
MAX_GROUPS = 256  # distinct groups one scan counts apart; the store keeps fewer (its own cap)
MAX_LABEL_CHARS = 120
OTHER = "(other)"
NO_GROUP = "(none)"
MAX_COUNT = 1 << 40  # as scan.MAX_COUNT
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# Templates capture these as raw tokens; a string with an escape, a float, or a container takes
# json.loads. A string's token keeps its quotes; "-0" is no integer here (json.loads reads 0).
# json.loads refuses an integer of more digits than sys.get_int_max_str_digits() (4,300 by default:
# Python 3.11+, and 3.8.14+ / 3.9.14+ / 3.10.7+), and the line is malformed; a template refuses it
# too (MORE_DIGITS bounds every integer it matches; as scan.MORE_DIGITS), so such a line takes json.loads.
INT_MAX_DIGITS = getattr(sys, "get_int_max_str_digits", int)()  # 0: no limit (int() is 0: before the limit)
MORE_DIGITS = b"[0-9]{0,%d}" % (INT_MAX_DIGITS - 1) if INT_MAX_DIGITS > 0 else b"[0-9]*"
_SCALAR_RX = rb'(?P<%s>"[^"\\\x00-\x1f]*"|0|-?[1-9]' + MORE_DIGITS + b"|null|true|false)"
_PT_RX = b"(?:(?P<%s>0|[1-9]" + MORE_DIGITS + rb')|null|true|false|"[^"\\\x00-\x1f]*")'
_P = b"+" if sys.version_info >= (3, 11) else b""  # possessive (3.11+), as scan._P
# A strict template (scan._Builder.compile) captures only the kind of token its line held there
# ("s" a string, "i" an integer, "l" null/true/false), in fewer regex steps; a line with
# another kind takes the tolerant template, which captures as above.
_SCALAR_STRICT = {  # "s": a non-empty string, so a strict hit's ID token is always an ID
    "s": rb'(?P<%s>"[^"\\\x00-\x1f]+' + _P + b'")',
    "i": b"(?P<%s>0|-?[1-9]" + MORE_DIGITS + _P + b")",
    "l": b"(?P<%s>null|true|false)",
}
_PT_STRICT = {"i": b"(?P<%s>0|[1-9]" + MORE_DIGITS + _P + b")"}
MAX_PT_VALUES = 1 << 16  # distinct prompt-token counts kept raw before they are folded into bins
NOT_ID = frozenset(b"ntf")  # a token starting so is null, true or false
_REVERSED = operator.itemgetter(slice(None, None, -1))
crc32 = _crc32 = zlib.crc32
_TEXT_SCALAR = {  # a non-string text value: only its own kind (a string there is a hole)
    "n": b"-?(?:0|[1-9]" + MORE_DIGITS + rb")(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?",
    "l": rb"(?:true|false|null)",
}
_ESCAPED_ASCII = re.compile(rb"\\u00[0-7]|\\/")  # an escape that could spell part of a tag


def dotted(path):
    return ".".join(str(p) for p in path)


def _parse(dotted_path):
    return tuple(int(p) if p.lstrip("-").isdigit() else p for p in dotted_path.split("."))


class FieldSpec:
    """The configured paths (`prompt_id_path`, `prompt_tokens_path`, `group_path` of a poll
    request), parsed; the candidates each field is looked for in."""

    def __init__(self, paths=None):
        paths = paths or {}
        get = paths.get
        self.id_paths = (_parse(get("prompt_id_path")),) if get("prompt_id_path") else formats.ID_FIELDS
        self.pt_paths = (
            (_parse(get("prompt_tokens_path")),) if get("prompt_tokens_path") else formats.PROMPT_TOKEN_FIELDS
        )
        self.group_path = _parse(get("group_path")) if get("group_path") else None
        self.configured = bool(get("prompt_id_path") or get("prompt_tokens_path") or get("group_path"))

    def key(self):
        return (self.id_paths, self.pt_paths, self.group_path)


def id_bytes(value):
    """The bytes an ID is hashed from, or None when `value` is no usable ID."""
    if isinstance(value, str):  # as its JSON token without escapes: quoted, so "7" is not 7
        if not value:
            return None
        try:
            return b'"' + value.encode("utf-8", "surrogateescape") + b'"'  # an invalid byte kept as it was
        except UnicodeEncodeError:
            return b'"' + value.encode("utf-8", "surrogatepass") + b'"'  # a "\\ud800" escape
    if type(value) is int:
        return str(value).encode("ascii")
    return None


def _valid_count(v):
    return type(v) is int and 0 <= v <= MAX_COUNT


def _label(value):
    """A group value as its label (bounded, valid UTF-8)."""
    if value is None:
        return NO_GROUP
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value if isinstance(value, str) else str(value) if type(value) is int else json.dumps(value, sort_keys=True)
    text = text[:MAX_LABEL_CHARS]
    return text if text.isascii() else _SURROGATE_RE.sub("\ufffd", text)


def bin_label(k):
    """The label of prompt-token bin k (tokens whose bit length is k): "512-1023 prompt tokens"."""
    if k == 0:
        return "0 prompt tokens"
    return "%d-%d prompt tokens" % (1 << (k - 1), (1 << k) - 1)


def _text_candidates(loc):
    """(answer paths, reasoning paths) of scan.locate's formats.Located, in the order they are tried."""
    return list(loc.answer), list(loc.reasoning)


def answer_state(obj, texts):
    """(no_answer, reasoned) of a `length` stop, the reference rule (module docstring)."""
    ans_paths, rsn_paths = _text_candidates(texts)
    ans = next((v for v in (formats.get_at(obj, p) for p in ans_paths) if isinstance(v, str)), "")
    rsn = next((v for v in (formats.get_at(obj, p) for p in rsn_paths) if isinstance(v, str)), "")
    i = ans.find("<think>")
    open_think = i >= 0 and ans.find("</think>", i) < 0
    return (bool(rsn) and not ans) or open_think, bool(rsn) or i >= 0


def line_values(obj, spec):
    """(ID candidate index or -1, ID bytes or None, prompt tokens or None, group value present, group key)."""
    idx, idb = -1, None
    for i, p in enumerate(spec.id_paths):
        idb = id_bytes(formats.get_at(obj, p))
        if idb is not None:
            idx = i
            break
    pt = None
    for p in spec.pt_paths:
        v = formats.get_at(obj, p)
        if _valid_count(v):
            pt = v
            break
    if spec.group_path is not None:
        return idx, idb, pt, _label(formats.get_at(obj, spec.group_path))
    return idx, idb, pt, None if pt is None else pt.bit_length()


def has_fields(obj, spec, texts):
    """Whether this parsed line turns the shard's fields on."""
    if spec.configured:
        return True
    idx, _, pt, _ = line_values(obj, spec)
    return idx >= 0 or pt is not None or answer_state(obj, texts)[1]


def id_hash(idb):
    """The 64-bit hash of an ID's bytes (module docstring): CRC-32 of them, then of them reversed."""
    return _crc32(idb) << 32 | _crc32(idb[::-1])


def _capture(tolerant, strict, name):
    """(tolerant pattern, {token kind: strict pattern}) of one captured field, its group `name`."""
    return tolerant % name, {kind: rx % name for kind, rx in strict.items()}


class TemplateFields:
    """How a template (scan._Builder) captures the fields: `captures` maps a path to its
    capture patterns (_capture; None: an answer or reasoning text, whose hole is remembered). After the
    template is compiled, `bind(plan)` notes where each capture lands among the plan's
    field-capturing segments, so a hit reads each field with one group() call."""

    def __init__(self, spec, texts):
        self.spec = spec
        caps = {}  # type: dict
        for i, p in enumerate(spec.id_paths):
            caps[p] = _capture(_SCALAR_RX, _SCALAR_STRICT, b"xi%d" % i)
        for i, p in enumerate(spec.pt_paths):
            caps.setdefault(p, _capture(_PT_RX, _PT_STRICT, b"xp%d" % i))
        if spec.group_path is not None:
            caps.setdefault(spec.group_path, _capture(_SCALAR_RX, _SCALAR_STRICT, b"xg"))
        self.ans_paths, self.rsn_paths = _text_candidates(texts)
        for p in self.ans_paths + self.rsn_paths:
            caps.setdefault(p, None)
        self.captures = caps
        self.ans_hole = self.rsn_hole = None
        self.id_get = self.pt_get = ()  # type: tuple  # ((segment among the field-capturing ones, group number), ...)
        self.plain, self.id1, self.pt1 = False, None, None  # bind() sets them
        # where the lines an inline walk counts (scan._walk sets it) hold their ID: the reply's
        # id_fields; every other path names the field its line's ID came from (id_paths)
        self.id_seen = ()
        self.id_got = self.id_names = ()  # the ID candidates this template captures, in the order tried (dotted)
        self.grp_get = None
        self.no_group = False  # a group is configured and this template's lines have none

    def with_holes(self, hole_paths):
        """Note which hole (its index among the template's holes) holds the answer and the
        reasoning text: the first candidate that is a string in the template's line."""
        pos = {p: i for i, p in enumerate(hole_paths)}
        self.ans_hole = next((pos[p] for p in self.ans_paths if p in pos), None)
        self.rsn_hole = next((pos[p] for p in self.rsn_paths if p in pos), None)
        return self

    def bind(self, plan):
        """A copy for `plan` (its segments: (match, groups, ...)) with the group getters set."""
        out = TemplateFields.__new__(TemplateFields)
        out.__dict__.update(self.__dict__)
        where = {}  # group name -> (which field-capturing segment, its group number there)
        k = 0
        for seg in plan:
            if seg[1] & 4:
                for name, number in seg[0].__self__.groupindex.items():
                    where[name] = (k, number)
                k += 1
        ids = [i for i in range(len(self.spec.id_paths)) if "xi%d" % i in where]
        out.id_get = tuple(where["xi%d" % i] for i in ids)
        out.id_got = tuple(self.spec.id_paths[i] for i in ids)  # the ID candidates captured, as id_get
        out.id_names = tuple(dotted(self.spec.id_paths[i]) for i in ids)
        out.pt_get = tuple(where[n] for n in ("xp%d" % i for i in range(len(self.spec.pt_paths))) if n in where)
        out.grp_get = where.get("xg")
        out.no_group = self.spec.group_path is not None and out.grp_get is None
        # the scan's inline path: one ID capture at most, one prompt-token capture at most, no group
        out.plain = len(out.id_get) <= 1 and len(out.pt_get) <= 1 and self.spec.group_path is None
        out.id1 = out.id_get[0] if out.id_get else None
        out.pt1 = out.pt_get[0] if out.pt_get else None
        return out


def text_scalar(kind):
    return _TEXT_SCALAR["n" if kind == "n" else "l"]


def _open_think(buf, s, e):
    """Whether the JSON string body buf[s:e] holds a <think> with no </think> after it."""
    if _ESCAPED_ASCII.search(buf, s, e) is not None:  # rare: decode, then the reference rule
        try:
            text = json.loads(b'"' + bytes(buf[s:e]) + b'"')
        except ValueError:
            text = bytes(buf[s:e]).decode("utf-8", "replace")
        i = text.find("<think>")
        return i >= 0 and text.find("</think>", i) < 0, i >= 0
    i = buf.find(b"<think>", s, e)
    return i >= 0 and buf.find(b"</think>", i, e) < 0, i >= 0


def _token_label(tok):
    """A group's raw JSON token (a template capture) as its label, as _label gives for the value."""
    if tok[0] == 34:  # a string, quotes included
        return _label(tok[1:-1].decode("utf-8", "surrogateescape"))
    return NO_GROUP if tok == b"null" else tok.decode("ascii")


class Tally:
    """The fields of one scan's lines (scan.py feeds it line by line; entry() is the reply part).

    Template hits are counted by raw bytes (a prompt-token count, a group's token) and turned
    into values once per distinct value in entry(), as scan._Tally does with its keys."""

    def __init__(self, spec, plans=()):
        self.spec = spec
        self.plans = plans  # the shard's templates (their ID fields are reported as seen)
        self.ids_hi, self.ids_lo = array.array("I"), array.array("I")  # id_hash per line with an ID, its halves
        self.raw_ids = []  # ID bytes of lines with an ID (template lines: their tokens), not hashed yet
        self.failed_raw = []  # ID bytes of failed requests (scan.py counts them apart)
        self.id_paths = set()  # dotted ID paths lines held their ID at (but those of inline walks: id_seen)
        self.pt_lines = 0
        self.groups = {}  # label or prompt-token bin -> [lines, length stops, {tokens: length stops}]
        self.raw_groups = {}  # (group token, token-count bytes of a `length` stop, else None) -> lines
        self.raw_pt = {}  # (prompt-token digits, finish_reason bytes) -> lines (template lines)
        self.raw_pt_stop = {}  # prompt-token digits -> lines (template lines not at length: scan's inline path)
        self.length_pt = {}  # (tokens, prompt tokens) -> length stops
        self.no_answer, self.reasoned = {}, {}  # tokens -> length stops

    def _group(self, grp, ct=None):
        """One line of group `grp`; `ct`: its token count when it stopped by `length`, else None."""
        g = self.groups.get(grp)
        if g is None:
            if len(self.groups) >= MAX_GROUPS:
                grp = OTHER
            g = self.groups.setdefault(grp, [0, 0, {}])
        g[0] += 1
        if ct is not None:
            g[1] += 1
            g[2][ct] = g[2].get(ct, 0) + 1

    def answer(self, ct, no_answer, reasoned):
        if reasoned:
            self.reasoned[ct] = self.reasoned.get(ct, 0) + 1
        if no_answer:
            self.no_answer[ct] = self.no_answer.get(ct, 0) + 1

    def json_line(self, obj, texts, ct, fr):
        """A line json.loads parsed (the reference rule)."""
        is_length = fr == "length"
        idx, idb, pt, grp = line_values(obj, self.spec)
        if idb is not None:
            self.raw_ids.append(idb)  # hashed with the template lines' IDs, in line order
            self.id_paths.add(dotted(self.spec.id_paths[idx]))
        if pt is not None:
            self.pt_lines += 1
            if is_length:
                self.length_pt[(ct, pt)] = self.length_pt.get((ct, pt), 0) + 1
        if grp is not None:
            self._group(grp, ct if is_length else None)
        if is_length:
            self.answer(ct, *answer_state(obj, texts))

    def template_line(self, tf, ct, fr, ex, plan, buf, pos, end):
        """A line a template matched: ct and fr its raw bytes, `ex` the matches that captured
        fields, `tf` the template's TemplateFields. The hot path: raw bytes are counted, and
        turned into values once per distinct value (entry())."""
        pt = None
        if ex:
            for j, (k, g) in enumerate(tf.id_get):
                v = ex[k][g]
                if len(v) > 2 if v[0] == 34 else v[0] not in NOT_ID:  # a non-empty string, an integer
                    self.raw_ids.append(v)
                    self.id_paths.add(tf.id_names[j])  # a tolerant plan's may not be its strict twin's
                    break
            for k, g in tf.pt_get:
                pt = ex[k][g]
                if pt is not None:
                    key = (pt, fr)
                    self.raw_pt[key] = self.raw_pt.get(key, 0) + 1
                    break
            if tf.grp_get is not None:
                # a `length` stop keeps its token count (the group's cuts are those at the ceiling, #41)
                key = (ex[tf.grp_get[0]][tf.grp_get[1]], ct if fr == b"length" else None)
                raw = self.raw_groups
                if key not in raw and len(raw) >= 4 * MAX_GROUPS:
                    self._fold_raw_groups()  # many distinct (token, length) keys: labels now, not (other)
                    raw = self.raw_groups
                raw[key] = raw.get(key, 0) + 1
        if tf.no_group:  # a configured group this template's lines do not have
            self._group(NO_GROUP, int(ct) if fr == b"length" else None)
        if fr == b"length":
            self._length_line(tf, int(ct), pt, plan, buf, pos, end)

    def plain_line(self, tf, ct, fr, idt, pt, plan, buf, pos, end, ans_rsn=None):
        """template_line for a line scan.py's inline walk matched: its ID token `idt` and
        prompt-token digits `pt` (None: not captured), and the (start, end) of its answer and
        reasoning text (`ans_rsn`, as _length_line takes them), read by the walk."""
        if idt is not None and (len(idt) > 2 if idt[0] == 34 else idt[0] not in NOT_ID):
            self.raw_ids.append(idt)
        if pt is not None:
            key = (pt, fr)
            self.raw_pt[key] = self.raw_pt.get(key, 0) + 1
        if fr == b"length":
            self._length_line(tf, int(ct), pt, plan, buf, pos, end, ans_rsn)

    def _length_line(self, tf, ct, pt, plan, buf, pos, end, ans_rsn=None):
        """A `length` stop on the template path: its prompt tokens, and whether it answered.
        `ans_rsn`: (answer, reasoning) text spans, (start, end) or None where the template has
        no such hole; None: found by walking the line again (hole_spans)."""
        if pt is not None and int(pt) <= MAX_COUNT:  # else no count (json.loads' rule: _valid_count)
            k2 = (ct, int(pt))
            self.length_pt[k2] = self.length_pt.get(k2, 0) + 1
        if ans_rsn is None:
            spans = hole_spans(plan, buf, pos, end)
            ans = spans[tf.ans_hole] if tf.ans_hole is not None else None
            rsn = spans[tf.rsn_hole] if tf.rsn_hole is not None else None
        else:
            ans, rsn = ans_rsn
        open_think, think = _open_think(buf, ans[0], ans[1]) if ans is not None else (False, False)
        reasoned = rsn is not None and rsn[1] > rsn[0]
        empty = ans is None or ans[1] == ans[0]
        self.answer(ct, (reasoned and empty) or open_think, reasoned or think)

    def hash_ids(self):
        """The IDs collected hashed (id_hash), in bulk: C-level maps, no Python frame per ID,
        each half kept apart (32-bit values, no big integers) until ids() joins them. Every
        path that collects an ID checks that it is one (a template's null, true, false or ""
        is not), so none is dropped here."""
        raw = self.raw_ids
        if raw:
            self.ids_hi.extend(map(_crc32, raw))
            self.ids_lo.extend(map(_crc32, map(_REVERSED, raw)))
            self.raw_ids = []

    def ids(self):
        """The 64-bit hashes, little-endian, 8 bytes an ID (the wire's `ids` before base64)."""
        out = array.array("I", bytes(8 * len(self.ids_hi)))
        out[0::2], out[1::2] = self.ids_lo, self.ids_hi  # a little-endian uint64 is its low half first
        if sys.byteorder == "big":
            out.byteswap()
        return out.tobytes()

    def failed_ids(self):
        """The failed requests' prompt-ID hashes as the wire's `failed_ids` (as `ids`), or ""."""
        if not self.failed_raw:
            return ""
        out = array.array("Q", (id_hash(b) for b in self.failed_raw))
        if sys.byteorder == "big":
            out.byteswap()
        return base64.b64encode(out.tobytes()).decode("ascii")

    def bound_memory(self):
        """After each chunk: many distinct prompt-token counts are folded into bins, and the
        IDs collected are hashed."""
        if self.raw_ids:
            self.hash_ids()
        if len(self.raw_pt) + len(self.raw_pt_stop) > MAX_PT_VALUES:
            self._fold_pt()

    def _fold_pt(self):
        """Raw prompt-token counts into lines and bins (the bins only when no group is configured)."""
        raw = dict(self.raw_pt)
        raw.update(((pt, b"stop"), n + raw.get((pt, b"stop"), 0)) for pt, n in self.raw_pt_stop.items())
        self.raw_pt.clear()
        self.raw_pt_stop.clear()  # the same dicts: the scan loop holds them
        bins = self.spec.group_path is None
        for (pt, fr), n in raw.items():
            if len(pt) >= 13 and int(pt) > MAX_COUNT:
                continue  # no count (json.loads' rule: valid_count)
            self.pt_lines += n
            if bins:  # the `length` stops' token counts per bin: from length_pt, in entry()
                g = self.groups.setdefault(int(pt).bit_length(), [0, 0, {}])
                g[0] += n
                if fr == b"length":
                    g[1] += n

    def _fold_raw_groups(self):
        """The template lines' raw group tokens turned into labels (once per distinct key)."""
        raw, self.raw_groups = self.raw_groups, {}
        for (tok, ct), n in raw.items():
            label = _token_label(tok)
            g = self.groups.get(label)
            if g is None:
                g = self.groups.setdefault(OTHER if len(self.groups) >= MAX_GROUPS else label, [0, 0, {}])
            g[0] += n
            if ct is not None:
                g[1] += n
                t = int(ct)
                g[2][t] = g[2].get(t, 0) + n

    def _fold_groups(self):
        self._fold_pt()
        self._fold_raw_groups()
        if self.spec.group_path is None:
            # prompt-token bins: each `length` stop with prompt tokens is in length_pt, once (the
            # same validity rule as the bins'), so the bins' token counts are read from it
            for g in self.groups.values():
                g[2] = {}
            for (t, p), n in self.length_pt.items():
                g = self.groups.get(p.bit_length())
                if g is not None:  # always (both count the same lines); never a KeyError in a scan
                    g[2][t] = g[2].get(t, 0) + n

    def entry(self):
        """The reply's "fields" part for this scan, or None when no line had any."""
        self.hash_ids()
        self._fold_groups()
        if not (self.ids_hi or self.pt_lines or self.groups or self.reasoned or self.no_answer):
            return None
        spec = self.spec
        gp = spec.group_path
        return {
            "ids": base64.b64encode(self.ids()).decode("ascii"),
            "id_lines": len(self.ids_hi),
            "id_fields": sorted(self.id_paths.union(*(p.fields.id_seen for p in self.plans if p.fields))),
            "prompt_token_lines": self.pt_lines,
            "group_field": dotted(gp) if gp is not None else ("prompt_tokens" if self.groups else None),
            "groups": sorted(
                [k if gp is not None else bin_label(k), n, c, sorted([t, m] for t, m in by.items())]
                for k, (n, c, by) in self.groups.items()
            ),
            "length_prompt_tokens": sorted([t, p, n] for (t, p), n in self.length_pt.items()),
            "no_answer": sorted([t, n] for t, n in self.no_answer.items()),
            "reasoned": sorted([t, n] for t, n in self.reasoned.items()),
        }


hole_spans: Any = None  # scan.hole_spans, set by scan.py (it owns the template walk)


def merge(a, b):
    """Two "fields" parts of consecutive scans of one shard as one (parallel backfill pieces)."""
    if not a or not b:
        return a or b
    out = dict(a)
    out["ids"] = base64.b64encode(base64.b64decode(a["ids"]) + base64.b64decode(b["ids"])).decode("ascii")
    for k in ("id_lines", "prompt_token_lines"):
        out[k] = a[k] + b[k]
    out["id_fields"] = sorted(set(a["id_fields"]) | set(b["id_fields"]))
    out["group_field"] = a["group_field"] or b["group_field"]
    for k, width in (("length_prompt_tokens", 2), ("no_answer", 1), ("reasoned", 1)):
        acc = {}  # type: dict
        for row in a[k] + b[k]:
            key = tuple(row[:width])
            acc[key] = acc.get(key, 0) + row[width]
        out[k] = sorted(list(key) + [n] for key, n in acc.items())
    groups = {}  # type: dict
    for label, n, c, by in a["groups"] + b["groups"]:
        g = groups.setdefault(label, [0, 0, {}])
        g[0] += n
        g[1] += c
        for t, m in by:
            g[2][t] = g[2].get(t, 0) + m
    out["groups"] = sorted([label, n, c, sorted([t, m] for t, m in by.items())] for label, (n, c, by) in groups.items())
    return out
