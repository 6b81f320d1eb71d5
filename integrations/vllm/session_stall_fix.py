"""A candidate fix for a stall of vLLM 0.33.0's streaming-input sessions: sessions that hold
the KV pool, each with input to run, wait for each other for good. Applied to one built
scheduler so that the engine-core checks can validate it.

The stall (docs/engines.md, "Streaming-input sessions"): a session keeps the KV of its kept
tokens between turns (`_handle_stopped_request`), and its next input resumes it from the
waiting queue holding that KV (`kv_holding_waiting`). When its new tokens need blocks the pool
does not have, `schedule()` leaves it waiting (`allocate_slots` returns None) and frees nothing.
vLLM frees blocks by finishing or preempting running requests only. With no request running and
the pool held by sessions that each wait for room (or by those and sessions waiting for input),
no call ever frees a block: the engine steps on, scheduling nothing, while every such session
has its input and nothing of theirs runs. Two sessions of 13 and 12 kept tokens in a pool of 26
blocks of one token, each given a few more tokens, are enough (`docs/shrunk/
vllm-session-stall.json`).

The fix: where the waiting loop finds no room for a resumed session that holds KV and no
request runs, it drops that session's KV as a preemption would (its blocks freed, deferred
while a step in flight may write them; nothing computed; back to the waiting queue without
KV), so the others can run; the session recomputes its tokens (or hits the prefix cache) once
it fits. A session waiting for input keeps its KV, as released vLLM keeps it. Not with a KV
connector: there the drop would have to be told to the connector as a preemption is (a store
job may still read those blocks), which the fix does not do; with one the stall stays.

It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`SESSION_STALL_FIXES`):
`fix_as_diff()` prints it as a patch, and `apply_session_stall_fix(sched)` gives one built
scheduler the edited `Scheduler.schedule` through a subclass of its class. `FixDoesNotApply`
if vLLM's file no longer has the statement the fix edits.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ScheduleFix

SESSION_STALL = "drop-stalled-session-kv"

#: The waiting loop's give-up when `allocate_slots` finds no room.
_NO_ROOM = (
    "                if new_blocks is None:\n"
    "                    # The request cannot be scheduled.\n"
    "\n"
    "                    # NOTE: we need to untouch the request from the encode cache\n"
    "                    # manager\n"
    "                    if request.has_encoder_inputs:\n"
    "                        self.encoder_cache_manager.free(request)\n"
    "                    break\n"
)
_NO_ROOM_DROPS_A_STALLED_SESSION = (
    "                if new_blocks is None:\n"
    "                    # The request cannot be scheduled.\n"
    "\n"
    "                    # NOTE: we need to untouch the request from the encode cache\n"
    "                    # manager\n"
    "                    if request.has_encoder_inputs:\n"
    "                        self.encoder_cache_manager.free(request)\n"
    "                    # A resumed streaming session holds its kept tokens' KV. With\n"
    "                    # no request running nothing else frees blocks, and sessions\n"
    "                    # holding the pool would wait for each other for good: drop\n"
    "                    # this one's KV, as a preemption would, so the others can run.\n"
    "                    if (\n"
    "                        not self.running\n"
    "                        and self.connector is None\n"
    "                        and request.resumable\n"
    "                        and request.num_computed_tokens > 0\n"
    "                    ):\n"
    "                        request_queue.remove_request(request)\n"
    "                        self.deferred_waiting.discard(request)\n"
    "                        self._free_request_blocks(request)\n"
    "                        request.num_computed_tokens = 0\n"
    "                        self._enqueue_waiting_request(request)\n"
    "                    break\n"
)

SESSION_STALL_FIX = EngineFix(
    SESSION_STALL,
    ((MODULE, _NO_ROOM, _NO_ROOM_DROPS_A_STALLED_SESSION),),
    ((MODULE, "Scheduler.schedule"),),
    "streaming-input sessions holding the KV pool, each with input and no room for it, wait "
    "for each other for good: with no request running, drop the KV of a resumed session that "
    "finds no room",
)
SESSION_STALL_SCHEDULE = ScheduleFix(SESSION_STALL_FIX)
SESSION_STALL_FIXES = SESSION_STALL_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_session_stall_fix = SESSION_STALL_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff = SESSION_STALL_SCHEDULE.as_diff

__all__ = [
    "SESSION_STALL",
    "SESSION_STALL_FIX",
    "SESSION_STALL_FIXES",
    "SESSION_STALL_SCHEDULE",
    "FixDoesNotApply",
    "apply_session_stall_fix",
    "fix_as_diff",
]
