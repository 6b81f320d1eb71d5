"""The reference vllm-v1 scheduler: conformance under every policy, hand-checked decisions,
bad configuration and bad requests."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from properties.ar.strategies import ar_configs
from reference.ar.vllm_v1 import VLLM_V1, make_vllm_v1
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig, ArRequest, ArRequestTooLong, Policy
from spec.ar.events import ArFinished, ArFinishReason, ArPreempted, ArScheduled, ArStepEnd
from spec.errors import ConfigError, RequestTooLarge, UnknownRequest
from spec.implementation import ArImplementation

RUN = settings(
    max_examples=60,
    deadline=None,
    stateful_step_count=30,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("policy", list(Policy), ids=[p.value for p in Policy])
def test_vllm_v1_conforms(policy: Policy) -> None:
    machine = ar_conformance_machine(make_vllm_v1, configs=ar_configs(policies=(policy,)))
    run_state_machine_as_test(machine, settings=RUN)


def _h(**kw: object) -> ArHarness:
    return ArHarness(make_vllm_v1, ArConfig(**kw))  # type: ignore[arg-type]


def test_chunked_prefill_then_decode() -> None:
    h = _h(block_size=4, num_blocks=9, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=16)
    h.submit(ArRequest("a", 10, 3))
    h.drain()
    sched = [e.num_tokens for e in h.events if isinstance(e, ArScheduled)]
    assert sched == [4, 4, 2, 1, 1]  # chunks of the budget, then one token per decode step
    assert h.outputs() == {"a": 3}


def test_long_prefill_threshold() -> None:
    h = _h(max_num_batched_tokens=16, max_model_len=16, long_prefill_token_threshold=3)
    h.submit(ArRequest("a", 7, 1))
    h.drain()
    assert [e.num_tokens for e in h.events if isinstance(e, ArScheduled)] == [3, 3, 1]


def test_preempts_the_tail_and_recomputes() -> None:
    # 4 usable blocks of 2 tokens; two requests that each grow to 4 blocks.
    h = _h(block_size=2, num_blocks=5, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=9)
    h.submit(ArRequest("a", 3, 5))
    h.submit(ArRequest("b", 3, 5))
    h.drain()
    pre = [e for e in h.events if isinstance(e, ArPreempted)]
    assert pre and pre[0].request_id == "b"  # the tail, never the head
    assert h.outputs() == {"a": 5, "b": 5}
    assert 0 not in {b for e in pre for b in e.freed}  # the null block is never handed out


def test_priority_preempts_lowest_priority() -> None:
    h = _h(
        block_size=2,
        num_blocks=5,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=9,
        policy="priority",
    )
    h.submit(ArRequest("low", 3, 5, priority=5))
    h.submit(ArRequest("high", 3, 5, priority=0))
    h.drain()
    pre = [e.request_id for e in h.events if isinstance(e, ArPreempted)]
    assert pre and set(pre) == {"low"}


def _first_scheduled(h: ArHarness) -> list[str]:
    seen: list[str] = []
    for e in h.events:
        if isinstance(e, ArScheduled) and e.request_id not in seen:
            seen.append(e.request_id)
    return seen


def test_priority_soft_arrival_waits_for_a_seat() -> None:
    """A high-priority arrival does not evict a running request: it joins when the seat frees,
    ahead of a lower-priority request that waited longer."""
    h = _h(max_num_seqs=1, policy="priority-soft")
    h.submit(ArRequest("low", 2, 3, priority=5))
    h.step()
    h.submit(ArRequest("mid", 2, 2, priority=3))
    h.submit(ArRequest("high", 2, 2, priority=0))
    h.drain()
    assert not any(isinstance(e, ArPreempted) for e in h.events)
    assert _first_scheduled(h) == ["low", "high", "mid"]
    assert h.outputs() == {"low": 3, "mid": 2, "high": 2}


def test_priority_soft_shrinks_a_chunk_before_preempting() -> None:
    """7 usable one-token blocks. In step 2 "high" (mid-prefill) wants 3 tokens with 1 block
    free: priority preempts it (it is the only unscheduled running request); soft preemption
    computes 1 token instead and evicts nobody."""
    by_policy = {}
    for policy in ("priority", "priority-soft"):
        h = _h(
            block_size=1,
            num_blocks=8,
            max_num_batched_tokens=4,
            max_num_seqs=2,
            max_model_len=8,
            policy=policy,
        )
        h.submit(ArRequest("low", 1, 4, priority=5))
        h.step()
        h.submit(ArRequest("high", 6, 1, priority=0))
        h.step()
        start = len(h.events)
        h.step()
        by_policy[policy] = [
            (type(e).__name__, e.request_id)
            for e in h.events[start:]
            if isinstance(e, ArScheduled | ArPreempted)
        ]
        h.drain()
        assert h.outputs() == {"low": 4, "high": 1}
    assert by_policy["priority"] == [("ArScheduled", "low"), ("ArPreempted", "high")]
    assert by_policy["priority-soft"] == [("ArScheduled", "low"), ("ArScheduled", "high")]


def test_stop_token_and_abort_from_every_state() -> None:
    h = _h(max_num_seqs=1)
    h.submit(ArRequest("s", 2, 8, stop_after=2))
    h.submit(ArRequest("w", 2, 8))
    h.step()
    h.abort("w")  # waiting
    h.drain()
    fin = [e for e in h.events if isinstance(e, ArFinished)]
    assert fin == [ArFinished("s", ArFinishReason.STOP)]
    h.submit(ArRequest("r", 2, 8))
    h.step()
    h.abort("r")  # running, holding blocks
    assert isinstance(h.abort("r"), UnknownRequest)
    assert h.impl.snapshot().held_blocks() == 0


@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("block_size", {"block_size": 0}),
        ("max_num_batched_tokens", {"max_num_batched_tokens": 0}),
        ("max_num_seqs", {"max_num_seqs": 0}),
        ("num_blocks", {"num_blocks": 1}),
        ("max_num_batched_tokens", {"max_num_seqs": 8, "max_num_batched_tokens": 4}),
        ("max_num_batched_tokens", {"enable_chunked_prefill": False}),
        ("policy", {"policy": "lottery"}),
        ("long_prefill_token_threshold", {"long_prefill_token_threshold": -1}),
    ],
)
def test_bad_config_names_the_field(field: str, kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as err:
        ArConfig(**kw)  # type: ignore[arg-type]
    assert err.value.field == field


def test_bad_requests_are_typed_errors() -> None:
    h = _h(block_size=4, num_blocks=3, max_model_len=32)  # 2 usable blocks = 8 tokens
    assert isinstance(h.submit(ArRequest("long", 30, 8)), ArRequestTooLong)
    assert isinstance(h.submit(ArRequest("huge", 10, 2)), RequestTooLarge)
    assert h.events == []  # nothing was accepted, nothing loops


# ---------------------------------------------------------------- vLLM 0.33.0's options (VLLM_V1)
def _priority_run(factory: ArImplementationFactory) -> list[tuple[str, bool]]:
    """3 usable blocks of 2 tokens: "low" (priority 5) runs first, "high" (priority 0) joins
    behind it in the running order; both grow until the pool is short. Returns each preempted
    request and whether "low" had been scheduled earlier in that step."""
    h = ArHarness(
        factory,
        ArConfig(
            block_size=2,
            num_blocks=4,
            max_num_batched_tokens=8,
            max_num_seqs=2,
            max_model_len=12,
            policy=Policy.PRIORITY,
        ),
    )
    h.submit(ArRequest("low", 1, 3, priority=5))
    h.step()
    h.submit(ArRequest("high", 2, 2, priority=0))
    h.drain()
    assert h.violation is None
    assert h.outputs() == {"low": 3, "high": 2}
    out: list[tuple[str, bool]] = []
    scheduled: set[str] = set()
    for e in h.events:
        if isinstance(e, ArScheduled):
            scheduled.add(e.request_id)
        elif isinstance(e, ArPreempted):
            out.append((e.request_id, "low" in scheduled))
            scheduled.discard(e.request_id)
        elif isinstance(e, ArStepEnd):
            scheduled = set()
    return out


def test_idealised_priority_victim_inverts_priorities() -> None:
    """The idealised reference chooses among requests not yet scheduled: "low" was scheduled
    first in the step, so "high" preempts itself while "low" keeps running."""
    assert ("high", True) in _priority_run(make_vllm_v1)


def test_vllm_033_priority_victim_is_the_lowest_priority_of_all_running() -> None:
    """VLLM_V1 (vLLM 0.33.0's rule): "low" is the victim even though it was already scheduled;
    it is unscheduled and "high" never waits for it."""
    assert {rid for rid, _ in _priority_run(VLLM_V1.factory)} == {"low"}


def test_vllm_033_lone_request_ignores_the_threshold() -> None:
    h = ArHarness(
        VLLM_V1.factory,
        ArConfig(max_num_batched_tokens=16, max_model_len=16, long_prefill_token_threshold=3),
        policy=VLLM_V1.profile.policy,
    )
    h.submit(ArRequest("a", 7, 1))
    h.drain()
    assert [e.num_tokens for e in h.events if isinstance(e, ArScheduled)] == [7]


def test_vllm_033_admits_only_when_the_whole_sequence_fits() -> None:
    """As tests/test_real_vllm.py checks on vLLM itself: "b" could start its first chunk but
    waits until all 4 of its blocks fit."""
    by_factory = {}
    for name, factory in (("ideal", make_vllm_v1), ("033", VLLM_V1.factory)):
        h = ArHarness(
            factory,
            ArConfig(
                block_size=2,
                num_blocks=7,
                max_num_batched_tokens=4,
                max_num_seqs=2,
                max_model_len=12,
            ),
        )
        h.submit(ArRequest("a", 5, 4))
        h.step()
        h.step()
        h.submit(ArRequest("b", 8, 1))
        start = len(h.events)
        h.step()
        by_factory[name] = [
            (e.request_id, e.num_tokens) for e in h.events[start:] if isinstance(e, ArScheduled)
        ]
        h.drain()
        assert h.outputs() == {"a": 4, "b": 1}
    assert by_factory == {"ideal": [("a", 1), ("b", 3)], "033": [("a", 1)]}


def test_vllm_v1_builtin_conforms_under_its_profile() -> None:
    """Every policy of its space (the vLLM 0.33 options apply to all of them)."""
    machine = ar_conformance_machine(VLLM_V1.factory, profile=VLLM_V1.profile)
    run_state_machine_as_test(machine, settings=RUN)


def test_the_cadence_reference_schedules_an_empty_held_step_unless_it_lifts_the_hold() -> None:
    """The prefill cadence (interval 3), 8 blocks of one token: r0 is in its prefill and r1
    decodes when step 5 starts held; r1 preempts itself for want of a block. As vLLM 0.33.0
    does, `VLLM_V1_CADENCE` then schedules nothing (`progress`); with the candidate fix
    (`VLLM_V1_CADENCE_FIXED`) the hold lifts, r0's chunk runs, and the spec, which allows a
    hold with no decode left to lift, passes it."""
    from reference.ar.vllm_settings import VLLM_V1_CADENCE, VLLM_V1_CADENCE_FIXED
    from spec.errors import SpecViolation

    config = ArConfig(
        block_size=1,
        num_blocks=9,  # 8 usable and the null block
        max_num_batched_tokens=3,
        max_num_seqs=2,
        max_model_len=6,
        long_prefill_token_threshold=2,
    )

    def run(impl: ArImplementation) -> ArHarness:
        h = ArHarness(impl.factory, config, policy=impl.profile.policy)
        h.step()
        h.submit(ArRequest("r0", 5, 1))
        h.submit(ArRequest("r1", 1, 5))
        h.drain()
        return h

    with pytest.raises(SpecViolation, match=r"\[progress\] step 5 scheduled nothing"):
        run(VLLM_V1_CADENCE)
    h = run(VLLM_V1_CADENCE_FIXED)
    assert h.violation is None and h.outputs() == {"r0": 1, "r1": 5}
    assert any(isinstance(e, ArPreempted) for e in h.events)
