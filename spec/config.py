"""Scheduler configuration and request descriptions, validated on construction.

Invalid values raise `ConfigError` (field, value, what is valid); invalid requests raise a
`RequestError` subclass. Validation never allocates or changes anything.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass

from spec.errors import (
    ConfigError,
    EmptyPrompt,
    InvalidRequest,
    PromptTooLong,
    RequestTooLarge,
)
from spec.events import Submitted


class Mode(enum.Enum):
    """How the worker hands control back to the scheduler."""

    SYNC = "sync"  # loop forward→step until every block of the batch is done
    FDFO = "fdfo"  # one forward→step per round; done blocks leave at once

    @classmethod
    def parse(cls, value: str | Mode) -> Mode:
        """The mode named `value` (any case), or `value` itself; else a `ConfigError`."""
        if isinstance(value, Mode):
            return value
        if not isinstance(value, str):
            raise ConfigError("mode", value, "one of 'sync', 'fdfo' (a string or a Mode)")
        try:
            return cls(value.lower())
        except ValueError:
            raise ConfigError("mode", value, "one of 'sync', 'fdfo'") from None


# Sizes are token/slot indices, int32 in every engine's index tensors.
MAX_SIZE = 2**31 - 1
# What the spec machine and the reference keep per KV slot (owner table entry, free-set and
# snapshot entries), in bytes: the basis of the memory estimate that refuses absurd pools.
BYTES_PER_SLOT = 100
BYTES_PER_ROW_TOKEN = 8


def _positive(field: str, value: int, limit: int | None = MAX_SIZE) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, value, "must be an integer >= 1")
    if limit is not None and value > limit:
        raise ConfigError(field, value, f"must be an integer >= 1 and <= {limit}")


def _token_id(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_SIZE:
        raise ConfigError(field, value, f"must be an integer token id in [-{MAX_SIZE}, {MAX_SIZE}]")


def machine_memory_bytes() -> int | None:
    """Physical memory of this machine, or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n: int) -> str:
    """`n` bytes in GiB, three digits; in integer arithmetic past what a float holds (a pool
    of a 320-digit page count must be refused in words, not by an OverflowError)."""
    if n < 2**1000:
        return f"{n / 2**30:.3g} GiB"
    digits = str(n // 2**30)
    return f"{digits[0]}.{digits[1:3]}e+{len(digits) - 1} GiB"


@dataclass(frozen=True, slots=True)
class DllmConfig:
    """Configuration of a block-diffusion scheduler.

    Sizes:
        block_size: tokens per diffusion block (>= 1).
        page_size: tokens per KV page; a positive multiple of block_size so that every block
            lies whole inside one page (SGLang forces the same).
        kv_pages: pages in the KV pool (>= 1); the pool has kv_pages * page_size slots.
        req_pool_rows: rows of the request pool (request-to-token table), >= 1.
        max_running_requests: requests in the running batch at once, >= 1. Either may be the
            smaller: a request is admitted only while both a seat and a free row remain.
        max_context: tokens per request (prompt + output, whole blocks), a multiple of
            block_size.
    Policy:
        mode: sync or fdfo.
        in_place_reuse: an unfinished FDFO block keeps its row and KV slots across rounds
            (fdfo only).
        reloop: under FDFO, run forward→step again without returning to the scheduler while no
            block of the batch finished (fdfo only).
    Token conventions:
        mask_token_id: the id of the mask token in block contents.
        eos_token_id: the end-of-sequence id; None disables EOS finishing.
    Prefix cache:
        prefix_cache: committed blocks may be kept in a cache keyed by content (a request's
            tokens from position 0 through the block's end) and read by requests whose tokens
            start the same (SGLang's radix cache, on for dLLMs unless `--disable-radix-cache`;
            events `KvCached`, `CacheHit`, `CacheReleased`, `CacheEvicted`). Cached slots are
            neither free nor owned by a request; an unread cached block may be evicted.
    """

    block_size: int = 4
    page_size: int = 4
    kv_pages: int = 16
    req_pool_rows: int = 4
    max_running_requests: int = 4
    max_context: int = 64
    mode: Mode = Mode.FDFO
    in_place_reuse: bool = True
    reloop: bool = False
    mask_token_id: int = -1
    eos_token_id: int | None = None
    prefix_cache: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "page_size", "req_pool_rows"):
            _positive(name, getattr(self, name))
        _positive("kv_pages", self.kv_pages, limit=None)  # bounded by the memory estimate
        _positive("max_running_requests", self.max_running_requests)
        _positive("max_context", self.max_context)
        if self.page_size % self.block_size != 0:
            raise ConfigError(
                "page_size",
                self.page_size,
                f"must be a positive multiple of block_size={self.block_size} "
                f"(e.g. {self.block_size} or {2 * self.block_size}) so every block lies whole "
                f"inside one page",
            )
        if self.max_context % self.block_size != 0:
            lo = max(self.block_size, self.max_context - self.max_context % self.block_size)
            raise ConfigError(
                "max_context",
                self.max_context,
                f"must be a multiple of block_size={self.block_size} (e.g. {lo})",
            )
        if not isinstance(self.mode, Mode):
            object.__setattr__(self, "mode", Mode.parse(self.mode))
        for name in ("in_place_reuse", "reloop", "prefix_cache"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "must be True or False")
        if self.mode is Mode.SYNC and self.in_place_reuse:
            raise ConfigError(
                "in_place_reuse",
                True,
                "only meaningful under mode='fdfo' (sync blocks never span rounds); "
                "set in_place_reuse=False or mode='fdfo'",
            )
        if self.mode is Mode.SYNC and self.reloop:
            raise ConfigError(
                "reloop",
                True,
                "only meaningful under mode='fdfo' (sync already loops until all blocks are "
                "done); set reloop=False or mode='fdfo'",
            )
        _token_id("mask_token_id", self.mask_token_id)
        if self.eos_token_id is not None:
            _token_id("eos_token_id", self.eos_token_id)
            if self.eos_token_id == self.mask_token_id:
                raise ConfigError(
                    "eos_token_id",
                    self.eos_token_id,
                    f"must differ from mask_token_id={self.mask_token_id} (a masked position "
                    f"would read as end of sequence), or be None",
                )
        self._check_memory()

    def memory_estimate(self) -> int:
        """Bytes the spec machine and the reference need for these pools (an estimate)."""
        return (
            self.kv_pages * self.page_size * BYTES_PER_SLOT
            + self.req_pool_rows * self.max_context * BYTES_PER_ROW_TOKEN
        )

    def _check_memory(self) -> None:
        need = self.memory_estimate()
        have = machine_memory_bytes()
        if have is not None and need > have:
            raise ConfigError(
                "kv_pages",
                self.kv_pages,
                f"these pools need about {_gib(need)} ({self.kv_pages * self.page_size} KV "
                f"slots x {BYTES_PER_SLOT} B + {self.req_pool_rows} rows x {self.max_context} "
                f"tokens x {BYTES_PER_ROW_TOKEN} B) but this machine has {_gib(have)}: "
                f"use fewer pages",
            )
        if self.kv_pages * self.page_size > MAX_SIZE:
            raise ConfigError(
                "kv_pages",
                self.kv_pages,
                f"kv_pages * page_size = {self.kv_pages * self.page_size} slots exceeds "
                f"{MAX_SIZE} (int32 slot indices)",
            )

    @property
    def kv_slots(self) -> int:
        """Total KV slots (tokens) in the pool."""
        return self.kv_pages * self.page_size

    @property
    def blocks_per_page(self) -> int:
        """Diffusion blocks per KV page (the page size is a multiple of the block size)."""
        return self.page_size // self.block_size

    def replace(self, **changes: object) -> DllmConfig:
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def solo_sync(self) -> DllmConfig:
        """The batch-size-1 synchronous configuration that defines a request's parity output
        (without a prefix cache: a hit reads KV the request would compute itself)."""
        return self.replace(
            mode=Mode.SYNC,
            max_running_requests=1,
            in_place_reuse=False,
            reloop=False,
            prefix_cache=False,
        )


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A generation request: prompt token ids and the number of tokens to generate.

    `stop_token_ids`: token ids other than the EOS that end the request like the EOS, with
    reason STOP (distinct ids >= 0, neither the EOS nor the mask token).
    `stop_sampled`: the request also stops on a condition the spec cannot evaluate (a stop
    string, say); its `Submitted` event says so and it may finish with reason STOP.
    `ignore_eos`: no token ends the request, neither the EOS nor a stop token id (it runs to
    max_new_tokens, or a sampled STOP), and its output is not cut after one.
    `priority`: its place in the queue of an implementation whose policy orders by priority
    (`DllmPolicy.priority_order`): a lower value is admitted first, submission order breaking
    ties (vLLM's convention, and SGLang's with `--schedule-low-priority-values-first`). Any
    integer; an implementation that admits in submission order ignores it."""

    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    stop_sampled: bool = False
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    priority: int = 0

    def submitted(self) -> Submitted:
        """The `Submitted` event of this request, as an implementation that accepts it
        emits it: every field as given."""
        return Submitted(
            self.request_id,
            tuple(self.prompt),
            self.max_new_tokens,
            stop_sampled=self.stop_sampled,
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids),
            priority=self.priority,
        )

    @classmethod
    def of(cls, event: Submitted) -> RequestSpec:
        """The request `event` submitted, every field as the event gives it (the inverse of
        `submitted`)."""
        return cls(
            event.request_id,
            tuple(event.prompt),
            event.max_new_tokens,
            stop_sampled=event.stop_sampled,
            ignore_eos=event.ignore_eos,
            stop_token_ids=tuple(event.stop_token_ids),
            priority=event.priority,
        )


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What a valid request will occupy: whole blocks, never more than this."""

    prompt_blocks: int  # blocks that hold only prompt tokens (one forward each)
    total_blocks: int  # prompt blocks + output blocks, worst case
    total_tokens: int  # total_blocks * block_size
    pages: int  # KV pages needed at most


