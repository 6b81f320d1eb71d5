"""`integrations.vllm.free_queue.free_blocks` on a vLLM-shaped free queue (plain objects with the
fields vLLM's `FreeKVCacheBlockQueue` and `KVCacheBlock` have): a well-formed queue is read in
order, and a queue a double free broke raises `FreeQueueCorrupt` saying how, where vLLM's own
walk (`get_all_free_blocks`) loops forever on a cycle. Needs no vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from integrations.vllm.free_queue import FreeQueueCorrupt, free_block_ids, free_blocks


@dataclass(eq=False)
class Block:
    block_id: int
    is_null: bool = False
    next_free_block: Block | None = None
    prev_free_block: Block | None = None


@dataclass
class Queue:
    fake_free_list_head: Block
    fake_free_list_tail: Block
    num_free_blocks: int


@dataclass
class Pool:
    blocks: list[Block]
    free_block_queue: Queue = field(init=False)


def pool_of(n: int, free: list[int]) -> Pool:
    """A pool of `n` blocks (block 0 the null block, off the queue) whose queue links `free`."""
    pool = Pool([Block(i, is_null=i == 0) for i in range(n)])
    head, tail = Block(-1), Block(-2)
    last = head
    for i in free:
        block = pool.blocks[i]
        last.next_free_block, block.prev_free_block = block, last
        last = block
    last.next_free_block, tail.prev_free_block = tail, last
    pool.free_block_queue = Queue(head, tail, len(free))
    return pool


def test_a_well_formed_queue_is_read_in_order() -> None:
    pool = pool_of(5, [3, 1, 4, 2])
    assert [b.block_id for b in free_blocks(pool)] == [3, 1, 4, 2]
    assert free_block_ids(pool) == {1, 2, 3, 4}
    assert free_blocks(pool_of(3, [])) == []


def test_a_cycle_names_the_repeated_block() -> None:
    pool = pool_of(5, [3, 1, 4])
    pool.blocks[4].next_free_block = pool.blocks[1]  # 3 -> 1 -> 4 -> 1 -> ...
    with pytest.raises(FreeQueueCorrupt, match="lists block 1 twice"):
        free_blocks(pool)


def test_links_and_count_that_disagree_are_named() -> None:
    pool = pool_of(5, [3, 1, 4])
    pool.free_block_queue.num_free_blocks = 4  # a block put back twice: counted, not linked
    with pytest.raises(FreeQueueCorrupt, match="links 3 blocks but its num_free_blocks says 4"):
        free_blocks(pool)


def test_a_queue_without_its_tail_is_named() -> None:
    pool = pool_of(5, [3, 1])
    pool.blocks[1].next_free_block = None
    with pytest.raises(FreeQueueCorrupt, match="ends without its tail after 2 blocks"):
        free_blocks(pool)
