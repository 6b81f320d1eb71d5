"""A candidate fix for a finding in vLLM 0.33.0's scheduling of multimodal items with chunked
mm input disabled (docs/engines/vllm-features.md, "Multimodal encoder inputs").

The finding: with `disable_chunked_mm_input` a step may not cover part of an item
(`Scheduler._try_schedule_encoder_inputs` rolls a chunk that would end inside one back to the
item's start, and one that starts on the item to nothing: vllm-project/vllm#52306, so the
request "waits for a step that can fit it"). `long_prefill_token_threshold` caps every prefill
chunk while more than one request is eligible, before that rollback. With the cap below an
item's length no step can ever fit the item: the request reaches the item's start and is then
given no token in every step, for as long as another request is eligible, which it stays when it
waits for the stalled request's seat or is stalled the same way. vLLM validates an item only
against `max_num_batched_tokens` (`compute_mm_encoder_budget`), so such a configuration starts
and hangs at the first two concurrent requests with an item longer than the cap (shrunk: one
seat, a cap of 1 token, a 4-token prompt with a 3-token item and a second request).

The fix: where `Scheduler.schedule` applies the cap (in its running loop and its waiting loop),
with chunked mm input disabled a cap that would end inside an item reaches that item's end
instead (an item the chunk starts inside, after a prefix-cache hit ending there, included:
vLLM 0.34.0 waits for the rest of such an item to fit) (the token budget still bounds the chunk,
and `max_num_batched_tokens` holds an item, as vLLM checks). The cap keeps a long prefill from
starving the others; an item that may not be split is the least it can take, as when the request
is the only one eligible, where vLLM lifts the cap altogether. An edit of vLLM's own
`vllm/v1/core/sched/scheduler.py` (`MM_THRESHOLD_FIXES`, `fix_as_diff()`), given to one built
scheduler by `apply_mm_threshold_fix`.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

WHOLE_ITEM_PAST_THRESHOLD = "whole-item-past-threshold"


def _capped(indent: str, computed: str) -> tuple[str, str]:
    """The cap statement at `indent` and its fixed form, the chunk starting at `computed`."""
    cap = (
        f"{indent}if 0 < long_prefill_token_threshold < num_new_tokens:\n"
        f"{indent}    num_new_tokens = long_prefill_token_threshold\n"
    )
    fixed = (
        f"{indent}if 0 < long_prefill_token_threshold < num_new_tokens:\n"
        f"{indent}    capped = long_prefill_token_threshold\n"
        f"{indent}    if self.scheduler_config.disable_chunked_mm_input:\n"
        f"{indent}        # An item may not be split: a cap ending inside one reaches\n"
        f"{indent}        # its end, or no step ever fits it.\n"
        f"{indent}        chunk_start = {computed}\n"
        f"{indent}        for mm_feature in request.mm_features:\n"
        f"{indent}            item_start = mm_feature.mm_position.offset\n"
        f"{indent}            item_end = item_start + mm_feature.mm_position.length\n"
        f"{indent}            chunk_end = chunk_start + capped\n"
        f"{indent}            if item_start < chunk_end < item_end:\n"
        f"{indent}                capped = item_end - chunk_start\n"
        f"{indent}                break\n"
        f"{indent}    num_new_tokens = min(num_new_tokens, capped)\n"
    )
    return cap, fixed


_RUNNING = _capped(" " * 12, "request.num_computed_tokens")
_WAITING = _capped(" " * 20, "num_computed_tokens")

MM_THRESHOLD_FIX = EngineFix(
    WHOLE_ITEM_PAST_THRESHOLD,
    ((MODULE, *_RUNNING), (MODULE, *_WAITING)),
    ((MODULE, "Scheduler.schedule"),),
    "with chunked mm input disabled, a long-prefill cap shorter than an item stalls the request "
    "at the item for as long as another request is eligible: let the cap reach the item's end",
)
MM_THRESHOLD_SCHEDULE = ScheduleFix(MM_THRESHOLD_FIX)
MM_THRESHOLD_FIXES = MM_THRESHOLD_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_mm_threshold_fix: ApplyFix = MM_THRESHOLD_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = MM_THRESHOLD_SCHEDULE.as_diff

__all__ = [
    "MM_THRESHOLD_FIX",
    "MM_THRESHOLD_FIXES",
    "MM_THRESHOLD_SCHEDULE",
    "WHOLE_ITEM_PAST_THRESHOLD",
    "FixDoesNotApply",
    "apply_mm_threshold_fix",
    "fix_as_diff",
]
