"""The shared skeletons: MachineBase (handler table, rule enum, fail/apply/enabled/copy) and
ConformanceBase (implementation errors as findings, ignored rules, the abort/drain rules)."""

from __future__ import annotations

import sys
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings

from properties.conformance import conformance_machine
from properties.harness import Harness
from properties.verify import failure_from, run_machine
from reference.dllm import ReferenceDllmScheduler, make_scheduler
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError, SchedulerStalled, SpecViolation
from spec.events import Event, Finished, Forward, KvAllocated, KvFreed, Submitted
from spec.machine import SpecMachine
from spec.profile import ConfigOutsideProfile, DllmConfigSpace, DllmProfile
from spec.rules import RULES, Rule, describe
from tests.mutants import MUTANTS

RUN = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    stateful_step_count=20,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
FDFO = DllmConfig(
    block_size=2, page_size=2, kv_pages=8, req_pool_rows=2, max_running_requests=2, mode=Mode.FDFO
)


# ---------------------------------------------------------------- MachineBase
def test_rule_names_are_an_enum_that_equals_its_strings() -> None:
    assert str(Rule.NO_LEAK) == "no_leak" and Rule("no_leak") is Rule.NO_LEAK
    assert describe("no_leak") == RULES[Rule.NO_LEAK]
    assert SpecViolation(Rule.NO_LEAK, "x").rule == "no_leak"  # violations keep string rules
    assert set(RULES) == set(Rule)  # every rule has a statement, documented in docs/spec.md


def test_apply_uses_the_handler_table_and_counts_events() -> None:
    m = SpecMachine(DllmConfig())
    m.apply(Submitted("a", (1, 2), 3))
    assert m.events_applied == 1
    with pytest.raises(SpecViolation) as exc:
        m.apply(object())  # type: ignore[arg-type]
    assert exc.value.rule == Rule.LIFECYCLE and "unknown event type object" in str(exc.value)


def test_enabled_checks_on_a_copy_and_names_the_rule() -> None:
    m = SpecMachine(DllmConfig())
    m.apply(Submitted("a", (1, 2), 3))
    assert m.enabled(Submitted("a", (1,), 1)) == "unique_submission"
    assert m.enabled(Submitted("b", (1,), 1)) is None
    assert m.request_phase("b") is None  # enabled() did not change the machine
    c = m.copy()
    c.apply(Submitted("b", (1,), 1))
    assert m.request_phase("b") is None and c.request_phase("b") is not None


# ---------------------------------------------------------------- harness input errors
def test_factory_returning_a_non_adapter_is_a_typed_error() -> None:
    def make_nothing(config: DllmConfig, sink: EventSink) -> object:
        return object()

    with pytest.raises(ConfigError) as exc:
        Harness(make_nothing, DllmConfig())  # type: ignore[arg-type]
    assert exc.value.field == "impl" and "SchedulerAdapter" in str(exc.value)


def test_config_outside_the_declared_space_is_refused_naming_field_and_space() -> None:
    profile = DllmProfile(space=DllmConfigSpace(page_multiples=frozenset({1})))
    with pytest.raises(ConfigOutsideProfile) as exc:
        Harness(make_scheduler, DllmConfig(block_size=2, page_size=4), profile=profile)
    assert exc.value.field == "page_size" and "declared space" in str(exc.value)


# ---------------------------------------------------------------- implementation errors
class _OutOfMemory(ReferenceDllmScheduler):
    """A real engine's failure mode: the second concurrent prefill runs out of memory."""

    def run_round(self) -> None:
        if len(self.running) + len(self.waiting) >= 2:
            raise RuntimeError("Prefill out of memory")
        super().run_round()


class _ExitsMidRound(ReferenceDllmScheduler):
    """An engine that calls `sys.exit` when it hits a state it cannot handle."""

    def run_round(self) -> None:
        if len(self.running) + len(self.waiting) >= 2:
            sys.exit("cannot batch two requests")
        super().run_round()


class _GivesUp(ReferenceDllmScheduler):
    def drain(self, max_rounds: int = 100_000) -> None:
        if self.waiting or self.running:
            raise SchedulerStalled(max_rounds, "gave up")


@pytest.mark.parametrize(
    ("impl", "raised"),
    [
        (_OutOfMemory, "RuntimeError: Prefill out of memory"),
        (_ExitsMidRound, "SystemExit: cannot batch two requests"),  # sys.exit() too
    ],
    ids=["exception", "sys-exit"],
)
def test_unexpected_exception_is_an_implementation_error_finding(
    impl: type[ReferenceDllmScheduler], raised: str
) -> None:
    err, printed = run_machine(conformance_machine(impl), RUN)
    assert err is not None
    failure = failure_from(err, printed)
    assert failure.rule == "implementation_error", failure.message
    assert raised in failure.message
    assert "state.submit" in failure.program  # submit( or submit_burst(


