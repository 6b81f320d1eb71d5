"""Candidate fixes for six findings in vLLM 0.33.0's KV connector path, where a request's KV
load fails, applied to one built scheduler so that the engine-core checks can validate them.

The findings (docs/engines/vllm-kv.md, "KV connectors: loads, sends and failures"). An asynchronous
KV load reserves the blocks its request still needs (`Scheduler._inflight_prefills`, summed by
`_inflight_prefill_reserved_blocks`), and `schedule()` admits another asynchronous load only
into the free blocks left after every such reservation. When such a load fails as a whole
under `kv_load_failure_policy="recompute"`, `_update_waiting_for_remote_kv` frees the
request's blocks and promotes it to waiting, but

1. leaves it in `_inflight_prefills`, reserving the blocks it no longer holds: a connector that
   offers the hit again (vLLM's offloading connector looks every request up afresh) makes its
   retry an asynchronous load too, whose admission subtracts that stale reservation (all its
   blocks) from the free blocks, so it needs its prompt's blocks twice, and every other
   asynchronous load is admitted only beside it; if that is more than the pool has free, no
   such load is ever admitted (`drop-stale-reservation` takes it out of `_inflight_prefills`
   when its blocks are freed);
2. leaves it at the head of the queue of requests holding KV (`kv_holding_waiting`, served
   first, which it no longer belongs to): when its retry does not fit beside the other loads'
   reservations the waiting loop stops there, so the loads behind it, done, are never promoted
   and never free their blocks (`requeue-failed-load` moves it to the waiting queue).

Either way, with nothing running the engine steps for ever. When a synchronous load fails in a
block (`invalid_block_ids`, `_handle_invalid_blocks`),

3. the step that loaded it has computed the request's next blocks over it, and vLLM evicts
   neither from the prefix cache under the recompute policy, nor, under either, a failed block
   no running request holds (its loader aborted): a later hit reads them
   (`evict-failed-blocks` evicts both, under either policy);
4. of the requests holding the failed block (it was cached at once, and hit before the failure
   was known), only the first recomputes it; the others keep it as computed and read it before
   it is recomputed (`every-sharer-recomputes` makes each recompute from it);
5. under async scheduling, a running request truncated to recompute keeps its output
   placeholders counted, so its recomputation schedules past its tokens: output tokens are
   lost, or it hangs (vLLM issue #45138; `stale-after-failed-load` drops the output of its
   steps in flight, as a preemption does);
6. vLLM finds the blocks computed over a failed block only in the block tables of running
   requests: when the request that loaded it is no longer running (aborted
   before the failure is reported), they stay cached even with `evict-failed-blocks`, and once
   its first blocks are computed again elsewhere a hit reaches them
   (`evict-ended-loader-blocks` hands the failed step's `SchedulerOutput` to
   `_handle_invalid_blocks`, which evicts them by that step's own block ids, and those of the
   request's later steps in flight as their outputs arrive).

Each fix is an edit of its own statements of vLLM's `vllm/v1/core/sched/scheduler.py`, so they
compose (`KV_LOAD_FIXES`): `fix_as_diff()` prints all six as a patch,
`apply_kv_load_fixes(sched)` gives one built scheduler the edited methods through a subclass
of its class (`apply_drop_stale_reservation_fix`: the first alone). `FixDoesNotApply` if
vLLM's file no longer has a statement a fix edits.

vLLM 0.34.0 has all six findings. Three fixes are written anew for it (`EngineFix.releases`,
chosen where the file has `_reserve_parked`). `drop-stale-reservation` also gives up the parked
reservation that 0.34.0 refreshes at promotion (`_parked_reservations`). `requeue-failed-load`
also clears the requeued request's fetch stage, which counts against
`max_num_inflight_kv_loads`. `evict-ended-loader-blocks` reads resumed requests among the new
ones, since 0.34.0 has no `resumed_req_ids`.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_034, ApplyFix, FixDiff, ScheduleFix
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE

DROP_STALE_RESERVATION = "drop-stale-reservation"

#: What a load that failed as a whole does with a request that has no valid token left.
_FREED = (
    "                # No valid computed tokens, release allocated blocks.\n"
    "                # There may be a local cache hit on retry.\n"
    "                # (Freed blocks are re-recorded for zeroing when\n"
    "                # reallocated, so the skipped blocks need no handling.)\n"
    "                self.kv_cache_manager.free(request)\n"
)
_FREED_AND_UNRESERVED = _FREED + (
    "                # It holds no blocks and loads nothing now: its in-flight\n"
    "                # reservation is stale (a retry that loads again reserves anew).\n"
    "                self._inflight_prefills.discard(request)\n"
)

#: Where 0.34.0 promotes a request whose asynchronous load is done, refreshing its reservation.
_PROMOTED_034 = (
    "            # Promote request to waiting or preempted.\n"
    "            self._update_waiting_for_remote_kv(request)\n"
    "            self._reserve_parked(request)\n"
)
_PROMOTED_034_UNRESERVED = (
    "            # Promote request to waiting or preempted.\n"
    "            # A load that failed with no valid token frees the request's blocks\n"
    "            # (_update_waiting_for_remote_kv): it then holds and loads nothing, so\n"
    "            # it gives up its reservation (a retry that loads again reserves anew).\n"
    "            blocks_freed = (\n"
    "                request_id in self.failed_recving_kv_req_ids\n"
    "                and not request.num_computed_tokens\n"
    "            )\n"
    "            self._update_waiting_for_remote_kv(request)\n"
    "            if blocks_freed:\n"
    "                self._unreserve_parked(request)\n"
    "            else:\n"
    "                self._reserve_parked(request)\n"
)
_STALE_RESERVATION = (
    "a request whose KV load failed as a whole and freed its blocks gives up its in-flight "
    "reservation, which it kept: its own retry and every other asynchronous load were admitted "
    "only beside it, and one that did not fit never got in (the engine hung)"
)

DROP_STALE_RESERVATION_FIX = EngineFix(
    DROP_STALE_RESERVATION,
    ((MODULE, _FREED, _FREED_AND_UNRESERVED),),
    ((MODULE, "Scheduler._update_waiting_for_remote_kv"),),
    _STALE_RESERVATION,
    releases=(
        (
            SCHEDULER_034,
            EngineFix(
                DROP_STALE_RESERVATION,
                (
                    (MODULE, _FREED, _FREED_AND_UNRESERVED),
                    (MODULE, _PROMOTED_034, _PROMOTED_034_UNRESERVED),
                ),
                (
                    (MODULE, "Scheduler._update_waiting_for_remote_kv"),
                    (MODULE, "Scheduler._handle_blocked_waiting_request"),
                ),
                _STALE_RESERVATION + " (vLLM 0.34.0: the parked reservation it refreshed at "
                "promotion, to every block it needs)",
            ),
        ),
    ),
)

REQUEUE_FAILED_LOAD = "requeue-failed-load"

#: Where the waiting loop promotes a request whose load is done.
_PROMOTED = (
    "                ready_to_schedule = self._handle_blocked_waiting_request(request)\n"
    "                if not ready_to_schedule:\n"
    "                    skip_request(request_queue)\n"
    "                    continue\n"
)
_PROMOTED_OR_REQUEUED = _PROMOTED + (
    "                if (\n"
    "                    request_queue is self.kv_holding_waiting\n"
    "                    and not self._holds_kv_blocks(request)\n"
    "                ):\n"
    "                    # Its load failed and freed its blocks: it queues as waiting\n"
    "                    # again, not ahead of the loads that hold theirs.\n"
    "                    skip_request(request_queue)\n"
    "                    continue\n"
)

#: The same in vLLM 0.34.0, where a finished load counts against `max_num_inflight_kv_loads`
#: (its fetch stage) until the request is scheduled or looked up again: requeued, it would
#: count while a load waiting for the cap heads the queue ahead of it, for ever.
_PROMOTED_OR_REQUEUED_034 = _PROMOTED + (
    "                if (\n"
    "                    request_queue is self.kv_holding_waiting\n"
    "                    and not self._holds_kv_blocks(request)\n"
    "                ):\n"
    "                    # Its load failed and freed its blocks: it queues as waiting\n"
    "                    # again, not ahead of the loads that hold theirs, and is no\n"
    "                    # longer counted as a load (its lookup counts it anew).\n"
    "                    self._set_kv_fetch_stage(request, None)\n"
    "                    skip_request(request_queue)\n"
    "                    continue\n"
)
_REQUEUED = (
    "a request whose KV load failed and freed its blocks queues as waiting again instead of "
    "heading the queue of requests holding KV, where a retry that does not fit kept every "
    "finished load behind it from being promoted (the engine hung)"
)

REQUEUE_FAILED_LOAD_FIX = EngineFix(
    REQUEUE_FAILED_LOAD,
    ((MODULE, _PROMOTED, _PROMOTED_OR_REQUEUED),),
    ((MODULE, "Scheduler.schedule"),),
    _REQUEUED,
    releases=(
        (
            SCHEDULER_034,
            EngineFix(
                REQUEUE_FAILED_LOAD,
                ((MODULE, _PROMOTED, _PROMOTED_OR_REQUEUED_034),),
                ((MODULE, "Scheduler.schedule"),),
                _REQUEUED + " (vLLM 0.34.0: and it no longer counts against "
                "max_num_inflight_kv_loads, where it kept a load waiting for the cap ahead of it "
                "from starting)",
            ),
        ),
    ),
)

EVICT_FAILED_BLOCKS = "evict-failed-blocks"

_FAIL_POLICY = "        should_fail = not self.recompute_kv_load_failures\n"
_FAIL_POLICY_AND_EVICT = _FAIL_POLICY + (
    "        # A failed block holds nothing valid, whoever holds it now (the request\n"
    "        # that loaded it may be gone): no prefix-cache hit may read it.\n"
    "        self.kv_cache_manager.evict_blocks(invalid_block_ids)\n"
)
_EVICT_UNDER_FAIL = (
    "        # evict invalid blocks and downstream dependent blocks from cache\n"
    "        # only when not using recompute policy (where blocks will be recomputed\n"
    "        # and reused by other requests sharing them)\n"
    "        if sync_blocks_to_evict and not self.recompute_kv_load_failures:\n"
)
_EVICT_ALWAYS = (
    "        # evict invalid blocks and downstream dependent blocks from cache, under\n"
    "        # either policy: a hit may read them before anything recomputes them\n"
    "        if sync_blocks_to_evict:\n"
)

EVICT_FAILED_BLOCKS_FIX = EngineFix(
    EVICT_FAILED_BLOCKS,
    (
        (MODULE, _FAIL_POLICY, _FAIL_POLICY_AND_EVICT),
        (MODULE, _EVICT_UNDER_FAIL, _EVICT_ALWAYS),
    ),
    ((MODULE, "Scheduler._handle_invalid_blocks"),),
    "blocks whose KV load failed, and the blocks a step computed over them, leave the prefix "
    "cache under the recompute policy too (they stayed, and a later hit read KV computed over "
    "a failed block)",
)

EVERY_SHARER_RECOMPUTES = "every-sharer-recomputes"

_SHARED_INVALID = (
    "                if block_id in marked_invalid_block_ids:\n"
    "                    # This invalid block is shared with a previous request\n"
    "                    # and was already marked for recomputation.\n"
    "                    # This means this request can still consider this block\n"
    "                    # as computed when rescheduled.\n"
    "                    # Currently this only applies to sync loading; Async\n"
    "                    # loading does not yet support block sharing\n"
    "                    continue\n"
    "\n"
)
_SHARED_INVALID_RECOMPUTED = (
    "                # A request sharing a failed block recomputes from it too: the\n"
    "                # request that marked it may run later than this one, or never.\n"
    "\n"
)

EVERY_SHARER_RECOMPUTES_FIX = EngineFix(
    EVERY_SHARER_RECOMPUTES,
    ((MODULE, _SHARED_INVALID, _SHARED_INVALID_RECOMPUTED),),
    ((MODULE, "Scheduler._update_requests_with_invalid_blocks"),),
    "every request holding a block whose KV load failed recomputes from it (a second holder "
    "kept it as computed, relying on the first to recompute it, and read it before that)",
)

STALE_AFTER_FAILED_LOAD = "stale-after-failed-load"

_TRUNCATED = (
    "                # Truncate the computed tokens at the first failed block\n"
    "                request.num_computed_tokens = idx * self.block_size\n"
)
_TRUNCATED_AND_STALE = _TRUNCATED + (
    "                if request.num_output_placeholders:\n"
    "                    # Async scheduling: the steps in flight ran over the failed\n"
    "                    # block; their output is dropped, and no longer counted.\n"
    "                    request.num_output_placeholders = 0\n"
    "                    request.num_stale_output_tokens = request.num_in_flight_tokens\n"
    "                    request.drop_stale_output = True\n"
)

STALE_AFTER_FAILED_LOAD_FIX = EngineFix(
    STALE_AFTER_FAILED_LOAD,
    ((MODULE, _TRUNCATED, _TRUNCATED_AND_STALE),),
    ((MODULE, "Scheduler._update_requests_with_invalid_blocks"),),
    "under async scheduling, a request truncated by a failed KV load drops the output of its "
    "steps in flight, as a preempted request does (its placeholders stayed counted, so its "
    "recomputation lost output tokens or hung: vLLM issue #45138)",
)

EVICT_ENDED_LOADER_BLOCKS = "evict-ended-loader-blocks"

_HANDLED = (
    "                self._handle_invalid_blocks(\n"
    "                    kv_connector_output.invalid_block_ids,\n"
    "                    num_scheduled_tokens,\n"
    "                )\n"
)
_HANDLED_WITH_OUTPUT = (
    "                self._handle_invalid_blocks(\n"
    "                    kv_connector_output.invalid_block_ids,\n"
    "                    num_scheduled_tokens,\n"
    "                    scheduler_output,\n"
    "                )\n"
)
_HANDLER = (
    "    def _handle_invalid_blocks(\n"
    "        self, invalid_block_ids: set[int], num_scheduled_tokens: dict[str, int]\n"
    "    ) -> set[str]:\n"
)
_HANDLER_WITH_OUTPUT = (
    "    def _handle_invalid_blocks(\n"
    "        self,\n"
    "        invalid_block_ids: set[int],\n"
    "        num_scheduled_tokens: dict[str, int],\n"
    "        scheduler_output: SchedulerOutput | None = None,\n"
    "    ) -> set[str]:\n"
)
_ASYNC_LOADS = "        # handle async KV loads (not cached yet, evict_blocks=False)\n"
_ENDED_LOADERS_HEAD = (
    "        # A request that loaded in this step and is no longer running (ended\n"
    "        # since) is not scanned below, but the blocks the step computed over its\n"
    "        # failed block are cached: evict them by the step's own block ids, and\n"
    "        # those of its later steps in flight as their outputs arrive.\n"
    "        if scheduler_output is not None:\n"
    "            running_ids = {req.request_id for req in self.running}\n"
)
#: vLLM 0.33.0 resumes a preempted request among `scheduled_cached_reqs`, its block table
#: replaced; 0.34.0 sends it in full among `scheduled_new_reqs`, as a new one.
_STEPPED_RESUMED = (
    "            cached = scheduler_output.scheduled_cached_reqs\n"
    "            stepped = [\n"
    "                (new_req.req_id, new_req.block_ids)\n"
    "                for new_req in scheduler_output.scheduled_new_reqs\n"
    "            ]\n"
    "            stepped += [\n"
    "                (req_id, block_ids)\n"
    "                for req_id, block_ids in zip(cached.req_ids, cached.new_block_ids)\n"
    "                if req_id in cached.resumed_req_ids and block_ids is not None\n"
    "            ]\n"
)
_STEPPED_NEW = (
    "            stepped = [\n"
    "                (new_req.req_id, new_req.block_ids)\n"
    "                for new_req in scheduler_output.scheduled_new_reqs\n"
    "            ]\n"
)
_ENDED_LOADERS_EVICTED = (
    "            for req_id, (req_block_ids,) in stepped:\n"
    "                if req_id in running_ids:\n"
    "                    continue\n"
    "                for idx, block_id in enumerate(req_block_ids):\n"
    "                    if block_id in invalid_block_ids:\n"
    "                        self.kv_cache_manager.evict_blocks(set(req_block_ids[idx:]))\n"
    "                        if self.sched_step_seq > self.processed_step_seq:\n"
    "                            self._failed_ended_loaders[req_id] = self.sched_step_seq\n"
    "                        break\n"
    "\n"
)
_ENDED_LOADERS_AND_ASYNC_LOADS = (
    _ENDED_LOADERS_HEAD + _STEPPED_RESUMED + _ENDED_LOADERS_EVICTED + _ASYNC_LOADS
)
_ENDED_LOADERS_AND_ASYNC_LOADS_034 = (
    _ENDED_LOADERS_HEAD + _STEPPED_NEW + _ENDED_LOADERS_EVICTED + _ASYNC_LOADS
)

#: Where `__init__` sets up the connector's state.
_DELIVERY = "        self.requires_kv_delivery = False\n"
_DELIVERY_AND_ENDED_LOADERS = _DELIVERY + (
    "        # Request id -> the last step scheduled when a synchronous KV load of it was\n"
    "        # found failed after it ended: its steps still in flight computed over the\n"
    "        # failed block, so the blocks they got are evicted as their outputs arrive.\n"
    "        self._failed_ended_loaders: dict[str, int] = {}\n"
)

#: Where `update_from_output` learns that the step's GPU writes are done.
_PROCESSED = (
    "            self.processed_step_seq += 1\n"
    "            self._drain_deferred_frees()\n"
    "            self._drain_deferred_loads()\n"
)
_PROCESSED_AND_EVICTED = _PROCESSED + (
    "        if self._failed_ended_loaders:\n"
    "            self._evict_failed_ended_loaders(scheduler_output)\n"
)

#: A method added before `_handle_invalid_blocks`.
_HANDLER_DEF = "    def _handle_invalid_blocks(\n"
_EVICTER_AND_HANDLER_DEF = (
    "    def _evict_failed_ended_loaders(self, scheduler_output: SchedulerOutput) -> None:\n"
    '        """Evict the blocks this step got for requests whose synchronous KV load\n'
    "        failed after they ended (`_failed_ended_loaders`): it computed them over the\n"
    "        failed block. Forget those whose steps are all processed.\n"
    '        """\n'
    "        cached = scheduler_output.scheduled_cached_reqs\n"
    "        for req_id, new_block_ids in zip(cached.req_ids, cached.new_block_ids):\n"
    "            if req_id in self._failed_ended_loaders and new_block_ids is not None:\n"
    "                for group_block_ids in new_block_ids:\n"
    "                    self.kv_cache_manager.evict_blocks(set(group_block_ids))\n"
    "        self._failed_ended_loaders = {\n"
    "            req_id: seq\n"
    "            for req_id, seq in self._failed_ended_loaders.items()\n"
    "            if seq > self.processed_step_seq\n"
    "        }\n"
    "\n"
) + _HANDLER_DEF

