"""Rule `admission_progress` (declared by vLLM's profiles and logs): an admission pass stops
only at a request it cannot admit. A step that preempted nothing, unpaused, does not end with
the first waiting request the admission rules allow still waiting where it fits (a seat,
the budget for all its tokens or, with chunked prefill, for a chunk, the blocks for what it
reaches above the watermark). It catches a pass that stops at a request it passes over
(awaiting, adapter-blocked) and one that admits less than fits; it asks nothing where the
request may not fit, nor where the rules let a pass stop early."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from properties.ar.harness import ArHarness
from properties.ar.trace_check import check_ar_trace
from reference.ar.prefix_cache import make_vllm_v1_prefix
from reference.ar.vllm_v1 import make_vllm_v1_033
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import AdmissionOrder, ArConfig, ArRequest, ArRules, Policy
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPauseSet,
    ArPreempted,
    ArReady,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArPolicy
from tests.test_ar_awaiting import BEHIND_AN_AWAITING_ONE, log_of
from tests.test_ar_rules_fire import CFG, NO_CHUNKING, ONE_SEAT

PROGRESS = ArPolicy(admission_progress=True)


def verdict(events: Sequence[ArEvent], config: ArConfig = CFG, policy: ArPolicy = PROGRESS) -> str:
    """The violation the check gives the log of `events` under `policy` ("" where none)."""
    found = check_ar_trace(log_of(events, config), policy=policy).violation
    return "" if found is None else str(found)


def a_admitted_then(*after: ArEvent, b_tokens: int = 3, a_tokens: int = 3) -> list[ArEvent]:
    """a (`a_tokens`, one block) and b (`b_tokens`) wait; step 0 admits a alone; then
    `after`."""
    return [
        ArSubmitted("a", a_tokens, 2),
        ArSubmitted("b", b_tokens, 2),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", a_tokens),
        *after,
        ArStepEnd(0),
    ]


def test_a_request_that_fits_whole_left_waiting_fails() -> None:
    """b needs 3 tokens of the 5 left and one block of the 7 free: the step that admitted a
    alone fails, saying what fit; undeclared, the same log conforms."""
    said = verdict(a_admitted_then())
    assert said.startswith(
        "[admission_progress] step 0 left 'b' waiting, the first request the admission rules "
        "allow, though it fits whole: a seat free (1 of 2 running), its 3 token(s) within the "
        "5 left of the budget, its 1 block(s) within the 7 free"
    ), said
    assert verdict(a_admitted_then(), policy=ArPolicy()) == ""
    admitted = a_admitted_then(ArBlocksAllocated("b", (2,)), ArScheduled("b", 3))
    assert verdict(admitted) == ""


def test_a_request_whose_chunk_fits_left_waiting_fails_under_chunked_prefill() -> None:
    """b's 6 tokens exceed the 5 left of the budget, but with chunked prefill vLLM admits a
    chunk of 5 (2 blocks of the 7 free): the step fails, saying so. With chunked prefill off
    only a whole fit is asked, and b may wait."""
    said = verdict(a_admitted_then(b_tokens=6))
    assert (
        "left 'b' waiting, the first request the admission rules allow, though a chunk of it "
        "fits (chunked prefill): a seat free (1 of 2 running), 5 token(s) left of the budget "
        "for its 6, its 2 block(s) within the 7 free"
    ) in said, said
    assert verdict(a_admitted_then(b_tokens=6), NO_CHUNKING) == ""
    assert "it fits whole" in verdict(a_admitted_then(), NO_CHUNKING)


def test_under_the_whole_sequence_gate_a_chunk_needs_the_whole_sequences_blocks() -> None:
    """b (9 tokens, max_model_len 12) finds 5 tokens of the budget left: its chunk reaches 2
    blocks, which fit the 7 free above a watermark of 5, so it is asked; under the
    whole-sequence gate (vLLM's scheduler_reserve_full_isl) it needs all 3, and may wait."""
    config = CFG.replace(max_model_len=12)
    mark = ArPolicy(admission_progress=True, watermark_fraction=0.65)
    said = verdict(a_admitted_then(b_tokens=9), config, mark)
    assert "its 2 block(s) within the 7 free above the watermark (5)" in said, said
    whole = dataclasses.replace(mark, full_sequence_admission=True)
    assert verdict(a_admitted_then(b_tokens=9), config, whole) == ""


def cached_then_b(b_prompt: tuple[int, ...], x_tokens: int = 4) -> list[ArEvent]:
    """a's 4-token prompt is computed and cached in step 0 (block 1, free once a finishes);
    in step 1 x takes `x_tokens` of the 8 tokens (one block) and b (`b_prompt`) waits."""
    return [
        ArSubmitted("a", 4, 1, prompt=(1, 2, 3, 4)),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 4),
        ArStepEnd(0),
        ArBlocksFreed("a", (1,)),
        ArFinished("a", ArFinishReason.LENGTH),
        ArSubmitted("x", x_tokens, 2, prompt=(9,) * x_tokens),
        ArSubmitted("b", len(b_prompt), 2, prompt=b_prompt),
        ArBlocksAllocated("x", (2,)),
        ArScheduled("x", x_tokens),
        ArStepEnd(1),
    ]