def request_shape(config: DllmConfig, prompt_len: int, max_new_tokens: int) -> RequestShape:
    """The whole-block footprint of a request with the given sizes (no validation)."""
    b = config.block_size
    total_blocks = -(-(prompt_len + max_new_tokens) // b)
    total_tokens = total_blocks * b
    return RequestShape(
        prompt_blocks=prompt_len // b,
        total_blocks=total_blocks,
        total_tokens=total_tokens,
        pages=-(-total_tokens // config.page_size),
    )


def validate_stop_token_ids(config: DllmConfig, rid: str, ids: object) -> None:
    """Raise InvalidRequest unless `ids` are valid `stop_token_ids` of request `rid`: a
    sequence of distinct token ids >= 0, neither the EOS nor the mask token."""
    if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)):
        raise InvalidRequest(
            rid, "stop_token_ids", type(ids).__name__, "a sequence of token ids (a tuple of ints)"
        )
    seen: set[int] = set()
    for tok in ids:
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise InvalidRequest(rid, "stop_token_ids", tok, "token ids must be integers >= 0")
        if tok in (config.mask_token_id, config.eos_token_id):
            name = "mask token" if tok == config.mask_token_id else "EOS, which ends it already"
            raise InvalidRequest(
                rid, "stop_token_ids", tok, f"cannot list the {name} (valid: other token ids)"
            )
        if tok in seen:
            raise InvalidRequest(rid, "stop_token_ids", tok, "is listed twice (list each once)")
        seen.add(tok)


