"""The stateful conformance machine, generic over an implementation factory.

`conformance_machine(factory)` returns a Hypothesis `RuleBasedStateMachine` class whose rules
submit, abort, run a round and drain, all through `Harness` (every event replayed into the spec,
invariants after every event, snapshot after every round). At teardown it drains, checks for
leaks and checks parity against each request's solo sync output. A failure prints a shrunk,
copy-pasteable program of `state.<rule>(...)` calls that replays it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from properties.harness import Harness, SoloCache, check_parity
from properties.strategies import dllm_configs, prompts
from spec.adapter import ImplementationFactory
from spec.config import DllmConfig, RequestSpec

ParityPolicy = Literal["always", "bs1", "never"]


class StepCounter:
    """Counts rule executions across examples (for progress and the steps/s benchmark)."""

    def __init__(self) -> None:
        self.steps = 0
        self.examples = 0
        self.on_example: Callable[[int, int], None] | None = None


def conformance_machine(
    factory: ImplementationFactory,
    *,
    configs: st.SearchStrategy[DllmConfig] | None = None,
    parity: ParityPolicy = "always",
    counter: StepCounter | None = None,
    name: str = "Conformance",
) -> type[RuleBasedStateMachine]:
    """A state machine class checking `factory`'s implementation against the spec.

    parity: "always" when outputs must not depend on batching (the reference), "bs1" when only
    batch-size-1 runs must match sync (a real model with batch-dependent float kernels),
    "never" to skip the output check.
    """
    config_strategy = configs if configs is not None else dllm_configs()
    solo_cache: SoloCache = {}
    count = counter or StepCounter()

    class Conformance(RuleBasedStateMachine):
        requests = Bundle("requests")

        def __init__(self) -> None:
            super().__init__()
            self.h: Harness | None = None
            self.next_id = 0

        @initialize(config=config_strategy)
        def configure(self, config: DllmConfig) -> None:
            self.h = Harness(factory, config)

        @property
        def harness(self) -> Harness:
            assert self.h is not None
            return self.h

        @rule(target=requests, prompt=prompts(20), max_new_tokens=st.integers(1, 20))
        def submit(self, prompt: tuple[int, ...], max_new_tokens: int) -> object:
            """Submit a request (rejected with a typed error if it cannot fit the config)."""
            count.steps += 1
            max_new = max_new_tokens
            rid = f"r{self.next_id}"
            self.next_id += 1
            err = self.harness.submit(RequestSpec(rid, prompt, max_new))
            return multiple() if err is not None else rid

        @rule(request=consumes(requests))
        def abort(self, request: str) -> None:
            count.steps += 1
            self.harness.abort(request)

        @rule(request=requests)
        def abort_again_or_late(self, request: str) -> None:
            """Aborting a finished or already aborted request must be refused cleanly."""
            count.steps += 1
            self.harness.abort(request)

        @rule()
        def abort_unknown(self) -> None:
            count.steps += 1
            err = self.harness.abort("no-such-request")
            assert err is not None, "abort of an unknown id must raise UnknownRequest"

        @rule()
        def round(self) -> None:
            count.steps += 1
            self.harness.round()

        @precondition(lambda self: self.h is not None and self.h.spec.round_index % 3 == 2)
        @rule()
        def drain(self) -> None:
            count.steps += 1
            self.harness.drain()

        @invariant()
        def rounds_are_checked(self) -> None:
            if self.h is not None:
                assert self.h.ended_rounds() == self.h.spec.round_index

        def teardown(self) -> None:
            # Hypothesis runs teardown after a failing step too: do not mask that failure.
            if self.h is None or self.h.violation is not None:
                return
            self.h.drain()
            if parity == "always" or (parity == "bs1" and self.h.config.max_running_requests == 1):
                check_parity(self.h, solo_cache)
            count.examples += 1
            if count.on_example is not None:
                count.on_example(count.examples, count.steps)

    Conformance.__name__ = name
    Conformance.__qualname__ = name
    return Conformance
