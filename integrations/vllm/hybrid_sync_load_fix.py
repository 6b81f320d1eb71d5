"""A candidate fix for a finding in vLLM's KV connector path on a hybrid cache (several KV
cache groups): a synchronous load that fails has no way to be heard.

The finding (docs/engines/vllm-kv.md, "A KV connector on a hybrid cache", finding 3): on several
groups `_handle_invalid_blocks` refuses block-level failures ("Connectors must report failed
requests via KVConnectorTransferResults.failed_recving instead"), and `_handle_failed_recving` reads
`failed_recving` only for requests waiting for an asynchronous load. A synchronous load is
made in the forward of the step that admits its request, which is running by then: its
failure is dropped. The request carries on over KV that nothing wrote, even under
`kv_load_failure_policy="fail"`, and the blocks of the loaded tokens (cached at allocation)
are hit by other requests.

The fix hears it where the single-group path would. `schedule()` records each synchronous load
of the step (the first loaded token, and the request's blocks in every group with their hashes
then); `update_from_output` of that step, told the request's load failed in `failed_recving`,
takes the blocks from the one holding that token on, in every group (null blocks left out),
as computed from nothing: they leave the prefix cache, and every request holding one fails
under the "fail" policy (the loader, and a request that hit them since, as
`_update_requests_with_invalid_blocks` fails every holder of a failed block on one group), or,
under "recompute", starts again: a running holder is preempted (its KV freed, its steps in
flight dropped, as `reset_prefix_cache` preempts) and resumes once those steps have drained, as
the waiting loop holds back a request whose stale output is in flight (so that, with pipeline
stages, it keeps the decode cadence); a holder whose asynchronous load is in flight is marked
failed (its blocks freed when that load ends, as `_handle_failed_recving` does). Truncating
the computed tokens at the failed block, as one group does, is no option here: a sliding
window's blocks before the load are null already. A loader that is no longer that run (it ended
or was preempted since the step was scheduled) gives its blocks by the record, each only while
it still holds the hash it had then (a block freed and reused has lost it).

It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`HYBRID_SYNC_LOAD_FIXES`,
`fix_as_diff()`), given to one built scheduler by `apply_hybrid_sync_load_fix`; the same text in
vLLM 0.33.0 and 0.34.0.
"""

from __future__ import annotations

from collections import deque

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

HYBRID_SYNC_LOAD = "hear-failed-sync-load"

#: Where `__init__` sets up the preemptions reported by the next `schedule()`.
_RESET_PREEMPTED = "        self.reset_preempted_req_ids: set[str] = set()\n"
_RESET_PREEMPTED_AND_LOADS = _RESET_PREEMPTED + (
    "        # The synchronous KV loads of the non-empty steps in flight, in schedule\n"
    "        # order: request id -> (first loaded token, its preemptions then, (block, its\n"
    "        # hash then) per group).\n"
    "        self._sync_loads_in_flight: deque[\n"
    "            dict[str, tuple[int, int, list[list[tuple]]]]\n"
    "        ] = deque()\n"
    "        # Requests preempted to recompute after a failed synchronous load: each waits\n"
    "        # for its dropped steps in flight to drain before it resumes.\n"
    "        self._failed_load_restarts: set[str] = set()\n"
)

#: Where `schedule()` sets up its own record of synchronous loads.
_NO_SYNC_LOADS = "        has_sync_kv_loads = False\n"
_NO_SYNC_LOADS_RECORDED = _NO_SYNC_LOADS + (
    "        # This step's synchronous loads (_sync_loads_in_flight).\n"
    "        sync_loads: dict[str, tuple[int, int, list[list[tuple]]]] = {}\n"
)

#: Where the waiting loop admits a request with a synchronous load.
_SYNC_LOAD = (
    "                if num_external_computed_tokens > 0:\n"
    "                    # load_kv_async is False here\n"
    "                    has_sync_kv_loads = True\n"
)
_SYNC_LOAD_RECORDED = _SYNC_LOAD + (
    "                    sync_loads[request_id] = (\n"
    "                        num_computed_tokens - num_external_computed_tokens,\n"
    "                        request.num_preemptions,\n"
    "                        [\n"
    "                            [(block, block.block_hash) for block in group]\n"
    "                            for group in self.kv_cache_manager.get_blocks(\n"
    "                                request_id\n"
    "                            ).blocks\n"
    "                        ],\n"
    "                    )\n"
)

