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
and `BlockRemoved` carry `group_idx`). vLLM's offloading connector announces its CPU tier's
stores and removals through the same publisher (medium "CPU", a chunk's key): the view counts
those apart, and they must leave cached exactly the chunks the connector's manager holds
stored. `AllBlocksCleared` names no medium, and clears both. A removal of a key with no copy is
ignored, as the routers' filters pass unknown removals through.

Not a rule here: a `BlockStored`'s `token_ids` span every block of its range while its
`block_hashes` leave out the blocks it skips (a sliding window's or Mamba group's null blocks),
so a reader cannot pair a key with its tokens (known: vLLM issue #44451; `sparse_stores`
counts such events). The view pairs keys with nothing but their count. Nor is a store whose
`parent_block_hash` has no copy when it arrives (`orphan_stores`, `cpu_orphan_stores`): a
radix-tree router skips it, but vLLM skips the null blocks of a window or Mamba group, and
its offloading connector announces a job's chunks in no set order (key order is "free" there).
What each store says of its blocks (tokens, parent, adapter, extra keys) is the rule
`kv_event_content` (`integrations.vllm.kv_event_content`), fed by `take_stores`.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.release_api import cached_block_ids

#: vLLM's medium name for the GPU block pool's events (`vllm.distributed.kv_events.MEDIUM_GPU`).
GPU_MEDIUM = "GPU"

#: The medium of the CPU tier of vLLM's offloading connector (`MEDIUM_CPU`).
CPU_MEDIUM = "CPU"

#: A cached block's key as the events carry it: (its external block hash, KV cache group).
EventKey = tuple[Hashable, int | None]


@dataclass
class KvEventView:
    """A router's view of one engine's GPU prefix cache, built from its KV events alone: the
    copies announced per key (stores minus removals, a reset clearing all), with counts of
    what arrived. vLLM's scheduler calls `publish` with each batch, as it calls its
    publisher's."""

    copies: Counter[EventKey] = field(default_factory=Counter)
    #: The same for the CPU tier of vLLM's offloading connector (medium "CPU").
    cpu_copies: Counter[EventKey] = field(default_factory=Counter)
    #: The token ids of the store event that last announced each key (for messages).
    tokens: dict[EventKey, tuple[int, ...]] = field(default_factory=dict)
    stored: int = 0  # keys announced stored
    removed: int = 0  # keys announced removed
    cleared: int = 0  # AllBlocksCleared events
    sparse_stores: int = 0  # stores whose token_ids are not one block per key (#44451)
    other_media: int = 0  # events of another tier (the offloading connector's CPU tier)
    #: Stores whose `parent_block_hash` has no copy in the view when they arrive (GPU tier;
    #: `cpu_orphan_stores`, the CPU tier's): a radix-tree router, which hangs a store under
    #: its parent (Dynamo's `RadixTree.apply_event`), skips them.
    orphan_stores: int = 0
    cpu_orphan_stores: int = 0

    #: The stores of either tier that arrived since `take_stores` last ran, with their medium
    #: (what `integrations.vllm.kv_event_content` reads).
    stores: list[tuple[Any, str]] = field(default_factory=list)

    #: With a callable, one line per published batch (a loop's trace).
    log: Callable[[str], None] | None = None

    def publish(self, batch: Any) -> None:
        """Apply a `KVEventBatch` (vLLM's `EventPublisher.publish`)."""
        for event in batch.events:
            self.apply(event)
        if self.log is not None:
            self.log(f"KV events: {describe(batch.events)}")

    def apply(self, event: Any) -> None:
        """Apply one KV cache event."""
        kind = type(event).__name__
        if kind == "AllBlocksCleared":
            # it names no medium: routers drop the engine's keys of every tier
            self.copies.clear()
            self.cpu_copies.clear()
            self.cleared += 1
            return
        medium = getattr(event, "medium", GPU_MEDIUM)
        if kind == "BlockStored" and medium in (GPU_MEDIUM, CPU_MEDIUM, None):
            self.stores.append((event, medium or GPU_MEDIUM))
        if medium == CPU_MEDIUM:
            self.other_media += 1
            self.cpu_orphan_stores += _orphan(self.cpu_copies, kind, event)
            _count(self.cpu_copies, kind, event)
            return
        if medium not in (GPU_MEDIUM, None):
            self.other_media += 1
            return
        if kind == "BlockStored":
            self.orphan_stores += _orphan(self.copies, kind, event)
            tokens = tuple(event.token_ids)
            if len(tokens) != len(event.block_hashes) * event.block_size:
                self.sparse_stores += 1
            for key in event.block_hashes:
                self.tokens[(key, event.group_idx)] = tokens
            self.stored += len(event.block_hashes)
        elif kind == "BlockRemoved":
            self.removed += len(event.block_hashes)
        _count(self.copies, kind, event)

    def take_stores(self) -> list[tuple[Any, str]]:
        """The stores that arrived since the last call, with their medium, in order."""
        stores, self.stores = self.stores, []
        return stores

    def cached(self) -> set[EventKey]:
        """The keys with a copy left: what a router takes as cached."""
        return {key for key, n in self.copies.items() if n > 0}


def describe(events: Sequence[Any]) -> str:
    """`events` in words: per kind and medium the keys named ("BlockStored GPU 2 keys;
    BlockRemoved CPU 1 key; AllBlocksCleared")."""
    keys: Counter[str] = Counter()
    for event in events:
        kind = type(event).__name__
        medium = getattr(event, "medium", None)
        keys[kind if medium is None else f"{kind} {medium}"] += len(
            getattr(event, "block_hashes", ())
        )
    return "; ".join(
        where if where == "AllBlocksCleared" else f"{where} {n} key{'s' * (n != 1)}"
        for where, n in keys.items()
    )


def _orphan(copies: Counter[EventKey], kind: str, event: Any) -> int:
    """1 for a store naming a parent key (`parent_block_hash`, in its group) with no copy in
    `copies`, else 0."""
    parent = getattr(event, "parent_block_hash", None)
    if kind != "BlockStored" or parent is None:
        return 0
    return int(copies[(parent, event.group_idx)] <= 0)


def _count(copies: Counter[EventKey], kind: str, event: Any) -> None:
    """A store adds a copy of each key it names, a removal takes one; a removal of a key with
    no copy is ignored, as the routers' filters pass unknown removals through."""
    for key in event.block_hashes:
        full = (key, event.group_idx)
        if kind == "BlockStored":
            copies[full] += 1
        elif kind == "BlockRemoved" and copies[full] > 0:
            copies[full] -= 1


def pool_keys(sched: Any, kv_utils: Any) -> dict[EventKey, list[int]]:
    """The keys the block pool's prefix cache holds, as events name them, with the ids of the
    blocks holding each (`kv_utils`: vLLM's `kv_cache_utils`)."""
    pool = sched.kv_cache_manager.block_pool
    keys: dict[EventKey, list[int]] = {}
    # vLLM's conversion reads an environment variable per key (most of this check's cost):
    # converted keys are remembered per conversion functions and setting, read once a call
    convert, block_hash, group_id = (
        kv_utils.maybe_convert_block_hash,
        kv_utils.get_block_hash,
        kv_utils.get_group_id,
    )
    setting = getattr(getattr(kv_utils, "envs", None), "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", None)
    memo = _EVENT_KEYS.setdefault((convert, block_hash, group_id, setting), {})
    if len(memo) > _EVENT_KEYS_KEPT:
        memo.clear()
    for full_key, block_ids in cached_block_ids(pool).items():
        key = memo.get(full_key)
        if key is None:
            key = memo[full_key] = (convert(block_hash(full_key)), group_id(full_key))
        keys[key] = block_ids
    return keys


#: `pool_keys`' converted keys, by (vLLM's three conversion functions, the setting by which
#: events name keys by integers): a block pool's key -> the key its events name; cleared
#: past this many.
_EVENT_KEYS: dict[tuple[Any, Any, Any, Any], dict[Any, EventKey]] = {}
_EVENT_KEYS_KEPT = 100_000


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
    offloaded = offloaded_keys(sched, kv_utils)
    if offloaded is None:
        return
    in_cpu = {key for key, n in view.cpu_copies.items() if n > 0}
    for extra, what in (
        (
            in_cpu - offloaded,
            "leave cached in the CPU tier keys that vLLM's offloading "
            "connector no longer holds: a router counts on CPU-tier hits that are gone",
        ),
        (
            offloaded - in_cpu,
            "do not leave cached in the CPU tier keys that vLLM's offloading "
            "connector holds: a router misses those hits",
        ),
    ):
        if extra:
            key = sorted(extra, key=repr)[0]
            raise EngineCoreViolation(
                "kv_events",
                f"{where}: the KV events {what} ({len(extra)}; the first of KV cache group "
                f"{key[1]})",
            )


def offloaded_keys(sched: Any, kv_utils: Any) -> set[EventKey] | None:
    """The keys of the chunks vLLM's offloading connector holds stored in its CPU tier (a store
    completed), as its events name them (a chunk's own key; with self-describing events, the
    per-block keys its connector recorded for it), or None where the scheduler serves no such
    connector or its manager keeps them in a structure this does not read (a policy other
    than LRU)."""
    connector = getattr(getattr(sched, "connector", None), "connector_scheduler", None)
    chunks = getattr(getattr(getattr(connector, "manager", None), "_policy", None), "chunks", None)
    if not isinstance(chunks, dict):
        return None
    base = importlib.import_module("vllm.v1.kv_offload.base")
    tracker: Any = getattr(connector, "_events_tracker", None)
    payloads = (
        tracker._pending_event_metadata
        if getattr(tracker, "self_describing_enabled", False)
        else {}
    )
    keys: set[EventKey] = set()
    for key, chunk in chunks.items():
        if not chunk.is_ready:
            continue
        group = base.get_offload_group_idx(key)
        payload = payloads.get(key)
        # self-describing: the per-block keys the connector recorded for the chunk when it
        # stored it; else (or for a chunk it recorded nothing for) the chunk's own key
        hashes = (
            payload.block_hashes if payload is not None else (base.get_offload_block_hash(key),)
        )
        keys.update((kv_utils.maybe_convert_block_hash(h), group) for h in hashes)
    return keys


__all__ = [
    "CPU_MEDIUM",
    "GPU_MEDIUM",
    "EventKey",
    "KvEventView",
    "check_kv_events",
    "offloaded_keys",
    "pool_keys",
]
