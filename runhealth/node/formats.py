"""runhealth node agent, output formats as data: where each published format keeps its figures.

Part of the node agent (runhealth/node/, shipped with agent.py): standard library only, Python
3.8-compatible syntax. One small declarative entry per format (STYLE.md "Output formats as
data"): an envelope (WRAPPERS: a batch API's line around the completion, and how it says a
request failed) and a body (BODIES: the completion itself). Each entry says how a line is
recognised (keys present and their kinds: structure only, so a template, which proves a line's
structure, sees the same format as json.loads), where the finish reason, the token count, the
prompt ID, the prompt tokens and the answer / reasoning text are, which keys a template must
match literally (their values decide the format's reading: `type`, `status`, `status_code`),
and the label map that puts each format's spelling in the product's one vocabulary: "length"
is cut at the token limit, "stop" a natural stop, "content_filter" a filter. scan.locate()
dispatches on these tables; adding a format is one entry here and its fixture.

Conditions are (path, kind): kind PRESENT (the key exists), DICT or LIST (the value is one). A
path step Where(key, value) matches every item of a list that is a dict whose `key` holds
`value` (NOT_TRUE: the key is absent or not true). Failure tests and token counts are named in
the entries' comments; markdown() renders the README's table from these entries.
"""

from __future__ import annotations

from collections import namedtuple

PRESENT, DICT, LIST = "present", "dict", "list"
NOT_TRUE = object()
MAX_FAILED_REASONS = 32  # distinct failure reasons one scan keeps apart; the rest are "other"
MAX_REASON_CHARS = 40

Where = namedtuple("Where", "key value")
# recognise: alternatives, each a tuple of conditions that must all hold
# fails: (path, test, reason paths, default reason): the first test that holds makes the line a
#   failed request, its reason the first string (or integer) at the reason paths, else default
#   ("%s" in it takes the tested value)
Wrapper = namedtuple("Wrapper", "name doc recognise root fails literal")
# finish / tokens: candidate paths, the first whose last key exists in its parent is used (the
# last when none does); count: "value" (an integer) or "len" (the length of a list of token IDs)
Body = namedtuple(
    "Body",
    "name doc recognise finish tokens count answer reasoning prompt_tokens literal labels fails tokens_plus",
    defaults=((), ()),
)

WRAPPERS = (
    Wrapper(
        "openai-batch",
        "https://platform.openai.com/docs/guides/batch",
        (((("custom_id",), PRESENT), (("response",), PRESENT)), ((("response",), DICT), (("response", "body"), DICT))),
        ("response", "body"),
        (
            (("error",), "dict", (("error", "code"), ("error", "type")), "error"),
            (("response",), "null", (), "no_response"),
            (
                ("response", "status_code"),
                "not_200",
                (("response", "body", "error", "code"), ("response", "body", "error", "type")),
                "http_%s",
            ),
        ),
        ("status_code",),
    ),
    Wrapper(
        "anthropic-batch",
        "https://docs.anthropic.com/en/api/retrieving-message-batch-results",
        (((("custom_id",), PRESENT), (("result", "type"), PRESENT)),),
        ("result", "message"),
        (
            (
                ("result", "type"),
                "errored_expired_canceled",
                (("result", "error", "error", "type"), ("result", "error", "type"), ("result", "type")),
                "errored",
            ),
        ),
        ("type",),
    ),
    Wrapper(
        "gemini-batch",
        "https://ai.google.dev/gemini-api/docs/batch-mode",
        (
            ((("response", "candidates"), LIST),),
            ((("key",), PRESENT), (("error",), DICT)),
            ((("request",), DICT), (("status",), PRESENT), (("processed_time",), PRESENT)),
        ),
        ("response",),
        (
            (("error",), "dict", (("error", "status"), ("error", "code")), "error"),
            (("status",), "nonempty_str", (), "status_error"),
        ),
        ("status",),
    ),
)