#: Where the waiting loop holds back a resumed request whose stale output is in flight.
_STALE_IN_FLIGHT = (
    "                if request.num_stale_output_tokens and not request.drop_stale_output:\n"
)
_STALE_OR_RESTART_IN_FLIGHT = (
    "                if request.num_stale_output_tokens and (\n"
    "                    not request.drop_stale_output\n"
    "                    or request_id in self._failed_load_restarts\n"
    "                ):\n"
    "                    # (A request restarted by a failed synchronous load waits too:\n"
    "                    # its steps in flight keep the pipeline's decode cadence.)\n"
)

#: The end of `schedule()`, before the step fence.
_FENCE = (
    "        # Advance the fence only for non-empty steps (those that actually\n"
    "        # write KV and have their output processed later in update_from_output).\n"
)
_LOADS_QUEUED_AND_FENCE = (
    "        if total_num_scheduled_tokens > 0:\n"
    "            self._sync_loads_in_flight.append(sync_loads)\n"
    "\n"
) + _FENCE

#: Where `update_from_output` reads the connector's block-level failures.
_INVALID_BLOCKS = "        if kv_connector_output and kv_connector_output.invalid_block_ids:\n"
_FAILED_SYNC_LOADS_AND_INVALID_BLOCKS = (
    "        if scheduler_output.total_num_scheduled_tokens > 0 and self._sync_loads_in_flight:\n"
    "            # The synchronous loads this step made; one whose request is reported\n"
    "            # in failed_recving failed as a whole (how a connector reports it on\n"
    "            # several KV cache groups, where invalid_block_ids is refused).\n"
    "            sync_loads = self._sync_loads_in_flight.popleft()\n"
    "            failed_recving = (\n"
    "                kv_connector_output.failed_recving if kv_connector_output else None\n"
    "            )\n"
    "            failed_sync_loads = {\n"
    "                req_id: load\n"
    "                for req_id, load in sync_loads.items()\n"
    "                if failed_recving and req_id in failed_recving\n"
    "            }\n"
    "            if failed_sync_loads:\n"
    "                failed_kv_load_req_ids.update(\n"
    "                    self._handle_failed_sync_loads(failed_sync_loads)\n"
    "                )\n"
) + _INVALID_BLOCKS

#: A method added before `_handle_failed_recving`.
_FAILED_RECVING_DEF = (
    "    def _handle_failed_recving(self, failed_req_ids: set[str]) -> set[str]:\n"
)
_HANDLER_AND_FAILED_RECVING_DEF = (
    "    def _handle_failed_sync_loads(\n"
    "        self, failed_loads: dict[str, tuple[int, int, list[list[tuple]]]]\n"
    "    ) -> set[str]:\n"
    '        """Requests whose synchronous KV load failed as a whole in this step, as\n'
    "        (first loaded token, its preemptions and (block, its hash then) per group at\n"
    "        admission). The blocks from the one holding that token on, in every group,\n"
    "        hold KV computed from nothing: they leave the prefix cache, and every\n"
    "        request holding one fails (policy fail) or starts again (recompute: a\n"
    "        running one is preempted, one whose asynchronous load is in flight is\n"
    "        marked failed). Returns the requests whose output of this step is skipped.\n"
    '        """\n'
    "        groups = self.kv_cache_config.kv_cache_groups\n"
    "        failed_blocks: set[int] = set()\n"
    "        for req_id, (first_token, preemptions, admitted) in failed_loads.items():\n"
    "            request = self.requests.get(req_id)\n"
    "            # still the run that loaded (not preempted since, maybe running again)\n"
    "            running = (\n"
    "                request is not None\n"
    "                and request.status == RequestStatus.RUNNING\n"
    "                and request.num_preemptions == preemptions\n"
    "            )\n"
    "            held = self.kv_cache_manager.get_blocks(req_id).blocks if running else ()\n"
    "            for g, group in enumerate(groups):\n"
    "                first = first_token // group.kv_cache_spec.block_size\n"
    "                # the blocks it had then that still hold what they held (one freed\n"
    "                # and reused has lost its hash), and, still that run, those it holds\n"
    "                failed_blocks.update(\n"
    "                    block.block_id\n"
    "                    for block, block_hash in admitted[g][first:]\n"
    "                    if block_hash is not None and block.block_hash == block_hash\n"
    "                )\n"
    "                if running:\n"
    "                    failed_blocks.update(\n"
    "                        block.block_id for block in held[g][first:] if not block.is_null\n"
    "                    )\n"
    "        self.kv_cache_manager.evict_blocks(failed_blocks)\n"
    "\n"
    "        def holds_failed_block(request: Request) -> bool:\n"
    "            held = self.kv_cache_manager.get_block_ids(request.request_id)\n"
    "            return any(not failed_blocks.isdisjoint(ids) for ids in held)\n"
    "\n"
    "        running_holders = [req for req in self.running if holds_failed_block(req)]\n"
    "        loading_holders = [\n"
    "            req\n"
    "            for req in self.kv_holding_waiting\n"
    "            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS\n"
    "            and holds_failed_block(req)\n"
    "        ]\n"
    "        holder_ids = {req.request_id for req in running_holders + loading_holders}\n"
    "        logger.warning(\n"
    '            "Synchronous KV load of %s failed: %d block(s) evicted, held by %s "\n'
    '            "(failure_policy=%s).",\n'
    "            sorted(failed_loads),\n"
    "            len(failed_blocks),\n"
    "            sorted(holder_ids),\n"
    '            "recompute" if self.recompute_kv_load_failures else "fail",\n'
    "        )\n"
    "        if not self.recompute_kv_load_failures:\n"
    "            return holder_ids\n"
    "        timestamp = time.monotonic()\n"
    "        # (forget the restarts whose dropped steps have drained)\n"
    "        self._failed_load_restarts = {\n"
    "            req_id\n"
    "            for req_id in self._failed_load_restarts\n"
    "            if req_id in self.requests\n"
    "            and self.requests[req_id].num_stale_output_tokens\n"
    "        }\n"
    "        for request in running_holders:\n"
    "            # its KV from the failed block on is wrong, and a sliding window's\n"
    "            # blocks before it are null already: it recomputes from the start\n"
    "            self.running.remove(request)\n"
    "            self._preempt_request(request, timestamp, drop_stale_output=True)\n"
    "            if request.num_stale_output_tokens:\n"
    "                self._failed_load_restarts.add(request.request_id)\n"
    "        for request in loading_holders:\n"
    "            request.num_computed_tokens = 0\n"
    "            self.failed_recving_kv_req_ids.add(request.request_id)\n"
    "        return {req.request_id for req in running_holders}\n"
    "\n"
) + _FAILED_RECVING_DEF

