"""Every rule of the AR spec fires, by its own name, on something that breaks it.

`CASES` holds a minimal AR event trace for each rule that the AR tests elsewhere do not already
break by hand: every event but the last conforms and the last breaks the rule. `CHECKS` holds
the rules only the between-steps checks see (an invariant over the state after clean events, or
the implementation's own snapshot). `test_every_ar_rule_is_broken_somewhere` then requires every
`ArRule` to be broken here, by a seeded bug of `tests/ar_mutants.py`, by a named test elsewhere
whose source names the rule, or be an invariant that event rules shadow (`SHADOWED`: the trace
that tries to break it is caught by the named event rule first, and the invariant itself still
names its rule on a state no event can reach) — so an AR rule added to the spec without a test
that breaks it fails the suite.
"""

from __future__ import annotations

import dataclasses

import pytest

from spec.ar.config import ArConfig, ArRules
from spec.ar.events import (
    ArAborted,
    ArAwaiting,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheHit,
    ArCacheReset,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArOutputTokens,
    ArPauseSet,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.invariants import check_all
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArPolicy
from spec.ar.rules import ArRule
from spec.ar.snapshot import ArSnapshot
from spec.ar.state import ArState
from spec.errors import SpecViolation
from tests.ar_mutants import AR_MUTANTS
from tests.test_spec_rules_fire import assert_the_test_names_its_rule

# blocks of 4 tokens, 8 usable (block 0 is the null block), at most 2 blocks per request
CFG = ArConfig(
    block_size=4, num_blocks=9, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=8
)
ONE_SEAT = CFG.replace(max_num_seqs=1)
NO_CHUNKING = CFG.replace(enable_chunked_prefill=False)
CACHING = CFG.replace(enable_prefix_caching=True)
STATIC = ArPolicy(rules=ArRules(static_batches=True))

# a's whole 4-token prompt in one block, scheduled in step 0
ADMIT_A: list[ArEvent] = [ArSubmitted("a", 4, 2), ArBlocksAllocated("a", (1,)), ArScheduled("a", 4)]
# after step 0: a runs with its prompt computed and 1 of its 2 outputs sampled
STEP_0: list[ArEvent] = [*ADMIT_A, ArStepEnd(0)]
# after step 0: a (5-token prompt, two blocks) runs with 1 of its 2 outputs sampled
TWO_BLOCKS: list[ArEvent] = [
    ArSubmitted("a", 5, 2),
    ArBlocksAllocated("a", (1, 2)),
    ArScheduled("a", 5),
    ArStepEnd(0),
]

CASES: dict[str, tuple[list[ArEvent], ArConfig]] = {
    "unique_submission": ([ArSubmitted("a", 4, 2), ArSubmitted("a", 4, 2)], CFG),
    "valid_request": ([ArSubmitted("a", 0, 2)], CFG),
    "known_request": ([ArAborted("nobody")], CFG),
    "lifecycle": ([ArSubmitted("a", 4, 2), ArFinished("a", ArFinishReason.LENGTH)], CFG),
    "seat_cap": (
        [
            ArSubmitted("a", 4, 2),
            ArSubmitted("b", 4, 2),
            *ADMIT_A[1:],
            ArBlocksAllocated("b", (2,)),
            ArScheduled("b", 4),  # a second running request with one seat
        ],
        ONE_SEAT,
    ),
    "one_schedule_per_step": ([*ADMIT_A, ArScheduled("a", 1)], CFG),
    "no_compute_past_known": (
        [ArSubmitted("a", 4, 2), ArBlocksAllocated("a", (1, 2)), ArScheduled("a", 5)],
        CFG,
    ),
    "no_chunking_when_disabled": (
        [ArSubmitted("a", 4, 2), ArBlocksAllocated("a", (1,)), ArScheduled("a", 2)],
        NO_CHUNKING,
    ),
    "step_order": ([ArStepEnd(1)], CFG),
    "kv_bounded": ([ArSubmitted("a", 4, 2), ArBlocksAllocated("a", (1, 2, 3))], CFG),
    "kv_exclusive": (
        [
            ArSubmitted("a", 4, 2),
            ArSubmitted("b", 4, 2),
            ArBlocksAllocated("a", (1,)),
            ArBlocksAllocated("b", (1,)),  # a already holds block 1; prefix caching is off
        ],
        CFG,
    ),
    "null_block_reserved": ([ArSubmitted("a", 4, 2), ArBlocksAllocated("a", (0,))], CFG),
    "cache_hit_bounded": (
        # a 4-token prompt: a one-block hit would leave no token to compute and sample from
        [ArSubmitted("a", 4, 2), ArCacheHit("a", (1,))],
        CACHING,
    ),
    "preempt_frees_all": ([*TWO_BLOCKS, ArPreempted("a", (1,))], CFG),  # a also holds block 2
    "finish_condition": ([*STEP_0, ArFinished("a", ArFinishReason.LENGTH)], CFG),  # 1 of 2
    "finish_released": (
        # a produced its only output in step 0 but is still running when step 1 ends
        [ArSubmitted("a", 4, 1), *ADMIT_A[1:], ArStepEnd(0), ArStepEnd(1)],
        CFG,
    ),
    "cache_reset": ([*STEP_0, ArCacheReset()], CFG),  # a still runs, holding block 1
    "pause": (
        # paused_new between steps: b, waiting, is admitted all the same
        [*STEP_0, ArSubmitted("b", 4, 2), ArPauseSet("paused_new"), ArBlocksAllocated("b", (2,))],
        CFG,
    ),
    "speculative_drafts": (
        # a decodes its last token and one draft, with speculative decoding off
        [*TWO_BLOCKS[:3], ArStepEnd(0), ArScheduled("a", 2, drafts=1)],
        CFG,
    ),
    "output_tokens": (
        # a produced 1 output in step 0, and the log names the ids of 2
        [*STEP_0, ArOutputTokens("a", (7, 8))],
        CFG,
    ),
    "awaiting": (
        # a awaits its grammar (no ar_ready), and is given a block
        [ArSubmitted("a", 4, 2), ArAwaiting("a", "grammar"), ArBlocksAllocated("a", (1,))],
        CFG,
    ),
    "lora_slots": (
        # a (adapter 1) and b (adapter 2) admitted in one step with one adapter slot
        [
            ArSubmitted("a", 4, 2, lora=1),
            ArSubmitted("b", 4, 2, lora=2),
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 4),
            ArBlocksAllocated("b", (2,)),
            ArScheduled("b", 4),
        ],
        CFG.replace(max_loras=1),
    ),
    "cache_hit_longest": (
        # a's prompt block (1) stays cached; b, whose prompt starts with it, takes no hit
        [
            ArSubmitted("a", 5, 1, prompt=(1, 2, 3, 4, 5)),
            ArBlocksAllocated("a", (1, 2)),
            ArScheduled("a", 5),
            ArStepEnd(0),
            ArBlocksFreed("a", (1, 2)),
            ArFinished("a", ArFinishReason.LENGTH),
            ArSubmitted("b", 5, 1, prompt=(1, 2, 3, 4, 6)),
            ArBlocksAllocated("b", (3, 4)),
        ],
        CACHING,
    ),
    "admission_progress": (
        # b (3 tokens, one block) waits through step 0 beside a though it fits whole
        [
            ArSubmitted("a", 3, 2),
            ArSubmitted("b", 3, 2),
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 3),
            ArStepEnd(0),
        ],
        CFG,
    ),
    "static_batch": (
        # b is admitted while a, of the batch of step 0, still runs
        [*STEP_0, ArSubmitted("b", 4, 2), ArBlocksAllocated("b", (2,)), ArScheduled("b", 4)],
        CFG,
    ),
}
# the rules of CASES that hold only under a declared policy option
POLICIES: dict[str, ArPolicy] = {
    "static_batch": STATIC,
    "cache_hit_longest": ArPolicy(longest_cache_hit=True),
    "admission_progress": ArPolicy(admission_progress=True),
}


