"""Named state invariants: predicates over `AbstractState` that must hold after every event.

Each predicate returns None when it holds, or a description of the first counterexample. The
rules that constrain *events* (admission order, forward policy, end-of-round duties) live in
`SpecMachine`; these are the properties of the state itself, the ones the Z3 layer proves
inductive.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from spec.state import (
    ACTIVE_PHASES,
    CARRIED_BLOCK_PHASES,
    TERMINAL_PHASES,
    AbstractState,
    SlotOwner,
)

Invariant = Callable[[AbstractState], str | None]


def no_leak(s: AbstractState) -> str | None:
    """free + owned + cached = total; every owned slot belongs to a live block of an active
    request."""
    total = s.config.kv_slots
    cached = s.cached_slots
    if len(s.free_slots) + len(s.slot_owners) + len(cached) != total:
        return (
            f"free {len(s.free_slots)} + owned {len(s.slot_owners)} + cached {len(cached)} "
            f"!= total {total}"
        )
    for slot, (rid, block) in s.slot_owners.items():
        if not 0 <= slot < total:
            return f"slot {slot} outside the pool"
        r = s.requests.get(rid)
        if r is None:
            return f"slot {slot} owned by unknown request {rid!r}"
        live = block < r.committed_blocks or (r.current is not None and r.current.index == block)
        if not live:
            return f"slot {slot} owned by block {block} of {rid!r}, which is not live"
    return None


def terminal_owns_nothing(s: AbstractState) -> str | None:
    """Finished or aborted requests own no slot, hold no row and read no cached block."""
    owners = {rid for rid, _ in s.slot_owners.values()}
    for rid, r in s.requests.items():
        if r.phase in TERMINAL_PHASES:
            if rid in owners:
                return f"{r.phase.value} request {rid!r} owns KV slots"
            if r.row is not None or rid in s.rows.values():
                return f"{r.phase.value} request {rid!r} holds a row"
            if r.cache_reads or any(reader[0] == rid for c in s.cache for reader in c.readers):
                return f"{r.phase.value} request {rid!r} reads cached blocks"
    return None


def max_running(s: AbstractState) -> str | None:
    """At most `max_running_requests` requests are admitted or running."""
    n = len(s.running)
    if n > s.config.max_running_requests:
        return f"{n} running > max_running_requests={s.config.max_running_requests}"
    return None


def row_exclusive(s: AbstractState) -> str | None:
    """The row table and the requests' rows agree; rows are in range."""
    for row, rid in s.rows.items():
        if not 0 <= row < s.config.req_pool_rows:
            return f"row {row} outside the request pool"
        r = s.requests.get(rid)
        if r is None or r.row != row:
            return f"row {row} is held by {rid!r}, which does not record it"
    for rid, r in s.requests.items():
        if r.row is not None and s.rows.get(r.row) != rid:
            return f"{rid!r} records row {r.row}, which the pool gives to {s.rows.get(r.row)!r}"
    return None


def _blocks(s: AbstractState) -> dict[SlotOwner, list[int]]:
    by: dict[SlotOwner, list[int]] = defaultdict(list)
    for slot, owner in s.slot_owners.items():
        by[owner].append(slot)
    return by


def whole_blocks(s: AbstractState) -> str | None:
    """Every block that owns KV owns exactly block_size slots."""
    for owner, slots in _blocks(s).items():
        if len(slots) != s.config.block_size:
            return f"block {owner} owns {len(slots)} slots, not {s.config.block_size}"
    return None


def page_alignment(s: AbstractState) -> str | None:
    """Blocks are contiguous at their position's page offset; no page has two requests."""
    p = s.config.page_size
    page_users: dict[int, set[str]] = defaultdict(set)
    for (rid, block), slots in _blocks(s).items():
        slots = sorted(slots)
        if slots != list(range(slots[0], slots[0] + len(slots))):
            return f"block {block} of {rid!r} is not contiguous: {slots}"
        if slots[0] % p != (block * s.config.block_size) % p or slots[0] // p != slots[-1] // p:
            return f"block {block} of {rid!r} is misaligned in its page: {slots}"
        page_users[slots[0] // p].add(rid)
    for page, users in page_users.items():
        if len(users) > 1:
            return f"page {page} is shared by {sorted(users)}"
    return None


def reused_block_keeps_slots(s: AbstractState) -> str | None:
    """A current block that records slots owns exactly those slots."""
    for rid, r in s.requests.items():
        cur = r.current
        if r.phase in ACTIVE_PHASES and cur is not None and cur.slots is not None:
            for slot in cur.slots:
                if s.slot_owners.get(slot) != (rid, cur.index):
                    return f"block {cur.index} of {rid!r} records slot {slot}, owned by " + repr(
                        s.slot_owners.get(slot)
                    )
    return None


def carriers_consistent(s: AbstractState) -> str | None:
    """A carried (unfinished, stepped) block knows how many masks it has left."""
    for rid, r in s.requests.items():
        cur = r.current
        if cur is not None and cur.phase in CARRIED_BLOCK_PHASES and cur.masks is None:
            return f"carried block {cur.index} of {rid!r} has no mask count"
        if cur is not None and r.phase not in ACTIVE_PHASES:
            return f"{r.phase.value} request {rid!r} still has a current block"
    return None


INVARIANTS: dict[str, Invariant] = {
    "no_leak": no_leak,
    "terminal_owns_nothing": terminal_owns_nothing,
    "max_running": max_running,
    "row_exclusive": row_exclusive,
    "whole_block_alloc": whole_blocks,
    "page_alignment": page_alignment,
    "reuse_keeps_slots": reused_block_keeps_slots,
    "carriers_iff_unfinished": carriers_consistent,
}


def check_all(s: AbstractState) -> tuple[str, str] | None:
    """(rule, detail) of the first invariant that fails, or None."""
    for name, inv in INVARIANTS.items():
        detail = inv(s)
        if detail is not None:
            return name, detail
    return None
