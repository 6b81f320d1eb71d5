"""Profiles take effect: the policy options parameterise the rules (prefill-first batches, work
conservation), RowAcquired is accepted, and contradictory profiles are refused by field."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from properties.conformance import conformance_machine
from reference.dllm import REFERENCE_DLLM, REFERENCE_DLLM_JOINT, REFERENCE_DLLM_SCRIPTED
from spec.config import DllmConfig, Mode
from spec.errors import SpecViolation
from spec.events import (
    Admitted,
    ControlReturned,
    Event,
    Forward,
    ForwardRow,
    KvAllocated,
    KvFreed,
    RowAcquired,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.implementation import DllmImplementation
from spec.machine import SpecMachine
from spec.profile import (
    AcceptedDeviation,
    DllmAdmission,
    DllmConfigSpace,
    DllmPolicy,
    DllmProfile,
    ProfileError,
)

CFG = DllmConfig(
    block_size=2,
    page_size=2,
    kv_pages=16,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=8,
    mode=Mode.FDFO,
    in_place_reuse=True,
)
PREFILL_FIRST = DllmPolicy(admission=DllmAdmission.PREFILL_FIRST)


def _replay(machine: SpecMachine, events: Sequence[Event]) -> str | None:
    try:
        machine.apply_all(events)
    except SpecViolation as v:
        return str(v.rule)
    return None


def _two_admitted() -> list[Event]:
    """a: a prompt-only block 0 (prefill); b: block 0 holds one prompt token (decode)."""
    return [
        Submitted("a", (1, 2, 3, 4), 2),
        Submitted("b", (5,), 3),
        Admitted("a", 0),
        Admitted("b", 1),
        KvAllocated("a", 0, (0, 1)),
        KvAllocated("b", 0, (2, 3)),
    ]


def _row(rid: str, masked: int) -> ForwardRow:
    return ForwardRow(rid, 0, reused=False, num_tokens=2, masked=masked)


# ---------------------------------------------------------------- prefill first
def test_mixed_prefill_and_decode_batch_is_fine_under_fcfs() -> None:
    events = [*_two_admitted(), Forward((_row("a", 0), _row("b", 1)))]
    assert _replay(SpecMachine(CFG), events) is None


def test_prefill_first_refuses_a_mixed_batch() -> None:
    events = [*_two_admitted(), Forward((_row("a", 0), _row("b", 1)))]
    assert _replay(SpecMachine(CFG, PREFILL_FIRST), events) == "prefill_first"


def test_prefill_first_refuses_decode_while_a_prompt_block_waits() -> None:
    events = [*_two_admitted(), Forward((_row("b", 1),))]
    assert _replay(SpecMachine(CFG), events) is None
    assert _replay(SpecMachine(CFG, PREFILL_FIRST), events) == "prefill_first"


def test_prefill_first_accepts_the_prefill_batch_first() -> None:
    events = [*_two_admitted(), Forward((_row("a", 0),))]
    assert _replay(SpecMachine(CFG, PREFILL_FIRST), events) is None


def _queued(*prompts: tuple[str, tuple[int, ...]]) -> list[Event]:
    return [Submitted(rid, prompt, 2) for rid, prompt in prompts]


def test_prefill_first_admits_a_prompt_block_request_past_shorter_prompts() -> None:
    # d1, d2: a prompt shorter than the block (SGLang's INCOMING_DECODE); p: a whole block
    events = [*_queued(("d1", (1,)), ("d2", (2,)), ("p", (3, 4))), Admitted("p", 0)]
    assert _replay(SpecMachine(CFG), events) == "fcfs_admission"
    assert _replay(SpecMachine(CFG, PREFILL_FIRST), events) is None


def test_prefill_first_keeps_fcfs_within_each_kind() -> None:
    past_a_prefill = [*_queued(("p1", (1, 2)), ("d", (3,)), ("p2", (4, 5))), Admitted("p2", 0)]
    past_a_decode = [*_queued(("d1", (1,)), ("d2", (2,))), Admitted("d2", 0)]
    decode_past_prefill = [*_queued(("p", (1, 2)), ("d", (3,))), Admitted("d", 0)]
    policy = PREFILL_FIRST
    for events in (past_a_prefill, past_a_decode, decode_past_prefill):
        m = SpecMachine(CFG, policy)
        with pytest.raises(SpecViolation) as exc:
            m.apply_all(events)
        assert exc.value.rule == "fcfs_admission"
        assert "under PREFILL_FIRST only a request whose first block is prompt-only" in str(
            exc.value
        )


# ---------------------------------------------------------------- work conservation
def _admits_one_of_two() -> list[Event]:
    return [
        Submitted("a", (1,), 3),
        Submitted("b", (5,), 3),
        Admitted("a", 0),
        KvAllocated("a", 0, (0, 1)),
        Forward((_row("a", 1),)),
    ]


def test_a_round_that_admits_nothing_while_the_head_fits_is_not_work_conserving() -> None:
    m = SpecMachine(CFG)
    assert _replay(m, _admits_one_of_two()[:2]) is None
    # round 0 admits a; b is left although it fits: that round did admit, so it passes
    assert _replay(m, _admits_one_of_two()[2:]) is None
    m.apply_all([StepResult("a", 0, 0, 1), ControlReturned(0)])
    # round 1 admits nothing while a seat, a row and pages are free
    assert _replay(m, [Forward((ForwardRow("a", 0, True, 2, 1),))]) == "work_conserving"


def test_work_conserving_off_lets_an_engine_hold_back() -> None:
    m = SpecMachine(CFG, DllmPolicy(work_conserving=False))
    events = [*_admits_one_of_two(), StepResult("a", 0, 0, 1), ControlReturned(0)]
    assert _replay(m, [*events, Forward((ForwardRow("a", 0, True, 2, 1),))]) is None


def test_work_conservation_counts_worst_case_claims_of_the_running() -> None:
    """With the pool claimed by the running request's worst case, holding back is correct."""
    tight = CFG.replace(kv_pages=4)  # a needs 2 pages at most, b 2: 4 fit, so b must come in
    m = SpecMachine(tight.replace(kv_pages=3))  # 2 claimed by a, 1 left < 2 for b
    events = [*_admits_one_of_two(), StepResult("a", 0, 0, 1), ControlReturned(0)]
    assert _replay(m, [*events, Forward((ForwardRow("a", 0, True, 2, 1),))]) is None
    m = SpecMachine(tight)
    assert _replay(m, [*events, Forward((ForwardRow("a", 0, True, 2, 1),))]) == "work_conserving"


