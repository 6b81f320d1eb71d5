"""The encoding of every event kind: one module per kind, named as `SpecMachine`'s handler
(`Submitted` -> `submitted.py` <-> `SpecMachine._submitted`), each with

- `guards(enc, s, p) -> list[Guard]`: the kind's enabling condition, one labelled conjunct per
  `SpecMachine` check (the label is the rule `SpecMachine` names when the check fails);
- `effect(enc, s, p) -> State`: the successor, written as the fields it changes.

`EVENTS` registers them by kind, in `spec.events.EVENT_TYPES` order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from properties.symbolic.events import (
    aborted,
    admitted,
    block_committed,
    cache_evicted,
    cache_hit,
    cache_released,
    control_returned,
    finished,
    forward,
    kv_allocated,
    kv_cached,
    kv_freed,
    row_acquired,
    row_released,
    step_result,
    submitted,
)
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from spec.events import EVENT_TYPES

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding

GuardsFn = Callable[["Encoding", State, Params], list[Guard]]
EffectFn = Callable[["Encoding", State, Params], State]


@dataclass(frozen=True, slots=True)
class EventEncoding:
    """The guards and the effect of one event kind."""

    kind: str
    guards: GuardsFn
    effect: EffectFn


_MODULES = (
    submitted,
    admitted,
    row_acquired,
    kv_allocated,
    kv_freed,
    row_released,
    forward,
    step_result,
    block_committed,
    finished,
    aborted,
    control_returned,
    kv_cached,
    cache_hit,
    cache_released,
    cache_evicted,
)
_BY_KIND = {m.__name__.rsplit(".", 1)[1]: m for m in _MODULES}

EVENTS: Mapping[str, EventEncoding] = MappingProxyType(
    {
        t.kind: EventEncoding(t.kind, _BY_KIND[t.kind].guards, _BY_KIND[t.kind].effect)
        for t in EVENT_TYPES
    }
)

__all__ = ["EVENTS", "EffectFn", "EventEncoding", "GuardsFn"]
