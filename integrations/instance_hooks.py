"""Replacing methods of one live object, and putting them back.

An engine's scheduler is observed by replacing some of its methods on that instance only
(instance attributes shadow the class's methods; the class, and every other instance, is
untouched). `InstanceHooks` remembers what each object had, so `restore` leaves the object as
it found it: an attribute the instance had of its own is put back, and one it did not is
deleted so that the class's method shows through again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class InstanceHooks:
    """The methods replaced on live objects, in order, until `restore`."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []  # (object, name, its own attribute)

    def replace(self, obj: Any, name: str, replacement: Callable[..., Any]) -> Callable[..., Any]:
        """Put `replacement` on `obj` as `name`; returns what `obj.name` was, to call through."""
        original: Callable[..., Any] = getattr(obj, name)
        self._saved.append((obj, name, vars(obj).get(name)))
        setattr(obj, name, replacement)
        return original

    def replace_methods(
        self, obj: Any, replacements: Mapping[str, Callable[..., Any]]
    ) -> dict[str, Callable[..., Any]]:
        """`replace` for each name of `replacements`; returns name -> what `obj` had."""
        return {name: self.replace(obj, name, new) for name, new in replacements.items()}

    def restore(self) -> None:
        """Give every object its own methods back (latest replacement first)."""
        for obj, name, own in reversed(self._saved):
            if own is None:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
        self._saved.clear()


__all__ = ["InstanceHooks"]
