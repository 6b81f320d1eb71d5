"""`verify` names a dLLM failure that is a known finding, as it does an AR one
(`tests/test_verify_known_fixes.py`): the dLLM harness records every operation, the conformance
machine keeps the failing example (`properties.example.DllmExample`), and `verify` runs it again
as it is and with each of SGLang's known fixes whose finding breaks its rule. A fix names the
finding when the program passes with it and every round before the failure admits and forwards
as without it, up to the round where a fix that admits otherwise by design (an estimate, a
reservation) first does.

The SGLang cases need SGLang installed (`schedspec install-engines sglang`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from integrations.sglang import (
    REAL_SGLANG_DLLM,
    REAL_SGLANG_DLLM_LOF,
    REAL_SGLANG_DLLM_UNDER_PRESSURE,
)
from integrations.sglang.fixes import FINDING_RULES, SGLANG_FIXES, known_fixes, sglang_fixed
from properties.conformance import conformance_machine
from properties.example import DllmExample
from properties.operations import Abort, Drain, Op, Round, Submit
from properties.verify import (
    DllmTwin,
    Failure,
    VerifyResult,
    failure_from,
    run_machine,
    verify_settings,
)
from reference.dllm import REFERENCE_DLLM
from schedspec_cli.main import main
from schedspec_cli.twins import resolve_twin
from spec.adapter import EventSink, SchedulerAdapter
from spec.config import DllmConfig, Mode, RequestSpec
from spec.events import Admitted, ControlReturned, Event, Forward, ForwardRow
from spec.implementation import Family
from tests.mutants import MUTANTS
from tests.test_real_sglang import ROWS_TAKEN as ROWS_TAKEN_FINDING
from tests.test_real_sglang import (
    ROWS_TAKEN_CONFIG,
    recreate_32992,
    sglang_installed,  # noqa: F401 - the module's engine gate
    two_long_requests_config,
)
from tests.test_sglang_priority import _config  # sync, block = page = 2, as many rows as seats

UNDER_PRESSURE = REAL_SGLANG_DLLM_UNDER_PRESSURE
MUTANT = MUTANTS["no_free_on_finish"]  # keeps a finished request's KV: terminal_owns_nothing


def _submit(rid: str, prompt_len: int, new_tokens: int) -> Submit:
    return Submit(RequestSpec(rid, (0,) * prompt_len, new_tokens))


def _failure(example: DllmExample, factory: Any) -> Failure:
    """The example's failure as `verify` reports it (its rule; the example kept)."""
    found = example.replay(factory)
    assert found is not None
    return Failure(found.rule, str(found), "program", example)


def _trial(failure: Failure, factory: Any, impl: str) -> Any:
    from schedspec_cli.known_fixes import try_known_fixes

    return try_known_fixes(failure, factory, known_fixes(impl))


# ---------------------------------------------------------------- the example, engine aside
def test_the_failing_dllm_example_is_kept_and_fails_again_the_same_way() -> None:
    machine = conformance_machine(MUTANT.factory, configs=MUTANT.configs, profile=MUTANT.profile)
    err, printed = run_machine(machine, verify_settings(200))
    assert err is not None
    failure = failure_from(err, printed)
    example = failure.example
    assert isinstance(example, DllmExample) and example.ops
    assert any(isinstance(op, Submit) for op in example.ops)
    again = example.replay(MUTANT.factory)
    assert again is not None and again.rule == failure.rule == MUTANT.rule
    assert example.replay(REFERENCE_DLLM.factory) is None  # the correct scheduler passes it
    assert set(failure.to_json()) == {"rule", "message", "program"}  # kept in memory only


def _batch_dependent(config: DllmConfig, sink: EventSink) -> SchedulerAdapter:
    """The reference alone, a stale-context mutant in a batch: outputs that depend on the
    batch, every event conforming."""
    stale = MUTANTS["stale_context"].factory
    return (stale if config.max_running_requests > 1 else REFERENCE_DLLM.factory)(config, sink)


