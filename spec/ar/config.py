"""Autoregressive (AR) scheduler configuration, requests and declared policy rules.

`ArConfig` validates on construction and raises `spec.errors.ConfigError(field, value, valid)`.
`ArRequest` describes one generation request by sizes only (AR scheduling never needs token
values); `validate_ar_request` rejects what no scheduler could ever serve with a typed
`spec.errors.RequestError`. `ArRules` is what an implementation *promises* about its ordering
decisions (admission order, preemption victim, ...); the core rules (token budget, seats, KV
accounting) hold for every implementation regardless.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from spec.errors import ConfigError, InvalidRequest, RequestError, RequestTooLarge


class Policy(enum.Enum):
    """Which waiting request a scheduler admits first (and, for priority, which it preempts)."""

    FCFS = "fcfs"  # submission order; preempted requests go back to the head of the queue
    PRIORITY = "priority"  # lowest priority value first, then earliest arrival (vLLM)
    # priority admission with soft preemption: a high-priority arrival never evicts the KV of
    # running requests; it is admitted (ahead of lower-priority waiting requests) once a seat
    # and blocks free up; a running request is preempted only when no block is free for the
    # next token of a running request.
    PRIORITY_SOFT = "priority-soft"
    SJF = "sjf"  # shortest job first: prompt + known or predicted output length
    SRPT = "srpt"  # shortest remaining processing time: job length - computed tokens
    LAS = "las"  # least attained service: fewest tokens computed so far
    AGING = "aging"  # SJF, but a request that waited max_wait_steps steps goes first
    FAIR = "fair"  # FCFS admission; every running request gets >= 1 token per step, <= cap

    @classmethod
    def parse(cls, value: str | Policy) -> Policy:
        """The policy named `value` (any case), or `value` itself; else a `ConfigError` listing
        the valid names."""
        if isinstance(value, Policy):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            valid = ", ".join(repr(p.value) for p in cls)
            raise ConfigError("policy", value, f"one of {valid}") from None


# Upper bounds: sizes a CPU checker can hold (a pool of 10**12 blocks would exhaust memory
# long before a check ran); generous against every real engine configuration.
MAX_BLOCKS = 10_000_000
MAX_TOKENS = 100_000_000
MAX_SMALL = 1_000_000


def _positive(field: str, value: object, minimum: int = 1, maximum: int = MAX_TOKENS) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(field, value, f"must be an integer in [{minimum}, {maximum}]")


def _flag(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(field, value, "must be True or False")


@dataclass(frozen=True, slots=True)
class ArConfig:
    """Configuration of an autoregressive, iteration-level scheduler (vLLM / Vidur style).

    KV cache:
        block_size: tokens per KV block (>= 1).
        num_blocks: blocks in the pool (>= 1); with reserve_null_block the first block (id 0)
            is vLLM's null block, never handed to a request, so usable = num_blocks - 1.
    Per step:
        max_num_batched_tokens: the token budget of one step (>= 1, >= max_num_seqs).
        max_num_seqs: the seat cap: requests in the running set at once (>= 1).
        long_prefill_token_threshold: 0 = off; else a prefill chunk is at most this long.
        enable_chunked_prefill: a prompt may be split across steps; when False a prefill is
            scheduled whole, so the budget must hold a whole request (>= max_model_len).
    Requests:
        max_model_len: prompt + max_tokens of any request (>= 2).
    Policy:
        policy: see `Policy`.
        max_wait_steps: aging bound (policy AGING, >= 1).
        fair_token_cap: per-request tokens per step under policy FAIR (0 = no cap).
        max_waiting_iters: LightLLM's decode steps before it must try a prefill batch.
    Topology:
        num_stages: pipeline stages of a replica (one batch per stage in flight).
        num_replicas: replicas behind a global scheduler.
    Prefix caching:
        enable_prefix_caching: full KV blocks are cached by content and shared, with reference
            counts, by requests with the same prefix (vLLM's `enable_prefix_caching`, on by
            default in vLLM 0.33); a cache hit makes computed tokens jump (`ArCacheHit`).
    Speculative decoding:
        num_speculative_tokens: the most draft tokens one step of a request verifies (vLLM's
            `num_speculative_tokens`; 0 = none). A decode step then schedules the request's
            last token and up to this many drafts after it (`ArScheduled.drafts`); the
            drafts the model rejects are rolled back (`ArDraftsVerified`).
        num_lookahead_tokens: KV slots a scheduled request holds past the tokens its step
            computes, for a drafter's own KV (vLLM's `num_lookahead_tokens`: k for EAGLE and a
            draft model, 0 for ngram and without drafts), within `max_model_len`: its blocks
            cover min(computed + scheduled + this, max_model_len) tokens (`kv_covers_scheduled`).
        num_drafting_slots: input rows the drafter adds to the batch per scheduled request
            (vLLM's `max_num_new_slots_for_drafting`: 1 for a draft model, 0 for ngram and
            EAGLE): a step's tokens plus this many per scheduled request stay within
            `max_num_batched_tokens` (`token_budget`).
    LoRA adapters:
        max_loras: the most LoRA adapters the running requests use at once (vLLM's
            `max_loras`; 0: no request names one). A waiting request whose adapter none of
            them uses while they use this many cannot be admitted; admission passes over it
            (`lora_slots`). With prefix caching a block is cached under its request's adapter
            as vLLM keys it: the same tokens under another adapter are other content.
    """

    block_size: int = 4
    num_blocks: int = 17
    reserve_null_block: bool = True
    max_num_batched_tokens: int = 16
    max_num_seqs: int = 4
    max_model_len: int = 32
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    policy: Policy = Policy.FCFS
    max_wait_steps: int = 8
    fair_token_cap: int = 0
    max_waiting_iters: int = 4
    num_stages: int = 1
    num_replicas: int = 1
    enable_prefix_caching: bool = False
    num_speculative_tokens: int = 0
    num_lookahead_tokens: int = 0
    num_drafting_slots: int = 0
    max_loras: int = 0

    def __post_init__(self) -> None:
        _positive("block_size", self.block_size, 1, MAX_SMALL)
        _flag("reserve_null_block", self.reserve_null_block)
        _positive("num_blocks", self.num_blocks, 2 if self.reserve_null_block else 1, MAX_BLOCKS)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("max_num_seqs", self.max_num_seqs, 1, MAX_SMALL)
        _positive("max_model_len", self.max_model_len, 2)
        _positive("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        _flag("enable_chunked_prefill", self.enable_chunked_prefill)
        if not isinstance(self.policy, Policy):
            object.__setattr__(self, "policy", Policy.parse(self.policy))
        _positive("max_wait_steps", self.max_wait_steps, 1, MAX_SMALL)
        _positive("fair_token_cap", self.fair_token_cap, 0)
        _positive("max_waiting_iters", self.max_waiting_iters, 1, MAX_SMALL)
        _positive("num_stages", self.num_stages, 1, 1024)
        _positive("num_replicas", self.num_replicas, 1, 1024)
        _flag("enable_prefix_caching", self.enable_prefix_caching)
        _positive("num_speculative_tokens", self.num_speculative_tokens, 0, MAX_SMALL)
        _positive("num_lookahead_tokens", self.num_lookahead_tokens, 0, MAX_SMALL)
        _positive("num_drafting_slots", self.num_drafting_slots, 0, MAX_SMALL)
        _positive("max_loras", self.max_loras, 0, MAX_SMALL)
        if self.num_drafting_slots >= self.max_num_batched_tokens:
            raise ConfigError(
                "num_drafting_slots",
                self.num_drafting_slots,
                f"below max_num_batched_tokens={self.max_num_batched_tokens}, so a scheduled "
                "request has room for a token beside its drafting slots",
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                "max_num_batched_tokens",
                self.max_num_batched_tokens,
                f"must be >= max_num_seqs={self.max_num_seqs} so every running request can "
                f"decode in one step (vLLM's own check)",
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                "max_num_batched_tokens",
                self.max_num_batched_tokens,
                f"must be >= max_model_len={self.max_model_len} when chunked prefill is off "
                f"(a whole prefill must fit one step), or set enable_chunked_prefill=True",
            )
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise ConfigError(
                "long_prefill_token_threshold",
                self.long_prefill_token_threshold,
                "needs enable_chunked_prefill=True (it limits prefill chunks); use 0",
            )

        if self.policy is Policy.FAIR and self.fair_token_cap and not self.enable_chunked_prefill:
            raise ConfigError(
                "fair_token_cap",
                self.fair_token_cap,
                "a per-request token cap chunks prefills: needs enable_chunked_prefill=True, "
                "or use 0",
            )

    @property
    def usable_blocks(self) -> int:
        """Blocks a request can ever hold: the pool less the reserved null block."""
        return self.num_blocks - (1 if self.reserve_null_block else 0)

    @property
    def null_block(self) -> int | None:
        """Block 0 when the pool reserves a null block (vLLM), else None."""
        return 0 if self.reserve_null_block else None

    @property
    def max_blocks_per_request(self) -> int:
        """Blocks that hold `max_model_len` tokens: the most one request can ever hold."""
        return -(-self.max_model_len // self.block_size)

    def blocks_for(self, tokens: int) -> int:
        """KV blocks that hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    def replace(self, **changes: object) -> ArConfig:
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ArRequest:
    """A generation request, by sizes.

    prompt_len: prompt tokens (>= 1).
    max_tokens: output tokens at most (>= 1): the request finishes with reason LENGTH there.
    stop_after: the (scripted) model samples the end token as output token number
        `stop_after` (1-based): the request finishes with reason STOP then. None: never.
    priority: lower value = more important (vLLM's convention); used by policy PRIORITY.
    predicted_len: a predicted output length for SJF / SRPT (None: use max_tokens).
    arrival_time: seconds, for traces and metrics; the order of arrival is submission order.
    prompt: the prompt's token ids (len == prompt_len), or None. Only prefix caching looks at
        them: requests whose prompts share a prefix may share its full KV blocks. None means a
        prompt shared with no other request.
    cache_read_limit: the most leading tokens a prefix-cache hit may give the request, or None
        (unbounded). 0: it reads nothing from the cache (vLLM's `skip_reading_prefix_cache`);
        s > 0: it scores its prompt from row s on, so every later row must be computed by its
        own forwards (vLLM 0.34's `prompt_logprob_start`, its `prefix_cache_hit_limit`).
        Drawn only for implementations whose profile declares it
        (`ArConfigSpace.cache_read_limits`).
    lora: its LoRA adapter (an id >= 1), or None for the base model; only where the
        configuration serves adapters (`ArConfig.max_loras` > 0).
    outputs: the ids of its first outputs, as the scripted model samples them (at most
        max_tokens), or None: every output private to the request. A scheduler with prefix
        caching keys the blocks holding them by these ids and names them
        (`ArOutputTokens`), so a later request whose prompt continues the prompt and outputs
        (a conversation's next turn) may hit those blocks; a decision twin replaying a log
        gets the ids the log named (`properties.ar.decisions.operations`).
    """

    request_id: str
    prompt_len: int
    max_tokens: int
    stop_after: int | None = None
    priority: int = 0
    predicted_len: int | None = None
    arrival_time: float = 0.0
    prompt: tuple[int, ...] | None = None
    cache_read_limit: int | None = None
    lora: int | None = None
    outputs: tuple[int, ...] | None = None

    @property
    def expected_output(self) -> int:
        """The output length a scheduler may plan with: `predicted_len`, else `max_tokens`."""
        return self.max_tokens if self.predicted_len is None else self.predicted_len

    @property
    def final_output(self) -> int:
        """Output tokens the request will produce when it runs to its end."""
        if self.stop_after is None:
            return self.max_tokens
        return min(self.max_tokens, self.stop_after)


