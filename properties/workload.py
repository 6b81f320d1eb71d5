"""Workloads: a configuration plus a program of operations, replayable on any implementation.

Strategies generate them, Z3 synthesises boundary ones, and failures can be saved as one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from properties.harness import Harness, SoloCache, check_parity
from properties.operations import Abort, Drain, Op, OpDriver, Round, Submit, apply_ops
from spec.adapter import ImplementationFactory
from spec.config import DllmConfig
from spec.profile import DllmProfile


@dataclass(frozen=True, slots=True)
class Workload:
    """`ops` run in order against a fresh implementation built for `config`; a final drain is
    implied. `name` says what boundary it exercises."""

    config: DllmConfig
    ops: tuple[Op, ...]
    name: str = ""
    notes: tuple[str, ...] = field(default=())


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


__all__ = [
    "Abort",
    "Drain",
    "Op",
    "OpDriver",
    "Round",
    "Submit",
    "Workload",
    "apply_ops",
    "run_workload",
]
