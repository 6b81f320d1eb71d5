"""A candidate fix for a limitation of vLLM 0.33.0 that a "keep" pause reaches: the caches'
reset with `reset_running_requests=True` fails while a waiting request holds blocks that a KV
connector loaded into. Applied to one built scheduler so that the engine-core checks can
validate it.

The limitation (docs/engines/vllm-features.md, "Pausing generation"): with the offloading connector,
a request whose prefix is in the CPU tier holds the GPU blocks its KV loads into until it is
scheduled (`kv_holding_waiting`). A "keep" pause (`PAUSED_ALL`) schedules nothing and counts no
request unfinished, so it completes with that request still holding its blocks.
`_finish_pause`'s `reset_prefix_cache(reset_running_requests=True)` preempts the running
requests only, finds those blocks in use, and raises ("... requests waiting for remote KV
transfer, which is not supported yet"): `pause_generation(mode="keep")` with its default
`clear_cache=True` fails a weight update.

The fix: where the reset preempts the running requests, it also takes back the blocks of every
waiting request that holds KV whose load is done (a load reported finished and not yet
promoted, or promoted and not yet scheduled: status `WAITING` or `PREEMPTED` with tokens
computed), and of every streaming-input session between turns (`WAITING_FOR_STREAMING_REQ`,
which reaches the same raise with no connector at all, in any pause mode) or waiting for its
next input's grammar (`WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`, with `own-grammar-per-input`;
both keep their status). Such KV predates
the reset (a weight update makes it stale, as it does the running requests' KV), so the
request goes back to the waiting queue with nothing computed and looks its prefix up again, as
a preempted request does; a session keeps waiting for its input and recomputes when it comes.
The request's prefill counted in flight (`_inflight_prefills`, which a reported load leaves it
in) is forgotten too, or its reservation keeps it waiting for good.
A load still in flight writes into its blocks: those stay held and the reset still raises, as
released vLLM does. With the offloading connector a pause never reaches its reset with a load
in flight: the engine keeps stepping while the connector has a job unreported
(`has_pending_push_work`), as the engine-core loop does, so every load is done by then.

It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`RESET_HOLDERS_FIXES`):
`fix_as_diff()` prints it as a patch, and `apply_reset_holders_fix(sched)` gives one built
scheduler the edited `Scheduler.reset_prefix_cache` through a subclass of its class.
`FixDoesNotApply` if vLLM's file no longer has the statement the fix edits.

vLLM 0.34.0 has the same limitation. The fix is written anew for it (`EngineFix.releases`): the
running requests are preempted by `_preempt_request` there, and a request taken back also
gives up its parked reservation and its fetch stage, which counts against
`max_num_inflight_kv_loads`.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_034, ApplyFix, FixDiff, ScheduleFix
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE

RESET_HOLDERS = "reset-loaded-holders"

#: The end of the running requests' preemption in `reset_prefix_cache`, and the reset after it.
_PREEMPTED_ALL_RUNNING = (
    "            self.prev_step_scheduled_req_ids.clear()\n"
    "\n"
    "        reset_successful = self.kv_cache_manager.reset_prefix_cache()\n"
)
_TAKE_BACK_LOADED_HOLDERS = (
    "            self.prev_step_scheduled_req_ids.clear()\n"
    "\n"
    "            # Waiting requests holding KV (a connector's load done, promoted or\n"
    "            # not; a streaming session between turns) hold blocks too, and that KV\n"
    "            # predates the reset: take the blocks back, so they look their prefix\n"
    "            # up again (a session when its next input comes). A load still in\n"
    "            # flight writes into its blocks: those keep theirs.\n"
    "            for request in list(self.kv_holding_waiting):\n"
    "                # a session between turns, or waiting for its next input's grammar,\n"
    "                # keeps its status\n"
    "                keeps_status = request.status in (\n"
    "                    RequestStatus.WAITING_FOR_STREAMING_REQ,\n"
    "                    RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,\n"
    "                )\n"
    "                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:\n"
    "                    if request.request_id not in self.finished_recving_kv_req_ids:\n"
    "                        continue\n"
    "                elif not keeps_status and request.status not in (\n"
    "                    RequestStatus.WAITING,\n"
    "                    RequestStatus.PREEMPTED,\n"
    "                ):\n"
    "                    continue\n"
    "                self.kv_holding_waiting.remove_request(request)\n"
    "                self.deferred_waiting.discard(request)\n"
    "                self.finished_recving_kv_req_ids.discard(request.request_id)\n"
    "                self.failed_recving_kv_req_ids.discard(request.request_id)\n"
    "                self._free_request_blocks(request)\n"
    "                # else its prefill, counted in flight, keeps reserving blocks\n"
    "                self._inflight_prefills.discard(request)\n"
    "                request.num_computed_tokens = 0\n"
    "                if not keeps_status:\n"
    "                    request.status = (\n"
    "                        RequestStatus.PREEMPTED\n"
    "                        if request.num_preemptions\n"
    "                        else RequestStatus.WAITING\n"
    "                    )\n"
    "                self._enqueue_waiting_request(request)\n"
    "\n"
    "        reset_successful = self.kv_cache_manager.reset_prefix_cache()\n"
)

#: The same in vLLM 0.34.0: the running requests are preempted by `_preempt_request` (no
#: `prev_step_scheduled_req_ids`), and a request taken back also gives up its parked
#: reservation and its fetch stage (counted against `max_num_inflight_kv_loads`).
_PREEMPTED_ALL_RUNNING_034 = (
    "                self._preempt_request(request, timestamp, drop_stale_output=True)\n"
    "\n"
    "        reset_successful = self.kv_cache_manager.reset_prefix_cache()\n"
)
_TAKE_BACK_LOADED_HOLDERS_034 = _TAKE_BACK_LOADED_HOLDERS.replace(
    "            self.prev_step_scheduled_req_ids.clear()\n",
    "                self._preempt_request(request, timestamp, drop_stale_output=True)\n",
).replace(
    "                self._inflight_prefills.discard(request)\n",
    "                self._inflight_prefills.discard(request)\n"
    "                self._unreserve_parked(request)\n"
    "                # else its load, done, keeps counting against the in-flight cap\n"
    "                self._set_kv_fetch_stage(request, None)\n",
)
_RESET_HOLDERS = (
    "a cache reset that preempts the running requests fails while a waiting request holds "
    "blocks a connector loaded into (a 'keep' pause with a CPU-tier hit) or a streaming "
    "session waits for input: take back the blocks of waiting requests whose load is done "
    "and of sessions between turns"
)

RESET_HOLDERS_FIX = EngineFix(
    RESET_HOLDERS,
    ((MODULE, _PREEMPTED_ALL_RUNNING, _TAKE_BACK_LOADED_HOLDERS),),
    ((MODULE, "Scheduler.reset_prefix_cache"),),
    _RESET_HOLDERS,
    releases=(
        (
            SCHEDULER_034,
            EngineFix(
                RESET_HOLDERS,
                ((MODULE, _PREEMPTED_ALL_RUNNING_034, _TAKE_BACK_LOADED_HOLDERS_034),),
                ((MODULE, "Scheduler.reset_prefix_cache"),),
                _RESET_HOLDERS + " (vLLM 0.34.0: also their parked reservations and fetch stages)",
            ),
        ),
    ),
)
RESET_HOLDERS_SCHEDULE = ScheduleFix(RESET_HOLDERS_FIX)
RESET_HOLDERS_FIXES = RESET_HOLDERS_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `reset_prefix_cache`
#: (`ScheduleFix.apply`).
apply_reset_holders_fix: ApplyFix = RESET_HOLDERS_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = RESET_HOLDERS_SCHEDULE.as_diff

__all__ = [
    "RESET_HOLDERS",
    "RESET_HOLDERS_FIX",
    "RESET_HOLDERS_FIXES",
    "RESET_HOLDERS_SCHEDULE",
    "FixDoesNotApply",
    "apply_reset_holders_fix",
    "fix_as_diff",
]
