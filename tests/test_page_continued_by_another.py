"""A page is never continued while another request owns part of it (rule `page_alignment`).

With the prefix cache and pages of three blocks or more, a request could continue a page after
a cached block it reads while the block's first owner still held a later slot of that page:
`SpecMachine` accepted every event of such a trace and then broke its own `page_alignment`
invariant (`page 0 is shared by ['r0', 'r1']`), so an implementation that made only legal
moves would have been blamed; the Z3 encoding accepted it too, and the state before was a
counterexample to the invariant's induction (found by a review, 2026-12-06). Both now refuse
the allocation, and agree, in a geometry of three blocks a page (the drift tests' geometries,
and the proofs' before this, had at most two)."""

from __future__ import annotations

import pytest

from properties.symbolic.drift import SymbolicStepper
from properties.symbolic.geometry import Geometry
from spec.config import DllmConfig, Mode
from spec.errors import SpecViolation
from spec.events import (
    Admitted,
    BlockCommitted,
    CacheHit,
    ControlReturned,
    Event,
    Forward,
    ForwardRow,
    KvAllocated,
    KvCached,
    KvFreed,
    StepResult,
    Submitted,
)
from spec.invariants import check_all
from spec.machine import SpecMachine

CONFIG = DllmConfig(
    block_size=1,
    page_size=3,
    kv_pages=2,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=8,
    mode=Mode.FDFO,
    in_place_reuse=True,
    prefix_cache=True,
)


def _forward(rid: str, block: int) -> Forward:
    return Forward((ForwardRow(rid, block, False, 1, 0),))


# r0 commits and caches its block 0 (slot 0), commits block 1 (slot 1), takes slot 2 for
# block 2 and frees slot 1; r1 reads the cached block 0 and would take slot 1 as its block 1
PREFIX: tuple[Event, ...] = (
    Submitted("r0", (5, 6, 7), 1),
    Submitted("r1", (5, 9), 1),
    Admitted("r0", 0),
    Admitted("r1", 1),
    KvAllocated("r0", 0, (0,)),
    _forward("r0", 0),
    StepResult("r0", 0, 1, 0),
    BlockCommitted("r0", 0, (5,)),
    KvCached("r0", 0, (0,)),
    ControlReturned(0),
    KvAllocated("r0", 1, (1,)),
    _forward("r0", 1),
    StepResult("r0", 1, 1, 0),
    BlockCommitted("r0", 1, (6,)),
    ControlReturned(1),
    KvAllocated("r0", 2, (2,)),
    KvFreed("r0", (1,)),
    CacheHit("r1", 0, (0,)),
)
CONTINUES_A_SHARED_PAGE = KvAllocated("r1", 1, (1,))


def test_the_spec_refuses_to_continue_a_page_another_request_owns_part_of() -> None:
    machine = SpecMachine(CONFIG)
    for event in PREFIX:
        machine.apply(event)
        assert not check_all(machine.state()), event  # every invariant holds on the way
    with pytest.raises(SpecViolation) as info:
        machine.apply(CONTINUES_A_SHARED_PAGE)
    assert info.value.rule == "page_alignment"
    assert "block 1 continues page 0, where r0 still owns slots" in str(info.value)


def test_the_encoding_refuses_it_for_the_same_rule() -> None:
    stepper = SymbolicStepper(Geometry(1, 3, 3, prefix_cache=True))
    machine = SpecMachine(CONFIG)
    for event in PREFIX:
        assert stepper.verdict(machine.state(), event).enabled, event
        machine.apply(event)
    verdict = stepper.verdict(machine.state(), CONTINUES_A_SHARED_PAGE)
    assert not verdict.enabled
    assert "page_alignment" in verdict.failed_rules, verdict.failed_rules