# ---------------------------------------------------------------- RowAcquired
NO_REUSE = CFG.replace(in_place_reuse=False, req_pool_rows=2)


def _round0_releasing_row() -> list[Event]:
    return [
        Submitted("a", (1,), 3),
        Admitted("a", 0),
        KvAllocated("a", 0, (0, 1)),
        Forward((_row("a", 1),)),
        StepResult("a", 0, 0, 1),
        KvFreed("a", (0, 1)),
        RowReleased("a", 0),
        ControlReturned(0),
    ]


def test_row_acquired_is_accepted_for_a_carried_block_without_reuse() -> None:
    events = [
        *_round0_releasing_row(),
        RowAcquired("a", 1),
        KvAllocated("a", 0, (2, 3)),
        Forward((_row("a", 1),)),
    ]
    m = SpecMachine(NO_REUSE, DllmPolicy(rows_released_between_rounds=True))
    assert _replay(m, events) is None
    assert m.state().rows == {1: "a"}
    # the idealised spec keeps the row across rounds
    assert _replay(SpecMachine(NO_REUSE), events) == "row_exclusive"


def test_row_acquired_while_holding_a_row_breaks_row_exclusive() -> None:
    events: list[Event] = [Submitted("a", (1,), 3), Admitted("a", 0), RowAcquired("a", 1)]
    assert _replay(SpecMachine(NO_REUSE), events) == "row_exclusive"


def test_a_running_request_without_a_row_under_reuse_breaks_row_exclusive() -> None:
    events = _round0_releasing_row()
    events.remove(KvFreed("a", (0, 1)))  # under reuse the slots stay
    policy = DllmPolicy(rows_released_between_rounds=True)
    assert _replay(SpecMachine(CFG, policy), events) == "row_exclusive"


def test_row_acquired_within_the_scheduler_phase_by_default() -> None:
    """Without the policy a row may still be given back and taken again inside one round."""
    events: list[Event] = [
        Submitted("a", (1,), 3),
        Admitted("a", 0),
        RowReleased("a", 0),
        RowAcquired("a", 1),
        KvAllocated("a", 0, (0, 1)),
        Forward((_row("a", 1),)),
    ]
    assert _replay(SpecMachine(NO_REUSE), events) is None