HYBRID_SYNC_LOAD_FIX = EngineFix(
    HYBRID_SYNC_LOAD,
    (
        (MODULE, _RESET_PREEMPTED, _RESET_PREEMPTED_AND_LOADS),
        (MODULE, _NO_SYNC_LOADS, _NO_SYNC_LOADS_RECORDED),
        (MODULE, _STALE_IN_FLIGHT, _STALE_OR_RESTART_IN_FLIGHT),
        (MODULE, _SYNC_LOAD, _SYNC_LOAD_RECORDED),
        (MODULE, _FENCE, _LOADS_QUEUED_AND_FENCE),
        (MODULE, _INVALID_BLOCKS, _FAILED_SYNC_LOADS_AND_INVALID_BLOCKS),
        (MODULE, _FAILED_RECVING_DEF, _HANDLER_AND_FAILED_RECVING_DEF),
    ),
    (
        (MODULE, "Scheduler.schedule"),
        (MODULE, "Scheduler.update_from_output"),
        (MODULE, "Scheduler._handle_failed_sync_loads"),
    ),
    "a synchronous KV load that fails as a whole, reported in failed_recving (the only way on "
    "several KV cache groups), is heard: the blocks from its first loaded token on leave the "
    "prefix cache in every group, and every request holding one fails, or under recompute "
    "starts again (it carried on over KV nothing wrote, and others hit its blocks)",
    state=(("_sync_loads_in_flight", deque), ("_failed_load_restarts", set)),
)
HYBRID_SYNC_LOAD_SCHEDULE = ScheduleFix(HYBRID_SYNC_LOAD_FIX)
HYBRID_SYNC_LOAD_FIXES = HYBRID_SYNC_LOAD_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed methods (`ScheduleFix.apply`).
apply_hybrid_sync_load_fix: ApplyFix = HYBRID_SYNC_LOAD_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = HYBRID_SYNC_LOAD_SCHEDULE.as_diff

__all__ = [
    "HYBRID_SYNC_LOAD",
    "HYBRID_SYNC_LOAD_FIX",
    "HYBRID_SYNC_LOAD_FIXES",
    "HYBRID_SYNC_LOAD_SCHEDULE",
    "FixDoesNotApply",
    "apply_hybrid_sync_load_fix",
    "fix_as_diff",
]
