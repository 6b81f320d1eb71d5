"""Every rule of the dLLM spec fires, by its own name, on something that breaks it.

`CASES` holds a minimal event trace for each rule that the tests of `SpecMachine` elsewhere do
not already break by hand; `test_every_rule_is_broken_somewhere` then requires every `Rule` to
be broken here, by a seeded bug of `tests/mutants.py` (rules only a harness sees: reported and
golden outputs, parity, carriers in the snapshot), by a named test elsewhere whose source names
the rule, or be an invariant that event rules shadow (`tests.test_mutants.SHADOWED_INVARIANTS`)
— so a rule added to the spec without a test that breaks it fails the suite.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

from spec import (
    Aborted,
    Admitted,
    BlockCommitted,
    ControlReturned,
    DllmConfig,
    Event,
    Finished,
    FinishReason,
    Forward,
    KvAllocated,
    KvFreed,
    Mode,
    RowReleased,
    SpecMachine,
    SpecViolation,
    StepResult,
    Submitted,
)
from spec.rules import Rule
from tests.mutants import MUTANTS
from tests.test_mutants import SHADOWED_INVARIANTS
from tests.test_spec_machine import CFG, row

# FDFO with in-place reuse, block 2, pages of 4 slots: prompt (5,) + 3 new tokens is two blocks
FDFO = CFG
SYNC = dataclasses.replace(FDFO, mode=Mode.SYNC, in_place_reuse=False)

ADMIT_A: list[Event] = [Submitted("a", (5,), 3), Admitted("a", 0), KvAllocated("a", 0, (0, 1))]
# round 0: block 0 of a is stepped to no masks but not done (its final-KV forward is next)
ROUND_0: list[Event] = [
    *ADMIT_A,
    Forward((row("a", 0, 1),)),
    StepResult("a", 0, 0, 0),
    ControlReturned(0),
]
# round 1 up to block 0's commit (a is still active: 1 of 3 tokens)
COMMIT_0: list[Event] = [
    *ROUND_0,
    Forward((row("a", 0, 0, reused=True),)),
    StepResult("a", 0, 2, 0),
    BlockCommitted("a", 0, (5, 7)),
]

CASES: dict[str, tuple[list[Event], DllmConfig]] = {
    "unique_submission": ([Submitted("a", (5,), 1), Submitted("a", (5,), 1)], FDFO),
    "valid_request": ([Submitted("a", (), 1)], FDFO),
    "known_request": ([Aborted("nobody")], FDFO),
    "lifecycle": ([Submitted("a", (5,), 1), Admitted("a", 0), Admitted("a", 1)], FDFO),
    "committed_prefix_kept": (
        [
            *COMMIT_0,
            KvFreed("a", (0, 1)),  # the committed block's KV, while a is still active
            ControlReturned(1),
        ],
        FDFO,
    ),
    "forward_ready": ([*ADMIT_A, Forward(())], FDFO),
    "batch_stable": (
        [
            Submitted("a", (5,), 3),
            Submitted("b", (6,), 3),
            Admitted("a", 0),
            Admitted("b", 1),
            KvAllocated("a", 0, (0, 1)),
            KvAllocated("b", 0, (4, 5)),
            Forward((row("a", 0, 1), row("b", 0, 1))),
            StepResult("a", 0, 0, 0),
            StepResult("b", 0, 0, 0),
            Forward((row("a", 0, 0),)),  # b left out of the round's batch
        ],
        SYNC,
    ),
    "forward_policy": (
        [
            *ADMIT_A,
            Forward((row("a", 0, 1),)),
            StepResult("a", 0, 0, 0),
            Forward((row("a", 0, 0),)),
        ],
        FDFO,
    ),
    "step_per_row": ([*ADMIT_A, Forward((row("a", 0, 1),)), Forward((row("a", 0, 1),))], FDFO),
    "accept_length": ([*ADMIT_A, Forward((row("a", 0, 1),)), StepResult("a", 0, 1, 0)], FDFO),
    "prompt_preserved": (
        [
            *ROUND_0,
            Forward((row("a", 0, 0, reused=True),)),
            StepResult("a", 0, 2, 0),
            BlockCommitted("a", 0, (6, 7)),  # position 0 is the prompt's 5
        ],
        FDFO,
    ),
    "finish_condition": (
        [*COMMIT_0, KvFreed("a", (0, 1)), RowReleased("a", 0), Finished("a", FinishReason.LENGTH)],
        FDFO,
    ),
    "round_order": ([ControlReturned(1)], FDFO),
    "work_conserving": (
        [
            Submitted("a", (5,), 3),
            Submitted("b", (6,), 3),
            Admitted("a", 0),
            KvAllocated("a", 0, (0, 1)),
            Forward((row("a", 0, 1),)),
            StepResult("a", 0, 0, 0),
            ControlReturned(0),
            Forward((row("a", 0, 0, reused=True),)),  # round 1 admits nothing; b fits
        ],
        FDFO,
    ),
    "progress": ([*ADMIT_A, ControlReturned(0)], FDFO),
    "fdfo_releases_same_round": (
        [
            *ROUND_0,
            Forward((row("a", 0, 0, reused=True),)),
            StepResult("a", 0, 2, 0),
            ControlReturned(1),  # done but not committed
        ],
        FDFO,
    ),
}

MACHINE, PROFILE, BASE, CACHE = (
    "tests.test_spec_machine",
    "tests.test_spec_profile",
    "tests.test_spec_base",
    "tests.test_spec_prefix_cache",
)
# rule -> (module, test) elsewhere that breaks it by hand (the test's source names the rule)
ELSEWHERE: dict[str, tuple[str, str]] = {
    "final_forward_before_commit": (MACHINE, "test_final_forward_before_commit"),
    "fcfs_admission": (MACHINE, "test_fcfs_and_max_running_and_rows"),
    "max_running": (MACHINE, "test_fcfs_and_max_running_and_rows"),
    "row_exclusive": (MACHINE, "test_fcfs_and_max_running_and_rows"),
    "page_alignment": (MACHINE, "test_page_alignment_and_exclusive_slots"),
    "kv_exclusive": (MACHINE, "test_page_alignment_and_exclusive_slots"),
    "whole_block_alloc": (MACHINE, "test_page_alignment_and_exclusive_slots"),
    "whole_block_rows": (MACHINE, "test_ragged_rows_and_carrier_continuity"),
    "carrier_continuity": (MACHINE, "test_ragged_rows_and_carrier_continuity"),
    "terminal_owns_nothing": (MACHINE, "test_terminal_requests_own_nothing_and_double_free"),
    "free_owned_only": (MACHINE, "test_terminal_requests_own_nothing_and_double_free"),
    "sync_yields_when_all_done": (MACHINE, "test_sync_yields_only_when_all_done"),
    "no_reuse_releases": (MACHINE, "test_no_reuse_requires_release_and_reuse_forbids_it"),
    "reuse_keeps_slots": (MACHINE, "test_no_reuse_requires_release_and_reuse_forbids_it"),
    "snapshot_matches": (MACHINE, "test_snapshot_mismatch_is_reported"),
    "scheduler_phase": (MACHINE, "test_abort_mid_round_is_rejected_with_a_violation_not_a_crash"),
    "prefill_first": (PROFILE, "test_prefill_first_refuses_a_mixed_batch"),
    "fdfo_sync_parity": (
        "tests.test_mutants",
        "test_without_a_golden_decoder_batch_parity_catches_a_mode_bug",
    ),
    "implementation_error": (BASE, "test_unexpected_exception_is_an_implementation_error_finding"),
    "prefix_cache_on": (CACHE, "test_cache_events_need_a_cache_prefix_cache_on"),
    "cache_committed_only": (
        CACHE,
        "test_only_a_committed_block_owned_whole_is_cached_cache_committed_only",
    ),
    "cache_hit_content": (CACHE, "test_a_hit_reads_only_its_own_content_cache_hit_content"),
    "evict_unread_only": (CACHE, "test_only_unread_whole_blocks_are_evicted_evict_unread_only"),
    "twin_decisions": (
        "tests.test_decisions",
        "test_a_twin_of_another_policy_fails_the_suite_by_twin_decisions",
    ),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_the_rule_fires_by_its_name(rule: str) -> None:
    events, config = CASES[rule]
    machine = SpecMachine(config)
    *before, last = events
    for event in before:
        machine.apply(event)  # everything up to the last event conforms
    with pytest.raises(SpecViolation) as caught:
        machine.apply(last)
    assert caught.value.rule == rule, str(caught.value)
    assert str(caught.value).startswith(f"[{rule}]") and "state:" in str(caught.value)


def test_every_rule_is_broken_somewhere() -> None:
    by_mutant = {m.rule for m in MUTANTS.values()}
    for rule in Rule:
        name = str(rule)
        if name in CASES or name in by_mutant or name in SHADOWED_INVARIANTS:
            continue  # a shadowed invariant: the mutants that try are caught by event rules
        assert name in ELSEWHERE, f"no test breaks the rule {name!r}"
        assert_the_test_names_its_rule(name, *ELSEWHERE[name])


def assert_the_test_names_its_rule(rule: str, module: str, function: str) -> None:
    """The test `module.function`, said to break `rule` by hand, names it in its source."""
    test = getattr(importlib.import_module(module), function)
    assert f'"{rule}"' in inspect.getsource(test), f"{module}.{function} does not name {rule}"
