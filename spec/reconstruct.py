"""Event reconstruction: derive pool events from an engine's own pool views.

Real engines emit no events. Their pools, though, can be read at any moment: which KV slot holds
which (request, block), which request-pool row belongs to which request, which requests are in
the running batch. `reconstruct(before, after)` turns two such views into the events that lead
from one to the other, so an adapter for an engine that emits no events is mostly a function
that reads a `PoolView`:

- `KvFreed` (one per request, every slot it lost) and `RowReleased` come first, so a slot or row
  freed and handed to another request within the same interval is freed before it is taken;
- then `Admitted` for every request new to the running batch (in the order of `after.running`,
  which must be admission order), `RowAcquired` for a running request that holds a row again,
  and `KvAllocated` for every (request, block) that gained slots (slots in position order).

With a prefix cache (`DllmConfig.prefix_cache`) a view also says which slots the cache holds
(`cached`) and which (request, block) reads which cached slots (`reads`); the cache's events
join in: `KvCached` (an owned block's slots now cached) and a swap's `CacheHit` (a block it
owned now read from other, cached slots) before the frees, `CacheReleased` with them,
`CacheEvicted` (slots no longer cached) after `RowReleased`, and a new read's `CacheHit` right
before the allocations.

Where to take the views (see docs/spec.md, "Event order within a round"): read one view before
the round's first forward and reconstruct (admissions and allocations), emit `Forward` /
`StepResult` / `BlockCommitted` from the engine's outputs, and reconstruct again just before each
`Finished` / `Aborted` / `ControlReturned` (the frees and releases of the completion phase).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spec.events import (
    Admitted,
    CacheEvicted,
    CacheHit,
    CacheReleased,
    Event,
    KvAllocated,
    KvCached,
    KvFreed,
    RowAcquired,
    RowReleased,
)
from spec.snapshot import SlotOwner, Snapshot


@dataclass(frozen=True, slots=True)
class PoolView:
    """An engine's pools at one moment.

    slots: KV slot -> (request id, block index) for every slot a request owns.
    rows: request-pool row -> request id for every held row.
    running: the running batch, in admission order.
    cached: the slots a prefix cache holds (neither free nor owned).
    reads: (request id, block index) -> the cached slots it reads that block from (position
        order).
    """

    slots: Mapping[int, SlotOwner] = field(default_factory=dict)
    rows: Mapping[int, str] = field(default_factory=dict)
    running: tuple[str, ...] = ()
    cached: frozenset[int] = frozenset()
    reads: Mapping[SlotOwner, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snap: Snapshot, running_order: Sequence[str] = ()) -> PoolView:
        """A view of a `Snapshot`; `running_order` orders the running set (admission order),
        otherwise it is sorted by id."""
        order = [r for r in running_order if r in snap.running]
        order += sorted(r for r in snap.running if r not in order)
        return cls(dict(snap.slot_owners), dict(snap.rows), tuple(order))

    @classmethod
    def from_token_table(
        cls,
        table: Mapping[str, Sequence[int | None]],
        block_size: int,
        rows: Mapping[int, str],
        running: Sequence[str],
        cached: frozenset[int] = frozenset(),
    ) -> PoolView:
        """A view from a request-to-token table (SGLang's `req_to_token`, vLLM's block table
        expanded to slots): `table[request][position]` is the KV slot of that token position,
        or None where none is held. Position p belongs to block p // block_size. A slot in
        `cached` (the prefix cache's) is read, not owned."""
        slots: dict[int, SlotOwner] = {}
        reads: dict[SlotOwner, list[int]] = {}
        for rid, positions in table.items():
            for pos, slot in enumerate(positions):
                if slot is None:
                    continue
                if slot in cached:
                    reads.setdefault((rid, pos // block_size), []).append(slot)
                else:
                    slots[slot] = (rid, pos // block_size)
        frozen_reads = {owner: tuple(read) for owner, read in reads.items()}
        return cls(slots, dict(rows), tuple(running), cached, frozen_reads)


def without_reserved(view: PoolView, slots: int = 0, rows: int = 0) -> PoolView:
    """The view in spec ids for an engine that keeps the first `slots` KV slots and `rows`
    request-pool rows for itself (`DllmPolicy.reserved_kv_pages` x page_size, `reserved_rows`;
    SGLang: page 0 and row 0 hold padding): spec id = engine id - reserved. A reserved slot or
    row held by a request is a `ValueError` (the engine broke its own reservation)."""
    bad = sorted(s for s in view.slots if s < slots) + sorted(r for r in view.rows if r < rows)
    if bad:
        raise ValueError(f"reserved ids {bad} are held by requests")
    return PoolView(
        {s - slots: owner for s, owner in view.slots.items()},
        {r - rows: rid for r, rid in view.rows.items()},
        view.running,
        frozenset(s - slots for s in view.cached),
        {owner: tuple(s - slots for s in read) for owner, read in view.reads.items()},
    )


def _owned_blocks(view: PoolView) -> dict[SlotOwner, tuple[int, ...]]:
    by: dict[SlotOwner, list[int]] = {}
    for slot, owner in view.slots.items():
        by.setdefault(owner, []).append(slot)
    return {owner: tuple(sorted(slots)) for owner, slots in by.items()}


def release_events(before: PoolView, after: PoolView) -> list[Event]:
    """`KvCached` for owned blocks now cached and `CacheHit` for owned blocks now read from
    other cached slots (a swap); `KvFreed` per request for the slots it no longer owns (nor
    cached); `CacheReleased` for reads dropped; `RowReleased`; `CacheEvicted` for slots no
    longer cached."""
    events: list[Event] = []
    read_before = dict(before.reads)
    lost: dict[str, list[int]] = {}
    gone = {
        owner: slots
        for owner, slots in _owned_blocks(before).items()
        if after.slots.get(slots[0]) != owner  # blocks are owned and freed whole
    }
    # Every block cached in the interval first: another request's duplicate insert may swap
    # onto one of them, whatever the order the view lists the owners in.
    for owner, slots in gone.items():
        if after.cached.issuperset(slots):
            events.append(KvCached(owner[0], owner[1], slots))
            read_before[owner] = slots  # it reads what it cached
    for owner, slots in gone.items():
        if after.cached.issuperset(slots):
            continue
        swapped = after.reads.get(owner)
        if swapped is not None and read_before.get(owner) != swapped:
            events.append(CacheHit(owner[0], owner[1], swapped))
            read_before[owner] = swapped
        lost.setdefault(owner[0], []).extend(slots)
    events += [KvFreed(rid, tuple(sorted(s))) for rid, s in lost.items()]
    holders = set(after.rows.values())
    for owner, read in sorted(read_before.items()):
        if after.reads.get(owner) == read:
            continue
        if owner not in after.reads and owner[0] in holders and not after.cached.issuperset(read):
            continue  # it keeps its row but the block left the cache: evicted under it (below)
        events.append(CacheReleased(owner[0], owner[1], read))
    after_row = {rid: row for row, rid in after.rows.items()}
    for row, rid in before.rows.items():
        if after_row.get(rid) != row:
            events.append(RowReleased(rid, row))
    evicted = before.cached - after.cached
    if evicted:
        events.append(CacheEvicted(tuple(sorted(evicted))))
    return events


def acquire_events(before: PoolView, after: PoolView) -> list[Event]:
    """`Admitted` for requests new to the running batch, `RowAcquired` for running requests
    that hold a row again, `CacheHit` for each block newly read from the prefix cache (in
    block order), then `KvAllocated` per (request, block) that gained slots."""
    row_of = {rid: row for row, rid in after.rows.items()}
    had_row = {rid: row for row, rid in before.rows.items()}
    was_running = set(before.running)
    events: list[Event] = []
    for rid in after.running:
        if rid not in was_running and rid in row_of:
            events.append(Admitted(rid, row_of[rid]))
    for rid in after.running:
        if rid in was_running and rid in row_of and had_row.get(rid) != row_of[rid]:
            events.append(RowAcquired(rid, row_of[rid]))
    rank = {rid: i for i, rid in enumerate(after.running)}
    owned_before = _owned_blocks(before)
    new_reads = [
        owner
        for owner, read in after.reads.items()
        if before.reads.get(owner) != read
        and owner not in owned_before  # a swap or a block it cached: `release_events`
    ]
    for owner in sorted(new_reads, key=lambda o: (rank.get(o[0], len(rank)), o[0], o[1])):
        events.append(CacheHit(owner[0], owner[1], after.reads[owner]))
    gained: dict[SlotOwner, list[int]] = {}
    for slot, owner in after.slots.items():
        if before.slots.get(slot) != owner:
            gained.setdefault(owner, []).append(slot)
    for owner in sorted(gained, key=lambda o: (rank.get(o[0], len(rank)), o[0], o[1])):
        events.append(KvAllocated(owner[0], owner[1], tuple(sorted(gained[owner]))))
    return events


def reconstruct(before: PoolView, after: PoolView) -> list[Event]:
    """Every pool event from `before` to `after`: releases first, then acquisitions."""
    return release_events(before, after) + acquire_events(before, after)


__all__ = ["PoolView", "acquire_events", "reconstruct", "release_events", "without_reserved"]