def test_a_chunk_starts_past_the_cache_hit_it_would_take() -> None:
    """With a's block cached, b's chunk of 4 would start past its hit of 4 tokens and reach
    2 blocks, the hit's evictable one among them: above a watermark of 6 only 1 of the 7
    free may go, and b may wait. Sharing no prefix its chunk needs 1 block: asked."""
    config = CFG.replace(enable_prefix_caching=True, max_model_len=12)
    mark = ArPolicy(admission_progress=True, watermark_fraction=0.75)
    assert verdict(cached_then_b((1, 2, 3, 4, 5, 6, 7, 8)), config, mark) == ""
    said = verdict(cached_then_b((5, 5, 5, 5, 5, 6, 7, 8)), config, mark)
    assert "4 token(s) left of the budget for its 8, its 1 block(s) within the 7 free" in said
    wider = ArPolicy(admission_progress=True, watermark_fraction=0.6)
    said = verdict(cached_then_b((1, 2, 3, 4, 5, 6, 7, 8)), config, wider)
    assert "for its 8 past its cache hit of 4, its 2 block(s) within the 7 free" in said, said


def test_a_request_that_may_not_fit_may_wait() -> None:
    """With one seat, or a watermark b's block would break (7 of the 8 usable blocks), or
    no token of the budget left, nothing is asked."""
    assert verdict(a_admitted_then(), ONE_SEAT) == ""
    watermark = ArPolicy(admission_progress=True, watermark_fraction=0.9)
    assert verdict(a_admitted_then(), policy=watermark) == ""
    full = CFG.replace(max_num_batched_tokens=3)
    assert verdict(a_admitted_then(b_tokens=6), full) == ""


def test_a_pass_that_stops_at_an_awaiting_request_fails_naming_it() -> None:
    """x runs; a awaits its grammar: b behind it fits, and a pass that stops at a leaves it
    waiting (the log tests/test_ar_awaiting.py's twin test checks undeclared). Once a is
    ready, a pass that schedules x alone leaves a, the head, waiting: that fails too."""
    said = verdict([*BEHIND_AN_AWAITING_ONE, ArStepEnd(1)])
    assert "step 1 left 'b' waiting" in said, said
    assert "(past 'a', awaiting its grammar)" in said, said
    ready = [
        *BEHIND_AN_AWAITING_ONE,
        ArBlocksAllocated("b", (2,)),
        ArScheduled("b", 4),
        ArStepEnd(1),
        ArBlocksFreed("b", (2,)),
        ArFinished("b", ArFinishReason.LENGTH),
    ]
    assert verdict(ready) == ""
    later = [*ready, ArReady("a"), ArBlocksAllocated("x", (3,)), ArScheduled("x", 1), ArStepEnd(2)]
    assert "step 2 left 'a' waiting" in verdict(later)


