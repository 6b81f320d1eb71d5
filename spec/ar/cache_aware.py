"""Cache-aware admission order (`ArPolicy.cache_aware_window`, vLLM 0.34's
`cache_aware_admission_window`): which order the waiting queue takes when the window engages.

Facts read in vLLM 0.34.0 (`Scheduler._reorder_waiting_by_cached_prefix`,
`KVCacheManager.get_num_cached_tokens`, `BlockPool.get_usage`), written anew:

- the window engages only when the pool's usage, 1 - free / usable blocks (free cached blocks
  count as free), is at least the threshold;
- within the first `window` waiting requests, only the slots of requests never scheduled take
  part (a preempted request keeps its exact place); those slots are refilled by the same
  requests, deepest cached prefix first, their queue position breaking ties;
- a request's cached prefix is its leading full blocks, of at most its known tokens less one,
  whose content is in the prefix cache (held or free).

The spec machine calls `cache_aware_order` at the moment vLLM does (see `ArPolicy`); the result
replaces the queue's head, so the reordering persists into later steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def pool_usage(free_blocks: int, usable_blocks: int) -> float:
    """The pool's usage as vLLM computes it: 1 - free / usable (0.0 for an empty pool)."""
    if usable_blocks <= 0:
        return 0.0
    return 1.0 - (free_blocks / usable_blocks)


def cache_aware_order(
    queue: Sequence[str],
    window: int,
    fresh: Callable[[str], bool],
    cached_tokens: Callable[[str], int],
) -> list[str]:
    """`queue` with its first `window` entries reordered: the positions held by `fresh`
    requests (never scheduled) are refilled by them in (-cached_tokens, position) order; every
    other entry keeps its position. `cached_tokens` is asked only for fresh requests in the
    window."""
    head = list(queue[:window])
    slots = [i for i, rid in enumerate(head) if fresh(rid)]
    if len(slots) < 2:
        return list(queue)
    depth = {i: cached_tokens(head[i]) for i in slots}
    order = sorted(slots, key=lambda i: (-depth[i], i))
    reordered = list(head)
    for slot, source in zip(slots, order, strict=True):
        reordered[slot] = head[source]
    return reordered + list(queue[window:])


__all__ = ["cache_aware_order", "pool_usage"]
