"""The named rules of the AR scheduling specification, in words.

An `ArSpecMachine` violation names one of these. The core rules hold for every implementation;
the policy rules hold as the implementation declares them in its `ArRules`.
"""

from __future__ import annotations

from types import MappingProxyType

_AR_RULES: dict[str, str] = {
    # --- requests
    "unique_submission": "A request id is submitted at most once.",
    "valid_request": "Only valid requests are accepted (sizes >= 1, prompt + max_tokens <= "
    "max_model_len, the request fits the usable KV pool alone).",
    "known_request": "Events refer to requests that were submitted and are not finished or "
    "aborted.",
    "lifecycle": "Every phase change follows the AR request and block lifecycle tables.",
    # --- one step
    "token_budget": "The tokens scheduled in one step sum to at most max_num_batched_tokens.",
    "seat_cap": "At most max_num_seqs requests are running at once.",
    "one_schedule_per_step": "A request is scheduled at most once per step, for >= 1 token.",
    "no_compute_past_known": "A request is never scheduled more tokens than it has known and "
    "not yet computed (prompt + sampled outputs - computed).",
    "no_chunking_when_disabled": "With chunked prefill off, a request is scheduled all its "
    "uncomputed tokens at once.",
    "long_prefill_threshold": "With long_prefill_token_threshold > 0, no request is scheduled "
    "more tokens than the threshold in one step (unless the implementation exempts a lone "
    "request, as vLLM 0.33 does: nothing else running or waiting).",
    "full_sequence_admission": "Where the implementation gates admission on the whole "
    "sequence (vLLM's scheduler_reserve_full_isl), a waiting request is admitted only when "
    "blocks for all its known tokens fit the free blocks.",
    "admission_watermark": "Admission leaves at least the declared watermark of free blocks "
    "(Vidur's watermark_blocks_fraction).",
    "progress": "A step with running or waiting requests schedules at least one token.",
    "step_order": "Steps are numbered 0, 1, 2, ... in order.",
    # --- KV blocks
    "kv_covers_scheduled": "A scheduled request holds KV blocks for its computed tokens plus "
    "the tokens it computes this step (blocks * block_size >= computed + scheduled).",
    "kv_covers_computed": "Between steps every running request holds KV blocks for every token "
    "it has computed.",
    "kv_bounded": "A request never holds more blocks than max_model_len needs.",
    "kv_exclusive": "Allocated blocks were free (cached ones included: allocating one evicts "
    "it) and are in the pool; a block has one holder unless prefix caching shares it through "
    "a cache hit.",
    "null_block_reserved": "The null block (block 0, when reserved) is never allocated.",
    "block_conservation": "free + referenced = usable blocks at every moment (each block once, "
    "whatever its reference count; the null block reserved); a block's holders are exactly "
    "the requests whose block tables list it (its reference count).",
    # --- prefix caching
    "cache_hit_enabled": "Cache hits happen only with prefix caching on.",
    "cache_hit_cached": "A cache hit takes cached blocks whose content is the request's own "
    "prefix, block i holding its tokens up to (i + 1) * block_size: it never claims a block "
    "that is not cached, or that caches other content.",
    "cache_hit_bounded": "A cache hit covers at most the request's known tokens less one (the "
    "last token is always computed, to sample from).",
    "evict_unreferenced_only": "Only cached blocks that no request references are evicted.",
    "refcount_matches": "Between steps the implementation's reference count of every block "
    "equals the number of requests holding it (no reference leaked or lost).",
    "free_owned_only": "Only blocks the request holds are freed, each once (no double free).",
    "waiting_holds_nothing": "Between steps a waiting request holds no KV block.",
    # --- preemption
    "preempt_frees_all": "A preempted request gives back every block it held, at once, and "
    "recomputes from zero.",
    "preempted_holds_nothing": "A preempted request holds no KV block and no computed token; "
    "where the implementation re-admits after preempting (Vidur's Sarathi), the re-admission "
    "may allocate to it in the same scheduling phase, and between steps it holds nothing.",
    "no_preempt_scheduled": "A request already scheduled in this step is not preempted in it "
    "(vLLM #23347 / #21528: preempting it leaves its tokens in the batch).",
    "preemption_victim": "The victim is the declared one, among running requests not scheduled "
    "in this step: the tail of running, i.e. the latest admitted (FCFS), or the lowest "
    "priority then latest arrival (priority); or, where declared (vLLM 0.33's priority "
    "policy), the lowest priority among all running requests, a scheduled one then "
    "unscheduled with its tokens returned to the budget.",
    "no_admission_after_preemption": "A step that preempted admits no waiting request (vLLM), "
    "unless the implementation declares otherwise.",
    "soft_preemption": "Under soft preemption (priority-soft) a waiting request never causes "
    "a preemption: a running request is preempted only when the free blocks cannot hold one "
    "more token of some running request not yet scheduled in this step, and a step that "
    "preempted allocates no block to and admits no waiting request. A high-priority arrival "
    "therefore waits for a seat and blocks to free up, and is then admitted ahead of "
    "lower-priority waiting requests (policy_admission).",
    # --- admission order
    "fcfs_admission": "A waiting request is admitted only from the head of the waiting queue "
    "(submission order; preempted requests at the head).",
    "waiting_order": "The implementation's waiting queue has the spec's order (FCFS).",
    "policy_admission": "Under priority / SJF / SRPT / LAS, the admitted request minimises the "
    "policy key (ties: earliest arrival).",
    "aging_bound": "Once a waiting request has waited max_wait_steps steps, no other waiting "
    "request is admitted before it.",
    "static_batch": "A static-batch scheduler admits only when no request of an earlier batch is "
    "running (a new batch forms when the previous one is entirely done).",
    "token_fairness_floor": "Every running request is scheduled at least one token per step "
    "when the budget holds one token per running request.",
    "token_fairness_cap": "No request is scheduled more than the per-request token cap in one "
    "step.",
    # --- end of a request
    "finish_condition": "A request finishes only when it produced max_tokens (LENGTH) or "
    "sampled its end token (STOP), with the matching reason.",
    "finish_released": "A request whose finish condition holds is finished in the step that "
    "produced its last token.",
    "terminal_holds_nothing": "A finished or aborted request holds no KV block.",
    # --- cross-checks
    "snapshot_matches": "Between steps the implementation's own pool, running set, waiting set "
    "and computed-token counts equal the abstract state.",
}

AR_RULES: MappingProxyType[str, str] = MappingProxyType(_AR_RULES)


def describe(rule: str) -> str:
    """The rule's statement in words; KeyError for an unknown rule name."""
    return AR_RULES[rule]
