"""AR implementation profiles: the policy options are parameters of the rules (each can make a
run pass that the idealised spec fails, and vice versa), the configuration space bounds the
strategies, and self-contradicting profiles are refused with a typed error."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from properties.ar.strategies import ar_configs_in
from spec.ar.config import ArConfig, ArRules, Policy, VictimOrder
from spec.ar.events import (
    ArBlocksAllocated,
    ArEvent,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile
from spec.errors import ConfigError, SpecViolation
from spec.profile import AcceptedDeviation, ConfigOutsideProfile, ProfileError


def _rule(config: ArConfig, policy: ArPolicy | None, events: list[ArEvent]) -> str | None:
    m = ArSpecMachine(config, policy)
    try:
        for e in events:
            m.apply(e)
            m.check_invariants()
    except SpecViolation as v:
        return v.rule
    return None


def test_lone_request_threshold_exemption() -> None:
    cfg = ArConfig(block_size=4, num_blocks=9, long_prefill_token_threshold=4)
    alone: list[ArEvent] = [
        ArSubmitted("a", 8, 2),
        ArBlocksAllocated("a", (1, 2)),
        ArScheduled("a", 8),
    ]
    exempt = ArPolicy(lone_request_threshold_exempt=True)
    assert _rule(cfg, None, alone) == "long_prefill_threshold"
    assert _rule(cfg, exempt, alone) is None
    # not alone: another request waits, so the threshold binds again
    crowded = [alone[0], ArSubmitted("b", 2, 2), *alone[1:]]
    assert _rule(cfg, exempt, crowded) == "long_prefill_threshold"


def _priority_steps() -> list[ArEvent]:
    """a (priority 0) and b (priority 5) run; in step 1 b is scheduled first, then a needs a
    block: vLLM 0.33 preempts b (the lowest priority among all running), unscheduling it."""
    return [
        ArSubmitted("b", 4, 4, priority=5),
        ArSubmitted("a", 4, 4, priority=0),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 4),
        ArBlocksAllocated("b", (2,)),
        ArScheduled("b", 4),
        ArStepEnd(0),
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", 1),
        ArPreempted("b", (2, 3)),
        ArBlocksAllocated("a", (2,)),
        ArScheduled("a", 1),
        ArStepEnd(1),
    ]


def test_victim_among_all_running_with_unscheduling() -> None:
    cfg = ArConfig(
        block_size=4,
        num_blocks=4,
        max_num_batched_tokens=8,
        max_model_len=8,
        policy=Policy.PRIORITY,
    )
    assert _rule(cfg, None, _priority_steps()) == "no_preempt_scheduled"
    policy = ArPolicy(victim=VictimOrder.LOWEST_PRIORITY_ANY)
    m = ArSpecMachine(cfg, policy)
    m.apply_all(_priority_steps())
    m.check_invariants(between_steps=True)
    assert m.state().scheduled == {}  # the new step; b's tokens went back in step 1
    assert m.request_phase("b") is not None and m.state().requests["b"].num_computed == 0
    # the victim must still be the lowest priority: preempting a instead is refused
    wrong = _priority_steps()
    wrong[9] = ArPreempted("a", (1,))
    assert _rule(cfg, policy, wrong) == "preemption_victim"


def test_full_sequence_admission_gate() -> None:
    # b holds 2 blocks; a's 6-token prompt needs 3, and its first chunk takes the last 2
    tight = ArConfig(block_size=2, num_blocks=5, max_num_batched_tokens=8, max_model_len=8)
    events: list[ArEvent] = [
        ArSubmitted("b", 4, 1),
        ArSubmitted("a", 6, 1),
        ArBlocksAllocated("b", (1, 2)),
        ArScheduled("b", 4),
        ArBlocksAllocated("a", (3, 4)),
        ArScheduled("a", 4),
    ]
    gate = ArPolicy(full_sequence_admission=True)
    assert _rule(tight, None, events) is None  # only the chunk must fit
    assert _rule(tight, gate, events) == "full_sequence_admission"
    roomy = tight.replace(num_blocks=6)  # one block more: the whole prompt fits
    assert _rule(roomy, gate, events) is None


# a's 7-token prompt admitted alone into blocks 1-4 (of 9 usable, blocks of 2 tokens)
A_TAKES_FOUR_BLOCKS: list[ArEvent] = [
    ArSubmitted("a", 7, 1),
    ArBlocksAllocated("a", (1, 2, 3, 4)),
    ArScheduled("a", 7),
]


def test_watermark() -> None:
    cfg = ArConfig(block_size=2, num_blocks=10, max_num_batched_tokens=8, max_model_len=8)
    events = A_TAKES_FOUR_BLOCKS
    # 9 usable blocks (the null block reserved), 4 taken: 5 stay free. The watermark is a
    # fraction of the usable blocks: int(0.67 * 9) = 6 is broken, int(0.6 * 9) = 5 is kept
    # (int(0.6 * 10) = 6 would count the null block, which Vidur's pool does not have)
    assert _rule(cfg, ArPolicy(watermark_fraction=0.67), events) == "admission_watermark"
    assert _rule(cfg, ArPolicy(watermark_fraction=0.6), events) is None


def test_a_watermark_of_the_pool_counts_the_null_block() -> None:
    cfg = ArConfig(block_size=2, num_blocks=10, max_num_batched_tokens=8, max_model_len=8)
    events = A_TAKES_FOUR_BLOCKS
    # as test_watermark: 5 of 9 usable blocks stay free; of the pool (vLLM's) 0.6 is
    # int(0.6 * 10) = 6 > 5
    pool = ArPolicy(watermark_fraction=0.6, watermark_of_pool=True)
    assert pool.watermark_blocks(cfg) == 6
    assert _rule(cfg, pool, events) == "admission_watermark"


def test_a_watermark_beside_running_binds_only_while_a_request_runs() -> None:
    cfg = ArConfig(block_size=2, num_blocks=10, max_num_batched_tokens=16, max_model_len=8)
    # a, alone, takes 4 of 9 usable blocks (5 free < the watermark of 6): legal beside
    # nothing. b, admitted next in the same step beside a, takes 1 more: 4 free < 6.
    alone = A_TAKES_FOUR_BLOCKS
    beside = [*alone, ArSubmitted("b", 2, 1), ArBlocksAllocated("b", (5,)), ArScheduled("b", 2)]
    vllm = ArPolicy(watermark_fraction=0.6, watermark_of_pool=True, watermark_beside_running=True)
    assert _rule(cfg, vllm, alone) is None
    assert _rule(cfg, vllm, beside) == "admission_watermark"
    always = dataclasses.replace(vllm, watermark_beside_running=False)
    assert _rule(cfg, always, alone) == "admission_watermark"


def test_the_whole_sequence_must_fit_above_a_binding_watermark() -> None:
    cfg = ArConfig(block_size=2, num_blocks=11, max_num_batched_tokens=8, max_model_len=12)
    # a runs in 2 blocks; b's first chunk of 2 tokens takes 1 block and leaves 7 of 10 usable
    # free; its whole 10-token prompt needs 4 more: 7 - 4 = 3 < the watermark int(0.4 * 11) = 4
    events: list[ArEvent] = [
        ArSubmitted("a", 4, 1),
        ArBlocksAllocated("a", (1, 2)),
        ArScheduled("a", 4),
        ArSubmitted("b", 10, 1),
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", 2),
    ]
    gate = ArPolicy(full_sequence_admission=True, watermark_fraction=0.4, watermark_of_pool=True)
    assert _rule(cfg, dataclasses.replace(gate, watermark_fraction=0.0), events) is None
    assert _rule(cfg, gate, events) == "full_sequence_admission"
    assert _rule(cfg, dataclasses.replace(gate, watermark_fraction=0.3), events) is None


def test_an_adaptive_threshold_is_floored_at_a_fair_share_of_the_budget() -> None:
    cfg = ArConfig(
        block_size=2,
        num_blocks=20,
        max_num_batched_tokens=12,
        max_model_len=16,
        long_prefill_token_threshold=2,
    )

    # two requests waiting: the floor is 12 // 2 = 6 tokens each
    def chunks(first: int, second: int) -> list[ArEvent]:
        return [
            ArSubmitted("a", 10, 1),
            ArSubmitted("b", 10, 1),
            ArBlocksAllocated("a", tuple(range(1, 1 + -(-first // 2)))),
            ArScheduled("a", first),
            ArBlocksAllocated("b", tuple(range(10, 10 + -(-second // 2)))),
            ArScheduled("b", second),
        ]

    adaptive = ArPolicy(adaptive_long_prefill_threshold=True)
    assert _rule(cfg, adaptive, chunks(6, 6)) is None
    assert _rule(cfg, None, chunks(6, 6)) == "long_prefill_threshold"
    m = ArSpecMachine(cfg, adaptive)
    with pytest.raises(SpecViolation, match=r"7 tokens > 6, the adaptive floor") as err:
        for e in chunks(7, 5):
            m.apply(e)
    assert err.value.rule == "long_prefill_threshold"
    # without a threshold there is nothing to floor
    assert _rule(cfg.replace(long_prefill_token_threshold=0), adaptive, chunks(8, 4)) is None


def _cadence_run(b_admitted_in: int) -> list[ArEvent]:
    """a (a 4-token prompt, many outputs) prefills in step 0 and decodes from then on; b (an
    8-token prompt) arrives after step 0 and is admitted in step `b_admitted_in`."""
    events: list[ArEvent] = [
        ArSubmitted("a", 4, 12),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 4),
        ArStepEnd(0),
        ArSubmitted("b", 8, 1),
    ]
    for step in range(1, b_admitted_in + 1):
        if step % 4 == 1:  # its token 4 + step - 1 starts a block
            events.append(ArBlocksAllocated("a", (2 + step // 4,)))
        events.append(ArScheduled("a", 1))
        if step == b_admitted_in:
            events += [ArBlocksAllocated("b", (8, 9)), ArScheduled("b", 8)]
        events.append(ArStepEnd(step))
    return events


def test_prefill_cadence_holds_prefill_while_a_request_decodes() -> None:
    cfg = ArConfig(block_size=4, num_blocks=12, max_num_batched_tokens=16, max_model_len=24)
    cadence = ArPolicy(prefill_interval=3)
    # step 0 carried a's prefill (executed step 1); steps 1 and 2 (executed 2 and 3) are held
    # while a decodes; step 3 (executed 4) is the next that may carry prefill
    assert _rule(cfg, cadence, _cadence_run(3)) is None
    assert _rule(cfg, cadence, _cadence_run(2)) == "prefill_cadence"
    assert _rule(cfg, None, _cadence_run(1)) is None  # no cadence declared
    m = ArSpecMachine(cfg, cadence)
    with pytest.raises(SpecViolation, match=r"'b' admitted with 8 tokens to compute in step 1"):
        for e in _cadence_run(1):
            m.apply(e)


def test_prefill_cadence_lifts_while_the_last_release_step_left_requests_waiting() -> None:
    """A budget of 4: a's prompt takes all of step 0, so b, already waiting, is left waiting
    by that release step (the capacity escape) and step 1 may admit it beside a's decode.
    Had b arrived after step 0, step 1 would be held."""
    cfg = ArConfig(block_size=4, num_blocks=12, max_num_batched_tokens=4, max_model_len=24)

    def run(b_before_step_0: bool) -> list[ArEvent]:
        b = ArSubmitted("b", 8, 1)
        return [
            ArSubmitted("a", 4, 12),
            *([b] if b_before_step_0 else []),
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 4),
            ArStepEnd(0),
            *([] if b_before_step_0 else [b]),
            ArBlocksAllocated("a", (2,)),
            ArScheduled("a", 1),
            ArBlocksAllocated("b", (8,)),
            ArScheduled("b", 3),
            ArStepEnd(1),
        ]

    cadence = ArPolicy(prefill_interval=3)
    assert _rule(cfg, cadence, run(b_before_step_0=True)) is None
    assert _rule(cfg, cadence, run(b_before_step_0=False)) == "prefill_cadence"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prefill_interval": 0}, "policy.prefill_interval"),
        ({"prefill_interval": True}, "policy.prefill_interval"),
        ({"watermark_fraction": 1.5}, "policy.watermark_fraction"),
        ({"adaptive_long_prefill_threshold": 0}, "policy.adaptive_long_prefill_threshold"),
        ({"watermark_of_pool": 1}, "policy.watermark_of_pool"),
        ({"watermark_beside_running": "yes"}, "policy.watermark_beside_running"),
        ({"watermark_fraction": True}, "policy.watermark_fraction"),
        ({"victim": "tail"}, "policy.victim"),
        ({"full_sequence_admission": 1}, "policy.full_sequence_admission"),
        ({"admit_after_preemption": "yes"}, "policy.admit_after_preemption"),
        ({"rules": {}}, "policy.rules"),
    ],
)
def test_bad_policy_is_a_typed_error(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ProfileError) as err:
        ArPolicy(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_bad_space_and_profile() -> None:
    with pytest.raises(ProfileError):
        ArConfigSpace(prefix_caching=frozenset())
    with pytest.raises(ProfileError):
        ArConfigSpace(stages=frozenset({0}))
    with pytest.raises(ProfileError):
        ArProfile(
            deviations=(AcceptedDeviation("progress", "a"), AcceptedDeviation("progress", "b"))
        )
    with pytest.raises(ProfileError) as err:
        ArProfile(deviations=(AcceptedDeviation("no_such_rule", "a"),))
    assert err.value.field == "deviations"


def test_config_outside_space_names_the_field() -> None:
    space = ArConfigSpace(
        policies=frozenset({Policy.FCFS}),
        prefix_caching=frozenset({False}),
        long_prefill_threshold=False,
        pool_holds_max_model_len=True,
    )
    with pytest.raises(ConfigOutsideProfile) as err:
        space.check(ArConfig(enable_prefix_caching=True))
    assert err.value.field == "enable_prefix_caching"
    with pytest.raises(ConfigOutsideProfile) as err:
        space.check(ArConfig(long_prefill_token_threshold=2))
    assert err.value.field == "long_prefill_token_threshold"
    with pytest.raises(ConfigOutsideProfile) as err:
        space.check(ArConfig(num_blocks=4, max_model_len=32))
    assert err.value.field == "num_blocks"
    assert isinstance(err.value, ConfigError)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    config=ar_configs_in(
        ArConfigSpace(
            policies=frozenset({Policy.SJF}),
            block_sizes=frozenset({2}),
            chunked_prefill=frozenset({True}),
            prefix_caching=frozenset({True}),
            null_block=frozenset({True}),
            long_prefill_threshold=False,
            pool_holds_max_model_len=True,
        )
    )
)
def test_strategies_draw_inside_the_space(config: ArConfig) -> None:
    assert config.policy is Policy.SJF and config.block_size == 2
    assert config.enable_chunked_prefill and config.enable_prefix_caching
    assert config.reserve_null_block and config.long_prefill_token_threshold == 0
    assert config.usable_blocks >= config.max_blocks_per_request


def test_policy_overrides_rules() -> None:
    cfg = ArConfig(policy=Policy.PRIORITY)
    rules = ArPolicy(victim=VictimOrder.LOWEST_PRIORITY_ANY, admit_after_preemption=True)
    eff = rules.rules_for(cfg)
    assert eff.victim is VictimOrder.LOWEST_PRIORITY_ANY and eff.admit_after_preemption
    assert ArPolicy(rules=ArRules(token_budget=False)).rules_for(cfg).token_budget is False


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_blocks", 10**12),
        ("block_size", "4"),
        ("max_num_seqs", -1),
        ("enable_prefix_caching", 1),
        ("num_stages", 0),
        ("max_model_len", 1.5),
    ],
)
def test_config_types_and_bounds(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        ArConfig(**{field: value})  # type: ignore[arg-type]
    assert err.value.field == field


def test_accepted_deviations_and_campaign_hook() -> None:
    """A rule in `ignored_rules` (the profile's accepted deviations, or a campaign's) makes an
    example invalid instead of failing it, and each hit is counted in `ignored_hits`."""
    from hypothesis import Phase, settings

    from properties.ar.conformance import ar_conformance_machine
    from properties.verify import run_machine
    from tests.ar_mutants import AR_MUTANTS

    hunt = settings(
        phases=[Phase.generate],
        max_examples=150,
        derandomize=True,
        deadline=None,
        database=None,
        stateful_step_count=20,
        suppress_health_check=list(HealthCheck),
    )
    mutant = AR_MUTANTS["budget_overflow"]
    plain = ar_conformance_machine(mutant.factory, configs=mutant.configs)
    err, _ = run_machine(plain, hunt)
    assert isinstance(err, SpecViolation) and err.rule == "token_budget"
    accepted = ArProfile(deviations=(AcceptedDeviation("token_budget", "known: one over"),))
    machine = ar_conformance_machine(mutant.factory, profile=accepted, configs=mutant.configs)
    err, _ = run_machine(machine, settings(hunt, max_examples=40))
    assert err is None or getattr(err, "rule", None) != "token_budget"
    assert machine.ignored_hits.get("token_budget", 0) > 0  # type: ignore[attr-defined]


def test_a_pool_with_spare_tokens_is_named_when_too_small() -> None:
    """LightLLM's space: the pool holds max_model_len and one token more (its router refuses a
    request with prompt + max_new_tokens + 1 > pool)."""
    space = ArConfigSpace(block_sizes=frozenset({1}), pool_holds_max_model_len=True)
    spared = dataclasses.replace(space, pool_spare_tokens=1)
    exact = ArConfig(block_size=1, num_blocks=8, reserve_null_block=False, max_model_len=8)
    assert space.outside(exact) is None
    assert spared.outside(exact) == (
        "num_blocks",
        8,
        "a usable pool of at least 9 blocks (max_model_len=8 per request and 1 spare)",
    )
    assert spared.outside(exact.replace(num_blocks=9)) is None
    bad: object
    for bad in (-1, True, 1.5):
        with pytest.raises(ProfileError, match=r"space\.pool_spare_tokens"):
            dataclasses.replace(space, pool_spare_tokens=bad)  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match="unless pool_holds_max_model_len"):
        ArConfigSpace(pool_spare_tokens=1)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    config=ar_configs_in(
        ArConfigSpace(
            block_sizes=frozenset({1}),
            pool_holds_max_model_len=True,
            pool_spare_tokens=1,
        )
    )
)
def test_strategies_draw_pools_with_the_spare_tokens(config: ArConfig) -> None:
    assert config.usable_blocks >= config.max_model_len + 1


def test_an_ar_space_covers_another_only_where_it_runs_all_of_its_configurations() -> None:
    """`ArConfigSpace.uncovered` names the first kind of configuration the other space allows
    and this one refuses (a decision twin must run every configuration of what it checks)."""
    from spec.ar.profile import CacheReadLimits

    anything = ArConfigSpace()
    assert anything.uncovered(anything) is None
    fcfs = ArConfigSpace(policies=frozenset({Policy.FCFS}))
    assert anything.uncovered(fcfs) is None
    gap = fcfs.uncovered(anything)
    assert gap is not None and gap.startswith("policy={aging"), gap
    cases = [
        (ArConfigSpace(block_sizes=frozenset({2})), anything, "block_size=any (this space: {2})"),
        (
            ArConfigSpace(prefix_caching=frozenset({False})),
            anything,
            "enable_prefix_caching={True}",
        ),
        (
            ArConfigSpace(long_prefill_threshold=False),
            anything,
            "long_prefill_token_threshold other than 0",
        ),
        (
            ArConfigSpace(pool_holds_max_model_len=True, pool_spare_tokens=1),
            ArConfigSpace(pool_holds_max_model_len=True),
            "pools that do not hold one max_model_len request and 1 spare tokens",
        ),
        (
            ArConfigSpace(cache_read_limits=CacheReadLimits.SKIP),
            ArConfigSpace(cache_read_limits=CacheReadLimits.BOUNDED),
            "cache read limits bounded (this space: skip)",
        ),
        (
            ArConfigSpace(cache_read_limits=CacheReadLimits.BOUNDED),
            ArConfigSpace(cache_read_limits=CacheReadLimits.SKIP),
            None,
        ),
        (
            ArConfigSpace(stages=frozenset({1})),
            ArConfigSpace(stages=None),
            "num_stages=any (this space: {1})",
        ),
    ]
    for twin, checked, said in cases:
        assert twin.uncovered(checked) == said, (twin, checked, twin.uncovered(checked))
