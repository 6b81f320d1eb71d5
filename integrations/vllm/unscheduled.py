"""Which victims vLLM 0.33.0's `schedule()` had scheduled before it preempted them in the same
call (the priority policy picks its victim among all running requests), told from what that
scheduling left in the prefix cache.

`KVCacheManager.allocate_slots` hashes the blocks a request's scheduled tokens fill at once. A
victim taken out of the step after that leaves those hashes on blocks it no longer holds (vLLM
0.33.0 does not drop them: a finding, docs/engines/vllm.md), so the block tables before and after
`schedule()` do not show the scheduling, but the hashes do: a block nobody holds after the
call whose hash changed in it to the victim's own block hash number k (k at or past its first
uncomputed block) was filled by the victim's scheduling. With the candidate fix
(`integrations.vllm.preempted_cache_fix`) no such hash stays, and nothing is reported.

`unscheduled_victims` gives, for each such victim, the blocks that scheduling allocated (those
past its block table before the call, from the first on without a gap) and the fewest tokens
that fill every block found, for `spec.ar.reconstruct.scheduling_events(unscheduled=...)`.
Blocks that scheduling allocated and another request took again in the same call are not
seen; neither are the tokens past the last hashed block. Only attributes of vLLM's objects are
read (`block_pool.blocks[i].block_hash`, `Request.block_hashes`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from spec.ar.reconstruct import ArPoolView


def block_hashes(sched: Any) -> dict[int, bytes]:
    """Block id -> its prefix-cache key (block hash and group id) for every hashed block of a
    vLLM scheduler's pool, the null block left out."""
    pool = sched.kv_cache_manager.block_pool
    return {
        b.block_id: bytes(b.block_hash)
        for b in pool.blocks
        if b.block_hash is not None and not b.is_null
    }


def unscheduled_victims(
    requests: Mapping[str, Any],
    victims: Collection[str],
    before: ArPoolView,
    after: ArPoolView,
    hashes_before: Mapping[int, bytes],
    hashes_after: Mapping[int, bytes],
    block_size: int,
    block_hash_of: Callable[[bytes], bytes],
) -> dict[str, tuple[tuple[int, ...], int]]:
    """Victim id -> (blocks its same-call scheduling allocated, its tokens), for the victims
    whose scheduling left a hash behind. `requests`: vLLM's `scheduler.requests`; `victims`:
    the requests preempted in the call; `block_hash_of`: vLLM's `get_block_hash` (a cache key
    without its group id). A block whose new hash two victims share is attributed to
    neither."""
    held = {b for table in after.block_tables.values() for b in table}
    changed = {
        b: block_hash_of(h)
        for b, h in hashes_after.items()
        if b not in held and hashes_before.get(b) != h
    }
    claims: dict[int, list[tuple[str, int]]] = {}
    for rid in victims:
        first = before.num_computed.get(rid, 0) // block_size
        own = {bytes(h): k for k, h in enumerate(requests[rid].block_hashes) if k >= first}
        for b, h in changed.items():
            if h in own:
                claims.setdefault(b, []).append((rid, own[h]))
    found: dict[str, dict[int, int]] = {}  # victim -> block index -> block
    for b, owners in claims.items():
        if len(owners) == 1:
            rid, k = owners[0]
            found.setdefault(rid, {})[k] = b
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    for rid, by_index in found.items():
        table = before.table(rid)
        last = max((k for k in by_index if k < len(table)), default=-1)
        new: list[int] = []
        k = len(table)
        while k in by_index:
            new.append(by_index[k])
            k += 1
        if new:
            last = len(table) + len(new) - 1
        tokens = (last + 1) * block_size - before.num_computed.get(rid, 0)
        if last >= 0 and tokens > 0:
            out[rid] = (tuple(new), tokens)
    return out


__all__ = ["block_hashes", "unscheduled_victims"]
