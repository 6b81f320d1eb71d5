"""A candidate fix for vLLM 0.33.0's streaming-input sessions on hybrid models (a Mamba group)
under asynchronous scheduling: a turn's dropped in-flight step has already advanced the
session's Mamba state. Applied to one built scheduler so that the engine-core checks can
validate it.

The finding (docs/engines/vllm-features.md, "Streaming-input sessions"): when a turn ends, vLLM has
usually scheduled the session's next decode step already (async scheduling runs a step ahead).
`_handle_stopped_request` drops that step's work by moving the session back to its
materialized frontier (`num_computed_tokens` less its output placeholders) and dropping the
step's output as stale. For attention KV that is enough: the step wrote the KV of a position
the next input then writes again. A Mamba state is one block updated in place: the dropped step
has run, the state holds the discarded token too, and the next turn resumes from it as if it
were the state at the frontier (`cache_hit_written`: "holds the state of 'r7' after 3 tokens,
not the state after its first 2 tokens"). The synchronous loop has no step in flight and
passes.

The fix: where a session's turn ends with a step of it in flight and the model has Mamba
layers, the state cannot be rolled back, so the session gives up its KV (its blocks freed,
deferred while the step in flight may write them; nothing computed) and recomputes its tokens
(or hits the prefix cache) when it resumes.

It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`SESSION_STATE_FIXES`):
`fix_as_diff()` prints it as a patch, and `apply_session_state_fix(sched)` gives one built
scheduler the edited `Scheduler._handle_stopped_request` through a subclass of its class.
`FixDoesNotApply` if vLLM's file no longer has the statement the fix edits.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

SESSION_STATE = "recompute-session-state"

#: `_handle_stopped_request`: the move back to the materialized frontier.
_BACK_TO_THE_FRONTIER = (
    "        safe_frontier = request.num_computed_tokens - request.num_output_placeholders\n"
    "        assert safe_frontier >= 0\n"
    "        request.num_computed_tokens = safe_frontier\n"
)
_BACK_TO_THE_FRONTIER_OR_TO_NOTHING = (
    "        safe_frontier = request.num_computed_tokens - request.num_output_placeholders\n"
    "        assert safe_frontier >= 0\n"
    "        request.num_computed_tokens = safe_frontier\n"
    "        if self.has_mamba_layers and request.num_in_flight_tokens > 0:\n"
    "            # A Mamba state is updated in place: the step in flight has already\n"
    "            # advanced it past the frontier. Recompute the session instead.\n"
    "            self._free_request_blocks(request)\n"
    "            request.num_computed_tokens = 0\n"
)

SESSION_STATE_FIX = EngineFix(
    SESSION_STATE,
    ((MODULE, _BACK_TO_THE_FRONTIER, _BACK_TO_THE_FRONTIER_OR_TO_NOTHING),),
    ((MODULE, "Scheduler._handle_stopped_request"),),
    "a streaming-input session's turn ends with a step in flight, which has already advanced "
    "its Mamba state past the frontier the next turn resumes from: with Mamba layers, "
    "recompute the session instead",
)
SESSION_STATE_SCHEDULE = ScheduleFix(SESSION_STATE_FIX)
SESSION_STATE_FIXES = SESSION_STATE_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed method (`ScheduleFix.apply`).
apply_session_state_fix: ApplyFix = SESSION_STATE_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = SESSION_STATE_SCHEDULE.as_diff

__all__ = [
    "SESSION_STATE",
    "SESSION_STATE_FIX",
    "SESSION_STATE_FIXES",
    "SESSION_STATE_SCHEDULE",
    "FixDoesNotApply",
    "apply_session_state_fix",
    "fix_as_diff",
]
