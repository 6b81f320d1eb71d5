"""The torch engine with an ordered waiting queue (`DllmEngine(priority_order=True)`, built-in
`engine-priority`; `DllmEngine(longest_output_first=True)`, built-in `engine-lof`): SGLang's
`--enable-priority-scheduling` and `--schedule-policy lof`. The engine admits in the declared
order, conforms under the profile that declares it, the default (FCFS) profile refuses it with
a message naming the order it broke, an engine that ignores the order is caught under the
declared profile, and every request's output is the FCFS engine's byte for byte."""

from __future__ import annotations

import pytest
import torch
from hypothesis.stateful import run_state_machine_as_test

from gpu.engine import (
    SMALL_ENGINE_LOF,
    SMALL_ENGINE_PRIORITY,
    DllmEngine,
    make_small_engine,
    make_small_lof_engine,
    make_small_priority_engine,
)
from properties.conformance import conformance_machine
from properties.harness import Harness
from properties.verify import failure_from, run_machine
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError, SpecViolation
from spec.events import Admitted, Event
from spec.profile import DllmPolicy, DllmProfile
from tests.test_engine_conformance import SUITE
from tests.test_engine_mutants import HUNT

torch.set_num_threads(1)

# one seat: the queue's order is the admission order
CONFIG = DllmConfig(
    block_size=4,
    page_size=4,
    kv_pages=32,
    req_pool_rows=2,
    max_running_requests=1,
    max_context=32,
    mode=Mode.FDFO,
    in_place_reuse=True,
)
# submitted in this order: the FCFS engine admits a, b, c, d
WORKLOAD = [
    RequestSpec("a", (1, 2, 3), 2, priority=1),
    RequestSpec("b", (4, 5), 6, priority=2),
    RequestSpec("c", (6, 7, 8), 6, priority=0),
    RequestSpec("d", (9,), 9, priority=1),
]


def _serve(
    factory: object, requests: list[RequestSpec] = WORKLOAD
) -> tuple[list[str], dict[str, tuple[int, ...]]]:
    """Submit every request before the first round, drain; the admission order and outputs."""
    events: list[Event] = []
    engine = factory(CONFIG, events.append)  # type: ignore[operator]
    assert isinstance(engine, DllmEngine)
    for req in requests:
        engine.submit(req)
    engine.drain()
    snap = engine.snapshot()
    assert snap.leaked_slots() == 0 and snap.held_rows() == 0
    return [e.request_id for e in events if isinstance(e, Admitted)], engine.take_outputs()


def _both_orders(config: DllmConfig, sink: object) -> DllmEngine:
    """The engine with both options (no built-in has them; `submit` reads `queue_order`)."""
    engine = make_small_engine(config, sink)  # type: ignore[arg-type]
    engine.queue_order = DllmPolicy(priority_order=True, longest_output_first=True)
    return engine


@pytest.mark.parametrize(
    ("factory", "admitted"),
    [
        (make_small_engine, ["a", "b", "c", "d"]),  # submission order
        (make_small_priority_engine, ["c", "a", "d", "b"]),  # priority; a before d: submitted first
        (make_small_lof_engine, ["d", "b", "c", "a"]),  # longest first; b before c: submitted first
        (_both_orders, ["c", "d", "a", "b"]),  # priority, then longest first
    ],
    ids=["fcfs", "priority", "lof", "priority-lof"],
)
def test_the_engine_admits_in_its_queue_order_with_the_fcfs_outputs(
    factory: object, admitted: list[str]
) -> None:
    order, outputs = _serve(factory)
    assert order == admitted
    _, fcfs_outputs = _serve(make_small_engine)
    assert outputs == fcfs_outputs  # an output does not depend on when it was admitted


