"""Candidate fixes for two findings in vLLM 0.33.0's own KV offloading connector on a hybrid KV
cache with a sliding-window group (docs/engines/vllm-kv.md, "Hybrid KV caches").

1. `forget-stale-window` ("a cache reset re-stores window blocks the window freed"). The
   connector keeps each request's block ids per group (`RequestGroupState.block_ids`). A
   sliding window frees the blocks that leave it, and the scheduler may give them to another
   request or group; the connector zeroes such stale ids, but only at positions it has not
   stored yet (from `next_stored_chunk_idx` on). A cache reset
   (`reset_prefix_cache(reset_connector=True)`, `_reset_cache`) sets every running request's
   `next_stored_chunk_idx` back to 0 so that it re-offloads from chunk 0, and the store then
   reads blocks that now hold other KV, under this request's keys. The fix: the reset also
   zeroes, in each sliding-window group, the ids of the positions already stored (their
   blocks may be stale), so that the re-offload skips them as it skips any block that left
   the window.
2. `whole-window-chunks` ("a window chunk stored in part is hit whole"). With CPU chunks of
   several blocks, a sliding-window chunk may be stored in part: the store copies its blocks
   that are not the null block, whether they left the window or the store mask
   (`_reachable_store_block_mask`) did not ask for them, under the key of the whole chunk. A
   later hit ending at that chunk (a request whose shorter prompt shares it) reads the
   window's blocks before it, the missing part included: the load fills them from the part of
   the chunk the store left out, and the request reads it. Where the null block is in the
   middle of the chunk (the connector zeroes a window block id only when the pool reallocates
   the block), vLLM's worker, filling the chunk's slots one after the other, stores the blocks
   after it one slot early. The fix: a sliding-window chunk holding the null block is not
   stored (as one with a null block the mask asks for already is not).

Each is an edit of vLLM's own `offloading/scheduler.py`: `scripts/engine_fixes_diff.py
vllm-offloading` prints them as a patch (with `no-pointless-hit`, `OFFLOADING_FIXES`), and
`apply_forget_stale_window` / `apply_whole_window_chunks` give one built scheduler's connector
the edited method. `FixDoesNotApply` if vLLM's file no longer has the statements the fixes edit,
or the scheduler serves another connector.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from typing import Any

from integrations.patches import EngineFix, FixSet
from integrations.vllm.adapter import load_vllm
from integrations.vllm.offload_error_store_fix import (
    STORE_COMPUTED_ON_ERROR,
    STORE_COMPUTED_ON_ERROR_FIX,
)
from integrations.vllm.offload_events_fix import (
    ANNOUNCE_CPU_RESET,
    ANNOUNCE_CPU_RESET_FIX,
    MANAGER_MODULE,
    check_cpu_manager,
    start_announcing,
)
from integrations.vllm.offload_hit_fix import (
    MODULE,
    OFFLOAD_HIT_FIX,
    give_methods,
    offloading_connector,
)
from integrations.vllm.offload_restore_fix import (
    COUNT_RECORDED_STORES,
    COUNT_RECORDED_STORES_FIX,
    EVENTS_MODULE,
    events_tracker,
    start_counting,
)

FORGET_STALE_WINDOW = "forget-stale-window"
WHOLE_WINDOW_CHUNKS = "whole-window-chunks"
_RESET = "OffloadingConnectorScheduler._reset_cache"
_STORE = "OffloadingConnectorScheduler._build_store_jobs"

#: Where `_reset_cache` sends every running request back to chunk 0.
_REOFFLOAD = (
    "        for status in self._req_status.values():\n"
    "            for group_state in status.group_states:\n"
    "                group_state.next_stored_chunk_idx = 0\n"
)
_REOFFLOAD_FORGETTING = (
    "        for status in self._req_status.values():\n"
    "            for grp_idx in self._sliding_window_groups:\n"
    "                # Ids below the store frontier were never checked for staleness: the\n"
    "                # window may have freed and reallocated their blocks. Skip them.\n"
    "                group_state = status.group_states[grp_idx]\n"
    "                stored = group_state.next_stored_chunk_idx * self.config.blocks_per_chunk\n"
    "                for j in range(min(stored, len(group_state.block_ids))):\n"
    "                    group_state.block_ids[j] = 0\n" + _REOFFLOAD.split("\n", 1)[1]
)
#: Where `_build_store_jobs` skips a chunk the store would leave in part.
_SKIPPED_IF_REACHABLE = (
    "                    # A reachable null block would leave part of the chunk unwritten.\n"
    "                    chunk_start = abs_chunk_idx * blocks_per_chunk\n"
    "                    if any(\n"
    "                        group_state.block_ids[chunk_start + b] == 0\n"
    "                        and (\n"
    "                            block_mask is None\n"
)
_SKIPPED_IF_WINDOW = (
    "                    # A reachable null block would leave part of the chunk unwritten;\n"
    "                    # so would any in a sliding-window chunk, which a hit ending at it\n"
    "                    # (a shorter prompt sharing it) reads whole; and one in its middle\n"
    "                    # would shift the blocks after it by a slot.\n"
    "                    chunk_start = abs_chunk_idx * blocks_per_chunk\n"
    "                    window = group_config.sliding_window_size_in_chunks is not None\n"
    "                    if any(\n"
    "                        group_state.block_ids[chunk_start + b] == 0\n"
    "                        and (\n"
    "                            window\n"
    "                            or block_mask is None\n"
)

FORGET_STALE_WINDOW_FIX = EngineFix(
    FORGET_STALE_WINDOW,
    ((MODULE, _REOFFLOAD, _REOFFLOAD_FORGETTING),),
    ((MODULE, _RESET),),
    "a cache reset re-offloads running requests from chunk 0 over sliding-window block ids "
    "the window freed and the pool reallocated: zero the ids already stored",
)
WHOLE_WINDOW_CHUNKS_FIX = EngineFix(
    WHOLE_WINDOW_CHUNKS,
    ((MODULE, _SKIPPED_IF_REACHABLE, _SKIPPED_IF_WINDOW),),
    ((MODULE, _STORE),),
    "a sliding-window chunk stored in part (null blocks left out) is keyed, and hit, as a "
    "whole, and the load reads the part left out: store no window chunk holding a null block",
)
#: vLLM's offloading connector's candidate fixes (this module's, `no-pointless-hit`,
#: `store-computed-on-error`, `announce-cpu-reset` in its CPU manager and
#: `count-recorded-stores` in its event tracker).
OFFLOADING_FIXES = FixSet(
    engine="vLLM 0.33.0",
    modules=(MODULE, MANAGER_MODULE, EVENTS_MODULE),
    fixes=(
        OFFLOAD_HIT_FIX,
        FORGET_STALE_WINDOW_FIX,
        WHOLE_WINDOW_CHUNKS_FIX,
        ANNOUNCE_CPU_RESET_FIX,
        COUNT_RECORDED_STORES_FIX,
        STORE_COMPUTED_ON_ERROR_FIX,
    ),
    exclusive=(),
    load=load_vllm,
    importing=contextlib.nullcontext,
)


@functools.cache
def _fixed_methods(names: tuple[str, ...]) -> dict[tuple[str, str], Any]:
    return OFFLOADING_FIXES.fixed_methods(names)


def apply_offloading_fixes(sched: Any, names: Iterable[str]) -> None:
    """The named fixes of `OFFLOADING_FIXES` on the offloading connector of `sched` (a built
    scheduler serving vLLM's `OffloadingConnector`), their edits made together, so that two
    fixes of one method (`forget-stale-window` and `announce-cpu-reset` both edit
    `_reset_cache`) compose: its scheduler side, its CPU manager and its event tracker each get
    the edited methods through a subclass of their class. `FixDoesNotApply` for a scheduler
    without that connector (or, for `announce-cpu-reset`, without its CPU manager)."""
    chosen = tuple(sorted(set(names)))
    if not chosen:
        return
    verb = "edits" if len(chosen) == 1 else "edit"
    connector = offloading_connector(sched, f"{', '.join(chosen)} {verb}")
    if ANNOUNCE_CPU_RESET in chosen:
        check_cpu_manager(connector)
    methods = _fixed_methods(chosen)
    holders = (
        (MODULE, connector),
        (MANAGER_MODULE, connector.manager),
        (EVENTS_MODULE, events_tracker(connector)),
    )
    for module, holder in holders:
        own = {m.split(".", 1)[1]: f for (where, m), f in methods.items() if where == module}
        if own:
            give_methods(holder, own)
    if ANNOUNCE_CPU_RESET in chosen:
        start_announcing(connector)
    if COUNT_RECORDED_STORES in chosen:
        start_counting(events_tracker(connector))


def apply_forget_stale_window(sched: Any) -> None:
    """`forget-stale-window` on the offloading connector of `sched` (a built scheduler serving
    vLLM's `OffloadingConnector`); `FixDoesNotApply` for another."""
    apply_offloading_fixes(sched, [FORGET_STALE_WINDOW])


def apply_store_computed_on_error(sched: Any) -> None:
    """`store-computed-on-error` on the offloading connector of `sched`; `FixDoesNotApply` for
    a scheduler without it."""
    apply_offloading_fixes(sched, [STORE_COMPUTED_ON_ERROR])


def apply_whole_window_chunks(sched: Any) -> None:
    """`whole-window-chunks` on the offloading connector of `sched`; `FixDoesNotApply` for a
    scheduler without it."""
    apply_offloading_fixes(sched, [WHOLE_WINDOW_CHUNKS])


__all__ = [
    "FORGET_STALE_WINDOW",
    "FORGET_STALE_WINDOW_FIX",
    "OFFLOADING_FIXES",
    "WHOLE_WINDOW_CHUNKS",
    "WHOLE_WINDOW_CHUNKS_FIX",
    "apply_forget_stale_window",
    "apply_offloading_fixes",
    "apply_store_computed_on_error",
    "apply_whole_window_chunks",
]