_MSG = ("choices", 0, "message")
BODIES = (
    Body(
        "openai-chat",
        "https://platform.openai.com/docs/api-reference/chat/object",
        (((_MSG, DICT),),),
        (("choices", 0, "finish_reason"),),
        (("usage", "completion_tokens"),),
        "value",
        (_MSG + ("content",),),
        (_MSG + ("reasoning_content",), _MSG + ("reasoning",)),
        (("usage", "prompt_tokens"),),
        (),
        {},
    ),
    Body(
        "openai-completions",
        "https://platform.openai.com/docs/api-reference/completions/object",
        (((("choices", 0), DICT),),),
        (("choices", 0, "finish_reason"),),
        (("usage", "completion_tokens"),),
        "value",
        (("choices", 0, "text"),),
        (),
        (("usage", "prompt_tokens"),),
        (),
        {},
    ),
    Body(
        "openai-responses",
        "https://platform.openai.com/docs/api-reference/responses/object",
        (((("output",), LIST), (("status",), PRESENT)),),
        (("incomplete_details", "reason"), ("status",)),
        (("usage", "output_tokens"),),
        "value",
        (("output", Where("type", "message"), "content", Where("type", "output_text"), "text"),),
        (
            ("output", Where("type", "reasoning"), "content", Where("type", "reasoning_text"), "text"),
            ("output", Where("type", "reasoning"), "summary", Where("type", "summary_text"), "text"),
        ),
        (("usage", "input_tokens"),),
        ("status", "type"),
        {"max_output_tokens": "length", "completed": "stop", "content_filter": "content_filter"},
        (
            (("error",), "dict", (("error", "code"), ("error", "type")), "failed"),
            (("status",), "failed", (), "failed"),
        ),
    ),
    Body(
        "anthropic-messages",
        "https://docs.anthropic.com/en/api/messages",
        (((("stop_reason",), PRESENT), (("content",), LIST)),),
        (("stop_reason",),),
        (("usage", "output_tokens"),),
        "value",
        (("content", Where("type", "text"), "text"),),
        (("content", Where("type", "thinking"), "thinking"),),
        (("usage", "input_tokens"),),
        ("type",),
        {"max_tokens": "length"},
    ),
    Body(
        "gemini",
        "https://ai.google.dev/api/generate-content#generatecontentresponse",
        (((("candidates", 0), DICT),),),
        (("candidates", 0, "finishReason"),),
        (("usageMetadata", "candidatesTokenCount"),),
        "value",
        (("candidates", 0, "content", "parts", Where("thought", NOT_TRUE), "text"),),
        (("candidates", 0, "content", "parts", Where("thought", True), "text"),),
        (("usageMetadata", "promptTokenCount"),),
        ("thought",),
        {
            "MAX_TOKENS": "length",
            "STOP": "stop",
            "SAFETY": "content_filter",
            "RECITATION": "content_filter",
            "BLOCKLIST": "content_filter",
            "PROHIBITED_CONTENT": "content_filter",
            "SPII": "content_filter",
            "IMAGE_SAFETY": "content_filter",
        },
        (),
        # a thinking model's thoughts count against maxOutputTokens but not candidatesTokenCount
        (("usageMetadata", "thoughtsTokenCount"),),
    ),
    Body(
        "sglang",
        "https://docs.sglang.ai/basic_usage/native_api.html",
        (((("meta_info",), DICT),),),
        (("meta_info", "finish_reason", "type"), ("meta_info", "finish_reason")),
        (("meta_info", "completion_tokens"),),
        "value",
        (("text",),),
        (),
        (("meta_info", "prompt_tokens"),),
        (),
        {},
    ),
    Body(
        "vllm-offline",
        "https://docs.vllm.ai/en/latest/api/vllm/outputs.html",
        (((("outputs", 0), DICT),),),
        (("outputs", 0, "finish_reason"),),
        (("outputs", 0, "token_ids"),),
        "len",
        (("outputs", 0, "text"),),
        (),
        (),
        (),
        {},
    ),
    Body(
        "tgi",
        "https://huggingface.github.io/text-generation-inference/",
        (((("details",), DICT), (("generated_text",), PRESENT)),),
        (("details", "finish_reason"),),
        (("details", "generated_tokens"),),
        "value",
        (("generated_text",),),
        (),
        (),
        (),
        {"eos_token": "stop"},
    ),
    Body(
        "ollama",
        "https://github.com/ollama/ollama/blob/main/docs/api.md",
        (((("done_reason",), PRESENT),), ((("eval_count",), PRESENT),)),
        (("done_reason",),),
        (("eval_count",),),
        "value",
        (("message", "content"), ("response",)),
        (("message", "thinking"), ("thinking",)),
        (("prompt_eval_count",),),
        (),
        {},
    ),
    Body(
        "llama.cpp",
        "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md",
        (((("stop_type",), PRESENT),), ((("tokens_predicted",), PRESENT),)),
        (("stop_type",),),
        (("tokens_predicted",),),
        "value",
        (("content",),),
        (),
        (("tokens_evaluated",),),
        (),
        {"limit": "length", "eos": "stop", "word": "stop"},
    ),
)
TEXT_KEYS = ("text", "completion", "output", "response")  # a flat record's text: the first string
FLAT = Body(
    "flat",
    "(records with finish_reason and completion_tokens at the top)",
    ((),),
    (("finish_reason",),),
    (("usage", "completion_tokens"), ("completion_tokens",)),
    "value",
    tuple((k,) for k in TEXT_KEYS),
    (),
    (("usage", "prompt_tokens"),),
    (),
    {},
)
BASE_LABELS = {b.name: dict(b.labels) for b in BODIES + (FLAT,)}
LABELS = {b.name: dict(b.labels) for b in BODIES + (FLAT,)}  # with the configured cut labels
CUT_LABELS = [()]  # the configured cut_labels the maps hold now


