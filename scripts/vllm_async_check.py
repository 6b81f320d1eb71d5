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
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm.engine_core import (
    ASYNC_BATCH_QUEUE,
    EngineCoreViolation,
    check_both,
    core_program,
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
    parser.add_argument("--programs", type=int, default=3000, help="generated programs (seeds)")
    parser.add_argument(
        "--pipeline-parallel",
        type=int,
        default=1,
        metavar="P",
        help="pipeline stages of the asynchronous loop (default 1)",
    )
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the figures to this file"
    )
    args = parser.parse_args(argv)
    if args.programs < 1:
        parser.error("--programs: must be >= 1")
    if args.pipeline_parallel < 1:
        parser.error("--pipeline-parallel: must be >= 1")
    start = time.perf_counter()
    totals: dict[str, Counter[str]] = {"sync": Counter(), "async": Counter()}
    failures: dict[str, list[int]] = {}
    first: dict[str, str] = {}
    prefix = 0
    for seed in range(args.programs):
        program = core_program(seed)
        prefix += program.config.enable_prefix_caching
        try:
            runs = check_both(program, pipeline_parallel_size=args.pipeline_parallel)
        except EngineCoreViolation as err:
            failures.setdefault(err.rule, []).append(seed)
            first.setdefault(err.rule, err.detail)
            continue
        for mode, run in zip(("sync", "async"), runs, strict=True):
            totals[mode].update({k: getattr(run, k) for k in COUNTS})
    elapsed = time.perf_counter() - start
    failed = sum(len(s) for s in failures.values())
    p = args.pipeline_parallel
    print(
        f"{args.programs} programs ({prefix} with prefix caching; async with {p} pipeline "
        f"stage{'s' if p > 1 else ''}), {args.programs - failed} pass both loops"
    )
    print(f"{'':50} {'sync':>8} {'async':>8}")
    for key in COUNTS:
        print(f"{MEANING[key]:50} {totals['sync'][key]:8d} {totals['async'][key]:8d}")
    for rule, seeds in sorted(failures.items()):
        print(f"FAIL [{rule}] {len(seeds)} programs, first seeds {seeds[:5]}: {first[rule]}")
    print(f"({elapsed:.1f} s)")
    if args.json:
        write_json(
            args.json,
            {
                "programs": args.programs,
                "prefix_caching_programs": prefix,
                "failures": {r: {"seeds": s, "first": first[r]} for r, s in failures.items()},
                "counts": {mode: dict(c) for mode, c in totals.items()},
                "seconds": elapsed,
                "async_batch_queue": ASYNC_BATCH_QUEUE if p == 1 else p + 1,
                "pipeline_parallel_size": p,
            },
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