def test_lora_a_pass_that_stops_at_a_blocked_adapter_fails_naming_it() -> None:
    """One adapter slot: a (adapter 1) runs, b (adapter 2) finds no room, c (the base model)
    fits: a step that leaves c waiting fails, naming b and why."""
    events: list[ArEvent] = [
        ArSubmitted("a", 3, 2, lora=1),
        ArSubmitted("b", 3, 2, lora=2),
        ArSubmitted("c", 3, 2),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 3),
        ArStepEnd(0),
    ]
    said = verdict(events, CFG.replace(max_loras=1, max_num_seqs=3))
    assert "left 'c' waiting" in said and "(past 'b', whose adapter 2 finds no room)" in said


def test_under_priority_the_least_key_is_asked() -> None:
    """c (priority 2), a (1) and b (0) arrive in that order: b is admitted; then a, not c
    ahead of it in the queue, is the request left waiting; with a admitted too, c is."""
    config = CFG.replace(policy=Policy.PRIORITY, max_num_seqs=3, max_num_batched_tokens=16)
    events: list[ArEvent] = [
        ArSubmitted("c", 3, 2, priority=2),
        ArSubmitted("a", 3, 2, priority=1),
        ArSubmitted("b", 3, 2, priority=0),
        ArBlocksAllocated("b", (1,)),
        ArScheduled("b", 3),
        ArStepEnd(0),
    ]
    assert "left 'a' waiting" in verdict(events, config)
    both = [*events[:5], ArBlocksAllocated("a", (2,)), ArScheduled("a", 3), ArStepEnd(0)]
    assert "left 'c' waiting" in verdict(both, config)


def test_lookahead_slots_count_against_the_free_blocks() -> None:
    """With 2 lookahead slots (and 2 drafts) b's 3 tokens need 7 slots, 2 blocks; 6 are free
    above a watermark of 5 after a took its 2: b may wait. Without the slots 1 block would
    do, and b is asked."""
    config = CFG.replace(num_speculative_tokens=2, num_lookahead_tokens=2)
    policy = ArPolicy(admission_progress=True, watermark_fraction=0.7)
    events: list[ArEvent] = [
        ArSubmitted("a", 3, 2),
        ArSubmitted("b", 3, 2),
        ArBlocksAllocated("a", (1, 2)),
        ArScheduled("a", 3),
        ArStepEnd(0),
    ]
    assert verdict(events, config, policy) == ""
    assert "left 'b' waiting" in verdict(events, CFG, policy)


def test_a_drafters_tokens_and_rows_count_against_the_budget() -> None:
    """With k drafts vLLM may pad a one-token request to k + 1 tokens, and a draft model adds
    one input row per scheduled request: b is asked only where the budget left covers its
    tokens and those too (8 - 3 = 5 left after a): all of them with chunked prefill off, a
    one-token chunk's with it on."""
    whole = NO_CHUNKING
    assert "left 'b' waiting" in verdict(a_admitted_then(), whole.replace(num_speculative_tokens=2))
    assert verdict(a_admitted_then(), whole.replace(num_speculative_tokens=3)) == ""
    assert "left 'b' waiting" in verdict(a_admitted_then(b_tokens=4), whole)
    rows = whole.replace(num_drafting_slots=1)  # 8 - 3 - 1 = 4 left; b needs 4 and a row
    assert verdict(a_admitted_then(b_tokens=4), rows) == ""
    chunked = CFG.replace(num_speculative_tokens=3)  # a one-token chunk padded to 4 of 5
    assert "a chunk of it fits" in verdict(a_admitted_then(), chunked)
    assert verdict(a_admitted_then(), chunked.replace(num_drafting_slots=1)) == ""


def test_a_step_that_preempted_is_not_asked() -> None:
    """A step that preempted admits nothing (vLLM): b waits though it fits."""
    events: list[ArEvent] = [
        ArSubmitted("a", 3, 4),
        ArSubmitted("c", 3, 4),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 3),
        ArBlocksAllocated("c", (2,)),
        ArScheduled("c", 3),
        ArStepEnd(0),
        ArSubmitted("b", 3, 2),
        ArScheduled("c", 1),
        ArPreempted("a", (1,)),
        ArStepEnd(1),
    ]
    assert verdict(events, CFG.replace(max_num_seqs=3)) == ""


