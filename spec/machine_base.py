"""`MachineBase`: the skeleton both spec machines (dLLM and AR) are built on.

A spec machine replays an implementation's events against the specification. What every family
shares lives here:

- a **handler table** keyed by event type (`handlers`): `apply(event)` looks the handler up,
  runs it (it raises a violation when the event is not enabled, or applies its effect) and counts
  the event; an event type without a handler breaks the family's lifecycle rule;
- `_fail(rule, detail, event)`: the violation, naming the rule (a member of the family's rule
  enum, so mypy checks every name), the event and the rendered state before the event;
- `apply_all`, `enabled` (would this event be accepted now? on a copy), `copy`, `render`.

How a family subclasses it (the dLLM `spec.machine.SpecMachine` is the worked example):

1. declare the rule names as a `StrEnum` (`spec.rules.Rule`; a member compares and hashes equal to
   its string, so `violation.rule == "no_leak"` keeps working) and subclass
   `MachineBase[MyEvent, MyRule]`;
2. set `lifecycle_rule` (the rule an unknown event type breaks) and, if the family has its own
   violation class, `violation_type` (a `SpecViolation` subclass);
3. implement `render()` (the state in words, shown in every violation);
4. write one handler method per event type and, after the class body, install the table:
   `MyMachine.handlers = {MyEvent: MyMachine._my_event, ...}`.

The harnesses (`properties.replay.ReplayHarness`) drive any such machine the same way.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, Generic, Self, TypeVar

from spec.errors import SpecViolation

EventT = TypeVar("EventT")
RuleT = TypeVar("RuleT", bound=StrEnum)

Handler = Callable[[Any, Any], None]


class MachineBase(Generic[EventT, RuleT]):
    """Handler table, failure, replay, copy and render shared by the spec machines.

    Subclasses set `handlers` and `lifecycle_rule`, implement `render`, and initialise
    `events_applied = 0` (or call `super().__init__()`).
    """

    handlers: ClassVar[Mapping[type, Handler]] = MappingProxyType({})
    lifecycle_rule: ClassVar[str] = "lifecycle"
    violation_type: ClassVar[type[SpecViolation]] = SpecViolation

    def __init__(self) -> None:
        self.events_applied: int = 0

    # ------------------------------------------------------------------ views
    def render(self) -> str:
        """The current state in words (shown in every violation)."""
        raise NotImplementedError

    def copy(self) -> Self:
        """An independent copy (for `enabled` and for exploring alternatives)."""
        return _copy.deepcopy(self)

    # ------------------------------------------------------------------ errors
    def _fail(self, rule: RuleT, detail: str, event: object | None) -> SpecViolation:
        """The violation of `rule` by `event`, with the state before it rendered."""
        return self.violation_type(rule, detail, event, self.render())

    # ------------------------------------------------------------------ replay
    def apply(self, event: EventT) -> None:
        """Check that `event` is enabled and apply its effect; raise a violation if not."""
        handler = self.handlers.get(type(event))
        if handler is None:
            raise self.violation_type(
                self.lifecycle_rule,
                f"unknown event type {type(event).__name__}",
                event,
                self.render(),
            )
        handler(self, event)
        self.events_applied += 1

    def apply_all(self, events: Iterable[EventT]) -> None:
        """`apply` each event in order; the first one not enabled raises its violation."""
        for e in events:
            self.apply(e)

    def enabled(self, event: EventT) -> str | None:
        """None if `event` is enabled now, else the name of the rule it would break."""
        try:
            self.copy().apply(event)
        except SpecViolation as v:
            return v.rule
        return None


__all__ = ["EventT", "Handler", "MachineBase", "RuleT"]
