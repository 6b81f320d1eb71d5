"""vLLM 0.33.0's diffusion-LLM path (`DiffusionScheduler`, `DiffusionAsyncScheduler`), checked
over generated programs.

    .venv/bin/python scripts/vllm_dllm_check.py --programs 2000 [--budget-binds]
        [--reach-model-len] [--whole-canvas-fix] [--read-only-hold-fix] [--model-len-hold-fix]
        [--pipeline-parallel P] [--prefix-caching] [--priority] [--kv-events]
        [--loras N [--max-loras M]] [--pauses keep|wait|abort] [--json FILE]

Runs each program (`integrations.vllm.diffusion.dllm_program(seed)`, seeds 0..N-1) through
vLLM's engine-core loop twice, synchronous and asynchronous (a batch queue of two), with the
checks of `integrations.vllm.diffusion`; prints the failures (rule and first seeds), for each
the `scripts/vllm_dllm_shrink.py` command that shrinks its first program under the same options
(`integrations.vllm.dllm_arguments`), and how often each path was taken. `--budget-binds` draws
the programs with a token budget that binds (the first finding's space: unpatched vLLM cuts
canvases there); `--reach-model-len` draws requests that may run into max_model_len (the second
finding's space: the async loop cuts a canvas early there); `--whole-canvas-fix` runs vLLM with
the candidate fix of `integrations.vllm.whole_canvas_fix`, `--read-only-hold-fix` and
`--model-len-hold-fix` with those of `integrations.vllm.async_hold_fixes` (several flags: those
fixes together, the holds first); `--pipeline-parallel P` runs the asynchronous loop with P
pipeline stages (a batch queue of P + 1); `--prefix-caching` serves with prefix caching on and
half the prompts prefixes of one shared prompt; `--priority` serves under vLLM's priority
policy, each request a priority in 0..2; `--kv-events` serves with vLLM's KV cache events on,
read as a router reads them (copies counted) and checked after every `update_from_output`
(`kv_events`, `integrations.vllm.kv_events`; and what each store says of its blocks,
`kv_event_content`); `--loras N` serves N LoRA adapters, at most `--max-loras M` (default 1)
at once, and checks `max_loras` (`integrations.vllm.lora_rules`); `--pauses MODE` pauses
generation now and then as RL trainers do around a weight update, clears the caches once idle
and resumes, and checks `pause` (`integrations.vllm.pauses`). With
`SCHEDSPEC_VLLM_SCHEDULER_CLS=pkg.module.Class` (`integrations.vllm.custom_scheduler`) both
loops build that class: it must subclass `DiffusionAsyncScheduler` (which the synchronous
loop's `DiffusionScheduler` is a base of), checked before any program; the output's first line
and the JSON's `scheduler_cls` name it, and each shrink command printed starts with the
variable. Exit 1 if a program failed (exit 2, one line, for `--max-loras` without `--loras` or
a scheduler class that is not one vLLM builds in both loops).
Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.hash_seed import hash_seed, pin_hash_seed
from integrations.vllm.admission_check import ADMISSION_MEANING
from integrations.vllm.cache_aware_check import CACHE_AWARE_MEANING
from integrations.vllm.custom_scheduler import check_for_loops, is_scheduler_cls_error
from integrations.vllm.diffusion import END_MARGIN_CANVASES, check_both
from integrations.vllm.dllm_arguments import (
    add_dllm_arguments,
    check_dllm_arguments,
    describe_fixes,
    describe_space,
    dllm_generator,
    fix_fields,
    fix_names,
)
from integrations.vllm.fixes import dllm_mutation
from integrations.vllm.program_tally import (
    MODES,
    ProgramTally,
    add_program_arguments,
    engine_words,
    parse_program_arguments,
    refuse_scheduler_cls,
    shrink_commands,
)
from schedspec_cli.output import output_file, write_json
from spec.errors import ConfigError

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
    "events_stored": "keys KV cache events announced stored",
    "events_removed": "keys they announced removed",
    "events_keys_described": "keys of stores checked against their blocks' content",
    "adapter_waits": "requests waiting for room for their LoRA adapter, per schedule",
    "pauses": "generation paused",
    "pause_preempted": "running requests a pause's cache reset preempted",
    **ADMISSION_MEANING,
    # (one waiting queue here: no load cap, so no request is passed behind a moved head)
    **{name: text for name, text in CACHE_AWARE_MEANING.items() if name != "window_passes"},
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/vllm_dllm_check.py")
    add_program_arguments(parser, 2000)
    add_dllm_arguments(parser)
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the figures to this file"
    )
    args = parse_program_arguments(parser, argv)
    check_dllm_arguments(parser, args)
    try:
        # both loops run: a class of the user's must be one vLLM builds in each, checked
        # before any program
        scheduler_cls = check_for_loops(MODES, diffusion=True)
    except ConfigError as err:
        return refuse_scheduler_cls(parser.prog, err)
    start = time.perf_counter()
    tally = ProgramTally(tuple(MEANING))
    mutate = dllm_mutation(fix_names(args))
    generate = dllm_generator(args)
    requests = 0
    try:
        for seed in range(args.programs):
            program = generate(seed)
            requests += sum(len(batch) for batch in program.arrivals)
            tally.check(
                seed,
                partial(check_both, program, mutate, pipeline_parallel_size=args.pipeline_parallel),
            )
    except ConfigError as err:
        if not is_scheduler_cls_error(err):
            raise
        return refuse_scheduler_cls(parser.prog, err)
    elapsed = time.perf_counter() - start
    engine = engine_words()
    if engine is not None:
        print(engine)
    space, patch = describe_space(args), describe_fixes(args)
    p = args.pipeline_parallel
    stages = f"async with {p} pipeline stage{'s' if p > 1 else ''}"
    print(
        f"{args.programs} programs ({requests} requests; {space}; {patch}; {stages}), "
        f"{tally.passed} pass both loops"
    )
    print("\n".join(tally.report(MEANING, 45)))
    print("\n".join(shrink_commands("scripts/vllm_dllm_shrink.py", tally.failures, argv)))
    print(f"({elapsed:.1f} s)")
    if args.json:
        write_json(
            args.json,
            {
                "programs": args.programs,
                "requests": requests,
                "python_hash_seed": hash_seed(),
                "scheduler_cls": scheduler_cls,
                **tally.json_fields(),
                "seconds": elapsed,
                "end_margin_canvases": 0 if args.reach_model_len else END_MARGIN_CANVASES,
                "budget_binds": args.budget_binds,
                **fix_fields(args),
                "pipeline_parallel_size": args.pipeline_parallel,
                "prefix_caching": args.prefix_caching,
                "priority_policy": args.priority,
                "kv_events": args.kv_events,
                "loras": args.loras,
                "max_loras": args.max_loras,
                "pauses": args.pauses,
            },
        )
    return 1 if tally.failures else 0


if __name__ == "__main__":
    pin_hash_seed()  # the same figures on every run (integrations.hash_seed)
    sys.exit(main())
