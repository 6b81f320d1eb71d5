"""A candidate fix for a finding in vLLM 0.33.0's multimodal encoder cache beside a KV
connector (docs/engines/vllm-features.md, "Multimodal encoder inputs").

The finding: when a KV load fails under the recompute policy, `_update_requests_with_invalid_
blocks` truncates each affected request's computed tokens at its first failed block, and the
request recomputes from there. Its references in the encoder cache stay as they were: an item
past the new frontier that the failed step (or an earlier one) encoded stays referenced by the
request, so it cannot be evicted. When the request now needs an earlier item first and the
cache has no room for both, `_try_schedule_encoder_inputs` finds no room for the earlier one
(the later one, referenced, is not reclaimable) and gives the request no token, in every step:
the request waits for itself for good, and the engine with it. vLLM sizes the cache at
`max_num_batched_tokens` (and at least one item), so two items of a prompt that together pass
it are enough (shrunk: one request, a 10-token prompt with items at [1, 4) and [7, 10), a
cache of 3 embeddings, a remote hit of 5 tokens whose load fails in block 1).

The fix: where a request is truncated, it drops its references to the items that start at or
past its new frontier (`EncoderCacheManager.free_encoder_input`): they stay cached and
reclaimable, a hit again when the request reaches them if nothing evicted them meanwhile, and
computed again if something did. One insertion in `Scheduler._update_requests_with_invalid_
blocks`; an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`ENCODER_ROLLBACK_FIXES`,
`fix_as_diff()`), given to one built scheduler by `apply_encoder_rollback_fix`.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

RELEASE_ITEMS_PAST_ROLLBACK = "release-items-past-rollback"

_AFFECTED = "                affected_req_ids.add(request.request_id)\n"
_AFFECTED_AND_RELEASED = _AFFECTED + (
    "                # Items at or past the new frontier are not needed until the\n"
    "                # request reaches them again; a reference kept to one could\n"
    "                # leave no room for an earlier item it now needs first.\n"
    "                ec_manager = self.encoder_cache_manager\n"
    "                for input_id in list(ec_manager.get_cached_input_ids(request)):\n"
    "                    mm_position = request.mm_features[input_id].mm_position\n"
    "                    if mm_position.offset >= request.num_computed_tokens:\n"
    "                        ec_manager.free_encoder_input(request, input_id)\n"
)

ENCODER_ROLLBACK_FIX = EngineFix(
    RELEASE_ITEMS_PAST_ROLLBACK,
    ((MODULE, _AFFECTED, _AFFECTED_AND_RELEASED),),
    ((MODULE, "Scheduler._update_requests_with_invalid_blocks"),),
    "a request truncated by a failed KV load keeps its encoder cache references to items past "
    "its new frontier, and with no room left for an earlier item it needs first it waits for "
    "itself for good: drop those references when it is truncated",
)
ENCODER_ROLLBACK_SCHEDULE = ScheduleFix(ENCODER_ROLLBACK_FIX)
ENCODER_ROLLBACK_FIXES = ENCODER_ROLLBACK_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed methods (`ScheduleFix.apply`).
apply_encoder_rollback_fix: ApplyFix = ENCODER_ROLLBACK_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = ENCODER_ROLLBACK_SCHEDULE.as_diff

__all__ = [
    "ENCODER_ROLLBACK_FIX",
    "ENCODER_ROLLBACK_FIXES",
    "ENCODER_ROLLBACK_SCHEDULE",
    "RELEASE_ITEMS_PAST_ROLLBACK",
    "FixDoesNotApply",
    "apply_encoder_rollback_fix",
    "fix_as_diff",
]
