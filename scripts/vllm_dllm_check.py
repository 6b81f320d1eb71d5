"""vLLM 0.33.0's diffusion-LLM path (`DiffusionScheduler`, `DiffusionAsyncScheduler`), checked
over generated programs.

    .venv/bin/python scripts/vllm_dllm_check.py --programs 2000 [--budget-binds]
        [--reach-model-len] [--whole-canvas-fix] [--read-only-hold-fix] [--model-len-hold-fix]
        [--pipeline-parallel P] [--prefix-caching] [--priority] [--json FILE]

Runs each program (`integrations.vllm.diffusion.dllm_program(seed)`, seeds 0..N-1) through
vLLM's engine-core loop twice, synchronous and asynchronous (a batch queue of two), with the
checks of `integrations.vllm.diffusion`; prints the failures (rule and first seeds) and how
often each path was taken. `--budget-binds` draws the programs with a token budget that binds
(the first finding's space: unpatched vLLM cuts canvases there); `--reach-model-len` draws
requests that may run into max_model_len (the second finding's space: the async loop cuts a
canvas early there); `--whole-canvas-fix` runs vLLM with the candidate fix of
`integrations.vllm.whole_canvas_fix`, `--read-only-hold-fix` and `--model-len-hold-fix` with
those of `integrations.vllm.async_hold_fixes` (several flags: those fixes together, the holds
first); `--pipeline-parallel P` runs the
asynchronous loop with P pipeline stages (a batch queue of P + 1); `--prefix-caching` serves
with prefix caching on and half the prompts prefixes of one shared prompt; `--priority` serves
under vLLM's priority policy, each request a priority in 0..2. Exit 1 if a program failed.
Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm.async_hold_fixes import apply_model_len_hold_fix, apply_read_only_hold_fix
from integrations.vllm.diffusion import END_MARGIN_CANVASES, check_both, dllm_program
from integrations.vllm.program_tally import (
    ProgramTally,
    add_program_arguments,
    parse_program_arguments,
)
from integrations.vllm.whole_canvas_fix import apply_whole_canvas_fix
from schedspec_cli.output import output_file, write_json

MEANING = {
    "engine_steps": "engine-core steps",
    "schedules": "schedule() calls",
    "denoise_steps": "runner canvas steps that sampled nothing",
    "commits": "runner canvas steps that emitted the canvas",
    "preemptions": "preemptions",
    "cadence_waits": "requests held back for the pipeline cadence",
    "prefix_hit_tokens": "prompt tokens found in the prefix cache",
    "aborts_in_flight": "aborts with a step in flight",
    "discarded": "steps of a request that had finished",
    "discarded_read_only": "  of them, of a read-only request",
}


#: (flag's attribute, name, fix), in the order they are applied: the hold fixes replace vLLM's
#: class (the second adds to the first), the whole-canvas fix subclasses whatever class it finds
FIXES: tuple[tuple[str, str, Callable[[Any], None]], ...] = (
    ("read_only_hold_fix", "the read-only hold fix", apply_read_only_hold_fix),
    ("model_len_hold_fix", "the model-len hold fix", apply_model_len_hold_fix),
    ("whole_canvas_fix", "the whole-canvas fix", apply_whole_canvas_fix),
)


def _apply_all(fixes: Sequence[Callable[[Any], None]], sched: Any) -> None:
    for fix in fixes:
        fix(sched)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/vllm_dllm_check.py")
    add_program_arguments(parser, 2000)
    parser.add_argument(
        "--budget-binds",
        action="store_true",
        help="draw a token budget that binds (below every seat's canvas)",
    )
    parser.add_argument(
        "--whole-canvas-fix",
        action="store_true",
        help="run vLLM with the candidate fix: a canvas is scheduled whole or not at all",
    )
    parser.add_argument(
        "--read-only-hold-fix",
        action="store_true",
        help="run vLLM with the candidate fix: a read-only request is held once its step cap "
        "is scheduled",
    )
    parser.add_argument(
        "--model-len-hold-fix",
        action="store_true",
        help="run vLLM with the candidate fix: near max_model_len a request waits for its "
        "canvas step in flight",
    )
    parser.add_argument(
        "--reach-model-len",
        action="store_true",
        help="draw requests that may run into max_model_len",
    )
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="prefix caching on, half the prompts prefixes of one shared prompt",
    )
    parser.add_argument(
        "--priority",
        action="store_true",
        help="vLLM's priority policy, each request a priority in 0..2",
    )
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the figures to this file"
    )
    args = parse_program_arguments(parser, argv)
    start = time.perf_counter()
    tally = ProgramTally(tuple(MEANING))
    chosen = [(name, fix) for attr, name, fix in FIXES if getattr(args, attr)]
    mutate = partial(_apply_all, [fix for _, fix in chosen]) if chosen else None
    requests = 0
    for seed in range(args.programs):
        program = dllm_program(
            seed,
            budget_binds=args.budget_binds,
            reach_model_len=args.reach_model_len,
            prefix_caching=args.prefix_caching,
            priority_policy=args.priority,
        )
        requests += sum(len(batch) for batch in program.arrivals)
        tally.check(
            seed,
            partial(check_both, program, mutate, pipeline_parallel_size=args.pipeline_parallel),
        )
    elapsed = time.perf_counter() - start
    space = "token budget binds" if args.budget_binds else "token budget never binds"
    if args.reach_model_len:
        space += ", requests may reach max_model_len"
    named = " and ".join(name for name, _ in chosen)
    patch = f"vLLM with {named}" if chosen else "vLLM as released"
    if args.prefix_caching:
        patch += ", prefix caching on"
    if args.priority:
        patch += ", priority policy"
    p = args.pipeline_parallel
    stages = f"async with {p} pipeline stage{'s' if p > 1 else ''}"
    print(
        f"{args.programs} programs ({requests} requests; {space}; {patch}; {stages}), "
        f"{tally.passed} pass both loops"
    )
    print("\n".join(tally.report(MEANING, 45)))
    print(f"({elapsed:.1f} s)")
    if args.json:
        write_json(
            args.json,
            {
                "programs": args.programs,
                "requests": requests,
                **tally.json_fields(),
                "seconds": elapsed,
                "end_margin_canvases": 0 if args.reach_model_len else END_MARGIN_CANVASES,
                "budget_binds": args.budget_binds,
                **{attr: getattr(args, attr) for attr, _, _ in FIXES},
                "pipeline_parallel_size": args.pipeline_parallel,
                "prefix_caching": args.prefix_caching,
                "priority_policy": args.priority,
            },
        )
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
