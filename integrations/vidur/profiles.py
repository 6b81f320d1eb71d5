"""The profiles of Vidur's replica schedulers checked here: what each supports and promises.

Facts read from vidur 0.0.25 `vidur/scheduler/replica_scheduler/*.py` (file:line cited) and
confirmed by running the classes:

- vLLM, Sarathi, Orca, LightLLM and FasterTransformer are FCFS over one request queue
  (`_request_queue.pop(0)`) with no priorities, no token threshold and no null block (the
  adapter names Vidur's counted blocks itself);
- vLLM (`vllm_replica_scheduler.py`): never chunks a prompt (`_get_request_next_num_q_tokens`
  gives the whole prefill); a batch is prefill-only or decode-only (`if requests: return
  Batch` at :103 before the decode loop); budget `max_tokens_in_batch` (:85); a decode demands
  one free block, needed or not (`_can_allocate_request`, :43-44), and while none is free
  restarts the latest-arrived pending request (`pop(-1)`, :117-120), or itself when it is the
  last, leaving the batch empty: vLLM v0's `can_append_slot` and recompute, which the profile
  declares (`preemption_may_empty_step`);
- Sarathi (`sarathi_replica_scheduler.py`): always chunks (`chunk_size`, :114), decodes
  first, then running prefills, then new requests; a request restarted in this step sits at
  the head of the queue (:155-158) and may be admitted again in the same batch (:196):
  `admit_after_preemption`;
- Orca (`orca_replica_scheduler.py`) and FasterTransformer
  (`faster_transformer_replica_scheduler.py`): reserve `_max_blocks_per_sequence` blocks per
  request at admission (:38-43 / :55-59), have no token budget (every pending request decodes,
  every new one prefills whole) and never preempt; FasterTransformer admits a new batch only
  when no earlier batch has requests left (`_preempted_batches` first, :43): static batches;
  FasterTransformer frees a batch's memory when the whole batch has ended (`on_batch_end`,
  :13-18; FasterTransformer keeps one KV cache per batch), which its profile declares
  (`free_at_batch_end`);
- LightLLM (`lightllm_replica_scheduler.py`): token-level KV (`assert block_size == 1`, :17),
  admission by peak memory (`_can_allocate_request`, :48-62, LightLLM's own formula: the peak
  strictly below the pool, a queued request counted as prompt + 1), never preempts (it raises
  "OOM handling not implemented yet", :160); its space keeps to pools of max_model_len + 1
  tokens at least, where every request is one LightLLM's router accepts (it refuses prompt +
  max_new_tokens + 1 > pool, which Vidur does not);
- Mnemosyne, FCFS with a fixed chunk (`mnemosyne_fcfs_fixed_chunk_replica_scheduler.py` on
  `mnemosyne_base_replica_scheduler.py`, both releases): its queue holds (arrival, request)
  pairs sorted by arrival; it forms decodes first (`_add_running_decodes`), restarting victims
  from the tail of its decode queue `_preempted_requests` or the request itself
  (`_ensure_can_append_slot`): `VictimOrder.LAST_DECODING`; then admits prefills in the same
  batch (`admit_after_preemption`), allocating a request's whole prompt and skipping up to
  `MAX_NUM_SKIPPED_REQUESTS` = 10 requests it cannot admit: the loop stops when it has
  skipped 10, so it admits past at most 9 (`fcfs_lookahead=9`).
"""

from __future__ import annotations

import dataclasses

from spec.ar.config import ArRules, Policy, VictimOrder
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile

# Every Vidur replica scheduler: FCFS, one pipeline stage stepped here, no prefix cache, no
# long-prefill threshold; Vidur's default watermark (`watermark_blocks_fraction=0.01`,
# config.py:279) is passed to the vLLM and Sarathi classes and declared.
_SPACE = ArConfigSpace(
    policies=frozenset({Policy.FCFS}),
    chunked_prefill=frozenset({False}),
    prefix_caching=frozenset({False}),
    long_prefill_threshold=False,
    stages=frozenset({1}),
)
WATERMARK_FRACTION = 0.01
# mnemosyne_base_replica_scheduler.py: `_add_prefill_requests` reads a request only while it
# has skipped fewer than MAX_NUM_SKIPPED_REQUESTS = 10, so an admitted one has at most 9 ahead
MNEMOSYNE_LOOKAHEAD = 9

# a decode demands a free block, needed or not, and restarts its request when none is
# (vllm_replica_scheduler.py:43-44, :117-125): vLLM v0's `can_append_slot`, declared
VLLM_RULES = ArRules(preemption_may_empty_step=True)
VLLM = ArProfile(
    space=_SPACE,
    policy=ArPolicy(rules=VLLM_RULES, watermark_fraction=WATERMARK_FRACTION),
)
SARATHI = ArProfile(
    space=dataclasses.replace(_SPACE, chunked_prefill=frozenset({True})),
    # a restarted request goes back to the head of the queue and the same batch admits from
    # there (sarathi_replica_scheduler.py:155-158, :196)
    policy=ArPolicy(
        rules=ArRules(), admit_after_preemption=True, watermark_fraction=WATERMARK_FRACTION
    ),
)
ORCA = ArProfile(
    space=dataclasses.replace(_SPACE, pool_holds_max_model_len=True),
    policy=ArPolicy(rules=ArRules(victim=VictimOrder.NONE, token_budget=False)),
)
FT = ArProfile(
    space=dataclasses.replace(_SPACE, pool_holds_max_model_len=True),
    policy=ArPolicy(
        rules=ArRules(
            victim=VictimOrder.NONE,
            token_budget=False,
            static_batches=True,
            # one KV cache per batch, freed when the whole batch has ended (on_batch_end, :13-18)
            free_at_batch_end=True,
        )
    ),
)
# LightLLM's router refuses a request with prompt + max_new_tokens + 1 > its pool
# (`httpserver/manager.py`, `req_total_len + 1 > self.total_token_num`), which Vidur's copy of
# its admission (the strict `<` and a queued request counted as prompt + 1, :42 and :62, both
# LightLLM's own) relies on: the space keeps to pools where every request is one LightLLM takes
LIGHTLLM = ArProfile(
    space=dataclasses.replace(
        _SPACE, block_sizes=frozenset({1}), pool_holds_max_model_len=True, pool_spare_tokens=1
    ),
    policy=ArPolicy(rules=ArRules(victim=VictimOrder.NONE)),
)

MNEMOSYNE = ArProfile(
    space=dataclasses.replace(_SPACE, chunked_prefill=frozenset({True})),
    policy=ArPolicy(
        rules=ArRules(
            victim=VictimOrder.LAST_DECODING,
            admit_after_preemption=True,
            fcfs_lookahead=MNEMOSYNE_LOOKAHEAD,
        ),
        watermark_fraction=WATERMARK_FRACTION,
    ),
)

PROFILES: dict[str, ArProfile] = {
    "vllm": VLLM,
    "sarathi": SARATHI,
    "orca": ORCA,
    "lightllm": LIGHTLLM,
    "ft": FT,
    "mnemosyne": MNEMOSYNE,
}

__all__ = [
    "FT",
    "LIGHTLLM",
    "ORCA",
    "PROFILES",
    "SARATHI",
    "VLLM",
    "VLLM_RULES",
    "WATERMARK_FRACTION",
]
