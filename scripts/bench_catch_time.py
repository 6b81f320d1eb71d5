"""Benchmark: how fast the suites catch each seeded bug of the catalogue.

Per mutant (tests/mutants.py for dLLM, tests/ar_mutants.py for AR): the generated programs
(examples) and seconds until the first failure with shrinking off — what a CI run pays — and,
in a second run with shrinking on, the number of actions in the shrunk program a developer
reads. Each mutant is hunted once per seed (`--seeds`, default 0..4: Hypothesis's random
generator forced to that seed, so figures repeat); the table shows the median and the worst
over the seeds. Shrinking (about 20x the hunt) runs for the first seed only unless
`--shrink-all-seeds`. Each mutant runs under its own profile, as its catalogue test does. By
default Hypothesis draws no constants mined from loaded modules, as under the ci profile and on
the command line (`properties.profiles.draw_no_mined_constants`); `--mined-constants` draws
them, as the dev and release profiles do outside CI. Prints a table and writes JSON.

    .venv/bin/python scripts/bench_catch_time.py [--only NAME,...] [--seeds 0,1,2,3,4]
        [--no-shrink | --shrink-all-seeds] [--mined-constants] [--json PATH]

Goal (issue "Checking power"): every mutant caught within 200 examples and 30 s on 2 cores,
shrunk programs under 8 steps — here: in the worst seed.
"""

from __future__ import annotations

import argparse
import statistics
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
from properties.profiles import draw_no_mined_constants  # noqa: E402
from properties.verify import failure_from, forced_seed, run_machine  # noqa: E402
from schedspec_cli.output import output_file, write_json  # noqa: E402
from tests.ar_mutants import AR_MUTANTS  # noqa: E402
from tests.mutants import MUTANTS  # noqa: E402

