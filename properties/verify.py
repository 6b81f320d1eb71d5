"""Run the conformance suite on one implementation and summarise the outcome.

Used by `schedspec verify` and by other projects' CI (see docs/implementers.md). A failure keeps
the violated rule, the message (with the state) and the shrunk program Hypothesis printed.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test
from hypothesis.strategies import SearchStrategy

from properties.conformance import ParityPolicy, StepCounter, conformance_machine
from spec.adapter import ImplementationFactory
from spec.errors import SpecViolation

MachineBuilder = Callable[..., type[RuleBasedStateMachine]]


@dataclass(frozen=True, slots=True)
class Failure:
    rule: str
    message: str
    program: str  # the shrunk, copy-pasteable program

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass(slots=True)
class VerifyResult:
    impl: str
    examples: int
    steps: int
    seconds: float
    failures: list[Failure] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "impl": self.impl,
            "examples": self.examples,
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "failures": [f.to_json() for f in self.failures],
        }


def verify_settings(examples: int, seed_derandomize: bool = True) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=seed_derandomize,
        database=None,
        stateful_step_count=30,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )


def run_machine(
    machine: type[RuleBasedStateMachine], run_settings: settings
) -> tuple[BaseException | None, str]:
    """Run a state machine test; return (exception or None, what Hypothesis printed)."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            run_state_machine_as_test(machine, settings=run_settings)
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        return err, buf.getvalue()
    return None, buf.getvalue()


def failure_from(err: BaseException, printed: str) -> Failure:
    notes = "\n".join(getattr(err, "__notes__", []))
    program = "\n".join(
        line
        for line in (printed + "\n" + notes).splitlines()
        if line.strip() and not line.startswith("Traceback")
    )
    rule = err.rule if isinstance(err, SpecViolation) else type(err).__name__
    return Failure(rule=rule, message=str(err), program=program)


def verify_impl(
    name: str,
    factory: ImplementationFactory,
    examples: int,
    *,
    parity: ParityPolicy = "always",
    builder: MachineBuilder | None = None,
    progress: Callable[[int, int], None] | None = None,
    configs: SearchStrategy[Any] | None = None,
) -> VerifyResult:
    """Run `examples` generated programs of the conformance machine against `factory`."""
    counter = StepCounter()
    counter.on_example = progress
    build = builder or conformance_machine
    kwargs: dict[str, Any] = {"counter": counter, "name": "Conformance"}
    if builder is None:
        kwargs["parity"] = parity
    if configs is not None:
        kwargs["configs"] = configs
    machine = build(factory, **kwargs)
    start = time.perf_counter()
    err, printed = run_machine(machine, verify_settings(examples))
    result = VerifyResult(name, counter.examples, counter.steps, time.perf_counter() - start)
    if err is not None:
        result.failures.append(failure_from(err, printed))
    return result


def stderr_progress(label: str, total: int) -> Callable[[int, int], None]:
    """A one-line progress display on stderr (only when it is a terminal)."""
    tty = sys.stderr.isatty()

    def show(examples: int, steps: int) -> None:
        if tty:
            sys.stderr.write(f"\r{label}: {min(examples, total)}/{total} examples, {steps} steps")
            sys.stderr.flush()

    return show
