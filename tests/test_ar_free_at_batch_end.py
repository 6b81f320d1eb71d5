"""`ArRules.free_at_batch_end`, FasterTransformer's batch-end free declared: a finished request of
a static batch may keep its blocks while a request of its batch runs, and frees them by the end
of the update phase in which the batch's last request finished or was aborted. Without the
declaration an early finisher that holds blocks breaks `terminal_holds_nothing` at its finish;
with it, one that still holds them once its batch ended does (Vidur 0.0.25's FasterTransformer,
which never frees a request that finished before its batch mates)."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator

import pytest

from properties.ar.trace_check import check_ar_trace
from reference.ar.stages import StageScheduler
from reference.ar.vidur import VIDUR_FT
from spec.ar.config import ArConfig, ArRequest, ArRules, VictimOrder
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
from spec.ar.machine import ArSpecMachine
from spec.ar.pipeline import check_pipeline
from spec.ar.profile import ArPolicy
from spec.ar.trace import write_ar_trace
from spec.errors import ConfigError, SpecViolation
from tests.ar_event_runs import first_ar_violation

CFG = ArConfig(
    block_size=2,
    num_blocks=8,
    reserve_null_block=False,
    enable_chunked_prefill=False,
    max_num_batched_tokens=8,
    max_num_seqs=2,
    max_model_len=8,
)
STATIC = ArRules(victim=VictimOrder.NONE, token_budget=False, static_batches=True)
DECLARED = ArPolicy(rules=dataclasses.replace(STATIC, free_at_batch_end=True))
UNDECLARED = ArPolicy(rules=STATIC)
LENGTH = ArFinishReason.LENGTH

# one static batch: `short` (2 prompt tokens, 1 output) and `long` (2, 3), each reserving
# max_model_len (4 blocks); `short` finishes after step 0 keeping its blocks
BATCH: list[ArEvent] = [
    ArSubmitted("short", 2, 1),
    ArSubmitted("long", 2, 3),
    ArBlocksAllocated("short", (0, 1, 2, 3)),
    ArScheduled("short", 2),
    ArBlocksAllocated("long", (4, 5, 6, 7)),
    ArScheduled("long", 2),
    ArStepEnd(0),
    ArFinished("short", LENGTH),
    ArScheduled("long", 1),
    ArStepEnd(1),
    ArScheduled("long", 1),
    ArStepEnd(2),
]
# the batch ends: `long` frees and finishes, then `short` frees what it kept
BATCH_END: list[ArEvent] = [
    ArBlocksFreed("long", (4, 5, 6, 7)),
    ArFinished("long", LENGTH),
    ArBlocksFreed("short", (0, 1, 2, 3)),
]
# the next batch takes the whole pool's first half
NEXT_BATCH: list[ArEvent] = [
    ArSubmitted("next", 2, 1),
    ArBlocksAllocated("next", (0, 1, 2, 3)),
    ArScheduled("next", 2),
    ArStepEnd(3),
]


def _trace(policy: ArPolicy, events: list[ArEvent]) -> Iterator[str]:
    out = io.StringIO()
    write_ar_trace(events, out, CFG, policy)
    return iter(out.getvalue().splitlines())


def test_an_early_finisher_keeps_its_blocks_to_the_batch_end_only_where_declared() -> None:
    events = [*BATCH, *BATCH_END, *NEXT_BATCH]
    assert first_ar_violation(CFG, DECLARED, events) is None
    found = first_ar_violation(CFG, UNDECLARED, events)
    assert found is not None and found.rule == "terminal_holds_nothing", found
    assert "'short' finished still holding blocks [0, 1, 2, 3]" in str(found)


def test_freeing_at_the_finish_conforms_under_the_declaration_too() -> None:
    """The declaration allows a hold; it demands none (the fix `ft-free-on-finish` passes)."""
    events = [*BATCH[:7], ArBlocksFreed("short", (0, 1, 2, 3)), *BATCH[7:], *BATCH_END[:2]]
    assert first_ar_violation(CFG, DECLARED, [*events, *NEXT_BATCH]) is None


def test_a_finisher_never_freed_is_caught_when_the_next_step_begins() -> None:
    """Vidur 0.0.25: the batch ends, `long` is freed, `short` never is."""
    found = first_ar_violation(CFG, DECLARED, [*BATCH, *BATCH_END[:2], *NEXT_BATCH])
    assert found is not None and found.rule == "terminal_holds_nothing", found
    assert "finished 'short' still holds blocks [0, 1, 2, 3] after its static batch ended" in str(
        found
    )
    assert found.event == NEXT_BATCH[1]  # the next step's first event


def test_a_finisher_never_freed_is_caught_between_steps_and_at_a_logs_end() -> None:
    machine = ArSpecMachine(CFG, DECLARED)
    for event in [*BATCH, *BATCH_END[:2]]:
        machine.apply(event)
        machine.check_invariants()  # within the update phase: the batch may still free
    for check in (machine.check_invariants, machine.check_invariants_full):
        with pytest.raises(SpecViolation, match="after its static batch ended") as caught:
            check(between_steps=True)
        assert caught.value.rule == "terminal_holds_nothing"
    result = check_ar_trace(_trace(DECLARED, [*BATCH, *BATCH_END[:2]]))
    assert result.violation is not None and result.line is None, result
    assert result.violation.rule == "terminal_holds_nothing"
    assert check_ar_trace(_trace(DECLARED, [*BATCH, *BATCH_END])).violation is None


def test_an_abort_that_ends_the_batch_ends_the_hold() -> None:
    """`long`, the last request running, is aborted: the batch ended, so `short` frees then."""
    aborted: list[ArEvent] = [ArBlocksFreed("long", (4, 5, 6, 7)), ArAborted("long")]
    events = [*BATCH[:8], *aborted, ArBlocksFreed("short", (0, 1, 2, 3))]
    machine = ArSpecMachine(CFG, DECLARED)
    machine.apply_all(events)
    machine.check_invariants(between_steps=True)
    machine = ArSpecMachine(CFG, DECLARED)
    machine.apply_all([*BATCH[:8], *aborted])
    with pytest.raises(SpecViolation, match="finished 'short' still holds"):
        machine.check_invariants(between_steps=True)


@pytest.mark.parametrize(
    ("extra", "rule", "text"),
    [
        # a kept block freed twice
        (
            [ArBlocksFreed("short", (0, 1)), ArBlocksFreed("short", (1,))],
            "free_owned_only",
            "'short' freed block 1, which is free",
        ),
        # a finished request frees a block it never held
        ([ArBlocksFreed("short", (4,))], "free_owned_only", "held by ['long']"),
        # a finished request that keeps its blocks is not scheduled again
        ([ArScheduled("short", 1)], "known_request", "'short' is finished"),
        # nor finished twice
        ([ArFinished("short", LENGTH)], "known_request", "'short' is finished"),
    ],
    ids=["double-free", "foreign-block", "scheduled-again", "finished-twice"],
)
def test_a_kept_hold_is_still_checked(extra: list[ArEvent], rule: str, text: str) -> None:
    found = first_ar_violation(CFG, DECLARED, [*BATCH[:8], *extra])
    assert found is not None and found.rule == rule, found
    assert text in str(found), found


def test_the_hold_shows_in_the_state_and_the_outcome() -> None:
    machine = ArSpecMachine(CFG, DECLARED)
    machine.apply_all(BATCH[:8])
    state = machine.state()
    assert state.requests["short"].blocks == (0, 1, 2, 3)
    assert state.running == ("long",)
    assert machine.request_phase("short") is not None
    assert machine.outputs() == {"short": 1}
    assert "short: finished" in machine.render()
    machine.check_invariants_full(between_steps=True)


def test_the_declaration_is_a_static_batchs_only() -> None:
    with pytest.raises(ConfigError, match=r"rules\.free_at_batch_end.*static_batches"):
        ArRules(free_at_batch_end=True)
    with pytest.raises(ConfigError, match=r"rules\.free_at_batch_end"):
        ArRules(static_batches=True, free_at_batch_end="yes")  # type: ignore[arg-type]


def test_the_reference_holds_an_early_finisher_to_its_batch_end() -> None:
    """`vidur-ft` frees as FasterTransformer does: `short` finishes first, keeps its blocks
    while `long` runs, and is freed right after `long`'s finish, under the spec."""
    events: list[ArEvent] = []
    machine = ArSpecMachine(CFG, VIDUR_FT.profile.policy)

    def sink(event: ArEvent) -> None:
        events.append(event)
        machine.apply(event)
        machine.check_invariants()

    ft = VIDUR_FT.factory(CFG, sink)
    ft.submit(ArRequest("short", 2, 1))
    ft.submit(ArRequest("long", 2, 3))
    ft.drain()
    machine.check_invariants(between_steps=True)
    tail = [e for e in events if isinstance(e, ArFinished | ArBlocksFreed)]
    assert tail == [
        ArFinished("short", LENGTH),
        ArBlocksFreed("long", (4, 5, 6, 7)),
        ArFinished("long", LENGTH),
        ArBlocksFreed("short", (0, 1, 2, 3)),
    ]