def validate_request(config: DllmConfig, request: RequestSpec) -> RequestShape:
    """Check a request against the configuration; return its footprint.

    Raises EmptyPrompt, InvalidRequest, PromptTooLong or RequestTooLarge. Never changes state.
    """
    rid = request.request_id
    if not isinstance(rid, str) or not rid:
        raise InvalidRequest(str(rid), "request_id", rid, "must be a non-empty string")
    prompt = request.prompt
    if not isinstance(prompt, Sequence) or isinstance(prompt, (str, bytes)):
        raise InvalidRequest(
            rid, "prompt", type(prompt).__name__, "a sequence of token ids (a tuple of ints)"
        )
    if len(prompt) == 0:
        raise EmptyPrompt(rid)
    for tok in request.prompt:
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise InvalidRequest(rid, "prompt", tok, "token ids must be integers >= 0")
        if tok == config.mask_token_id:
            raise InvalidRequest(
                rid, "prompt", tok, f"the mask token id {config.mask_token_id} cannot be a prompt"
            )
    if (
        isinstance(request.max_new_tokens, bool)
        or not isinstance(request.max_new_tokens, int)
        or request.max_new_tokens < 1
    ):
        raise InvalidRequest(rid, "max_new_tokens", request.max_new_tokens, "must be >= 1")
    for flag in ("stop_sampled", "ignore_eos"):
        value = getattr(request, flag)
        if not isinstance(value, bool):
            raise InvalidRequest(rid, flag, value, "must be true or false")
    validate_stop_token_ids(config, rid, request.stop_token_ids)
    if isinstance(request.priority, bool) or not isinstance(request.priority, int):
        raise InvalidRequest(rid, "priority", request.priority, "must be an integer")
    shape = request_shape(config, len(request.prompt), request.max_new_tokens)
    if shape.total_tokens > config.max_context:
        raise PromptTooLong(rid, shape.total_tokens, config.max_context)
    if shape.pages * config.page_size > config.kv_slots:
        raise RequestTooLarge(rid, shape.pages * config.page_size, config.kv_slots)
    return shape
