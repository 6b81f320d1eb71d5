"""A candidate fix for a finding in vLLM 0.33.0's speculative decoding: the padding of a newly
admitted decode request, applied to one built scheduler so that the engine-core checks can
validate it.

The finding (docs/engines/vllm-features.md, "Speculative decoding: the padding of a new decode"):
with speculative decoding, `Scheduler.schedule` pads a waiting request that has exactly one token
left to compute (a full prefix-cache hit, or a request resumed after preemption) to 1 + k
tokens, k draft placeholders, so that the step stays a uniform decode for CUDA graphs; if the
step's budget cannot take the padded size it stops admitting ("Prefer to not schedule than
schedule un-padded"). Two settings vLLM accepts break that:

- a long-prefill threshold T with 0 < T < 1 + k, when another request is running or waiting:
  the threshold then cuts the padded request to T tokens, and vLLM's own
  `assert num_new_tokens == 1 + self.num_spec_tokens` fails: `schedule()` raises
  `AssertionError` and the engine core dies;
- a token budget below 1 + k (`max_num_batched_tokens`; vLLM only warns that it is small):
  the padded size never fits, so the request is never admitted and the engine spins with it
  waiting (and everything queued behind it) for ever.

The fix pads only to a size a step can schedule whole: not when the threshold would cut it,
and not when it exceeds the most any step can give one request. Such a request is then
scheduled unpadded, as one without drafts is. It is an edit of vLLM's own
`vllm/v1/core/sched/scheduler.py` (`SPEC_PAD_FIXES`): `fix_as_diff()` prints it as a patch,
and `apply_spec_pad_fix(sched)` gives one built scheduler the edited `Scheduler.schedule`
through a subclass of its class. `FixDoesNotApply` if vLLM's file no longer has the statement
the fix edits.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

SPEC_PAD = "pad-what-fits"

#: The condition under which a new decode request is padded to 1 + k tokens.
_PAD_IF = (
    "                        # Pad only when there is room for the sampled token(s).\n"
    "                        if (\n"
    "                            num_computed_tokens\n"
    "                            + padded_num_tokens\n"
    "                            + self.num_sampled_tokens_per_step\n"
    "                            <= self.max_model_len\n"
    "                        ):\n"
)
_PAD_IF_FITS = (
    "                        # Pad only when there is room for the sampled token(s), and\n"
    "                        # only to a size some step can schedule whole: the long-prefill\n"
    "                        # threshold would cut the padding, and a size over the most a\n"
    "                        # step can give one request would hold it back for ever.\n"
    "                        if (\n"
    "                            num_computed_tokens\n"
    "                            + padded_num_tokens\n"
    "                            + self.num_sampled_tokens_per_step\n"
    "                            <= self.max_model_len\n"
    "                            and not 0 < long_prefill_token_threshold < padded_num_tokens\n"
    "                            and padded_num_tokens\n"
    "                            <= min(\n"
    "                                self.max_num_scheduled_tokens,\n"
    "                                self.scheduler_config.max_num_batched_tokens - draft_slots,\n"
    "                            )\n"
    "                        ):\n"
)

SPEC_PAD_FIX = EngineFix(
    SPEC_PAD,
    ((MODULE, _PAD_IF, _PAD_IF_FITS),),
    ((MODULE, "Scheduler.schedule"),),
    "with speculative decoding, pad a new decode request to 1 + k tokens only when a step can "
    "schedule that whole (a smaller long-prefill threshold crashes schedule(), a smaller "
    "budget never admits it)",
)
SPEC_PAD_SCHEDULE = ScheduleFix(SPEC_PAD_FIX)
SPEC_PAD_FIXES = SPEC_PAD_SCHEDULE.fix_set
#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_spec_pad_fix: ApplyFix = SPEC_PAD_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = SPEC_PAD_SCHEDULE.as_diff


__all__ = [
    "SPEC_PAD",
    "SPEC_PAD_FIX",
    "SPEC_PAD_FIXES",
    "SPEC_PAD_SCHEDULE",
    "FixDoesNotApply",
    "apply_spec_pad_fix",
    "fix_as_diff",
]
