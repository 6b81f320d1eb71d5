"""The real vLLM adapter's calls on vLLM's scheduler, one line each, in vLLM's own terms.

A failing example of the AR suite prints the spec's calls (`submit(ArRequest(...))`, `step()`);
a vLLM developer reads a scheduler test as vLLM's own tests write one (`tests/v1/core/`): a
`Scheduler` built for some settings, `add_request(Request(...))`, `schedule()`,
`update_from_output(out, ModelRunnerOutput(...))`. `RealVllmScheduler` keeps such a transcript
of what it called (`native_calls`), each call with vLLM's answer in a comment, built from these
lines: the settings the scheduler was built with, the request as vLLM holds it, and the sampled
tokens the adapter's fabricated model returned.
"""

from __future__ import annotations

from typing import Any

from spec.ar.config import ArConfig


def construction_line(sched: Any, config: ArConfig) -> str:
    """How the scheduler was built: its class and the settings it runs with, read from it
    (vLLM's names, what `EngineCore` would give it for the same `VllmConfig`)."""
    sc = sched.scheduler_config
    cache = sched.cache_config
    settings = {
        "block_size": cache.block_size,
        "num_gpu_blocks": sched.kv_cache_config.num_blocks,
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_model_len": sched.max_model_len,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "policy": str(sc.policy),
        "enable_prefix_caching": cache.enable_prefix_caching,
    }
    shown = ", ".join(f"{k}={v!r}" for k, v in settings.items())
    return (
        f"sched = {type(sched).__name__}(...)  # {shown}; block 0 is vLLM's null block; "
        f"the spec's config: {config.num_blocks} blocks of {config.block_size}"
    )


def request_line(req: Any) -> str:
    """`sched.add_request(Request(...))` for the vLLM request `req`, its prompt said compactly
    (one token repeated, as the adapter's unshared prompts are, is `[t] * n`)."""
    prompt = list(req.prompt_token_ids or [])
    said = f"[{prompt[0]}] * {len(prompt)}" if prompt and len(set(prompt)) == 1 else repr(prompt)
    params = req.sampling_params
    extras = f", priority={req.priority}" if req.priority else ""
    return (
        f"sched.add_request(Request(request_id={req.request_id!r}, prompt_token_ids={said}, "
        f"sampling_params=SamplingParams(max_tokens={params.max_tokens}, "
        f"stop_token_ids={list(params.stop_token_ids or [])}, ignore_eos={params.ignore_eos}), "
        f"arrival_time={req.arrival_time}{extras}))"
    )


def update_line(runner_output: Any) -> str:
    """`sched.update_from_output(out, ModelRunnerOutput(...))` with the model's sampled tokens
    per request (an empty list: a prefill chunk that samples nothing)."""
    sampled = dict(zip(runner_output.req_ids, runner_output.sampled_token_ids, strict=True))
    tokens = ", ".join(f"{rid!r}: {list(t)}" for rid, t in sampled.items())
    return f"sched.update_from_output(out, ModelRunnerOutput(sampled {{{tokens}}}))"
