"""Reading vLLM's free block queue without trusting it to be well formed.

vLLM keeps its free blocks in a doubly linked list (`FreeKVCacheBlockQueue`) and its own reader,
`get_all_free_blocks`, walks it until the fake tail. A block freed twice breaks the list: put
back while it is already on it, its links and `num_free_blocks` disagree (the blocks after it
are cut out, or its back link points at itself), and later removals through the broken links
can close a cycle, which that walk follows forever (a check that reads the pool then hangs
instead of failing). `free_blocks` walks the list at most once around the pool and raises
`FreeQueueCorrupt` naming what it found.
"""

from __future__ import annotations

from typing import Any


class FreeQueueCorrupt(RuntimeError):
    """vLLM's free block queue is not a list of distinct blocks ending at its tail, or does not
    hold as many blocks as its `num_free_blocks` says: a block was freed twice."""


def free_blocks(pool: Any) -> list[Any]:
    """The blocks on `pool`'s free queue (a vLLM `BlockPool`), in queue order, the null block
    included when it is there; `FreeQueueCorrupt` when the queue repeats a block, does not end
    within the pool's size, or links another number of blocks than `num_free_blocks`."""
    queue = pool.free_block_queue
    limit = len(pool.blocks)
    found: list[Any] = []
    seen: set[int] = set()
    block = queue.fake_free_list_head.next_free_block
    while block is not None and block is not queue.fake_free_list_tail:
        if block.block_id in seen:
            raise FreeQueueCorrupt(
                f"vLLM's free block queue lists block {block.block_id} twice (after "
                f"{len(found)} blocks; it cycles): a block freed twice"
            )
        if len(found) >= limit:
            break
        seen.add(block.block_id)
        found.append(block)
        block = block.next_free_block
    if block is None:
        raise FreeQueueCorrupt(
            f"vLLM's free block queue ends without its tail after {len(found)} blocks"
        )
    if len(found) != queue.num_free_blocks:
        raise FreeQueueCorrupt(
            f"vLLM's free block queue links {len(found)} blocks but its num_free_blocks says "
            f"{queue.num_free_blocks}: a block freed twice cut the list"
        )
    return found


def free_block_ids(pool: Any) -> frozenset[int]:
    """The ids of `free_blocks(pool)`, the null block left out."""
    return frozenset(b.block_id for b in free_blocks(pool) if not b.is_null)