_ENDED_LOADER_EDITS = (
    (MODULE, _DELIVERY, _DELIVERY_AND_ENDED_LOADERS),
    (MODULE, _PROCESSED, _PROCESSED_AND_EVICTED),
    (MODULE, _HANDLED, _HANDLED_WITH_OUTPUT),
    (MODULE, _HANDLER, _HANDLER_WITH_OUTPUT),
    (MODULE, _HANDLER_DEF, _EVICTER_AND_HANDLER_DEF),
)
_ENDED_LOADER_METHODS = (
    (MODULE, "Scheduler.update_from_output"),
    (MODULE, "Scheduler._evict_failed_ended_loaders"),
    (MODULE, "Scheduler._handle_invalid_blocks"),
)
_ENDED_LOADER_BLOCKS = (
    "the blocks a step computed over a block whose synchronous KV load failed, and those its "
    "later steps in flight computed, leave the prefix cache when the request that loaded it is "
    "no longer running (aborted before the failure was reported): vLLM found them only in "
    "running requests' block tables, and a later hit read them"
)

EVICT_ENDED_LOADER_BLOCKS_FIX = EngineFix(
    EVICT_ENDED_LOADER_BLOCKS,
    (*_ENDED_LOADER_EDITS, (MODULE, _ASYNC_LOADS, _ENDED_LOADERS_AND_ASYNC_LOADS)),
    _ENDED_LOADER_METHODS,
    _ENDED_LOADER_BLOCKS,
    state=(("_failed_ended_loaders", dict),),
    releases=(
        (
            SCHEDULER_034,
            EngineFix(
                EVICT_ENDED_LOADER_BLOCKS,
                (*_ENDED_LOADER_EDITS, (MODULE, _ASYNC_LOADS, _ENDED_LOADERS_AND_ASYNC_LOADS_034)),
                _ENDED_LOADER_METHODS,
                _ENDED_LOADER_BLOCKS + " (vLLM 0.34.0: a resumed request is among the new ones)",
                state=(("_failed_ended_loaders", dict),),
            ),
        ),
    ),
)

