"""The event vocabulary: what an implementation reports, in the order it happens.

Every event is a frozen, slotted dataclass with a stable `kind` name (used in JSON Lines traces).
A scheduler round is the run of events up to and including `ControlReturned`:

    scheduler phase   Admitted / RowAcquired / KvAllocated   (new work, new blocks)
    worker phase      Forward, StepResult × rows  (repeated: sync loop or FDFO re-loop)
    completion        BlockCommitted, KvFreed, RowReleased, Finished
    end               ControlReturned

`Submitted` and `Aborted` (with the frees it causes) happen between rounds.

With a prefix cache (`DllmConfig.prefix_cache`, SGLang's radix cache) four more kinds say what
moves between requests and the cache: `KvCached` (a committed block's slots enter the cache),
`CacheHit` (a request reads a cached block as one of its own), `CacheReleased` (it stops
reading it) and `CacheEvicted` (unread cached blocks go back to the free pool).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar


class FinishReason(enum.Enum):
    """Why a dLLM request finished."""

    LENGTH = "length"  # generated >= max_new_tokens
    EOS = "eos"  # an end-of-sequence token was committed
    # one of the request's `stop_token_ids` was committed, or a stop condition the spec does
    # not see (a stop string, a regex) held on the block just committed (`stop_sampled`)
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class Submitted:
    """A request entered the waiting queue (at the tail; under an ordered queue,
    `DllmPolicy.priority_order` or `longest_output_first`, behind every queued request that is
    not after it in that order: `DllmPolicy.queue_key`).

    `stop_token_ids`: token ids other than the EOS that end the request as the EOS does, with
    reason STOP: it finishes right after the block that commits the first of them (within
    max_new_tokens), and its output is cut after it (SGLang's and vLLM's `stop_token_ids`).
    `stop_sampled`: the engine also ends the request on a stop condition the spec cannot
    evaluate (stop strings, a stop regex, a grammar's end), so it may finish with reason STOP
    right after any round in which it committed a block holding a generated token.
    `ignore_eos`: the engine ends the request on no token (SGLang's `ignore_eos` sampling
    parameter, which turns off its stop token ids too), so it runs to max_new_tokens (or a
    sampled STOP) and its output keeps every EOS it generated. `priority`: the request's
    priority as submitted (`RequestSpec.priority`: lower first); it orders the queue only under
    `DllmPolicy.priority_order`. Each is written only when set (most logs have no such
    request)."""

    kind: ClassVar[str] = "submitted"
    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    stop_sampled: bool = False
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Admitted:
    """A queued request joined the running set, holding request-pool `row`."""

    kind: ClassVar[str] = "admitted"
    request_id: str
    row: int


@dataclass(frozen=True, slots=True)
class RowAcquired:
    """A running request that had released its row (FDFO without reuse) took one again."""

    kind: ClassVar[str] = "row_acquired"
    request_id: str
    row: int


@dataclass(frozen=True, slots=True)
class RowReleased:
    """A request gave its request-pool row back."""

    kind: ClassVar[str] = "row_released"
    request_id: str
    row: int


@dataclass(frozen=True, slots=True)
class KvAllocated:
    """KV `slots` (block_size of them, in position order) now hold block `block_index`."""

    kind: ClassVar[str] = "kv_allocated"
    request_id: str
    block_index: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KvFreed:
    """KV `slots` owned by the request went back to the free pool."""

    kind: ClassVar[str] = "kv_freed"
    request_id: str
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KvCached:
    """Prefix cache: the request's committed block `block_index`, whose `slots` it owned, now
    belongs to the cache, keyed by the request's tokens from position 0 through the block's
    end; the request keeps reading it (a reference, dropped with `CacheReleased`)."""

    kind: ClassVar[str] = "kv_cached"
    request_id: str
    block_index: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CacheHit:
    """Prefix cache: the request reads the cached block in `slots` (block_size of them, in
    position order) as its block `block_index`; the cached content is its own tokens through
    that block. A hit on its next block (`block_index` = blocks committed, before the round's
    first forward, the block wholly inside the prompt) commits that block without a forward;
    a hit on a block it already committed swaps its own copy for the cached one (it then frees
    its own slots: SGLang's insert of a block the tree already holds)."""

    kind: ClassVar[str] = "cache_hit"
    request_id: str
    block_index: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CacheReleased:
    """Prefix cache: the request stopped reading the cached block in `slots` (its block
    `block_index`); the block stays cached."""

    kind: ClassVar[str] = "cache_released"
    request_id: str
    block_index: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CacheEvicted:
    """Prefix cache: the cached blocks in `slots` (whole blocks, none read by a request) left
    the cache; their slots are free."""

    kind: ClassVar[str] = "cache_evicted"
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ForwardRow:
    """One row of a forward: a whole block of one request.

    reused: the block kept its row and KV slots from an earlier round (in-place reuse).
    num_tokens: tokens fed for this row (must be block_size: rows are whole blocks).
    masked: mask tokens in the row's input (0 = the block is complete: final-KV forward).
    """

    request_id: str
    block_index: int
    reused: bool
    num_tokens: int
    masked: int


@dataclass(frozen=True, slots=True)
class Forward:
    """The model ran once over `rows` (one per request) and wrote their KV."""

    kind: ClassVar[str] = "forward"
    rows: tuple[ForwardRow, ...]


@dataclass(frozen=True, slots=True)
class StepResult:
    """The algorithm's step for one row of the latest forward.

    accept_length: 0 (not done: carry the block) or block_size (done: the block was already
        complete when this step started).
    masks_remaining: mask tokens left in the block after the step.
    """

    kind: ClassVar[str] = "step_result"
    request_id: str
    block_index: int
    accept_length: int
    masks_remaining: int


@dataclass(frozen=True, slots=True)
class BlockCommitted:
    """A done block became part of the request: its final `tokens` (block_size ids)."""

    kind: ClassVar[str] = "block_committed"
    request_id: str
    block_index: int
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Finished:
    """The request finished for `reason`, right after the commit that ended it; it owns no
    slot and no row from now on."""

    kind: ClassVar[str] = "finished"
    request_id: str
    reason: FinishReason


@dataclass(frozen=True, slots=True)
class Aborted:
    """The client aborted the request between rounds; it owns no slot and no row from now
    on."""

    kind: ClassVar[str] = "aborted"
    request_id: str


@dataclass(frozen=True, slots=True)
class ControlReturned:
    """The worker handed control back to the scheduler: round `round_index` ended."""

    kind: ClassVar[str] = "control_returned"
    round_index: int


Event = (
    Submitted
    | Admitted
    | RowAcquired
    | RowReleased
    | KvAllocated
    | KvFreed
    | Forward
    | StepResult
    | BlockCommitted
    | Finished
    | Aborted
    | ControlReturned
    | KvCached
    | CacheHit
    | CacheReleased
    | CacheEvicted
)

EVENT_TYPES: tuple[type[Event], ...] = (
    Submitted,
    Admitted,
    RowAcquired,
    RowReleased,
    KvAllocated,
    KvFreed,
    Forward,
    StepResult,
    BlockCommitted,
    Finished,
    Aborted,
    ControlReturned,
    KvCached,
    CacheHit,
    CacheReleased,
    CacheEvicted,
)

EVENT_BY_KIND: dict[str, type[Event]] = {t.kind: t for t in EVENT_TYPES}