class ArRequestTooLong(RequestError):
    """prompt_len + max_tokens exceeds max_model_len."""

    def __init__(self, request_id: str, needed_tokens: int, max_model_len: int) -> None:
        self.request_id = request_id
        self.needed_tokens = needed_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"request {request_id!r} needs {needed_tokens} tokens (prompt_len + max_tokens) but "
            f"max_model_len is {max_model_len}: shorten the prompt or lower max_tokens"
        )


def _int_field(rid: str, name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidRequest(rid, name, value, f"must be an integer >= {minimum}")


def validate_ar_request(config: ArConfig, request: ArRequest) -> int:
    """Check a request against the configuration; return the KV blocks it needs at most.

    Raises InvalidRequest, ArRequestTooLong or RequestTooLarge (it could never fit in the KV
    pool, even alone: it would be preempted forever). Never changes state.
    """
    rid = request.request_id
    if not isinstance(rid, str) or not rid:
        raise InvalidRequest(str(rid), "request_id", rid, "must be a non-empty string")
    _int_field(rid, "prompt_len", request.prompt_len, 1)
    _int_field(rid, "max_tokens", request.max_tokens, 1)
    if request.stop_after is not None:
        _int_field(rid, "stop_after", request.stop_after, 1)
    if request.predicted_len is not None:
        _int_field(rid, "predicted_len", request.predicted_len, 1)
    if isinstance(request.priority, bool) or not isinstance(request.priority, int):
        raise InvalidRequest(rid, "priority", request.priority, "must be an integer")
    if request.cache_read_limit is not None:
        _int_field(rid, "cache_read_limit", request.cache_read_limit, 0)
    if request.lora is not None:
        _int_field(rid, "lora", request.lora, 1)
        if not config.max_loras:
            raise InvalidRequest(
                rid,
                "lora",
                request.lora,
                "no adapter (the base model): the configuration serves none (max_loras=0)",
            )
    if request.prompt is not None and (
        not isinstance(request.prompt, tuple)
        or len(request.prompt) != request.prompt_len
        or any(isinstance(t, bool) or not isinstance(t, int) for t in request.prompt)
    ):
        raise InvalidRequest(
            rid, "prompt", request.prompt, f"None or a tuple of {request.prompt_len} int token ids"
        )
    if request.outputs is not None and (
        not isinstance(request.outputs, tuple)
        or len(request.outputs) > request.max_tokens
        or any(isinstance(t, bool) or not isinstance(t, int) for t in request.outputs)
    ):
        raise InvalidRequest(
            rid,
            "outputs",
            request.outputs,
            f"None or a tuple of at most {request.max_tokens} int token ids (max_tokens)",
        )
    total = request.prompt_len + request.max_tokens
    if total > config.max_model_len:
        raise ArRequestTooLong(rid, total, config.max_model_len)
    # The KV a request holds at most: every token but the last sampled one is computed.
    blocks = config.blocks_for(total - 1)
    if blocks > config.usable_blocks:
        raise RequestTooLarge(
            rid, blocks * config.block_size, config.usable_blocks * config.block_size
        )
    return blocks


class AdmissionOrder(enum.Enum):
    """Which waiting request may be admitted next (`ArRules.admission`): the head of the queue
    (FCFS), or the least key, ties to the earlier arrival."""

    FCFS = "fcfs"  # the head of the waiting queue
    PRIORITY = "priority"  # min (priority, arrival)
    SJF = "sjf"  # min (prompt + expected output, arrival)
    SRPT = "srpt"  # min (prompt + expected output - computed, arrival)
    LAS = "las"  # min (attained service, arrival)


class VictimOrder(enum.Enum):
    """Which running request may be preempted when a running request needs a block that is
    not free (`ArRules.victim`)."""

    NONE = "none"  # never preempts
    TAIL = "tail"  # the tail of running: latest admitted, not scheduled this step (FCFS)
    # max (priority, arrival) among running requests not scheduled in this step
    LOWEST_PRIORITY = "lowest_priority"
    # max (priority, arrival) among ALL running requests, including one already scheduled in
    # this step, which is then unscheduled and its tokens returned to the budget (vLLM 0.33's
    # priority policy, `Scheduler.schedule`: the victim is `max(self.running, key=...)`; when it
    # is in `scheduled_running_reqs` it is removed there and its tokens given back).
    LOWEST_PRIORITY_ANY = "lowest_priority_any"
    # the request that started decoding last (its prefill completed latest) among running
    # requests whose prefill is complete, not scheduled in this step; one still in its prefill
    # is never a victim (Vidur's Mnemosyne: `_ensure_can_append_slot` takes victims from the
    # tail of its decode queue, `_preempted_requests`, else restarts the request itself)
    LAST_DECODING = "last_decoding"


@dataclass(frozen=True, slots=True)
class ArRules:
    """The ordering rules an implementation promises (checked by `ArSpecMachine`).

    admission: which waiting request may be admitted next.
    victim: which running request may be preempted.
    admit_after_preemption: whether a step that preempted may still admit waiting requests
        (vLLM: no; Vidur's Sarathi: yes).
    token_budget: whether the step's token budget binds (Vidur's Orca and FasterTransformer
        have none).
    static_batches: admission only when nothing runs (FasterTransformer).
    max_wait_steps: aging bound: once a waiting request has waited this many steps, no other
        waiting request is admitted before it (None: no bound).
    token_floor: every running request gets at least one token each step (when the budget
        holds one per running request).
    token_cap: a request is scheduled at most this many tokens per step (None: no cap).
    soft_preemption: a waiting request never causes a preemption: a step that preempted
        allocates nothing to and admits no waiting request, and a running request is preempted
        only when the free blocks cannot hold one more token of some running request not yet
        scheduled in this step (rule `soft_preemption`).
    fcfs_lookahead: FCFS with look-ahead (admission FCFS only; None: strict FCFS). A waiting
        request may be admitted with at most this many waiting requests ahead of it, each of
        which does not fit: its known tokens need more blocks than the pool had free above
        the watermark when it was passed over. The waiting queue is then in arrival order (a
        preempted request returns to its arrival place). Vidur's Mnemosyne schedulers read at most
        `MAX_NUM_SKIPPED_REQUESTS` = 10 requests they cannot admit, so they admit past at most
        9 (look-ahead 9), and allocate a request's whole prompt when they admit it.
    preemption_may_empty_step: a step whose preemptions, each made while no block was free,
        left nothing running may schedule nothing (rule `progress` waives that step only; the
        next one has nothing running to preempt, and is held to it). vLLM v0's block manager decodes
        a request only while a block is free for every running one, needed or not
        (`BlockSpaceManager.can_append_slot`, vllm 0.2.7 `vllm/core/block_manager.py`), and
        otherwise preempts by recompute, the request itself when it runs alone, which then
        waits at the head of the queue for the next step, since a step that preempted admits
        nothing (`vllm/core/scheduler.py`); Vidur's vLLM scheduler copies it.
    free_at_batch_end: a finished request of a static batch may keep its blocks while another
        request of its batch still runs, and frees them by the end of the update phase in
        which the batch's last request finishes or is aborted (rule `terminal_holds_nothing`
        is read then, between steps, and when a new static batch is admitted, an abort in
        the middle of a step included; `static_batches` only). FasterTransformer keeps one
        KV cache per batch for the batch's life; Vidur's FasterTransformer scheduler frees a
        batch's memory in `on_batch_end` once all its requests completed.
    """

    admission: AdmissionOrder = AdmissionOrder.FCFS
    victim: VictimOrder = VictimOrder.TAIL
    admit_after_preemption: bool = False
    token_budget: bool = True
    static_batches: bool = False
    max_wait_steps: int | None = None
    token_floor: bool = False
    token_cap: int | None = None
    soft_preemption: bool = False
    fcfs_lookahead: int | None = None
    preemption_may_empty_step: bool = False
    free_at_batch_end: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.admission, AdmissionOrder):
            valid = ", ".join(a.value for a in AdmissionOrder)
            raise ConfigError("rules.admission", self.admission, f"one of {valid}")
        if not isinstance(self.victim, VictimOrder):
            valid = ", ".join(v.value for v in VictimOrder)
            raise ConfigError("rules.victim", self.victim, f"one of {valid}")
        for name in (
            "admit_after_preemption",
            "token_budget",
            "static_batches",
            "token_floor",
            "soft_preemption",
            "preemption_may_empty_step",
            "free_at_batch_end",
        ):
            _flag(f"rules.{name}", getattr(self, name))
        for name in ("max_wait_steps", "token_cap", "fcfs_lookahead"):
            value = getattr(self, name)
            if value is not None:
                _positive(f"rules.{name}", value, 1, MAX_SMALL)
        if self.free_at_batch_end and not self.static_batches:
            raise ConfigError(
                "rules.free_at_batch_end",
                self.free_at_batch_end,
                "False unless static_batches is True (a batch-end hold is a static batch's)",
            )
        if self.fcfs_lookahead is not None and self.admission is not AdmissionOrder.FCFS:
            raise ConfigError(
                "rules.fcfs_lookahead",
                self.fcfs_lookahead,
                f"None under admission {self.admission.value} (a look-ahead is FCFS's)",
            )


def rules_for(config: ArConfig) -> ArRules:
    """The rules a vLLM-v1-style scheduler promises under `config.policy`."""
    p = config.policy
    if p is Policy.PRIORITY:
        return ArRules(AdmissionOrder.PRIORITY, VictimOrder.LOWEST_PRIORITY)
    if p is Policy.PRIORITY_SOFT:
        return ArRules(AdmissionOrder.PRIORITY, VictimOrder.LOWEST_PRIORITY, soft_preemption=True)
    if p is Policy.SJF:
        return ArRules(AdmissionOrder.SJF)
    if p is Policy.SRPT:
        return ArRules(AdmissionOrder.SRPT)
    if p is Policy.LAS:
        return ArRules(AdmissionOrder.LAS)
    if p is Policy.AGING:
        return ArRules(AdmissionOrder.SJF, max_wait_steps=config.max_wait_steps)
    if p is Policy.FAIR:
        return ArRules(token_floor=True, token_cap=config.fair_token_cap or None)
    return ArRules()