def test_scheduler_stalled_from_drain_breaks_progress() -> None:
    err, printed = run_machine(conformance_machine(_GivesUp), RUN)
    assert err is not None
    failure = failure_from(err, printed)
    assert failure.rule == "progress", failure.message
    assert "gave up" in failure.message


def test_a_typed_request_error_from_submit_is_not_an_implementation_error() -> None:
    h = Harness(make_scheduler, DllmConfig(max_context=8, kv_pages=2))
    err = h.guarded("submit", h.submit, RequestSpec("a", tuple(range(1, 10)), 1))
    assert err is not None and h.violation is None


# ---------------------------------------------------------------- ignored rules
def test_ignored_rule_rejects_the_example_and_counts_the_hit() -> None:
    mutant = MUTANTS["double_free"]
    base = conformance_machine(mutant.factory, configs=mutant.configs)

    class Campaign(base):  # type: ignore[misc, valid-type]
        ignored_rules = frozenset({mutant.rule})
        ignored_hits: ClassVar[dict[str, int]] = {}

    err, printed = run_machine(Campaign, RUN)
    assert Campaign.ignored_hits.get(mutant.rule, 0) > 0
    if err is not None:  # a different rule may still show; never the ignored one
        assert failure_from(err, printed).rule != mutant.rule


def test_profile_deviations_start_ignored() -> None:
    from spec.profile import AcceptedDeviation

    mutant = MUTANTS["double_free"]
    profile = DllmProfile(deviations=(AcceptedDeviation(mutant.rule, "known, tracked"),))
    machine = conformance_machine(mutant.factory, profile=profile, configs=mutant.configs)
    assert mutant.rule in machine.ignored_rules  # type: ignore[attr-defined]


def test_strategies_draw_only_inside_the_space() -> None:
    from hypothesis import given

    from properties.strategies import dllm_configs

    space = DllmConfigSpace(
        modes=frozenset({Mode.FDFO}),
        page_multiples=frozenset({1}),
        in_place_reuse=frozenset({True}),
        reloop=frozenset({False}),
        rows_equal_max_running=True,
    )

    @settings(max_examples=60, database=None, deadline=None)
    @given(dllm_configs(space=space))
    def check(config: DllmConfig) -> None:
        assert space.outside(config) is None, config

    check()


# ---------------------------------------------------------------- events out of order, named
def _one_request_run() -> list[Event]:
    """A conforming run of one request of three blocks (the reference's events)."""
    events: list[Event] = []
    impl = make_scheduler(FDFO, events.append)
    impl.submit(RequestSpec("r0", (1, 2), 4))
    impl.drain()
    return events


def _violation(events: list[Event]) -> SpecViolation:
    m = SpecMachine(FDFO)
    with pytest.raises(SpecViolation) as exc:
        for e in events:
            m.apply(e)
            m.check_changed()
    return exc.value


def test_a_forward_before_its_blocks_allocation_names_the_missing_kv_allocated() -> None:
    """It said `its current block is None`; it says what the forward lacks."""
    events = _one_request_run()
    alloc = next(i for i, e in enumerate(events) if isinstance(e, KvAllocated))
    forward = next(i for i, e in enumerate(events) if isinstance(e, Forward))
    events.insert(forward, events.pop(alloc))  # allocated after the first forward
    v = _violation(events)
    assert v.rule == "forward_ready", v
    assert v.detail.startswith(
        "'r0' forwards block 0 but has no KvAllocated for block 0 before the forward"
    ), v.detail
    assert "None" not in v.detail, v.detail


def test_finished_before_kv_freed_says_the_free_came_too_late() -> None:
    """The same rule (a request ends owning nothing), with what to do: free before ending."""
    events = _one_request_run()
    freed = next(i for i, e in enumerate(events) if isinstance(e, KvFreed))
    finished = next(i for i, e in enumerate(events) if isinstance(e, Finished))
    events.insert(finished, events.pop(freed))  # Finished, then KvFreed
    v = _violation(events)
    assert v.rule == "terminal_owns_nothing", v
    assert v.detail == (
        "request 'r0' ends still owning 6 KV slots (blocks [0, 1, 2], slots [0, 1, 2, 3, 4, 5]) "
        "at its Finished: free them (KvFreed) before the Finished event; a KvFreed after the "
        "request has ended is too late"
    ), v.detail
