"""A candidate fix for a finding in vLLM's KV connector path on a hybrid cache (a sliding-window
group beside full attention): a connector hit of a whole request is loaded whole and its last
token then recomputed, reading a window block the allocation had already made null.

The finding (docs/engines/vllm-kv.md, "A KV connector on a hybrid cache"): `Scheduler.schedule`
takes the connector's hit (`get_num_new_matched_tokens`) as it comes. For an asynchronous load
covering every token of the request, `allocate_slots` allocates the sliding-window group for
the hit (`allocate_external_computed_blocks`: the tokens below `hit - window + 1` are skipped,
their blocks null), and once the load is done `_update_waiting_for_remote_kv` sets the computed
tokens back to `num_tokens - 1`, so that the last token is computed and the next sampled. That
token's window starts one token earlier than the hit's next token's: where that token opens a
block (one prompt length in every block size), the window reads it from the null block, whose
KV is no token's (`kv_covers_scheduled`). vLLM's own offloading connector never offers a hit
of the whole prompt, and a synchronous hit must leave a token to compute; a P/D connector
(NIXL loads every prompt token by default) does offer one.

The fix: the scheduler loads at most up to the request's last token (one token less for a hit
of the whole request), as it keeps a local prefix-cache hit (`num_tokens - 1`), so that the
window is allocated for the token the request computes first; the load is asynchronous only if
something is left to load. It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py`
(`WINDOW_HIT_FIXES`, `fix_as_diff()`), given to one built scheduler by `apply_window_hit_fix`;
the same text in vLLM 0.33.0 and 0.34.0.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

WINDOW_HIT = "hit-leaves-last-token"

#: The statement right after the connector's hit is settled in the waiting loop.
_HIT_SETTLED = "                        if hit_diverged and num_external_computed_tokens == 0:\n"
_HIT_LEAVES_LAST_TOKEN = (
    "                        # Leave the last token to compute, as a local hit does: a\n"
    "                        # sliding window allocated for a hit of every token has left\n"
    "                        # the block the recomputed last token's window reads.\n"
    "                        last_token = request.num_tokens - 1 - num_new_local_computed_tokens\n"
    "                        if num_external_computed_tokens > last_token:\n"
    "                            num_external_computed_tokens = max(last_token, 0)\n"
    "                            load_kv_async &= num_external_computed_tokens > 0\n"
    "\n" + _HIT_SETTLED
)

WINDOW_HIT_FIX = EngineFix(
    WINDOW_HIT,
    ((MODULE, _HIT_SETTLED, _HIT_LEAVES_LAST_TOKEN),),
    ((MODULE, "Scheduler.schedule"),),
    "an asynchronous connector hit of a whole request is loaded whole and its last token "
    "recomputed, its sliding window reading a block the allocation made null: load up to the "
    "last token only",
)
WINDOW_HIT_SCHEDULE = ScheduleFix(WINDOW_HIT_FIX)
WINDOW_HIT_FIXES = WINDOW_HIT_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `schedule` (`ScheduleFix.apply`).
apply_window_hit_fix: ApplyFix = WINDOW_HIT_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = WINDOW_HIT_SCHEDULE.as_diff

__all__ = [
    "WINDOW_HIT",
    "WINDOW_HIT_FIX",
    "WINDOW_HIT_FIXES",
    "WINDOW_HIT_SCHEDULE",
    "FixDoesNotApply",
    "apply_window_hit_fix",
    "fix_as_diff",
]
