"""Longest output first in the dLLM spec (`DllmPolicy.longest_output_first`).

SGLang's `--schedule-policy lof` sorts the waiting queue by `max_new_tokens`, longest first,
before every round, its dLLM path included (`SchedulePolicy._sort_by_longest_output`, a stable
sort, so arrival breaks ties; under priority scheduling the priority comes first). Under that
option the spec's queue is that order, and `fcfs_admission` reads it; without it
`max_new_tokens` orders nothing. Each test breaks one part and names the violation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reference.dllm import LONGEST_OUTPUT_FIRST_POLICY, ReferenceDllmScheduler
from spec import Admitted, RequestSpec, SpecMachine, SpecViolation, Submitted
from spec.events import Event
from spec.profile import DllmAdmission, DllmPolicy
from spec.trace import TraceFormatError, config_to_dict, policy_from_dict
from tests.event_runs import SMALL_SYNC
from tests.test_spec_priority import assert_check_trace_follows_the_declared_order

LOF = LONGEST_OUTPUT_FIRST_POLICY
PRIORITY_THEN_LOF = DllmPolicy(priority_order=True, longest_output_first=True)
PREFILL_FIRST_LOF = DllmPolicy(admission=DllmAdmission.PREFILL_FIRST, longest_output_first=True)
ONE_SEAT = SMALL_SYNC.replace(max_running_requests=1, req_pool_rows=1)


def queued(policy: DllmPolicy, *lengths: int, priorities: tuple[int, ...] = ()) -> SpecMachine:
    """A machine under `policy` with requests r0, r1, ... submitted in that order with those
    `max_new_tokens` (and priorities, 0 where not given); two-token prompts."""
    m = SpecMachine(SMALL_SYNC, policy)
    for i, length in enumerate(lengths):
        priority = priorities[i] if i < len(priorities) else 0
        m.apply(Submitted(f"r{i}", (3, 4), length, priority=priority))
    return m


def test_the_queue_is_longest_output_first_ties_by_submission() -> None:
    m = queued(LOF, 2, 6, 2, 4, 6)
    assert m.state().queue == ("r1", "r4", "r3", "r0", "r2")
    m.apply(Admitted("r1", 0))
    m.apply(Admitted("r4", 1))
    assert m.state().queue == ("r3", "r0", "r2")


def test_admitting_past_a_longer_output_breaks_fcfs_admission() -> None:
    m = queued(LOF, 2, 6)
    with pytest.raises(SpecViolation) as info:
        m.apply(Admitted("r0", 0))
    message = str(info.value)
    assert "[fcfs_admission]" in message
    assert "admitted 'r0' while 'r1' is ahead of it" in message
    assert (
        "the queue is ordered by max_new_tokens, longest first "
        "(r1: max_new_tokens 6, r0: max_new_tokens 2)" in message
    )


def test_without_the_option_max_new_tokens_orders_nothing() -> None:
    m = queued(DllmPolicy(), 2, 6)
    assert m.state().queue == ("r0", "r1")
    with pytest.raises(SpecViolation, match="fcfs_admission"):
        m.apply(Admitted("r1", 0))


def test_under_priority_order_too_the_priority_comes_first_then_the_longest() -> None:
    m = queued(PRIORITY_THEN_LOF, 6, 2, 4, 2, priorities=(1, 0, 0, 1))
    assert m.state().queue == ("r2", "r1", "r0", "r3")
    with pytest.raises(SpecViolation) as info:
        m.apply(Admitted("r0", 0))
    assert (
        "the queue is ordered by priority, lower first, then max_new_tokens, longest first "
        "(r2: priority 0 max_new_tokens 4, r1: priority 0 max_new_tokens 2, "
        "r0: priority 1 max_new_tokens 6, r3: priority 1 max_new_tokens 2)" in str(info.value)
    )


def test_the_queue_key_and_its_description_follow_the_options() -> None:
    assert DllmPolicy().queue_key(3, 9) == (0, 0) and not DllmPolicy().orders_queue
    assert LOF.queue_key(3, 9) == (0, -9) and LOF.orders_queue
    assert PRIORITY_THEN_LOF.queue_key(3, 9) == (3, -9)
    assert DllmPolicy().describe_queue_order() == ""
    assert LOF.describe_queue_order() == "the queue is ordered by max_new_tokens, longest first"


def test_under_prefill_first_a_prompt_block_passes_only_decode_requests_in_that_order() -> None:
    m = SpecMachine(SMALL_SYNC, PREFILL_FIRST_LOF)
    m.apply(Submitted("short-prompt", (3,), 6))  # first block not prompt-only
    m.apply(Submitted("prompt-short-out", (3, 4), 2))
    m.apply(Submitted("prompt-long-out", (3, 4), 4))
    # order: short-prompt(6), prompt-long-out(4), prompt-short-out(2); a prompt block may pass
    # short-prompt, but not the prompt block with the longer output
    with pytest.raises(SpecViolation) as info:
        m.apply(Admitted("prompt-short-out", 0))
    assert "'short-prompt' is ahead" in str(info.value)
    m.apply(Admitted("prompt-long-out", 0))


def test_reindex_keeps_the_queue_longest_first() -> None:
    m = queued(LOF, 2, 6, 4)
    m._queue = dict.fromkeys(("r0", "r1", "r2"))  # what a drift-guard perturbation may leave
    m.reindex()
    assert m.state().queue == ("r1", "r2", "r0")


def test_a_trace_declares_the_option_and_reads_it_back() -> None:
    assert config_to_dict(SMALL_SYNC, LOF)["declared_policy"] == {"longest_output_first": True}
    assert policy_from_dict({"longest_output_first": True}) == LOF
    with pytest.raises(TraceFormatError, match="longest_output_first=1: must be true or false"):
        policy_from_dict({"longest_output_first": 1})


def reference_run(policy: DllmPolicy, *requests: tuple[str, int]) -> list[Event]:
    events: list[Event] = []
    scheduler = ReferenceDllmScheduler(ONE_SEAT, events.append, policy=policy)
    for rid, length in requests:
        scheduler.submit(RequestSpec(rid, (3, 4), length))
    scheduler.drain()
    return events


def test_the_reference_admits_longest_output_first() -> None:
    events = reference_run(LOF, ("two", 2), ("six", 6), ("four", 4), ("six-later", 6))
    admitted = [e.request_id for e in events if isinstance(e, Admitted)]
    assert admitted == ["six", "six-later", "four", "two"]
    m = SpecMachine(ONE_SEAT, LOF)
    for e in events:
        m.apply(e)
    m2 = SpecMachine(ONE_SEAT)  # the idealised spec refuses the same run
    with pytest.raises(SpecViolation, match="fcfs_admission"):
        for e in events:
            m2.apply(e)


def test_check_trace_follows_a_declared_longest_output_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = reference_run(LOF, ("short", 2), ("long", 6))
    assert_check_trace_follows_the_declared_order(
        tmp_path, capsys, events, LOF, "reference-dllm-lof"
    )


def test_the_shortest_first_mutant_shrinks_to_a_program_that_replays() -> None:
    """The seeded bug (the sort key's sign dropped) is caught by `fcfs_admission` with a
    readable program, which run as printed breaks the rule again."""
    from tests.test_conformance_burst import caught, replay_printed

    failure, machine = caught("shortest_output_first", ONE_SEAT)
    assert failure.rule == "fcfs_admission"
    assert "max_new_tokens, longest first" in failure.message, failure.message
    assert "priority" not in failure.program  # drawn only under priority_order
    assert replay_printed(failure.program, machine).rule == "fcfs_admission"
