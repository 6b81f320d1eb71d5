"""The engine's paged KV allocator: which pool slot holds which (request, block).

The KV pool (`gpu.kv_cache.PagedKvCache`) is `num_pages * page_size` slots. This allocator owns
the bookkeeping over those slots:

- `owner_req` / `owner_block`: int32 tensors with one entry per slot: the owning request's
  handle and block index, or -1 when the slot is free. `snapshot()` of the engine reads these
  tensors, so a slot the allocator forgets to release shows up as owned even when the event log
  says it was freed.
- a min-heap of wholly free pages and a per-page count of used slots.
- the admission reservation: pages promised to admitted requests (their worst case), so a block
  allocation of an admitted request can never fail and the pool never deadlocks.

The page rule (SGLang forces page_size to be a multiple of block_size, the spec checks it): a
block whose first position is at page offset 0 takes the lowest wholly free page; any other block
continues the page of the request's previous block, right after its last slot. So every block is
contiguous and lies whole inside one page, and pages are never shared between requests.

Every allocation and free is reported through the sink as `KvAllocated` / `KvFreed` at the
moment it changes the tensors.

With a prefix cache (`gpu.prefix_cache`) a block can leave its request for the cache
(`to_cache`): its slots are then marked `CACHED` in both owner tensors, neither free nor owned,
and its page stays used until the cache evicts it (`evict_cached`). The cache reports those
changes itself (`KvCached`, `CacheEvicted`).
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from spec.adapter import EventSink
from spec.errors import ConfigError, SchedSpecError
from spec.events import KvAllocated, KvFreed

FREE = -1
CACHED = -2  # held by the prefix cache: neither free nor owned by a request


class AllocatorError(SchedSpecError, RuntimeError):
    """An allocation or free the engine's own reservation rules should have made impossible
    (an engine bug, never a user error): the allocator refuses instead of corrupting state."""


class PagedKvAllocator:
    """Paged slot allocator with per-slot owner tensors (CPU int32)."""

    def __init__(self, num_pages: int, page_size: int, block_size: int, sink: EventSink) -> None:
        if block_size < 1 or page_size < 1 or num_pages < 1 or page_size % block_size:
            raise ConfigError(
                "page_size",
                page_size,
                f"a positive multiple of block_size={block_size} with num_pages >= 1",
            )
        self.num_pages = num_pages
        self.page_size = page_size
        self.block_size = block_size
        self.num_slots: int = num_pages * page_size
        self.sink = sink
        self.owner_req: torch.Tensor = torch.full((self.num_slots,), FREE, dtype=torch.int32)
        self.owner_block: torch.Tensor = torch.full((self.num_slots,), FREE, dtype=torch.int32)
        # numpy views sharing the tensors' memory: the hot paths index through them (a CPU
        # tensor op costs microseconds, a numpy one a fraction), the tensors stay the state.
        self._req = self.owner_req.numpy()
        self._blk = self.owner_block.numpy()
        self._free_pages: list[int] = list(range(num_pages))  # a heap (sorted is a heap)
        self._page_used: list[int] = [0] * num_pages
        self._names: dict[int, str] = {}
        self._next_handle = 0
        self.reserved_pages: int = 0
        # The handle `free_all` last emptied, while nothing was allocated to it since: its
        # `unregister` needs no scan of the owner tensor.
        self._emptied: int | None = None

    # ------------------------------------------------------------------ owners
    def register(self, request_id: str) -> int:
        """A handle for `request_id` (stored in the owner tensor instead of the string)."""
        handle = self._next_handle
        self._next_handle += 1
        self._names[handle] = request_id
        return handle

    def unregister(self, handle: int) -> None:
        """Forget a handle whose request ended. If it still owns slots (an engine bug) its name
        is kept, so the snapshot shows the leak under the right request id."""
        emptied = handle == self._emptied
        if emptied:
            self._emptied = None
        if emptied or not (self._req == handle).any():
            self._names.pop(handle, None)

    def live_handles(self) -> int:
        """How many handles are registered (requests not yet ended, plus any leaking ones)."""
        return len(self._names)

    def name(self, handle: int) -> str:
        """The request id of a handle (a placeholder for a handle already forgotten)."""
        return self._names.get(handle, f"<released handle {handle}>")

    # ------------------------------------------------------------------ reservation
    def can_reserve(self, pages: int) -> bool:
        """Whether `pages` more pages fit in the reservation (at most `num_pages` in all)."""
        return self.reserved_pages + pages <= self.num_pages

    def reserve(self, pages: int) -> None:
        """Promise `pages` pages to an admitted request; AllocatorError when they do not fit."""
        if not self.can_reserve(pages):
            raise AllocatorError(
                f"reserving {pages} pages over {self.reserved_pages}/{self.num_pages} reserved"
            )
        self.reserved_pages += pages

    def unreserve(self, pages: int) -> None:
        """Return `pages` reserved pages; AllocatorError when fewer are reserved."""
        if pages > self.reserved_pages:
            raise AllocatorError(f"unreserving {pages} pages, only {self.reserved_pages} reserved")
        self.reserved_pages -= pages

    # ------------------------------------------------------------------ allocation
    def allocate_block(self, handle: int, block_index: int, prev_last_slot: int | None) -> int:
        """Slots for block `block_index` of `handle`; returns the first slot (the block holds
        `block_size` contiguous slots from there) and emits `KvAllocated`.

        `prev_last_slot` is the last slot of the request's previous block (read from the
        request-to-token table); it is needed when this block does not start a page.
        """
        b, p = self.block_size, self.page_size
        if handle == self._emptied:
            self._emptied = None
        offset = (block_index * b) % p
        if offset == 0:
            if not self._free_pages:
                raise AllocatorError(
                    f"no free page for block {block_index} of {self._names.get(handle)!r}"
                )
            page = heapq.heappop(self._free_pages)
            start = page * p
        else:
            if prev_last_slot is None or prev_last_slot % p != offset - 1:
                raise AllocatorError(
                    f"block {block_index} continues a page but the previous block ends at "
                    f"slot {prev_last_slot}"
                )
            if self._req[prev_last_slot] != handle or self._blk[prev_last_slot] != block_index - 1:
                raise AllocatorError(
                    f"slot {prev_last_slot} does not hold block {block_index - 1} of handle "
                    f"{handle}"
                )
            start = prev_last_slot + 1
            page = start // p
        # tolist + count: plain Python on b ints (a numpy reduction costs more right after a
        # forward has evicted numpy's dispatch paths from the caches)
        if self._req[start : start + b].tolist().count(FREE) != b:
            raise AllocatorError(f"slots {start}..{start + b - 1} are not free")
        self._req[start : start + b] = handle
        self._blk[start : start + b] = block_index
        self._page_used[page] += b
        self.sink(KvAllocated(self._names[handle], block_index, tuple(range(start, start + b))))
        return start

    # ------------------------------------------------------------------ free
    def free_blocks(self, handle: int, first_slots: list[int]) -> None:
        """Free whole blocks of `handle` given their first slots; one `KvFreed` event."""
        b = self.block_size
        slots: list[int] = []
        for first in first_slots:
            if first % b:
                raise AllocatorError(f"slot {first} does not start a block (block size {b})")
            slots.extend(range(first, first + b))
        self._free(handle, slots)

    def free_block(self, handle: int, first_slot: int) -> None:
        """Free one whole block of `handle` given its first slot; one `KvFreed` event. (The
        FDFO carry path frees one block per row per round: no index arrays, no sort.)"""
        b = self.block_size
        end = first_slot + b
        if first_slot % b:
            raise AllocatorError(f"slot {first_slot} does not start a block (block size {b})")
        owned = self._req[first_slot:end]
        if first_slot < 0 or owned.tolist().count(handle) != b:
            raise AllocatorError(
                f"free of slots {first_slot}..{end - 1} not owned by "
                f"{self._names.get(handle)!r} (or freed twice)"
            )
        owned[:] = FREE
        self._blk[first_slot:end] = FREE
        page = first_slot // self.page_size  # a block lies whole inside one page
        self._page_used[page] -= b
        if self._page_used[page] == 0:
            heapq.heappush(self._free_pages, page)
        self.sink(KvFreed(self._names[handle], tuple(range(first_slot, end))))

    def free_all(self, handle: int) -> None:
        """Free every slot the owner tensor records for `handle` (its committed blocks and any
        retained in-progress block); one `KvFreed` event, none when it owns nothing."""
        slots = np.flatnonzero(self._req == handle)  # ascending, distinct, all owned
        self._emptied = handle
        if not len(slots):
            return
        self._req[slots] = FREE
        self._blk[slots] = FREE
        freed = slots.tolist()
        p, used = self.page_size, self._page_used
        for slot in freed:
            used[slot // p] -= 1
        for page in {slot // p for slot in freed}:
            if used[page] == 0:
                heapq.heappush(self._free_pages, page)
        self.sink(KvFreed(self._names[handle], tuple(freed)))

    def _free(self, handle: int, slots: list[int]) -> None:
        if not slots:
            return
        idx = np.asarray(slots, dtype=np.int64)
        if (
            int(idx.min()) < 0
            or int(idx.max()) >= self.num_slots
            or (self._req[idx] != handle).any()
            or len(set(slots)) != len(slots)
        ):
            raise AllocatorError(
                f"free of slots not owned by {self._names.get(handle)!r} (or freed twice)"
            )
        self._req[idx] = FREE
        self._blk[idx] = FREE
        p = self.page_size
        for s in slots:
            page = s // p
            self._page_used[page] -= 1
            if self._page_used[page] == 0:
                heapq.heappush(self._free_pages, page)
        self.sink(KvFreed(self._names[handle], tuple(sorted(slots))))

    # ------------------------------------------------------------------ prefix cache
    def to_cache(self, handle: int, first_slot: int) -> None:
        """One whole block of `handle`, given its first slot, leaves it for the prefix cache:
        its slots become `CACHED` and its page stays used. No event (the cache reports
        `KvCached`)."""
        end = self._owned_block(handle, first_slot)
        self._req[first_slot:end] = CACHED
        self._blk[first_slot:end] = CACHED

    def evict_cached(self, first_slot: int) -> None:
        """A cached block, given its first slot, leaves the cache: its slots are free, and so
        is its page once nothing else uses it. No event (the cache reports `CacheEvicted`)."""
        b = self.block_size
        end = first_slot + b
        if first_slot % b or self._req[first_slot:end].tolist().count(CACHED) != b:
            raise AllocatorError(f"slots {first_slot}..{end - 1} are not one cached block")
        self._req[first_slot:end] = FREE
        self._blk[first_slot:end] = FREE
        page = first_slot // self.page_size
        self._page_used[page] -= b
        if self._page_used[page] == 0:
            heapq.heappush(self._free_pages, page)

    def cached_slot_set(self) -> frozenset[int]:
        """The slots `owner_req` marks `CACHED` (read from the tensor, for the snapshot)."""
        return frozenset(torch.nonzero(self.owner_req == CACHED).flatten().tolist())

    def _owned_block(self, handle: int, first_slot: int) -> int:
        """The end of the whole block of `handle` starting at `first_slot`; AllocatorError if
        it is not one."""
        b = self.block_size
        end = first_slot + b
        if (
            first_slot < 0
            or first_slot % b
            or self._req[first_slot:end].tolist().count(handle) != b
        ):
            raise AllocatorError(
                f"slots {first_slot}..{end - 1} are not a block of {self._names.get(handle)!r}"
            )
        return end

    # ------------------------------------------------------------------ views
    def free_slot_set(self) -> frozenset[int]:
        """The slots `owner_req` marks free (read from the tensor, for the snapshot)."""
        return frozenset(torch.nonzero(self.owner_req == FREE).flatten().tolist())

    def slot_owners(self) -> dict[int, tuple[str, int]]:
        """Slot -> (request id, block index) for every owned slot, read from the owner tensors
        (a forgotten handle shows as its placeholder name)."""
        used = torch.nonzero(self.owner_req >= 0).flatten()  # not free, not cached
        reqs = self.owner_req[used].tolist()
        blocks = self.owner_block[used].tolist()
        return {
            int(s): (self.name(int(h)), int(k))
            for s, h, k in zip(used.tolist(), reqs, blocks, strict=True)
        }

    def free_pages(self) -> int:
        """How many pages are wholly free (the size of the free-page heap)."""
        return len(self._free_pages)

    def used_slots(self) -> int:
        """How many slots `owner_req` marks owned by a request (cached ones not counted)."""
        return int((self.owner_req >= 0).sum())

    def check_consistency(self) -> None:
        """Raise AllocatorError if the page heap, page counts and owner tensors disagree."""
        p = self.page_size
        used = (self.owner_req != FREE).view(self.num_pages, p).sum(dim=1).tolist()
        if used != self._page_used:
            raise AllocatorError(f"page counts {self._page_used} != owner tensor {used}")
        wholly_free = sorted(i for i, n in enumerate(used) if n == 0)
        if sorted(self._free_pages) != wholly_free:
            raise AllocatorError(f"free pages {sorted(self._free_pages)} != {wholly_free}")
        if bool(((self.owner_req == FREE) != (self.owner_block == FREE)).any()):
            raise AllocatorError("owner request and owner block tensors disagree")
