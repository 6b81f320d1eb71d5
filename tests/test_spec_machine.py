"""SpecMachine on hand-written event sequences: each rule fires on the event that breaks it."""

from __future__ import annotations

import pytest

from spec import (
    Aborted,
    Admitted,
    BlockCommitted,
    ControlReturned,
    DllmConfig,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    KvAllocated,
    KvFreed,
    Mode,
    RowReleased,
    Snapshot,
    SpecMachine,
    SpecViolation,
    StepResult,
    Submitted,
)
from spec.ar.config import ArConfig
from spec.ar.machine import ArSpecMachine
from spec.lifecycles import LIFECYCLES, mermaid
from spec.rules import RULES

CFG = DllmConfig(
    block_size=2,
    page_size=4,
    kv_pages=4,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=8,
    mode=Mode.FDFO,
    in_place_reuse=True,
)


def row(rid: str, block: int, masked: int, reused: bool = False, n: int = 2) -> ForwardRow:
    return ForwardRow(rid, block, reused, n, masked)


def one_block_run(m: SpecMachine) -> None:
    """r0: prompt of 1 token, 1 new token -> one output block (1 prompt + 1 mask)."""
    m.apply(Submitted("r0", (5,), 1))
    m.apply(Admitted("r0", 0))
    m.apply(KvAllocated("r0", 0, (0, 1)))
    m.apply(Forward((row("r0", 0, 1),)))
    m.apply(StepResult("r0", 0, 0, 0))
    m.apply(ControlReturned(0))
    m.apply(Forward((row("r0", 0, 0, reused=True),)))
    m.apply(StepResult("r0", 0, 2, 0))
    m.apply(BlockCommitted("r0", 0, (5, 7)))
    m.apply(KvFreed("r0", (0, 1)))
    m.apply(RowReleased("r0", 0))
    m.apply(Finished("r0", FinishReason.LENGTH))
    m.apply(ControlReturned(1))


def test_a_conforming_run_replays_and_ends_idle() -> None:
    m = SpecMachine(CFG)
    one_block_run(m)
    assert m.is_idle()
    assert m.outputs() == {"r0": (7,)}
    m.check_invariants()
    m.check_snapshot(Snapshot(frozenset(range(16)), {}, {}, frozenset(), frozenset()))


def violation(events: list[object], cfg: DllmConfig = CFG) -> SpecViolation:
    m = SpecMachine(cfg)
    with pytest.raises(SpecViolation) as info:
        for e in events:
            m.apply(e)  # type: ignore[arg-type]
    assert info.value.rule in RULES, info.value.rule
    return info.value


def test_final_forward_before_commit() -> None:
    v = violation(
        [
            Submitted("r0", (5,), 1),
            Admitted("r0", 0),
            KvAllocated("r0", 0, (0, 1)),
            Forward((row("r0", 0, 1),)),
            StepResult("r0", 0, 2, 0),
        ]
    )
    assert v.rule == "final_forward_before_commit"
    assert "started with 1 masks" in str(v) and "state:" in str(v)


def test_fcfs_and_max_running_and_rows() -> None:
    base = [Submitted("a", (1,), 1), Submitted("b", (1,), 1), Submitted("c", (1,), 1)]
    assert violation([*base, Admitted("b", 0)]).rule == "fcfs_admission"
    assert violation([*base, Admitted("a", 0), Admitted("b", 0)]).rule == "row_exclusive"
    v = violation([*base, Admitted("a", 0), Admitted("b", 1), Admitted("c", 2)])
    assert v.rule == "max_running"


def test_page_alignment_and_exclusive_slots() -> None:
    base = [
        Submitted("a", (1, 2, 3), 1),
        Submitted("b", (1,), 1),
        Admitted("a", 0),
        Admitted("b", 1),
        KvAllocated("a", 0, (0, 1)),
    ]
    assert violation([*base, KvAllocated("b", 0, (2, 3))]).rule == "page_alignment"
    assert violation([*base, KvAllocated("b", 0, (0, 1))]).rule == "kv_exclusive"
    assert violation([*base, KvAllocated("b", 0, (5, 6))]).rule == "page_alignment"
    assert violation([*base, KvAllocated("b", 0, (4,))]).rule == "whole_block_alloc"


def test_ragged_rows_and_carrier_continuity() -> None:
    base = [Submitted("a", (1,), 3), Admitted("a", 0), KvAllocated("a", 0, (0, 1))]
    assert violation([*base, Forward((row("a", 0, 1, n=1),))]).rule == "whole_block_rows"
    assert violation([*base, Forward((row("a", 0, 2),))]).rule == "carrier_continuity"


