"""How often the cache-aware order moves the waiting queue in the AR suite's programs.

    .venv/bin/python scripts/cache_aware_tally.py [--impl TARGET] [--examples N] [--seed S]
        [--json FILE]

Runs the AR conformance suite on an implementation that declares `ArPolicy.cache_aware_window`
(default: the twin `reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE`; on vLLM 0.34.0 also
`integrations.vllm:REAL_VLLM_CACHE_AWARE`, with `SCHEDSPEC_VLLM_VERSION=0.34.0`) and counts, in
the spec machine, the admission phases where the window engaged (FCFS, prefix caching, no
preemption, two or more waiting, the pool used at least the threshold: `asked`, the order
computed by `spec.ar.cache_aware`) and those where it moved the queue (`moved`). A pass in
which the queue never moved would say nothing of the option: this shows it is exercised.
`cut` counts the phases where a request in the window was ranked below its whole cached prefix
because of its cache read limit (`ArRequest.cache_read_limit`: it may read only so much), the
case vLLM 0.34.0's ranking gets wrong (docs/engines/vllm-0.34.md).
Exit 0 on a pass, 1 on a violation, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import spec.ar.machine as ar_machine
from properties.ar.conformance import ar_conformance_machine
from properties.verify import forced_seed, run_machine, verify_settings
from schedspec_cli.loader import load_object
from schedspec_cli.output import output_file, write_json
from spec.ar.cache_aware import cache_aware_order
from spec.errors import SchedSpecError
from spec.implementation import ArImplementation

DEFAULT_IMPL = "reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE"


def _whole_prefix(machine: ar_machine.ArSpecMachine, rid: str) -> int:
    """The tokens of `rid`'s prefix the spec machine's cache holds, its limit ignored."""
    r = machine._requests[rid]
    bs = machine.config.block_size
    cached = set(machine._cache.values())
    k = 0
    while k < (r.known - 1) // bs and machine._key(r, k) in cached:
        k += 1
    return k * bs


def _counting(
    tally: dict[str, int], current: list[ar_machine.ArSpecMachine]
) -> Callable[..., list[str]]:
    def order(
        queue: Sequence[str],
        window: int,
        fresh: Callable[[str], bool],
        cached_tokens: Callable[[str], int],
    ) -> list[str]:
        out = cache_aware_order(queue, window, fresh, cached_tokens)
        tally["asked"] += 1
        tally["moved"] += out != list(queue)
        machine = current[-1]
        tally["cut"] += any(
            fresh(rid)
            and machine._requests[rid].cache_read_limit is not None
            and _whole_prefix(machine, rid) > cached_tokens(rid)
            for rid in queue[:window]
        )
        return out

    return order


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/cache_aware_tally.py")
    parser.add_argument("--impl", default=DEFAULT_IMPL, help="an ArImplementation import string")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=output_file, default=None)
    args = parser.parse_args(argv)
    try:
        impl = load_object(args.impl)
    except SchedSpecError as err:
        print(f"cache_aware_tally: {err}", file=sys.stderr)
        return 2
    if not isinstance(impl, ArImplementation) or not impl.profile.policy.cache_aware_window:
        print(
            f"cache_aware_tally: {args.impl} is not an AR implementation whose profile declares "
            "cache_aware_window (e.g. " + DEFAULT_IMPL + ")",
            file=sys.stderr,
        )
        return 2
    tally = {"asked": 0, "moved": 0, "cut": 0}
    # the machine calls the order function by its module-level name: count through it, and
    # put it back after (a test may call `main` in a process that goes on checking); the
    # machine asking is noted by wrapping its reorder
    current: list[ar_machine.ArSpecMachine] = []
    reorder = ar_machine.ArSpecMachine._reorder_cache_aware

    def noting(machine: ar_machine.ArSpecMachine) -> None:
        current.append(machine)
        try:
            reorder(machine)
        finally:
            current.pop()

    vars(ar_machine)["cache_aware_order"] = _counting(tally, current)
    ar_machine.ArSpecMachine._reorder_cache_aware = noting  # type: ignore[method-assign,assignment]
    try:
        machine = ar_conformance_machine(impl.factory, profile=impl.profile)
        with forced_seed(args.seed):
            failure, _ = run_machine(
                machine, verify_settings(args.examples, seed_derandomize=False)
            )
    finally:
        vars(ar_machine)["cache_aware_order"] = cache_aware_order
        ar_machine.ArSpecMachine._reorder_cache_aware = reorder  # type: ignore[method-assign]
    result = "PASS" if failure is None else f"FAIL: {str(failure).splitlines()[0]}"
    print(f"{'impl':<48}  {'examples':>8}  {'asked':>6}  {'moved':>6}  {'cut':>6}  result")
    print(
        f"{args.impl:<48}  {args.examples:>8}  {tally['asked']:>6}  {tally['moved']:>6}  "
        f"{tally['cut']:>6}  {result}"
    )
    write_json(
        args.json,
        {
            "impl": args.impl,
            "examples": args.examples,
            "seed": args.seed,
            **tally,
            "result": result,
        },
    )
    return 0 if failure is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
