"""Implementations that hang, for the call-deadline tests: each is a correct reference scheduler
except for one call that never returns (a spin or a deadlock), from a chosen call on."""

from __future__ import annotations

import threading
from typing import NoReturn

from reference.ar.vllm_v1 import VllmV1Scheduler
from reference.dllm import ReferenceDllmScheduler
from spec.adapter import EventSink
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig
from spec.config import DllmConfig

SPIN_FROM_ROUND = 3  # the calls before it are served normally


def spin() -> NoReturn:
    """Loop forever in Python (interruptible between bytecodes)."""
    while True:
        pass


class _SpinsOnACall:
    """Counts the calls of one method per instance; the `SPIN_FROM_ROUND`-th never returns."""

    calls_made = 0

    def _count_or_spin(self) -> None:
        self.calls_made += 1
        if self.calls_made == SPIN_FROM_ROUND:
            spin()


class SpinsInARound(_SpinsOnACall, ReferenceDllmScheduler):
    """The third `run_round` of an instance never returns."""

    def run_round(self) -> None:
        self._count_or_spin()
        super().run_round()


class DeadlocksInDrain(ReferenceDllmScheduler):
    """`drain` takes a non-reentrant lock twice: it waits for ever."""

    def drain(self, max_rounds: int = 10_000) -> None:
        lock = threading.Lock()
        with lock, lock:
            super().drain(max_rounds)


class SpinsInAStep(_SpinsOnACall, VllmV1Scheduler):
    """AR: the third `step` of an instance never returns."""

    def step(self) -> None:
        self._count_or_spin()
        super().step()


def spins_in_a_round(config: DllmConfig, sink: EventSink) -> SpinsInARound:
    return SpinsInARound(config, sink)


def deadlocks_in_drain(config: DllmConfig, sink: EventSink) -> DeadlocksInDrain:
    return DeadlocksInDrain(config, sink)


class SpinsInEveryStepFromTheThird(VllmV1Scheduler):
    """AR: every `step` from an instance's third on never returns, the teardown's drain's too;
    `spins` counts the spins begun, across instances."""

    spins = 0

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink)
        self.steps_begun = 0

    def step(self) -> None:
        self.steps_begun += 1
        if self.steps_begun >= SPIN_FROM_ROUND:
            SpinsInEveryStepFromTheThird.spins += 1
            spin()
        super().step()


def spins_in_every_step_from_the_third(
    config: ArConfig, sink: ArEventSink
) -> SpinsInEveryStepFromTheThird:
    return SpinsInEveryStepFromTheThird(config, sink)


def spins_in_a_step(config: ArConfig, sink: ArEventSink) -> SpinsInAStep:
    return SpinsInAStep(config, sink)


def spins_when_built(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    spin()
