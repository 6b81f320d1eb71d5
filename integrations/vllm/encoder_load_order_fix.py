"""A candidate fix for a finding in vLLM 0.33.0's and 0.34.0's CPU encoder-cache offload
(`ECCPUConnector`, role `ec_both`; docs/engines/vllm-features.md, "CPU encoder-cache offload").

The finding: `_try_schedule_encoder_inputs` plans a request's items first (an item the
connector holds ready, `has_cache_item`, becomes an external load), and `schedule` then books
them in the order `encoder_inputs_to_schedule + external_load_encoder_input`: the items the
encoder runs before the ones it loads. Booking an item the encoder runs gives it CPU blocks
for its save (`update_state_after_alloc`, producer side), evicting the oldest ready, unpinned
entry when the region is full: that can be the very entry the request is about to load,
which is pinned only when its own turn comes. Its turn then finds no entry: the consumer side
dispatches no load, and the producer side allocates a save of an item the encoder does not run
in the step. The runner never gets the item the book now holds (the step, or a later one,
reading it is an "Encoder cache miss"), and the save never lands: the entry holds its blocks,
never ready, and `has_pending_push_work` stays true, for good. Shrunk: two prompts with the
same two items, a region of two items, a third item in between that evicts the first.

The fix: book the loads first, so each pins its entry before any save of the step can evict
it. Two edits of `Scheduler.schedule` (its running and its waiting branch); an edit of vLLM's
own `vllm/v1/core/sched/scheduler.py` (`ENCODER_LOAD_ORDER_FIXES`, `fix_as_diff()`), given
to one built scheduler by `apply_encoder_load_order_fix`.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

PIN_LOADS_BEFORE_SAVES = "pin-loads-before-saves"

_WHY = "# Loads first: each pins its entry before a save can evict it.\n"
_RUNNING = "                    (encoder_inputs_to_schedule or []) + external_load_encoder_input,\n"
_RUNNING_FIXED = (
    "                    " + _WHY + "                    external_load_encoder_input\n"
    "                    + (encoder_inputs_to_schedule or []),\n"
)
_WAITING = (
    "                        (encoder_inputs_to_schedule or [])\n"
    "                        + external_load_encoder_input,\n"
)
_WAITING_FIXED = (
    "                        " + _WHY + "                        external_load_encoder_input\n"
    "                        + (encoder_inputs_to_schedule or []),\n"
)

ENCODER_LOAD_ORDER_FIX = EngineFix(
    PIN_LOADS_BEFORE_SAVES,
    ((MODULE, _RUNNING, _RUNNING_FIXED), (MODULE, _WAITING, _WAITING_FIXED)),
    ((MODULE, "Scheduler.schedule"),),
    "with the CPU encoder-cache offload, booking a request's encoded items before the ones it "
    "loads lets an encoded item's save evict the entry a load is about to pin: no load is "
    "sent and a save that never lands is; book the loads first",
)
ENCODER_LOAD_ORDER_SCHEDULE = ScheduleFix(ENCODER_LOAD_ORDER_FIX)
ENCODER_LOAD_ORDER_FIXES = ENCODER_LOAD_ORDER_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed methods (`ScheduleFix.apply`).
apply_encoder_load_order_fix: ApplyFix = ENCODER_LOAD_ORDER_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = ENCODER_LOAD_ORDER_SCHEDULE.as_diff

__all__ = [
    "ENCODER_LOAD_ORDER_FIX",
    "ENCODER_LOAD_ORDER_FIXES",
    "ENCODER_LOAD_ORDER_SCHEDULE",
    "PIN_LOADS_BEFORE_SAVES",
    "FixDoesNotApply",
    "apply_encoder_load_order_fix",
    "fix_as_diff",
]
