"""Event reconstruction for AR engines that emit no events: diff two views of the engine's own
pools and queues, taken before and after a call, into the AR events the spec replays.

An adapter for such an engine is then mostly a view function. Where each event belongs in a
step (the order the spec checks; see docs/schedulers.md):

    scheduling phase (one call of the engine's `schedule()`), `scheduling_events`:
        1. ArPreempted for every running request that lost its blocks (tail of running first,
           or the engine's own order when given), each with every block it held. Placing
           every preemption before any scheduling is valid for the victim rules TAIL (FCFS)
           and LOWEST_PRIORITY_ANY (vLLM 0.33's priority policy): the engine's victim is then
           also the spec's victim. Under LOWEST_PRIORITY (among requests not yet scheduled)
           an engine must report its events itself, in order. A victim the engine had
           scheduled earlier in the same call (`unscheduled`, when the adapter can tell) gets
           its ArBlocksAllocated and ArScheduled right before its ArPreempted;
        2. for every request still running, in running order: ArBlocksAllocated (the blocks
           appended to its table), then ArScheduled (its tokens this step);
        3. for every admitted request, in running order: ArCacheHit (the leading blocks its
           computed tokens cover), ArBlocksAllocated (the rest), ArScheduled;
        4. ArCacheEvicted for blocks that lost their cached content without being allocated.
    model execution: ArStepEnd (the adapter's, once the engine ran the step).
    update phase (the engine's `update_from_output()`), `release_events`: ArBlocksFreed for
        every block a request no longer holds; the adapter then emits ArFinished / ArAborted
        with the reason only it knows.

View semantics: `num_computed` counts tokens computed *before* this step's forward (vLLM adds
the scheduled tokens to `num_computed_tokens` inside `schedule()`: subtract them), so that a
request admitted with computed > 0 got exactly that many tokens from the prefix cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheEvicted,
    ArCacheHit,
    ArEvent,
    ArPreempted,
    ArScheduled,
)
from spec.errors import SchedSpecError


class ReconstructionError(SchedSpecError, ValueError):
    """Two views that no sequence of AR events explains (names the request and why)."""


@dataclass(frozen=True, slots=True)
class ArPoolView:
    """An engine's AR pools and queues at one moment.

    block_tables: request id -> its block table, in order (running and waiting requests; a
        request missing here holds nothing).
    num_computed: request id -> tokens computed before this step's forward.
    running / waiting: the engine's queues, in its order.
    cached: blocks whose content is in the prefix cache (referenced or not).
    """

    block_tables: Mapping[str, tuple[int, ...]]
    num_computed: Mapping[str, int]
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    cached: frozenset[int] = field(default_factory=frozenset)

    def table(self, request_id: str) -> tuple[int, ...]:
        """The request's block table (empty when it holds nothing)."""
        return tuple(self.block_tables.get(request_id, ()))

    def holders(self) -> dict[int, frozenset[str]]:
        """Block id -> every request whose table lists it (its reference count = the size)."""
        out: dict[int, set[str]] = {}
        for rid, table in self.block_tables.items():
            for b in table:
                out.setdefault(b, set()).add(rid)
        return {b: frozenset(h) for b, h in out.items()}


def scheduling_events(
    before: ArPoolView,
    after: ArPoolView,
    scheduled: Mapping[str, int],
    block_size: int,
    preempted_order: Sequence[str] | None = None,
    unscheduled: Mapping[str, tuple[tuple[int, ...], int]] | None = None,
) -> list[ArEvent]:
    """The scheduling-phase events that take `before` to `after` (see the module docstring).

    `scheduled`: the engine's tokens per request this step (vLLM: `num_scheduled_tokens`).
    `unscheduled`: victims the engine had scheduled in this step before it preempted them
        (LOWEST_PRIORITY_ANY), as request id -> (the blocks that scheduling allocated, its
        tokens), when the adapter can tell (the views cannot: the blocks are gone again). Each
        gets `ArBlocksAllocated` and `ArScheduled` right before its `ArPreempted`, which frees
        those blocks too.
    Raises `ReconstructionError` when a scheduled request is unknown to `after`, or an admitted
    request's computed tokens are not whole cached blocks of its table.
    """
    events: list[ArEvent] = []
    was_running = set(before.running)
    still = set(after.running)
    victims = [
        rid
        for rid in before.running
        if rid not in still
        or (not _extends(after.table(rid), before.table(rid)) and before.table(rid))
    ]
    victims = [rid for rid in victims if rid in after.waiting or rid in still]
    if preempted_order is not None:
        rank = {rid: i for i, rid in enumerate(preempted_order)}
        victims.sort(key=lambda rid: rank.get(rid, len(rank)))
    else:
        victims.reverse()  # the tail of running first
    taken = unscheduled or {}
    for rid in victims:
        freed = before.table(rid)
        if rid in taken:
            blocks, n = taken[rid]
            if blocks:
                events.append(ArBlocksAllocated(rid, blocks))
            events.append(ArScheduled(rid, n))
            freed += blocks
        events.append(ArPreempted(rid, freed))
    preempted = set(victims)
    allocated: set[int] = set()
    for rid in after.running:
        if rid not in scheduled:
            continue
        if rid in was_running and rid not in preempted:
            new = after.table(rid)[len(before.table(rid)) :]
        else:  # admitted (from waiting, or re-admitted after its preemption)
            table = after.table(rid)
            computed = after.num_computed.get(rid, 0)
            if computed % block_size or computed // block_size > len(table):
                raise ReconstructionError(
                    f"request {rid!r} was admitted with {computed} computed tokens: a cache hit "
                    f"covers whole blocks of its table ({len(table)} blocks of {block_size})"
                )
            k = computed // block_size
            hit = table[:k]
            if hit:
                # cached before the step, or cached by a request scheduled earlier in it
                missing = [b for b in hit if b not in before.cached and b not in after.cached]
                if missing:
                    raise ReconstructionError(
                        f"request {rid!r} starts with computed blocks {list(missing)} that are "
                        f"not cached"
                    )
                events.append(ArCacheHit(rid, tuple(hit)))
            new = table[k:]
        if new:
            events.append(ArBlocksAllocated(rid, tuple(new)))
            allocated.update(new)
        events.append(ArScheduled(rid, scheduled[rid]))
    unknown = sorted(set(scheduled) - still)
    if unknown:
        raise ReconstructionError(
            f"requests {unknown} were scheduled but are not running after the call"
        )
    evicted = sorted(b for b in before.cached - after.cached if b not in allocated)
    if evicted:
        events.append(ArCacheEvicted(tuple(evicted)))
    return events


def release_events(before: ArPoolView, after: ArPoolView) -> list[ArEvent]:
    """`ArBlocksFreed` for every block a request held in `before` and no longer holds in
    `after` (finished, aborted or trimmed), in the request's table order."""
    events: list[ArEvent] = []
    for rid, table in before.block_tables.items():
        kept = set(after.table(rid))
        gone = tuple(b for b in table if b not in kept)
        if gone:
            events.append(ArBlocksFreed(rid, gone))
    return events


def _extends(longer: tuple[int, ...], prefix: tuple[int, ...]) -> bool:
    return longer[: len(prefix)] == prefix


__all__ = ["ArPoolView", "ReconstructionError", "release_events", "scheduling_events"]
