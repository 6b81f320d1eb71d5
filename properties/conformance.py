"""The stateful dLLM conformance machine, generic over an implementation factory.

`conformance_machine(factory, profile=...)` returns a Hypothesis `RuleBasedStateMachine` class
(built on `properties.conformance_base.ConformanceBase`, which brings the abort rules, drain,
teardown, step counting, implementation-error findings and `ignored_rules`) whose own rules
configure, submit one request or a burst of them, and run a round, all through `Harness`
(every event replayed into the spec, invariants after every event, snapshot, reported outputs
and golden outputs after every round). At
teardown it drains, checks for leaks and checks parity against each request's solo sync
output. A failure prints a shrunk, copy-pasteable program of `state.<rule>(...)` calls.

Configurations are drawn inside the profile's declared space and the spec machine gets the
profile's policy; the profile's accepted deviations start in `ignored_rules`.
"""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    multiple,
    rule,
)

from properties.conformance_base import ConformanceBase, StepCounter
from properties.decisions import DecisionTwin, twin_difference
from properties.example import DllmExample, ParityPolicy
from properties.harness import Harness, SoloCache, check_parity
from properties.strategies import (
    dllm_configs,
    prompts,
    shared_stem_prompts,
    stop_token_id_sets,
)
from spec.adapter import ImplementationFactory
from spec.config import DllmConfig, RequestSpec
from spec.profile import DllmProfile

# A burst is one more request than the largest running cap `dllm_configs` draws by default (4).
_BURST_MAX = 5

_DEFAULT_PROFILE = DllmProfile()


