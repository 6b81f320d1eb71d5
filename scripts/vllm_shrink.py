"""Shrink one failing engine-core program of vLLM 0.33.0 to a small one that fails the same way.

    .venv/bin/python scripts/vllm_shrink.py --seed N [--loop {sync,async}] [--rule RULE]
        [--budget RUNS] [--pipeline-parallel P] [--programs-from {random,same-step,shared-prompts}]
        [--fix NAME ...] [--speculative-tokens K ...] [--structured-output ...]
        [--kv-connector {recompute,fail} ...] [--lifted-by FIX ...] [--trace] [--json FILE]

Takes program N as `scripts/vllm_async_check.py` generates it and runs it, with the same
options (`integrations.vllm.loop_arguments`), in the synchronous loop and then the
asynchronous one (or only `--loop`); the first rule it breaks there (or `--rule`) is the
target. `integrations.vllm.shrink.shrink` then removes requests, aborts and steps and reduces
sizes and the configuration while that loop still breaks that rule, at most `--budget` runs
(default 3000), the store's and the drafts' draws held at the original program's
(`draw_seed`). Prints the program's size before and after, the smaller program's violation,
and the smaller program as Python (`CoreProgram(...)`, which `run_loop` takes with
`LoopOptions(..., draw_seed=...)`, the seed printed with it; `--json` writes it with the
other `LoopOptions` fields and the fixes' names). With `--lifted-by FIX` a smaller program is
kept only if it also passes that loop with FIX made: the shrink keeps the finding FIX lifts,
not another bug that breaks the same rule. `--trace` also prints the smaller program's run, one
line per submission, abort, `schedule()` call, applied output and connector event, up to the
violation (`integrations.vllm.trace`).

Exit 0 if the program breaks no rule in the loops run (or not `--rule`): nothing to shrink;
1 with the smaller program printed; 2 for a usage error. Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import RULES, program_seed, run_loop
from integrations.vllm.loop_arguments import FIXES, GENERATORS, add_loop_arguments, loop_options
from integrations.vllm.patches import ScheduleFix
from integrations.vllm.program_tally import add_pipeline_argument
from integrations.vllm.shrink import (
    SHRINK_BUDGET,
    fails_like,
    lifted_by,
    program_source,
    shrink,
    size,
)
from integrations.vllm.trace import compact
from schedspec_cli.output import output_file, write_json
from spec.errors import ConfigError

#: What `integrations.vllm.shrink.size` counts.
SIZES = ("requests", "aborts", "tokens")


def _sizes(counts: tuple[int, int, int]) -> str:
    requests, aborts, tokens = counts
    return f"{requests} requests, {aborts} aborts, {tokens} tokens"


def build_parser() -> argparse.ArgumentParser:
    """The script's arguments: the program, the loop and rule, the budget, the loop options
    of `scripts/vllm_async_check.py`, `--lifted-by`, `--trace` and `--json`."""
    parser = argparse.ArgumentParser(prog="scripts/vllm_shrink.py")
    parser.add_argument("--seed", type=int, required=True, help="the program to shrink")
    parser.add_argument(
        "--loop",
        choices=("sync", "async"),
        default=None,
        help="the loop to shrink in (default: the first, sync then async, that fails)",
    )
    parser.add_argument(
        "--rule", choices=RULES, default=None, help="the rule to keep broken (default: the first)"
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=SHRINK_BUDGET,
        metavar="RUNS",
        help=f"loop runs at most (default {SHRINK_BUDGET})",
    )
    add_pipeline_argument(parser)
    add_loop_arguments(parser)
    parser.add_argument(
        "--lifted-by",
        choices=sorted(FIXES),
        action="append",
        default=None,
        metavar="FIX",
        help="keep only smaller programs that pass with this fix made too (repeatable): the "
        "shrink keeps the finding that fix lifts",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="also print the smaller program's run, one line per event, up to the violation",
    )
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the result to this file"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seed < 0 or args.budget < 1 or args.pipeline_parallel < 1:
        parser.error("--seed must be >= 0, --budget and --pipeline-parallel >= 1")
    options, names = loop_options(args, parser)
    program = GENERATORS[args.programs_from](args.seed)
    name = f"program {args.seed} ({args.programs_from}"
    name += f"; fix {' + '.join(names)})" if names else ")"
    start = time.perf_counter()
    found: tuple[str, EngineCoreViolation] | None = None
    for loop in (args.loop,) if args.loop else ("sync", "async"):
        try:
            run_loop(program, async_scheduling=loop == "async", options=options)
        except EngineCoreViolation as err:
            if args.rule is None or err.rule == args.rule:
                found = (loop, err)
                break
        except ConfigError as err:
            print(f"{name}: vLLM refuses its configuration: {err}")
            return 0
    if found is None:
        wanted = f" [{args.rule}]" if args.rule else " any rule"
        print(f"{name} breaks{wanted} in neither loop run: nothing to shrink")
        return 0
    loop, first = found
    print(f"{name}: [{first.rule}] {first.detail}")
    draws = program_seed(program)
    fails = fails_like(options, loop == "async", first.rule, draws)
    lifting = sorted(set(args.lifted_by or ()) - set(names))
    if lifting:
        fixed = replace(options, fix=ScheduleFix(*(FIXES[n] for n in names + lifting)).apply)
        fails = lifted_by(fails, fixed, loop == "async", draws)
        if not fails(program):
            print(f"{name} still breaks a rule with {' + '.join(lifting)}: nothing to shrink")
            return 0
    result = shrink(program, fails, budget=args.budget)
    smaller = fails(result.program)
    assert smaller is not None  # shrink keeps only programs that fail
    elapsed = time.perf_counter() - start
    budget = " (the budget ran out)" if result.exhausted else ""
    print(
        f"shrunk in {result.runs} runs{budget}, {elapsed:.1f} s: {_sizes(size(program))} -> "
        f"{_sizes(size(result.program))}"
    )
    print(f"[{smaller.rule}] {smaller.detail}")
    source = program_source(result.program)
    print(f"with the original program's draws, LoopOptions(..., draw_seed={draws}):")
    print(source)
    trace: list[str] = []
    if args.trace:
        traced = replace(options, draw_seed=draws, trace=trace)
        try:
            run_loop(result.program, async_scheduling=loop == "async", options=traced)
        except EngineCoreViolation as err:
            trace.append(f"violation: [{err.rule}] {err.detail}")
        print(f"its run in the {loop} loop:")
        trace = compact(trace)
        print("\n".join(f"  {line}" for line in trace))
    if args.json:
        write_json(
            args.json,
            {
                "seed": args.seed,
                "programs_from": args.programs_from,
                "fix": " + ".join(names) or None,
                "lifted_by": " + ".join(lifting) or None,
                "options": {
                    f.name: getattr(options, f.name)
                    for f in fields(options)
                    if f.name not in ("mutate", "fix", "draw_seed", "trace")
                },
                "loop": loop,
                "rule": first.rule,
                "first": first.detail,
                "shrunk": smaller.detail,
                "runs": result.runs,
                "exhausted": result.exhausted,
                "size_before": dict(zip(SIZES, size(program), strict=True)),
                "size_after": dict(zip(SIZES, size(result.program), strict=True)),
                "program": source,
                "draw_seed": draws,
                "trace": trace if args.trace else None,
                "seconds": elapsed,
            },
        )
    return 1


if __name__ == "__main__":
    sys.exit(main())
