"""A candidate fix for vLLM 0.33.0's offloading connector beside streaming-input sessions with
structured output: a request ended with an error before it computed its prompt has its
uncomputed blocks stored.

The finding (docs/engines/vllm-features.md, "Streaming-input sessions"): when a request finishes,
the connector's `_build_store_jobs` stores its blocks up to the commit point of a request that
computed its whole prompt (`max(num_prompt_tokens, num_tokens - 1)`) unless it was aborted, in
which case it stores only the tokens it computed. A request can also end with an error before
its prompt is computed: a session whose next input is applied (its tokens added to the prompt)
and whose grammar then fails to compile, once each input has its own grammar
(`own-grammar-per-input`, as vLLM PR #57685 makes it). The connector then stores the block of
the input's tokens, which no batch wrote, under the keys of those tokens (`store_content`),
and a later request with that prompt would load it.

The fix (`store-computed-on-error`): a request that ended with an error is stored as an aborted
one is, up to the tokens it computed. It is an edit of vLLM's own
`vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py` (in `OFFLOADING_FIXES`):
`scripts/engine_fixes_diff.py vllm-offloading --fix store-computed-on-error` prints it, and
`apply_store_computed_on_error(sched)` gives one built scheduler's connector the edited method.
`FixDoesNotApply` if vLLM's file no longer has the statement the fix edits, or the scheduler
serves no offloading connector.

vLLM 0.34.0 fixed it upstream (`fixed_upstream`): a finished request stores at most what it
computed ("A request that finished before its prefill completed (e.g. an error) has computed
only num_computed_tokens of its prompt").
"""

from __future__ import annotations

from integrations.patches import EngineFix
from integrations.vllm.offload_hit_fix import MODULE

STORE_COMPUTED_ON_ERROR = "store-computed-on-error"


def fixed_upstream() -> bool:
    """Whether the installed vLLM's offloading connector already stores at most what a
    finished request computed (0.34.0 clamps its commit point to `num_computed_tokens`), so
    the finding does not reproduce and this fix is not needed."""
    from integrations.vllm.patches import installed_text

    return "has computed only num_computed_tokens of its prompt" in installed_text(MODULE)


#: `_build_store_jobs`: a finished request's tokens to store.
_ABORTED_STORES_COMPUTED = "            if req.status is RequestStatus.FINISHED_ABORTED:\n"
_ABORTED_OR_ERROR_STORES_COMPUTED = (
    "            # An abort, or an error (a session whose next input's grammar failed), may\n"
    "            # end a request before its prompt is computed: store what it computed.\n"
    "            if req.status in (\n"
    "                RequestStatus.FINISHED_ABORTED,\n"
    "                RequestStatus.FINISHED_ERROR,\n"
    "            ):\n"
)

STORE_COMPUTED_ON_ERROR_FIX = EngineFix(
    STORE_COMPUTED_ON_ERROR,
    ((MODULE, _ABORTED_STORES_COMPUTED, _ABORTED_OR_ERROR_STORES_COMPUTED),),
    ((MODULE, "OffloadingConnectorScheduler._build_store_jobs"),),
    "a request ended with an error before it computed its prompt (a session whose next "
    "input's grammar failed) has its uncomputed blocks stored: store what it computed, as for "
    "an abort",
)

__all__ = ["STORE_COMPUTED_ON_ERROR", "STORE_COMPUTED_ON_ERROR_FIX", "fixed_upstream"]
