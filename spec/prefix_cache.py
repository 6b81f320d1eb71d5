"""The dLLM spec's prefix cache (`DllmConfig.prefix_cache`): which slots it holds, under which
content key, and which (request, block) pairs read each cached block.

A cached block is whole (block_size slots, position order) and keyed by content: the tokens
from position 0 through the block's end of the request that cached it. Its KV depends on that
whole prefix (every block attends to the blocks before it, and bidirectionally within itself),
so a hit is sound only on an identical key. A key is held as a `BlockKey`: the block's index,
its own tokens, and a SHA-256 chained over every block up to it (`chain`), so the spec keeps
a fixed amount per cached block however long the context, and still tells where two keys
differ: the block's own tokens, or the prefix before it. Cached slots are neither free nor
owned by a request; a block no request reads may be evicted, and its slots are free again.

`PrefixCache` keeps the tables and refuses what would break them with `CacheRefused(rule,
detail)`; `SpecMachine` turns that into a `SpecViolation` naming the event and the state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from spec.rules import Rule
from spec.state import CachedBlock, SlotOwner

ROOT = b""  # the chain's start: the empty prefix


def chain(previous: bytes, block: Sequence[int]) -> bytes:
    """The digest of a prefix that ends with `block`, given the digest of the prefix before it
    (`ROOT` for block 0): SHA-256 over the previous digest and the block's token ids."""
    digest = hashlib.sha256(previous)
    digest.update(",".join(map(str, block)).encode())
    return digest.digest()


@dataclass(frozen=True, slots=True)
class BlockKey:
    """A block's content key: its index, its own tokens, and the chained digest of every
    token from position 0 through its end (equal digests: equal prefixes)."""

    block_index: int
    tokens: tuple[int, ...]
    digest: bytes

    def difference(self, wanted: BlockKey) -> str:
        """Where this (cached) key and a request's part, in words."""
        if self.block_index != wanted.block_index:
            return f"it was cached as block {self.block_index}, not block {wanted.block_index}"
        for i, (a, b) in enumerate(zip(self.tokens, wanted.tokens, strict=True)):
            if a != b:
                at = self.block_index * len(self.tokens) + i
                return f"position {at} holds {a} in the cache and {b} in the request"
        return (
            f"block {self.block_index} holds the same tokens {list(self.tokens)}, but the "
            f"tokens before it differ"
        )


@dataclass(slots=True, eq=False)
class CacheEntry:
    """One cached block: its slots (position order), its key and its readers (in the order
    they started reading)."""

    slots: tuple[int, ...]
    key: BlockKey
    readers: dict[SlotOwner, None]

    def frozen(self) -> CachedBlock:
        """The block as the abstract state shows it."""
        key = self.key
        return CachedBlock(
            self.slots, key.block_index, key.tokens, key.digest.hex(), frozenset(self.readers)
        )


class CacheRefused(Exception):
    """A cache operation the spec forbids: the rule it breaks and what was wrong."""

    def __init__(self, rule: Rule, detail: str) -> None:
        super().__init__(f"[{rule}] {detail}")
        self.rule = rule
        self.detail = detail


class PrefixCache:
    """The cached blocks, indexed by slot."""

    def __init__(self) -> None:
        self._by_slot: dict[int, CacheEntry] = {}

    def __len__(self) -> int:
        """Slots held."""
        return len(self._by_slot)

    def holds(self, slot: int) -> bool:
        """Whether `slot` is held by a cached block."""
        return slot in self._by_slot

    def entry_of(self, slot: int) -> CacheEntry | None:
        """The cached block holding `slot`, if any."""
        return self._by_slot.get(slot)

    def entries(self) -> list[CacheEntry]:
        """Every cached block once, by first slot."""
        unique = {id(entry): entry for entry in self._by_slot.values()}
        return sorted(unique.values(), key=lambda entry: entry.slots[0])

    def blocks(self) -> tuple[CachedBlock, ...]:
        """Every cached block, frozen (`AbstractState.cache`)."""
        return tuple(entry.frozen() for entry in self.entries())

    def insert(self, slots: tuple[int, ...], key: BlockKey, reader: SlotOwner) -> CacheEntry:
        """Cache a block the caller checked is committed and owned whole by `reader`, which
        keeps reading it."""
        entry = CacheEntry(tuple(slots), key, {reader: None})
        for slot in slots:
            self._by_slot[slot] = entry
        return entry

    def lookup(self, slots: tuple[int, ...], describe: Callable[[int], str]) -> CacheEntry:
        """The cached block whose slots are exactly `slots`; else `CacheRefused` naming what
        each slot is (`describe`: a slot the cache lacks -> what it is, in words)."""
        entry = self._by_slot.get(slots[0]) if slots else None
        if entry is None or entry.slots != tuple(slots):
            raise CacheRefused(Rule.CACHE_HIT_CONTENT, self._not_a_block(slots, describe))
        return entry

    def _not_a_block(self, slots: tuple[int, ...], describe: Callable[[int], str]) -> str:
        parts = []
        for slot in slots:
            entry = self._by_slot.get(slot)
            if entry is None:
                parts.append(f"{slot}: {describe(slot)}")
            else:
                parts.append(f"{slot}: in cached block {list(entry.slots)}")
        return f"slots {list(slots)} are not one cached block ({'; '.join(parts)})"

    def evict(self, slots: Iterable[int], describe: Callable[[int], str]) -> None:
        """Drop the whole, unread cached blocks that make up `slots`; else `CacheRefused`
        (`describe` as for `lookup`)."""
        wanted = list(slots)
        if len(set(wanted)) != len(wanted):
            raise CacheRefused(Rule.EVICT_UNREAD_ONLY, f"slots {wanted} evicted twice at once")
        chosen: dict[int, CacheEntry] = {}
        for slot in wanted:
            entry = self._by_slot.get(slot)
            if entry is None:
                what = describe(slot)
                raise CacheRefused(
                    Rule.EVICT_UNREAD_ONLY, f"evicted slot {slot}, which is not cached ({what})"
                )
            chosen[id(entry)] = entry
        taken = set(wanted)
        for entry in chosen.values():
            if not taken.issuperset(entry.slots):
                raise CacheRefused(
                    Rule.EVICT_UNREAD_ONLY,
                    f"evicted part of cached block {list(entry.slots)}; blocks leave the cache "
                    f"whole",
                )
            if entry.readers:
                readers = ", ".join(f"{rid!r} as block {k}" for rid, k in entry.readers)
                raise CacheRefused(
                    Rule.EVICT_UNREAD_ONLY,
                    f"evicted cached block {list(entry.slots)}, which {readers} still reads",
                )
        for entry in chosen.values():
            for slot in entry.slots:
                del self._by_slot[slot]


__all__ = ["ROOT", "BlockKey", "CacheEntry", "CacheRefused", "PrefixCache", "chain"]
