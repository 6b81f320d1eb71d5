"""The AR event vocabulary: what an autoregressive scheduler reports, in order.

Every event is a frozen, slotted dataclass with a stable `kind` (JSON Lines traces). A step is:

    scheduling phase   ArCacheHit (prefix caching: an admitted request takes cached blocks),
                       ArBlocksAllocated, ArScheduled (tokens for one request this step),
                       ArPreempted (with every block it held), ArCacheEvicted
    model execution    ArStepEnd (each scheduled request computes its tokens; a request that
                       caught up with its known tokens samples one output token)
    update phase       ArDraftsVerified, ArOutputTokens (optional: the ids of the outputs the
                       step produced), ArBlocksFreed, ArFinished, ArDraftsProposed (optional:
                       the drafts proposed for a request's next step)

`ArSubmitted` and `ArAborted` (with the frees it causes) happen between steps, and so does
`ArAwaiting` (optional: a request submitted in the same gap may not be admitted yet); its
`ArReady` comes between steps or in a step's admission pass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar


class ArFinishReason(enum.Enum):
    """Why an AR request finished."""

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
    prompt: tuple[int, ...] | None = None  # token ids, for prefix caching (None: unshared)
    # The log's writer cannot know when the model will sample the end token (a live engine's
    # log): the request may finish with reason STOP right after any step in which it produced
    # an output token. `stop_after` is then None (the two are exclusive).
    stop_sampled: bool = False
    # The most leading tokens a cache hit may give it (`ArRequest.cache_read_limit`; None:
    # unbounded; 0: it skips reading the prefix cache).
    cache_read_limit: int | None = None
    # Its LoRA adapter (`ArRequest.lora`; None: the base model).
    lora: int | None = None


@dataclass(frozen=True, slots=True)
class ArCacheHit:
    """Prefix caching: the waiting request takes a reference to `blocks`, cached full blocks
    holding its prefix (block i holds its tokens [i * block_size, (i + 1) * block_size)); its
    computed tokens jump to len(blocks) * block_size. Comes right before its admission
    (`ArBlocksAllocated` for the rest of the chunk, then `ArScheduled`) in the same step."""

    kind: ClassVar[str] = "ar_cache_hit"
    request_id: str
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArCacheEvicted:
    """Prefix caching: the cached content of `blocks` (each free: no request holds it) is
    dropped. Allocating a free cached block evicts it implicitly; this event is for evictions
    that happen otherwise (an engine's cache reset)."""

    kind: ClassVar[str] = "ar_cache_evicted"
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArBlocksAllocated:
    """KV `blocks` (ids) now belong to the request, appended to its block table."""

    kind: ClassVar[str] = "ar_blocks_allocated"  # fresh blocks (free, evicted if cached)
    request_id: str
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArScheduled:
    """The request computes `num_tokens` tokens in this step (a waiting request is admitted).

    `drafts` (speculative decoding, `ArConfig.num_speculative_tokens`): the last `drafts` of
    those tokens are draft tokens after the request's known ones, which the step verifies;
    the step end counts them computed, and `ArDraftsVerified` rolls back those rejected."""

    kind: ClassVar[str] = "ar_scheduled"
    request_id: str
    num_tokens: int
    drafts: int = 0


@dataclass(frozen=True, slots=True)
class ArPreempted:
    """A running request was preempted: every block it held (`freed`) went back to the pool,
    its computed tokens are discarded (recompute from zero) and it waits again at the head of
    the queue.

    `reset`: preempted by an operator's cache reset between steps, not by the scheduler's
    choice (vLLM's `reset_prefix_cache(reset_running_requests=True)`, which a pause for a
    weight update calls: it preempts every running request, last first, so they wait in their
    running order, then `ArCacheReset`). Outside any schedule phase; no victim rule applies."""

    kind: ClassVar[str] = "ar_preempted"
    request_id: str
    freed: tuple[int, ...]
    reset: bool = False


@dataclass(frozen=True, slots=True)
class ArBlocksFreed:
    """The request dropped its references to these KV blocks; a block left with no holder is
    free again (with prefix caching: cached, its content still hittable)."""

    kind: ClassVar[str] = "ar_blocks_freed"
    request_id: str
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArFinished:
    """The request finished for `reason`; it holds no block from now on."""

    kind: ClassVar[str] = "ar_finished"
    request_id: str
    reason: ArFinishReason


@dataclass(frozen=True, slots=True)
class ArAborted:
    """The client aborted the request between steps; it holds no block from now on."""

    kind: ClassVar[str] = "ar_aborted"
    request_id: str


@dataclass(frozen=True, slots=True)
class ArAwaiting:
    """The request just submitted may not be admitted until its `ArReady`: an input it needs
    is not ready (`what`; vLLM: "grammar", a structured-output grammar still compiling, its
    status `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`). Optional, between steps, in the gap of the
    request's `ArSubmitted`. While it awaits, the request is not admitted and every admission
    rule passes over it (its place in the queue is kept); it may be aborted."""

    kind: ClassVar[str] = "ar_awaiting"
    request_id: str
    what: str


@dataclass(frozen=True, slots=True)
class ArReady:
    """Between steps: the awaiting request's input is ready, and it may be admitted from now
    on (vLLM: its grammar has compiled). With `in_step`: the step's admission pass promoted
    it (vLLM's waiting pass reached it with its grammar compiled, after the cache-aware
    reorder, which does not move a request before its promotion; never in a step that
    preempted, nor while paused); for a request still awaiting, this is also where its input
    is ready, at the pass's start. `in_step` starts the step's schedule phase and its
    admission pass if nothing has."""

    kind: ClassVar[str] = "ar_ready"
    request_id: str
    in_step: bool = False


@dataclass(frozen=True, slots=True)
class ArInputFailed:
    """Between steps: the awaiting request's input will never be ready (vLLM: its grammar
    failed to compile). It stays awaiting; the first admission pass that reaches it (one that
    admits a request after it in the pass's order, or finds nothing to admit with nothing
    running) ends it: `ArAborted` in that step's update phase, as vLLM ends it with an
    error."""

    kind: ClassVar[str] = "ar_input_failed"
    request_id: str


#: The scheduler's pause states (vLLM's `PauseState`, lower case): scheduling as usual; only
#: requests that run (or hold KV) are scheduled, none admitted; nothing is scheduled.
AR_PAUSE_STATES = ("unpaused", "paused_new", "paused_all")


@dataclass(frozen=True, slots=True)
class ArPauseSet:
    """An operator set the scheduler's pause state between steps (`AR_PAUSE_STATES`; vLLM's
    `set_pause_state`, which `pause_scheduler` calls around a weight update). Under
    "paused_new" a step admits no request (vLLM also admits a waiting request that holds KV,
    which no AR log has); under "paused_all" it schedules nothing."""

    kind: ClassVar[str] = "ar_pause_set"
    state: str


@dataclass(frozen=True, slots=True)
class ArCacheReset:
    """An operator emptied the prefix cache between steps, with no block referenced (vLLM's
    `reset_prefix_cache`, after new weights: what was cached is stale). With
    `reset_running_requests` vLLM first preempts every running request (`ArPreempted` with
    `reset`, each), then resets."""

    kind: ClassVar[str] = "ar_cache_reset"


@dataclass(frozen=True, slots=True)
class ArStepEnd:
    """The model ran step `step_index` over every request scheduled in it."""

    kind: ClassVar[str] = "ar_step_end"
    step_index: int


@dataclass(frozen=True, slots=True)
class ArDraftsVerified:
    """After the step that scheduled the request's drafts, before the next step is scheduled:
    `accepted` of them became output tokens, after the token the step sampled (each accepted
    draft is the model's own next token); the rest are rejected, and the request's computed
    tokens lose them (vLLM's `update_from_output`: `num_computed_tokens -= num_rejected`,
    and fewer still where a stop or max_tokens cut the step's tokens short). The KV the
    rejected drafts wrote stays allocated, to be overwritten."""

    kind: ClassVar[str] = "ar_drafts_verified"
    request_id: str
    accepted: int


@dataclass(frozen=True, slots=True)
class ArDraftsProposed:
    """Optional, between steps (after the update phase that verified the request's last
    drafts): the drafter proposed `drafts` draft tokens (1 to `num_speculative_tokens`) for
    the running, decoding request's next step (vLLM's `update_draft_token_ids`, after a
    grammar kept those it allows). The next step that schedules the request schedules at most
    these, fewer where its tokens are cut short (the budget, the long-prefill threshold,
    `max_model_len`); a preemption drops them, and a proposal replaces the one before. Once a
    log names one proposal it names them all: a draft scheduled beyond what was proposed
    breaks `speculative_drafts`. A decision twin replays them (`properties.ar.decisions`)."""

    kind: ClassVar[str] = "ar_drafts_proposed"
    request_id: str
    drafts: int


@dataclass(frozen=True, slots=True)
class ArOutputTokens:
    """In the update phase of the step that produced them (after its `ArDraftsVerified`): the
    token ids of the request's next `len(tokens)` outputs, in order, after those earlier
    `ArOutputTokens` of it named (a log names each output once, in its step's update phase, or
    never). Optional: an output no event names is private to its request. A named output
    keys the prefix-cache blocks holding it (and, with `ArPolicy.hash_lookahead_tokens`, the
    blocks before it) by its id, as a prompt token is: a later request whose prompt continues
    the request's prompt and outputs (a conversation's next turn) may then hit those blocks,
    as vLLM's hits do."""

    kind: ClassVar[str] = "ar_output_tokens"
    request_id: str
    tokens: tuple[int, ...]


ArEvent = (
    ArSubmitted
    | ArCacheHit
    | ArCacheEvicted
    | ArBlocksAllocated
    | ArScheduled
    | ArPreempted
    | ArBlocksFreed
    | ArFinished
    | ArAborted
    | ArPauseSet
    | ArCacheReset
    | ArStepEnd
    | ArDraftsVerified
    | ArDraftsProposed
    | ArOutputTokens
    | ArAwaiting
    | ArReady
    | ArInputFailed
)

AR_EVENT_TYPES: tuple[type[ArEvent], ...] = (
    ArSubmitted,
    ArCacheHit,
    ArCacheEvicted,
    ArBlocksAllocated,
    ArScheduled,
    ArPreempted,
    ArBlocksFreed,
    ArFinished,
    ArAborted,
    ArPauseSet,
    ArCacheReset,
    ArStepEnd,
    ArDraftsVerified,
    ArDraftsProposed,
    ArOutputTokens,
    ArAwaiting,
    ArReady,
    ArInputFailed,
)

AR_EVENT_BY_KIND: dict[str, type[ArEvent]] = {t.kind: t for t in AR_EVENT_TYPES}
