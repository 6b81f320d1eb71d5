"""The stateful AR conformance machine, generic over an AR implementation factory.

`ar_conformance_machine(factory, profile=...)` returns a Hypothesis `RuleBasedStateMachine`
class whose rules submit, abort, step and drain through `ArHarness` (every event replayed into
`ArSpecMachine`, invariants after every event, snapshot after every step). At teardown it drains
and checks that no block is held. Configurations are drawn only inside `profile.space`; the
spec machine gets `profile.policy` (its `rules`, or else the adapter's declared `rules`). A
configuration the factory refuses (`ConfigError`, e.g. LightLLM with block_size != 1) is not a
failure: the example is discarded. A failure prints a shrunk program of `state.<rule>(...)`
calls that replays it.

The shared skeleton (abort rules, drain, teardown, step counting, implementation errors as
findings, `ignored_rules` / `ignored_hits` for campaigns) is
`properties.conformance_base.ConformanceBase`; `ignored_rules` starts with the profile's
accepted deviations.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import (
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    multiple,
    precondition,
    rule,
)

from properties.adapter_check import require_adapter
from properties.ar.decisions import twin_difference
from properties.ar.example import ArExample
from properties.ar.harness import ArHarness
from properties.ar.strategies import (
    ar_configs,
    ar_configs_in,
    cache_read_limits,
    prompts,
    request_loras,
    request_sizes,
)
from properties.conformance_base import ConformanceBase, StepCounter
from spec.ar.adapter import ArDraftingAdapter, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile, CacheReadLimits
from spec.errors import CannotDrive, ConfigError

DEFAULT_POLICIES = (Policy.FCFS,) * 6 + tuple(p for p in Policy if p is not Policy.FCFS)


def ar_conformance_machine(
    factory: ArImplementationFactory,
    *,
    profile: ArProfile | None = None,
    configs: st.SearchStrategy[ArConfig] | None = None,
    counter: StepCounter | None = None,
    name: str = "ArConformance",
    twin: ArImplementationFactory | None = None,
    twin_policy: ArPolicy | None = None,
    loras: bool = False,
    drafts: bool = False,
) -> type[RuleBasedStateMachine]:
    """A state machine class checking `factory`'s AR implementation against the AR spec, under
    `profile` (default: the idealised spec, every configuration).

    configs: overrides the configurations drawn (those outside `profile.space` are discarded).
    twin: a decision twin (another AR implementation): at the end of every example the
        example's operations run through it and must decide exactly alike, step by step (rule
        `twin_decisions`, `properties.ar.decisions`); it is checked against the spec under
        `twin_policy` (None: the twin adapter's own rules).
    loras: draw LoRA adapter slots too, where `profile.space` serves adapters (`max_loras`):
        half the configurations get one or two slots, and their requests one of three
        adapters or the base model (rule `lora_slots`). Off by default, so that the examples
        of every other suite are drawn as before.
    drafts: draw speculative decoding too (`num_speculative_tokens` 0 to 3), and a rule
        `propose` by which a drafter proposes drafts for a decoding request's next step and
        the model will accept some (`spec.ar.ArDraftingAdapter`; rule
        `speculative_drafts`). Off by default, as `loras`.
    """
    prof = profile if profile is not None else ArProfile()
    space = prof.space
    if configs is not None:
        config_strategy = configs
    elif space == ArConfigSpace():
        config_strategy = ar_configs(policies=DEFAULT_POLICIES)
    else:
        config_strategy = ar_configs_in(space, loras=loras, drafts=drafts)
    step_counter = counter or StepCounter()

    class ArConformance(ConformanceBase[ArHarness]):
        ignored_rules: ClassVar[frozenset[str]] = frozenset(d.rule for d in prof.deviations)
        ignored_hits: ClassVar[dict[str, int]] = {}
        counter = step_counter
        order_rule = "step_order"
        note_calls = True  # its requests are drawn inside the rules: print them whole

        @initialize(config=config_strategy)
        def configure(self, config: ArConfig) -> None:
            assume(space.outside(config) is None)  # explicit `configs` may stray outside
            call = f"configure(config={config!r})"
            try:
                probe = self.construct(call, lambda: factory(config, lambda e: None))
            except ConfigError:
                assume(False)  # the implementation does not support this configuration
                return
            # read `rules` only from an adapter: a missing or ill-typed one is named (ConfigError)
            require_adapter(probe, ArSchedulerAdapter, factory)
            if drafts and not isinstance(probe, ArDraftingAdapter):
                raise CannotDrive(
                    f"{type(probe).__name__} replays no drafter (its adapter has no "
                    "propose_drafts), and the suite was asked for drafts: make it a "
                    "spec.ar.ArDraftingAdapter, or run without drafts (--drafts)"
                )
            policy = prof.policy
            if policy.rules is None:  # the adapter declares its ordering rules itself
                policy = dataclasses.replace(policy, rules=probe.rules)
            self.build(lambda: ArHarness(factory, config, policy=policy), call)

        def clock(self) -> int:
            return self.harness.spec.step_index

        def ended(self) -> int:
            return self.harness.ended_steps()

        def _request(self, data: st.DataObject, **kw: object) -> ArRequest:
            config = self.harness.config
            prompt_len, max_tokens = data.draw(request_sizes(config), "sizes")
            prompt = None
            limit = None
            if config.enable_prefix_caching:
                prompt = data.draw(prompts(prompt_len), "prompt")
                if space.cache_read_limits is not CacheReadLimits.NONE:
                    limit = data.draw(
                        cache_read_limits(prompt_len, space.cache_read_limits), "cache_read_limit"
                    )
            lora = data.draw(request_loras(), "lora") if config.max_loras else None
            rid = self.new_id()
            return ArRequest(
                rid,
                prompt_len,
                max_tokens,
                arrival_time=float(self.next_id),
                prompt=prompt,
                cache_read_limit=limit,
                lora=lora,
                **kw,  # type: ignore[arg-type]
            )

        @rule(
            target=ConformanceBase.requests,
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
        ) -> str | MultipleResults[str]:
            """Submit a request (rejected with a typed error if it cannot fit the config)."""
            req = self._request(
                data, stop_after=stop_after, priority=priority, predicted_len=predicted_len
            )
            err = self.run("submit", self.harness.submit, req)
            return multiple() if err is not None else req.request_id

        @rule(data=st.data(), n=st.integers(2, 4))
        def submit_burst(self, data: st.DataObject, n: int) -> None:
            """Several requests arrive together (queueing and preemption pressure)."""
            for _ in range(n):
                self.run("submit", self.harness.submit, self._request(data))

        @rule(data=st.data(), n=st.integers(2, 4))
        def submit_arrivals(self, data: st.DataObject, n: int) -> None:
            """Requests arriving one per step while earlier ones run: under priority a more
            important request can arrive after a less important one was admitted, and the
            growing running set meets a full pool (preemption within a step)."""
            for _ in range(n):
                priority = data.draw(st.integers(0, 3), "priority")
                self.run("submit", self.harness.submit, self._request(data, priority=priority))
                self.run("step", self.harness.step)

        @rule()
        def step(self) -> None:
            self.run("step", self.harness.step)

        @rule()
        def steps(self) -> None:
            """Several steps at once (long requests get to finish)."""
            for _ in range(4):
                self.run("step", self.harness.step)

        def failing_example(self) -> ArExample | None:
            h = self.h
            if h is None:
                return None
            return ArExample(h.config, h.policy, tuple(h.ops), twin, twin_policy)

        def teardown_checks(self) -> None:
            if twin is None:
                return
            h = self.harness
            differs = twin_difference(h.ops, h.events, h.config, twin, twin_policy)
            if differs is not None:
                raise h._violate("twin_decisions", differs)

    if not drafts:
        ArConformance.__name__ = name
        ArConformance.__qualname__ = name
        return ArConformance

    class ArDraftingConformance(ArConformance):
        # a subclass, so that the suites without drafts draw their rules as before
        @precondition(lambda self: self.h is not None and self.h.config.num_speculative_tokens)
        @rule(data=st.data())
        def propose(self, data: st.DataObject) -> None:
            """The drafter proposes 1 to k drafts for a decoding request's next step; the
            model will accept the first few of those the step schedules."""
            decoding = self.harness.spec.decoding_requests()
            if not decoding:
                return
            rid = data.draw(st.sampled_from(decoding), "request")
            k = self.harness.config.num_speculative_tokens
            drafts = data.draw(st.integers(1, k), "drafts")
            accepted = data.draw(st.integers(0, drafts), "accepted")
            self.run("propose_drafts", self.harness.propose_drafts, rid, drafts, accepted)

    ArDraftingConformance.__name__ = ArDraftingConformance.__qualname__ = name
    return ArDraftingConformance


__all__ = ["DEFAULT_POLICIES", "ar_conformance_machine"]
