"""The reference dLLM scheduler with a prefix cache (`DllmConfig.prefix_cache`), as SGLang's
radix cache keeps committed blocks for later requests. Plain Python, obviously correct.

`CachingKvPool` is the paged pool plus the cache, one page per block (the reference caches
whole pages: `page_size == block_size`, as SGLang's dLLM path has):
- `cache(request, block, key)`: right after a commit the block's slots leave the request and
  are cached under `key` (the request's tokens through the block's end), and the request reads
  them (`KvCached`). A block whose key is cached already is a duplicate: the request reads the
  cached copy and frees its own (`CacheHit`, then `KvFreed`), as SGLang's insert does;
- `hit(request, block, key)`: a new request reads a cached block as its next prompt block
  (`CacheHit`);
- `release(request)`: it stops reading every block it reads (`CacheReleased`);
- an allocation that finds no free page evicts the least recently used cached block no request
  reads (`CacheEvicted`).

`CachingReferenceScheduler` admits as the reference does, with each request's worst-case pages
reserved as if it hit nothing: a request's own and read blocks together never exceed its
reservation, so the pages the running requests use fit the pool, and an allocation that finds
no free page always finds an unread cached block to evict. At admission it reads the longest
run of cached whole prompt blocks; under PREFILL_FIRST its first computed block after such
hits runs in that round's prefill batch (the spec's `prefill_first` counts it as prefill, as
SGLang classifies an incoming request before its match).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference.dllm import ReferenceDllmScheduler, _Req, replaying_twin
from reference.kv_pool import PagedKvPool, PoolExhausted, SlotOwner
from reference.oracle import DenoiseOracle
from spec.adapter import EventSink
from spec.config import DllmConfig
from spec.errors import ConfigError
from spec.events import CacheEvicted, CacheHit, CacheReleased, KvCached
from spec.implementation import DllmImplementation
from spec.profile import DllmConfigSpace, DllmPolicy, DllmProfile
from spec.snapshot import Snapshot


@dataclass(slots=True)
class CachedPage:
    """A cached block, one page: its slots, who reads it, and when it was last read or cached
    (the spec's own view of a cached block is `spec.state.CachedBlock`)."""

    slots: tuple[int, ...]
    readers: set[SlotOwner] = field(default_factory=set)
    last_used: int = 0


class CachingKvPool(PagedKvPool):
    """The paged pool with a prefix cache of whole blocks (module docstring)."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        super().__init__(config, sink)
        self.cached: dict[tuple[int, ...], CachedPage] = {}  # key -> block
        self.cached_slots: set[int] = set()
        self.reads: dict[str, dict[int, tuple[int, ...]]] = {}  # request -> block -> key
        self._clock = 0  # counts cache uses, for least-recently-used eviction

    def free_slots(self) -> frozenset[int]:
        """The slots no block owns and the cache does not hold."""
        return super().free_slots() - frozenset(self.cached_slots)

    def cache(self, request_id: str, block_index: int, key: tuple[int, ...]) -> None:
        """The request's committed block `block_index` enters the cache under `key` (or, a
        duplicate, is swapped for the cached copy); the request reads it either way."""
        own = tuple(self.slots_of_block(request_id, block_index))
        block = self.cached.get(key)
        if block is not None:  # the tree holds it already: read that copy, free our own
            self._read(request_id, block_index, key, block)
            self.free(request_id, own)
            return
        for slot in own:
            self.owner[slot] = None
            self.cached_slots.add(slot)
        self._forget_freed({(request_id, block_index)})
        self.cached[key] = CachedPage(own)
        self.sink(KvCached(request_id, block_index, own))
        self._read(request_id, block_index, key, self.cached[key], announce=False)

    def hit(self, request_id: str, block_index: int, key: tuple[int, ...]) -> bool:
        """Read the cached block under `key` as the request's block `block_index`, if any."""
        block = self.cached.get(key)
        if block is None:
            return False
        self._read(request_id, block_index, key, block)
        return True

    def _read(
        self,
        request_id: str,
        block_index: int,
        key: tuple[int, ...],
        block: CachedPage,
        *,
        announce: bool = True,
    ) -> None:
        block.readers.add((request_id, block_index))
        self._clock += 1
        block.last_used = self._clock
        self.reads.setdefault(request_id, {})[block_index] = key
        if announce:
            self.sink(CacheHit(request_id, block_index, block.slots))

    def release(self, request_id: str) -> None:
        """The request stops reading every cached block it reads (`CacheReleased`)."""
        for block_index, key in sorted(self.reads.pop(request_id, {}).items()):
            block = self.cached[key]
            block.readers.discard((request_id, block_index))
            self.sink(CacheReleased(request_id, block_index, block.slots))

    def allocate_block(self, request_id: str, block_index: int) -> tuple[int, ...]:
        """As the paged pool's, after evicting an unread cached block if no page is free."""
        if not self.free_pages:
            self._evict_one()
        return super().allocate_block(request_id, block_index)

    def _evict_one(self) -> None:
        self._evict(self._victim())

    def _victim(self) -> tuple[int, ...]:
        """The key of the least recently used cached block no request reads."""
        unread = [(b.last_used, key) for key, b in self.cached.items() if not b.readers]
        if not unread:
            raise PoolExhausted("no free page and every cached block is read")
        return min(unread)[1]

    def _evict(self, key: tuple[int, ...]) -> None:
        """Drop the cached block under `key`; its page is free again (`CacheEvicted`)."""
        block = self.cached.pop(key)
        for slot in block.slots:
            self.cached_slots.discard(slot)
        self.page_freed(block.slots[0] // self.config.page_size)
        self.sink(CacheEvicted(block.slots))


class CachingReferenceScheduler(ReferenceDllmScheduler):
    """The reference scheduler with the prefix cache of `CachingKvPool` (module docstring)."""

    def __init__(
        self,
        config: DllmConfig,
        sink: EventSink,
        oracle: DenoiseOracle | None = None,
        *,
        policy: DllmPolicy | None = None,
    ) -> None:
        if not config.prefix_cache:
            raise ConfigError(
                "prefix_cache", False, "True for the caching reference (else use the reference)"
            )
        if config.page_size != config.block_size:
            raise ConfigError(
                "page_size",
                config.page_size,
                f"equal to block_size={config.block_size}: the caching reference caches whole "
                f"pages, one block each (as SGLang's dLLM path)",
            )
        super().__init__(config, sink, oracle, policy=policy)
        self.kv: CachingKvPool = CachingKvPool(config, sink)
        self._hit_round: dict[str, int] = {}  # request -> the round of its admission hits

    def snapshot(self) -> Snapshot:
        """The reference's snapshot, with the cache's slots."""
        snap = super().snapshot()
        return Snapshot(
            snap.free_slots,
            snap.slot_owners,
            snap.rows,
            snap.running,
            snap.carrying,
            cached_slots=frozenset(self.kv.cached_slots),
        )

    def _key(self, tokens: list[int] | tuple[int, ...], block_index: int) -> tuple[int, ...]:
        """The cache key of block `block_index` of a request with these tokens: every token
        from position 0 through the block's end (its KV depends on all of them)."""
        return tuple(tokens[: (block_index + 1) * self.config.block_size])

    def _admit_one(self, req: _Req) -> None:
        """Admit, then read the longest run of cached whole prompt blocks."""
        super()._admit_one(req)
        b, prompt = self.config.block_size, req.spec.prompt
        while (req.committed_blocks + 1) * b <= len(prompt):
            k = req.committed_blocks
            if not self.kv.hit(req.rid, k, self._key(prompt, k)):
                break
            req.committed.extend(prompt[k * b : (k + 1) * b])
            req.committed_blocks += 1
            self._hit_round[req.rid] = self.round_index

    def _prefill_rows(self) -> list[_Req]:
        """As the reference's, with the first block after this round's hits (prefill too)."""
        hit_now = [
            r
            for r in self.running
            if r.row is not None and self._hit_round.get(r.rid) == self.round_index
        ]
        return [r for r in super()._prefill_rows() if r not in hit_now] + hit_now

    def _commit(self, req: _Req) -> None:
        """Commit, then cache the block (or read the cached copy of it)."""
        super()._commit(req)
        k = req.committed_blocks - 1
        self.kv.cache(req.rid, k, self._key(req.committed, k))

    def _release(self, req: _Req) -> None:
        """Stop reading the cache, then the reference's release of slots, row and pages."""
        self.kv.release(req.rid)
        self._hit_round.pop(req.rid, None)
        super()._release(req)


def make_caching_scheduler(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """Factory for `schedspec verify --impl reference-dllm-cached`: the caching reference, or
    for a configuration without the cache the reference (the parity check runs each request
    alone under `DllmConfig.solo_sync`, which has none)."""
    if config.prefix_cache:
        return CachingReferenceScheduler(config, sink)
    return ReferenceDllmScheduler(config, sink)


CACHED_PROFILE = DllmProfile(
    space=DllmConfigSpace(page_multiples=frozenset({1}), prefix_cache=frozenset({True})),
    ignore_eos=True,
    stop_token_ids=True,
)
"""Whole pages of one block each, always with the cache (the strategies then draw prompts that
share stems: `properties.conformance.conformance_machine`)."""

#: The caching reference's decision twin (`verify --impl engine-cached --twin
#: reference-dllm-cached`): it replays a run's step outcomes, so only decisions can differ.
CACHED_TWIN = replaying_twin(CachingReferenceScheduler)

REFERENCE_DLLM_CACHED = DllmImplementation(
    make_caching_scheduler,
    CACHED_PROFILE,
    "the reference with a prefix cache (SGLang's radix cache: blocks cached, read, evicted)",
)

__all__ = [
    "CACHED_PROFILE",
    "CACHED_TWIN",
    "REFERENCE_DLLM_CACHED",
    "CachedPage",
    "CachingKvPool",
    "CachingReferenceScheduler",
    "make_caching_scheduler",
]
