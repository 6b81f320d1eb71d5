"""SGLang 0.5.23's dLLM path with its radix cache on (SGLang's default for dLLM), checked over
generated programs.

    .venv/bin/python scripts/sglang_radix_check.py --programs 300 [--fix NAME ...] [--all-fixes]
        [--cache-off] [--pressure] [--no-spec] [--schedule-policy NAME] [--json FILE]

Runs each program (seeds 0..N-1, `integrations.sglang.radix_check.radix_program`) through
SGLang's real scheduler and worker with the block-level radix cache on, and checks by outcome
(`integrations.sglang.radix_check`: output content, clean cache hits, pool accounting, no leak,
progress) and, unless `--no-spec`, the run's event log (`SglangEventLog`) against the dLLM
spec with its prefix cache (`spec:<rule>`); prints the failures (rule, first seeds and
message), how often the cache was hit and the log's cache events.
`--fix` applies SGLang fixes of `integrations.sglang.fixes` (repeatable; `--all-fixes`: the
five); `--cache-off` runs the same programs with the cache disabled (the control);
`--pressure` shrinks the pool below what every running request can claim;
`--schedule-policy` serves under that SGLang policy (default fcfs; `lpm` and the other
cache-aware ones, and `random`, are logged with a free queue order; `random`'s shuffle is
seeded with each program's seed). Exit 1 if a program failed. Needs
`schedspec install-engines sglang`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.sglang.engine import SCHEDULE_POLICIES
from integrations.sglang.fixes import FIX_NAMES, SGLANG_FIXES, sglang_fixed
from integrations.sglang.radix_check import RadixViolation, check_program, radix_program
from schedspec_cli.output import output_file, write_json

COUNTS = (
    "rounds",
    "forwards",
    "aborts",
    "stops",
    "hits",
    "hit_blocks",
    "evictions",
    "log_cached",
    "log_hits",
    "log_evicted",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/sglang_radix_check.py")
    parser.add_argument("--programs", type=int, default=300, help="programs to run (seeds 0..N-1)")
    parser.add_argument(
        "--fix",
        choices=SGLANG_FIXES.names,
        action="append",
        default=None,
        help="apply this SGLang fix (repeatable)",
    )
    parser.add_argument("--all-fixes", action="store_true", help="apply the five SGLang fixes")
    parser.add_argument(
        "--cache-off", action="store_true", help="run with the radix cache disabled (the control)"
    )
    parser.add_argument(
        "--pressure",
        action="store_true",
        help="a pool between one request's context and every running request's (KV pressure)",
    )
    parser.add_argument(
        "--no-spec",
        action="store_true",
        help="check by outcome only (no event log, no spec)",
    )
    parser.add_argument(
        "--schedule-policy",
        choices=SCHEDULE_POLICIES,
        default="fcfs",
        help="SGLang's --schedule-policy to serve under (default fcfs)",
    )
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the figures to this file"
    )
    args = parser.parse_args(argv)
    if args.programs < 1:
        parser.error("--programs: must be >= 1")
    names = sorted(set(args.fix or ()) | (set(FIX_NAMES) if args.all_fixes else set()))
    logging.getLogger("sglang").setLevel(logging.CRITICAL)  # its eviction notes are not findings
    start = time.perf_counter()
    failures: dict[str, list[int]] = {}
    first: dict[str, str] = {}
    totals: Counter[str] = Counter()
    with sglang_fixed(names) if names else contextlib.nullcontext():
        for seed in range(args.programs):
            random.seed(seed)  # `random`'s shuffle draws from Python's global generator
            try:
                program = radix_program(seed, pressure=args.pressure)
                counts = check_program(
                    program,
                    radix_cache=not args.cache_off,
                    spec=not args.no_spec,
                    schedule_policy=args.schedule_policy,
                )
            except RadixViolation as err:
                failures.setdefault(err.rule, []).append(seed)
                first.setdefault(err.rule, err.detail)
                continue
            totals.update(vars(counts))
    elapsed = time.perf_counter() - start
    passed = args.programs - sum(map(len, failures.values()))
    cache = "off" if args.cache_off else "on"
    fixed = f"; fixes {' + '.join(names)}" if names else ""
    fixed += "; KV pressure" if args.pressure else ""
    fixed += f"; --schedule-policy {args.schedule_policy}"
    fixed += "; by outcome only" if args.no_spec else "; event logs checked by the spec"
    print(f"{args.programs} programs (radix cache {cache}{fixed}), {passed} pass")
    for key in COUNTS:
        print(f"  {key:<12} {totals[key]:>8}")
    for rule, seeds in failures.items():
        print(f"FAIL [{rule}] {len(seeds)} programs, first seeds {seeds[:5]}: {first[rule]}")
    print(f"({elapsed:.1f} s)")
    if args.json:
        write_json(
            args.json,
            {
                "programs": args.programs,
                "radix_cache": not args.cache_off,
                "pressure": args.pressure,
                "schedule_policy": args.schedule_policy,
                "spec": not args.no_spec,
                "fixes": names,
                "passed": passed,
                "failures": {r: {"seeds": s, "first": first[r]} for r, s in failures.items()},
                "counts": dict(totals),
                "seconds": elapsed,
            },
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
