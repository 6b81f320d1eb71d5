"""What the two shrink scripts share: `scripts/vllm_shrink.py` (the autoregressive engine-core
loop's programs) and `scripts/vllm_dllm_shrink.py` (the diffusion loop's) take a program by seed,
find the rule it breaks, shrink it, and print and record the result the same way.

`add_shrink_arguments` adds the options both take (`--seed`, `--loop`, `--rule`, `--budget`,
`--lifted-by`, `--trace`; each script adds its `--json` itself, with the CLI's output check),
`first_failure` finds the loop and rule to keep broken, `report` prints the shrunk program and
its run and returns the JSON record both write.

A configuration vLLM refuses is one of two things. When vLLM serves the program as drawn (its
seed, from the space the flags choose) without the run's other flags, those flags made it refuse:
`shrink_target` raises `RefusedByFlags`, which each script reports as a usage error (exit 2, one
line). When vLLM refuses the program even without them, the program itself is refused (as the
check scripts count it, neither passed nor failed): nothing to shrink, said, exit 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.custom_scheduler import (
    SCHEDULER_VARIABLE,
    check_for_loops,
    is_scheduler_cls_error,
)
from integrations.vllm.shrink import SHRINK_BUDGET, Shrunk, Stepped, size
from integrations.vllm.trace import compact, elide
from spec.errors import ConfigError

#: What `integrations.vllm.shrink.size` counts.
SIZES = ("requests", "aborts", "tokens")


def sizes_text(program: Stepped) -> str:
    """The program's size in words."""
    requests, aborts, tokens = size(program)
    return f"{requests} requests, {aborts} aborts, {tokens} tokens"