def test_a_request_submitted_between_rounds_takes_its_place() -> None:
    """An arrival with a longer output goes ahead of the requests still waiting, not of the
    running one; the harness checks every round against the spec under the declared order."""
    h = Harness(make_small_lof_engine, CONFIG, profile=SMALL_ENGINE_LOF.profile)
    h.submit(RequestSpec("a", (1, 2, 3), 2))
    h.submit(RequestSpec("b", (4, 5), 3))
    h.round()
    engine = h.impl
    assert isinstance(engine, DllmEngine)
    assert [r.rid for r in engine.running] == ["b"]
    h.submit(RequestSpec("c", (6,), 8))
    assert [r.rid for r in engine.waiting] == ["c", "a"]
    h.drain()
    assert engine.is_idle()


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        (make_small_priority_engine, "admitted 'c' while 'a' is ahead of it"),
        (make_small_lof_engine, "admitted 'd' while 'a' is ahead of it"),
    ],
    ids=["priority", "lof"],
)
def test_the_fcfs_profile_refuses_the_order(factory: object, words: str) -> None:
    h = Harness(factory, CONFIG)  # type: ignore[arg-type]
    for req in WORKLOAD:
        h.submit(req)
    with pytest.raises(SpecViolation) as info:
        h.drain()
    assert info.value.rule == "fcfs_admission"
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("profile", "order"),
    [
        (
            SMALL_ENGINE_PRIORITY.profile,
            "(c: priority 0, a: priority 1, d: priority 1, b: priority 2)",
        ),
        (
            SMALL_ENGINE_LOF.profile,
            "(d: max_new_tokens 9, b: max_new_tokens 6, c: max_new_tokens 6, a: max_new_tokens 2)",
        ),
    ],
    ids=["priority", "lof"],
)
def test_an_engine_that_ignores_the_order_is_caught(profile: DllmProfile, order: str) -> None:
    """The seeded bug: the FCFS engine under a profile that declares an order; the violation
    names the order and every queued request's key."""
    h = Harness(make_small_engine, CONFIG, profile=profile)
    for req in WORKLOAD:
        h.submit(req)
    with pytest.raises(SpecViolation) as info:
        h.drain()
    assert info.value.rule == "fcfs_admission"
    assert "admitted 'a' while" in str(info.value)
    assert order in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "profile", [SMALL_ENGINE_PRIORITY.profile, SMALL_ENGINE_LOF.profile], ids=["priority", "lof"]
)
def test_the_suite_catches_an_engine_that_ignores_the_order(profile: DllmProfile) -> None:
    """The same seeded bug, found by the conformance suite itself: a printed program that
    replays it."""
    err, printed = run_machine(conformance_machine(make_small_engine, profile=profile), HUNT)
    assert isinstance(err, SpecViolation), "the suite did not catch an FCFS queue"
    assert err.rule == "fcfs_admission", str(err)
    failure = failure_from(err, printed)
    assert "state.configure(config=" in failure.program
    assert profile.policy.describe_queue_order() in failure.message


@pytest.mark.parametrize(
    ("factory", "profile"),
    [
        (make_small_priority_engine, SMALL_ENGINE_PRIORITY.profile),
        (make_small_lof_engine, SMALL_ENGINE_LOF.profile),
    ],
    ids=["priority", "lof"],
)
def test_the_ordered_engine_conforms_under_its_profile(
    factory: object, profile: DllmProfile
) -> None:
    machine = conformance_machine(factory, profile=profile)  # type: ignore[arg-type]
    run_state_machine_as_test(machine, settings=SUITE)


def test_the_options_are_off_by_default() -> None:
    engine = make_small_engine(CONFIG, lambda e: None)
    assert not engine.queue_order.orders_queue
    assert make_small_lof_engine(CONFIG, lambda e: None).queue_order.longest_output_first
    assert make_small_priority_engine(CONFIG, lambda e: None).queue_order.priority_order


@pytest.mark.parametrize("option", ["priority_order", "longest_output_first"])
def test_an_option_that_is_not_a_boolean_is_a_config_error(option: str) -> None:
    """A truthy string would otherwise switch the order on without a word."""
    plain = make_small_engine(CONFIG, lambda e: None)
    with pytest.raises(ConfigError, match=rf"{option}='yes': a bool \(True or False\)"):
        DllmEngine(
            CONFIG,
            lambda e: None,
            model=plain.model,
            algorithm=plain.algorithm,
            **{option: "yes"},  # type: ignore[arg-type]
        )
