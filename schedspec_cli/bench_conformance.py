"""`schedspec bench conformance`: stateful steps per second of the conformance machine.

A step is one rule execution (submit, abort, round, drain) including the spec replay of every
event it caused, the invariant checks and the snapshot comparison. With `--twin NAME` each
implementation runs twice in the same process, without and then with that decision twin (the
same derandomized programs, after an untimed warm-up of 20 programs), and the table gives the
twin's cost as a ratio of the two times per step. `--seed N` draws the programs `verify --seed N`
draws. torch runs on `--threads` intra-op threads (one by default, as `verify --impl` checks;
the JSON records the count, null when nothing loaded torch).
Prints a table and writes JSON; this is a script, not a timed test.
"""

from __future__ import annotations

import platform
import time
from typing import Any

from properties.conformance import ParityPolicy, StepCounter
from properties.verify import Twin, forced_seed, machine_for, run_machine, verify_settings
from schedspec_cli.args import MAX_EXAMPLES, MAX_SEED, Parser, int_in, positive
from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
from schedspec_cli.impls import refuse_parity_for_ar_only, resolve
from schedspec_cli.output import check_output_path, table, write_json
from schedspec_cli.torch_threads import (
    add_threads_argument,
    pin_torch_threads,
    torch_threads_now,
)
from schedspec_cli.twins import twin_for_target, twin_for_targets
from spec.implementation import Family, Implementation


def build_parser() -> Parser:
    """The command's flags; a bad one raises `UsageError` (exit 2)."""
    p = Parser(prog="schedspec bench conformance", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--impl",
        action="append",
        default=None,
        help="built-in name or module:attribute (repeatable; default the two references)",
    )
    p.add_argument("--examples", type=positive(MAX_EXAMPLES), default=200, help="programs per impl")
    p.add_argument(
        "--parity",
        choices=("on", "off"),
        help="dLLM implementations: include the output check (default on)",
    )
    p.add_argument(
        "--twin",
        metavar="NAME|MODULE:ATTR",
        help="also run each implementation with this decision twin (as verify --twin) and "
        "report the twin's cost as a ratio of the two times",
    )
    p.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        metavar="N",
        help="draw the programs from this seed, as verify --seed does (default: the fixed one)",
    )
    add_threads_argument(p, ", as verify --impl checks")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON here")
    return p


def bench_main(argv: list[str]) -> int:
    """`schedspec bench conformance`: run the conformance machine for `--examples` programs
    on each `--impl` (default `reference-dllm` and `reference-dllm-joint`), with `--twin` also
    with that twin; print the steps-per-second table and write the rows to `--json` when given.
    Returns 0 when every run passed, 1 when one failed; a bad flag, name or path raises
    (`UsageError`, `ConfigError`: exit 2) before anything runs."""
    args = build_parser().parse_args(argv)
    check_output_path("--json", args.json)
    with implementation_stdout_to_stderr():  # what a module prints as it is imported, too
        targets = [resolve(n) for n in args.impl or ["reference-dllm", "reference-dllm-joint"]]
    refuse_parity_for_ar_only(args.parity, targets)
    pin_torch_threads(args.threads)  # after loading: an engine's torch is imported by now
    twin = twin_for_targets(args.twin, targets) if args.twin is not None else None
    parity = args.parity or "on"
    rows = []
    for t in targets:
        dllm = t.family is Family.DLLM
        policy: ParityPolicy = "always" if parity == "on" and dllm else "never"
        if twin:  # warm up (lazy imports, caches) so that neither timed run pays for it
            _run(t.implementation, policy, None, min(args.examples, WARM_UP_EXAMPLES), args.seed)
        its_twin = twin_for_target(twin, t)[0] if twin else None
        for with_twin in (None, its_twin) if its_twin else (None,):
            row = _run(t.implementation, policy, with_twin, args.examples, args.seed)
            rows.append({"impl": t.name, **row, "parity_check": parity if dllm else "n/a"})
            if with_twin is not None:  # cost: time per step with the twin / without
                alone = rows[-2]
                rows[-1]["twin_cost"] = round(
                    (row["seconds"] / max(row["steps"], 1))
                    / (alone["seconds"] / max(alone["steps"], 1)),
                    2,
                )
    headers: tuple[str, ...] = (
        *("impl", "twin", "examples", "steps", "seconds", "steps/s", "passed", "parity"),
    )
    cells = [tuple(r[k] for k in _KEYS) for r in rows]
    if twin:
        headers += ("twin cost",)
        cells = [(*c, r.get("twin_cost", "-")) for c, r in zip(cells, rows, strict=True)]
    print(table(headers, cells))
    payload = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "seed": args.seed,
        "threads": torch_threads_now(),
        "rows": rows,
    }
    write_json(args.json, payload)
    return 0 if all(r["passed"] for r in rows) else 1


WARM_UP_EXAMPLES = 20
_KEYS = ("impl", "twin", "examples", "steps", "seconds", "steps_per_s", "passed", "parity_check")


def _run(
    impl: Implementation, parity: ParityPolicy, twin: Twin | None, examples: int, seed: int | None
) -> dict[str, Any]:
    counter = StepCounter()
    machine = machine_for(impl, parity=parity, counter=counter, twin=twin)
    start = time.perf_counter()
    # an implementation's own prints stay off the table
    with forced_seed(seed), implementation_stdout_to_stderr():
        err, _ = run_machine(machine, verify_settings(examples, seed_derandomize=seed is None))
    seconds = time.perf_counter() - start
    return {
        "twin": twin.name if twin else "-",
        "examples": counter.examples,
        "steps": counter.steps,
        "seconds": round(seconds, 3),
        "steps_per_s": round(counter.steps / seconds, 1) if seconds else 0.0,
        "passed": err is None,
    }
