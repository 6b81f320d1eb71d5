"""vLLM 0.33.0's asynchronous scheduling (its default), checked over generated programs.

    .venv/bin/python scripts/vllm_async_check.py --programs 3000 [--pipeline-parallel P]
        [--json FILE]

Runs each program (`integrations.vllm.engine_core.core_program(seed)`, seeds 0..N-1) through
vLLM's engine-core loop twice, synchronous (the control) and asynchronous (`AsyncScheduler`,
a batch queue of two), with the checks of `integrations.vllm.engine_core`; prints the failures
(rule and first seeds) and how often the asynchronous paths were taken. `--pipeline-parallel P`
runs the asynchronous loop with P pipeline stages (vLLM's V2 model runner, a batch queue of
P + 1). Exit 1 if a program failed. Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm.engine_core import (
    ASYNC_BATCH_QUEUE,
    check_both,
    core_program,
)
from integrations.vllm.program_tally import (
    ProgramTally,
    add_program_arguments,
    parse_program_arguments,
)
from schedspec_cli.output import output_file, write_json

COUNTS = (
    "engine_steps",
    "schedules",
    "ahead",
    "stale",
    "aborts_in_flight",
    "discarded",
    "cadence_waits",
)
MEANING = {
    "engine_steps": "engine-core steps",
    "schedules": "schedule() calls",
    "ahead": "requests scheduled with an output in flight",
    "stale": "preemptions with a step in flight (stale output)",
    "aborts_in_flight": "aborts with a step in flight",
    "discarded": "steps of a request that had finished",
    "cadence_waits": "requests held back for the pipeline cadence",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/vllm_async_check.py")
    add_program_arguments(parser, 3000)
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the figures to this file"
    )
    args = parse_program_arguments(parser, argv)
    start = time.perf_counter()
    tally = ProgramTally(COUNTS)
    prefix = 0
    for seed in range(args.programs):
        program = core_program(seed)
        prefix += program.config.enable_prefix_caching
        tally.check(
            seed, partial(check_both, program, pipeline_parallel_size=args.pipeline_parallel)
        )
    elapsed = time.perf_counter() - start
    p = args.pipeline_parallel
    print(
        f"{args.programs} programs ({prefix} with prefix caching; async with {p} pipeline "
        f"stage{'s' if p > 1 else ''}), {tally.passed} pass both loops"
    )
    print("\n".join(tally.report(MEANING, 50)))
    print(f"({elapsed:.1f} s)")
    if args.json:
        write_json(
            args.json,
            {
                "programs": args.programs,
                "prefix_caching_programs": prefix,
                **tally.json_fields(),
                "seconds": elapsed,
                "async_batch_queue": ASYNC_BATCH_QUEUE if p == 1 else p + 1,
                "pipeline_parallel_size": p,
            },
        )
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
