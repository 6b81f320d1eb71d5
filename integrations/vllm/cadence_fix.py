"""A candidate fix for a finding in vLLM 0.33.0's local prefill cadence
(`prefill_schedule_interval` > 1; docs/engines/vllm.md, "Admission settings under the AR suite").

The finding: `Scheduler.schedule` decides before its running loop whether the step is held
(`defer_prefills`: a request decodes and the interval has not passed), and the held loop skips
every running request still in its prefill. When the step's only decoding request then finds no
free block and, as the tail of the running requests, preempts itself, nothing is left that a
held step may run: the step schedules nothing at all while a request in its prefill runs and
the victim waits (the AR spec's `progress`). vLLM's own comment on the hold says a held step's
"decodes still run to fill this step"; here none is left. The next step is not held, so this
costs one iteration, not a stall.

The fix: where the running loop gives up on a request (no blocks), a held step with nothing
scheduled yet and no decoding request left running lifts its hold and revisits the running
requests from the first, so the prefill chunks it skipped run after all (one insertion in
`Scheduler.schedule`'s running loop). An edit of vLLM's own `vllm/v1/core/sched/scheduler.py`
(`CADENCE_FIXES`, `fix_as_diff()`), given to one built scheduler by `apply_cadence_fix`.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

LIFT_EMPTY_HOLD = "lift-empty-hold"

_GIVE_UP = (
    "            if new_blocks is None:\n"
    "                if (\n"
    "                    self.policy == SchedulingPolicy.PRIORITY\n"
    "                    and request.status == RequestStatus.PREEMPTED\n"
    "                ):\n"
)
_LIFT_THEN_GIVE_UP = (
    "            if new_blocks is None:\n"
    "                if (\n"
    "                    defer_prefills\n"
    "                    and not scheduled_running_reqs\n"
    "                    and all(r.is_prefill_chunk for r in self.running)\n"
    "                ):\n"
    "                    # The hold was for decodes, and every one of them is gone\n"
    "                    # (preempted): nothing else may run in this step. Lift the\n"
    "                    # hold and revisit the prefill chunks it skipped.\n"
    "                    defer_prefills = False\n"
    "                    req_index = 0\n"
    "                    continue\n"
    "                if (\n"
    "                    self.policy == SchedulingPolicy.PRIORITY\n"
    "                    and request.status == RequestStatus.PREEMPTED\n"
    "                ):\n"
)

CADENCE_FIX = EngineFix(
    LIFT_EMPTY_HOLD,
    ((MODULE, _GIVE_UP, _LIFT_THEN_GIVE_UP),),
    ((MODULE, "Scheduler.schedule"),),
    "a step the prefill cadence holds schedules nothing when its only decode preempts itself: "
    "lift the hold once no decode is left and nothing is scheduled, and revisit the running "
    "requests",
)
CADENCE_SCHEDULE = ScheduleFix(CADENCE_FIX)
CADENCE_FIXES = CADENCE_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_cadence_fix: ApplyFix = CADENCE_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = CADENCE_SCHEDULE.as_diff

__all__ = [
    "CADENCE_FIX",
    "CADENCE_FIXES",
    "CADENCE_SCHEDULE",
    "LIFT_EMPTY_HOLD",
    "FixDoesNotApply",
    "apply_cadence_fix",
    "fix_as_diff",
]
