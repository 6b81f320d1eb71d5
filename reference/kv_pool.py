"""The reference paged KV pool and request pool (plain Python, obviously correct).

KV slots are grouped in pages of `page_size`; a block takes `block_size` contiguous slots at
its position's page offset: a block that starts a page takes the lowest wholly free page, any
other block continues its request's current page. Pages are never shared between requests.
Every allocation and free is reported to the event sink at the moment it happens.
"""

from __future__ import annotations

from spec.adapter import EventSink
from spec.config import DllmConfig
from spec.events import KvAllocated, KvFreed

SlotOwner = tuple[str, int]


class PoolExhausted(RuntimeError):
    """Internal: an allocation found no page. The reference's admission reservation makes this
    unreachable; reaching it is a bug in the reference, never a user error."""


class PagedKvPool:
    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        self.config = config
        self.sink = sink
        self.owner: list[SlotOwner | None] = [None] * config.kv_slots
        self.free_pages: set[int] = set(range(config.kv_pages))

    # --- queries
    def free_slots(self) -> frozenset[int]:
        return frozenset(i for i, o in enumerate(self.owner) if o is None)

    def slot_owners(self) -> dict[int, SlotOwner]:
        return {i: o for i, o in enumerate(self.owner) if o is not None}

    def slots_of(self, request_id: str) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o is not None and o[0] == request_id]

    def slots_of_block(self, request_id: str, block_index: int) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o == (request_id, block_index)]

    # --- allocation
    def allocate_block(self, request_id: str, block_index: int) -> tuple[int, ...]:
        """Slots for block `block_index` of the request, page-aligned; emits KvAllocated."""
        b, p = self.config.block_size, self.config.page_size
        offset = (block_index * b) % p
        if offset == 0:
            if not self.free_pages:
                raise PoolExhausted(f"no free page for block {block_index} of {request_id!r}")
            page = min(self.free_pages)
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
        for s in slots:
            self.owner[s] = (request_id, block_index)
        self.sink(KvAllocated(request_id, block_index, slots))
        return slots

    def free(self, request_id: str, slots: list[int] | tuple[int, ...]) -> None:
        """Return the request's `slots` to the pool; emits KvFreed. Pages wholly free again
        go back to the free-page set."""
        if not slots:
            return
        p = self.config.page_size
        for s in slots:
            self.owner[s] = None
        for page in {s // p for s in slots}:
            if all(o is None for o in self.owner[page * p : page * p + p]):
                self.free_pages.add(page)
        self.sink(KvFreed(request_id, tuple(sorted(slots))))


class RequestPool:
    """Request-pool rows (the request-to-token table's rows)."""

    def __init__(self, rows: int) -> None:
        self.holder: list[str | None] = [None] * rows

    def acquire(self, request_id: str) -> int | None:
        for i, h in enumerate(self.holder):
            if h is None:
                self.holder[i] = request_id
                return i
        return None

    def release(self, row: int) -> None:
        self.holder[row] = None

    def has_free(self) -> bool:
        return any(h is None for h in self.holder)

    def rows(self) -> dict[int, str]:
        return {i: h for i, h in enumerate(self.holder) if h is not None}
