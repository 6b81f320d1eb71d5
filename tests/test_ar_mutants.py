"""The AR suite has teeth: every seeded bug in tests/ar_mutants.py makes the AR conformance
suite FAIL, naming the right rule (`SpecViolation.rule`) with a replayable program."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from properties.ar.conformance import ar_conformance_machine
from properties.conformance_base import CALLS_NOTE
from properties.verify import failure_from, run_machine
from spec.errors import SpecViolation
from tests.ar_mutants import AR_MUTANTS

# The hunt finds every mutant within a second or two; shrinking (minutes on a shared machine)
# is exercised once, by `test_ar_counterexample_is_shrunk`.
HUNT = settings(
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    max_examples=1000,
    derandomize=True,
    deadline=None,
    database=None,
    stateful_step_count=30,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("name", sorted(AR_MUTANTS))
def test_ar_suite_catches_mutant(name: str) -> None:
    mutant = AR_MUTANTS[name]
    machine = ar_conformance_machine(mutant.factory, configs=mutant.configs, profile=mutant.profile)
    err, printed = run_machine(machine, HUNT)
    assert err is not None, f"the AR conformance suite did not catch mutant {name!r}"
    assert isinstance(err, SpecViolation), f"{name}: not a SpecViolation:\n{err!r}"
    assert err.rule == mutant.rule, f"{name}: expected [{mutant.rule}], got:\n{err}"
    failure = failure_from(err, printed)
    assert "state:" in failure.message
    assert "state.configure(config=" in failure.program
    assert "state.submit" in failure.program  # submit( or submit_burst(
    # the requests whole (Hypothesis prints `data=data(...)` and the draws apart), last
    calls = failure.program.split(CALLS_NOTE, 1)[1]
    assert "submit(ArRequest(request_id='r0', prompt_len=" in calls, failure.program


def test_ar_counterexample_is_shrunk() -> None:
    """With shrinking on, the printed program is short and replays the bug."""
    mutant = AR_MUTANTS["budget_overflow"]
    machine = ar_conformance_machine(mutant.factory, configs=mutant.configs)
    err, printed = run_machine(machine, settings(HUNT, phases=list(Phase)))
    assert isinstance(err, SpecViolation) and err.rule == "token_budget"
    program = failure_from(err, printed).program
    calls = [line.split("= ")[-1] for line in program.splitlines() if "state." in line]
    assert sum(c.startswith("state.submit") for c in calls) == 1, program
    assert sum(c.startswith("state.step") for c in calls) <= 2, program


@pytest.mark.parametrize("name", ["mnemosyne_restarts_head", "mnemosyne_unbounded_lookahead"])
def test_short_prompts_find_the_mnemosyne_bugs_within_half_the_ci_budget(name: str) -> None:
    """Choosing the wrong victim among three or more decoding requests, or reading past nine
    waiting ones, needs many requests in one tight pool: the short prompts that
    `request_sizes` draws a third of the time give that, and the derandomized hunt catches both
    within 30 examples (without them it caught neither within 30; over ten seeds medians
    71 and 6, worst 163 and 141, docs/performance.md)."""
    mutant = AR_MUTANTS[name]
    machine = ar_conformance_machine(mutant.factory, configs=mutant.configs)
    err, _ = run_machine(machine, settings(HUNT, max_examples=30))
    assert isinstance(err, SpecViolation), f"{name} not caught within 30 examples"
    assert err.rule == mutant.rule, str(err)