def test_terminal_requests_own_nothing_and_double_free() -> None:
    run = [
        Submitted("r0", (5,), 1),
        Admitted("r0", 0),
        KvAllocated("r0", 0, (0, 1)),
        Forward((row("r0", 0, 1),)),
        StepResult("r0", 0, 0, 0),
        ControlReturned(0),
    ]
    assert violation([*run, RowReleased("r0", 0), Aborted("r0")]).rule == "terminal_owns_nothing"
    v = violation([*run, KvFreed("r0", (0, 1)), KvFreed("r0", (0, 1))])
    assert v.rule == "free_owned_only"


def test_sync_yields_only_when_all_done() -> None:
    cfg = CFG.replace(mode=Mode.SYNC, in_place_reuse=False)
    v = violation(
        [
            Submitted("r0", (5,), 1),
            Admitted("r0", 0),
            KvAllocated("r0", 0, (0, 1)),
            Forward((row("r0", 0, 1),)),
            StepResult("r0", 0, 0, 0),
            ControlReturned(0),
        ],
        cfg,
    )
    assert v.rule == "sync_yields_when_all_done"


def test_no_reuse_requires_release_and_reuse_forbids_it() -> None:
    head = [
        Submitted("r0", (5,), 1),
        Admitted("r0", 0),
        KvAllocated("r0", 0, (0, 1)),
        Forward((row("r0", 0, 1),)),
        StepResult("r0", 0, 0, 0),
    ]
    cfg = CFG.replace(in_place_reuse=False)
    assert violation([*head, ControlReturned(0)], cfg).rule == "no_reuse_releases"
    v = violation([*head, KvFreed("r0", (0, 1)), ControlReturned(0)])
    assert v.rule == "reuse_keeps_slots"


def test_progress_rule() -> None:
    v = violation([Submitted("r0", (5,), 1), ControlReturned(0)])
    assert v.rule == "progress"


def test_snapshot_mismatch_is_reported() -> None:
    m = SpecMachine(CFG)
    m.apply(Submitted("r0", (5,), 1))
    m.apply(Admitted("r0", 0))
    m.apply(KvAllocated("r0", 0, (0, 1)))
    leaky = Snapshot(
        frozenset(range(2, 15)), {0: ("r0", 0), 1: ("r0", 0)}, {0: "r0"}, frozenset({"r0"})
    )
    with pytest.raises(SpecViolation) as info:
        m.check_snapshot(leaky)
    assert info.value.rule == "snapshot_matches"
    # only the side that differs is named (no "also frees []")
    assert "free slots differ: implementation lacks [15]" in str(info.value)
    assert "also frees" not in str(info.value)


def test_a_snapshot_of_the_wrong_type_is_named_as_such() -> None:
    m = SpecMachine(CFG)
    with pytest.raises(SpecViolation) as info:
        m.check_snapshot(None)  # type: ignore[arg-type]  # what a broken adapter returns
    assert info.value.rule == "snapshot_matches"
    assert "snapshot() returned NoneType, not a spec.Snapshot" in str(info.value)
    ar = ArSpecMachine(ArConfig(block_size=2, num_blocks=8))
    with pytest.raises(SpecViolation) as info:
        ar.check_snapshot({"free": []})  # type: ignore[arg-type]
    assert "snapshot() returned dict, not a spec.ar.ArSnapshot" in str(info.value)


def test_enabled_reports_rule_without_changing_state() -> None:
    m = SpecMachine(CFG)
    m.apply(Submitted("r0", (5,), 1))
    assert m.enabled(Admitted("zz", 0)) == "lifecycle"
    assert m.enabled(Admitted("r0", 0)) is None
    assert m.state().queue == ("r0",)


def test_lifecycle_tables_render() -> None:
    for lc in LIFECYCLES:
        text = mermaid(lc)
        assert text.startswith("stateDiagram-v2")
        for t in lc.transitions:
            assert t.target in text
    assert all(isinstance(v, str) and v for v in RULES.values())


def test_abort_mid_round_is_rejected_with_a_violation_not_a_crash() -> None:
    """Found by the Z3 drift guard: a sync forward after a mid-round abort crashed the machine."""
    cfg = CFG.replace(mode=Mode.SYNC, in_place_reuse=False)
    v = violation(
        [
            Submitted("a", (5, 6), 1),
            Submitted("b", (5,), 1),
            Admitted("a", 0),
            Admitted("b", 1),
            KvAllocated("a", 0, (0, 1)),
            KvAllocated("b", 0, (4, 5)),
            Forward((row("a", 0, 0), row("b", 0, 1))),
            StepResult("a", 0, 2, 0),
            StepResult("b", 0, 0, 0),
            KvFreed("b", (4, 5)),
            RowReleased("b", 1),
            Aborted("b"),
        ],
        cfg,
    )
    assert v.rule == "scheduler_phase"
