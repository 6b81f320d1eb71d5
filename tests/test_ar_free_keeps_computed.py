"""A request's computed tokens stay tied to the blocks that hold them (`kv_covers_computed`).

A mutation review (2026-12-07) found the AR spec counted computed tokens but let the blocks
holding them go: a request that took a cache hit, gave the blocks back and took fresh ones in
the same step kept its computed count, so the fresh blocks, which no forward wrote, entered the
cache as its prefix and a later request read them. Now a request gives back the blocks of its
computed tokens only all at once: a queued one then holds and has computed nothing; a running
one may only finish or be aborted next. Blocks past its computed tokens may go alone.
"""

from __future__ import annotations

import io

import pytest

from properties.ar.trace_check import check_ar_trace
from spec.ar.config import ArConfig
from spec.ar.events import (
    ArAborted,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheHit,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArPolicy
from spec.ar.trace import write_ar_trace

CACHING = ArConfig(
    block_size=4,
    num_blocks=17,
    max_num_batched_tokens=16,
    max_num_seqs=2,
    enable_prefix_caching=True,
)
PROMPT = tuple(range(100, 109))  # 9 tokens: two full blocks of 4 and one more


def log_of(
    events: list[ArEvent], config: ArConfig = CACHING, policy: ArPolicy | None = None
) -> list[str]:
    """The AR log of `events` under `config` (and a declared `policy`)."""
    out = io.StringIO()
    write_ar_trace(events, out, config, policy)
    return out.getvalue().splitlines(keepends=True)


def verdict(
    events: list[ArEvent], config: ArConfig = CACHING, policy: ArPolicy | None = None
) -> tuple[str, str]:
    """(rule, message) `check_ar_trace` gives the log of `events`; ("", "") when it conforms."""
    result = check_ar_trace(log_of(events, config, policy))
    if result.violation is None:
        return "", ""
    return str(result.violation.rule), str(result.violation)


def b_caches_its_prefix() -> list[ArEvent]:
    """b computes its 9-token prompt in step 0 and finishes: blocks 1 and 2 stay cached."""
    return [
        ArSubmitted("b", 9, 1, prompt=PROMPT),
        ArBlocksAllocated("b", (1, 2, 3)),
        ArScheduled("b", 9),
        ArStepEnd(0),
        ArBlocksFreed("b", (1, 2, 3)),
        ArFinished("b", ArFinishReason.LENGTH),
    ]


def test_fresh_blocks_after_a_returned_cache_hit_are_never_cached_as_the_prefix() -> None:
    """The review's trace: a hits blocks 1, 2, gives them back, takes 4, 5, 6 and schedules one
    token. Before the fix a kept its 8 computed tokens, blocks 4 and 5 (never written) were
    cached as the prefix, and c's hit on them conformed; now a has computed nothing after the
    free, so 4 and 5 hold nothing cached and c's claim is refused."""
    events = [
        *b_caches_its_prefix(),
        ArSubmitted("a", 9, 4, prompt=PROMPT),
        ArCacheHit("a", (1, 2)),
        ArBlocksFreed("a", (1, 2)),
        ArBlocksAllocated("a", (4, 5, 6)),
        ArScheduled("a", 1),
        ArStepEnd(1),
        ArSubmitted("c", 9, 1, prompt=PROMPT),
        ArCacheHit("c", (4, 5)),
    ]
    rule, message = verdict(events)
    assert rule == "cache_hit_cached", message
    assert "claims block 4 as its prefix block 0, but block 4 is not cached" in message, message


def test_a_returned_cache_hit_recomputes_from_its_first_token() -> None:
    """The same a, scheduling all 9 tokens after the free: it conforms (it recomputes)."""
    events = [
        *b_caches_its_prefix(),
        ArSubmitted("a", 9, 4, prompt=PROMPT),
        ArCacheHit("a", (1, 2)),
        ArBlocksFreed("a", (1, 2)),
        ArBlocksAllocated("a", (4, 5, 6)),
        ArScheduled("a", 9),
        ArStepEnd(1),
    ]
    assert verdict(events) == ("", "")


def running_a() -> list[ArEvent]:
    """a, 9 prompt tokens, computed in step 0 into blocks 1, 2, 3, with one spare block 4."""
    return [
        ArSubmitted("a", 9, 4),
        ArBlocksAllocated("a", (1, 2, 3, 4)),
        ArScheduled("a", 9),
        ArStepEnd(0),
    ]


def test_a_running_request_freeing_a_leading_block_is_refused_at_once() -> None:
    """Freeing block 1 (its tokens 0..3) and keeping 2, 3, 4: four blocks still cover the count
    of computed tokens, so the step-end check alone passed it; the free itself is refused."""
    rule, message = verdict([*running_a(), ArBlocksFreed("a", (1,))])
    assert rule == "kv_covers_computed", message
    assert "freed block 1, its block 0, and keeps [2, 3, 4]" in message, message
    assert "only blocks from position 3 on may be freed alone" in message, message


def test_a_running_request_may_free_a_block_past_its_computed_tokens() -> None:
    """Block 4 (its position 3) holds no computed token: freeing it alone conforms."""
    events = [*running_a(), ArBlocksFreed("a", (4,)), ArScheduled("a", 1), ArStepEnd(1)]
    assert verdict(events) == ("", "")


def step_1_under_way() -> list[ArEvent]:
    """a and d run from step 0; d opens step 1's schedule phase, and a frees all its blocks
    inside the step, where no between-steps check looks."""
    return [
        ArSubmitted("a", 9, 4),
        ArSubmitted("d", 1, 4),
        ArBlocksAllocated("a", (1, 2, 3, 4)),
        ArScheduled("a", 9),
        ArBlocksAllocated("d", (8,)),
        ArScheduled("d", 1),
        ArStepEnd(0),
        ArScheduled("d", 1),
        ArBlocksFreed("a", (1, 2, 3, 4)),
    ]


def test_a_running_request_that_gave_everything_back_takes_no_blocks() -> None:
    """Freeing all its blocks inside a step and taking fresh ones: 9 computed tokens would sit
    in blocks no forward wrote, and three blocks cover the count at the step's end, so that
    check passed it. The allocation is refused."""
    events = [*step_1_under_way(), ArBlocksAllocated("a", (5, 6, 7)), ArScheduled("a", 1)]
    rule, message = verdict([*events, ArStepEnd(1)])
    assert rule == "kv_covers_computed", message
    assert "then got ArBlocksAllocated: after such a free it may only finish" in message


def test_a_running_request_that_gave_everything_back_is_not_scheduled() -> None:
    rule, message = verdict([*step_1_under_way(), ArScheduled("a", 1)])
    assert rule == "kv_covers_computed", message
    assert "got ArScheduled" in message, message


def test_a_running_request_that_gave_everything_back_may_be_aborted() -> None:
    events = [*running_a(), ArBlocksFreed("a", (1, 2, 3, 4)), ArAborted("a"), ArStepEnd(1)]
    assert verdict(events) == ("", "")


def d_scheduled_into_a_third_block() -> list[ArEvent]:
    """d, 12 prompt tokens in chunks of 8 and 4: its step-1 scheduling fills (and caches, as
    vLLM caches at scheduling) its third block, block 3, which step 1's forward writes."""
    return [
        ArSubmitted("d", 12, 4, prompt=tuple(range(200, 212))),
        ArBlocksAllocated("d", (1, 2)),
        ArScheduled("d", 8),
        ArStepEnd(0),
        ArBlocksAllocated("d", (3,)),
        ArScheduled("d", 4),
    ]


def test_blocks_a_scheduled_request_gives_back_leave_the_cache_unwritten() -> None:
    """The review's second probe: d frees all its blocks in the schedule phase that scheduled
    it, so step 1's forward never writes block 3; e's hit on it conformed until the step's end
    named d. Now block 3 leaves the cache at the free, and the hit is refused, saying why."""
    events = [
        *d_scheduled_into_a_third_block(),
        ArBlocksFreed("d", (1, 2, 3)),
        ArSubmitted("e", 13, 1, prompt=tuple(range(200, 213))),
        ArCacheHit("e", (1, 2, 3)),
    ]
    rule, message = verdict(events)
    assert rule == "cache_hit_cached", message
    assert "block 3 is not cached (cached: [1, 2]): prefix block 2 of 'd' (tokens 8..11)" in message
    assert "never computed: it freed its blocks in that step" in message, message


def test_a_scheduled_request_keeps_what_its_forward_uses() -> None:
    """Freeing only block 3, which step 1's 4 tokens are written into: refused at the free."""
    rule, message = verdict([*d_scheduled_into_a_third_block(), ArBlocksFreed("d", (3,))])
    assert rule == "kv_covers_scheduled", message
    assert "freed block 3, its block 2, which that step's forward uses, keeping [1, 2]" in message


def test_blocks_past_what_the_step_uses_may_go_in_the_schedule_phase() -> None:
    events: list[ArEvent] = [
        *running_a(),
        ArScheduled("a", 1),
        ArBlocksFreed("a", (4,)),
        ArStepEnd(1),
    ]
    assert verdict(events) == ("", "")


# Edges a mutation review (2026-12-07) found the tests above left open: each trace changes its
# verdict under one mutant of the free checks (named in the id).
EDGES: dict[str, tuple[list[ArEvent], ArConfig, str]] = {
    # block_size 2: 9 computed + 1 scheduled use blocks 0..4; block 6 (position 5) may go
    "the block from computed + scheduled on may go (< not <=)": (
        [
            ArSubmitted("a", 9, 4),
            ArBlocksAllocated("a", (1, 2, 3, 4, 5, 6)),
            ArScheduled("a", 9),
            ArStepEnd(0),
            ArScheduled("a", 1),
            ArBlocksFreed("a", (6,)),
            ArStepEnd(1),
        ],
        CACHING.replace(block_size=2),
        "",
    ),
    # block_size 2: 8 computed fill blocks 0..3; block 5 (position 4) may go between steps
    "the block from the computed tokens on may go (< not <=)": (
        [
            ArSubmitted("a", 8, 4),
            ArBlocksAllocated("a", (1, 2, 3, 4, 5)),
            ArScheduled("a", 8),
            ArStepEnd(0),
            ArBlocksFreed("a", (5,)),
            ArBlocksAllocated("a", (6,)),
            ArScheduled("a", 1),
            ArStepEnd(1),
        ],
        CACHING.replace(block_size=2),
        "",
    ),
    # positions 0 and 3 together: the first position freed decides (min, not max)
    "a free's first position is its lowest": (
        [
            ArSubmitted("a", 9, 4),
            ArBlocksAllocated("a", (1, 2, 3, 4)),
            ArScheduled("a", 9),
            ArStepEnd(0),
            ArBlocksFreed("a", (1, 4)),
        ],
        CACHING,
        "kv_covers_computed",
    ),
    # a frees all inside step 1, the scheduler then preempts it: readmitted in step 2
    "a preemption lifts the release": (
        [
            ArSubmitted("d", 1, 4),
            ArSubmitted("a", 9, 4),
            ArBlocksAllocated("d", (8,)),
            ArScheduled("d", 1),
            ArBlocksAllocated("a", (1, 2, 3, 4)),
            ArScheduled("a", 9),
            ArStepEnd(0),
            ArScheduled("d", 1),
            ArBlocksFreed("a", (1, 2, 3, 4)),
            ArPreempted("a", ()),
            ArStepEnd(1),
            ArScheduled("d", 1),
            ArBlocksAllocated("a", (1, 2, 3)),
            ArScheduled("a", 9),
            ArStepEnd(2),
        ],
        CACHING,
        "",
    ),
    # scheduled with nothing computed, all freed, a fresh block taken in the same phase
    "a request scheduled in the step that frees all leaves the batch": (
        [
            ArSubmitted("a", 4, 2),
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 4),
            ArBlocksFreed("a", (1,)),
            ArBlocksAllocated("a", (2,)),
        ],
        CACHING,
        "kv_covers_computed",
    ),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_an_edge_of_the_free_checks(name: str) -> None:
    events, config, rule = EDGES[name]
    assert verdict(events, config)[0] == rule, verdict(events, config)[1]
