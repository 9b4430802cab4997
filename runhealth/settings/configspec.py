"""The machinery behind `runhealth.settings.config`: one declaration per config key.

Each key of the config file is a dataclass field whose metadata is a `Spec` (made with
`spec(...)`): the TOML types it accepts, the rules its value must meet (each with the words of
its error message), and the default and meaning the README's key table shows. `check_table`
walks `dataclasses.fields()` to validate a TOML table, and `markdown_table` writes the README's
table from the same declarations, so the checks, the defaults and the documentation cannot
drift apart. Plain dataclass metadata rather than pydantic: no new dependency, and the error
wording ("<file>: node 'x': field 'y' ...") stays ours.

`Secret` holds a passphrase or password: it prints as '***' everywhere (repr, str, f-strings,
logging, dataclass reprs) and is read only through `reveal()`.
"""

from __future__ import annotations

import dataclasses
import hmac
import re
from collections.abc import Callable, Iterable
from typing import Any

from runhealth.errors import ConfigError

MASK = "***"
_UNITS = {"s": "seconds", "h": "hours"}


class Secret:
    """A secret string that never prints; `reveal()` is the only way to read it."""

    __slots__ = ("_value",)
    _value: str

    def __init__(self, value: str) -> None:
        object.__setattr__(self, "_value", value)

    def reveal(self) -> str:
        """The secret itself: only for the call that needs it (paramiko's connect)."""
        return self._value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Secret is read-only")

    def __repr__(self) -> str:
        return f"Secret('{MASK}')"

    def __str__(self) -> str:
        return MASK

    def __format__(self, format_spec: str) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(Secret)  # equal secrets must hash alike; the value itself stays out of it

    def __bool__(self) -> bool:
        return bool(self._value)

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict) -> Secret:
        return self  # immutable: dataclasses.asdict/replace keep the same object

    def __reduce__(self) -> Any:
        raise TypeError("a Secret is not pickled (it would be written out in the clear)")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One condition on a value, with the words that finish "field 'x' must ..." when it fails."""

    test: Callable[[Any], bool]
    must: str
    doc: str = ""  # the range as the README's key table states it ("1–8", "0.5–3600 s")


@dataclasses.dataclass(frozen=True)
class Spec:
    """What one config key accepts, and what the README says about it."""

    types: tuple[type, ...]
    required: bool = False
    rules: tuple[Rule, ...] = ()
    doc: str = ""
    default_doc: str | None = None  # the README's default column, when the dataclass default says too little
    in_file: bool = True  # False: never read from the config file (secrets, filled from secrets.toml)
    secret: bool = False


def between(lo: float, hi: float, unit: str = "", *, above: bool = False, hint: str = "") -> Rule:
    """lo <= value <= hi (lo < value with `above`), worded as "must be between lo and hi unit"."""
    words = f"must be between {lo:g} and {hi:g}" + (f" {_UNITS.get(unit, unit)}" if unit else "") + hint
    unit = f" {unit}" if unit else ""
    if above:
        return Rule(lambda v: lo < v <= hi, words, f"over {lo:g}, at most {hi:g}{unit}")
    return Rule(lambda v: lo <= v <= hi, words, f"{lo:g}–{hi:g}{unit}")


def positive() -> Rule:
    return Rule(lambda v: v > 0, "must be positive")


def one_of(*choices: str) -> Rule:
    return Rule(lambda v: v in choices, "must be one of " + ", ".join(repr(c) for c in choices))


def matches(pattern: str | re.Pattern[str], must: str) -> Rule:
    compiled = re.compile(pattern)
    return Rule(lambda v: bool(compiled.fullmatch(v)), must)  # match(...$) passes a trailing "\n"


def spec(
    *types: type,
    required: bool = False,
    rules: Iterable[Rule] = (),
    doc: str = "",
    default_doc: str | None = None,
    in_file: bool = True,
    secret: bool = False,
) -> dict[str, Spec]:
    """Field metadata: `dataclasses.field(default=..., metadata=spec(int, rules=[positive()], doc=...))`."""
    return {"spec": Spec(tuple(types), required, tuple(rules), doc, default_doc, in_file, secret)}


def spec_of(field: dataclasses.Field) -> Spec | None:
    return field.metadata.get("spec")


def file_fields(cls: type) -> list[tuple[dataclasses.Field, Spec]]:
    """The fields of `cls` a config file may set, in declaration order."""
    out = []
    for field in dataclasses.fields(cls):
        s = spec_of(field)
        if s is not None and s.in_file:
            out.append((field, s))
    return out


def check_keys(table: dict, allowed: Iterable[str], where: str) -> None:
    allowed = set(allowed)
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def check_table(table: dict, cls: type, where: str, value_where: str) -> dict[str, Any]:
    """The values of `table` for the dataclass `cls`, each checked against its declaration.

    `where` prefixes errors about the table's shape (unknown, missing, wrong type: "<where>:
    field 'y' must be int, got str"); `value_where` prefixes a rule's failure ("<value_where>
    field 'y' must be between 1 and 8").
    """
    fields = file_fields(cls)
    check_keys(table, [f.name for f, _ in fields], where)
    out = {}
    for field, s in fields:
        if field.name not in table:
            if s.required:
                raise ConfigError(f"{where}: missing required field {field.name!r}")
            continue
        value = table[field.name]
        # bool is an int subclass: `port = true` must not pass as a number.
        if not isinstance(value, s.types) or (isinstance(value, bool) and bool not in s.types):
            names = " or ".join(t.__name__ for t in s.types)
            raise ConfigError(f"{where}: field {field.name!r} must be {names}, got {type(value).__name__}")
        for rule in s.rules:
            if not rule.test(value):
                raise ConfigError(f"{value_where} field {field.name!r} {rule.must}")
        out[field.name] = value
    return out


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def default_text(field: dataclasses.Field, s: Spec) -> str:
    """The README's default column for one key."""
    if s.default_doc is not None:
        return s.default_doc
    if s.required:
        return "required"
    if field.default_factory is not dataclasses.MISSING:
        return f"`{_toml(field.default_factory())}`"
    if field.default is None:
        return "none"
    return f"`{_toml(field.default)}`"


def markdown_table(cls: type, heading: str) -> str:
    """The README's key table for `cls` (header `heading`), one row per file key."""
    rows = [f"| {heading} | default | meaning |", "|---|---|---|"]
    for field, s in file_fields(cls):
        meaning = " ".join([s.doc] + [f"({r.doc})" for r in s.rules if r.doc])
        rows.append(f"| `{field.name}` | {default_text(field, s)} | {meaning} |")
    return "\n".join(rows)
