"""`ArRules.preemption_may_empty_step`, vLLM v0's recompute declared: a step whose preemptions,
each made while no block was free, left nothing running may schedule nothing, and only that
step. Without the declaration the same log stalls (`progress`); with it, a step that preempted
nothing, one that preempted with a block free (a scheduler that recomputes for no reason), and
the step after the empty one if it too schedules nothing, all still do."""

from __future__ import annotations

import pytest

from spec.ar.config import ArConfig, ArRules
from spec.ar.events import (
    ArBlocksAllocated,
    ArEvent,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArPolicy
from spec.errors import ConfigError, SpecViolation
from tests.ar_event_runs import first_ar_violation

CFG = ArConfig(
    block_size=2,
    num_blocks=2,
    reserve_null_block=False,
    max_num_batched_tokens=5,
    max_num_seqs=1,
    max_model_len=5,
)
DECLARED = ArPolicy(rules=ArRules(preemption_may_empty_step=True))

# r0's 3-token prompt takes both blocks; at its first decode it is restarted, nothing runs
RESTARTED_ALONE: list[ArEvent] = [
    ArSubmitted("r0", 3, 2),
    ArBlocksAllocated("r0", (0, 1)),
    ArScheduled("r0", 3),
    ArStepEnd(0),
    ArPreempted("r0", (0, 1)),
    ArStepEnd(1),
]
# the next step re-admits it whole
READMITTED: list[ArEvent] = [ArBlocksAllocated("r0", (0, 1)), ArScheduled("r0", 4), ArStepEnd(2)]


def _apply(policy: ArPolicy | None, events: list[ArEvent]) -> SpecViolation | None:
    return first_ar_violation(CFG, policy, events)


def test_a_step_emptied_by_its_preemption_conforms_only_where_declared() -> None:
    assert _apply(DECLARED, [*RESTARTED_ALONE, *READMITTED]) is None
    found = _apply(None, RESTARTED_ALONE)
    assert found is not None and found.rule == "progress", found
    assert "step 1 scheduled nothing with 0 running and 1 waiting" in str(found)


@pytest.mark.parametrize(
    ("events", "step"),
    [
        # nothing preempted: a plain stall, declared or not
        ([ArSubmitted("r0", 3, 2), ArStepEnd(0)], 0),
        # the step after the emptied one schedules nothing as well
        ([*RESTARTED_ALONE, ArStepEnd(2)], 2),
        # a one-block request preempted with a block free: no decode was short of one
        (
            [
                ArSubmitted("r0", 1, 3),
                ArBlocksAllocated("r0", (0,)),
                ArScheduled("r0", 1),
                ArStepEnd(0),
                ArPreempted("r0", (0,)),
                ArStepEnd(1),
            ],
            1,
        ),
    ],
    ids=["no-preemption", "the-next-step", "a-block-was-free"],
)
def test_the_waiver_is_that_step_only(events: list[ArEvent], step: int) -> None:
    found = _apply(DECLARED, events)
    assert found is not None and found.rule == "progress", found
    assert f"step {step} scheduled nothing" in str(found)


def test_the_declaration_is_checked_as_a_flag() -> None:
    with pytest.raises(ConfigError, match=r"rules\.preemption_may_empty_step"):
        ArRules(preemption_may_empty_step="yes")  # type: ignore[arg-type]
