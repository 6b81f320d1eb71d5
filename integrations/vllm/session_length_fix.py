"""A candidate fix for vLLM 0.33.0's streaming-input sessions growing past `max_model_len`.
Applied to one built scheduler so that the engine-core checks can validate it.

The finding (docs/engines/vllm-features.md, "Streaming-input sessions"): `AsyncLLM` validates each
input of a session on its own (`InputProcessor` refuses a prompt of `max_model_len` tokens or more),
but the scheduler resumes the session with its prompt, its kept outputs and the input together
(`_update_request_as_session`), and nothing bounds that. A session resumed with
`max_model_len` tokens or more is then scheduled past the blocks `allocate_slots` gives it
(capped at `max_model_len`: `kv_covers_scheduled`), or, at exactly `max_model_len`, never
scheduled again (its last prompt token is capped away) and the engine never drains.

The fix ends such a session where its input arrives, as a request that reaches
`max_model_len` ends (`FINISHED_LENGTH_CAPPED`): in `add_request` for a session waiting for
input, and in `_handle_stopped_request` for an input queued while its turn ran (the turn's
output then finishes the request). The input is not applied. (An engine core would also have
to tell the client in the first case, as it does for an error; the scheduler edit is what the
loop can check.)

It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`SESSION_LENGTH_FIXES`):
`fix_as_diff()` prints it as a patch, and `apply_session_length_fix(sched)` gives one built
scheduler the edited methods through a subclass of its class. `FixDoesNotApply` if vLLM's
file no longer has the statements the fix edits.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

SESSION_LENGTH = "end-session-at-model-len"

#: `add_request`: the next input of a session waiting for input is applied at once.
_APPLY_WAITING = (
    "            elif update is not None:\n"
    "                # Commence next input chunk.\n"
    "                self._update_request_as_session(existing, update)\n"
)
_APPLY_WAITING_IF_IT_FITS = (
    "            elif update is not None and (\n"
    "                existing.num_tokens - 1 + len(update.prompt_token_ids or ())\n"
    "                >= self.max_model_len\n"
    "            ):\n"
    "                # The session would leave no room for an output: it ends as a\n"
    "                # request that reaches max_model_len ends.\n"
    "                self.finish_requests(\n"
    "                    request.request_id, RequestStatus.FINISHED_LENGTH_CAPPED\n"
    "                )\n"
    "            elif update is not None:\n"
    "                # Commence next input chunk.\n"
    "                self._update_request_as_session(existing, update)\n"
)
#: `_handle_stopped_request`: an input queued while the turn ran is applied as it ends.
_APPLY_QUEUED = (
    "            if update is None:\n"
    "                # Streaming request finished.\n"
    "                return True\n"
)
_APPLY_QUEUED_IF_IT_FITS = (
    "            if update is None:\n"
    "                # Streaming request finished.\n"
    "                return True\n"
    "            if (\n"
    "                request.num_tokens - 1 + len(update.prompt_token_ids or ())\n"
    "                >= self.max_model_len\n"
    "            ):\n"
    "                # The session would leave no room for an output: it ends here.\n"
    "                return True\n"
)

SESSION_LENGTH_FIX = EngineFix(
    SESSION_LENGTH,
    (
        (MODULE, _APPLY_WAITING, _APPLY_WAITING_IF_IT_FITS),
        (MODULE, _APPLY_QUEUED, _APPLY_QUEUED_IF_IT_FITS),
    ),
    ((MODULE, "Scheduler.add_request"), (MODULE, "Scheduler._handle_stopped_request")),
    "a streaming-input session's inputs are checked against max_model_len one by one, and the "
    "session is resumed past it: end the session (length capped) where its next input would "
    "leave no room for an output",
)
SESSION_LENGTH_SCHEDULE = ScheduleFix(SESSION_LENGTH_FIX)
SESSION_LENGTH_FIXES = SESSION_LENGTH_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed methods (`ScheduleFix.apply`).
apply_session_length_fix: ApplyFix = SESSION_LENGTH_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = SESSION_LENGTH_SCHEDULE.as_diff

__all__ = [
    "SESSION_LENGTH",
    "SESSION_LENGTH_FIX",
    "SESSION_LENGTH_FIXES",
    "SESSION_LENGTH_SCHEDULE",
    "FixDoesNotApply",
    "apply_session_length_fix",
    "fix_as_diff",
]
