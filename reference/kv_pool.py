"""The reference paged KV pool and request pool (plain Python, obviously correct).

KV slots are grouped in pages of `page_size`; a block takes `block_size` contiguous slots at
its position's page offset: a block that starts a page takes the lowest wholly free page, any
other block continues its request's current page. Pages are never shared between requests.
Every allocation and free is reported to the event sink at the moment it happens.
"""

from __future__ import annotations

import heapq

from spec.adapter import EventSink
from spec.config import DllmConfig
from spec.events import KvAllocated, KvFreed

SlotOwner = tuple[str, int]


class PoolExhausted(RuntimeError):
    """Internal: an allocation found no page. The reference's admission reservation makes this
    unreachable; reaching it is a bug in the reference, never a user error."""


class PagedKvPool:
    """The paged KV slot pool (module docstring): `owner` per slot ((request id, block index) or
    None) and the wholly free pages; allocations and frees are reported to `sink`."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        self.config = config
        self.sink = sink
        self.owner: list[SlotOwner | None] = [None] * config.kv_slots
        self.free_pages: set[int] = set(range(config.kv_pages))
        # Two indexes keep an allocation O(block) instead of O(pool): the simulator serves long
        # prompts on large pools through this class. `owner` and `free_pages` stay the truth.
        # The heap holds every free page, plus stale entries that are skipped when popped.
        self._page_heap: list[int] = list(range(config.kv_pages))
        # Per request, per block: the slot groups given to it (`take`) that still hold a slot
        # of it, so a request's slots are found without scanning the pool.
        self._groups: dict[str, dict[int, list[tuple[int, ...]]]] = {}

    # --- queries
    def free_slots(self) -> frozenset[int]:
        """The slots no block owns."""
        return frozenset(i for i, o in enumerate(self.owner) if o is None)

    def slot_owners(self) -> dict[int, SlotOwner]:
        """Slot -> (request id, block index) of every owned slot."""
        return {i: o for i, o in enumerate(self.owner) if o is not None}

    def slots_of(self, request_id: str) -> list[int]:
        """The request's slots, ascending."""
        blocks = self._groups.get(request_id, {})
        return sorted(s for k in blocks for s in self.slots_of_block(request_id, k))

    def slots_of_block(self, request_id: str, block_index: int) -> list[int]:
        """The block's slots, ascending."""
        key = (request_id, block_index)
        groups = self._groups.get(request_id, {}).get(block_index, ())
        return sorted(s for group in groups for s in group if self.owner[s] == key)

    # --- allocation
    def take(self, request_id: str, block_index: int, slots: tuple[int, ...]) -> None:
        """Record `slots` as the block's (the one place slot owners are set)."""
        key = (request_id, block_index)
        for s in slots:
            self.owner[s] = key
        self._groups.setdefault(request_id, {}).setdefault(block_index, []).append(slots)

    def allocate_block(self, request_id: str, block_index: int) -> tuple[int, ...]:
        """Slots for block `block_index` of the request, page-aligned; emits KvAllocated."""
        b, p = self.config.block_size, self.config.page_size
        offset = (block_index * b) % p
        if offset == 0:
            if not self.free_pages:
                raise PoolExhausted(f"no free page for block {block_index} of {request_id!r}")
            page = heapq.heappop(self._page_heap)
            while page not in self.free_pages:  # a stale entry: allocated since it was pushed
                page = heapq.heappop(self._page_heap)
            self.free_pages.discard(page)
            start = page * p
        else:
            prev = self.slots_of_block(request_id, block_index - 1)
            if not prev:
                raise PoolExhausted(
                    f"block {block_index} of {request_id!r} continues a page its previous block "
                    f"does not hold"
                )
            start = max(prev) + 1
        slots = tuple(range(start, start + b))
        self.take(request_id, block_index, slots)
        self.sink(KvAllocated(request_id, block_index, slots))
        return slots

    def free(self, request_id: str, slots: list[int] | tuple[int, ...]) -> None:
        """Return the request's `slots` to the pool; emits KvFreed. Pages wholly free again
        go back to the free-page set."""
        if not slots:
            return
        p = self.config.page_size
        emptied = {o for o in (self.owner[s] for s in slots) if o is not None}
        for s in slots:
            self.owner[s] = None
        self._forget_freed(emptied)
        for page in {s // p for s in slots}:
            if page not in self.free_pages and all(
                o is None for o in self.owner[page * p : page * p + p]
            ):
                self.page_freed(page)
        self.sink(KvFreed(request_id, tuple(sorted(slots))))

    def page_freed(self, page: int) -> None:
        """`page` is wholly free again: allocations may take it."""
        self.free_pages.add(page)
        heapq.heappush(self._page_heap, page)

    def _forget_freed(self, blocks: set[SlotOwner]) -> None:
        """Drop these blocks' groups that hold no slot of theirs any more (so the index holds
        live blocks only, however many requests the pool has served)."""
        for key in blocks:
            request_id, block_index = key
            of_request = self._groups.get(request_id, {})
            live = [
                g for g in of_request.get(block_index, ()) if any(self.owner[s] == key for s in g)
            ]
            if live:
                of_request[block_index] = live
            else:
                of_request.pop(block_index, None)
                if not of_request:
                    self._groups.pop(request_id, None)


class RequestPool:
    """Request-pool rows (the request-to-token table's rows)."""

    def __init__(self, rows: int) -> None:
        self.holder: list[str | None] = [None] * rows

    def acquire(self, request_id: str) -> int | None:
        """The lowest free row, now held by `request_id`; None when every row is held."""
        for i, h in enumerate(self.holder):
            if h is None:
                self.holder[i] = request_id
                return i
        return None

    def release(self, row: int) -> None:
        """Free `row`, whoever holds it."""
        self.holder[row] = None

    def has_free(self) -> bool:
        """Whether some row is free."""
        return any(h is None for h in self.holder)

    def rows(self) -> dict[int, str]:
        """Row -> request id of every held row."""
        return {i: h for i, h in enumerate(self.holder) if h is not None}
