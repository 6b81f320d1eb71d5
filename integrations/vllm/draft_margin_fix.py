"""A candidate fix for a minor finding in vLLM 0.33.0's KV connector path with speculative
decoding: the draft-block margin an asynchronous load is admitted with.

The finding (docs/engines/vllm-kv.md, "with drafts, a load that fills the pool is never admitted"):
with drafts, `Scheduler.schedule` admits an asynchronous KV load only if its blocks and one
decode step's draft blocks (`_spec_decode_step_blocks`, `cdiv(1 + k + lookahead, block
size)` per attention group) fit in the free pool less the other loads' reservations. That
margin is the same for every request, whatever the request can still need: a request whose
step after the load samples its last token never decodes with drafts, and no request holds
slots past `max_model_len`. In a pool that holds the request whole and no more, the load is
never admitted, nor anything queued behind it: the engine spins for ever.

The fix caps the margin, per attention group, at the blocks the request's first decode step
after the load can need beyond the loaded tokens: its tokens so far (prompt, and output when
it resumes), the token that step computes and one step's drafts and lookahead, as far as vLLM
lets them reach (`schedule()` keeps a step's inputs below `max_model_len`, `allocate_slots`
its lookahead slots within it); nothing past its tokens when the step that ends its prefill
samples its last output token.
It only lowers the margin where the request cannot use it. It is an edit of vLLM's own
`vllm/v1/core/sched/scheduler.py` (`DRAFT_MARGIN_FIXES`): `fix_as_diff()` prints it as a
patch, and `apply_draft_margin_fix(sched)` gives one built scheduler the edited methods.
`FixDoesNotApply` if vLLM's file no longer has a statement the fix edits.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

DRAFT_MARGIN = "cap-draft-margin"

#: The reservation an asynchronous load is admitted beside.
_RESERVED = (
    "                    reserved_blocks = (\n"
    "                        self._inflight_prefill_reserved_blocks()\n"
    "                        + self._spec_decode_step_blocks\n"
    "                    )\n"
)
_RESERVED_CAPPED = (
    "                    reserved_blocks = (\n"
    "                        self._inflight_prefill_reserved_blocks()\n"
    "                        + self._spec_decode_margin_blocks(request, num_computed_tokens)\n"
    "                    )\n"
)

#: A method added before `_inflight_prefill_reserved_blocks`.
_RESERVED_DEF = "    def _inflight_prefill_reserved_blocks(self) -> int:\n"
_MARGIN_AND_RESERVED_DEF = (
    "    def _spec_decode_margin_blocks(\n"
    "        self, request: Request, num_computed_tokens: int\n"
    "    ) -> int:\n"
    '        """One decode step\'s draft blocks (`_spec_decode_step_blocks`), capped per\n'
    "        group at what `request`'s first decode step after its first\n"
    "        `num_computed_tokens` tokens can need: its tokens so far, the one that step\n"
    "        computes, its drafts and lookahead, as far as schedule() and allocate_slots\n"
    "        let them reach toward `max_model_len`; only its tokens so far when the step\n"
    "        that ends its prefill samples its last output token.\n"
    '        """\n'
    "        num_step_tokens = 1 + self.num_spec_tokens + self.num_lookahead_tokens\n"
    "        num_needed_tokens = request.num_tokens\n"
    "        if request.num_output_tokens + 1 < request.max_tokens:\n"
    "            # A decode step follows. schedule() stops its inputs short of\n"
    "            # max_model_len; allocate_slots caps its lookahead slots there.\n"
    "            num_needed_tokens = min(\n"
    "                min(\n"
    "                    request.num_tokens + 1 + self.num_spec_tokens,\n"
    "                    self.max_model_len - self.num_sampled_tokens_per_step,\n"
    "                )\n"
    "                + self.num_lookahead_tokens,\n"
    "                self.max_model_len,\n"
    "            )\n"
    "        return sum(\n"
    "            min(\n"
    "                cdiv(num_step_tokens, manager.block_size),\n"
    "                max(\n"
    "                    0,\n"
    "                    cdiv(num_needed_tokens, manager.block_size)\n"
    "                    - cdiv(num_computed_tokens, manager.block_size),\n"
    "                ),\n"
    "            )\n"
    "            for manager in self.kv_cache_manager.coordinator.single_type_managers\n"
    "            if not isinstance(manager.kv_cache_spec, MambaSpec)\n"
    "        )\n"
    "\n"
) + _RESERVED_DEF

DRAFT_MARGIN_FIX = EngineFix(
    DRAFT_MARGIN,
    (
        (MODULE, _RESERVED, _RESERVED_CAPPED),
        (MODULE, _RESERVED_DEF, _MARGIN_AND_RESERVED_DEF),
    ),
    (
        (MODULE, "Scheduler.schedule"),
        (MODULE, "Scheduler._spec_decode_margin_blocks"),
    ),
    "with speculative decoding, an asynchronous KV load is admitted beside a draft-block margin "
    "capped at what the request's first decode step can need (none if it samples its last "
    "token first, never past max_model_len): a load that fills the pool was never admitted",
)
DRAFT_MARGIN_SCHEDULE = ScheduleFix(DRAFT_MARGIN_FIX)
DRAFT_MARGIN_FIXES = DRAFT_MARGIN_SCHEDULE.fix_set
#: Give one built `Scheduler` or `AsyncScheduler` the fixed methods (`ScheduleFix.apply`).
apply_draft_margin_fix: ApplyFix = DRAFT_MARGIN_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = DRAFT_MARGIN_SCHEDULE.as_diff


__all__ = [
    "DRAFT_MARGIN",
    "DRAFT_MARGIN_FIX",
    "DRAFT_MARGIN_FIXES",
    "DRAFT_MARGIN_SCHEDULE",
    "FixDoesNotApply",
    "apply_draft_margin_fix",
    "fix_as_diff",
]