def _snapshot(free: frozenset[int], waiting: tuple[str, ...]) -> ArSnapshot:
    """The implementation's own view with nothing running: `free` blocks and its queue."""
    return ArSnapshot(free, {}, (), waiting, {rid: 0 for rid in waiting})


ALL_FREE = frozenset(range(1, CFG.num_blocks))

# rule -> (clean events, config, snapshot): after the events `check_snapshot(snapshot)`, or with
# no snapshot `check_invariants(between_steps=True)`, breaks the rule
CHECKS: dict[str, tuple[list[ArEvent], ArConfig, ArSnapshot | None]] = {
    # a running request gave back the block of its 4 computed tokens
    "kv_covers_computed": ([*STEP_0, ArBlocksFreed("a", (1,))], CFG, None),
    "waiting_holds_nothing": (
        [
            ArSubmitted("a", 4, 2),
            ArSubmitted("b", 4, 2),
            *ADMIT_A[1:],
            ArBlocksAllocated("b", (2,)),  # b gets a block but is never scheduled
            ArStepEnd(0),
        ],
        CFG,
        None,
    ),
    # the implementation's queue has b ahead of a, which arrived first
    "waiting_order": (
        [ArSubmitted("a", 4, 2), ArSubmitted("b", 4, 2)],
        CFG,
        _snapshot(ALL_FREE, ("b", "a")),
    ),
    # the implementation's allocator lost block 1: nobody holds it and it is not free
    "snapshot_matches": ([ArSubmitted("a", 4, 2)], CFG, _snapshot(ALL_FREE - {1}, ("a",))),
}

