"""`schedspec bench conformance`: stateful steps per second of the conformance machine.

A step is one rule execution (submit, abort, round, drain) including the spec replay of every
event it caused, the invariant checks and the snapshot comparison. Prints a table and writes
JSON; this is a script, not a timed test.
"""

from __future__ import annotations

import platform
import time

from properties.conformance import ParityPolicy, StepCounter
from properties.verify import machine_for, run_machine, verify_settings
from schedspec_cli.args import MAX_EXAMPLES, Parser, positive
from schedspec_cli.impls import refuse_parity_for_ar_only, resolve
from schedspec_cli.output import check_output_path, table, write_json
from spec.implementation import Family


def bench_main(argv: list[str]) -> int:
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
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON here")
    args = p.parse_args(argv)
    check_output_path("--json", args.json)
    targets = [resolve(n) for n in args.impl or ["reference-dllm", "reference-dllm-joint"]]
    refuse_parity_for_ar_only(args.parity, targets)
    parity = args.parity or "on"
    rows = []
    for t in targets:
        counter = StepCounter()
        dllm = t.family is Family.DLLM
        policy: ParityPolicy = "always" if parity == "on" and dllm else "never"
        machine = machine_for(t.implementation, parity=policy, counter=counter)
        start = time.perf_counter()
        err, _ = run_machine(machine, verify_settings(args.examples))
        seconds = time.perf_counter() - start
        rows.append(
            {
                "impl": t.name,
                "examples": counter.examples,
                "steps": counter.steps,
                "seconds": round(seconds, 3),
                "steps_per_s": round(counter.steps / seconds, 1) if seconds else 0.0,
                "parity_check": parity if dllm else "n/a",
                "passed": err is None,
            }
        )
    headers = ("impl", "examples", "steps", "seconds", "steps/s", "parity", "passed")
    print(table(headers, [tuple(r.values()) for r in rows]))
    payload = {"machine": platform.machine(), "python": platform.python_version(), "rows": rows}
    write_json(args.json, payload)
    return 0 if all(r["passed"] for r in rows) else 1
