"""A candidate fix for a stall of vLLM 0.33.0's streaming-input sessions: sessions that hold
the KV pool, each with input to run, wait for each other for good. Applied to one built
scheduler so that the engine-core checks can validate it.

The stall (docs/engines/vllm-features.md, "Streaming-input sessions"): a session keeps the KV of its
kept tokens between turns (`_handle_stopped_request`), and its next input resumes it from the
waiting queue holding that KV (`kv_holding_waiting`). When its new tokens need blocks the pool
does not have, `schedule()` leaves it waiting (`allocate_slots` returns None) and frees nothing.
vLLM frees blocks by finishing or preempting running requests only. With no request running and
the pool held by sessions that each wait for room (or by those and sessions waiting for input),
no call ever frees a block: the engine steps on, scheduling nothing, while every such session
has its input and nothing of theirs runs. Two sessions holding 17 of 21 one-token blocks, the
first needing 5 more of the 4 free, are enough (`docs/shrunk/vllm-session-stall.json`).

The fix: where the waiting loop finds no room for a request and no request runs, it drops the
KV of the last session in the queue that waits with KV (the victim a preemption would pick;
the request itself if it is the only one; with a KV connector the request may be one whose
KV a load wrote, waiting for room a session holds) as a preemption would: its blocks freed
(deferred while a step in flight may write them), nothing computed, no prefill in flight,
back to the waiting queue without KV, and its id in the next output's `preempted_req_ids`, so
that the workers forget its state and a KV connector flushes the store jobs that may still
read those blocks, as for any preemption. The next call retries the request; the session
recomputes its tokens (or hits a cache) once it fits. A session waiting for input keeps its
KV, as released vLLM keeps it.

It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`SESSION_STALL_FIXES`):
`fix_as_diff()` prints it as a patch, and `apply_session_stall_fix(sched)` gives one built
scheduler the edited `Scheduler.schedule` through a subclass of its class. `FixDoesNotApply`
if vLLM's file no longer has the statement the fix edits.

vLLM 0.34.0 has the stall too, and the 0.33.0 edit applies there, but it leaves a dropped
request's parked reservation and its KV fetch stage: a loaded request whose KV the fix drops
keeps counting against `max_num_inflight_kv_loads`, and with a cap of 1 no load starts again,
its own retry included (session program 18 with the KV connector: `progress`). Its version
for 0.34.0 (`EngineFix.releases`) also gives both up.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_034, ApplyFix, FixDiff, ScheduleFix
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE

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
    "                    # A streaming session waiting to resume holds its KV. With no\n"
    "                    # request running nothing else frees blocks, and requests\n"
    "                    # waiting with KV would wait for each other for good: drop\n"
    "                    # the KV of the last such session in the queue (the victim a\n"
    "                    # preemption would pick; this one if it is the only one), as a\n"
    "                    # preemption would, so the others can run. One waiting for its\n"
    "                    # next input's grammar is promoted only when the loop reaches it,\n"
    "                    # which it never does while this request finds no room.\n"
    "                    stalled = [\n"
    "                        r\n"
    "                        for r in reversed(list(self.kv_holding_waiting))\n"
    "                        if r.resumable\n"
    "                        and r.status\n"
    "                        in (\n"
    "                            RequestStatus.WAITING,\n"
    "                            RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,\n"
    "                        )\n"
    "                        and r.num_computed_tokens > 0\n"
    "                    ]\n"
    "                    if not self.running and stalled:\n"
    "                        session = stalled[0]\n"
    "                        self.kv_holding_waiting.remove_request(session)\n"
    "                        self.deferred_waiting.discard(session)\n"
    "                        if self.aux_output_connector is not None:\n"
    "                            self.aux_output_connector.request_finished(session)\n"
    "                        self._free_request_blocks(session)\n"
    "                        self.encoder_cache_manager.free(session)\n"
    "                        self._pending_encoder_input_ids.pop(session.request_id, None)\n"
    "                        # else its prefill, counted in flight, reserves blocks\n"
    "                        self._inflight_prefills.discard(session)\n"
    "                        session.num_computed_tokens = 0\n"
    "                        self._enqueue_waiting_request(session)\n"
    "                        # Tell the workers and the KV connector, as a preemption\n"
    "                        # is told: a store job may still read those blocks.\n"
    "                        self.reset_preempted_req_ids.add(session.request_id)\n"
    "                    break\n"
)

#: 0.34.0: a dropped request also gives up its parked reservation and its KV fetch stage.
_GIVES_UP_ITS_LOAD = _NO_ROOM_DROPS_A_STALLED_SESSION.replace(
    "                        self._inflight_prefills.discard(session)\n",
    "                        self._inflight_prefills.discard(session)\n"
    "                        self._unreserve_parked(session)\n"
    "                        # else its load, done, keeps counting against the in-flight cap\n"
    "                        self._set_kv_fetch_stage(session, None)\n",
)
_SUMMARY = (
    "streaming-input sessions holding the KV pool, each with input and no room for it, wait "
    "for each other for good: when a request finds no room and no request runs, the last "
    "session waiting with KV gives it up, told as a preemption"
)
SESSION_STALL_FIX = EngineFix(
    SESSION_STALL,
    ((MODULE, _NO_ROOM, _NO_ROOM_DROPS_A_STALLED_SESSION),),
    ((MODULE, "Scheduler.schedule"),),
    _SUMMARY,
    releases=(
        (
            SCHEDULER_034,
            EngineFix(
                SESSION_STALL,
                ((MODULE, _NO_ROOM, _GIVES_UP_ITS_LOAD),),
                ((MODULE, "Scheduler.schedule"),),
                _SUMMARY + " (vLLM 0.34.0: with its reservation and fetch stage)",
            ),
        ),
    ),
)
SESSION_STALL_SCHEDULE = ScheduleFix(SESSION_STALL_FIX)
SESSION_STALL_FIXES = SESSION_STALL_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_session_stall_fix: ApplyFix = SESSION_STALL_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = SESSION_STALL_SCHEDULE.as_diff

__all__ = [
    "SESSION_STALL",
    "SESSION_STALL_FIX",
    "SESSION_STALL_FIXES",
    "SESSION_STALL_SCHEDULE",
    "FixDoesNotApply",
    "apply_session_stall_fix",
    "fix_as_diff",
]
