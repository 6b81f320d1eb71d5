"""The SGLang adapter's calls on SGLang's dLLM scheduler path, one line each, in SGLang's terms.

A failing example of the dLLM suite prints the spec's calls (`submit(RequestSpec(...))`,
`run_round()`); an SGLang developer reads the same example as the scheduler saw it: requests
(`Req` under the engine id `len:id|`) appended to `waiting_queue`, `abort_request(AbortReq)`,
and per round the batch `get_next_batch_to_run` chose (its forward mode, and per request its
`req_pool_idx` and `DllmReqPhase`) and what `process_batch_result_dllm` ended.
`SglangDllmAdapter.native_calls` joins these lines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spec.config import DllmConfig


def described(line: Callable[..., str], *args: Any) -> str:
    """`line(*args)`, or a line saying it could not be said: the transcript is a courtesy, and
    an SGLang object without a field it reads must not fail the run it describes."""
    try:
        return line(*args)
    except Exception as err:  # an SGLang release whose objects differ: said, never raised
        return f"# ({line.__name__} could not describe this call: {type(err).__name__}: {err})"


def construction_line(config: DllmConfig) -> str:
    """How the adapter assembled the scheduler (integrations/sglang/engine.py, `build`)."""
    return (
        f"scheduler = Scheduler.__new__(Scheduler)  # assembled by integrations/sglang/engine.py: "
        f"page_size={config.page_size}, dllm block_size={config.block_size}, "
        f"max_running_requests={config.max_running_requests}, req_to_token_pool "
        f"{config.req_pool_rows} rows + row 0 (padding), token_to_kv_pool "
        f"{config.kv_pages * config.page_size} slots + page 0 (padding), radix cache "
        f"{'on' if config.prefix_cache else 'off'}, first_done_first_out_mode="
        f"{config.mode.value == 'fdfo'}"
    )


def request_line(req: Any, prompt: tuple[int, ...], max_new_tokens: int) -> str:
    """The request queued as `queue_request` does (`Scheduler._add_request_to_queue`)."""
    params = req.sampling_params
    return (
        f"scheduler.waiting_queue.append(Req(rid={req.rid!r}, origin_input_ids={list(prompt)}, "
        f"sampling_params=SamplingParams(max_new_tokens={max_new_tokens}, "
        f"ignore_eos={params.ignore_eos}, stop_token_ids={sorted(params.stop_token_ids or ())})"
        f", priority={req.priority}))"
    )


def batch_line(batch: Any) -> str:
    """What `get_next_batch_to_run` returned: nothing, or the forward mode and each request's
    row (`req_pool_idx`, SGLang's numbering) and dLLM phase."""
    if batch is None:
        return "batch = scheduler.get_next_batch_to_run(...)  # None: nothing to run"
    rows = ", ".join(
        f"{req.rid} row {req.kv.req_pool_idx} {getattr(req.dllm_phase, 'name', req.dllm_phase)}"
        for req in batch.reqs
    )
    mode = getattr(batch.forward_mode, "name", batch.forward_mode)
    return f"batch = scheduler.get_next_batch_to_run(...)  # {mode}: {rows}"


def result_line(batch: Any) -> str:
    """`process_batch_result_dllm` on the worker's (scripted) step: the requests it ended."""
    ended = [
        f"{req.rid} ({type(req.finished_reason).__name__})" for req in batch.reqs if req.finished()
    ]
    said = ", ".join(ended) if ended else "none ended"
    return f"scheduler.process_batch_result_dllm(batch, worker step)  # {said}"
