"""vLLM's KV cache events, read as a KV-aware router reads them, and checked against the
prefix cache they describe.

With `KVEventsConfig(enable_kv_cache_events=True)` vLLM's block pool queues an event for every
change of its prefix cache: `BlockStored` when blocks are cached (and, in the "full" report
mode, when a hit reuses them), `BlockRemoved` when a cached block is evicted or its key
replaced, `AllBlocksCleared` on a reset. `Scheduler.update_from_output` takes them and hands
them to its publisher (ZMQ for a router: llm-d's KV-cache indexer, Dynamo's KV router, SGLang's
model gateway). A router scores engines by the prefix cache those events describe, so they must
describe it exactly: a key the events leave cached that the engine evicted sends requests to KV
that is gone; a key the engine holds that the events never announced loses hits.

One key may be held by several blocks at once: vLLM does not deduplicate cached blocks (its
block tables are append-only), and it announces each copy's store and each copy's removal.
Routers count the copies (Dynamo's `EventDedupFilter`, llm-d's `eventDedupFilter`): a key
stays cached until as many removals as stores arrived. `KvEventView` is such a reader, standing
in for the publisher; `check_kv_events` is the rule `kv_events`: after each
`update_from_output` (when vLLM publishes), the keys of the view with a copy left are exactly
the keys of the block pool's cache, group by group (`(key, KV cache group)`, as `BlockStored`
and `BlockRemoved` carry `group_idx`). Events of another medium (vLLM's offloading connector
announces the CPU tier's stores and removals through the same publisher) describe that tier,
not the GPU pool, and are counted only.

Not a rule here: a `BlockStored`'s `token_ids` span every block of its range while its
`block_hashes` leave out the blocks it skips (a sliding window's or Mamba group's null blocks),
so a reader cannot pair a key with its tokens (known: vLLM issue #44451; `sparse_stores`
counts such events). The view pairs keys with nothing but their count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation

#: vLLM's medium name for the GPU block pool's events (`vllm.distributed.kv_events.MEDIUM_GPU`).
GPU_MEDIUM = "GPU"

#: A cached block's key as the events carry it: (its external block hash, KV cache group).
EventKey = tuple[Hashable, int | None]


@dataclass
class KvEventView:
    """A router's view of one engine's GPU prefix cache, built from its KV events alone: the
    copies announced per key (stores minus removals, a reset clearing all), with counts of
    what arrived. vLLM's scheduler calls `publish` with each batch, as it calls its
    publisher's."""

    copies: Counter[EventKey] = field(default_factory=Counter)
    #: The token ids of the store event that last announced each key (for messages).
    tokens: dict[EventKey, tuple[int, ...]] = field(default_factory=dict)
    stored: int = 0  # keys announced stored
    removed: int = 0  # keys announced removed
    cleared: int = 0  # AllBlocksCleared events
    sparse_stores: int = 0  # stores whose token_ids are not one block per key (#44451)
    other_media: int = 0  # events of another tier (the offloading connector's CPU store)

    def publish(self, batch: Any) -> None:
        """Apply a `KVEventBatch` (vLLM's `EventPublisher.publish`)."""
        for event in batch.events:
            self.apply(event)

    def apply(self, event: Any) -> None:
        """Apply one KV cache event."""
        kind = type(event).__name__
        if kind == "AllBlocksCleared":
            self.copies.clear()
            self.cleared += 1
            return
        if getattr(event, "medium", GPU_MEDIUM) not in (GPU_MEDIUM, None):
            self.other_media += 1
            return
        group = event.group_idx
        if kind == "BlockStored":
            tokens = tuple(event.token_ids)
            if len(tokens) != len(event.block_hashes) * event.block_size:
                self.sparse_stores += 1
            for key in event.block_hashes:
                self.copies[(key, group)] += 1
                self.tokens[(key, group)] = tokens
                self.stored += 1
        elif kind == "BlockRemoved":
            for key in event.block_hashes:
                self.copies[(key, group)] -= 1
                self.removed += 1

    def cached(self) -> set[EventKey]:
        """The keys with a copy left: what a router takes as cached."""
        return {key for key, n in self.copies.items() if n > 0}


def pool_keys(sched: Any, kv_utils: Any) -> dict[EventKey, list[int]]:
    """The keys the block pool's prefix cache holds, as events name them, with the ids of the
    blocks holding each (`kv_utils`: vLLM's `kv_cache_utils`)."""
    pool = sched.kv_cache_manager.block_pool
    keys: dict[EventKey, list[int]] = {}
    for full_key, held in pool.cached_block_hash_to_block._cache.items():
        key = (
            kv_utils.maybe_convert_block_hash(kv_utils.get_block_hash(full_key)),
            kv_utils.get_group_id(full_key),
        )
        blocks = held.values() if isinstance(held, dict) else (held,)
        keys[key] = sorted(int(b.block_id) for b in blocks)
    return keys


def check_kv_events(view: KvEventView, sched: Any, kv_utils: Any, where: str) -> None:
    """`EngineCoreViolation("kv_events", ...)` unless the keys `view` takes as cached are
    exactly those the prefix cache holds, naming the first key either way."""
    held = pool_keys(sched, kv_utils)
    announced = view.cached()
    gone = sorted(announced - held.keys(), key=repr)
    if gone:
        key = gone[0]
        raise EngineCoreViolation(
            "kv_events",
            f"{where}: the KV events leave {len(gone)} key(s) cached that the prefix cache no "
            f"longer holds; the first, of KV cache group {key[1]}, was stored with tokens "
            f"{list(view.tokens.get(key, ()))} and has {view.copies[key]} copy(ies) left by the "
            "events: a router sends requests here for KV that is gone",
        )
    unannounced = sorted(held.keys() - announced, key=repr)
    if unannounced:
        key = unannounced[0]
        raise EngineCoreViolation(
            "kv_events",
            f"{where}: the prefix cache holds {len(unannounced)} key(s) the KV events do not "
            f"leave cached; the first, of KV cache group {key[1]}, in block(s) {held[key]}, has "
            f"{view.copies[key]} copy(ies) by the events: a router misses those hits",
        )


__all__ = ["GPU_MEDIUM", "EventKey", "KvEventView", "check_kv_events", "pool_keys"]