# invariant -> why no event trace reaches it: the named event rule fires first
SHADOWED: dict[str, str] = {
    "block_conservation": "The machine updates block tables and holders together, so an event "
    "that would split them (freeing a block the request does not hold) breaks "
    "`free_owned_only` first.",
    "preempted_holds_nothing": "A preempted request is given blocks again only by a re-admission "
    "in the step that preempted it, which breaks `no_admission_after_preemption` first (and "
    "where the implementation declares such re-admission the invariant is off).",
}
# invariant -> (the event rule that fires first, a trace that tries to break the invariant)
SHADOW_TRIES: dict[str, tuple[str, list[ArEvent]]] = {
    "block_conservation": (
        "free_owned_only",
        [ArSubmitted("a", 4, 2), ArBlocksAllocated("a", (1,)), ArBlocksFreed("a", (2,))],
    ),
    "preempted_holds_nothing": (
        "no_admission_after_preemption",
        [*TWO_BLOCKS, ArPreempted("a", (1, 2)), ArBlocksAllocated("a", (1,))],
    ),
}


def _corrupt(rule: str, state: ArState) -> ArState:
    """`state` (after the trace of SHADOW_TRIES less its last event) changed as no event can."""
    if rule == "block_conservation":  # a holds block 2 without listing it
        return dataclasses.replace(
            state, block_holders={**state.block_holders, 2: frozenset({"a"})}
        )
    a = state.requests["a"]  # preempted_holds_nothing: the victim keeps its computed tokens
    return dataclasses.replace(
        state, requests={"a": dataclasses.replace(a, num_computed=a.prompt_len)}
    )


