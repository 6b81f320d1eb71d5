"""AR decision twins: `spec.ar.decisions` reads a run's per-step decisions, and
`ar_conformance_machine(..., twin=...)` fails an example by the rule `twin_decisions` when a
second AR implementation, given the same operations, decides otherwise (no engine needed; the
real vLLM's runs against its re-implementation are in tests/test_real_vllm.py). Also the two
facts of vLLM's prefix cache that the twin showed the `vllm-v1-prefix` reference lacked."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from properties.ar.conformance import ar_conformance_machine
from properties.ar.decisions import twin_difference
from properties.ar.harness import ArDrain, ArHarness, ArStep, ArSubmit
from reference.ar.base import CachingBlockPool
from reference.ar.vllm_v1 import VLLM_V1, make_vllm_v1
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.decisions import StepDecision, first_difference, step_decisions
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
)
from spec.errors import SpecViolation

LENGTH = ArFinishReason.LENGTH


def test_step_decisions_read_what_each_step_decided() -> None:
    events: list[ArEvent] = [
        ArBlocksAllocated("a", (1, 2)),
        ArScheduled("a", 5),
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", 1),
        ArStepEnd(0),
        ArBlocksFreed("b", (3,)),
        ArFinished("b", LENGTH),  # after step 0's end: step 0 finished it
        ArBlocksAllocated("a", (4,)),  # then preempted in the same step: given back
        ArScheduled("a", 1),
        ArPreempted("a", (1, 2, 4)),
        ArBlocksAllocated("c", (1,)),
        ArScheduled("c", 2),
        ArStepEnd(1),
        ArScheduled("c", 1),  # a step that never ended is no step
    ]
    assert step_decisions(events) == [
        StepDecision((("a", 5), ("b", 1)), (), (("a", 2), ("b", 1)), ("b",)),
        StepDecision((("c", 2),), ("a",), (("c", 1),), ()),
    ]


def test_first_difference_names_the_step_and_the_part() -> None:
    one = StepDecision((("a", 1),))
    other = StepDecision((("a", 2),))
    assert first_difference([one], [one]) is None
    assert first_difference([one, one], [one, other], ("A", "B")) == (
        "step 1: A schedules [('a', 1)], B schedules [('a', 2)]"
    )
    assert first_difference([one, one], [one], ("A", "B")) == (
        "step 1: A runs it, B ran only 1 step"
    )
    preempting = StepDecision((("a", 1),), ("b",))
    assert first_difference([one], [preempting]) == (
        "step 0: the implementation preempts [], the other preempts ['b']"
    )


CFG = ArConfig(
    block_size=1,
    num_blocks=3,
    reserve_null_block=False,
    max_num_batched_tokens=2,
    max_num_seqs=2,
    max_model_len=4,
    policy=Policy.AGING,
)


def test_twin_difference_replays_the_recorded_operations() -> None:
    """The harness records what it was asked (`ops`); the twin runs exactly those. Three blocks,
    `r0` holding one and growing into a second: `r1`'s whole sequence (three blocks) does not
    fit, so vLLM 0.33's full-sequence gate holds it back; the idealised twin admits its first
    token at once (the suite's shrunk counterexample)."""
    h = ArHarness(VLLM_V1.factory, CFG, policy=VLLM_V1.profile.policy)
    h.submit(ArRequest("r0", 1, 2, arrival_time=1.0))
    h.step()
    h.submit(ArRequest("r1", 2, 1, arrival_time=2.0))
    h.step()
    h.drain()
    assert [type(op) for op in h.ops] == [ArSubmit, ArStep, ArSubmit, ArStep, ArDrain]
    assert twin_difference(h.ops, h.events, CFG, VLLM_V1.factory, VLLM_V1.profile.policy) is None
    differs = twin_difference(h.ops, h.events, CFG, make_vllm_v1)
    assert differs == (
        "step 1: the implementation schedules [('r0', 1)], its twin schedules "
        "[('r0', 1), ('r1', 1)]"
    )


def _suite(**kw: object) -> None:
    machine = ar_conformance_machine(VLLM_V1.factory, profile=VLLM_V1.profile, **kw)  # type: ignore[arg-type]
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=200,
            deadline=None,
            database=None,
            derandomize=True,
            stateful_step_count=30,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),  # no explain
            # stop at the first failure: searching on for more bugs is bounded by wall-clock
            # time (10 s), which would make the counterexample depend on the machine's load
            report_multiple_bugs=False,
        ),
    )


def test_vllm_v1_decides_as_itself() -> None:
    _suite(twin=VLLM_V1.factory, twin_policy=VLLM_V1.profile.policy)


def test_a_twin_without_vllms_options_fails_the_suite_by_twin_decisions() -> None:
    """`vllm-v1` (vLLM 0.33's three options on) against the idealised reference (all off):
    both conform to their own policies, so only the twin sees them part."""
    with pytest.raises(SpecViolation) as caught:
        _suite(twin=make_vllm_v1)
    assert caught.value.rule == "twin_decisions", caught.value
    shape = r"\[twin_decisions\] step \d+: the implementation (\w+( blocks)?) .*, its twin \1 "
    assert re.match(shape, str(caught.value)), str(caught.value)


# ------------------------------------------------------------------ vLLM's prefix cache
CACHING = ArConfig(
    block_size=1,
    num_blocks=8,
    max_num_batched_tokens=8,
    max_num_seqs=2,
    max_model_len=8,
    enable_prefix_caching=True,
)


def test_freed_blocks_go_back_in_vllms_eviction_order() -> None:
    """vLLM 0.33 frees a request's blocks tail first (`SingleTypeKVCacheManager.free`): cached
    blocks to the tail of the free queue, so a request's first blocks, the prefix others
    share, are evicted last; uncached ones to the head, reused first (`BlockPool.free_blocks`).
    The reference appended them head first, so a decode could evict a prefix that the next
    request would have hit (found by `verify --impl real-vllm-prefix --twin vllm-v1-prefix`)."""
    pool = CachingBlockPool(CACHING, lambda e: None)
    blocks = pool.allocate("a", 4)
    for i, b in enumerate(blocks[:3]):  # the last block is partial: never cached
        pool.register(b, ("a", i))
    rest = list(pool.free_queue)
    pool.release("a", blocks)
    assert list(pool.free_queue) == [blocks[3], *rest, blocks[2], blocks[1], blocks[0]]


def test_blocks_of_equal_content_stay_cached_until_each_is_evicted() -> None:
    """vLLM does not de-duplicate cached blocks (`BlockHashToBlockMap`): evicting one copy
    leaves the other findable. The reference's index kept one block per content, so evicting
    the indexed copy lost a hit that vLLM makes."""
    pool = CachingBlockPool(CACHING, lambda e: None)
    (first,) = pool.allocate("a", 1)
    (second,) = pool.allocate("b", 1)
    pool.register(first, ("same",))
    pool.register(second, ("same",))
    assert pool.lookup([("same",)]) == [first]
    pool.release("a", [first])
    while first in pool.free_queue:  # allocate until the first copy is evicted
        pool.allocate("c", 1)
    assert pool.lookup([("same",)]) == [second]
