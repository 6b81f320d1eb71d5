"""Two changes vLLM 0.34.0 made to multimodal scheduling, written as candidate fixes of 0.33.0
for the two findings of 0.33.0 they lift (docs/engines/vllm-features.md, "Multimodal encoder
inputs"; fixed upstream in 0.34.0, whose programs pass there as released).

- `finish-item-started-inside`: with `disable_chunked_mm_input`, 0.33.0 rolls back only a chunk
  that starts at or before an item (`num_computed_tokens <= start_pos`); a chunk that starts
  inside one, after a prefix-cache hit that ends there, is scheduled in part, so the item is
  split after all. 0.34.0 schedules nothing until the rest of the item fits. The fix drops the
  condition: a chunk that starts inside the item then rolls back to nothing (the rollback's
  `max(0, start_pos - num_computed_tokens)` is 0 there), as 0.34.0 has it.
- `whole-prompt-under-encoder-pressure`: with chunked prefill off, 0.33.0 lets the encoder's
  cut (`_try_schedule_encoder_inputs` stops a chunk before an item that finds no room in the
  encoder cache or budget) stand, and schedules part of a prompt that must be prefilled whole.
  0.34.0 then requeues the request and drops the references its hits took ("encoder cache
  pressure must not split a prompt that requires full prefill"); the fix inserts that check
  in the waiting loop.

Edits of vLLM 0.33.0's own `vllm/v1/core/sched/scheduler.py` (`MM_UPSTREAM_FIXES`,
`fix_as_diff()`), given to one built scheduler by `apply_mm_upstream_fixes`; 0.34.0's file
has neither place (`FixDoesNotApply` there: nothing to fix).
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

FINISH_ITEM_STARTED_INSIDE = "finish-item-started-inside"
WHOLE_PROMPT_UNDER_ENCODER_PRESSURE = "whole-prompt-under-encoder-pressure"

_STARTS_AT_OR_BEFORE = (
    "                and not self.is_encoder_decoder\n"
    "                # `<=`, not `<`: a chunk that starts exactly at the item still\n"
    "                # splits it when it cannot cover the whole item.\n"
    "                and num_computed_tokens <= start_pos\n"
)
_ANY_START = (
    "                and not self.is_encoder_decoder\n"
    "                # A chunk that starts inside the item (a prefix-cache hit can end\n"
    "                # there) splits it too: it rolls back to nothing until the rest fits.\n"
)

FINISH_ITEM_STARTED_INSIDE_FIX = EngineFix(
    FINISH_ITEM_STARTED_INSIDE,
    ((MODULE, _STARTS_AT_OR_BEFORE, _ANY_START),),
    ((MODULE, "Scheduler._try_schedule_encoder_inputs"),),
    "with chunked mm input disabled, a chunk that starts inside an item (after a prefix-cache "
    "hit ending there) is scheduled in part: schedule nothing until the rest fits, as vLLM "
    "0.34.0 does",
)

_LOOKAHEAD_RESERVED = (
    "                    num_new_tokens = self._reserve_prefill_lookahead(\n"
    "                        request, num_computed_tokens, num_new_tokens\n"
    "                    )\n"
    "\n"
    "                    if num_new_tokens == 0:\n"
)
_LOOKAHEAD_RESERVED_WHOLE_PROMPT = (
    "                    num_new_tokens = self._reserve_prefill_lookahead(\n"
    "                        request, num_computed_tokens, num_new_tokens\n"
    "                    )\n"
    "\n"
    "                    if (\n"
    "                        request.has_encoder_inputs\n"
    "                        and not self.scheduler_config.enable_chunked_prefill\n"
    "                        and not self.is_mm_encoder_only\n"
    "                        and num_new_tokens > 0\n"
    "                        and num_new_tokens < request.num_tokens - num_computed_tokens\n"
    "                    ):\n"
    "                        # Encoder pressure must not split a prompt that must be\n"
    "                        # prefilled whole: drop the references its hits took.\n"
    "                        self.encoder_cache_manager.free(request)\n"
    "                        num_new_tokens = 0\n"
    "\n"
    "                    if num_new_tokens == 0:\n"
)

WHOLE_PROMPT_UNDER_ENCODER_PRESSURE_FIX = EngineFix(
    WHOLE_PROMPT_UNDER_ENCODER_PRESSURE,
    ((MODULE, _LOOKAHEAD_RESERVED, _LOOKAHEAD_RESERVED_WHOLE_PROMPT),),
    ((MODULE, "Scheduler.schedule"),),
    "with chunked prefill off, the encoder's cut splits a prompt that must be prefilled whole: "
    "requeue the request instead, as vLLM 0.34.0 does",
)


def fixed_upstream() -> bool:
    """Whether the installed vLLM already has both changes (0.34.0: its chunk rollback no
    longer asks `num_computed_tokens <= start_pos`, and its waiting loop keeps a prompt whole
    under encoder pressure), so neither finding reproduces and these fixes are not needed."""
    from integrations.vllm.patches import installed_text

    text = installed_text(MODULE)
    return _STARTS_AT_OR_BEFORE not in text and "must not split a prompt" in text


MM_UPSTREAM_SCHEDULE = ScheduleFix(
    FINISH_ITEM_STARTED_INSIDE_FIX, WHOLE_PROMPT_UNDER_ENCODER_PRESSURE_FIX
)
MM_UPSTREAM_FIXES = MM_UPSTREAM_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` both fixed methods (`ScheduleFix.apply`).
apply_mm_upstream_fixes: ApplyFix = MM_UPSTREAM_SCHEDULE.apply
#: The fixes as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = MM_UPSTREAM_SCHEDULE.as_diff

__all__ = [
    "FINISH_ITEM_STARTED_INSIDE",
    "FINISH_ITEM_STARTED_INSIDE_FIX",
    "MM_UPSTREAM_FIXES",
    "MM_UPSTREAM_SCHEDULE",
    "WHOLE_PROMPT_UNDER_ENCODER_PRESSURE",
    "WHOLE_PROMPT_UNDER_ENCODER_PRESSURE_FIX",
    "FixDoesNotApply",
    "apply_mm_upstream_fixes",
    "fix_as_diff",
    "fixed_upstream",
]
