"""Priority order in the dLLM spec (`DllmPolicy.priority_order`, `Submitted.priority`).

SGLang's `--enable-priority-scheduling` (with `--schedule-low-priority-values-first`) and vLLM's
priority policy keep the waiting queue ordered by priority, lower value first, arrival breaking
ties. Under that option the spec's queue is that order, and `fcfs_admission` reads it; without
it priorities are carried but ignored. Each test breaks one part and names the violation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference.dllm import PRIORITY_POLICY, ReferenceDllmScheduler
from schedspec_cli.main import main
from spec import Admitted, RequestSpec, SpecMachine, SpecViolation, Submitted
from spec.config import validate_request
from spec.errors import InvalidRequest
from spec.events import Event
from spec.profile import DllmAdmission, DllmPolicy
from spec.trace import (
    TraceFormatError,
    config_to_dict,
    event_from_dict,
    event_to_dict,
    policy_from_dict,
)
from tests.event_runs import SMALL_SYNC

PREFILL_FIRST_PRIORITY = DllmPolicy(admission=DllmAdmission.PREFILL_FIRST, priority_order=True)


def queued(policy: DllmPolicy, *priorities: int) -> SpecMachine:
    """A machine under `policy` with requests r0, r1, ... submitted in that order with those
    priorities (prompts of two tokens: a whole prompt block under SMALL_SYNC)."""
    m = SpecMachine(SMALL_SYNC, policy)
    for i, priority in enumerate(priorities):
        m.apply(Submitted(f"r{i}", (3, 4), 2, priority=priority))
    return m


def test_the_queue_is_in_priority_order_lower_first_ties_by_submission() -> None:
    m = queued(PRIORITY_POLICY, 2, 0, 2, 1, 0)
    assert m.state().queue == ("r1", "r4", "r3", "r0", "r2")
    assert "queue: ['r1', 'r4', 'r3', 'r0', 'r2'] priorities [0, 0, 1, 2, 2]" in m.render()
    m.apply(Admitted("r1", 0))
    assert "request r1: admitted" in m.render() and "priority=" not in m.render()
    m.apply(Admitted("r4", 1))
    m = queued(PRIORITY_POLICY, 3)
    m.apply(Admitted("r0", 0))
    assert "request r0: admitted" in m.render() and " priority=3" in m.render()


def test_without_the_option_priorities_are_carried_but_ignored() -> None:
    m = queued(DllmPolicy(), 2, 0, 1)
    assert m.state().queue == ("r0", "r1", "r2")
    m.apply(Admitted("r0", 0))  # the head by submission, though its priority is the highest
    assert m.state().requests["r1"].priority == 0 and m.state().requests["r2"].priority == 1


def test_admitting_past_a_lower_priority_value_breaks_fcfs_admission() -> None:
    m = queued(PRIORITY_POLICY, 1, 0)
    with pytest.raises(SpecViolation) as info:
        m.apply(Admitted("r0", 0))
    message = str(info.value)
    assert "[fcfs_admission]" in message
    assert "admitted 'r0' while 'r1' is ahead of it" in message
    assert "ordered by priority, lower first (r1: priority 0, r0: priority 1)" in message


def test_the_head_by_priority_is_admitted_then_submission_order_decides_ties() -> None:
    m = queued(PRIORITY_POLICY, 1, 0, 0)
    m.apply(Admitted("r1", 0))
    m.apply(Admitted("r2", 1))
    assert m.state().queue == ("r0",)


def test_under_prefill_first_a_prompt_block_passes_only_decode_requests_in_priority_order() -> None:
    m = SpecMachine(SMALL_SYNC, PREFILL_FIRST_PRIORITY)
    m.apply(Submitted("short", (3,), 2, priority=0))  # first block not prompt-only
    m.apply(Submitted("long-late", (3, 4), 2, priority=1))
    m.apply(Submitted("long-first", (3, 4), 2, priority=0))
    # order: short(0), long-first(0), long-late(1); long-late may pass short but not long-first
    with pytest.raises(SpecViolation) as info:
        m.apply(Admitted("long-late", 0))
    assert "[fcfs_admission]" in str(info.value) and "'short' is ahead" in str(info.value)
    m = SpecMachine(SMALL_SYNC, PREFILL_FIRST_PRIORITY)
    m.apply(Submitted("short", (3,), 2, priority=0))
    m.apply(Submitted("long", (3, 4), 2, priority=0))
    m.apply(Admitted("long", 0))  # a prompt-only first block passes the decode request


@pytest.mark.parametrize("bad", [True, "1", 1.0, None])
def test_a_priority_that_is_not_an_integer_is_an_invalid_request(bad: object) -> None:
    request = RequestSpec("a", (3, 4), 2, priority=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match=r"priority.*must be an integer"):
        validate_request(SMALL_SYNC, request)


def test_a_negative_priority_is_valid_and_goes_first() -> None:
    validate_request(SMALL_SYNC, RequestSpec("a", (3, 4), 2, priority=-5))
    assert queued(PRIORITY_POLICY, 0, -5).state().queue == ("r1", "r0")


def test_request_spec_and_submitted_carry_the_priority_both_ways() -> None:
    request = RequestSpec("a", (3, 4), 2, priority=2)
    assert request.submitted().priority == 2
    assert RequestSpec.of(request.submitted()) == request


def test_a_trace_writes_the_priority_only_when_set_and_reads_it_back() -> None:
    assert "priority" not in event_to_dict(Submitted("a", (3,), 2))
    line = event_to_dict(Submitted("a", (3,), 2, priority=-1))
    assert line["priority"] == -1
    assert event_from_dict(json.loads(json.dumps(line))) == Submitted("a", (3,), 2, priority=-1)
    with pytest.raises(TraceFormatError, match=r"line 4: submitted field 'priority' is '1'"):
        event_from_dict({**line, "priority": "1"}, 4)
    assert policy_from_dict({"priority_order": True}) == DllmPolicy(priority_order=True)
    with pytest.raises(TraceFormatError, match="priority_order=1: must be true or false"):
        policy_from_dict({"priority_order": 1})


def test_the_reference_admits_in_priority_order() -> None:
    events: list[Event] = []
    config = SMALL_SYNC.replace(max_running_requests=1, req_pool_rows=1)
    scheduler = ReferenceDllmScheduler(config, events.append, policy=PRIORITY_POLICY)
    for rid, priority in (("low", 2), ("mid", 1), ("high", 0), ("mid2", 1)):
        scheduler.submit(RequestSpec(rid, (3, 4), 2, priority=priority))
    scheduler.drain()
    admitted = [e.request_id for e in events if isinstance(e, Admitted)]
    assert admitted == ["high", "mid", "mid2", "low"]
    m = SpecMachine(config, PRIORITY_POLICY)
    for e in events:
        m.apply(e)
    with pytest.raises(SpecViolation, match="fcfs_admission"):  # the idealised spec refuses
        m2 = SpecMachine(config)
        for e in events:
            m2.apply(e)


def _log(folder: Path, events: list[Event], policy: DllmPolicy | None) -> Path:
    path = folder / "log.jsonl"
    header = config_to_dict(SMALL_SYNC.replace(max_running_requests=1, req_pool_rows=1), policy)
    lines = [json.dumps(header), *(json.dumps(event_to_dict(e)) for e in events)]
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_check_trace_follows_the_declared_order(
    folder: Path,
    capsys: pytest.CaptureFixture[str],
    events: list[Event],
    policy: DllmPolicy,
    twin: str,
) -> None:
    """`events`, a one-seat run under `policy` that admits out of submission order: declared,
    `check-trace` passes it alone and against `twin` (the reference under `policy`) and fails it
    against the FCFS twin; undeclared, it fails `fcfs_admission`."""
    declared = _log(folder, events, policy)
    assert main(["check-trace", str(declared)]) == 0
    assert main(["check-trace", str(declared), "--twin", twin]) == 0
    capsys.readouterr()
    assert main(["check-trace", str(declared), "--twin", "reference-dllm"]) == 1  # FCFS twin
    assert "twin_decisions" in capsys.readouterr().out
    undeclared = _log(folder, events, None)
    assert main(["check-trace", str(undeclared)]) == 1
    assert "[fcfs_admission]" in capsys.readouterr().out


def test_check_trace_follows_a_declared_priority_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events: list[Event] = []
    config = SMALL_SYNC.replace(max_running_requests=1, req_pool_rows=1)
    scheduler = ReferenceDllmScheduler(config, events.append, policy=PRIORITY_POLICY)
    scheduler.submit(RequestSpec("late-low", (3, 4), 2, priority=1))
    scheduler.submit(RequestSpec("high", (3, 4), 2))
    scheduler.drain()
    assert_check_trace_follows_the_declared_order(
        tmp_path, capsys, events, PRIORITY_POLICY, "reference-dllm-priority"
    )


def test_the_z3_encoding_takes_the_priority_order_as_a_policy_field() -> None:
    from properties.symbolic.geometry import config_values, policy_label

    assert config_values(SMALL_SYNC, PRIORITY_POLICY)["priority_order"] is True
    assert config_values(SMALL_SYNC, DllmPolicy())["priority_order"] is False
    assert "priority_order=True" in policy_label(PRIORITY_POLICY)
    assert "priority_order" not in policy_label(DllmPolicy())


def test_the_suite_draws_priorities_only_under_priority_order_and_the_program_replays() -> None:
    """The inverted-priority mutant shrinks to a program that submits priorities and, run as
    printed, breaks `fcfs_admission` again; the plain reference's programs carry none."""
    from tests.test_conformance_burst import caught, replay_printed
    from tests.test_mutants import HUNT

    config = SMALL_SYNC.replace(max_running_requests=1, req_pool_rows=1)
    failure, machine = caught("priority_values_inverted", config)
    assert failure.rule == "fcfs_admission"
    assert "'priority': " in failure.program or "priority=" in failure.program, failure.program
    assert replay_printed(failure.program, machine).rule == "fcfs_admission"
    # the FCFS reference under the idealised profile: a failure it is made to show (an
    # unfreed finish) prints no priority
    plain, _ = caught("no_free_on_finish", config, HUNT)
    assert "priority" not in plain.program
