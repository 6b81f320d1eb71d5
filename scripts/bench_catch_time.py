"""Benchmark: how fast the suites catch each seeded bug of the catalogue.

Per mutant (tests/mutants.py for dLLM, tests/ar_mutants.py for AR): the generated programs
(examples) and seconds until the first failure with shrinking off — what a CI run pays — and,
in a second run with shrinking on, the number of actions in the shrunk program a developer
reads. Prints a table and writes JSON.

    .venv/bin/python scripts/bench_catch_time.py [--only NAME,...] [--no-shrink] [--json PATH]

Goal (issue "Checking power"): every mutant caught within 200 examples and 30 s on 2 cores,
shrunk programs under 8 steps. Hypothesis runs derandomized, so figures repeat on one machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the catalogue lives in tests/

from properties.ar.conformance import ar_conformance_machine  # noqa: E402
from properties.conformance import conformance_machine  # noqa: E402
from properties.conformance_base import StepCounter  # noqa: E402
from properties.verify import failure_from, run_machine  # noqa: E402
from tests.ar_mutants import AR_MUTANTS  # noqa: E402
from tests.mutants import MUTANTS  # noqa: E402

MAX_EXAMPLES = 1000
NO_SHRINK = settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    stateful_step_count=30,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
SHRINK = settings(NO_SHRINK, phases=[*NO_SHRINK.phases, Phase.shrink])


@dataclass(frozen=True, slots=True)
class Catch:
    family: str
    mutant: str
    expected_rule: str
    rule: str  # the rule the suite reported ("" = not caught within MAX_EXAMPLES)
    examples: int  # generated programs up to and including the failing one
    seconds: float
    shrunk_actions: int | None  # actions in the shrunk program (None: shrinking not run)


def _actions(program: str) -> int:
    # `state.round()` and `requests_0 = state.submit(...)`: every call on the machine
    calls = [ln.split(" = ", 1)[-1].strip() for ln in program.splitlines()]
    calls = [c for c in calls if c.startswith("state.")]
    return sum(1 for c in calls if "are_checked" not in c and "teardown" not in c)


def catch(
    family: str, name: str, rule: str, build: Callable[[StepCounter], Any], shrink: bool
) -> Catch:
    counter = StepCounter()
    start = time.perf_counter()
    err, printed = run_machine(build(counter), NO_SHRINK)
    seconds = time.perf_counter() - start
    found = failure_from(err, printed).rule if err is not None else ""
    shrunk = None
    if shrink and err is not None:
        err2, printed2 = run_machine(build(StepCounter()), SHRINK)
        if err2 is not None:
            shrunk = _actions(failure_from(err2, printed2).program)
    # the counter counts completed examples; the failing one ends early and is not counted
    examples = counter.examples + (1 if err is not None else 0)
    return Catch(family, name, rule, str(found), examples, seconds, shrunk)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated mutant names (default: all)")
    parser.add_argument("--no-shrink", action="store_true", help="skip the shrinking runs")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    rows: list[Catch] = []
    for name, m in sorted(MUTANTS.items()):
        if only is None or name in only:

            def build_dllm(c: StepCounter, m: Any = m) -> Any:
                return conformance_machine(m.factory, configs=m.configs, counter=c)

            rows.append(catch("dllm", name, m.rule, build_dllm, not args.no_shrink))
            _print_row(rows[-1])
    for name, am in sorted(AR_MUTANTS.items()):
        if only is None or name in only:

            def build_ar(c: StepCounter, m: Any = am) -> Any:
                return ar_conformance_machine(m.factory, configs=m.configs, counter=c)

            rows.append(catch("ar", name, am.rule, build_ar, not args.no_shrink))
            _print_row(rows[-1])
    caught = [r for r in rows if r.rule == r.expected_rule]
    in_goal = [r for r in caught if r.examples <= 200 and r.seconds <= 30]
    short = [r for r in caught if r.shrunk_actions is not None and r.shrunk_actions < 8]
    print(
        f"\n{len(caught)}/{len(rows)} caught with their rule; {len(in_goal)} within 200 examples "
        f"and 30 s; {len(short)} shrunk to < 8 actions"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"mutants": [asdict(r) for r in rows]}, indent=2) + "\n", encoding="utf-8"
        )
    return 0 if len(caught) == len(rows) else 1


def _print_row(r: Catch) -> None:
    ok = "ok" if r.rule == r.expected_rule else f"GOT {r.rule or 'nothing'}"
    shrunk = "-" if r.shrunk_actions is None else str(r.shrunk_actions)
    print(
        f"{r.family:<5} {r.mutant:<34} {r.expected_rule:<30} {ok:<6} "
        f"{r.examples:>5} ex {r.seconds:>6.2f} s  shrunk {shrunk:>3}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
