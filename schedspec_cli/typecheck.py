"""Check JSON values against a dataclass's field annotations, before a spec object is built.

A trace line like `{"kind": "kv_freed", "slots": ["0"]}` must be an input error naming the line
and the field, not a crash deep in the spec machine or, worse, a nonsense violation.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any


def type_problem(value: Any, hint: Any) -> str | None:
    """Why `value` (decoded JSON) does not fit `hint`, or None when it does."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        problems = [type_problem(value, h) for h in typing.get_args(hint)]
        return None if any(p is None for p in problems) else f"{value!r} is not {_name(hint)}"
    if hint is type(None):
        return None if value is None else f"{value!r} is not null"
    if hint is bool:
        return None if isinstance(value, bool) else f"{value!r} is not true/false"
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"{value!r} is not an integer"
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"{value!r} is not a number"
    if hint is str:
        return None if isinstance(value, str) else f"{value!r} is not a string"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        valid = [m.value for m in hint]
        return None if value in valid else f"{value!r} is not one of {valid}"
    if origin is tuple or origin is list:
        if not isinstance(value, list):
            return f"{value!r} is not a list"
        args = typing.get_args(hint)
        item = args[0] if args else Any
        for i, v in enumerate(value):
            p = type_problem(v, item)
            if p is not None:
                return f"item {i}: {p}"
        return None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            return f"{value!r} is not an object"
        return fields_problem(value, hint)
    return None  # a type this checker does not know: left to the constructor


def fields_problem(data: dict[str, Any], cls: type) -> str | None:
    """The first field of `data` that does not fit `cls`'s annotations (missing fields and
    unknown fields are left to the caller's parser, which names them)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: nothing to check against
        return None
    for f in dataclasses.fields(cls):
        if f.name in data and f.name in hints:
            p = type_problem(data[f.name], hints[f.name])
            if p is not None:
                return f"field {f.name!r}: {p}"
    return None


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


__all__ = ["fields_problem", "type_problem"]
