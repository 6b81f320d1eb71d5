"""The reference KV pool's indexes (free-page heap, per-block slot groups) agree with its
`owner` table after every operation, and hold nothing once every request is gone."""

from __future__ import annotations

import random

import pytest

from properties.harness import Harness
from reference.dllm import ReferenceDllmScheduler, make_scheduler
from reference.kv_pool import PagedKvPool
from spec import DllmConfig, Mode, RequestSpec


def scan_slots_of(pool: PagedKvPool, request_id: str) -> list[int]:
    return [i for i, o in enumerate(pool.owner) if o is not None and o[0] == request_id]


def scan_slots_of_block(pool: PagedKvPool, request_id: str, block: int) -> list[int]:
    return [i for i, o in enumerate(pool.owner) if o == (request_id, block)]


def check_indexes(pool: PagedKvPool, request_ids: list[str]) -> None:
    for rid in request_ids:
        assert pool.slots_of(rid) == scan_slots_of(pool, rid)
        blocks = {o[1] for o in pool.owner if o is not None and o[0] == rid}
        for k in blocks | {0, 1, 2}:
            assert pool.slots_of_block(rid, k) == scan_slots_of_block(pool, rid, k)
    assert pool.free_pages <= set(pool._page_heap)  # every free page can be popped
    p = pool.config.page_size
    wholly_free = {
        page
        for page in range(pool.config.kv_pages)
        if all(o is None for o in pool.owner[page * p : page * p + p])
    }
    assert pool.free_pages == wholly_free


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("mode", "reuse"), [(Mode.SYNC, False), (Mode.FDFO, False), (Mode.FDFO, True)]
)
def test_indexes_agree_with_the_owner_table(seed: int, mode: Mode, reuse: bool) -> None:
    rng = random.Random(seed)
    config = DllmConfig(
        block_size=2,
        page_size=4,
        kv_pages=12,
        max_context=16,
        max_running_requests=3,
        mode=mode,
        in_place_reuse=reuse,
    )
    h = Harness(make_scheduler, config)
    impl = h.impl
    assert isinstance(impl, ReferenceDllmScheduler)
    ids: list[str] = []
    for step in range(60):
        action = rng.random()
        if action < 0.35:
            rid = f"r{step}"
            prompt = tuple(rng.randrange(16) for _ in range(rng.randint(1, 9)))
            h.submit(RequestSpec(rid, prompt, rng.randint(1, 16 - len(prompt))))
            ids.append(rid)
        elif action < 0.45 and ids:
            h.abort(rng.choice(ids))
        else:
            h.round()
        check_indexes(impl.kv, ids)
    h.drain()
    check_indexes(impl.kv, ids)
    assert impl.kv._groups == {}  # nothing outlives the requests it served
