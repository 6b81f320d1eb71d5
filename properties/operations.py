"""The operations of a dLLM program: submit a request, abort one, run a round, drain.

A conformance program, a workload, a recorded run and a failing example are each a sequence of
them (`Op`); `apply_ops` runs one on anything that takes them (`OpDriver`: a checking harness,
or an implementation driven bare).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from spec.config import RequestSpec
from spec.events import Submitted


@dataclass(frozen=True, slots=True)
class Submit:
    """The operation that submits `request`."""

    request: RequestSpec

    @classmethod
    def of(cls, event: Submitted) -> Submit:
        """The submission that produced `event`, its flags included."""
        return cls(RequestSpec.of(event))


@dataclass(frozen=True, slots=True)
class Abort:
    """The operation that aborts `request_id`."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Round:
    """The operation that runs one round."""

    pass


@dataclass(frozen=True, slots=True)
class Drain:
    """The operation that drains the implementation until it is idle."""

    pass


Op = Submit | Abort | Round | Drain


class OpDriver(Protocol):
    """What runs operations: a `Harness` (every event checked), or an implementation driven
    bare (`properties.decisions`)."""

    def submit(self, request: RequestSpec) -> object:
        """Submit `request` (a harness returns the typed error of a rejection)."""
        ...

    def abort(self, request_id: str) -> object:
        """Abort `request_id` (a harness returns the typed error of a refusal)."""
        ...

    def round(self) -> None:
        """Run one round."""
        ...

    def drain(self) -> None:
        """Run rounds until the implementation is idle."""
        ...


def apply_ops(h: OpDriver, ops: Iterable[Op]) -> None:
    """Run `ops` on `h` in order (a harness checks every event against the spec under its
    profile; what they produced is `h.events`, also when one of them raised)."""
    for op in ops:
        if isinstance(op, Submit):
            h.submit(op.request)
        elif isinstance(op, Abort):
            h.abort(op.request_id)
        elif isinstance(op, Round):
            h.round()
        else:
            h.drain()


__all__ = ["Abort", "Drain", "Op", "OpDriver", "Round", "Submit", "apply_ops"]