PROFILE, PREFIX, VIDUR, BASE = (
    "tests.test_ar_profile",
    "tests.test_ar_prefix",
    "tests.test_ar_vidur",
    "tests.test_spec_base",
)
# rule -> (module, test) elsewhere that breaks it by hand (the test's source names the rule)
ELSEWHERE: dict[str, tuple[str, str]] = {
    "long_prefill_threshold": (PROFILE, "test_lone_request_threshold_exemption"),
    "full_sequence_admission": (PROFILE, "test_full_sequence_admission_gate"),
    "admission_watermark": (PROFILE, "test_watermark"),
    "prefill_cadence": (PROFILE, "test_prefill_cadence_holds_prefill_while_a_request_decodes"),
    "cache_hit_enabled": (PREFIX, "test_cache_hit_needs_prefix_caching_on"),
    "no_admission_after_preemption": (
        VIDUR,
        "test_same_step_readmission_is_legal_where_declared",
    ),
    # raised by `ReplayHarness.guarded`, which the AR conformance machine shares with the dLLM
    # one (an AR engine's case, tests.test_real_vidur, needs Vidur installed)
    "implementation_error": (BASE, "test_unexpected_exception_is_an_implementation_error_finding"),
    # checked by an engine's adapter on its own record (Vidur's Batch.num_kv_tokens)
    "batch_context": (
        "tests.test_vidur_batch_context",
        "test_a_subclass_that_miscounts_the_context_fails_batch_context",
    ),
    # a cross-run rule: the suite with a decision twin of another policy
    "twin_decisions": (
        "tests.test_ar_decisions",
        "test_a_twin_without_vllms_options_fails_the_suite_by_twin_decisions",
    ),
}


def _machine(config: ArConfig, rule: str = "") -> ArSpecMachine:
    return ArSpecMachine(config, POLICIES.get(rule))


@pytest.mark.parametrize("rule", sorted(CASES))
def test_the_ar_rule_fires_by_its_name(rule: str) -> None:
    events, config = CASES[rule]
    machine = _machine(config, rule)
    *before, last = events
    for event in before:
        machine.apply(event)  # everything up to the last event conforms
    with pytest.raises(SpecViolation) as caught:
        machine.apply(last)
    message = str(caught.value)
    assert caught.value.rule == rule, message
    assert message.startswith(f"[{rule}]") and f"event: {last!r}" in message, message
    assert "state:" in message and "step " in message and "pool: " in message, message


def test_the_policy_option_is_what_the_policy_cases_break() -> None:
    """Without its option a policy case's whole trace conforms: the option is what breaks."""
    for rule in POLICIES:
        events, config = CASES[rule]
        _machine(config).apply_all(events)


@pytest.mark.parametrize("rule", sorted(CHECKS))
def test_the_ar_check_fires_by_its_name(rule: str) -> None:
    events, config, snapshot = CHECKS[rule]
    machine = _machine(config)
    for event in events:
        machine.apply(event)
        machine.check_invariants()  # every event conforms, and so does the state after it
    with pytest.raises(SpecViolation) as caught:
        if snapshot is None:
            machine.check_invariants(between_steps=True)
        else:
            machine.check_snapshot(snapshot)
    message = str(caught.value)
    assert caught.value.rule == rule, message
    assert message.startswith(f"[{rule}]") and "state:" in message, message
    if snapshot is None:  # the whole-state check agrees with the incremental one
        with pytest.raises(SpecViolation) as full:
            machine.check_invariants_full(between_steps=True)
        assert full.value.rule == rule, str(full.value)


@pytest.mark.parametrize("rule", sorted(SHADOWED))
def test_a_shadowed_ar_invariant_is_caught_by_the_event_rule_first(rule: str) -> None:
    first, events = SHADOW_TRIES[rule]
    assert f"`{first}`" in SHADOWED[rule]
    machine = _machine(CFG)
    *before, last = events
    for event in before:
        machine.apply(event)
        machine.check_invariants()
    with pytest.raises(SpecViolation) as caught:
        machine.apply(last)
    assert caught.value.rule == first, str(caught.value)
    # the invariant is not dead: on a state no event reaches, it names its rule
    assert check_all(machine.state()) is None
    failure = check_all(_corrupt(rule, machine.state()))
    assert failure is not None and failure[0] == rule, failure


def test_every_ar_rule_is_broken_somewhere() -> None:
    by_mutant = {m.rule for m in AR_MUTANTS.values()}
    here = CASES.keys() | CHECKS.keys() | SHADOWED.keys()
    for rule in ArRule:
        name = str(rule)
        if name in here or name in by_mutant:
            continue
        assert name in ELSEWHERE, f"no test breaks the AR rule {name!r}"
        assert_the_test_names_its_rule(name, *ELSEWHERE[name])