def test_the_stage_twin_reports_the_hold_to_the_pipeline_rules() -> None:
    """In a pipeline the snapshot lists the kept blocks and their static batch; the rules pass
    them while a batch mate runs, and only because the hold is declared."""
    config = dataclasses.replace(CFG, num_stages=2)
    stages = StageScheduler(config, lambda e: None, "vidur-ft")
    stages.submit(ArRequest("short", 2, 1))
    stages.submit(ArRequest("long", 2, 3))
    while "short" not in stages.replica.finished:
        stages.step()
        stages.check_pipeline()
    snapshot = stages.pipeline_snapshot()
    assert snapshot.batch_end_free and snapshot.held_blocks["short"] == 4
    assert snapshot.static_batch_of == {"short": 0, "long": 0}
    with pytest.raises(SpecViolation, match="'short' \\(finished\\) holds 4 blocks"):
        check_pipeline(dataclasses.replace(snapshot, batch_end_free=False))
    stages.drain()
    stages.check_pipeline()
    assert stages.replica.pool.num_free == config.usable_blocks


def test_a_new_batch_is_not_admitted_while_a_finisher_of_the_last_one_holds() -> None:
    """Found by review: the batch's last request aborted after this step's scheduling began,
    then a new request admitted in the same step while `short` still holds its blocks. No
    between-steps check falls inside the step, and from then on something runs, so only the
    admission can tell."""
    events: list[ArEvent] = [
        *BATCH[:8],
        ArSubmitted("next", 2, 1),
        ArScheduled("long", 1),
        ArBlocksFreed("long", (4, 5, 6, 7)),
        ArAborted("long"),
        ArBlocksAllocated("next", (4, 5, 6, 7)),
        ArScheduled("next", 2),
    ]
    found = first_ar_violation(CFG, DECLARED, events)
    assert found is not None and found.rule == "terminal_holds_nothing", found
    assert "admitted 'next', a new static batch, while finished 'short'" in str(found)
