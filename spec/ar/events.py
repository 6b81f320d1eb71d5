"""The AR event vocabulary: what an autoregressive scheduler reports, in order.

Every event is a frozen, slotted dataclass with a stable `kind` (JSON Lines traces). A step is:

    scheduling phase   ArBlocksAllocated, ArScheduled (tokens for one request this step),
                       ArPreempted (with every block it held)
    model execution    ArStepEnd (each scheduled request computes its tokens; a request that
                       caught up with its known tokens samples one output token)
    update phase       ArBlocksFreed, ArFinished

`ArSubmitted` and `ArAborted` (with the frees it causes) happen between steps.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar


class ArFinishReason(enum.Enum):
    LENGTH = "length"  # produced max_tokens output tokens
    STOP = "stop"  # sampled the end token


@dataclass(frozen=True, slots=True)
class ArSubmitted:
    """A request entered the waiting queue (arrival order = submission order)."""

    kind: ClassVar[str] = "ar_submitted"
    request_id: str
    prompt_len: int
    max_tokens: int
    stop_after: int | None = None
    priority: int = 0
    predicted_len: int | None = None


@dataclass(frozen=True, slots=True)
class ArBlocksAllocated:
    """KV `blocks` (ids) now belong to the request, appended to its block table."""

    kind: ClassVar[str] = "ar_blocks_allocated"
    request_id: str
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArScheduled:
    """The request computes `num_tokens` tokens in this step (a waiting request is admitted)."""

    kind: ClassVar[str] = "ar_scheduled"
    request_id: str
    num_tokens: int


@dataclass(frozen=True, slots=True)
class ArPreempted:
    """A running request was preempted: every block it held (`freed`) went back to the pool,
    its computed tokens are discarded (recompute from zero) and it waits again at the head of
    the queue."""

    kind: ClassVar[str] = "ar_preempted"
    request_id: str
    freed: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArBlocksFreed:
    kind: ClassVar[str] = "ar_blocks_freed"
    request_id: str
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArFinished:
    kind: ClassVar[str] = "ar_finished"
    request_id: str
    reason: ArFinishReason


@dataclass(frozen=True, slots=True)
class ArAborted:
    kind: ClassVar[str] = "ar_aborted"
    request_id: str


@dataclass(frozen=True, slots=True)
class ArStepEnd:
    """The model ran step `step_index` over every request scheduled in it."""

    kind: ClassVar[str] = "ar_step_end"
    step_index: int


ArEvent = (
    ArSubmitted
    | ArBlocksAllocated
    | ArScheduled
    | ArPreempted
    | ArBlocksFreed
    | ArFinished
    | ArAborted
    | ArStepEnd
)

AR_EVENT_TYPES: tuple[type[ArEvent], ...] = (
    ArSubmitted,
    ArBlocksAllocated,
    ArScheduled,
    ArPreempted,
    ArBlocksFreed,
    ArFinished,
    ArAborted,
    ArStepEnd,
)

AR_EVENT_BY_KIND: dict[str, type[ArEvent]] = {t.kind: t for t in AR_EVENT_TYPES}