def add_shrink_arguments(
    parser: argparse.ArgumentParser, rules: Sequence[str], fixes: Sequence[str]
) -> None:
    """`--seed` (required), `--loop`, `--rule` (one of `rules`), `--budget`, `--lifted-by` (one
    of `fixes`, repeatable) and `--trace`."""
    parser.add_argument("--seed", type=int, required=True, help="the program to shrink")
    parser.add_argument(
        "--loop",
        choices=("sync", "async"),
        default=None,
        help="the loop to shrink in (default: the first, sync then async, that fails)",
    )
    parser.add_argument(
        "--rule", choices=rules, default=None, help="the rule to keep broken (default: the first)"
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=SHRINK_BUDGET,
        metavar="RUNS",
        help=f"loop runs at most (default {SHRINK_BUDGET})",
    )
    parser.add_argument(
        "--lifted-by",
        choices=sorted(fixes),
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


def check_scheduler_cls(
    args: argparse.Namespace, parser: argparse.ArgumentParser, *, diffusion: bool = False
) -> str | None:
    """The class `SCHEDSPEC_VLLM_SCHEDULER_CLS` names (None when unset), checked before the
    program runs against the class vLLM builds in each loop the shrink may run (`--loop`, else
    both): one that is not one is a usage error (exit 2, one line), not a configuration vLLM
    refuses. When set, a line names it (as `schedspec verify` does)."""
    loops = (args.loop,) if args.loop else ("sync", "async")
    try:
        chosen = check_for_loops(loops, diffusion=diffusion, sync_alone="--loop sync")
    except ConfigError as err:
        parser.error(one_line(str(err)))
    if chosen is not None:
        print(f"scheduler_cls {chosen} ({SCHEDULER_VARIABLE}), the class vLLM builds")
    return chosen


def with_class(chosen: str | None) -> str:
    """What the reproduction line adds for a class of the user's: run the program with the
    variable set (" with SCHEDSPEC_VLLM_SCHEDULER_CLS=my_sched.Mine set"), else nothing."""
    return "" if chosen is None else f", with {SCHEDULER_VARIABLE}={chosen} set"


def check_shrink_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """A usage error (exit 2, one line) for a seed below 0, or a budget or stage count below 1."""
    if args.seed < 0 or args.budget < 1 or args.pipeline_parallel < 1:
        parser.error("--seed must be >= 0, --budget and --pipeline-parallel >= 1")


def first_failure(
    run: Callable[[bool], object], loop: str | None, rule: str | None
) -> tuple[str, EngineCoreViolation] | None:
    """The first loop (`loop`, else sync then async) in which `run(async_scheduling)` breaks
    `rule` (else any rule), with the violation; None if none does. A `ConfigError` (a
    configuration vLLM refuses) propagates."""
    for mode in (loop,) if loop else ("sync", "async"):
        try:
            run(mode == "async")
        except EngineCoreViolation as err:
            if rule is None or err.rule == rule:
                return mode, err
    return None


class RefusedByFlags(Exception):
    """vLLM refuses a program with the flags given and serves it without them: an input error
    (exit 2); the message is one line, for the script's `parser.error`."""


def shrink_target(
    name: str,
    run: Callable[[bool], object],
    loop: str | None,
    rule: str | None,
    plain: Callable[[bool], object],
) -> tuple[str, EngineCoreViolation] | None:
    """`first_failure`, said: the loop and violation to shrink, printed after `name` (the
    program); None, with the reason printed, when there is nothing to shrink (no rule broken,
    or a program vLLM refuses as drawn). A configuration vLLM refuses in a loop in which it
    serves the program without the flags (`plain(async_scheduling)`, breaking a rule or not)
    raises `RefusedByFlags`. An error about the user's scheduler class
    (`SCHEDSPEC_VLLM_SCHEDULER_CLS`) propagates: it is neither."""
    tried: list[bool] = []

    def tracked(async_scheduling: bool) -> object:
        tried.append(async_scheduling)
        return run(async_scheduling)

    try:
        found = first_failure(tracked, loop, rule)
    except ConfigError as err:
        if is_scheduler_cls_error(err):
            raise  # the user's scheduler class, not a configuration vLLM refuses
        said = one_line(str(err))
        mode = tried[-1] if tried else loop == "async"
        if not _served(plain, mode):
            print(f"{name}: vLLM refuses its configuration: {said}")
            return None
        where = "async" if mode else "sync"
        raise RefusedByFlags(
            f"vLLM refuses {name} with the flags given, and serves it without them in the "
            f"{where} loop: {said}; valid: flags with which vLLM serves this program, or "
            "another --seed"
        ) from None
    if found is None:
        wanted = f" [{rule}]" if rule else " any rule"
        print(f"{name} breaks{wanted} in neither loop run: nothing to shrink")
        return None
    print(f"{name}: [{found[1].rule}] {found[1].detail}")
    return found


def _served(plain: Callable[[bool], object], async_scheduling: bool) -> bool:
    """Whether vLLM serves the program without the flags in that loop: it runs, or breaks a
    rule, instead of refusing its configuration."""
    try:
        plain(async_scheduling)
    except ConfigError:
        return False
    except EngineCoreViolation:
        return True
    return True


def one_line(text: str) -> str:
    """`text` with its line breaks and runs of blanks made single spaces (a usage error, or a
    refusal vLLM words over lines, is said in one line)."""
    return " ".join(text.split())


def lifted(name: str, fails: Callable[[Any], object], program: Any, lifting: list[str]) -> bool:
    """Whether `program` fails as `fails` (already kept to the fixes `lifting`) says; if not,
    print that it still breaks a rule with them: nothing to shrink."""
    if fails(program):
        return True
    print(f"{name} still breaks a rule with {' + '.join(lifting)}: nothing to shrink")
    return False


def traced_run(run: Callable[[list[str]], object]) -> list[str]:
    """The lines `run(trace)` appends to its trace, idle runs folded, ending at the violation;
    a run longer than 80 lines (a hang) keeps its first 60 and its last 20 (`elide`)."""
    trace: list[str] = []
    try:
        run(trace)
    except EngineCoreViolation as err:
        trace.append(f"violation: [{err.rule}] {err.detail}")
    return elide(compact(trace))


def report(
    *,
    program: Stepped,
    result: Shrunk[Any],
    smaller: EngineCoreViolation,
    source: str,
    elapsed: float,
    loop: str,
    reproduce: str,
    trace: list[str] | None,
) -> dict[str, object]:
    """Print the shrink's outcome: its runs and sizes, the smaller program's violation, how to
    run it (`reproduce`, a line), its source and, if traced, its run in `loop`. Returns the
    fields of the JSON record both scripts write about it."""
    budget = " (the budget ran out)" if result.exhausted else ""
    print(
        f"shrunk in {result.runs} runs{budget}, {elapsed:.1f} s: {sizes_text(program)} -> "
        f"{sizes_text(result.program)}"
    )
    print(f"[{smaller.rule}] {smaller.detail}")
    print(reproduce)
    print(source)
    if trace is not None:
        print(f"its run in the {loop} loop:")
        print("\n".join(f"  {line}" for line in trace))
    return {
        "loop": loop,
        "shrunk": smaller.detail,
        "runs": result.runs,
        "exhausted": result.exhausted,
        "size_before": dict(zip(SIZES, size(program), strict=True)),
        "size_after": dict(zip(SIZES, size(result.program), strict=True)),
        "program": source,
        "trace": trace,
        "seconds": elapsed,
    }


__all__ = [
    "SIZES",
    "RefusedByFlags",
    "add_shrink_arguments",
    "check_scheduler_cls",
    "check_shrink_arguments",
    "first_failure",
    "lifted",
    "one_line",
    "report",
    "shrink_target",
    "sizes_text",
    "traced_run",
    "with_class",
]
