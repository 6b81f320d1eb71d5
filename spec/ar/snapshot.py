"""What an AR implementation reports about its own pools and queues between steps.

Read from its real data structures (free-block list, block tables, queues), not from its event
log: a leak inside its allocator is caught even when its events look right.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spec.snapshot import container_fields


@dataclass(frozen=True, slots=True)
class ArSnapshot:
    """free_blocks: block ids its allocator considers free (the null block excluded).
    block_owners: block id -> request id for every held block.
    running: its running requests, in its running order.
    waiting: its waiting requests, in its queue order (FCFS) or any order (other policies).
    num_computed: computed tokens of every running or waiting request.

    Prefix caching (optional; None = not reported, not compared):
    block_holders: block id -> every request whose block table lists it. When given it
        replaces `block_owners` (which may then be left empty): a shared block has several.
    block_refcounts: block id -> the allocator's own reference count (vLLM's `ref_cnt`), for
        every block with a count > 0; compared with the number of holders (`refcount_matches`).
    cached_blocks: blocks whose content is cached (hittable), referenced or not.
    """

    free_blocks: frozenset[int]
    block_owners: Mapping[int, str]
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    num_computed: Mapping[str, int]
    block_holders: Mapping[int, frozenset[str]] | None = None
    block_refcounts: Mapping[int, int] | None = None
    cached_blocks: frozenset[int] | None = None

    def holders(self) -> Mapping[int, frozenset[str]]:
        """Block id -> its holders, from `block_holders` or else `block_owners`."""
        if self.block_holders is not None:
            return self.block_holders
        return {b: frozenset({r}) for b, r in self.block_owners.items()}

    def held_blocks(self) -> int:
        """Blocks some request holds. After a drain every block must be free."""
        return len(self.holders())


AR_SNAPSHOT_FIELDS = container_fields(ArSnapshot)
"""`ArSnapshot`'s fields and their declared container types (`spec.snapshot.wrong_container`)."""
