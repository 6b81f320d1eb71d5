"""Engine-core programs narrowed to where a request can be preempted in the step that
scheduled it, with its blocks still cached when a later request looks them up.

`integrations.vllm.engine_core.core_program` draws from the whole of vLLM's space, and none
of its programs reaches the finding of docs/engines/vllm.md, "A request preempted in the step that
scheduled it stays cached" (3000 and 20,000 programs pass). The finding needs all of:

- the priority policy and prefix caching;
- a lower-priority request ahead of a higher-priority one in the running queue, so it is
  scheduled first in a call: it arrives first, with a long prompt, and is still prefilling in
  chunks (a long-prefill threshold of 2 or 3) when the other decodes;
- a pool of about one request's worst case, so that the later request finds no block and
  preempts the earlier one in the same call;
- the victim's unwritten blocks surviving until a lookup: later requests are few and short
  (they take the freed blocks tail first), and most prompts are prefixes of one shared prompt.

`same_step_program(seed)` draws programs of that shape, still random in every size. Against
vLLM 0.33.0 as released, about 1.3 % of them break `cache_hit_written` (in either loop); with the
candidate fix none does (docs/engines/vllm.md gives the figures and the command).
"""

from __future__ import annotations

import random

from integrations.vllm.engine_core import CoreProgram
from spec.ar.config import ArConfig, ArRequest, Policy


def same_step_config(rnd: random.Random) -> ArConfig:
    """Priority, prefix caching, chunked prefill: blocks of 1 or 2 tokens, a model length of
    8..12 and a pool of one request's worst case plus 0..2 blocks (vLLM's null block besides),
    2 or 3 seats, a budget of 3 or 4 tokens, a long-prefill threshold of 2 or 3."""
    block_size = rnd.choice([1, 2])
    max_model_len = rnd.randint(8, 12)
    one_request = -(-(max_model_len - 1) // block_size)
    return ArConfig(
        block_size=block_size,
        num_blocks=one_request + rnd.randint(0, 2) + 1,
        reserve_null_block=True,
        max_num_batched_tokens=rnd.randint(3, 4),
        max_num_seqs=rnd.randint(2, 3),
        max_model_len=max_model_len,
        long_prefill_token_threshold=rnd.randint(2, 3),
        enable_chunked_prefill=True,
        policy=Policy.PRIORITY,
        enable_prefix_caching=True,
    )


def same_step_program(seed: int) -> CoreProgram:
    """A random program of the shape above: over 2..4 engine steps, first a request with a
    prompt within 3 tokens of the model length and up to 5 output tokens, then one short
    request (1 or 2 prompt tokens, 1 or 2 output tokens) per step, always at the second step,
    at each later one by a coin; priorities fall (rise in urgency) step by step. Four prompts
    in five are prefixes of one shared prompt; three requests in ten stop at a drawn output (a
    stop token), and before each step every earlier request is aborted with probability 0.1,
    so the asynchronous loop's paths for finished and aborted requests with a step in flight
    are taken too."""
    rnd = random.Random(seed)
    config = same_step_config(rnd)
    length = config.max_model_len
    shared = tuple(range(100, 100 + length))
    arrivals: list[tuple[ArRequest, ...]] = []
    aborts: list[tuple[str, ...]] = []
    n = 0
    for step in range(rnd.randint(2, 4)):
        aborts.append(tuple(f"r{i}" for i in range(n) if rnd.random() < 0.1))
        batch: list[ArRequest] = []
        if step < 2 or rnd.random() < 0.5:
            first = step == 0
            prompt_len = rnd.randint(length - 3, length - 1) if first else rnd.randint(1, 2)
            max_tokens = rnd.randint(1, min(5 if first else 2, length - prompt_len))
            batch.append(
                ArRequest(
                    f"r{n}",
                    prompt_len,
                    max_tokens,
                    stop_after=rnd.randint(1, max_tokens) if rnd.random() < 0.3 else None,
                    arrival_time=float(n),
                    priority=max(0, 3 - step - rnd.randint(0, 1)),
                    prompt=shared[:prompt_len] if rnd.random() < 0.8 else None,
                )
            )
            n += 1
        arrivals.append(tuple(batch))
    return CoreProgram(config, tuple(arrivals), tuple(aborts))


__all__ = ["same_step_config", "same_step_program"]
