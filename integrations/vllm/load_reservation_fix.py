"""A candidate fix for a finding in vLLM 0.33.0's admission of KV connector loads when
`scheduler_reserve_full_isl` is off (docs/engines/vllm-features.md, "Admission settings").

The finding: `Scheduler.schedule` admits an asynchronous KV load if its blocks fit in the free
blocks less the other in-flight prefills' reservations, "to avoid deadlock" (such a load holds
its blocks with no forward progress and is not preemptible). With the whole-sequence check on
(vLLM's default) the request's own sequence must fit too; off, nothing keeps room for the
request's own next step. A preempted request is then re-admitted as a load that takes the
last free blocks; once loaded it heads the queue of requests holding KV, finds no block for
its next step, and vLLM's waiting loop stops there, so the requests holding the rest of the
pool, which may need nothing more, wait behind it for good (`progress`).

The fix: an asynchronous load is admitted only if the request's whole sequence fits, as with
the default, whatever `scheduler_reserve_full_isl` says for other admissions (one condition
of the waiting loop's `allocate_slots` call). That is the room vLLM reserves for the load once
it is in flight (`Scheduler._request_remaining_blocks`), checked at its own admission too.
An edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`LOAD_RESERVATION_FIXES`,
`fix_as_diff()`), given to one built scheduler by `apply_load_reservation_fix`.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

LOAD_RESERVATION = "loads-reserve-their-sequence"

_WAITING_ALLOCATION = (
    "                    full_sequence_must_fit=self.scheduler_reserve_full_isl,\n"
)
_LOADS_FIT_WHOLE = (
    "                    # An async load holds its blocks and cannot be preempted: it\n"
    "                    # must leave room for its own sequence, or it may head the\n"
    "                    # queue with no room to run while others wait behind it.\n"
    "                    full_sequence_must_fit=(\n"
    "                        self.scheduler_reserve_full_isl or load_kv_async\n"
    "                    ),\n"
)

LOAD_RESERVATION_FIX = EngineFix(
    LOAD_RESERVATION,
    ((MODULE, _WAITING_ALLOCATION, _LOADS_FIT_WHOLE),),
    ((MODULE, "Scheduler.schedule"),),
    "with scheduler_reserve_full_isl off an asynchronous KV load is admitted without room for "
    "its own next step and can deadlock the requests holding KV: admit a load only if its "
    "whole sequence fits",
)
LOAD_RESERVATION_SCHEDULE = ScheduleFix(LOAD_RESERVATION_FIX)
LOAD_RESERVATION_FIXES = LOAD_RESERVATION_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_load_reservation_fix: ApplyFix = LOAD_RESERVATION_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = LOAD_RESERVATION_SCHEDULE.as_diff

__all__ = [
    "LOAD_RESERVATION",
    "LOAD_RESERVATION_FIX",
    "LOAD_RESERVATION_FIXES",
    "LOAD_RESERVATION_SCHEDULE",
    "FixDoesNotApply",
    "apply_load_reservation_fix",
    "fix_as_diff",
]