def test_the_example_runs_the_teardowns_output_check() -> None:
    """Outputs that depend on the batch fail parity at the end, as the machine's teardown
    does under `parity="always"`, and pass without it (golden off: it would fail first)."""
    ops: tuple[Op, ...] = (_submit("r0", 3, 4), _submit("r1", 1, 3), Drain())
    config = _config(kv_pages=16, max_context=8)
    profile = REFERENCE_DLLM.profile
    with_golden = DllmExample(config, profile, ops)
    found = with_golden.replay(_batch_dependent)
    assert found is not None and found.rule == "golden_output"
    parity_only = DllmExample(config, profile, ops, parity="always", golden=False)
    found = parity_only.replay(_batch_dependent)
    assert found is not None and found.rule == "fdfo_sync_parity"
    assert (
        DllmExample(config, profile, ops, parity="bs1", golden=False).replay(_batch_dependent)
        is None
    )  # parity read at batch size 1 only
    unchecked = DllmExample(config, profile, ops, parity="never", golden=False)
    assert unchecked.replay(_batch_dependent) is None


def _round(admits: list[str], rows: list[tuple[str, int]], index: int) -> list[Event]:
    events: list[Event] = [Admitted(rid, row) for row, rid in enumerate(admits)]
    forward = Forward(tuple(ForwardRow(rid, block, False, 2, 2) for rid, block in rows))
    return [*events, forward, ControlReturned(index)]


def test_decisions_are_compared_round_by_round_up_to_the_failure() -> None:
    """The first round that admits or forwards otherwise. When the failure was raised at the
    failing run's last event, that event is left out and its round compared as far as it
    went; otherwise (a crash, an end-of-run check) every round whole. A fix that admits
    otherwise by design is compared only up to its own first admission."""
    first = DllmExample.first_other_decision
    r0 = _round(["a"], [("a", 0)], 0)
    r1 = _round([], [("a", 1)], 1)
    failing = _round([], [("a", 2)], 2)
    before = [*r0, *r1, *failing]
    end = before[-1]  # raised at the end of round 2 (an idle round's check)
    assert first(before, before) is None
    more = _round(["b"], [("a", 2)], 2)  # the last round admits more: it went further
    assert first(before, [*r0, *r1, *more], failed_at=end) is None
    assert first(before, [*r0, *r1, *more]) == 2  # a crash after round 2: compared whole
    assert first([*r0, *r1, *more], before, failed_at=end) == 2  # it admitted b before
    other_rows = _round([], [("a", 2), ("b", 0)], 2)
    assert first(before, [*r0, *r1, *other_rows], failed_at=end) == 2
    assert first(before, [*r0, *_round([], [("a", 1), ("b", 0)], 1)], failed_at=end) == 1
    two_admitted = _round(["a", "b"], [("a", 0)], 0)
    assert first(before, [*two_admitted, *r1]) == 0  # other admissions
    assert first(before, [*two_admitted, *r1], by_design=True) is None
    assert first(before, r0) == 1  # it ended sooner
    # raised inside round 1, at admitting c (the decision that broke the rule, not
    # compared), after admitting b
    bad = Admitted("c", 0)
    mid_round = [*r0, Admitted("b", 1), bad]
    assert first(mid_round, [*r0, *_round(["b", "d"], [("b", 0)], 1)], failed_at=bad) is None
    assert first(mid_round, [*r0, *_round(["d"], [("d", 0)], 1)], failed_at=bad) == 1
    idle = [ControlReturned(0)]  # an idle round that admitted nothing: the failure itself
    assert first(idle, _round(["a"], [("a", 0)], 0), failed_at=idle[0]) is None
    assert first(idle, _round(["a"], [("a", 0)], 0)) == 0


# ---------------------------------------------------------------- SGLang's findings
def test_sglangs_known_fixes_are_those_of_each_spaces_findings() -> None:
    pressure = {fix.name: fix for fix in known_fixes("real-sglang-dllm-under-pressure")}
    assert set(pressure) == {
        "refused-stays-incoming",
        "worst-case-estimate",
        "reserve-future-blocks",
        "decode-fallback",
        "whole-staged-blocks",
    }
    # all but the decode fallback change what the adder admits, by design
    assert {n for n, fix in pressure.items() if not fix.by_design} == {"decode-fallback"}
    assert all(fix.rules == FINDING_RULES[n] for n, fix in pressure.items())
    lof = [fix.name for fix in known_fixes("real-sglang-dllm-lof")]
    assert lof == ["whole-staged-blocks", "priority-window"]
    # the declared headroom keeps four of the five out of reach, not the staging truncation
    assert [fix.name for fix in known_fixes("real-sglang-dllm")] == ["whole-staged-blocks"]
    assert known_fixes("vllm-v1") == ()
    assert set(FINDING_RULES) <= set(SGLANG_FIXES.names)


