"""The configuration of the same-step preemption program (docs/engines/vllm.md, "A request
preempted in the step that scheduled it stays cached"), shared by the tests that run it on vLLM
(`tests/test_real_vllm_preempted_cache.py`) and those that check its events without vLLM
(`tests/test_vllm_unscheduled.py`): one-token blocks, 8 usable blocks, a budget of 3, a
long-prefill threshold of 2, two seats, priority, prefix caching."""

from __future__ import annotations

from spec.ar.config import ArConfig, Policy

CONFIG = ArConfig(
    block_size=1,
    num_blocks=9,
    reserve_null_block=True,
    max_num_batched_tokens=3,
    max_num_seqs=2,
    max_model_len=16,
    long_prefill_token_threshold=2,
    enable_chunked_prefill=True,
    policy=Policy.PRIORITY,
    enable_prefix_caching=True,
)
