"""The Prometheus text format (0.0.4) of metric families, byte for byte prometheus_client's.

prometheus_client's `generate_latest` checks and escapes every label name of every sample and
formats each line through a few nested calls: at 512 nodes x 8 GPUs (~58K series) that was
about 60% of a scrape's CPU, a scrape every 15 s about 6% of a core (bench/fleet.py --history).
Our families have a fixed, valid set of metric and label names, so `text` checks each name once
per family, escapes only label values (backslash, newline, quote, as prometheus_client does)
and remembers each label pair and value it has formatted. A family with a name outside the
legacy character set (none of ours) goes through prometheus_client itself, so the output is
always what `generate_latest` gives (tests/test_exposition_text.py compares them).

`wsgi_app` serves it: the text format to every client that accepts it (no Accept header,
`text/plain`, `*/*`: Prometheus's default Accept lists text/plain 0.0.4), prometheus_client's
own app (OpenMetrics, `name[]` filters, other methods) otherwise.
"""

from __future__ import annotations

import gzip
import math
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import generate_latest, make_wsgi_app
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# generate_latest's renaming of types into the text format (suffix added to the name, type shown)
_TYPES = {"counter": ("_total", "counter"), "info": ("_info", "gauge"), "stateset": ("", "gauge")}
_TYPES |= {"gaugehistogram": ("", "histogram"), "unknown": ("", "untyped")}
_OM_ONLY = ("_created", "_gsum", "_gcount")  # OpenMetrics samples: generate_latest moves them to gauges


class _One:
    """One family as a collector, for prometheus_client's formatter."""

    def __init__(self, family: Any):
        self.family = family

    def collect(self) -> list[Any]:
        return [self.family]


def go_float(value: float) -> str:
    """A sample value as Go (and prometheus_client's floatToGoString) writes it."""
    d = float(value)
    if d != d:
        return "NaN"
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _help(name: str, family: Any, kind: str) -> str:
    doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def _plain(family: Any) -> bool:
    """Whether every name in the family is one the fast path writes as it is."""
    if not _NAME.match(family.name):
        return False
    names = {s.name for s in family.samples}
    labels = {k for s in family.samples for k in s.labels}
    return all(_NAME.match(n) for n in names) and all(_LABEL.match(k) for k in labels)


def _family(family: Any, pairs: dict[tuple[str, str], str], values: dict[float, str]) -> list[str]:
    """The lines of one family: HELP and TYPE, its samples, then its OpenMetrics-only samples."""
    suffix, kind = _TYPES.get(family.type, ("", family.type))
    out = [_help(family.name + suffix, family, kind)]
    moved: dict[str, list[str]] = {}
    order: dict[tuple[str, ...], list[str]] = {}
    om_names = {family.name + s: s for s in _OM_ONLY}
    for s in family.samples:
        labels = s.labels
        keys = tuple(labels)
        ordered = order.get(keys)
        if ordered is None:
            ordered = order[keys] = sorted(keys)
        parts = []
        for k in ordered:
            v = labels[k]
            pair = pairs.get((k, v))
            if pair is None:
                escaped = v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
                pair = pairs[(k, v)] = f'{k}="{escaped}"'
            parts.append(pair)
        value = values.get(s.value) if s.value else go_float(s.value)  # 0.0 == -0.0: not one key
        if value is None:
            value = values[s.value] = go_float(s.value)
        stamp = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
        line = f"{s.name}{{{','.join(parts)}}} {value}{stamp}\n" if parts else f"{s.name} {value}{stamp}\n"
        if s.name in om_names:
            moved.setdefault(om_names[s.name], []).append(line)
        else:
            out.append(line)
    for om_suffix, lines in sorted(moved.items()):
        out.append(_help(family.name + om_suffix, family, "gauge"))
        out.extend(lines)
    return out


def text(families: Iterable[Any]) -> bytes:
    """The families in the text format, as `prometheus_client.generate_latest` writes them."""
    out: list[str] = []
    pairs: dict[tuple[str, str], str] = {}  # (label, value) -> 'label="escaped value"'
    values: dict[float, str] = {}  # sample value -> as Go writes it (0, 1 and repeated readings)
    for family in families:
        if _plain(family):
            out.extend(_family(family, pairs, values))
        else:
            out.append(generate_latest(_One(family)).decode("utf-8"))
    return "".join(out).encode("utf-8")


def _wants_text(accept: str | None) -> bool:
    """Whether the client takes the 0.0.4 text format: no Accept header, text/plain (0.0.4 or no
    version: a text/plain of version 1.0.0 asks for escaping rules, left to prometheus_client) or a wildcard."""
    if not accept or choose_encoder(accept)[0] is generate_latest:
        return True
    for part in accept.split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        versions = [p.split("=", 1)[1].strip() for p in params if p.startswith("version=")]
        if kind in ("*/*", "text/*") or (kind == "text/plain" and versions in ([], ["0.0.4"])):
            return True
    return False


def wsgi_app(registry: Collector) -> Callable[..., list[bytes]]:
    """A WSGI app serving `registry` in the text format through `text`; anything else (another
    format asked for, `name[]`, a method other than GET, /favicon.ico) by prometheus_client's app."""
    fallback = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        plain = environ["REQUEST_METHOD"] == "GET" and environ.get("PATH_INFO") != "/favicon.ico"
        plain = plain and "name[]" not in parse_qs(environ.get("QUERY_STRING", ""))
        if not (plain and _wants_text(environ.get("HTTP_ACCEPT"))):
            return fallback(environ, start_response)
        output = text(registry.collect())
        headers = [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            output = gzip.compress(output)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    return app