def test_an_idle_engine_is_named_by_the_worst_case_estimate() -> None:
    """0.5.23's estimate (19 tokens for a request that claims 2) leaves an idle engine with a
    queued request: `[progress]`. Of the three fixes whose finding breaks `progress`, only the
    estimate passes it; it admits in the failing round, which is not compared."""
    config = _config(block_size=1, page_size=1, kv_pages=2, req_pool_rows=1)
    config = config.replace(max_running_requests=1, max_context=2)
    example = DllmExample(config, UNDER_PRESSURE.profile, (_submit("r0", 1, 1), Drain()))
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "progress"
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None and trial.replayed
    assert {f.name for f in trial.tried} == {
        "worst-case-estimate",
        "reserve-future-blocks",
        "decode-fallback",
    }
    assert trial.passes_with == (("worst-case-estimate",),) and trial.on_purpose == ()
    assert (
        "KNOWN FINDING: this program passes with the engine fix `worst-case-estimate`"
        in trial.lines()[0]
    )


#: Two requests of 3 and 5 pages in a pool of 7: 0.5.23 admits the second while the first
#: still needs blocks, and later raises `Prefill out of memory`.
OVERCOMMIT = (Round(), Round(), _submit("r0", 1, 4), _submit("r1", 2, 7), Drain())


def test_an_overcommitted_pool_is_named_by_the_reservation_admitting_otherwise_on_purpose() -> None:
    config = _config(kv_pages=7, max_context=10)
    example = DllmExample(config, UNDER_PRESSURE.profile, OVERCOMMIT)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "implementation_error" and "Prefill out of memory" in failure.message
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    # r0, refused, comes back in round 4 through the staging path, past the estimate that
    # refused it: kept incoming it waits; the reservation does not admit it there either;
    # whole staged blocks, charging r1's staged block only the KV it newly takes, admits r0 a
    # round sooner, and waits instead of overcommitting
    assert trial is not None
    assert trial.passes_with == (
        ("refused-stays-incoming",),
        ("reserve-future-blocks",),
        ("whole-staged-blocks",),
    )
    assert trial.on_purpose == (
        (("refused-stays-incoming",), 4),
        (("reserve-future-blocks",), 4),
        (("whole-staged-blocks",), 3),
    )
    lines = trial.lines()
    assert lines[1].startswith("PROBABLY A KNOWN FINDING: this program passes with the engine")
    assert "`reserve-future-blocks`" in lines[1]
    assert "deciding as before up to round 4, where it admits otherwise by design" in lines[1]
    assert trial.to_json()["on_purpose"][1] == {"fixes": ["reserve-future-blocks"], "round": 4}
    assert trial.identified_by() == ()  # none runs alike up to the failure
    # the released run shows the refused request's way back (`integrations.sglang.witness`),
    # quoted as a lead; the staging truncation's witness saw nothing
    took = "PrefillAdder.add_dllm_staging_req took 'r0' without a row (extending it by 2 tokens)"
    assert trial.witnessed == (
        ("refused-stays-incoming", (took,)),
        ("whole-staged-blocks", ()),
    )
    assert [line.split(":")[0] for line in lines[:3]] == ["PROBABLY A KNOWN FINDING"] * 3
    assert lines[3] == (
        "A lead, not proof: run again with no fix, the program showed the mechanism of "
        f"`refused-stays-incoming`'s finding acting: {took} (it acts in runs that pass too, so "
        "this does not tie it to the failure)."
    )
    assert trial.to_json()["witnessed"] == {
        "refused-stays-incoming": [took],
        "whole-staged-blocks": [],
    }