def set_cut_labels(labels):
    """Map the configured `cut_labels` (a run's config) to "length" in every format's label
    map, in place (templates hold the maps); True when they changed (the caller drops learned
    templates, whose lines were read under the old maps)."""
    labels = tuple(sorted(set(str(x) for x in labels or ())))
    if labels == CUT_LABELS[0]:
        return False
    CUT_LABELS[0] = labels
    for name, base in BASE_LABELS.items():
        m = LABELS[name]
        m.clear()
        m.update(base)
        m.update((label, "length") for label in labels)
    return True


Located = namedtuple("Located", "finish tokens answer reasoning body literal labels tokens_plus")


def get_at(obj, path):
    """Follow a key/index path through dicts and lists; None when any step is missing (the node
    modules' one copy: scan.py and fields.py call it as formats.get_at)."""
    for part in path:
        if type(obj) is dict or isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and isinstance(part, int) and -len(obj) <= part < len(obj):
            obj = obj[part]
        else:
            return None
    return obj


def _holds(obj, path, kind):
    if kind == PRESENT:
        parent = get_at(obj, path[:-1]) if len(path) > 1 else obj
        return isinstance(parent, dict) and path[-1] in parent
    v = get_at(obj, path)
    if kind == DICT:
        return isinstance(v, dict)
    return isinstance(v, list)


def _recognised(obj, alternatives):
    # plain loops, no generators: every line json.loads reads is recognised here (a failed
    # request's line, ~2% of some shards, takes this path each time: ~2x faster than any/all)
    for conds in alternatives:
        for path, kind in conds:
            if not _holds(obj, path, kind):
                break
        else:
            return True
    return False


def wrapper_of(obj):
    """The envelope entry of a parsed line, or None."""
    for w in WRAPPERS:
        if _recognised(obj, w.recognise):
            return w
    return None


def _exists(rec, path):
    """Whether the last key of `path` exists in its parent (structure, not value)."""
    parent = get_at(rec, path[:-1])
    return isinstance(parent, dict) and path[-1] in parent


def _first_existing(rec, paths):
    return next((p for p in paths if _exists(rec, p)), paths[-1])


def expand(rec, pattern):
    """The concrete paths of `pattern` in `rec` (WHERE steps over list items) whose last key exists."""
    out = [()]  # type: list
    for step in pattern:
        nxt = []  # type: list
        for p in out:
            v = get_at(rec, p)
            if isinstance(step, Where):
                if isinstance(v, list):
                    for i, item in enumerate(v):
                        if isinstance(item, dict) and _where(item, step):
                            nxt.append(p + (i,))
            elif (isinstance(v, dict) and step in v) or (
                isinstance(v, list) and isinstance(step, int) and -len(v) <= step < len(v)
            ):
                nxt.append(p + (step,))
        out = nxt
    return out


def _where(item, step):
    if step.value is NOT_TRUE:
        return item.get(step.key) is not True
    return step.key in item and item[step.key] == step.value and type(item[step.key]) is type(step.value)


def body_of(rec):
    for b in BODIES:
        if _recognised(rec, b.recognise):
            return b
    return FLAT


def locate(obj):
    """Where one parsed line keeps its figures: a Located (paths from the line's root)."""
    w = wrapper_of(obj)
    root, literal = (), ()
    if w is not None:
        literal = w.literal
        if isinstance(get_at(obj, w.root), dict):
            root = w.root
    rec = get_at(obj, root) if root else obj
    b = body_of(rec)

    def many(patterns):
        return [root + p for pat in patterns for p in expand(rec, pat)]

    return Located(
        root + _first_existing(rec, b.finish),
        root + _first_existing(rec, b.tokens),
        many(b.answer),
        many(b.reasoning),
        b,
        frozenset(literal + b.literal),
        LABELS[b.name],
        next((root + p for p in b.tokens_plus if _exists(rec, p)), None),
    )


def failure(obj):
    """The failure reason of a failed request's line (a short label), or None for a completion."""
    w = wrapper_of(obj)
    if w is not None:
        for path, test, reason_paths, default in w.fails:
            v = get_at(obj, path)
            if _failed(obj, path, test, v):
                return _reason(obj, reason_paths, default, v)
    rec = obj
    if w is not None and isinstance(get_at(obj, w.root), dict):
        rec = get_at(obj, w.root)
    for path, test, reason_paths, default in body_of(rec).fails:
        v = get_at(rec, path)
        if _failed(rec, path, test, v):
            return _reason(rec, reason_paths, default, v)
    return None


