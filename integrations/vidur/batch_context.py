"""The attention context a Vidur batch records for each request it schedules, checked as the AR
rule `batch_context`.

Vidur's `Batch` lists, beside each request's tokens for the batch (`num_q_tokens`), its
attention context (`num_kv_tokens`), and its execution-time predictor pairs the two lists with
`zip` to time the batch's attention. The event log has no such field, so the adapters check the
record itself, right after the scheduler formed the batch, against the count the kind declares
(`CONTEXT_OF`); Vidur's own kinds count it two ways:

- `Count.WITH_BATCH` (vLLM, Sarathi, Orca, FasterTransformer, LightLLM): the tokens Vidur counts
  processed before the batch plus the batch's tokens (`request.num_processed_tokens +
  next_num_q_tokens`). Vidur counts a request's first output as processed when its prefill ends,
  so a decode's context is one above the tokens whose KV it reads and writes: declared, as
  counted;
- `Count.BEFORE_BATCH` (Mnemosyne): the tokens processed before the batch, split over the
  KV-parallel groups holding them (their sum is checked); with sequence pipeline parallelism a
  prefill's count is its stage-processed tokens (`_get_num_processed_tokens`).

A list shorter or longer than the batch's requests breaks the rule first (Orca's finding: it
lists none for a request it admits).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from spec.ar.rules import ArRule
from spec.errors import SpecViolation


class Count(enum.Enum):
    """How a kind counts a request's attention context in a batch."""

    WITH_BATCH = "the tokens processed before the batch plus the batch's tokens"
    BEFORE_BATCH = "the tokens processed before the batch"


CONTEXT_OF: dict[str, Count] = {
    "vllm": Count.WITH_BATCH,
    "sarathi": Count.WITH_BATCH,
    "orca": Count.WITH_BATCH,
    "lightllm": Count.WITH_BATCH,
    "ft": Count.WITH_BATCH,
    "mnemosyne": Count.BEFORE_BATCH,
}


def check_batch_context(
    batch: Any, kind: str, scheduler: Any, name_of: Callable[[Any], str]
) -> None:
    """Raise `SpecViolation` `batch_context` unless each group of `batch` (a Mnemosyne
    `KVParallelBatch` has one per KV-parallel group, another batch is its own) lists one
    context per request, and each request's contexts sum to the count `CONTEXT_OF[kind]`
    declares; call it before the batch runs (the counts read the requests' processed tokens).
    `name_of(request)`: how the message names a Vidur request."""
    count = CONTEXT_OF[kind]
    mapping = getattr(batch, "batch_mapping", None)
    groups = list(mapping.items()) if mapping is not None else [(None, batch)]
    contexts: dict[Any, int] = {}
    tokens: dict[Any, int] = {}
    for group_id, group in groups:
        requests, q, kv = list(group.requests), list(group.num_q_tokens), list(group.num_kv_tokens)
        if len(kv) != len(requests):
            where = "" if group_id is None else f" (KV-parallel group {group_id})"
            unlisted = ", ".join(name_of(r) for r in requests[len(kv) :]) or "none"
            raise SpecViolation(
                ArRule.BATCH_CONTEXT,
                f"Vidur's batch{where} schedules {len(requests)} request"
                f"{'s' if len(requests) != 1 else ''} ({len(q)} q-token entries) but records "
                f"{len(kv)} attention context{'s' if len(kv) != 1 else ''} (Batch.num_kv_tokens); "
                f"past the last context: {unlisted}. Vidur's time predictor pairs the lists with "
                "zip, so it leaves those requests' attention out of the batch's time",
            )
        for request, n, context in zip(requests, q, kv, strict=True):
            contexts[request] = contexts.get(request, 0) + context
            tokens.setdefault(request, n)
    for request, context in contexts.items():
        processed = _processed(request, scheduler, count)
        expected = processed + tokens[request] if count is Count.WITH_BATCH else processed
        if context != expected:
            summed = " summed over its KV-parallel groups" if mapping is not None else ""
            raise SpecViolation(
                ArRule.BATCH_CONTEXT,
                f"{name_of(request)} is scheduled {tokens[request]} token"
                f"{'s' if tokens[request] != 1 else ''} with an attention context of {context}"
                f"{summed} (Batch.num_kv_tokens), where {kind}'s count, {count.value}, is "
                f"{expected} ({processed} processed"
                + (f" + {tokens[request]}" if count is Count.WITH_BATCH else "")
                + "): Vidur's time predictor reads that context",
            )


def _processed(request: Any, scheduler: Any, count: Count) -> int:
    """The tokens Vidur counts processed before the batch, as the kind's batch formation reads
    them: under `Count.BEFORE_BATCH` (Mnemosyne's `_get_num_processed_tokens`) with sequence
    pipeline parallelism on, a prefill's stage-processed tokens."""
    staged = getattr(scheduler, "is_sequence_pipeline_parallel_enabled", False)
    if count is Count.BEFORE_BATCH and staged and not request.is_prefill_stage_complete:
        return int(request.num_stage_processed_tokens)
    return int(request.num_processed_tokens)
