"""A request inside the engine: its row, its committed blocks and its current block.

Between FDFO rounds an unfinished block travels on the request as a `Carry`: the block's
tokens (`incomplete_ids`) and the opaque algorithm state (`algo_state`), exactly what SGLang's
dLLM scheduler stores on `Req`. With in-place reuse the block also keeps its KV slots
(`block_first_slot` stays set); without it the slots are freed at the end of the round and the
next round allocates the block afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spec.config import RequestSpec
from spec.events import FinishReason
from spec.prefix_cache import ROOT, chain


@dataclass(slots=True)
class Carry:
    """An unfinished block carried to the next round."""

    incomplete_ids: torch.Tensor  # [block_size] internal ids, masks included
    algo_state: object
    # The masks in incomplete_ids when known on the host (the step's count), so the next round
    # needs no device read to report them; None: the engine counts them from incomplete_ids.
    masks_left: int | None = None


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """What the streaming callback receives for every committed block.

    tokens: the block's tokens in the config's ids (prompt positions included).
    new_tokens: the generated tokens this block adds to the output (cut at max_new_tokens and
        after EOS, so the chunks of a request concatenate to its output).
    finished: the finish reason when this block ended the request, else None.
    """

    request_id: str
    block_index: int
    tokens: tuple[int, ...]
    new_tokens: tuple[int, ...]
    finished: FinishReason | None


@dataclass(slots=True, eq=False)
class EngineRequest:
    """The engine's record of one queued or running request: its handle, row, committed
    blocks and current block (fresh tokens and state, or a `Carry`)."""

    spec: RequestSpec
    handle: int  # the allocator's owner id for this request
    prompt_ids: list[int]  # internal ids
    pages_needed: int  # worst case, reserved at admission
    row: int | None = None
    committed_blocks: int = 0
    committed_spec: list[int] = field(default_factory=list)  # spec ids, prompt included
    block_first_slots: list[int] = field(default_factory=list)  # per committed block
    # with a prefix cache: the chained digest of each committed block's prefix
    digests: list[bytes] = field(default_factory=list)
    # the current block (None between blocks)
    block_first_slot: int | None = None  # its KV slots, when it holds them
    block_alloc_round: int = -1
    fresh_tokens: torch.Tensor | None = None  # a newly started block's initial tokens
    fresh_state: object = None
    fresh_masks: int = 0  # the masks in fresh_tokens (counted on the host)
    carry: Carry | None = None
    output: tuple[int, ...] = ()

    @property
    def rid(self) -> str:
        """The request id (`spec.request_id`)."""
        return self.spec.request_id

    @property
    def has_block(self) -> bool:
        """Whether a current block is under way: freshly started or carried."""
        return self.fresh_tokens is not None or self.carry is not None

    def next_digest(self, block: Sequence[int]) -> bytes:
        """The prefix digest of the next block (its tokens `block`, spec ids), chained onto
        the last committed block's (`spec.prefix_cache.chain`)."""
        return chain(self.digests[-1] if self.digests else ROOT, block)

    @property
    def generated(self) -> list[int]:
        """The committed spec ids past the prompt (a new list), not yet cut at EOS or
        `max_new_tokens`: whole blocks are committed."""
        return self.committed_spec[len(self.spec.prompt) :]