def _failed(obj, path, test, v):
    if test == "dict":
        return isinstance(v, dict)
    if test == "null":
        parent = get_at(obj, path[:-1])
        return isinstance(parent, dict) and path[-1] in parent and v is None
    if test == "not_200":
        return v is not None and v != 200
    if test == "errored_expired_canceled":
        return v in ("errored", "expired", "canceled")
    if test == "failed":
        return v == "failed"
    return isinstance(v, str) and v != ""  # nonempty_str


def _reason(obj, paths, default, tested):
    for p in paths:
        v = get_at(obj, p)
        if isinstance(v, str) and v or type(v) is int:
            return clean_reason(str(v))
    return clean_reason(default % (tested,) if "%s" in default else default)


def bound_reasons(counts):
    """{reason: count} as wire rows [[reason, count]], sorted, at most MAX_FAILED_REASONS: past
    the bound the largest are kept and the rest summed under "other" (merged pieces of a scan)."""
    if len(counts) > MAX_FAILED_REASONS:
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        keep = dict(ranked[: MAX_FAILED_REASONS - 1])
        keep["other"] = keep.get("other", 0) + sum(n for r, n in ranked[MAX_FAILED_REASONS - 1 :])
        counts = keep
    return sorted([r, n] for r, n in counts.items())


def clean_reason(text):
    """A failure reason as a short label: printable ASCII kept, others "?", MAX_REASON_CHARS at most."""
    text = "".join(c if " " <= c <= "~" else "?" for c in text)
    return text[:MAX_REASON_CHARS]


def _union(paths):
    out = []
    for p in paths:
        if p not in out:
            out.append(p)
    return tuple(out)


_ROOTS = ((),) + tuple(w.root for w in WRAPPERS)
# The prompt-ID and prompt-token candidates fields.py looks for (in this order), every format's.
ID_FIELDS = (("custom_id",), ("prompt_id",), ("metadata", "id"), ("id",), ("request_id",), ("key",))
PROMPT_TOKEN_FIELDS = _union(r + p for b in BODIES + (FLAT,) for p in b.prompt_tokens for r in _ROOTS)


def _named(path):
    """A path as people write it: `choices[0].finish_reason`, `content[].text`."""
    out = ""
    for p in path:
        if isinstance(p, Where):
            out += "[]"
        elif isinstance(p, int):
            out += "[%d]" % p
        else:
            out += ("." if out else "") + p
    return out


def looked_for(kind):
    """Every field the format entries read the finish reason (kind "finish") or the token count
    ("tokens") from, named for people, the flat format's first: what a "never a silent zero"
    warning names (an envelope's root, `response.body.` and the like, left off)."""
    return _union(_named(p) for b in (FLAT,) + BODIES for p in getattr(b, kind))


# ---------------------------------------------------------------------------- the README's table
_TESTS = {
    "dict": "an object",
    "null": "null",
    "not_200": "not 200",
    "errored_expired_canceled": "`errored`, `expired` or `canceled`",
}
_TESTS.update(failed="`failed`", nonempty_str="a non-empty string")


def _dotted(path):
    return ".".join("[]" if isinstance(p, Where) else str(p) for p in path).replace(".[]", "[]")


def _conds(alternatives):
    if alternatives == ((),):
        return "any other record"
    kinds = {PRESENT: "", DICT: " {}", LIST: " []"}
    return " or ".join(" + ".join("`%s`%s" % (_dotted(p), kinds[k]) for p, k in alt) for alt in alternatives)


def _fails(fails):
    return "; ".join("`%s` %s" % (_dotted(p), _TESTS[t]) for p, t, _r, _d in fails) or "none"


def markdown():
    """The README's table of the formats read without configuration, from the entries above."""
    out = [
        "| format | recognised by | tokens | cut at the limit (read as `length`) | other labels mapped | failed requests |",
        "|---|---|---|---|---|---|",
    ]
    for b in BODIES + (FLAT,):
        tokens = " or ".join("`%s`" % _dotted(p) for p in b.tokens)
        tokens += "".join(" + `%s` (when present)" % _dotted(p) for p in b.tokens_plus)
        cut = sorted(k for k, v in b.labels.items() if v == "length") or ["length"]
        other = ", ".join("`%s` → `%s`" % (k, v) for k, v in sorted(b.labels.items()) if v != "length") or "none"
        cells = [
            "[%s](%s)" % (b.name, b.doc),
            _conds(b.recognise),
            tokens if b.count == "value" else "length of " + tokens,
            ", ".join("`%s`" % c for c in cut),
            other,
            _fails(b.fails),
        ]
        out.append("| " + " | ".join(cells) + " |")
    for w in WRAPPERS:
        cells = ["[%s](%s) (envelope)" % (w.name, w.doc), _conds(w.recognise), "the body's, at `%s`" % _dotted(w.root)]
        cells += ["the body's", "the body's", _fails(w.fails)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
