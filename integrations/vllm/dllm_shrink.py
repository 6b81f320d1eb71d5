"""Shrinking a failing program of vLLM's diffusion path (`DllmProgram`) to a small one that
fails the same way: `integrations.vllm.shrink`'s greedy loop over the diffusion program's own
reductions.

`shrink_dllm(program, fails)` removes and reduces while `fails` still holds of the result:

1. whole requests (an aborted request's aborts go with it), then single aborts, then steps with
   no arrival and no abort (`integrations.vllm.shrink.step_removals`);
2. each request's script: `max_tokens` and `prompt_len` to 1, else down by one; a canvas's
   denoise steps (`converge_after`: an entry dropped, one lowered to 1 or by one); its stop
   token, narrower canvas, step cap, read-only flag, shared prompt and priority dropped, the
   canvas and step cap also narrowed by one;
3. the serving configuration: the canvas, the denoise-step cap, seats, the token budget, the
   pool and the model length down by one, the block size halved, prefix caching off and the
   FCFS policy (a change that makes the configuration or a request invalid is skipped; the
   pipeline stages are the loop's, and stay);
4. last, only where no single change is kept, two requests at once
   (`integrations.vllm.shrink.pair_removals`): a failure that needs the requests' parity
   survives no single removal.

The fabricated diffusion runner draws nothing (each request's script is in the program), so,
unlike the autoregressive loop's store, no draw needs holding: a smaller program reproduces as
printed. `dllm_fails_like(async_scheduling, rule, fixes)` is the `fails` of one loop and rule
(the named fixes of `integrations.vllm.fixes` made), `dllm_lifted_by` keeps only programs that
the finding's fix lifts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation, run_named
from integrations.vllm.diffusion import (
    DllmProgram,
    DllmRequest,
    run_dllm,
    validate_dllm_request,
)
from integrations.vllm.fixes import dllm_mutation
from integrations.vllm.shrink import (
    SHRINK_BUDGET,
    Shrunk,
    breaking,
    greedy_shrink,
    lower,
    pair_removals,
    passing_too,
    request_reductions,
    step_removals,
)
from integrations.vllm.source_text import dataclass_source, program_text
from spec.errors import ConfigError, RequestError


def run_dllm_named(
    program: DllmProgram,
    async_scheduling: bool,
    fixes: Sequence[str] = (),
    trace: list[str] | None = None,
) -> None:
    """`program` through one loop with the named fixes made; a violation names the loop
    (`"async loop: ..."`, as the sweeps report it)."""
    mutate = dllm_mutation(fixes)
    run_named(
        async_scheduling,
        lambda a: run_dllm(program, async_scheduling=a, mutate=mutate, trace=trace),
    )


def dllm_fails_like(
    async_scheduling: bool, rule: str, fixes: Sequence[str] = ()
) -> Callable[[DllmProgram], EngineCoreViolation | None]:
    """A `fails` for `shrink_dllm`: the violation of `rule` a program's run in the one loop
    raises with the named fixes made, else None (another rule, a pass, or a configuration or
    request vLLM refuses)."""
    return breaking(lambda program: run_dllm_named(program, async_scheduling, fixes), rule)


def dllm_lifted_by(
    fails: Callable[[DllmProgram], EngineCoreViolation | None],
    async_scheduling: bool,
    fixes: Sequence[str],
) -> Callable[[DllmProgram], EngineCoreViolation | None]:
    """`fails`, kept only where the same program passes the one loop with the named `fixes`
    made (those `fails` makes and the finding's): a shrink under it keeps the failure those
    fixes lift."""
    return passing_too(fails, lambda program: run_dllm_named(program, async_scheduling, fixes))


def shrink_dllm(
    program: DllmProgram,
    fails: Callable[[DllmProgram], object],
    *,
    budget: int = SHRINK_BUDGET,
) -> Shrunk[DllmProgram]:
    """The smallest program reached from `program` by the changes above, each kept only if
    `fails` (truthy) holds of its result. `program` itself must fail (`ValueError` if not)."""
    return greedy_shrink(program, fails, dllm_reductions, budget=budget)


def dllm_program_source(program: DllmProgram) -> str:
    """`program` as Python that builds it (`DllmProgram`, `DllmServing` and `DllmRequest` from
    `integrations.vllm.diffusion`): every serving size, each other field that differs from its
    default, a request's id and sizes by position."""
    return program_text(program, dataclass_source(program.serving))


def dllm_reductions(program: DllmProgram) -> Iterator[DllmProgram]:
    """Every one-change reduction of `program`, in the order `shrink_dllm` tries them, valid
    ones only."""
    for candidate in (
        *step_removals(program),
        *request_reductions(program, _smaller_requests),
        *_serving(program),
        *pair_removals(program),
    ):
        if _valid(candidate):
            yield candidate


def _smaller_requests(r: DllmRequest) -> Iterator[DllmRequest]:
    for tokens in lower(r.max_tokens):
        stop = r.stop_after if r.stop_after is None or r.stop_after <= tokens else None
        yield replace(r, max_tokens=tokens, stop_after=stop)
    for length in lower(r.prompt_len):
        yield replace(r, prompt_len=length)
    steps = r.converge_after
    if len(steps) > 1:
        yield replace(r, converge_after=steps[:-1])
        yield replace(r, converge_after=steps[1:])
    for i, count in enumerate(steps):
        for fewer in lower(count):
            yield replace(r, converge_after=(*steps[:i], fewer, *steps[i + 1 :]))
    if r.stop_after is not None:
        yield replace(r, stop_after=None)
    if r.width is not None:
        yield replace(r, width=None)
        for width in lower(r.width):
            yield replace(r, width=width)
    if r.max_steps is not None:
        yield replace(r, max_steps=None)
        for cap in lower(r.max_steps):
            yield replace(r, max_steps=cap)
    if r.read_only:
        yield replace(r, read_only=False)
    if r.shared_prompt:
        yield replace(r, shared_prompt=False)
    if r.priority:
        yield replace(r, priority=0)


def _serving(program: DllmProgram) -> Iterator[DllmProgram]:
    s = program.serving
    lowered: dict[str, Any] = {
        name: getattr(s, name) - 1
        for name in (
            "canvas_length",
            "max_denoising_steps",
            "max_num_seqs",
            "max_num_batched_tokens",
            "num_blocks",
            "max_model_len",
        )
    }
    if s.block_size % 2 == 0:
        lowered["block_size"] = s.block_size // 2
    if s.enable_prefix_caching:
        lowered["enable_prefix_caching"] = False
    if s.policy != "fcfs":
        lowered["policy"] = "fcfs"
    for name, value in lowered.items():
        try:
            yield replace(program, serving=replace(s, **{name: value}))
        except ConfigError:
            continue


def _valid(program: DllmProgram) -> bool:
    """Every request of `program` fits its serving (vLLM would refuse it otherwise): no field
    out of range, no request longer than max_model_len or the pool, no canvas wider than the
    served one."""
    try:
        for batch in program.arrivals:
            for request in batch:
                validate_dllm_request(program.serving, request)
                if request.width is not None and request.width > program.serving.canvas_length:
                    return False
    except RequestError:
        return False
    return any(program.arrivals)


__all__ = [
    "dllm_fails_like",
    "dllm_lifted_by",
    "dllm_program_source",
    "dllm_reductions",
    "run_dllm_named",
    "shrink_dllm",
]
