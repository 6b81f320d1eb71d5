"""`properties.decisions`: operations read back out of an event stream reproduce the run,
`first_difference` names the first round where two schedulers decide differently, and
`conformance_machine(..., twin=...)` fails an example by the rule `twin_decisions` when the
twin decides otherwise (no engine needed; SGLang's suites use the same with its twin)."""

from __future__ import annotations

import re

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from properties.conformance import conformance_machine
from properties.decisions import DecisionTwin, first_difference, operations
from properties.harness import Harness
from properties.workload import Abort, Op, Round, Submit, apply_ops
from reference.dllm import PREFILL_FIRST_POLICY, ReferenceDllmScheduler, replaying_twin
from reference.oracle import RecordedOracle
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SpecViolation
from spec.events import Admitted, ControlReturned, Event, Forward, ForwardRow
from spec.profile import DllmProfile

CONFIG = DllmConfig(
    block_size=2,
    page_size=2,
    kv_pages=6,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=8,
    mode=Mode.FDFO,
    in_place_reuse=True,
    eos_token_id=15,
)


def _reference_run() -> Harness:
    h = Harness(ReferenceDllmScheduler, CONFIG)
    h.submit(RequestSpec("r0", (1, 2, 3), 3))
    h.submit(RequestSpec("r1", (4,), 5))
    assert h.submit(RequestSpec("too-long", (1,) * 8, 4)) is not None  # rejected: no event
    h.submit(RequestSpec("r2", (5, 6), 4))
    h.round()
    h.abort("r2")  # still queued behind two running requests
    h.drain()
    assert h.abort("r0") is not None  # already finished: refused, no event
    return h


def test_operations_are_what_changed_the_run_in_stream_order() -> None:
    h = _reference_run()
    ops = operations(h.events)
    rounds = sum(isinstance(e, ControlReturned) for e in h.events)
    assert [op for op in ops if not isinstance(op, Round)] == [
        Submit(RequestSpec("r0", (1, 2, 3), 3)),
        Submit(RequestSpec("r1", (4,), 5)),
        Submit(RequestSpec("r2", (5, 6), 4)),
        Abort("r2"),
    ]
    assert ops.index(Abort("r2")) == 4  # after the first round, as it was called
    assert sum(isinstance(op, Round) for op in ops) == rounds > 1


def test_a_twin_replaying_the_step_outcomes_reproduces_every_event() -> None:
    """The operations and `RecordedOracle.from_events` drive a second reference into exactly the
    first one's events: same decisions, same denoising."""
    h = _reference_run()

    def twin(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        return ReferenceDllmScheduler(config, sink, RecordedOracle.from_events(h.events, config))

    other = Harness(twin, CONFIG)
    apply_ops(other, operations(h.events))
    other.drain()
    assert other.events == h.events
    assert first_difference(h.events, other.events) is None


def test_the_first_round_whose_admissions_differ_is_named() -> None:
    """One seat: FCFS admits the one-token head; PREFILL_FIRST lets the whole prompt block behind
    it pass."""
    one_seat = CONFIG.replace(max_running_requests=1, req_pool_rows=1)
    ops: list[Op] = [
        Submit(RequestSpec("r0", (1,), 3)),
        Submit(RequestSpec("r1", (1, 2, 3), 3)),
        Round(),
    ]

    def prefill_first(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        return ReferenceDllmScheduler(config, sink, policy=PREFILL_FIRST_POLICY)

    fcfs = Harness(ReferenceDllmScheduler, one_seat)
    apply_ops(fcfs, ops)
    other = Harness(prefill_first, one_seat, profile=DllmProfile(policy=PREFILL_FIRST_POLICY))
    apply_ops(other, ops)
    assert first_difference(fcfs.events, other.events, ("FCFS", "PREFILL_FIRST")) == (
        "round 0: FCFS admits ['r0'], PREFILL_FIRST admits ['r1']"
    )


def _forward(*rows: tuple[str, int]) -> Forward:
    return Forward(tuple(ForwardRow(rid, k, False, 2, 2) for rid, k in rows))


def test_the_first_forward_that_differs_is_named_when_admissions_agree() -> None:
    ours: list[Event] = [
        Admitted("a", 0),
        Admitted("b", 1),
        _forward(("a", 0), ("b", 0)),
        ControlReturned(0),
        _forward(("b", 1), ("a", 1)),
        ControlReturned(1),
    ]
    same_rows_other_order = [*ours[:4], _forward(("a", 1), ("b", 1)), ControlReturned(1)]
    assert first_difference(ours, same_rows_other_order) is None  # a forward's rows are a set
    theirs = [*ours[:4], _forward(("a", 1)), ControlReturned(1)]
    assert first_difference(ours, theirs, ("x", "y")) == (
        "round 1: x forwards [[('a', 1), ('b', 1)]], y forwards [[('a', 1)]]"
    )
    shorter = ours[:4]
    assert first_difference(ours, shorter, ("x", "y")) == (
        "round 1: x forwards [[('a', 1), ('b', 1)]], y forwards []"
    )


def _suite(twin: DecisionTwin, twin_profile: DllmProfile | None = None) -> None:
    """The dLLM suite on the reference over one roomy configuration (several requests in
    flight), each example ending with `twin`."""
    roomy = CONFIG.replace(kv_pages=32, max_context=32)
    machine = conformance_machine(
        ReferenceDllmScheduler, configs=st.just(roomy), twin=twin, twin_profile=twin_profile
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=12,
            derandomize=True,
            database=None,
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),  # no explain
            # stop at the first failure: searching on for more bugs is bounded by wall-clock
            # time (10 s), which would make the counterexample depend on the machine's load
            report_multiple_bugs=False,
        ),
    )


def test_the_reference_decides_as_its_own_replaying_twin() -> None:
    _suite(replaying_twin())


def test_a_twin_of_another_policy_fails_the_suite_by_twin_decisions() -> None:
    """The FCFS reference against a PREFILL_FIRST twin: the suite finds a program where the two
    decide differently (admit, or batch) and names the rule and the round."""
    with pytest.raises(SpecViolation) as caught:
        _suite(
            replaying_twin(policy=PREFILL_FIRST_POLICY), DllmProfile(policy=PREFILL_FIRST_POLICY)
        )
    assert caught.value.rule == "twin_decisions", caught.value
    # which decision parts first (an admission, or a batch) depends on the shrunk program
    shape = r"\[twin_decisions\] round \d+: the implementation (admits|forwards) .*, its twin \1 "
    assert re.match(shape, str(caught.value)), caught.value
