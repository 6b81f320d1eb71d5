"""A queue order the spec does not model (`DllmPolicy.free_queue_order`).

SGLang's cache-aware policies (`--schedule-policy lpm`, `dfs-weight`, `hrrn`,
`shortest-prefill-first`) sort the waiting queue by what the radix tree holds before every
round, and `lpm` pushes back a request sharing a short prefix with one ahead of it; `random`
shuffles the queue. The spec declares such an order free: `fcfs_admission` lets any queued
request in, and `work_conserving`, which cannot know the engine's head, asks for an admission
only when every queued request fits. Each test breaks one part and names the violation.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from schedspec_cli.main import main
from spec import Admitted, SpecMachine, SpecViolation, Submitted
from spec.config import DllmConfig, Mode
from spec.events import ControlReturned, Event, Forward, ForwardRow, KvAllocated, StepResult
from spec.profile import DllmAdmission, DllmPolicy, ProfileError
from spec.trace import TraceFormatError, config_to_dict, policy_from_dict
from tests.test_spec_lof import reference_run
from tests.test_spec_priority import _log

FREE = DllmPolicy(free_queue_order=True)
CFG = DllmConfig(
    block_size=2,
    page_size=2,
    kv_pages=16,
    req_pool_rows=3,
    max_running_requests=3,
    max_context=8,
    mode=Mode.FDFO,
    in_place_reuse=True,
)


def test_any_queued_request_may_be_admitted() -> None:
    m = SpecMachine(CFG, FREE)
    m.apply_all([Submitted(f"r{i}", (3, 4), 2) for i in range(3)])
    m.apply(Admitted("r2", 0))
    m.apply(Admitted("r0", 1))
    assert m.state().queue == ("r1",)


def test_without_the_option_the_same_admission_breaks_fcfs_admission() -> None:
    m = SpecMachine(CFG)
    m.apply_all([Submitted(f"r{i}", (3, 4), 2) for i in range(3)])
    with pytest.raises(SpecViolation, match=r"\[fcfs_admission\] admitted 'r2' while 'r0'"):
        m.apply(Admitted("r2", 0))


def test_admission_still_asks_for_a_queued_request_and_a_seat() -> None:
    m = SpecMachine(CFG.replace(max_running_requests=1, req_pool_rows=2), FREE)
    m.apply_all([Submitted("r0", (3, 4), 2), Submitted("r1", (3, 4), 2)])
    with pytest.raises(SpecViolation, match="lifecycle"):
        m.apply(Admitted("nobody", 0))
    m.apply(Admitted("r1", 0))
    with pytest.raises(SpecViolation, match="max_running"):
        m.apply(Admitted("r0", 1))


def _rounds(*submitted: Submitted) -> tuple[list[Event], Event]:
    """Round 0 submits `submitted` and admits `a` (prompt one token, 3 new: 2 worst-case
    pages); round 1 admits nothing and forwards `a` again."""
    first: list[Event] = [
        *submitted,
        Admitted("a", 0),
        KvAllocated("a", 0, (0, 1)),
        Forward((ForwardRow("a", 0, False, 2, 1),)),
        StepResult("a", 0, 0, 1),
        ControlReturned(0),
    ]
    return first, Forward((ForwardRow("a", 0, True, 2, 1),))


A = Submitted("a", (1,), 3)
SMALL = Submitted("small", (5,), 3)  # 2 pages
BIG = Submitted("big", (6,), 7)  # 4 pages


def test_a_free_order_holds_back_while_some_queued_request_does_not_fit() -> None:
    """5 pages, 2 claimed by `a`: `small` fits, `big` does not. Under FCFS the head, `small`,
    fits, so the idle round breaks `work_conserving`; under a free order the engine's head may
    be `big`, so it passes."""
    first, idle_round = _rounds(A, SMALL, BIG)
    fcfs = SpecMachine(CFG.replace(kv_pages=5))
    fcfs.apply_all(first)
    with pytest.raises(SpecViolation, match="admitted nothing although 'small' fits"):
        fcfs.apply(idle_round)
    SpecMachine(CFG.replace(kv_pages=5), FREE).apply_all([*first, idle_round])


def test_a_free_order_catches_an_idle_round_where_every_queued_request_fits() -> None:
    first, idle_round = _rounds(SMALL, BIG, A)  # `a` admitted past both: a free order
    m = SpecMachine(CFG.replace(kv_pages=6), FREE)  # 4 unclaimed pages: `big` fits too
    m.apply_all(first)
    with pytest.raises(SpecViolation) as info:
        m.apply(idle_round)
    assert info.value.rule == "work_conserving"
    assert "the round admitted nothing although every queued request fits, 'big' fits" in str(
        info.value
    ), info.value
    held_back = DllmPolicy(work_conserving=False, free_queue_order=True)
    SpecMachine(CFG.replace(kv_pages=6), held_back).apply_all([*first, idle_round])


@pytest.mark.parametrize(
    "ordered",
    [DllmPolicy(priority_order=True), DllmPolicy(longest_output_first=True)],
    ids=["priority_order", "longest_output_first"],
)
def test_a_free_order_excludes_the_orders_the_spec_defines(ordered: DllmPolicy) -> None:
    with pytest.raises(ProfileError, match=r"policy\.free_queue_order") as info:
        dataclasses.replace(ordered, free_queue_order=True)
    assert "priority_order or longest_output_first" in str(info.value)


def test_a_trace_declares_the_option_and_reads_it_back() -> None:
    assert config_to_dict(CFG, FREE)["declared_policy"] == {"free_queue_order": True}
    assert policy_from_dict({"free_queue_order": True}) == FREE
    assert policy_from_dict({"free_queue_order": True, "admission": "prefill-first"}) == (
        DllmPolicy(admission=DllmAdmission.PREFILL_FIRST, free_queue_order=True)
    )
    with pytest.raises(TraceFormatError, match=r"bad declared_policy.*free_queue_order"):
        policy_from_dict({"free_queue_order": True, "priority_order": True}, 1)


def test_check_trace_reads_a_declared_free_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A one-seat run that admits out of submission order (the reference under lof): declared
    free, `check-trace` passes it; undeclared, it fails `fcfs_admission` with exit code 1."""
    events = reference_run(DllmPolicy(longest_output_first=True), ("short", 2), ("long", 6))
    assert [e.request_id for e in events if isinstance(e, Admitted)] == ["long", "short"]
    assert main(["check-trace", str(_log(tmp_path, events, FREE))]) == 0
    capsys.readouterr()
    assert main(["check-trace", str(_log(tmp_path, events, None))]) == 1
    assert "[fcfs_admission]" in capsys.readouterr().out
