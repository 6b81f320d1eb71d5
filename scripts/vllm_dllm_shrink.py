"""Shrink one failing program of vLLM 0.33.0's diffusion path to a small one that fails the same
way.

    .venv/bin/python scripts/vllm_dllm_shrink.py --seed N [--loop {sync,async}] [--rule RULE]
        [--budget RUNS] [--pipeline-parallel P] [--budget-binds] [--reach-model-len]
        [--prefix-caching] [--priority] [--whole-canvas-fix] [--read-only-hold-fix]
        [--model-len-hold-fix] [--lifted-by FIX ...] [--trace] [--json FILE]

Takes program N as `scripts/vllm_dllm_check.py` draws it, with the same options
(`integrations.vllm.dllm_arguments`), and runs it in the synchronous loop and then the
asynchronous one (with P pipeline stages; or only `--loop`); the first rule it breaks there (or
`--rule`) is the target. `integrations.vllm.dllm_shrink.shrink_dllm` then removes requests,
aborts and steps and reduces each request's script and the serving configuration while that
loop still breaks that rule, at most `--budget` runs (default 3000). With `--lifted-by FIX`
(`whole-canvas`, `model-len-hold`, `read-only-hold`) a smaller program is kept only if it also
passes that loop with FIX made: the shrink keeps the finding FIX lifts. Prints the program's
size before and after, the smaller program's violation and the smaller program as Python
(`DllmProgram(...)`, which `integrations.vllm.diffusion.run_dllm` takes as it is: the
fabricated runner draws nothing); `--trace` also prints its run, one line per submission,
abort, `schedule()` call and applied output, up to the violation; `--json` writes it all, with
the vLLM release it ran (`"release"`).

Exit 0 if the program breaks no rule in the loops run (or not `--rule`), or vLLM refuses it as
drawn (from the space the flags choose, without the other options): nothing to shrink; 1 with
the smaller program printed; 2, one line on stderr, for a usage error or for options with which
vLLM refuses the program (it serves it as drawn without them). Needs `schedspec install-engines
vllm`.
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
from integrations.vllm.diffusion import RULES, DllmProgram, dllm_program
from integrations.vllm.dllm_arguments import (
    add_dllm_arguments,
    check_dllm_arguments,
    dllm_generator,
    fix_names,
    space,
)
from integrations.vllm.dllm_shrink import (
    dllm_fails_like,
    dllm_lifted_by,
    dllm_program_source,
    run_dllm_named,
    shrink_dllm,
)
from integrations.vllm.fixes import DLLM_FIX_ORDER
from integrations.vllm.manifest import VLLM_VERSION
from integrations.vllm.program_tally import add_pipeline_argument
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
    """The script's arguments: the program, the loop and rule, the budget, the pipeline stages,
    the program space and fixes of `scripts/vllm_dllm_check.py`, `--lifted-by`, `--trace` and
    `--json`; a usage error is one line (`schedspec_cli.args.Parser`: `UsageError`)."""
    parser = Parser(prog="scripts/vllm_dllm_shrink.py")
    add_shrink_arguments(parser, RULES, DLLM_FIX_ORDER)
    add_pipeline_argument(parser)
    add_dllm_arguments(parser)
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
    check_dllm_arguments(parser, args)
    check_shrink_arguments(args, parser)
    if args.loop == "sync" and args.pipeline_parallel > 1:
        parser.error("--pipeline-parallel > 1 runs the async loop only; drop --loop sync")
    scheduler_cls = check_scheduler_cls(args, parser, diffusion=True)
    names = fix_names(args)
    drawn = dllm_generator(args)(args.seed)
    name = f"program {args.seed} ({', '.join(k for k, v in space(args).items() if v) or 'random'}"
    name += f"; fix {' + '.join(names)})" if names else ")"
    stages = args.pipeline_parallel

    def served(async_scheduling: bool) -> DllmProgram:
        """The program as the loop serves it: the asynchronous loop with P stages."""
        p = stages if async_scheduling else 1
        return replace(drawn, serving=replace(drawn.serving, pipeline_parallel_size=p))

    # the program as drawn from the space the flags choose, without the other options (its
    # serving's settings, the pipeline stages, the fixes): does vLLM serve it at all?
    as_drawn = dllm_program(args.seed, **space(args))
    start = time.perf_counter()
    try:
        found = shrink_target(
            name,
            lambda a: run_dllm_named(served(a), a, names),
            args.loop,
            args.rule,
            plain=lambda a: run_dllm_named(as_drawn, a),
        )
    except RefusedByFlags as err:
        parser.error(str(err))
    if found is None:
        return 0
    loop, first = found
    async_scheduling = loop == "async"
    program = served(async_scheduling)
    fails = dllm_fails_like(async_scheduling, first.rule, names)
    lifting = sorted(set(args.lifted_by or ()) - set(names))
    if lifting:
        fails = dllm_lifted_by(fails, async_scheduling, names + lifting)
        if not lifted(name, fails, program, lifting):
            return 0
    result = shrink_dllm(program, fails, budget=args.budget)
    smaller = fails(result.program)
    assert smaller is not None  # shrink keeps only programs that fail
    elapsed = time.perf_counter() - start
    trace = (
        traced_run(lambda lines: run_dllm_named(result.program, async_scheduling, names, lines))
        if args.trace
        else None
    )
    record = report(
        program=program,
        result=result,
        smaller=smaller,
        source=dllm_program_source(result.program),
        elapsed=elapsed,
        loop=loop,
        reproduce="as it is (the fabricated runner draws nothing)"
        + with_class(scheduler_cls)
        + ":",
        trace=trace,
    )
    if args.json:
        write_json(
            args.json,
            {
                "path": "diffusion",
                "release": VLLM_VERSION,
                "scheduler_cls": scheduler_cls,
                "seed": args.seed,
                "space": space(args),
                "pipeline_parallel_size": stages,
                "fix": " + ".join(names) or None,
                "lifted_by": " + ".join(lifting) or None,
                "rule": first.rule,
                "first": first.detail,
                **record,
            },
        )
    return 1


if __name__ == "__main__":
    pin_hash_seed()  # the same figures on every run (integrations.hash_seed)
    sys.exit(main())
