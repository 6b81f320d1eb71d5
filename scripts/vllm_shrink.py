"""Shrink one failing engine-core program of vLLM (0.33.0, or the release `SCHEDSPEC_VLLM_VERSION`
selects) to a small one that fails the same way.

    .venv/bin/python scripts/vllm_shrink.py --seed N [--loop {sync,async}] [--rule RULE]
        [--budget RUNS] [--pipeline-parallel P]
        [--programs-from {branching-prompts,random,same-step,shared-prompts}]
        [--fix NAME ...] [--speculative-tokens K ...] [--structured-output ...]
        [--kv-connector {recompute,fail} ...] [--offload-chunks N ...] [--cache-resets]
        [--sliding-window W [--retention-interval N|dense]
         [--window-block-scale K | --full-block-scale K]]
        [--mamba [--mamba-block-scale K] [--mamba-checkpoint-alignment A]]
        [--lifted-by FIX ...] [--trace] [--json FILE]

Takes program N as `scripts/vllm_async_check.py` generates it and runs it, with the same
options (`integrations.vllm.loop_arguments`), in the synchronous loop and then the
asynchronous one (or only `--loop`); the first rule it breaks there (or `--rule`) is the
target. `integrations.vllm.shrink.shrink` then removes requests, aborts and steps and reduces
sizes and the configuration while that loop still breaks that rule, at most `--budget` runs
(default 3000), the store's and the drafts' draws held at the original program's
(`draw_seed`). Prints the program's size before and after, the smaller program's violation,
and the smaller program as Python (`CoreProgram(...)`, which `run_loop` takes with
`LoopOptions(..., draw_seed=...)`, the seed printed with it; `--json` writes it with the
other `LoopOptions` fields, the fixes' names and the vLLM release it ran, `"release"`). With
`--lifted-by FIX` a smaller program is kept only if it also passes that loop with FIX made: the
shrink keeps the finding FIX lifts, not another bug that breaks the same rule. `--trace` also
prints the smaller program's run, one line per submission, abort, `schedule()` call, applied
output and connector event, up to the violation (`integrations.vllm.trace`).

Exit 0 if the program breaks no rule in the loops run (or not `--rule`), or vLLM refuses it
even without the options above (as drawn): nothing to shrink; 1 with the smaller program
printed; 2, one line on stderr, for a usage error or for options with which vLLM refuses the
program (it serves it without them, e.g. `--speculative-tokens 99999`). Needs `schedspec
install-engines vllm`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.hash_seed import pin_hash_seed
from integrations.vllm.engine_core import RULES, LoopOptions, program_seed, run_loop
from integrations.vllm.loop_arguments import (
    FIXES,
    GENERATORS,
    add_loop_arguments,
    loop_options,
    make_fixes,
)
from integrations.vllm.manifest import VLLM_VERSION
from integrations.vllm.program_tally import add_pipeline_argument
from integrations.vllm.shrink import (
    fails_like,
    lifted_by,
    program_source,
    recorded_options,
    shrink,
)
from integrations.vllm.shrink_cli import (
    RefusedByFlags,
    add_shrink_arguments,
    check_scheduler_cls,
    check_shrink_arguments,
    lifted,
    report,
    shrink_target,
    traced_run,
    with_class,
)
from schedspec_cli.args import Parser, run_script
from schedspec_cli.output import output_file, write_json


def build_parser() -> argparse.ArgumentParser:
    """The script's arguments: the program, the loop and rule, the budget, the loop options
    of `scripts/vllm_async_check.py`, `--lifted-by`, `--trace` and `--json`; a usage error is
    one line (`schedspec_cli.args.Parser`: `UsageError`)."""
    parser = Parser(prog="scripts/vllm_shrink.py")
    add_shrink_arguments(parser, RULES, sorted(FIXES))
    add_pipeline_argument(parser)
    add_loop_arguments(parser)
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the result to this file"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Shrink the program the arguments name; a usage error is one line on stderr and
    `SystemExit(2)`, as argparse's own."""
    parser = build_parser()
    return run_script(parser, lambda args: shrink_program(parser, args), argv)


def shrink_program(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The script's run on parsed arguments (`main`): 0 nothing to shrink, 1 shrunk."""
    check_shrink_arguments(args, parser)
    options, names = loop_options(args, parser)
    scheduler_cls = check_scheduler_cls(args, parser)
    program = GENERATORS[args.programs_from](args.seed)
    name = f"program {args.seed} ({args.programs_from}"
    name += f"; fix {' + '.join(names)})" if names else ")"
    start = time.perf_counter()
    try:
        found = shrink_target(
            name,
            lambda a: run_loop(program, async_scheduling=a, options=options),
            args.loop,
            args.rule,
            # the program as drawn, without the options: does vLLM serve it at all?
            plain=lambda a: run_loop(program, async_scheduling=a, options=LoopOptions()),
        )
    except RefusedByFlags as err:
        parser.error(str(err))
    if found is None:
        return 0
    loop, first = found
    draws = program_seed(program)
    fails = fails_like(options, loop == "async", first.rule, draws)
    lifting = sorted(set(args.lifted_by or ()) - set(names))
    if lifting:
        fixed = replace(options, fix=make_fixes(names + lifting))
        fails = lifted_by(fails, fixed, loop == "async", draws)
        if not lifted(name, fails, program, lifting):
            return 0
    result = shrink(program, fails, budget=args.budget)
    smaller = fails(result.program)
    assert smaller is not None  # shrink keeps only programs that fail
    elapsed = time.perf_counter() - start
    trace = (
        traced_run(
            lambda lines: run_loop(
                result.program,
                async_scheduling=loop == "async",
                options=replace(options, draw_seed=draws, trace=lines),
            )
        )
        if args.trace
        else None
    )
    record = report(
        program=program,
        result=result,
        smaller=smaller,
        # with read limits, each request's limit shown (the loop sets the same ones again)
        source=program_source(options.limited(result.program)),
        elapsed=elapsed,
        loop=loop,
        reproduce=f"with the original program's draws, LoopOptions(..., draw_seed={draws})"
        + with_class(scheduler_cls)
        + ":",
        trace=trace,
    )
    if args.json:
        write_json(
            args.json,
            {
                "release": VLLM_VERSION,
                "scheduler_cls": scheduler_cls,
                "seed": args.seed,
                "programs_from": args.programs_from,
                "fix": " + ".join(names) or None,
                "lifted_by": " + ".join(lifting) or None,
                "options": recorded_options(options),
                "rule": first.rule,
                "first": first.detail,
                "draw_seed": draws,
                **record,
            },
        )
    return 1


if __name__ == "__main__":
    pin_hash_seed()  # the same figures on every run (integrations.hash_seed)
    sys.exit(main())
