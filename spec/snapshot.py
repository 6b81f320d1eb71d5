"""What an implementation reports about its own pools after a round.

The snapshot is read from the implementation's real data structures (its allocator's free
list, its request-to-token table, its running batch), not from its event log: that is how a leak
inside the implementation's allocator is caught even when its events look right.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from spec.events import FinishReason

SlotOwner = tuple[str, int]  # (request id, block index)


@dataclass(frozen=True, slots=True)
class FinishedOutput:
    """What an implementation returns to its client for a finished request.

    tokens: the output tokens (the spec's `request_output`: generated tokens cut at
        max_new_tokens and after the first EOS).
    reason: why it finished (must match its `Finished` event).
    """

    tokens: tuple[int, ...]
    reason: FinishReason


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An implementation's own view of its pools.

    free_slots: KV slots its allocator considers free.
    slot_owners: slot -> (request id, block index) for every slot in use.
    rows: request-pool row -> request id for every held row.
    running: requests in its running set.
    carrying: requests whose incomplete_ids are non-empty (an unfinished block carried to the
        next round).
    cached_slots: with a prefix cache, the slots it holds (neither free nor owned by a
        request); None where the implementation does not say (not compared).
    """

    free_slots: frozenset[int]
    slot_owners: Mapping[int, SlotOwner]
    rows: Mapping[int, str]
    running: frozenset[str]
    carrying: frozenset[str] = field(default_factory=frozenset)
    cached_slots: frozenset[int] | None = None

    def leaked_slots(self) -> int:
        """Slots in use. After a drain every slot must be free: any in use is a leak."""
        return len(self.slot_owners)

    def held_rows(self) -> int:
        """Rows held. After a drain every row must be free: any held is a leak."""
        return len(self.rows)
