"""Benchmark: stateful steps per second of the conformance machine (`schedspec bench conformance`).

A step is one rule execution (submit, abort, round, drain) including the spec replay of every
event it caused, the invariant checks and the snapshot comparison. Prints a table and writes
JSON; this is a script, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from properties.conformance import StepCounter, conformance_machine
from properties.registry import resolve
from properties.verify import run_machine, verify_settings


def bench_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="schedspec bench conformance")
    p.add_argument("--impl", action="append", default=None)
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--parity", choices=("on", "off"), default="on")
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = []
    for name in args.impl or ["reference-dllm", "reference-dllm-joint"]:
        display, factory, builtin = resolve(name)
        counter = StepCounter()
        policy = (builtin.parity if builtin else "always") if args.parity == "on" else "never"
        machine = conformance_machine(factory, counter=counter, parity=policy)
        start = time.perf_counter()
        err, _ = run_machine(machine, verify_settings(args.examples))
        seconds = time.perf_counter() - start
        rows.append(
            {
                "impl": display,
                "examples": counter.examples,
                "steps": counter.steps,
                "seconds": round(seconds, 3),
                "steps_per_s": round(counter.steps / seconds, 1),
                "parity_check": args.parity,
                "passed": err is None,
            }
        )
    print(f"{'impl':<24}{'examples':>10}{'steps':>8}{'seconds':>9}{'steps/s':>10}  parity")
    for r in rows:
        print(
            f"{r['impl']:<24}{r['examples']:>10}{r['steps']:>8}{r['seconds']:>9}"
            f"{r['steps_per_s']:>10}  {r['parity_check']}"
        )
    if args.json:
        payload = {"machine": platform.machine(), "python": platform.python_version(), "rows": rows}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0 if all(r["passed"] for r in rows) else 1