@pytest.mark.parametrize(
    "policy",
    [
        ArPolicy(admission_progress=True, prefill_interval=2),
        ArPolicy(admission_progress=True, rules=ArRules(fcfs_lookahead=1)),
        ArPolicy(admission_progress=True, rules=ArRules(static_batches=True)),
        ArPolicy(admission_progress=True, rules=ArRules(token_cap=3)),
        ArPolicy(admission_progress=True, rules=ArRules(max_wait_steps=3)),
        ArPolicy(admission_progress=True, rules=ArRules(admission=AdmissionOrder.SJF)),
    ],
    ids=["cadence", "look-ahead", "static-batches", "token-cap", "aging", "sjf"],
)
def test_rules_that_let_a_pass_stop_early_are_not_asked(policy: ArPolicy) -> None:
    """Beside a cadence, a look-ahead, static batches, a token cap or aging, or under a
    policy other than FCFS and priority, the pass may stop for reasons of its own: the log
    that leaves b waiting conforms."""
    assert verdict(a_admitted_then(), policy=policy) == ""


def test_a_paused_step_is_not_asked() -> None:
    """Under paused_new no request is admitted: b waits, and nothing is asked."""
    events: list[ArEvent] = [
        ArSubmitted("a", 3, 2),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 3),
        ArStepEnd(0),
        ArSubmitted("b", 3, 2),
        ArPauseSet("paused_new"),
        ArScheduled("a", 1),
        ArStepEnd(1),
    ]
    assert verdict(events) == ""
    unpaused = [e for e in events if not isinstance(e, ArPauseSet)]
    assert "step 1 left 'b' waiting" in verdict(unpaused)


@pytest.mark.parametrize("factory", [make_vllm_v1_033, make_vllm_v1_prefix])
def test_the_reference_vllm_twins_keep_it(factory: ArImplementationFactory) -> None:
    """The reference vLLM schedulers, which declare it, admit every request that fits: a
    burst of small requests is admitted in one step, checked event by event."""
    h = ArHarness(factory, CFG, policy=PROGRESS)
    for rid in ("a", "b", "c"):
        h.submit(ArRequest(rid, 3, 2))
    h.step()
    assert {e.request_id for e in h.events if isinstance(e, ArScheduled)} == {"a", "b"}
    h.drain()
    assert h.violation is None, h.violation


def test_a_chunks_blocks_cover_its_drafts_and_no_more_than_its_tokens() -> None:
    """No whole-sequence gate, 7 blocks free after a's. With one draft, b's chunk of the 4
    tokens left reaches 5 slots, 2 blocks: above a watermark of 6 it may wait, above 5 it is
    asked; with a drafter's row too, its chunk is 3 tokens, 4 slots, 1 block. A chunk
    reaches no further than the prompt: b's 6 tokens past a hit of 4 need 2 blocks, not the
    3 of the hit and the 5 tokens left."""
    config = CFG.replace(max_model_len=12, num_speculative_tokens=1)
    mark = ArPolicy(admission_progress=True, watermark_fraction=0.75)
    assert verdict(a_admitted_then(a_tokens=4, b_tokens=9), config, mark) == ""
    wider = ArPolicy(admission_progress=True, watermark_fraction=0.65)
    assert "its 2 block(s) within the 7 free" in verdict(
        a_admitted_then(a_tokens=4, b_tokens=9), config, wider
    )
    # a drafter's row for b comes out of the budget its chunk may take: 3 tokens, 1 block
    rows = config.replace(num_drafting_slots=1)
    assert "its 1 block(s) within the 7 free" in verdict(a_admitted_then(b_tokens=9), rows, mark)
    caching = CFG.replace(enable_prefix_caching=True, max_model_len=12)
    said = verdict(cached_then_b((1, 2, 3, 4, 5, 6), x_tokens=3), caching, wider)
    assert "5 token(s) left of the budget for its 6 past its cache hit of 4, its 2 block(s)" in (
        said
    ), said
