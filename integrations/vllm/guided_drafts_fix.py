"""A candidate fix for a finding in vLLM 0.34.0's structured output with speculative decoding
under asynchronous scheduling (docs/engines/vllm-0.34.md, "vLLM 0.34.0").

The finding: under async scheduling the scheduler holds placeholder drafts (-1) for a request
(`AsyncScheduler._update_after_schedule`); the V2 model runner keeps the real drafts and
verifies those. A batch whose structured-output request has an output in flight defers its
sampling (`pending_structured_output_tokens`), and the engine core replaces the placeholders
with the runner's drafts before it computes the grammar bitmask
(`update_draft_token_ids_in_output`). A guided request with nothing in flight (its last output
already applied: after a step that did not schedule it) does not defer, so the bitmask is made
from the placeholders: its row for the first placeholder holds the grammar's state, and every
row after it allows every token (`StructuredOutputManager.grammar_bitmask`: "padding or grammar
invalid"). The runner verifies its real first draft under the first row; when the draft is
accepted, the next token is sampled under a row that allows everything, so a guided request can
emit a token its grammar forbids. vLLM 0.33.0 guarded exactly this: its scheduler sent
`num_acceptable_drafts` and its runner invalidated drafts verified against a permissive row
(`grammar_invalid_drafts`); 0.34.0 removed both.

The fix: schedule no drafts for a structured-output request whose drafts are placeholders while
nothing of it is in flight (one statement in `Scheduler.schedule`'s running loop, before the
request's tokens are counted). Its bitmask then has one row, the grammar's, and the runner
verifies nothing under a row it cannot trust; the step loses that request's speculation. (The
other choice, deferring such a batch's sampling so the engine core fetches the runner's drafts,
cannot work: deferral waits for a batch in flight, and here there may be none.) It does not
address drafts handed back for the wrong batch under pipeline parallelism (vLLM issue #54437);
the keyed hand-off of PR #56802 does. Synchronously a structured request's drafts are never
placeholders (`trim_spec_tokens` strips them), so the synchronous scheduler is unchanged.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

NO_PLACEHOLDER_DRAFTS = "no-placeholder-drafts"

_NEW_TOKENS = (
    "            num_new_tokens = (\n"
    "                request.num_tokens_with_spec\n"
    "                + request.num_output_placeholders\n"
    "                - request.num_computed_tokens\n"
    "            )\n"
)
_DROP_THEN_NEW_TOKENS = (
    "            if (\n"
    "                request.use_structured_output\n"
    "                and request.num_output_placeholders == 0\n"
    "                and -1 in request.spec_token_ids\n"
    "            ):\n"
    "                # Placeholders for drafts the model runner holds, and no output in\n"
    "                # flight to defer sampling for: the bitmask would be made from the\n"
    "                # placeholders, its rows after the first allowing every token.\n"
    "                # Verify no drafts in this step.\n"
    "                request.spec_token_ids = []\n" + _NEW_TOKENS
)

GUIDED_DRAFTS_FIX = EngineFix(
    NO_PLACEHOLDER_DRAFTS,
    ((MODULE, _NEW_TOKENS, _DROP_THEN_NEW_TOKENS),),
    ((MODULE, "Scheduler.schedule"),),
    "a guided request's drafts verified under rows made from placeholders, the rows after the "
    "first allowing every token: schedule no drafts for it while nothing of it is in flight",
)
GUIDED_DRAFTS_SCHEDULE = ScheduleFix(GUIDED_DRAFTS_FIX, engine="vLLM 0.34.0")
GUIDED_DRAFTS_FIXES = GUIDED_DRAFTS_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_guided_drafts_fix: ApplyFix = GUIDED_DRAFTS_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = GUIDED_DRAFTS_SCHEDULE.as_diff

__all__ = [
    "GUIDED_DRAFTS_FIX",
    "GUIDED_DRAFTS_FIXES",
    "GUIDED_DRAFTS_SCHEDULE",
    "NO_PLACEHOLDER_DRAFTS",
    "FixDoesNotApply",
    "apply_guided_drafts_fix",
    "fix_as_diff",
]
