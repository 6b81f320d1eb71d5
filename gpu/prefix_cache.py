"""The engine's prefix cache: committed blocks kept for later requests with the same prefix.

A committed block's KV depends only on the tokens from position 0 through the block's end
(attention is bidirectional inside a block and causal across blocks), and on CPU a row's
forward is bit-identical at any batch size (`gpu.engine.make_small_engine`), so a request
whose prompt starts with the same whole blocks can read that KV instead of computing it. That
is SGLang's radix cache for dLLMs (PR #18724), one page per block (`page_size ==
block_size`, what the engine asks for when `DllmConfig.prefix_cache` is on).

`BlockCache` keeps the cached blocks by the chained digest of their prefix
(`spec.prefix_cache.chain`) and reports the spec's events itself:

- `insert`, right after a commit: the block leaves its request for the cache (`KvCached`) and
  the request reads it; if the cache holds that prefix already (another request committed the
  same block), the request reads the cached copy and frees its own (`CacheHit`, `KvFreed`), as
  SGLang's insert of a duplicate does;
- `hit`, at admission: a request reads a cached block as its next whole prompt block
  (`CacheHit`), which it then commits without a forward;
- `release`, when the request ends: it stops reading every block it reads (`CacheReleased`);
- `make_room`, before an allocation: with no free page, the least recently used block no
  request reads leaves the cache (`CacheEvicted`).

It is written apart from the caching reference (`reference.prefix_cache`) on purpose: that
reference is the decision twin this cache is checked against (`engine-cached`), so sharing code
with it would let a common mistake pass unseen.

The engine reserves each request's worst-case pages at admission as if nothing hit, and a
request's owned and read blocks together never exceed them; so when a running request needs a
page and none is free, some cached page is unread, and `make_room` always finds one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu.allocator import AllocatorError, PagedKvAllocator
from spec.adapter import EventSink
from spec.events import CacheEvicted, CacheHit, CacheReleased, KvCached


@dataclass(slots=True)
class CachedBlock:
    """A block the cache holds: its first slot, the requests reading it and when it was last
    cached or read (for least-recently-used eviction)."""

    first_slot: int
    readers: set[str] = field(default_factory=set)
    last_used: int = 0


class BlockCache:
    """The prefix cache over the allocator's pages (see the module docstring)."""

    def __init__(self, allocator: PagedKvAllocator, sink: EventSink) -> None:
        if allocator.page_size != allocator.block_size:
            raise AllocatorError("the prefix cache keeps whole pages of one block each")
        self.allocator: PagedKvAllocator = allocator
        self.sink: EventSink = sink
        self.block_size: int = allocator.block_size
        self.blocks: dict[bytes, CachedBlock] = {}  # prefix digest -> cached block
        self.reads: dict[str, dict[int, bytes]] = {}  # request -> block index -> digest
        self.hits: int = 0  # prompt blocks read at admission instead of computed
        self._clock = 0

    def _slots(self, first_slot: int) -> tuple[int, ...]:
        return tuple(range(first_slot, first_slot + self.block_size))

    def _read(self, rid: str, block_index: int, digest: bytes, block: CachedBlock) -> None:
        block.readers.add(rid)
        self._clock += 1
        block.last_used = self._clock
        self.reads.setdefault(rid, {})[block_index] = digest

    def insert(
        self, rid: str, handle: int, block_index: int, first_slot: int, digest: bytes
    ) -> int:
        """Request `rid` (allocator handle `handle`) committed block `block_index`, which it
        owns at `first_slot`, whose prefix has `digest`: cache it, or read the cached copy and
        free its own. Returns the first slot the request now reads the block from."""
        cached = self.blocks.get(digest)
        if cached is not None:  # a duplicate: read the cached copy, free our own
            self._read(rid, block_index, digest, cached)
            self.sink(CacheHit(rid, block_index, self._slots(cached.first_slot)))
            self.allocator.free_block(handle, first_slot)
            return cached.first_slot
        self.allocator.to_cache(handle, first_slot)
        block = CachedBlock(first_slot)
        self.blocks[digest] = block
        self.sink(KvCached(rid, block_index, self._slots(first_slot)))
        self._read(rid, block_index, digest, block)
        return first_slot

    def hit(self, rid: str, block_index: int, digest: bytes) -> int | None:
        """Read the cached block whose prefix has `digest` as block `block_index` of `rid`;
        its first slot, or None when the cache does not hold it."""
        cached = self.blocks.get(digest)
        if cached is None:
            return None
        self._read(rid, block_index, digest, cached)
        self.hits += 1
        self.sink(CacheHit(rid, block_index, self._slots(cached.first_slot)))
        return cached.first_slot

    def release(self, rid: str) -> None:
        """`rid` stops reading every block it reads (one `CacheReleased` each, block order)."""
        for block_index, digest in sorted(self.reads.pop(rid, {}).items()):
            cached = self.blocks[digest]
            cached.readers.discard(rid)
            self.sink(CacheReleased(rid, block_index, self._slots(cached.first_slot)))

    def make_room(self) -> None:
        """With no free page, evict the least recently used block no request reads;
        AllocatorError when every cached block is read (the reservation rules out)."""
        if self.allocator.free_pages():
            return
        unread = [(b.last_used, d) for d, b in self.blocks.items() if not b.readers]
        if not unread:
            raise AllocatorError("no free page and every cached block is read")
        digest = min(unread)[1]
        block = self.blocks.pop(digest)
        self.allocator.evict_cached(block.first_slot)
        self.sink(CacheEvicted(self._slots(block.first_slot)))

    def cached_slots(self) -> frozenset[int]:
        """Every slot the cache holds (from its own table; the snapshot reads the tensors)."""
        return frozenset(s for b in self.blocks.values() for s in self._slots(b.first_slot))
