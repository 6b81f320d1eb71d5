"""Workloads: a configuration plus a program of operations, replayable on any implementation.

Strategies generate them, Z3 synthesises boundary ones, and failures can be saved as one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from properties.harness import Harness, SoloCache, check_parity
from spec.adapter import ImplementationFactory
from spec.config import DllmConfig, RequestSpec
from spec.events import Submitted
from spec.profile import DllmProfile


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


@dataclass(frozen=True, slots=True)
class Workload:
    """`ops` run in order against a fresh implementation built for `config`; a final drain is
    implied. `name` says what boundary it exercises."""

    config: DllmConfig
    ops: tuple[Op, ...]
    name: str = ""
    notes: tuple[str, ...] = field(default=())


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


def run_workload(
    factory: ImplementationFactory,
    workload: Workload,
    *,
    parity: bool = True,
    cache: SoloCache | None = None,
    profile: DllmProfile | None = None,
) -> Harness:
    """Run the workload under the harness (raising SpecViolation on any breach), drain, check
    for leaks and, if `parity`, check every finished request against its solo sync output.
    `profile`: the implementation's (default the idealised spec's `DllmProfile()`)."""
    h = Harness(factory, workload.config, profile=profile or DllmProfile())
    apply_ops(h, workload.ops)
    h.drain()
    if parity:
        check_parity(h, cache)
    return h