# ---------------------------------------------------------------- profiles themselves
def test_contradictory_space_is_refused_naming_the_field() -> None:
    with pytest.raises(ProfileError) as exc:
        DllmConfigSpace(modes=frozenset({Mode.SYNC}), in_place_reuse=frozenset({True}))
    assert exc.value.field == "space.in_place_reuse" and "fdfo" in str(exc.value)


def test_deviation_of_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ProfileError) as exc:
        DllmProfile(deviations=(AcceptedDeviation("no_such_rule", "because"),))
    assert exc.value.field == "deviations"


def test_deviation_and_policy_switch_for_the_same_rule_contradict() -> None:
    with pytest.raises(ProfileError):
        DllmProfile(
            policy=DllmPolicy(work_conserving=False),
            deviations=(AcceptedDeviation("work_conserving", "holds back"),),
        )


def test_sglang_facts_are_expressible() -> None:
    """SGLang 0.5.23 dLLM as data: page == block, reuse always, no re-loop, rows sized from
    max_running, page 0 and row 0 reserved, prefill-first batches."""
    profile = DllmProfile(
        space=DllmConfigSpace(
            modes=frozenset({Mode.FDFO}),
            page_multiples=frozenset({1}),
            in_place_reuse=frozenset({True}),
            reloop=frozenset({False}),
            rows_equal_max_running=True,
        ),
        policy=DllmPolicy(
            admission=DllmAdmission.PREFILL_FIRST, reserved_kv_pages=1, reserved_rows=1
        ),
    )
    assert profile.space.outside(CFG) is None
    assert profile.space.outside(CFG.replace(page_size=4)) is not None


@pytest.mark.parametrize(
    "impl",
    [REFERENCE_DLLM, REFERENCE_DLLM_JOINT, REFERENCE_DLLM_SCRIPTED],
    ids=["reference", "joint", "scripted"],
)
def test_every_builtin_passes_under_its_profile(impl: DllmImplementation) -> None:
    machine = conformance_machine(impl.factory, profile=impl.profile)
    run_state_machine_as_test(machine, settings=settings(max_examples=20, deadline=None))


def test_a_space_covers_another_only_where_it_runs_all_of_its_configurations() -> None:
    """`uncovered` names the first kind of configuration the other space allows and this one
    refuses (a decision twin must run every configuration of what it checks); `modes`
    narrows the other space to the modes a run draws."""
    anything = DllmConfigSpace()
    sglang = DllmConfigSpace(
        page_multiples=frozenset({1}),
        in_place_reuse=frozenset({True}),
        reloop=frozenset({False}),
        rows_equal_max_running=True,
        kv_headroom_pages=4,
    )
    assert anything.uncovered(sglang) is None and sglang.uncovered(sglang) is None
    assert sglang.uncovered(anything) == "page_size = block_size x any (this space: {1})"
    other = DllmConfigSpace(block_sizes=frozenset({2, 4}), prefix_cache=frozenset({False, True}))
    headroom = DllmConfigSpace(kv_headroom_pages=4)
    cases = [
        (DllmConfigSpace(modes=frozenset({Mode.SYNC})), other, "mode={fdfo}"),
        (DllmConfigSpace(block_sizes=frozenset({2})), other, "block_size={2, 4} (this space: {2})"),
        (DllmConfigSpace(reloop=frozenset({False})), other, "reloop={True}"),
        (DllmConfigSpace(prefix_cache=frozenset({False, True})), other, None),
        (DllmConfigSpace(), other, "prefix_cache={True}"),
        (
            DllmConfigSpace(rows_equal_max_running=True),
            anything,
            "req_pool_rows other than max_running_requests",
        ),
        (headroom, anything, "any pool below 4 pages of headroom (kv_headroom_pages)"),
        (
            headroom,
            DllmConfigSpace(kv_headroom_pages=2),
            "pools below 4 pages of headroom (kv_headroom_pages)",
        ),
        (headroom, DllmConfigSpace(kv_headroom_pages=5), None),
    ]
    for twin, checked, said in cases:
        assert twin.uncovered(checked) == said, (twin, checked, twin.uncovered(checked))
    # the FDFO switches bind only where the other space runs FDFO
    sync_only = DllmConfigSpace(modes=frozenset({Mode.SYNC}), reloop=frozenset({False}))
    assert sync_only.uncovered(anything, modes=frozenset({Mode.SYNC})) is None
    assert sync_only.uncovered(anything) == "mode={fdfo}"