#: The fixes, each an edit of its own statements (they compose).
KV_LOAD_SCHEDULE = ScheduleFix(
    DROP_STALE_RESERVATION_FIX,
    REQUEUE_FAILED_LOAD_FIX,
    EVICT_FAILED_BLOCKS_FIX,
    EVERY_SHARER_RECOMPUTES_FIX,
    STALE_AFTER_FAILED_LOAD_FIX,
    EVICT_ENDED_LOADER_BLOCKS_FIX,
)
KV_LOAD_FIXES = KV_LOAD_SCHEDULE.fix_set
#: Give one built `Scheduler` or `AsyncScheduler` all six fixes.
apply_kv_load_fixes: ApplyFix = KV_LOAD_SCHEDULE.apply
#: Give one built scheduler `drop-stale-reservation` alone.
apply_drop_stale_reservation_fix: ApplyFix = ScheduleFix(DROP_STALE_RESERVATION_FIX).apply
#: The fixes as a unified diff of the installed vLLM's `scheduler.py`.
fix_as_diff: FixDiff = KV_LOAD_SCHEDULE.as_diff


__all__ = [
    "DROP_STALE_RESERVATION",
    "DROP_STALE_RESERVATION_FIX",
    "EVERY_SHARER_RECOMPUTES",
    "EVERY_SHARER_RECOMPUTES_FIX",
    "EVICT_ENDED_LOADER_BLOCKS",
    "EVICT_ENDED_LOADER_BLOCKS_FIX",
    "EVICT_FAILED_BLOCKS",
    "EVICT_FAILED_BLOCKS_FIX",
    "KV_LOAD_FIXES",
    "KV_LOAD_SCHEDULE",
    "REQUEUE_FAILED_LOAD",
    "REQUEUE_FAILED_LOAD_FIX",
    "STALE_AFTER_FAILED_LOAD",
    "STALE_AFTER_FAILED_LOAD_FIX",
    "FixDoesNotApply",
    "apply_drop_stale_reservation_fix",
    "apply_kv_load_fixes",
    "fix_as_diff",
]
