"""Traces that kill the spec mutants a mutation review found alive (2026-12-07).

The review mutated guards of the spec (`spec/machine.py`, `spec/ar/machine.py`,
`spec/prefix_cache.py`, `spec/trace.py`, `spec/reconstruct.py`): 80 mutants, 58 killed by the
suite, 4 equivalent, 18 alive though each changes a verdict on some trace. Each test here is
that trace, checked through the public path an engine's CI uses (`check_trace` /
`check_ar_trace` on a log's lines, the trace reader, `spec.reconstruct`), with the verdict of
the spec as written; each fails on its mutant (named in the test's docstring).
"""

from __future__ import annotations

import io
import json

import pytest

from properties.ar.trace_check import check_ar_trace
from properties.trace_check import check_trace
from spec.ar.config import ArConfig, Policy
from spec.ar.events import (
    ArAborted,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.trace import write_ar_trace
from spec.config import DllmConfig, Mode
from spec.events import (
    Aborted,
    Admitted,
    BlockCommitted,
    CacheEvicted,
    CacheHit,
    CacheReleased,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    KvAllocated,
    KvCached,
    KvFreed,
    RowAcquired,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.profile import DllmPolicy
from spec.reconstruct import PoolView, reconstruct, without_reserved
from spec.trace import TraceFormatError, config_to_dict, event_to_dict, iter_trace


def dllm_rule(config: DllmConfig, events: list[Event], policy: DllmPolicy | None = None) -> str:
    """The rule `check_trace` reports on the log of `events` ("" when it conforms)."""
    lines = [json.dumps(config_to_dict(config, policy))]
    lines += [json.dumps(event_to_dict(e)) for e in events]
    result = check_trace(lines)
    return "" if result.violation is None else str(result.violation.rule)


def ar_rule(config: ArConfig, events: list[ArEvent]) -> str:
    """The rule `check_ar_trace` reports on the log of `events` ("" when it conforms)."""
    out = io.StringIO()
    write_ar_trace(events, out, config)
    result = check_ar_trace(out.getvalue().splitlines(keepends=True))
    return "" if result.violation is None else str(result.violation.rule)


def row(request_id: str, block: int, masked: int) -> ForwardRow:
    return ForwardRow(request_id, block, False, 4, masked)


CACHED = DllmConfig(
    block_size=4,
    page_size=4,
    kv_pages=6,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=16,
    mode=Mode.FDFO,
    in_place_reuse=True,
    prefix_cache=True,
)
TWO_BLOCK_PAGES = CACHED.replace(page_size=8, kv_pages=3)


def committed_and_cached(prompt: tuple[int, ...] = (1, 2, 3, 4)) -> list[Event]:
    """r0 admitted, its block 0 (its prompt) committed and cached at slots 0..3."""
    return [
        Submitted("r0", prompt, 4),
        Admitted("r0", 0),
        KvAllocated("r0", 0, (0, 1, 2, 3)),
        Forward((row("r0", 0, 0),)),
        StepResult("r0", 0, 4, 0),
        BlockCommitted("r0", 0, prompt[:4]),
        KvCached("r0", 0, (0, 1, 2, 3)),
        ControlReturned(0),
    ]


def cached_and_gone() -> list[Event]:
    """`committed_and_cached`, then r0 stops reading its block and is aborted."""
    return [
        *committed_and_cached(),
        CacheReleased("r0", 0, (0, 1, 2, 3)),
        RowReleased("r0", 0),
        Aborted("r0"),
    ]


# --------------------------------------------------------------------------- dLLM, the cache
def test_a_cache_hit_on_the_block_being_denoised_is_refused() -> None:
    """Mutant: `_cache_hit` without its current-block check (the block was committed twice)."""
    events = [
        *committed_and_cached(),
        Submitted("r1", (1, 2, 3, 4, 5), 3),
        Admitted("r1", 1),
        KvAllocated("r1", 0, (8, 9, 10, 11)),
        CacheHit("r1", 0, (0, 1, 2, 3)),
    ]
    assert dllm_rule(CACHED, events) == "cache_hit_content"


def test_a_page_whose_other_half_is_cached_is_not_wholly_free() -> None:
    """Mutant: the page-start check without the prefix cache among a page's users."""
    prompt = (1, 2, 3, 4, 5, 6, 7, 8)
    events: list[Event] = [
        Submitted("r0", prompt, 4),
        Admitted("r0", 0),
        KvAllocated("r0", 0, (0, 1, 2, 3)),
        Forward((row("r0", 0, 0),)),
        StepResult("r0", 0, 4, 0),
        BlockCommitted("r0", 0, prompt[:4]),
        ControlReturned(0),
        KvAllocated("r0", 1, (4, 5, 6, 7)),
        Forward((row("r0", 1, 0),)),
        StepResult("r0", 1, 4, 0),
        BlockCommitted("r0", 1, prompt[4:]),
        KvCached("r0", 1, (4, 5, 6, 7)),
        ControlReturned(1),
        KvFreed("r0", (0, 1, 2, 3)),
        CacheReleased("r0", 1, (4, 5, 6, 7)),
        RowReleased("r0", 0),
        Aborted("r0"),
        Submitted("r1", (9, 9, 9, 9), 4),
        Admitted("r1", 0),
        KvAllocated("r1", 0, (0, 1, 2, 3)),  # page 0, whose slots 4..7 the cache holds
    ]
    assert dllm_rule(TWO_BLOCK_PAGES, events) == "page_alignment"


def test_a_block_after_a_cached_one_continues_that_page() -> None:
    """Mutant: a block after a cached read exempt from continuing its page."""
    events = [
        *cached_and_gone(),
        Submitted("r1", (1, 2, 3, 4, 5), 3),
        Admitted("r1", 0),
        CacheHit("r1", 0, (0, 1, 2, 3)),
        KvAllocated("r1", 1, (12, 13, 14, 15)),  # page 0's second half, slots 4..7, is free
    ]
    assert dllm_rule(TWO_BLOCK_PAGES, events) == "page_alignment"


def test_a_block_enters_the_cache_in_position_order() -> None:
    """Mutant: `KvCached` slots compared as a set."""
    events = committed_and_cached()
    events[6] = KvCached("r0", 0, (3, 2, 1, 0))
    assert dllm_rule(CACHED, events) == "cache_committed_only"


def test_an_eviction_lists_each_slot_once() -> None:
    """Mutant: `CacheEvicted` without its repeated-slot check."""
    events = [*cached_and_gone(), CacheEvicted((0, 1, 2, 3, 3, 0))]
    assert dllm_rule(CACHED, events) == "evict_unread_only"


# --------------------------------------------------------------------------- dLLM, finishing
def test_length_is_a_finish_reason_when_the_end_token_is_the_last_allowed() -> None:
    """The EOS is the max_new_tokens-th token: EOS and LENGTH both hold. Mutant: LENGTH
    only past max_new_tokens (`>` for `>=`)."""
    config = DllmConfig(
        block_size=4,
        page_size=4,
        kv_pages=4,
        req_pool_rows=1,
        max_running_requests=1,
        max_context=16,
        mode=Mode.SYNC,
        in_place_reuse=False,
        eos_token_id=9,
    )
    events: list[Event] = [
        Submitted("r0", (1, 2, 3, 4), 4),
        Admitted("r0", 0),
        KvAllocated("r0", 0, (0, 1, 2, 3)),
        Forward((row("r0", 0, 0),)),
        StepResult("r0", 0, 4, 0),
        BlockCommitted("r0", 0, (1, 2, 3, 4)),
        ControlReturned(0),
        KvAllocated("r0", 1, (4, 5, 6, 7)),
        Forward((row("r0", 1, 4),)),
        StepResult("r0", 1, 0, 0),
        Forward((row("r0", 1, 0),)),
        StepResult("r0", 1, 4, 0),
        BlockCommitted("r0", 1, (5, 6, 7, 9)),
        KvFreed("r0", (0, 1, 2, 3, 4, 5, 6, 7)),
        RowReleased("r0", 0),
        Finished("r0", FinishReason.LENGTH),
        ControlReturned(1),
    ]
    assert dllm_rule(config, events) == ""


def test_an_abort_with_a_step_result_pending_breaks_step_per_row() -> None:
    """Mutant: the abort's pending-step check dropped (another rule then named it)."""
    config = CACHED.replace(prefix_cache=False, req_pool_rows=1, max_running_requests=1)
    events: list[Event] = [
        Submitted("r0", (1, 2, 3, 4), 4),
        Admitted("r0", 0),
        KvAllocated("r0", 0, (0, 1, 2, 3)),
        Forward((row("r0", 0, 0),)),
        KvFreed("r0", (0, 1, 2, 3)),
        Aborted("r0"),
    ]
    assert dllm_rule(config, events, DllmPolicy(aborts_after_commit=True)) == "step_per_row"


# --------------------------------------------------------------------------- AR
AR = ArConfig(block_size=4, num_blocks=17, max_num_batched_tokens=16, max_num_seqs=2)


def test_an_ar_abort_still_holding_blocks_is_refused() -> None:
    """Mutant: `_aborted` without its blocks check (the blocks leaked for good)."""
    config = AR.replace(num_blocks=3, max_model_len=8)
    events: list[ArEvent] = [
        ArSubmitted("a", 2, 4),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 2),
        ArStepEnd(0),
        ArAborted("a"),
    ]
    assert ar_rule(config, events) == "terminal_holds_nothing"


def test_tokens_are_scheduled_only_into_blocks_already_allocated() -> None:
    """Mutant: `_scheduled` without `kv_covers_scheduled` (only the step's end checked)."""
    events: list[ArEvent] = [
        ArSubmitted("a", 2, 4),
        ArScheduled("a", 2),
        ArBlocksAllocated("a", (1,)),
        ArStepEnd(0),
    ]
    assert ar_rule(AR, events) == "kv_covers_scheduled"


def test_the_fairness_floor_holds_when_the_budget_equals_the_running_count() -> None:
    """Mutant: the floor only when the budget exceeds the running count (`<` for `<=`)."""
    config = AR.replace(max_num_batched_tokens=2, policy=Policy.FAIR)
    events: list[ArEvent] = [
        ArSubmitted("a", 1, 4),
        ArSubmitted("b", 1, 4),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 1),
        ArBlocksAllocated("b", (2,)),
        ArScheduled("b", 1),
        ArStepEnd(0),
        ArScheduled("a", 1),
        ArStepEnd(1),
    ]
    assert ar_rule(config, events) == "token_fairness_floor"


