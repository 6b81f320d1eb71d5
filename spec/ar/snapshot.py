"""What an AR implementation reports about its own pools and queues between steps.

Read from its real data structures (free-block list, block tables, queues), not from its event
log: a leak inside its allocator is caught even when its events look right.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ArSnapshot:
    """free_blocks: block ids its allocator considers free (the null block excluded).
    block_owners: block id -> request id for every held block.
    running: its running requests, in its running order.
    waiting: its waiting requests, in its queue order (FCFS) or any order (other policies).
    num_computed: computed tokens of every running or waiting request.
    """

    free_blocks: frozenset[int]
    block_owners: Mapping[int, str]
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    num_computed: Mapping[str, int]

    def held_blocks(self) -> int:
        return len(self.block_owners)
