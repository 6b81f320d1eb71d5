"""The profiles of Vidur's five replica schedulers: what each supports and promises.

Facts read from vidur 0.0.25 `vidur/scheduler/replica_scheduler/*.py` (file:line cited) and
confirmed by running the classes:

- all five are FCFS over one request queue (`_request_queue.pop(0)`) with no priorities, no
  token threshold and no null block (the adapter names Vidur's counted blocks itself);
- vLLM (`vllm_replica_scheduler.py`): never chunks a prompt (`_get_request_next_num_q_tokens`
  gives the whole prefill); a batch is prefill-only or decode-only (`if requests: return
  Batch` at :118 before the decode loop); budget `max_tokens_in_batch` (:96); a decode that
  cannot get its block restarts the latest-arrived pending request (`pop(-1)`, :126-135);
- Sarathi (`sarathi_replica_scheduler.py`): always chunks (`chunk_size`, :101-112), decodes
  first, then running prefills, then new requests; a request restarted in this step sits at
  the head of the queue and may be admitted again in the same batch (:196-224):
  `admit_after_preemption`;
- Orca (`orca_replica_scheduler.py`) and FasterTransformer
  (`faster_transformer_replica_scheduler.py`): reserve `_max_blocks_per_sequence` blocks per
  request at admission (:37-40 / :58-61), have no token budget (every pending request decodes,
  every new one prefills whole) and never preempt; FasterTransformer admits a new batch only
  when no earlier batch has requests left (`_preempted_batches` first, :43-45): static batches;
- LightLLM (`lightllm_replica_scheduler.py`): token-level KV (`assert block_size == 1`, :17),
  admission by peak memory (`_can_allocate_request`, :48-62), never preempts (it raises
  "OOM handling not implemented yet", :144).
"""

from __future__ import annotations

from spec.ar.config import ArRules, Policy, VictimOrder
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile

FCFS_ONLY = frozenset({Policy.FCFS})

VLLM = ArProfile(
    space=ArConfigSpace(policies=FCFS_ONLY, chunked_prefill=frozenset({False})),
    policy=ArPolicy(rules=ArRules()),
)
SARATHI = ArProfile(
    space=ArConfigSpace(policies=FCFS_ONLY, chunked_prefill=frozenset({True})),
    policy=ArPolicy(rules=ArRules(admit_after_preemption=True)),
)
ORCA = ArProfile(
    space=ArConfigSpace(policies=FCFS_ONLY, chunked_prefill=frozenset({False})),
    policy=ArPolicy(rules=ArRules(victim=VictimOrder.NONE, token_budget=False)),
)
FT = ArProfile(
    space=ArConfigSpace(policies=FCFS_ONLY, chunked_prefill=frozenset({False})),
    policy=ArPolicy(
        rules=ArRules(victim=VictimOrder.NONE, token_budget=False, static_batches=True)
    ),
)
LIGHTLLM = ArProfile(
    space=ArConfigSpace(
        policies=FCFS_ONLY, block_sizes=frozenset({1}), chunked_prefill=frozenset({False})
    ),
    policy=ArPolicy(rules=ArRules(victim=VictimOrder.NONE)),
)

PROFILES: dict[str, ArProfile] = {
    "vllm": VLLM,
    "sarathi": SARATHI,
    "orca": ORCA,
    "lightllm": LIGHTLLM,
    "ft": FT,
}

__all__ = ["FT", "LIGHTLLM", "ORCA", "PROFILES", "SARATHI", "VLLM"]