def test_a_bug_of_ones_own_beside_a_seen_mechanism_is_no_known_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review's counterexample to naming a finding on its witness alone: the overcommit's
    program with `r1` asking 5 tokens passes as released, and the staging path still takes
    `r0` without a row (the mechanism acts in passing runs). A bug of one's own in batch
    formation (a shared batch's last request loses a token) makes it fail `whole_block_alloc`;
    the refused-request fix sidesteps the shared batch and passes. The verdict stays
    "probably", with the mechanism a lead: no set is named."""
    from sglang.srt.dllm.mixin.scheduler import SchedulerDllmMixin

    config = _config(kv_pages=7, max_context=10)
    ops = (Round(), Round(), _submit("r0", 1, 4), _submit("r1", 2, 5), Drain())
    example = DllmExample(config, UNDER_PRESSURE.profile, ops)
    assert example.replay(UNDER_PRESSURE.factory) is None  # released, no bug: it passes
    create = SchedulerDllmMixin._create_dllm_batch

    def own_bug(self: Any, can_run_list: Any, *args: Any, **kwargs: Any) -> Any:
        if len(can_run_list) > 1:
            can_run_list[-1].extend_end -= 1
        return create(self, can_run_list, *args, **kwargs)

    monkeypatch.setattr(SchedulerDllmMixin, "_create_dllm_batch", own_bug)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "whole_block_alloc"
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None and trial.identified_by() == ()
    assert dict(trial.witnessed)["refused-stays-incoming"], trial.witnessed
    assert not any(line.startswith("KNOWN FINDING") for line in trial.lines()), trial.lines()
    assert any(line.startswith("A lead, not proof") for line in trial.lines()), trial.lines()


#: Two rows, three seats: r1 and r3, refused by the adder, come back as staging requests
#: without a row and SGLang raises `alloc_req_slots runs out of memory` (tests/test_real_sglang.py).
ROWS_TAKEN = ROWS_TAKEN_FINDING.ops


def test_a_row_taken_by_the_staging_path_is_named_by_keeping_the_refused_request_incoming() -> None:
    """Found by `--seed 4` (2026-12-06), where the verdict was NO KNOWN FINDING SAYS THIS: the
    crash's message was not SGLang running out of KV. It passes with the refused request kept
    incoming together with the decode fallback (kept incoming, it waits for a row: the row
    starvation), up to round 2, where keeping it incoming admits otherwise by design."""
    example = DllmExample(ROWS_TAKEN_CONFIG, UNDER_PRESSURE.profile, ROWS_TAKEN)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "implementation_error"
    assert "alloc_req_slots runs out of memory" in failure.message
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None
    assert ("refused-stays-incoming", "decode-fallback") in trial.passes_with
    assert (("refused-stays-incoming", "decode-fallback"), 2) in trial.on_purpose
    assert trial.lines()[0].startswith(
        "PROBABLY A KNOWN FINDING: this program passes with the engine fixes "
        "`refused-stays-incoming`"
    )
    # r1 and r3 both come back through the staging path without a row: quoted, as a lead
    lead = [line for line in trial.lines() if line.startswith("A lead, not proof")]
    assert (
        len(lead) == 1
        and "took 'r3' without a row (extending it by 2 tokens) (and 1 more)" in (lead[0])
    )
    assert "With the engine fix `refused-stays-incoming` alone it fails by [progress]" in (
        "\n".join(trial.lines())
    )


def test_a_fixed_run_that_breaks_an_accepted_rule_stops_there_and_says_so() -> None:
    """With `progress` accepted (`--accept`), `refused-stays-incoming` alone no longer "fails by
    [progress] instead": the run breaks a rule the campaign accepts and stops there, unchecked,
    which says nothing of the crash; the pair with the decode fallback still passes."""
    example = DllmExample(ROWS_TAKEN_CONFIG, UNDER_PRESSURE.profile, ROWS_TAKEN)
    failure = _failure(example, UNDER_PRESSURE.factory)
    from schedspec_cli.known_fixes import try_known_fixes

    known = known_fixes("real-sglang-dllm-under-pressure")
    trial = try_known_fixes(failure, UNDER_PRESSURE.factory, known, frozenset({"progress"}))
    assert trial is not None
    assert trial.other == ()
    assert (("refused-stays-incoming",), "progress") in trial.accepted_stops
    assert ("refused-stays-incoming", "decode-fallback") in trial.passes_with
    said = "\n".join(trial.lines())
    assert "alone it fails by [progress]" not in said, said
    assert (
        "With the engine fix `refused-stays-incoming` it breaks [progress], which this run "
        "accepts: it stops there, unchecked, so that says nothing of [implementation_error]."
    ) in said, said
    stops = trial.to_json()["accepted_stops"]
    assert {"fixes": ["refused-stays-incoming"], "rule": "progress"} in stops


def test_the_trials_accept_the_profiles_deviations_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """`known_fix_trials` hands the trials the profile's deviations beside `--accept`'s rules
    (a user's profile that declares one; the built-ins declare none)."""
    import dataclasses

    from schedspec_cli import verify as verify_cmd
    from schedspec_cli.impls import resolve
    from spec.profile import AcceptedDeviation

    seen: list[frozenset[str]] = []

    def spy(failure: Any, factory: Any, fixes: Any, accepted: frozenset[str]) -> None:
        seen.append(accepted)

    monkeypatch.setattr(verify_cmd, "try_known_fixes", spy)
    example = DllmExample(ROWS_TAKEN_CONFIG, UNDER_PRESSURE.profile, ROWS_TAKEN)
    result = VerifyResult("x", 1, 1, 0.0, failures=[_failure(example, UNDER_PRESSURE.factory)])
    target = resolve("real-sglang-dllm-under-pressure")
    declared = (AcceptedDeviation("fcfs_admission", "a queue order of its own"),)
    profile = dataclasses.replace(UNDER_PRESSURE.profile, deviations=declared)
    implementation = dataclasses.replace(UNDER_PRESSURE, profile=profile)
    target = dataclasses.replace(target, implementation=implementation)
    accepted = (AcceptedDeviation("progress", "the row starvation is known"),)
    assert verify_cmd.known_fix_trials(target, result, accepted) == [None]
    assert seen == [frozenset({"progress", "fcfs_admission"})]


def test_a_fix_that_admits_otherwise_without_saying_so_is_no_evidence() -> None:
    """The same program, the reservation not declared as admitting otherwise by design: it
    passes, but decides otherwise from round 4 on, before the failure."""
    from schedspec_cli.known_fixes import try_known_fixes

    config = _config(kv_pages=7, max_context=10)
    example = DllmExample(config, UNDER_PRESSURE.profile, OVERCOMMIT)
    failure = _failure(example, UNDER_PRESSURE.factory)
    undeclared = SGLANG_FIXES.known({"reserve-future-blocks": ["implementation_error"]})
    trial = try_known_fixes(failure, UNDER_PRESSURE.factory, undeclared)
    assert trial is not None and trial.passes_with == ()
    assert trial.passes_otherwise == (("reserve-future-blocks", 4),)
    assert "decides otherwise from round 4 on, before the failure" in "\n".join(trial.lines())


def test_a_set_whose_candidate_does_nothing_names_nothing() -> None:
    """Three requests in a pool of 4 pages run out of memory. The reservation passes it only
    with the worst-case estimate, but the estimate alone passes it too (admitting otherwise
    from round 0: the program never reaches the crash), so that pair is no evidence of the
    reservation's finding and none is named (seed 2's counterexample of `verify --impl
    real-sglang-dllm-under-pressure --keep-going`)."""
    config = _config(kv_pages=4, max_context=6)
    ops = (_submit("r0", 1, 1), _submit("r1", 1, 4), _submit("r2", 1, 2), Drain())
    example = DllmExample(config, UNDER_PRESSURE.profile, ops)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "implementation_error"
    with sglang_fixed(["worst-case-estimate", "reserve-future-blocks"]):
        assert example.replay(UNDER_PRESSURE.factory) is None
    with sglang_fixed(["worst-case-estimate"]):
        assert example.replay(UNDER_PRESSURE.factory) is None
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None and trial.passes_with == ()
    assert ("whole-staged-blocks", "progress") in trial.other
    assert trial.lines()[0].startswith("NO KNOWN FIX IDENTIFIES IT")
    # a refused request did come back without a row: quoted as a lead, though no set passes
    seen = dict(trial.witnessed)["refused-stays-incoming"]
    assert seen and all("without a row" in note for note in seen), trial.witnessed
    assert any(
        line.startswith(
            "A lead, not proof: run again with no fix, the program showed the mechanism of "
            f"`refused-stays-incoming`'s finding acting: {seen[0]}"
        )
        for line in trial.lines()
    ), trial.lines()


def test_a_crash_that_is_not_running_out_of_memory_is_no_known_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug of one's own that raises in a shared batch of the overcommit's program: any crash
    breaks `implementation_error`, but SGLang's known findings that break it say `out of
    memory`, so none is tried (the reservation would pass the program, by not forming the
    shared batch)."""
    from sglang.srt.managers.scheduler import Scheduler

    process = Scheduler.process_batch_result_dllm

    def new_bug(self: Any, batch: Any, result: Any) -> Any:
        if len(batch.reqs) > 1:
            raise RuntimeError("new bug: list index out of range in a shared batch")
        return process(self, batch, result)

    monkeypatch.setattr(Scheduler, "process_batch_result_dllm", new_bug)
    config = _config(kv_pages=7, max_context=10)
    example = DllmExample(config, UNDER_PRESSURE.profile, OVERCOMMIT)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "implementation_error" and "new bug" in failure.message
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None and trial.tried == ()
    assert trial.lines() == [
        "NO KNOWN FINDING SAYS THIS: the known findings that break [implementation_error] say "
        "/RuntimeError: ((Prefill )?[Oo]ut of memory|alloc_req_slots runs out of memory)/."
    ]
    assert trial.to_json()["patterns"] == [
        "RuntimeError: ((Prefill )?[Oo]ut of memory|alloc_req_slots runs out of memory)"
    ]


def test_a_bug_of_ones_own_that_a_reservation_sidesteps_is_no_known_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug of one's own (a round with two requests holding a row forms no batch:
    `[progress]`) that the reservation sidesteps by admitting `r1` later: it passes, but ran
    alike only up to the reservation's own admission, so the verdict is "probably", never
    "KNOWN FINDING" (found by a review)."""
    from sglang.srt.dllm.mixin.scheduler import SchedulerDllmMixin

    batch = SchedulerDllmMixin.get_new_batch_dllm

    def own_bug(self: Any, running_batch: Any) -> Any:
        if sum(1 for r in self.dllm_manager.waiting_queue if r.kv.holds_kv) >= 2:
            return None
        return batch(self, running_batch)

    monkeypatch.setattr(SchedulerDllmMixin, "get_new_batch_dllm", own_bug)
    example = DllmExample(_config(kv_pages=7, max_context=10), UNDER_PRESSURE.profile, OVERCOMMIT)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "progress"
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None and trial.identified_by() == ()
    assert not any(line.startswith("KNOWN FINDING") for line in trial.lines()), trial.lines()
    assert trial.to_json()["identified_by"] == []


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.FDFO])
def test_the_staging_truncation_inside_the_declared_headroom_is_named(mode: Mode) -> None:
    """Inside SGLang's declared space (`real-sglang-dllm`), two one-token prompts whose outputs
    fill a 24-token context: the second's last block gets one slot of two, the staging
    truncation, named by its fix."""
    config = two_long_requests_config(mode)
    ops = (_submit("r0", 1, 23), _submit("r1", 1, 23), Drain())
    example = DllmExample(config, REAL_SGLANG_DLLM.profile, ops)
    failure = _failure(example, REAL_SGLANG_DLLM.factory)
    assert failure.rule == "whole_block_alloc"
    trial = _trial(failure, REAL_SGLANG_DLLM.factory, "real-sglang-dllm")
    assert trial is not None and trial.identified_by() == (("whole-staged-blocks",),)
    # its witness saw the cut block too (it names the finding alike to the failure anyway)
    (name, notes), *_ = trial.witnessed
    assert name == "whole-staged-blocks" and len(notes) >= 1, trial.witnessed
    assert "PrefillAdder.add_dllm_staging_req cut the extend of 'r1' to 1 of 2 tokens" in notes[-1]


def test_a_twin_of_the_released_engine_does_not_hide_a_known_finding() -> None:
    """With `--twin sglang-dllm-order`, SGLang's own order re-implemented, a fixed engine
    decides otherwise than the twin by design: the fixes' trials leave the twin out (unless
    the failure is the twin's), and the ragged row is still named."""
    config = _config(kv_pages=5)
    ops = (Round(), _submit("r0", 1, 3), _submit("r1", 1, 1), Round(), Drain())
    twin = resolve_twin("sglang-dllm-order", Family.DLLM)
    assert isinstance(twin, DllmTwin)
    example = DllmExample(
        config, UNDER_PRESSURE.profile, ops, "bs1", True, twin.replay, twin.profile
    )
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "whole_block_alloc"
    with sglang_fixed(["refused-stays-incoming"]):
        with_twin = example.replay(UNDER_PRESSURE.factory)
    assert with_twin is not None and with_twin.rule == "twin_decisions"  # why it is left out
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None
    assert trial.passes_with == (("refused-stays-incoming",), ("whole-staged-blocks",))


def test_a_ragged_row_is_named_by_its_fixes() -> None:
    """A refused one-token prompt re-enters as a staging request and gets a row of one slot
    for a block of two (`[whole_block_alloc]`): both the cause's fix and the staged blocks'
    fix name it; the others break other rules and are not tried."""
    config = _config(kv_pages=5)
    ops = (Round(), _submit("r0", 1, 3), _submit("r1", 1, 1), Round(), Drain())
    example = DllmExample(config, UNDER_PRESSURE.profile, ops)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "whole_block_alloc"
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None
    assert [f.name for f in trial.tried] == ["refused-stays-incoming", "whole-staged-blocks"]
    assert trial.passes_with == (("refused-stays-incoming",), ("whole-staged-blocks",))


def test_lofs_sticky_window_is_named_by_the_priority_window() -> None:
    """Under lof, a request fetched into the dLLM manager keeps its place against a later,
    longer arrival (`[fcfs_admission]`, the program `verify --impl real-sglang-dllm-lof
    --examples 600` shrinks to)."""
    ops = (
        _submit("r0", 1, 1),
        _submit("r1", 2, 1),
        Round(),
        _submit("r2", 1, 1),
        _submit("r3", 1, 2),
    )
    example = DllmExample(_config(), REAL_SGLANG_DLLM_LOF.profile, ops)
    failure = _failure(example, REAL_SGLANG_DLLM_LOF.factory)
    assert failure.rule == "fcfs_admission"
    trial = _trial(failure, REAL_SGLANG_DLLM_LOF.factory, "real-sglang-dllm-lof")
    assert trial is not None and trial.passes_with == (("priority-window",),)


@pytest.mark.parametrize(
    "impl",
    ["real-sglang-dllm-under-pressure", "integrations.sglang:REAL_SGLANG_DLLM_UNDER_PRESSURE"],
)
def test_verify_names_sglangs_known_finding_under_pressure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str
) -> None:
    """The built-in without headroom, as released, by its name or its import string: its
    first failure, the idle engine, named by its fix in the output, the JSON and the report."""
    out_json = tmp_path / "verify.json"
    args = ["verify", "--impl", impl, "--examples", "50"]
    code = main([*args, "--json", str(out_json), "--report", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert code == 1
    data = json.loads(out_json.read_text())
    found = {f["rule"]: f["known_fixes"] for f in data["failures"]}
    assert found["progress"]["passes_with"] == [["worst-case-estimate"]], found
    assert found["progress"]["unit"] == "round" and found["progress"]["rule"] == "progress"
    assert "--- known fixes ---\nKNOWN FINDING: this program passes with the engine fix" in out
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Known fixes:\n\n- KNOWN FINDING: this program passes with the engine fix" in report


def test_verify_hands_its_accept_file_to_the_trials(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--accept FILE`'s rules reach the known-fix trials (a fixed run that breaks one stops
    there and is said to, `test_a_fixed_run_that_breaks_an_accepted_rule_...`)."""
    from schedspec_cli import verify as verify_cmd
    from schedspec_cli.known_fixes import try_known_fixes as real

    seen: list[frozenset[str]] = []

    def spy(failure: Any, factory: Any, fixes: Any, accepted: frozenset[str]) -> Any:
        seen.append(accepted)
        return real(failure, factory, fixes, accepted)

    monkeypatch.setattr(verify_cmd, "try_known_fixes", spy)
    accept = tmp_path / "accept.txt"
    accept.write_text("whole_block_alloc: the ragged row, reported upstream\n")
    args = ["verify", "--impl", "real-sglang-dllm-under-pressure", "--examples", "50"]
    assert main([*args, "--accept", str(accept)]) == 1
    assert "--- known fixes ---" in capsys.readouterr().out
    assert seen and all(rules == frozenset({"whole_block_alloc"}) for rules in seen), seen


def test_a_new_bug_is_no_known_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang #32992 re-created (an abort frees only an FDFO request's committed KV, not its
    retained block): a rule no known finding of SGLang breaks, so none is tried."""
    recreate_32992(monkeypatch)
    config = _config(block_size=4, page_size=4, max_context=32, mode=Mode.FDFO)
    config = config.replace(in_place_reuse=True)
    ops = (Submit(RequestSpec("a", (5, 6, 7, 8, 9), 8)), Round(), Round(), Abort("a"))
    example = DllmExample(config, UNDER_PRESSURE.profile, ops)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert failure.rule == "terminal_owns_nothing"
    trial = _trial(failure, UNDER_PRESSURE.factory, "real-sglang-dllm-under-pressure")
    assert trial is not None and trial.tried == ()
    assert trial.lines() == [
        "NO KNOWN FINDING BREAKS [terminal_owns_nothing]: the known ones break "
        "[implementation_error], [progress], [twin_decisions], [whole_block_alloc]."
    ]


def test_sglangs_radix_tree_printed_out_of_memory_goes_to_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """SGLang prints its radix tree when it runs out of memory, from Rust, to descriptor 1
    (past `sys.stdout`), on every replay of the overcommitted pool; inside `verify`'s guard
    (`schedspec_cli.engine_stdout`) the trials' replays leave stdout to the table."""
    from properties.verify import VerifyResult
    from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
    from schedspec_cli.impls import resolve
    from schedspec_cli.verify import known_fix_trials

    example = DllmExample(_config(kv_pages=7, max_context=10), UNDER_PRESSURE.profile, OVERCOMMIT)
    failure = _failure(example, UNDER_PRESSURE.factory)
    assert "full_lock=" in capfd.readouterr().out  # the engine's own print, as released
    target = resolve("real-sglang-dllm-under-pressure")
    result = VerifyResult(target.name, 1, 1, 0.0, failures=[failure])
    with implementation_stdout_to_stderr():
        (trial,) = known_fix_trials(target, result)
    assert trial is not None and trial.passes_with  # the replays ran, out of memory included
    seen = capfd.readouterr()
    assert seen.out == "" and "full_lock=" in seen.err, seen


def test_a_twin_of_another_policy_is_not_taken_for_a_new_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SGLang against the FCFS reference's twin fails `twin_decisions`, as it should (SGLang
    admits prefill-first and holds back): the verdict says the twin's policy differs by design
    and names how, where it once said "no known fix identifies it (a new finding...)" (a
    review's finding). Against SGLang's own order the same built-in tries the fixes."""
    out = tmp_path / "v.json"
    argv = ["verify", "--impl", "real-sglang-dllm", "--examples", "30", "--json", str(out)]
    assert main([*argv, "--twin", "reference-dllm"]) == 1
    printed = capsys.readouterr().out
    assert "NO KNOWN FIX IDENTIFIES IT" not in printed, printed
    (failure,) = json.loads(out.read_text())["failures"]
    assert failure["rule"] == "twin_decisions"
    said = failure["known_fixes"]["twin_differs"]
    assert said.startswith("admission: fcfs, the implementation prefill-first"), said
    assert "work_conserving: True, the implementation False" in said, said
    assert failure["known_fixes"]["verdict"][0].startswith("NOT TRIED: the decision twin")
    # SGLang's own order re-implemented decides by the same policy: its failures are tried
    from schedspec_cli.impls import resolve
    from schedspec_cli.verify import twin_policy_gap

    order = resolve_twin("sglang-dllm-order", Family.DLLM)
    for name in ("real-sglang-dllm", "real-sglang-dllm-under-pressure"):
        assert twin_policy_gap(order, resolve(name)) == "", name
    lof = resolve_twin("sglang-dllm-order-lof", Family.DLLM)
    assert twin_policy_gap(lof, resolve("real-sglang-dllm")) == (
        "longest_output_first: True, the implementation False"
    )
