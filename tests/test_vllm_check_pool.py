"""`pool_accounting` of a vLLM scheduler (`integrations.vllm.core_loop.check_pool`) without
vLLM: the scheduler is a stand-in with the fields the check reads. The check decides the
common case in bulk and names the offending block by a walk; each way a pool can be wrong is
caught, with the walk's message, and a consistent pool passes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from integrations.vllm.core_loop import EngineCoreViolation, check_pool


def _block(block_id: int, ref_cnt: int = 0) -> Any:
    return SimpleNamespace(
        block_id=block_id,
        ref_cnt=ref_cnt,
        is_null=block_id == 0,
        next_free_block=None,
        prev_free_block=None,
    )


def _queue(free: list[Any]) -> Any:
    """vLLM's free queue over `free`: a doubly linked list between a fake head and tail, with
    its count (what `integrations.vllm.free_queue` walks)."""
    head, tail = _block(-1), _block(-2)
    last = head
    for block in free:
        last.next_free_block, block.prev_free_block = block, last
        last = block
    last.next_free_block, tail.prev_free_block = tail, last
    return SimpleNamespace(
        fake_free_list_head=head, fake_free_list_tail=tail, num_free_blocks=len(free)
    )


def _sched(
    groups: list[dict[str, list[int]]],
    free: list[int],
    ref_cnt: dict[int, int] | None = None,
    deferred: list[tuple[int, list[int]]] | None = None,
) -> Any:
    """A scheduler whose KV cache groups hold `groups` (request -> block ids, 0 the null
    block), whose free queue holds `free` (and the null block, which the check skips)."""
    ref_cnt = ref_cnt or {}
    blocks = [_block(b, ref_cnt.get(b, 0)) for b in range(16)]
    queue = _queue([blocks[0], *(blocks[b] for b in free)])
    managers = [
        SimpleNamespace(req_to_blocks={r: [blocks[b] for b in t] for r, t in g.items()})
        for g in groups
    ]
    sched = SimpleNamespace(
        kv_cache_manager=SimpleNamespace(
            block_pool=SimpleNamespace(blocks=blocks, free_block_queue=queue),
            coordinator=SimpleNamespace(single_type_managers=managers),
        )
    )
    if deferred is not None:
        sched.deferred_frees = [(fence, [blocks[b] for b in bs]) for fence, bs in deferred]
    return sched


def test_a_consistent_pool_passes_with_and_without_prefix_caching() -> None:
    check_pool(_sched([{"a": [1, 2], "b": [3]}], free=[4, 5]), False, "here")
    shared = _sched([{"a": [1, 2], "b": [1, 3]}], free=[4], ref_cnt={1: 2, 2: 1, 3: 1})
    check_pool(shared, True, "here")
    # a sliding window's null block is held by many and is never free
    check_pool(_sched([{"a": [1]}, {"a": [0, 2], "b": [0, 3]}], free=[4]), False, "here")


@pytest.mark.parametrize(
    ("sched", "prefix_caching", "message"),
    [
        (_sched([{"a": [1, 2]}], free=[2, 4]), False, "here: block 2 is free and held by ['a']"),
        (
            _sched([{"a": [1]}, {"b": [5, 1]}], free=[4]),
            False,
            "here: block 1 is held by ['a (group 0)', 'b (group 1)'] (no prefix caching)",
        ),
        (
            _sched([{"a": [1, 3], "b": [1]}], free=[4], ref_cnt={1: 1, 3: 1}),
            True,
            "here: block 1 has reference count 1 but 2 holders ['a', 'b']",
        ),
        (
            _sched([{"a": [1]}], free=[4], deferred=[(7, [1])]),
            False,
            "here: block 1 is held by ['a', 'a free deferred to step 7'] (no prefix caching)",
        ),
    ],
    ids=["free-and-held", "two-holders", "reference-count", "deferred-free"],
)
def test_each_inconsistency_is_caught_and_named(
    sched: Any, prefix_caching: bool, message: str
) -> None:
    with pytest.raises(EngineCoreViolation) as caught:
        check_pool(sched, prefix_caching, "here")
    assert caught.value.rule == "pool_accounting"
    assert str(caught.value).endswith(message), str(caught.value)


def test_a_deferred_free_counts_as_a_holder() -> None:
    """A block whose free waits for a step in flight is held by that free: not free, and with
    prefix caching its reference counts it."""
    check_pool(_sched([{"a": [1]}], free=[4], deferred=[(3, [2])]), False, "here")
    with pytest.raises(EngineCoreViolation, match="block 2 is free and held"):
        check_pool(_sched([{"a": [1]}], free=[2], deferred=[(3, [2])]), False, "here")


def test_a_free_queue_a_double_free_broke_is_named_not_walked_forever() -> None:
    """A block on the free queue twice (linked back into itself): `pool_accounting` names it
    where vLLM's own `get_all_free_blocks` would loop."""
    sched = _sched([{"a": [1]}], free=[4, 5])
    five = sched.kv_cache_manager.block_pool.blocks[5]
    five.next_free_block = sched.kv_cache_manager.block_pool.blocks[4]
    with pytest.raises(EngineCoreViolation, match=r"here: vLLM's free block queue lists block 4"):
        check_pool(sched, False, "here")
