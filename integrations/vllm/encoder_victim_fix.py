"""A candidate fix for a finding in vLLM 0.33.0's multimodal encoder cache under priority
scheduling (docs/engines/vllm-features.md, "Multimodal encoder inputs").

The finding: `Scheduler.schedule` books a request's encoder inputs in the encoder cache
(`EncoderCacheManager.allocate`) when it schedules the request, before the model runner
computes them. Under the priority policy it may then preempt a request it already scheduled
in the same call (the lowest-priority running request, when a later one cannot get a block):
the victim's encoder inputs are taken out of the step (`scheduled_encoder_inputs.pop`) and
its compute budget restored, so the runner never computes them, but the book keeps their
entries: `_preempt_request` only drops the victim's references, leaving each entry
reclaimable and *cached*. A later step that reaches the item (the victim once resumed, or
any request with the same item) takes it as a hit (`check_and_update_cache`), schedules no
encoder run, and the runner raises "Encoder cache miss". The same shape as vLLM's merged fix
for stale same-step evictions (vllm-project/vllm#52482: an entry evicted and booked again in
one call was reported freed), on another path.

The fix: where the priority branch takes a scheduled victim's encoder inputs out of the step,
it frees the victim's references at once and drops from the book every one of those entries
that no other request references, returning its slots (as an eviction does, without telling
the runner, which never held it). One insertion in `Scheduler.schedule`; an edit of vLLM's
own `vllm/v1/core/sched/scheduler.py` (`ENCODER_VICTIM_FIXES`, `fix_as_diff()`), given to one
built scheduler by `apply_encoder_victim_fix`. An entry another request took as a hit in the
same call stays booked (that request still reads it); the sweeps in docs/engines/vllm-features.md
did not meet that case.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

ENCODER_VICTIM = "unbook-victim-encoder-inputs"

#: Where the priority branch gives back a scheduled victim's encoder compute budget.
_RESTORE = "                                encoder_compute_budget += num_embeds_to_restore\n"
_RESTORE_AND_UNBOOK = _RESTORE + (
    "                                # Those inputs are never computed: free the victim's\n"
    "                                # references now and drop from the book the entries no\n"
    "                                # other request references (the runner never held them).\n"
    "                                ec_manager = self.encoder_cache_manager\n"
    "                                ec_manager.free(preempted_req)\n"
    "                                for i in preempted_encoder_inputs:\n"
    "                                    mm_hash = preempted_req.mm_features[i].identifier\n"
    "                                    if ec_manager.cached.get(mm_hash) == set():\n"
    "                                        del ec_manager.cached[mm_hash]\n"
    "                                        ec_manager.freeable.pop(mm_hash)\n"
    "                                        ec_manager.num_free_slots += (\n"
    "                                            ec_manager.num_embeds_by_hash.pop(mm_hash)\n"
    "                                        )\n"
)

ENCODER_VICTIM_FIX = EngineFix(
    ENCODER_VICTIM,
    ((MODULE, _RESTORE, _RESTORE_AND_UNBOOK),),
    ((MODULE, "Scheduler.schedule"),),
    "a request preempted in the step that scheduled it leaves its never-computed encoder "
    "inputs booked in the encoder cache: drop them from the book when it is taken out",
)
ENCODER_VICTIM_SCHEDULE = ScheduleFix(ENCODER_VICTIM_FIX)
ENCODER_VICTIM_FIXES = ENCODER_VICTIM_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_encoder_victim_fix: ApplyFix = ENCODER_VICTIM_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = ENCODER_VICTIM_SCHEDULE.as_diff

__all__ = [
    "ENCODER_VICTIM",
    "ENCODER_VICTIM_FIX",
    "ENCODER_VICTIM_FIXES",
    "ENCODER_VICTIM_SCHEDULE",
    "FixDoesNotApply",
    "apply_encoder_victim_fix",
    "fix_as_diff",
]