def test_an_ar_request_may_finish_by_length_on_a_stop_at_its_last_token() -> None:
    """Mutant: LENGTH only past max_tokens (`>` for `>=`)."""
    events: list[ArEvent] = [
        ArSubmitted("a", 2, 1, stop_after=1),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 2),
        ArStepEnd(0),
        ArBlocksFreed("a", (1,)),
        ArFinished("a", ArFinishReason.LENGTH),
    ]
    assert ar_rule(AR, events) == ""


# --------------------------------------------------------------------------- the trace reader
HEADER = json.dumps(config_to_dict(CACHED.replace(prefix_cache=False)))


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('{"kind": "control_returned", "round_index": false}', "round_index"),
        (
            '{"kind": "forward", "rows": [{"request_id": "r0", "block_index": 0, '
            '"reused": 0, "num_tokens": 4, "masked": 0}]}',
            "reused",
        ),
    ],
)
def test_json_booleans_and_integers_are_not_each_other(line: str, said: str) -> None:
    """Mutants: the integer check that lets `false` through, the bool check that lets `0`."""
    with pytest.raises(TraceFormatError, match=said):
        list(iter_trace([HEADER, line]))


# --------------------------------------------------------------------------- reconstruct
def test_a_request_moved_to_another_row_releases_the_first() -> None:
    """Mutant: a row change seen only for a request that left every row."""
    before = PoolView(slots={}, rows={0: "r0"}, running=("r0",))
    after = PoolView(slots={}, rows={1: "r0"}, running=("r0",))
    assert reconstruct(before, after) == [RowReleased("r0", 0), RowAcquired("r0", 1)]


def test_a_reserved_row_held_by_a_request_is_refused() -> None:
    """Mutant: `without_reserved` checking the reserved slots only."""
    view = PoolView(slots={4: ("r0", 0)}, rows={0: "r0"}, running=("r0",))
    with pytest.raises(ValueError, match=r"reserved ids \[0\] are held by requests"):
        without_reserved(view, slots=0, rows=1)
