"""Prefix caching in the AR spec (shared, reference-counted blocks; cache hits; eviction), the
reference `vllm-v1-prefix` under its profile, and incremental invariant checking (the same
verdicts as the full check, on random programs)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from properties.ar.conformance import ar_conformance_machine
from properties.ar.strategies import ar_configs, prompts, request_sizes
from reference.ar.prefix_cache import VLLM_V1_PREFIX, make_vllm_v1_prefix
from reference.ar.vidur import make_vidur_sarathi
from reference.ar.vllm_v1 import VllmV1Scheduler, make_vllm_v1
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheEvicted,
    ArCacheHit,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.errors import RequestError, SchedSpecError, SpecViolation
from tests.ar_mutants import AR_MUTANTS

CFG = ArConfig(
    block_size=2,
    num_blocks=9,
    max_num_batched_tokens=8,
    max_model_len=8,
    enable_prefix_caching=True,
)


def _a_done() -> list[ArEvent]:
    """a (prompt 1 2 3 4 5) runs alone and finishes: blocks 1, 2 cached, then freed."""
    return [
        ArSubmitted("a", 5, 1, prompt=(1, 2, 3, 4, 5)),
        ArBlocksAllocated("a", (1, 2, 3)),
        ArScheduled("a", 5),
        ArStepEnd(0),
        ArBlocksFreed("a", (1, 2, 3)),
        ArFinished("a", ArFinishReason.LENGTH),
    ]


def _b_hits(blocks: tuple[int, ...]) -> list[ArEvent]:
    return [
        ArSubmitted("b", 5, 1, prompt=(1, 2, 3, 4, 9)),
        ArCacheHit("b", blocks),
        ArBlocksAllocated("b", (4,)),
        ArScheduled("b", 5 - 2 * len(blocks)),
    ]


def _violation(events: list[ArEvent], config: ArConfig = CFG) -> str | None:
    m = ArSpecMachine(config)
    try:
        for e in events:
            m.apply(e)
            m.check_invariants()
    except SpecViolation as v:
        return v.rule
    return None


def test_a_cache_hit_shares_the_prefix_and_jumps_computed_tokens() -> None:
    m = ArSpecMachine(CFG)
    m.apply_all([*_a_done(), *_b_hits((1, 2))])
    m.check_invariants()
    s = m.state()
    assert s.requests["b"].num_computed == 4 and s.requests["b"].blocks == (1, 2, 4)
    assert set(s.cached) >= {1, 2}


def test_shared_blocks_are_reference_counted() -> None:
    events: list[ArEvent] = [
        ArSubmitted("a", 5, 3, prompt=(1, 2, 3, 4, 5)),
        ArSubmitted("b", 5, 3, prompt=(1, 2, 3, 4, 6)),
        ArBlocksAllocated("a", (1, 2, 3)),
        ArScheduled("a", 5),
        ArCacheHit("b", (1, 2)),
        ArBlocksAllocated("b", (4,)),
        ArScheduled("b", 1),
        ArStepEnd(0),
    ]
    m = ArSpecMachine(CFG)
    m.apply_all(events)
    assert m.state().block_holders[1] == frozenset({"a", "b"})
    assert m.free_blocks == CFG.usable_blocks - 4
    m.apply(ArBlocksFreed("a", (1, 2, 3)))  # a's reference goes, b's stays
    assert m.state().block_holders[1] == frozenset({"b"})
    assert m.free_blocks == CFG.usable_blocks - 3
    with pytest.raises(SpecViolation) as err:  # evicting a block b still references
        m.apply(ArCacheEvicted((1,)))
    assert err.value.rule == "evict_unreferenced_only"


@pytest.mark.parametrize(
    ("events", "rule"),
    [
        (_b_hits((1, 2)), "cache_hit_cached"),  # nothing cached yet
        ([*_a_done(), *_b_hits((2, 1))], "cache_hit_cached"),  # out of order
        ([*_a_done(), *_b_hits((1, 3))], "cache_hit_cached"),  # block 3 holds a's 5th token
        (
            [*_a_done(), ArSubmitted("c", 4, 1, prompt=(1, 2, 3, 4)), ArCacheHit("c", (1, 2))],
            "cache_hit_bounded",  # all 4 known tokens: the last must be computed
        ),
        ([*_a_done(), ArCacheEvicted((7,))], "evict_unreferenced_only"),  # not cached
        (
            [*_a_done(), ArBlocksAllocated("a", (1,))],
            "known_request",
        ),
    ],
)
def test_bad_cache_events(events: list[ArEvent], rule: str) -> None:
    assert _violation(events) == rule


def test_cache_hit_needs_prefix_caching_on() -> None:
    off = CFG.replace(enable_prefix_caching=False)
    assert _violation([*_a_done(), *_b_hits((1, 2))], off) == "cache_hit_enabled"


def test_allocating_a_cached_free_block_evicts_it() -> None:
    m = ArSpecMachine(CFG)
    m.apply_all(_a_done())
    m.apply_all([ArSubmitted("c", 2, 1), ArBlocksAllocated("c", (1,)), ArScheduled("c", 2)])
    assert m.state().cached.get(1) is not None  # c's own content now (a full block)
    with pytest.raises(SpecViolation) as err:  # b's prefix is gone from block 1
        m.apply_all(_b_hits((1, 2)))
    assert err.value.rule == "cache_hit_cached"


def test_vllm_v1_prefix_conforms_under_its_profile() -> None:
    machine = ar_conformance_machine(VLLM_V1_PREFIX.factory, profile=VLLM_V1_PREFIX.profile)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=60,
            deadline=None,
            stateful_step_count=30,
            suppress_health_check=list(HealthCheck),
        ),
    )


# --- incremental invariant checks == full checks ------------------------------------------------


class _HoldsWhileWaiting(VllmV1Scheduler):
    """Gives the head of the queue a block without admitting it (a state invariant, not an
    event guard, catches it: waiting_holds_nothing, between steps)."""

    def _schedule(self) -> None:
        super()._schedule()
        if self.waiting and not self.waiting[0].blocks and self.pool.num_free:
            self._grow(self.waiting[0], 1)


def _holds_while_waiting(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    return _HoldsWhileWaiting(config, sink)


_FACTORIES: list[ArImplementationFactory] = [
    make_vllm_v1,
    make_vllm_v1_prefix,
    make_vidur_sarathi,
    _holds_while_waiting,
    *(AR_MUTANTS[n].factory for n in ("double_free", "refcount_leak", "vidur_ft_missing_free")),
]


class _Twin:
    """Applies every event to two machines: one checks incrementally, one fully."""

    def __init__(self, config: ArConfig, rules: object) -> None:
        self.inc = ArSpecMachine(config, rules)  # type: ignore[arg-type]
        self.full = ArSpecMachine(config, rules)  # type: ignore[arg-type]
        self.verdicts: list[tuple[str | None, str | None]] = []

    def __call__(self, event: ArEvent) -> None:
        def inc() -> None:
            self.inc.apply(event)
            self.inc.check_invariants()

        def full() -> None:
            self.full.apply(event)
            self.full.check_invariants_full()

        a, b = _outcome(inc), _outcome(full)
        self.verdicts.append((a, b))
        if a or b:
            raise SpecViolation(a or b or "", "stop")
        if isinstance(event, ArStepEnd):
            a = _outcome(lambda: self.inc.check_invariants(between_steps=True))
            b = _outcome(lambda: self.full.check_invariants_full(between_steps=True))
            self.verdicts.append((a, b))
            if a or b:  # the first violation ends a run (incremental checks report it once)
                raise SpecViolation(a or b or "", "stop")


def _outcome(fn: Callable[[], None]) -> str | None:
    try:
        fn()
    except SpecViolation as v:
        return v.rule
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    which=st.integers(0, len(_FACTORIES) - 1),
    config=ar_configs(policies=(Policy.FCFS, Policy.PRIORITY), prefix_caching=(False, True)),
    data=st.data(),
)
def test_incremental_checks_agree_with_full_checks(
    which: int, config: ArConfig, data: st.DataObject
) -> None:
    factory = _FACTORIES[which]
    twin: _Twin | None = None

    def sink(e: ArEvent) -> None:
        assert twin is not None
        twin(e)

    try:
        impl = factory(config, sink)
    except SchedSpecError:
        return
    twin = _Twin(config, impl.rules)
    try:
        for i in range(data.draw(st.integers(1, 8), "requests")):
            p, m = data.draw(request_sizes(config), "sizes")
            with contextlib.suppress(RequestError):
                impl.submit(ArRequest(f"r{i}", p, m, prompt=data.draw(prompts(p), "prompt")))
            for _ in range(data.draw(st.integers(0, 3), "steps")):
                impl.step()
        impl.drain(300)
    except (SpecViolation, SchedSpecError):
        pass
    for inc, full in twin.verdicts:
        assert inc == full
