"""A candidate fix for vLLM 0.33.0's streaming-input sessions with structured output: a later
input's grammar is dropped. Applied to one built scheduler so that the engine-core checks can
validate it.

The finding (docs/engines/vllm-features.md, "Streaming-input sessions"): `EngineCore` compiles the
grammar of every request it is given (`grammar_init`), a session's later input too, but the
scheduler turns that input into a `StreamingUpdate`, which carries its prompt, `max_tokens`, arrival
and sampling params alone. `_update_request_as_session` takes the new sampling params and keeps
the session's `structured_output_request`: the first input's grammar, which has accepted the
whole first turn (the last sampled token too, which the session then discards). Once that
grammar is done vLLM fills no bitmask row for it, so the later turn samples unconstrained, and
its first token is refused by the finished grammar (`accept_tokens`), which ends the session
with an error; a first turn cut by `max_tokens` leaves the grammar mid-way, constraining the
later turn by where the first stopped.

The fix gives each input its own grammar: `add_request` puts the input's compiled
`structured_output_request` on its `StreamingUpdate`, and `_update_request_as_session` installs
it (none if the input asks for none), the session waiting for it as a new request does
(`WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`): the scheduler promotes it once the grammar compiled
and ends it with an error if it did not (waiting only while the grammar still compiles would
schedule a session whose input was applied after its grammar failed with the compile error as
its grammar, and `get_grammar_bitmask` raises); `get_grammar_bitmask` gives
such a session no row, and the draft updates drop its drafts rather than check them (a batch
scheduled for the turn that ended, its output dropped, may be sampled and draft after the
input is applied, and a grammar still compiling can do neither).

It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`SESSION_GRAMMAR_FIXES`):
`fix_as_diff()` prints it as a patch, and `apply_session_grammar_fix(sched)` gives one built
scheduler the edited methods through a subclass of its class. `FixDoesNotApply` if vLLM's
file no longer has the statements the fix edits.

vLLM 0.34.0 has the finding too. Its version of the fix (`EngineFix.releases`) makes the first
five edits alone: 0.34.0 checks a deferred batch's drafts against no grammar, so there is no
check to keep from a grammar still compiling.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_034, ApplyFix, FixDiff, ScheduleFix
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE

SESSION_GRAMMAR = "own-grammar-per-input"

#: `add_request`: a later input of a session becomes a `StreamingUpdate`.
_UPDATE = "            update = StreamingUpdate.from_request(request)\n"
_UPDATE_WITH_ITS_GRAMMAR = (
    "            update = StreamingUpdate.from_request(request)\n"
    "            if update is not None:\n"
    "                # The input's own grammar, compiled for it, goes with it.\n"
    "                update.structured_output_request = request.structured_output_request\n"
)
#: `_update_request_as_session`: the input's sampling params replace the session's.
_TAKE_PARAMS = "        session.sampling_params = update.sampling_params\n"
_TAKE_PARAMS_AND_GRAMMAR = (
    "        session.sampling_params = update.sampling_params\n"
    "        # Each input's own grammar constrains its turn (none if it asks for none).\n"
    "        session.structured_output_request = getattr(\n"
    '            update, "structured_output_request", None\n'
    "        )\n"
)
#: `_update_request_as_session`: the session waits to be scheduled.
_WAITS = "        session.status = RequestStatus.WAITING\n"
_WAITS_FOR_ITS_GRAMMAR = (
    "        session.status = RequestStatus.WAITING\n"
    "        if session.structured_output_request is not None:\n"
    "            # wait for its grammar as a new request does: promoted once it compiled,\n"
    "            # ended with an error if it did not compile\n"
    "            session.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR\n"
)
#: `get_grammar_bitmask`: the structured requests a batch samples, in row order.
_ROWS = "            and (req.use_structured_output and not req.is_prefill_chunk)\n"
_ROWS_BUT_OF_A_GRAMMAR_COMPILING = (
    "            and (req.use_structured_output and not req.is_prefill_chunk)\n"
    "            # A session waiting for its next input's grammar: the batch was\n"
    "            # scheduled for the turn that ended, whose output is dropped.\n"
    "            and req.status != RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR\n"
)
#: `update_draft_token_ids`: a request's new drafts, checked against its grammar.
_DRAFTS = "            # Add newly generated spec token ids to the request.\n"
_DRAFTS_BUT_OF_A_GRAMMAR_COMPILING = (
    "            if request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:\n"
    "                # A session waiting for its next input's grammar: drafts of the\n"
    "                # turn that ended.\n"
    "                request.spec_token_ids = []\n"
    "                continue\n"
    "            # Add newly generated spec token ids to the request.\n"
)
#: `update_draft_token_ids_in_output`: a deferred batch's drafts, checked against the grammar.
_DRAFTS_IN_OUTPUT = (
    "            # Filter out spec tokens which do not adhere to the grammar.\n"
    "            spec_token_ids = self.structured_output_manager.validate_tokens(\n"
    "                request, spec_token_ids\n"
    "            )\n"
)
_DRAFTS_IN_OUTPUT_BUT_OF_A_GRAMMAR_COMPILING = (
    "            # Filter out spec tokens which do not adhere to the grammar (all of a\n"
    "            # session waiting for its next input's grammar: the turn that ended's).\n"
    "            if request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:\n"
    "                spec_token_ids = []\n"
    "            else:\n"
    "                spec_token_ids = self.structured_output_manager.validate_tokens(\n"
    "                    request, spec_token_ids\n"
    "                )\n"
)

_EDITS = (
    (MODULE, _UPDATE, _UPDATE_WITH_ITS_GRAMMAR),
    (MODULE, _TAKE_PARAMS, _TAKE_PARAMS_AND_GRAMMAR),
    (MODULE, _WAITS, _WAITS_FOR_ITS_GRAMMAR),
    (MODULE, _ROWS, _ROWS_BUT_OF_A_GRAMMAR_COMPILING),
    (MODULE, _DRAFTS, _DRAFTS_BUT_OF_A_GRAMMAR_COMPILING),
)
_METHODS = (
    (MODULE, "Scheduler.add_request"),
    (MODULE, "Scheduler._update_request_as_session"),
    (MODULE, "Scheduler.get_grammar_bitmask"),
    (MODULE, "Scheduler.update_draft_token_ids"),
)
_SUMMARY = (
    "a streaming-input session keeps its first input's grammar, done after the first turn, "
    "and drops each later input's: give each input its own grammar"
)

SESSION_GRAMMAR_FIX = EngineFix(
    SESSION_GRAMMAR,
    (*_EDITS, (MODULE, _DRAFTS_IN_OUTPUT, _DRAFTS_IN_OUTPUT_BUT_OF_A_GRAMMAR_COMPILING)),
    (*_METHODS, (MODULE, "Scheduler.update_draft_token_ids_in_output")),
    _SUMMARY,
    # vLLM 0.34.0 checks a deferred batch's drafts against no grammar
    # (`update_draft_token_ids_in_output`: "rejection sampling handles grammar violations"),
    # so there is no check to keep from a grammar still compiling
    releases=(
        (
            SCHEDULER_034,
            EngineFix(SESSION_GRAMMAR, _EDITS, _METHODS, _SUMMARY + " (vLLM 0.34.0: five edits)"),
        ),
    ),
)
SESSION_GRAMMAR_SCHEDULE = ScheduleFix(SESSION_GRAMMAR_FIX)
SESSION_GRAMMAR_FIXES = SESSION_GRAMMAR_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed methods (`ScheduleFix.apply`).
apply_session_grammar_fix: ApplyFix = SESSION_GRAMMAR_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = SESSION_GRAMMAR_SCHEDULE.as_diff

__all__ = [
    "SESSION_GRAMMAR",
    "SESSION_GRAMMAR_FIX",
    "SESSION_GRAMMAR_FIXES",
    "SESSION_GRAMMAR_SCHEDULE",
    "FixDoesNotApply",
    "apply_session_grammar_fix",
    "fix_as_diff",
]