MAX_EXAMPLES = 1000
GOAL_EXAMPLES, GOAL_SECONDS, GOAL_ACTIONS = 200, 30.0, 8
NO_SHRINK = settings(
    max_examples=MAX_EXAMPLES,
    derandomize=False,  # the seed is forced per run (see `_seeded`)
    deadline=None,
    database=None,
    stateful_step_count=30,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
SHRINK = settings(NO_SHRINK, phases=[*NO_SHRINK.phases, Phase.shrink])


@dataclass(frozen=True, slots=True)
class Hunt:
    """One seed's hunt for one mutant."""

    seed: int
    rule: str  # the rule the suite reported ("" = not caught within MAX_EXAMPLES)
    examples: int  # generated programs up to and including the failing one
    seconds: float
    shrunk_actions: int | None  # actions in the shrunk program (None: shrinking not run)


@dataclass(frozen=True, slots=True)
class Catch:
    family: str
    mutant: str
    expected_rule: str
    rule: str  # the rule reported in the worst seed ("" = some seed did not catch it)
    examples: int  # median over the seeds
    seconds: float  # median over the seeds
    worst_examples: int
    worst_seconds: float
    shrunk_actions: int | None  # the longest shrunk program over the seeds shrunk
    hunts: tuple[Hunt, ...]


def _actions(program: str) -> int:
    # `state.round()` and `requests_0 = state.submit(...)`: every call on the machine
    calls = [ln.split(" = ", 1)[-1].strip() for ln in program.splitlines()]
    calls = [c for c in calls if c.startswith("state.")]
    return sum(1 for c in calls if "are_checked" not in c and "teardown" not in c)


def _seeded(seed: int, machine: Any, run_settings: settings) -> tuple[BaseException | None, str]:
    """Run with Hypothesis's random generator forced to `seed` (what `--hypothesis-seed` does)."""
    with forced_seed(seed):
        return run_machine(machine, run_settings)


def hunt(seed: int, expected: str, build: Callable[[StepCounter], Any], shrink: bool) -> Hunt:
    counter = StepCounter()
    start = time.perf_counter()
    err, printed = _seeded(seed, build(counter), NO_SHRINK)
    seconds = time.perf_counter() - start
    found = failure_from(err, printed).rule if err is not None else ""
    shrunk = None
    if shrink and err is not None:
        err2, printed2 = _seeded(seed, build(StepCounter()), SHRINK)
        if err2 is not None:
            shrunk = _actions(failure_from(err2, printed2).program)
    # the counter counts completed examples; the failing one ends early and is not counted
    examples = counter.examples + (1 if err is not None else 0)
    if found != expected:  # not caught (or caught for another rule) counts as the worst case
        examples = MAX_EXAMPLES + 1 if not found else examples
    return Hunt(seed, str(found), examples, seconds, shrunk)


def catch(
    family: str,
    name: str,
    rule: str,
    build: Callable[[StepCounter], Any],
    seeds: list[int],
    shrink_seeds: set[int] | None,
) -> Catch:
    """Hunt the mutant under every seed; shrink under `shrink_seeds` (None: all of them)."""
    hunts = tuple(
        hunt(seed, rule, build, shrink_seeds is None or seed in shrink_seeds) for seed in seeds
    )
    wrong = [h for h in hunts if h.rule != rule]
    shrunk = [h.shrunk_actions for h in hunts if h.shrunk_actions is not None]
    return Catch(
        family,
        name,
        rule,
        wrong[0].rule if wrong else rule,
        round(statistics.median(h.examples for h in hunts)),
        statistics.median(h.seconds for h in hunts),
        max(h.examples for h in hunts),
        max(h.seconds for h in hunts),
        max(shrunk) if shrunk else None,
        hunts,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated mutant names (default: all)")
    parser.add_argument(
        "--seeds",
        default="0,1,2,3,4",
        help="comma-separated Hypothesis seeds (default %(default)s)",
    )
    shrinking = parser.add_mutually_exclusive_group()
    shrinking.add_argument("--no-shrink", action="store_true", help="skip the shrinking runs")
    shrinking.add_argument(
        "--shrink-all-seeds", action="store_true", help="shrink under every seed, not the first"
    )
    parser.add_argument(
        "--mined-constants",
        action="store_true",
        help="let Hypothesis draw constants it mines from loaded modules, as the dev and release "
        "profiles do outside CI (default: none, as the ci profile and the command line)",
    )
    parser.add_argument("--json", type=output_file, help="write the figures here")
    args = parser.parse_args(argv)
    if not args.mined_constants:
        draw_no_mined_constants()
    only = set(args.only.split(",")) if args.only else None
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    known = set(MUTANTS) | set(AR_MUTANTS)
    if only is not None and not only <= known:
        parser.error(f"--only: unknown mutants {sorted(only - known)}; valid: {sorted(known)}")
    shrink_seeds: set[int] | None = (
        set() if args.no_shrink else None if args.shrink_all_seeds else {seeds[0]}
    )
    print(f"{'family':<5} {'mutant':<34} {'rule':<30} {'':<6} {'median':>13} {'worst':>17}  shrunk")
    rows: list[Catch] = []
    for name, m in sorted(MUTANTS.items()):
        if only is None or name in only:

            def build_dllm(c: StepCounter, m: Any = m) -> Any:
                return conformance_machine(
                    m.factory, profile=m.profile, configs=m.configs, counter=c
                )

            rows.append(catch("dllm", name, m.rule, build_dllm, seeds, shrink_seeds))
            _print_row(rows[-1])
    for name, am in sorted(AR_MUTANTS.items()):
        if only is None or name in only:

            def build_ar(c: StepCounter, m: Any = am) -> Any:
                return ar_conformance_machine(
                    m.factory, configs=m.configs, counter=c, profile=m.profile
                )

            rows.append(catch("ar", name, am.rule, build_ar, seeds, shrink_seeds))
            _print_row(rows[-1])
    caught = [r for r in rows if r.rule == r.expected_rule]
    in_goal = [
        r for r in caught if r.worst_examples <= GOAL_EXAMPLES and r.worst_seconds <= GOAL_SECONDS
    ]
    short = [r for r in caught if r.shrunk_actions is not None and r.shrunk_actions < GOAL_ACTIONS]
    print(
        f"\n{len(caught)}/{len(rows)} caught with their rule in every seed ({seeds}); "
        f"{len(in_goal)} within {GOAL_EXAMPLES} examples and {GOAL_SECONDS:.0f} s in the worst "
        f"seed; {len(short)} shrunk to < {GOAL_ACTIONS} actions"
    )
    if args.json:
        write_json(
            args.json,
            {
                "command": "python scripts/bench_catch_time.py "
                + " ".join(argv if argv is not None else sys.argv[1:]),
                "seeds": seeds,
                "shrunk_seeds": sorted(seeds if shrink_seeds is None else shrink_seeds),
                "max_examples": MAX_EXAMPLES,
                "mined_constants": args.mined_constants,
                "mutants": [asdict(r) for r in rows],
            },
        )
    return 0 if len(caught) == len(rows) else 1


def _print_row(r: Catch) -> None:
    ok = "ok" if r.rule == r.expected_rule else f"GOT {r.rule or 'nothing'}"
    shrunk = "-" if r.shrunk_actions is None else str(r.shrunk_actions)
    print(
        f"{r.family:<5} {r.mutant:<34} {r.expected_rule:<30} {ok:<6} "
        f"{r.examples:>5} ex {r.seconds:>5.2f} s {r.worst_examples:>5} ex {r.worst_seconds:>6.2f} s"
        f"  {shrunk:>3}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
