"""The named rules of the AR scheduling specification, in words.

An `ArSpecMachine` violation names one of these (`ArRule`, a `StrEnum`: a member compares and
hashes equal to its string, so `violation.rule == "progress"` keeps working). The core rules
hold for every implementation; the policy rules hold as the implementation declares them in
its `ArPolicy` (ordering rules and options).
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType


class ArRule(StrEnum):
    """Every rule name of the AR spec. A member equals (and hashes like) its string."""

    UNIQUE_SUBMISSION = "unique_submission"
    VALID_REQUEST = "valid_request"
    KNOWN_REQUEST = "known_request"
    LIFECYCLE = "lifecycle"
    TOKEN_BUDGET = "token_budget"
    SEAT_CAP = "seat_cap"
    ONE_SCHEDULE_PER_STEP = "one_schedule_per_step"
    NO_COMPUTE_PAST_KNOWN = "no_compute_past_known"
    NO_CHUNKING_WHEN_DISABLED = "no_chunking_when_disabled"
    LONG_PREFILL_THRESHOLD = "long_prefill_threshold"
    FULL_SEQUENCE_ADMISSION = "full_sequence_admission"
    ADMISSION_WATERMARK = "admission_watermark"
    PREFILL_CADENCE = "prefill_cadence"
    PROGRESS = "progress"
    PAUSE = "pause"
    CACHE_RESET = "cache_reset"
    SPECULATIVE_DRAFTS = "speculative_drafts"
    OUTPUT_TOKENS = "output_tokens"
    AWAITING = "awaiting"
    LORA_SLOTS = "lora_slots"
    ADMISSION_PROGRESS = "admission_progress"
    STEP_ORDER = "step_order"
    KV_COVERS_SCHEDULED = "kv_covers_scheduled"
    KV_COVERS_COMPUTED = "kv_covers_computed"
    KV_BOUNDED = "kv_bounded"
    KV_EXCLUSIVE = "kv_exclusive"
    NULL_BLOCK_RESERVED = "null_block_reserved"
    BLOCK_CONSERVATION = "block_conservation"
    CACHE_HIT_ENABLED = "cache_hit_enabled"
    CACHE_HIT_CACHED = "cache_hit_cached"
    CACHE_HIT_BOUNDED = "cache_hit_bounded"
    CACHE_HIT_LONGEST = "cache_hit_longest"
    EVICT_UNREFERENCED_ONLY = "evict_unreferenced_only"
    REFCOUNT_MATCHES = "refcount_matches"
    FREE_OWNED_ONLY = "free_owned_only"
    WAITING_HOLDS_NOTHING = "waiting_holds_nothing"
    PREEMPT_FREES_ALL = "preempt_frees_all"
    PREEMPTED_HOLDS_NOTHING = "preempted_holds_nothing"
    NO_PREEMPT_SCHEDULED = "no_preempt_scheduled"
    PREEMPTION_VICTIM = "preemption_victim"
    NO_ADMISSION_AFTER_PREEMPTION = "no_admission_after_preemption"
    SOFT_PREEMPTION = "soft_preemption"
    FCFS_ADMISSION = "fcfs_admission"
    WAITING_ORDER = "waiting_order"
    POLICY_ADMISSION = "policy_admission"
    AGING_BOUND = "aging_bound"
    STATIC_BATCH = "static_batch"
    TOKEN_FAIRNESS_FLOOR = "token_fairness_floor"
    TOKEN_FAIRNESS_CAP = "token_fairness_cap"
    FINISH_CONDITION = "finish_condition"
    FINISH_RELEASED = "finish_released"
    TERMINAL_HOLDS_NOTHING = "terminal_holds_nothing"
    SNAPSHOT_MATCHES = "snapshot_matches"
    BATCH_CONTEXT = "batch_context"
    TWIN_DECISIONS = "twin_decisions"
    IMPLEMENTATION_ERROR = "implementation_error"


_AR_RULES: dict[ArRule, str] = {
    # --- requests
    ArRule.UNIQUE_SUBMISSION: "A request id is submitted at most once.",
    ArRule.VALID_REQUEST: "Only valid requests are accepted (sizes >= 1, prompt + max_tokens <= "
    "max_model_len, the request fits the usable KV pool alone).",
    ArRule.KNOWN_REQUEST: "Events refer to requests that were submitted and are not finished or "
    "aborted.",
    ArRule.LIFECYCLE: "Every phase change follows the AR request and block lifecycle tables.",
    # --- one step
    ArRule.TOKEN_BUDGET: "The tokens scheduled in one step sum to at most max_num_batched_tokens, "
    "with a drafter's input rows (num_drafting_slots per scheduled request) counted beside them.",
    ArRule.SEAT_CAP: "At most max_num_seqs requests are running at once.",
    ArRule.ONE_SCHEDULE_PER_STEP: "A request is scheduled at most once per step, for >= 1 token.",
    ArRule.NO_COMPUTE_PAST_KNOWN: "A request is never scheduled more tokens than it has known and "
    "not yet computed (prompt + sampled outputs - computed).",
    ArRule.NO_CHUNKING_WHEN_DISABLED: "With chunked prefill off, a request is scheduled all its "
    "uncomputed tokens at once.",
    ArRule.LONG_PREFILL_THRESHOLD: "With long_prefill_token_threshold > 0, no request is scheduled "
    "more tokens than the threshold in one step (unless the implementation exempts a lone "
    "request, as vLLM 0.33 does: nothing else running or waiting; where declared, as vLLM's "
    "adaptive threshold, the threshold is floored at max_num_batched_tokens // (running + "
    "waiting requests)).",
    ArRule.FULL_SEQUENCE_ADMISSION: "Where the implementation gates admission on the whole "
    "sequence (vLLM's scheduler_reserve_full_isl), a waiting request is admitted only when "
    "blocks for all its known tokens fit the free blocks, above the watermark where one binds.",
    ArRule.ADMISSION_WATERMARK: "Admission leaves at least the declared watermark of free blocks "
    "(Vidur's watermark_blocks_fraction, of the usable blocks; or, where declared, vLLM's "
    "watermark: of the whole pool, binding only while another request runs).",
    ArRule.PREFILL_CADENCE: "Where the implementation declares a prefill interval N > 1 "
    "(vLLM's prefill_schedule_interval), a step held by the cadence carries no prefill: no "
    "running request's next chunk while it is still in its prefill, and no admission with more "
    "than one token to compute after its cache hit. A step is held when fewer than N executed "
    "steps (steps that schedule a token) separate it from the last one that carried prefill, a "
    "running request decodes, and the last release step (one not held, that preempted nothing) "
    "left no request waiting but deferred ones (vLLM's deferred_waiting, until admitted: a "
    "request awaiting its input since its submission, or one a pass reached and skipped for its "
    "LoRA adapter). A held step that preempted, scheduled nothing yet and has no "
    "decoding request left may lift its hold (nothing else could run in it).",
    ArRule.PROGRESS: "A step with running or waiting requests (an awaiting one not counted) "
    "schedules at least one token "
    "(where declared, vLLM v0's recompute: a step whose preemptions, each made with no block "
    "free, left nothing running may schedule nothing, the next one may not); "
    "every call (submit, abort, a step, drain, snapshot) returns: one still running at the "
    "checker's call deadline is a hang.",
    ArRule.PAUSE: "An operator's pause (`ar_pause_set`, between steps) holds until the next: "
    "under paused_new a step admits no request (running ones go on, and progress asks nothing "
    "of the waiting ones); under paused_all it schedules, allocates and preempts nothing.",
    ArRule.CACHE_RESET: "An operator's cache reset (`ar_cache_reset`, between steps) empties the "
    "prefix cache while no request holds a block; the preemptions that make it so "
    "(`ar_preempted` with `reset`, between steps, each of a request that owes no finish) take "
    "every running request, the last first, and are followed by the reset before the next "
    "step's schedule phase.",
    ArRule.SPECULATIVE_DRAFTS: "Speculative decoding (num_speculative_tokens = k > 0): a step "
    "schedules a request's draft tokens (`ar_scheduled` with `drafts`) only after all its known "
    "tokens, at most k, and none at a position past max_model_len less the token the step "
    "samples (vLLM trims them to fit); the step end counts them computed, and before anything "
    "else happens (the next schedule phase, a pause, a reset or a preemption, a free of its "
    "blocks, its finish) one `ar_drafts_verified` of the running request says how many the "
    "model accepted: at most those drafts, never past max_tokens or the scripted end token. "
    "They are its next outputs, after the token the step sampled (cached like any computed "
    "token); the rejected ones are no longer computed, and their blocks stay held. An "
    "`ar_drafts_proposed` (optional, between steps, after the verifications) names the 1 to k "
    "drafts the drafter proposed for a running request that decodes; once a log names one, a "
    "running request's step schedules at most the drafts proposed since it was last scheduled "
    "or preempted (a waiting request's drafts are the engine's padding of a new decode).",
    ArRule.OUTPUT_TOKENS: "An `ar_output_tokens` event (optional) names the integer ids of "
    "outputs its request produced that no earlier one named, in order, in the update phase of "
    "the step that produced them (after its `ar_drafts_verified`, before the next step is "
    "scheduled): never more than it has produced, never an output of an earlier step. A named "
    "output keys the prefix-cache blocks holding it, and under hash_lookahead_tokens the "
    "blocks before it, by its id, as a prompt token does (blocks cached while it was private "
    "are keyed afresh, held or freed); an output never named is private to its request.",
    ArRule.AWAITING: "An `ar_awaiting` event (optional) names a request submitted in the same "
    "gap between steps, never scheduled, that may not be admitted yet (an input of it is not "
    "ready: vLLM's structured-output grammar still compiling); until an `ar_ready` it gets no "
    "cache hit, block or token, and every admission rule (FCFS order, policy key, aging, "
    "look-ahead, progress) passes over it, its place in the queue kept. An `ar_ready` between "
    "steps says its input is ready; one with in_step says the step's admission pass promoted "
    "it (vLLM's pass reaching it), and for a request still awaiting also that its input is "
    "ready, at the start of the pass, before the first event of a waiting request. Until "
    "promoted or admitted the cache-aware window does not move it, and the prefill cadence's "
    "capacity escape counts it, until admitted, as vLLM counts its deferred requests. An "
    "in_step `ar_ready` comes after the running requests' events, never in a step that "
    "preempts (before or after it) nor while paused (no waiting pass runs there). An "
    "`ar_input_failed` (between steps) says its input will never be ready: the first "
    "admission pass that reaches it (admitting a request after it in the pass's order, or "
    "admitting nothing with nothing running) ends it, `ar_aborted` in that step's update "
    "phase.",
    ArRule.LORA_SLOTS: "With max_loras > 0, a request may name a LoRA adapter (`ar_submitted`'s "
    "lora). The running requests, those admitted in the step included, use at most max_loras "
    "adapters (the base model not counted): a waiting request whose adapter none of them uses "
    "while they use max_loras is not admitted, and every admission rule (FCFS order, policy "
    "key, aging, progress) passes over it, its place in the queue kept (vLLM skips it: "
    "'Scheduling would exceed max_loras'). With prefix caching a block is cached under its "
    "request's adapter (cache_hit_cached).",
    ArRule.ADMISSION_PROGRESS: "Where declared (vLLM's waiting pass, which stops only at a "
    "request it cannot admit), under FCFS or priority: a step that preempted nothing, "
    "unpaused, does not end with the first waiting request the admission rules allow (the "
    "head, or the least policy key, past the requests they pass over: awaiting, or their "
    "adapter finds no room) still waiting if it fits: a seat free, the token budget left "
    "covers all its known tokens (with chunked prefill, one token) plus "
    "num_speculative_tokens (vLLM may pad a one-token request to a draft's length) and a "
    "drafter's input rows, and the free blocks cover the tokens it reaches (all its known "
    "ones; with chunked prefill and no whole-sequence gate, its cache hit and the budget "
    "left, at most all) and num_speculative_tokens and num_lookahead_tokens more, within "
    "max_model_len, above the binding watermark. Not checked beside a prefill cadence, a "
    "look-ahead, static batches, aging, token caps or soft preemption.",
    ArRule.STEP_ORDER: "Steps are numbered 0, 1, 2, ... in order.",
    # --- KV blocks
    ArRule.KV_COVERS_SCHEDULED: "A scheduled request holds KV blocks for its computed tokens plus "
    "the tokens it computes this step (blocks * block_size >= computed + scheduled), and with a "
    "drafter's lookahead slots (num_lookahead_tokens = L) for L tokens more, within "
    "max_model_len (>= min(computed + scheduled + L, max_model_len)). In the "
    "step's schedule phase it frees none of those blocks unless it frees all it holds, leaving "
    "the batch: what its scheduling cached is then uncached (no forward writes it).",
    ArRule.KV_COVERS_COMPUTED: "Between steps every running request holds KV blocks for every "
    "token it has computed. The blocks holding computed tokens go back all at once: a queued "
    "request that gives back what it took (a cache hit included) has computed nothing again; a "
    "running one may then only finish or be aborted; blocks past the computed tokens may go "
    "alone.",
    ArRule.KV_BOUNDED: "A request never holds more blocks than max_model_len needs; with a "
    "drafter's lookahead slots (num_lookahead_tokens = L), a step that allocates to a request "
    "leaves it no more blocks than min(computed + scheduled + L, max_model_len) tokens need.",
    ArRule.KV_EXCLUSIVE: "Allocated blocks were free (cached ones included: allocating one evicts "
    "it) and are in the pool; a block has one holder unless prefix caching shares it through "
    "a cache hit.",
    ArRule.NULL_BLOCK_RESERVED: "The null block (block 0, when reserved) is never allocated.",
    ArRule.BLOCK_CONSERVATION: "free + referenced = usable blocks at every moment (each block "
    "once, whatever its reference count; the null block reserved); a block's holders are exactly "
    "the requests whose block tables list it (its reference count).",
    # --- prefix caching
    ArRule.CACHE_HIT_ENABLED: "Cache hits happen only with prefix caching on.",
    ArRule.CACHE_HIT_CACHED: "A cache hit takes cached blocks whose content is the request's own "
    "prefix, block i holding its tokens up to (i + 1) * block_size under its LoRA adapter (the "
    "same tokens cached under another adapter, or the base model, are other content, as vLLM "
    "hashes the adapter into each block) (where the engine declares "
    "hash_lookahead_tokens = L, and its L tokens after them: such a block is cached once they "
    "are known): it never claims a block "
    "that is not cached, or that caches other content. What a request's scheduling cached is "
    "uncached if it is preempted in that same step: its forward never writes it.",
    ArRule.CACHE_HIT_BOUNDED: "A cache hit covers at most the request's known tokens less one (the "
    "last token is always computed, to sample from), whole blocks within its known tokens less "
    "L under hash_lookahead_tokens = L, and at most its cache_read_limit (0: it "
    "skips reading the cache; s: its prompt is scored from row s on).",
    ArRule.CACHE_HIT_LONGEST: "Where the engine declares longest_cache_hit (vLLM's lookup over "
    "one full-attention group): a request admitted from the queue takes the longest run of "
    "cached blocks holding its prefix that cache_hit_bounded allows, checked before its own "
    "allocation; a shorter hit, or none, is a prefix cache that missed.",
    ArRule.EVICT_UNREFERENCED_ONLY: "Only cached blocks that no request references are evicted.",
    ArRule.REFCOUNT_MATCHES: "Between steps the implementation's reference count of every block "
    "equals the number of requests holding it (no reference leaked or lost).",
    ArRule.FREE_OWNED_ONLY: "Only blocks the request holds are freed, each once (no double free).",
    ArRule.WAITING_HOLDS_NOTHING: "Between steps a waiting request holds no KV block.",
    # --- preemption
    ArRule.PREEMPT_FREES_ALL: "A preempted request gives back every block it held, at once, and "
    "recomputes from zero.",
    ArRule.PREEMPTED_HOLDS_NOTHING: "A preempted request holds no KV block and no computed token; "
    "where the implementation re-admits after preempting (Vidur's Sarathi), the re-admission "
    "may allocate to it in the same scheduling phase, and between steps it holds nothing.",
    ArRule.NO_PREEMPT_SCHEDULED: "A request already scheduled in this step is not preempted in it "
    "(vLLM #23347 / #21528: preempting it leaves its tokens in the batch).",
    ArRule.PREEMPTION_VICTIM: "The victim is the declared one, among running requests not "
    "scheduled in this step: the tail of running, i.e. the latest admitted (FCFS), or the lowest "
    "priority then latest arrival (priority); or, where declared (vLLM 0.33's priority "
    "policy), the lowest priority among all running requests, a scheduled one then "
    "unscheduled with its tokens returned to the budget; or, where declared (Vidur's "
    "Mnemosyne), the one that started decoding last, never one still in its prefill.",
    ArRule.NO_ADMISSION_AFTER_PREEMPTION: "A step that preempted admits no waiting request (vLLM), "
    "unless the implementation declares otherwise.",
    ArRule.SOFT_PREEMPTION: "Under soft preemption (priority-soft) a waiting request never causes "
    "a preemption: a running request is preempted only when the free blocks cannot hold one "
    "more token of some running request not yet scheduled in this step, and a step that "
    "preempted allocates no block to and admits no waiting request. A high-priority arrival "
    "therefore waits for a seat and blocks to free up, and is then admitted ahead of "
    "lower-priority waiting requests (policy_admission).",
    # --- admission order
    ArRule.FCFS_ADMISSION: "A waiting request is admitted only from the head of the waiting queue "
    "(submission order; preempted requests at the head; an awaiting request passed over); "
    "with a declared look-ahead, past at most that many requests, each too large for the "
    "free pool (the queue then in arrival order); with a declared cache-aware window, from "
    "the head of the queue as that window reorders it (vLLM 0.34's "
    "cache_aware_admission_window).",
    ArRule.WAITING_ORDER: "The implementation's waiting queue has the spec's order (FCFS, as a "
    "declared cache-aware window reorders it).",
    ArRule.POLICY_ADMISSION: "Under priority / SJF / SRPT / LAS, the admitted request minimises "
    "the policy key (ties: earliest arrival) among the waiting requests not awaiting.",
    ArRule.AGING_BOUND: "Once a waiting request not awaiting has waited max_wait_steps steps, no "
    "other waiting request is admitted before it.",
    ArRule.STATIC_BATCH: "A static-batch scheduler admits only when no request of an earlier "
    "batch is running (a new batch forms when the previous one is entirely done).",
    ArRule.TOKEN_FAIRNESS_FLOOR: "Every running request is scheduled at least one token per step "
    "when the budget holds one token per running request.",
    ArRule.TOKEN_FAIRNESS_CAP: "No request is scheduled more than the per-request token cap in one "
    "step.",
    # --- end of a request
    ArRule.FINISH_CONDITION: "A request finishes only when it produced max_tokens (LENGTH) or "
    "sampled its end token (STOP), with the matching reason. Where the end token is scripted "
    "(`stop_after`) that is at that output; where the log's engine sampled it "
    "(`stop_sampled`: a live engine cannot know it in advance), STOP is accepted right after a "
    "step in which the request produced an output token, and never with `stop_after` too.",
    ArRule.FINISH_RELEASED: "A request whose finish condition holds is finished in the step that "
    "produced its last token.",
    ArRule.TERMINAL_HOLDS_NOTHING: "A finished or aborted request holds no KV block (where "
    "declared, FasterTransformer's batch-end free: a finished request of a static batch may "
    "keep its blocks while a request of its batch runs, and holds none from the end of the "
    "update phase in which its batch's last request finished or was aborted, nor when a new "
    "static batch is admitted).",
    # --- cross-checks
    ArRule.SNAPSHOT_MATCHES: "Between steps the implementation's own pool, running set, waiting "
    "set and computed-token counts equal the abstract state.",
    ArRule.BATCH_CONTEXT: "Where the implementation records, for the work a step hands to "
    "execution, each scheduled request's attention context (Vidur's `Batch.num_kv_tokens`, "
    "which its execution-time predictor reads), it records one per scheduled request, counted "
    "as its engine declares (the engine's adapter checks the record; the event log carries "
    "none).",
    ArRule.TWIN_DECISIONS: "When a decision twin is declared for the run (another implementation "
    "that must decide alike, such as a re-implementation of an engine's policy), the same "
    "operations schedule the same tokens to the same requests, preempt the same requests in "
    "the same order, give each request as many fresh blocks and finish the same requests, step "
    "by step (spec/ar/decisions.py). A policy the spec states loosely cannot tell a choice "
    "from a miscount; the twin can.",
    # --- the harness
    ArRule.IMPLEMENTATION_ERROR: "The implementation raises nothing but the typed errors of the "
    "adapter contract (an unexpected exception inside the engine is a finding, named with the "
    "program that provoked it).",
}

AR_RULES: MappingProxyType[ArRule, str] = MappingProxyType(_AR_RULES)

_missing = [r for r in ArRule if r not in _AR_RULES]
if _missing:  # pragma: no cover - caught at import by every test
    raise RuntimeError(f"AR rules without a statement: {_missing}")


def describe(rule: str) -> str:
    """The rule's statement in words; KeyError for an unknown rule name."""
    return AR_RULES[ArRule(rule)]
