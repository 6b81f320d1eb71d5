"""A candidate fix for a finding in vLLM's admission on a hybrid cache (a sliding-window group
beside full attention): a sliding window's admission cap counts the null blocks of the table as
blocks the request holds, so a reservation can fall short of what the request's next step takes.

The finding (docs/engines/vllm-kv.md, "A KV connector on a hybrid cache"): for recycling specs
(sliding window, chunked local attention) `SingleTypeKVCacheManager.get_num_blocks_to_allocate` caps
the blocks a request needs at `max_admission_blocks_per_request`, "so per-request peak real-held
blocks <= this cap" (its comment; drift "would re-introduce the deadlock from issue #39734").
It then subtracts the length of the request's table, whose first entries are the null block
wherever the window has left them. The cap is in blocks held, the subtraction in table slots:
once blocks have left the window the capped count falls short by those slots. Admission and a
parked KV load's reservation (`Scheduler._request_remaining_blocks`) use the capped count; the
step's own allocation does not. A request whose KV a connector loaded can then head the queue
of requests holding KV with fewer free blocks than its next step takes, while the loaded
requests behind it, which need nothing more, hold the rest of the pool: vLLM's waiting loop
stops at the head, and nothing runs again (`progress`).

The fix: the cap bounds the blocks held, so it is raised by the window's null slots below the
request's computed tokens (`get_num_skipped_tokens(total_computed_tokens) // block_size`, the
slots `remove_skipped_blocks` empties before the step allocates). It is an edit of vLLM's own
`vllm/v1/core/single_type_kv_cache_manager.py` (`WINDOW_CAP_FIXES`, `fix_as_diff()`);
`apply_window_cap_fix(sched)` gives each capped manager of one built scheduler (its sliding
window groups) the edited method through a subclass of its class. The same text in vLLM 0.33.0
and 0.34.0.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from integrations.patches import EngineFix, FixDoesNotApply, FixSet
from integrations.vllm.adapter import load_vllm
from integrations.vllm.offload_hit_fix import give_methods

MODULE = "vllm.v1.core.single_type_kv_cache_manager"
WINDOW_CAP = "cap-blocks-held"
_METHOD = "SingleTypeKVCacheManager.get_num_blocks_to_allocate"

#: The cap, compared with the table's length below it.
_CAP = (
    "            num_required_blocks = min(\n"
    "                num_required_blocks, self.max_admission_blocks_per_request\n"
    "            )\n"
)
_CAP_HELD = (
    "            # The cap bounds the blocks held; the table's slots below the window\n"
    "            # hold the null block, and the count below subtracts every slot.\n"
    "            num_required_blocks = min(\n"
    "                num_required_blocks,\n"
    "                self.max_admission_blocks_per_request\n"
    "                + self.get_num_skipped_tokens(total_computed_tokens) // self.block_size,\n"
    "            )\n"
)

WINDOW_CAP_FIX = EngineFix(
    WINDOW_CAP,
    ((MODULE, _CAP, _CAP_HELD),),
    ((MODULE, _METHOD),),
    "a sliding window's admission cap counts the table's null slots as held blocks, so a "
    "loaded request's reservation falls short of its next step and the requests holding KV "
    "deadlock: cap the blocks held",
)
WINDOW_CAP_FIXES = FixSet(
    engine="vLLM 0.33.0",
    modules=(MODULE,),
    fixes=(WINDOW_CAP_FIX,),
    exclusive=(),
    load=load_vllm,
    importing=contextlib.nullcontext,
)


@functools.cache
def _fixed_count() -> Any:
    return WINDOW_CAP_FIXES.fixed_methods((WINDOW_CAP,))[(MODULE, _METHOD)]


def fix_as_diff() -> str:
    """The fix as a unified diff of the installed vLLM's `single_type_kv_cache_manager.py`
    (paths as `git apply -p1` in a vLLM checkout wants), made from that file when called."""
    return WINDOW_CAP_FIXES.as_diff((WINDOW_CAP,))


def apply_window_cap_fix(sched: Any) -> None:
    """Give every KV cache group manager of `sched` (a built vLLM scheduler) that caps its
    admission (a sliding window's) the fixed `get_num_blocks_to_allocate`; `FixDoesNotApply`
    where none does (no sliding-window group: nothing for the fix to edit)."""
    capped = [
        m
        for m in sched.kv_cache_manager.coordinator.single_type_managers
        if getattr(m, "max_admission_blocks_per_request", None) is not None
    ]
    if not capped:
        raise FixDoesNotApply(
            f"{WINDOW_CAP} edits the admission cap of a sliding-window group's manager, and "
            "this scheduler's KV cache has no such group (serve a hybrid cache: "
            "sliding_window=W)"
        )
    for manager in capped:
        give_methods(manager, {"get_num_blocks_to_allocate": _fixed_count()})


__all__ = [
    "WINDOW_CAP",
    "WINDOW_CAP_FIX",
    "WINDOW_CAP_FIXES",
    "FixDoesNotApply",
    "apply_window_cap_fix",
    "fix_as_diff",
]
