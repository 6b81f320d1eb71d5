"""The stateful AR conformance machine, generic over an AR implementation factory.

`ar_conformance_machine(factory, profile=...)` returns a Hypothesis `RuleBasedStateMachine`
class whose rules submit, abort, step and drain through `ArHarness` (every event replayed into
`ArSpecMachine`, invariants after every event, snapshot after every step). At teardown it drains
and checks that no block is held. Configurations are drawn only inside `profile.space`; the
spec machine gets `profile.policy` (its `rules`, or else the adapter's declared `rules`). A
configuration the factory refuses (`ConfigError`, e.g. LightLLM with block_size != 1) is not a
failure: the example is discarded. A failure prints a shrunk program of `state.<rule>(...)`
calls that replays it.

Campaigns: the class attribute `ignored_rules` names rules whose violation makes the example
invalid (`hypothesis.reject()`) instead of failing; each such hit is counted in the class-level
`ignored_hits`. It starts with the profile's accepted deviations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from hypothesis import assume, reject
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

from properties.ar.harness import ArHarness
from properties.ar.strategies import ar_configs, ar_configs_in, prompts, request_sizes
from properties.conformance import StepCounter
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.profile import ArConfigSpace, ArProfile
from spec.errors import ConfigError, SpecViolation

DEFAULT_POLICIES = (Policy.FCFS,) * 6 + tuple(p for p in Policy if p is not Policy.FCFS)


def ar_conformance_machine(
    factory: ArImplementationFactory,
    *,
    profile: ArProfile | None = None,
    configs: st.SearchStrategy[ArConfig] | None = None,
    counter: StepCounter | None = None,
    name: str = "ArConformance",
) -> type[RuleBasedStateMachine]:
    """A state machine class checking `factory`'s AR implementation against the AR spec, under
    `profile` (default: the idealised spec, every configuration)."""
    prof = profile if profile is not None else ArProfile()
    space = prof.space
    if configs is not None:
        config_strategy = configs
    elif space == ArConfigSpace():
        config_strategy = ar_configs(policies=DEFAULT_POLICIES)
    else:
        config_strategy = ar_configs_in(space)
    count = counter or StepCounter()

    class ArConformance(RuleBasedStateMachine):
        requests = Bundle("requests")
        ignored_rules: ClassVar[frozenset[str]] = frozenset(d.rule for d in prof.deviations)
        ignored_hits: ClassVar[dict[str, int]] = {}

        def __init__(self) -> None:
            super().__init__()
            self.h: ArHarness | None = None
            self.next_id = 0

        @contextmanager
        def _ignoring(self) -> Iterator[None]:
            """A violation of an ignored rule invalidates the example (counted)."""
            try:
                yield
            except SpecViolation as v:
                cls = type(self)
                if v.rule not in cls.ignored_rules:
                    raise
                cls.ignored_hits[v.rule] = cls.ignored_hits.get(v.rule, 0) + 1
                reject()

        @initialize(config=config_strategy)
        def configure(self, config: ArConfig) -> None:
            assume(space.outside(config) is None)  # explicit `configs` may stray outside
            try:
                impl_probe = factory(config, lambda e: None)
            except ConfigError:
                assume(False)  # the implementation does not support this configuration
                return
            policy = prof.policy
            if policy.rules is None:  # the adapter declares its ordering rules itself
                policy = dataclasses.replace(policy, rules=impl_probe.rules)
            self.h = ArHarness(factory, config, policy=policy)

        @property
        def harness(self) -> ArHarness:
            assert self.h is not None
            return self.h

        @rule(
            target=requests,
            data=st.data(),
            stop_after=st.none() | st.integers(1, 12),
            priority=st.integers(0, 3),
            predicted_len=st.none() | st.integers(1, 12),
        )
        def submit(
            self,
            data: st.DataObject,
            stop_after: int | None,
            priority: int,
            predicted_len: int | None,
        ) -> object:
            """Submit a request (rejected with a typed error if it cannot fit the config)."""
            count.steps += 1
            prompt_len, max_tokens = data.draw(request_sizes(self.harness.config), "sizes")
            prompt = None
            if self.harness.config.enable_prefix_caching:
                prompt = data.draw(prompts(prompt_len), "prompt")
            rid = f"r{self.next_id}"
            self.next_id += 1
            req = ArRequest(
                rid,
                prompt_len,
                max_tokens,
                stop_after=stop_after,
                priority=priority,
                predicted_len=predicted_len,
                arrival_time=float(self.next_id),
                prompt=prompt,
            )
            with self._ignoring():
                err = self.harness.submit(req)
            return multiple() if err is not None else rid

        @rule(data=st.data(), n=st.integers(2, 4))
        def submit_burst(self, data: st.DataObject, n: int) -> None:
            """Several requests arrive together (queueing and preemption pressure)."""
            count.steps += 1
            for _ in range(n):
                prompt_len, max_tokens = data.draw(request_sizes(self.harness.config), "sizes")
                prompt = None
                if self.harness.config.enable_prefix_caching:
                    prompt = data.draw(prompts(prompt_len), "prompt")
                rid = f"r{self.next_id}"
                self.next_id += 1
                with self._ignoring():
                    self.harness.submit(
                        ArRequest(
                            rid,
                            prompt_len,
                            max_tokens,
                            arrival_time=float(self.next_id),
                            prompt=prompt,
                        )
                    )

        @rule(request=consumes(requests))
        def abort(self, request: str) -> None:
            count.steps += 1
            with self._ignoring():
                self.harness.abort(request)

        @rule(request=requests)
        def abort_again_or_late(self, request: str) -> None:
            """Aborting a finished or already aborted request must be refused cleanly."""
            count.steps += 1
            with self._ignoring():
                self.harness.abort(request)

        @rule()
        def abort_unknown(self) -> None:
            count.steps += 1
            with self._ignoring():
                err = self.harness.abort("no-such-request")
            assert err is not None, "abort of an unknown id must raise UnknownRequest"

        @rule()
        def step(self) -> None:
            count.steps += 1
            with self._ignoring():
                self.harness.step()

        @rule()
        def steps(self) -> None:
            """Several steps at once (long requests get to finish)."""
            count.steps += 1
            with self._ignoring():
                for _ in range(4):
                    self.harness.step()

        @precondition(lambda self: self.h is not None and self.h.spec.step_index % 3 == 2)
        @rule()
        def drain(self) -> None:
            count.steps += 1
            with self._ignoring():
                self.harness.drain()

        @invariant()
        def steps_are_checked(self) -> None:
            if self.h is not None:
                assert self.h.ended_steps() == self.h.spec.step_index

        def teardown(self) -> None:
            if self.h is None or self.h.violation is not None:
                return
            with self._ignoring():
                self.h.drain()
            count.examples += 1
            if count.on_example is not None:
                count.on_example(count.examples, count.steps)

    ArConformance.__name__ = name
    ArConformance.__qualname__ = name
    return ArConformance
