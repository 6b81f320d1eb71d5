"""The dLLM machine's `submit_burst` rule: several requests before the next round, each
accepted one in the `requests` bundle, and a failing program that replays as printed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import MultipleResults, RuleBasedStateMachine

from properties.conformance import conformance_machine
from properties.verify import Failure, failure_from, run_machine
from reference.dllm import make_scheduler
from spec import DllmConfig, Mode
from spec.errors import SpecViolation
from tests.mutants import MUTANTS
from tests.test_mutants import SHRINK

CONFIG = DllmConfig(
    block_size=2,
    page_size=2,
    kv_pages=8,
    req_pool_rows=3,
    max_running_requests=2,
    max_context=8,
    mode=Mode.FDFO,
    mask_token_id=-1,
)


def test_a_burst_submits_every_request_and_bundles_the_accepted_ones() -> None:
    """Three requests in one burst, the middle one longer than the context: the other two are
    queued together (one admission then sees both) and join the bundle, the refused one does
    not; the example then runs and drains clean."""
    state: Any = conformance_machine(make_scheduler)()  # the rules are the generated class's
    state.configure(config=CONFIG)
    bundled = state.submit_burst(
        burst=[
            {"prompt": (0,), "max_new_tokens": 3},
            {"prompt": tuple(range(8)), "max_new_tokens": 4},  # 12 tokens > max_context 8
            {"prompt": (1, 2), "max_new_tokens": 2},
        ]
    )
    assert isinstance(bundled, MultipleResults)
    assert bundled.values == ("r0", "r2")
    assert state.harness.spec.state().queue == ("r0", "r2")
    state.round()
    assert state.harness.spec.state().queue == ()  # both admitted in the one round
    assert state.harness.spec.request_phase("r1") is None  # refused: never in the spec
    state.teardown()
    assert state.harness.violation is None


def test_a_shrunk_burst_replays_as_printed() -> None:
    """The off-by-one running cap shrinks to one burst (the configuration fixed, so that the
    shrink works on the program alone); the printed program, run as it is, breaks
    `max_running` again."""
    failure, machine = caught("admits_beyond_max_running", CONFIG)
    assert failure.rule == "max_running"
    assert "state.submit_burst(burst=[" in failure.program, failure.program
    assert replay_printed(failure.program, machine).rule == "max_running"


def caught(
    name: str, config: DllmConfig, how: settings = SHRINK
) -> tuple[Failure, type[RuleBasedStateMachine]]:
    """The failure the suite reports on mutant `name` of the catalogue, its configuration fixed
    to `config` (so that a shrink works on the program alone), and the machine it ran; the
    test fails if the suite catches nothing."""
    mutant = MUTANTS[name]
    machine = conformance_machine(mutant.factory, profile=mutant.profile, configs=st.just(config))
    err, printed = run_machine(machine, how)
    assert err is not None, f"the suite did not catch {name!r}"
    return failure_from(err, printed), machine


def replay_printed(program: str, machine: type) -> SpecViolation:
    """Run a failure's printed program as it is (Hypothesis's own lines around it left out)
    against `machine`; the violation it raises (the test fails if it raises none)."""
    code = "\n".join(
        line
        for line in program.splitlines()
        if not line.startswith(("Failing test case", "You can reproduce"))
    )
    with pytest.raises(SpecViolation) as replayed:
        exec(code, {"Conformance": machine, "DllmConfig": DllmConfig, "Mode": Mode})
    return replayed.value