def conformance_machine(
    factory: ImplementationFactory,
    *,
    profile: DllmProfile = _DEFAULT_PROFILE,
    configs: st.SearchStrategy[DllmConfig] | None = None,
    parity: ParityPolicy = "always",
    counter: StepCounter | None = None,
    name: str = "Conformance",
    golden: bool = True,
    twin: DecisionTwin | None = None,
    twin_profile: DllmProfile | None = None,
    prompt_strategy: st.SearchStrategy[tuple[int, ...]] | None = None,
) -> type[RuleBasedStateMachine]:
    """A state machine class checking `factory`'s implementation against the spec.

    profile: the implementation's declared space, policy and accepted deviations.
    configs: overrides the configurations drawn (each must lie inside `profile.space`, else the
        example fails with `ConfigOutsideProfile`).
    parity: "always" when outputs must not depend on batching (the reference), "bs1" when only
        batch-size-1 runs must match sync (a real model with batch-dependent float kernels),
        "never" to skip the output check.
    golden: check every finished request against the implementation's golden decoder after
        every round (rule `golden_output`) when it has one (`spec.golden.GoldenDecoder`).
    twin: a decision twin (`properties.decisions.DecisionTwin`): at the end of every example
        the example's operations run through it and must admit and forward exactly as the
        implementation did (rule `twin_decisions`); it is checked against the spec under
        `twin_profile` (default: `profile`).
    prompt_strategy: the prompts drawn (default `prompts(20)`, or `shared_stem_prompts(20)` for
        an implementation whose space has only `prefix_cache=True`, so that requests share
        prefixes).
    """
    config_strategy = configs if configs is not None else dllm_configs(space=profile.space)
    if prompt_strategy is None:  # a cache-only implementation gets prompts that share stems
        cache_only = profile.space.prefix_cache == frozenset({True})
        prompt_strategy = shared_stem_prompts(20) if cache_only else prompts(20)
    prompt = prompt_strategy
    new_tokens = st.integers(1, 20)
    # for an implementation that takes the option: ignore_eos on a quarter of the requests,
    # stop token ids on half (`stop_token_id_sets`); nothing drawn otherwise
    ignore_eos = st.integers(0, 3).map(lambda n: n == 3) if profile.ignore_eos else st.just(False)
    stop_ids = stop_token_id_sets() if profile.stop_token_ids else st.just(())
    burst_fields: dict[str, st.SearchStrategy[Any]] = {
        "prompt": prompt,
        "max_new_tokens": new_tokens,
    }
    if profile.ignore_eos:
        burst_fields["ignore_eos"] = ignore_eos
    if profile.stop_token_ids:
        burst_fields["stop_token_ids"] = stop_ids
    # under a priority-ordered queue, priorities 0-2 (ties common, so submission order still
    # decides between some); drawn only then, so other programs print as before
    submit_rule = functools.partial(
        rule,
        target=ConformanceBase.requests,
        prompt=prompt,
        max_new_tokens=new_tokens,
        ignore_eos=ignore_eos,
        stop_token_ids=stop_ids,
    )
    if profile.policy.priority_order:
        burst_fields["priority"] = st.integers(0, 2)
        submit_rule = functools.partial(submit_rule, priority=burst_fields["priority"])
    burst_request = st.fixed_dictionaries(burst_fields)
    solo_cache: SoloCache = {}
    step_counter = counter or StepCounter()

    class Conformance(ConformanceBase[Harness]):
        ignored_rules = frozenset(d.rule for d in profile.deviations)
        ignored_hits = {}  # noqa: RUF012 - the class-level counter, by design
        counter = step_counter

        @initialize(config=config_strategy)
        def configure(self, config: DllmConfig) -> None:
            self.build(
                lambda: Harness(
                    factory,
                    config,
                    profile=profile,
                    check_golden=golden,
                    on_golden_tie=step_counter.golden_tie,
                ),
                f"configure(config={config!r})",
            )

        def clock(self) -> int:
            return self.harness.spec.round_index

        def ended(self) -> int:
            return self.harness.ended_rounds()

        @submit_rule()
        def submit(
            self,
            prompt: tuple[int, ...],
            max_new_tokens: int,
            ignore_eos: bool,
            stop_token_ids: tuple[int, ...],
            priority: int = 0,
        ) -> str | MultipleResults[str]:
            """Submit a request (rejected with a typed error if it cannot fit the config), some
            ignoring EOS (`RequestSpec.ignore_eos`) or with stop token ids when the profile
            says it takes them, with a priority when its queue is in priority order."""
            rid = self.new_id()
            request = RequestSpec(
                rid,
                prompt,
                max_new_tokens,
                ignore_eos=ignore_eos,
                stop_token_ids=stop_token_ids,
                priority=priority,
            )
            err = self.run("submit", self.harness.submit, request)
            return multiple() if err is not None else rid

        @rule(
            target=ConformanceBase.requests,
            burst=st.lists(burst_request, min_size=2, max_size=_BURST_MAX),
        )
        def submit_burst(self, burst: list[dict[str, Any]]) -> MultipleResults[str]:
            """Several requests (each drawn as `submit` draws one, as `RequestSpec` fields)
            arrive before the next round: one admission sees a queue longer than the largest
            running cap drawn, where an off-by-one cap or an out-of-order admission shows.
            Single submits reach that only through several submit rules in a row, rarely. The
            accepted ones join `requests`."""
            accepted: list[str] = []
            for fields in burst:
                rid = self.new_id()
                err = self.run("submit", self.harness.submit, RequestSpec(rid, **fields))
                if err is None:
                    accepted.append(rid)
            return multiple(*accepted)

        @rule()
        def round(self) -> None:
            self.run("run_round", self.harness.round)

        def failing_example(self) -> DllmExample | None:
            h = self.h
            if h is None:
                return None
            return DllmExample(h.config, profile, tuple(h.ops), parity, golden, twin, twin_profile)

        def teardown_checks(self) -> None:
            h = self.harness
            if parity == "always" or (parity == "bs1" and h.config.max_running_requests == 1):
                h.guarded("parity", check_parity, h, solo_cache)
            if twin is not None:
                differs = twin_difference(h.events, h.config, twin, twin_profile or profile)
                if differs is not None:
                    raise h._violate("twin_decisions", differs)

    Conformance.__name__ = name
    Conformance.__qualname__ = name
    return Conformance


__all__ = ["ParityPolicy", "StepCounter", "conformance_machine"]
