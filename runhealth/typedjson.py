"""Typed JSON: a screen model (frozen dataclasses all the way down) to JSON-ready data and back.

`dump(value)` is what `dataclasses.asdict` gives, JSON-ready: a dataclass becomes a dict of its
fields (properties are not stored: they are computed again from the fields), tuples and lists
become lists, mappings dicts. `load(tp, data)` rebuilds a value of type `tp` from the field types,
read with `typing.get_type_hints`: dataclasses, `tuple[X, ...]` and fixed tuples, `list[X]`,
`dict[str, X]` and `Mapping`, `X | None`, `Literal`, TypedDicts (the dicts they are), the JSON
scalars and `Any`; a class that is no dataclass writes and reads itself (`to_json`/`from_json`,
as stats.LengthHist). So `load(type(m), dump(m)) == m` for every screen model, and a value stored by
one version of runhealth and read by another is checked field by field: a missing, unknown or
mistyped field raises `TypedJsonError` naming its path, never a half-built model.

Why not pickle: a store file from elsewhere must never run code in the dashboard (as the page
payloads, runhealth.payloads.pagedata).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, is_typeddict


class TypedJsonError(ValueError):
    """The data does not fit the type: `path` says where ("model.summary.tokens.p90")."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path = path


def dump(value: Any) -> Any:
    """`value` as JSON-ready data: dataclasses as dicts of their fields, tuples as lists."""
    tp = type(value)
    kind = _KINDS[tp] if tp in _KINDS else _dump_kind(tp)
    if kind is None:  # most values (a published Overview of 1,024 nodes holds ~110K): as they are
        return value
    if isinstance(kind, tuple):
        return {name: dump(getattr(value, name)) for name in kind}
    if kind == "own":
        return value.to_json()
    if kind == "list":
        return [dump(v) for v in value]
    return {str(k): dump(v) for k, v in value.items()}


_SCALARS = (str, int, float, bool, type(None))
_KINDS: dict[type, tuple[str, ...] | str | None] = dict.fromkeys(_SCALARS)  # type -> how dump writes it


def _dump_kind(tp: type) -> tuple[str, ...] | str | None:
    """How `dump` writes a value of type `tp` (decided once a type, not once a value): its field
    names (a dataclass), "own" (to_json), "list", "mapping", or None (as it is)."""
    _KINDS[tp] = kind = _kind_of(tp)
    return kind


def _kind_of(tp: type) -> tuple[str, ...] | str | None:
    if dataclasses.is_dataclass(tp):
        return tuple(f.name for f in dataclasses.fields(tp))
    if _own_json(tp):
        return "own"
    if issubclass(tp, list | tuple):
        return "list"
    if issubclass(tp, Mapping):
        return "mapping"
    return None


def load(tp: Any, data: Any, path: str = "$") -> Any:
    """A value of type `tp` rebuilt from `dump`'s data (see the module docstring).

    Raises:
        TypedJsonError: `data` does not fit `tp` (the path of the first field that does not).
    """
    if tp is float or tp is int or tp is str or tp is bool:  # most values (a long list's items): no generic to unpack
        return _scalar(tp, data, path)
    origin = get_origin(tp)
    if tp is Any or tp is object:
        return data
    if origin is Union or origin is types.UnionType:
        return _union(get_args(tp), data, path)
    if origin is Literal:
        if data not in get_args(tp):
            raise TypedJsonError(path, f"{data!r} is none of {get_args(tp)}")
        return data
    if origin is tuple:
        return _tuple(get_args(tp), data, path)
    if origin in (list, Sequence):
        return [load(get_args(tp)[0], x, f"{path}[{i}]") for i, x in enumerate(_list(data, path))]
    if origin in (dict, Mapping):
        value_type = get_args(tp)[1] if get_args(tp) else Any
        return {k: load(value_type, v, f"{path}.{k}") for k, v in _dict(data, path).items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, data, path)
    if is_typeddict(tp):
        return dict(_dict(data, path))
    if _own_json(tp):
        try:
            return tp.from_json(data)
        except (TypeError, ValueError, KeyError) as exc:
            raise TypedJsonError(path, f"not a {tp.__name__}: {exc}") from exc
    return _scalar(tp, data, path)


def _own_json(tp: Any) -> bool:
    """A class (not a dataclass) that writes and reads itself: `to_json()` and `from_json(data)`."""
    return (
        isinstance(tp, type)
        and not dataclasses.is_dataclass(tp)
        and hasattr(tp, "from_json")
        and hasattr(tp, "to_json")
    )


def _union(args: tuple[Any, ...], data: Any, path: str) -> Any:
    if data is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    for i, option in enumerate(options):
        try:
            return load(option, data, path)
        except TypedJsonError:
            if i == len(options) - 1:
                raise
    raise TypedJsonError(path, "None where a value is needed")


def _tuple(args: tuple[Any, ...], data: Any, path: str) -> tuple[Any, ...]:
    items = _list(data, path)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(load(args[0], x, f"{path}[{i}]") for i, x in enumerate(items))
    if len(items) != len(args):
        raise TypedJsonError(path, f"{len(items)} items where {len(args)} are needed")
    return tuple(load(a, x, f"{path}[{i}]") for i, (a, x) in enumerate(zip(args, items, strict=True)))


def _list(data: Any, path: str) -> list[Any]:
    if not isinstance(data, list | tuple):
        raise TypedJsonError(path, f"a list is needed, not {type(data).__name__}")
    return list(data)


def _dict(data: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise TypedJsonError(path, f"an object is needed, not {type(data).__name__}")
    return data


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) of each init field of dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            f.name,
            hints[f.name],
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
        if f.init
    )


def _dataclass(cls: type, data: Any, path: str) -> Any:
    given = _dict(data, path)
    fields = _fields(cls)
    unknown = set(given) - {name for name, _, _ in fields}
    if unknown:
        raise TypedJsonError(path, f"unknown field(s) {', '.join(sorted(unknown))} for {cls.__name__}")
    kwargs = {}
    for name, tp, required in fields:
        if name in given:
            kwargs[name] = load(tp, given[name], f"{path}.{name}")
        elif required:
            raise TypedJsonError(path, f"{cls.__name__} needs field {name!r}")
    return cls(**kwargs)


def _scalar(tp: Any, data: Any, path: str) -> Any:
    if tp is type(None):
        if data is not None:
            raise TypedJsonError(path, f"None is needed, not {data!r}")
        return None
    if tp is float and isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)  # JSON writes 2.0 as 2
    if tp is int and isinstance(data, bool):
        raise TypedJsonError(path, "an int is needed, not a bool")
    if isinstance(tp, type) and not isinstance(data, tp):
        raise TypedJsonError(path, f"{tp.__name__} is needed, not {type(data).__name__}")
    return data
