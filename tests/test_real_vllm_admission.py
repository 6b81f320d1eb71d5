"""vLLM 0.33.0's admission settings in its engine-core loop (`integrations.vllm.admission_knobs`):
the watermark, `max_num_active_seqs`, the prefill cadence (`prefill_schedule_interval`) and the
adaptive long-prefill threshold reach vLLM's scheduler, programs pass with them, and each rule
they add (`active_cap`, `watermark`, `prefill_cadence`) catches its seeded bug with a readable
counterexample; so does the synchronous loop's `idle_step`, which catches the cadence's empty
held step (a finding, fixed by `lift-empty-hold`).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import RealVllmScheduler
from integrations.vllm.admission_check import ADMISSION_RULES
from integrations.vllm.admission_knobs import AdmissionKnobs
from integrations.vllm.cadence_fix import LIFT_EMPTY_HOLD
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import RULES, CoreProgram, LoopOptions, core_program, run_loop
from integrations.vllm.load_reservation_fix import LOAD_RESERVATION, LOAD_RESERVATION_FIXES
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.session_stall_fix import SESSION_STALL
from integrations.vllm.sessions import session_program
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.patch_check import apply_fix_set
from tests.script_module import load_script
from tests.vllm_seeded_bugs import (
    active_seat_past_the_cap,
    cadence_counts_empty_calls,
    held_step_defers_decodes,
    waiting_sessions_not_counted,
    watermark_ignored,
)

PROGRAMS = 40
#: Every setting away from vLLM's default at once.
ALL = LoopOptions(watermark=0.1, max_active_seqs=2, prefill_interval=3, adaptive_threshold=True)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def test_the_settings_reach_vllms_scheduler() -> None:
    """Each setting is the scheduler's: the watermark in blocks of the pool, the active cap
    (at most max_num_seqs), the cadence interval, the adaptive threshold, the whole-sequence
    reservation."""
    knobs = AdmissionKnobs(
        watermark=0.25,
        max_active_seqs=9,
        prefill_interval=4,
        adaptive_threshold=True,
        reserve_full_isl=False,
    )
    config = ArConfig(num_blocks=17, max_num_seqs=4)
    sched = RealVllmScheduler(config, lambda _e: None, admission=knobs).sched
    assert sched.kv_cache_manager.watermark_blocks == int(0.25 * 17)
    assert sched.max_num_active_reqs == 4  # capped at max_num_seqs, as vLLM refuses more
    assert sched.local_prefill_interval == 4
    assert sched.adaptive_long_prefill_threshold is True
    assert sched.scheduler_reserve_full_isl is False
    default = RealVllmScheduler(config, lambda _e: None).sched
    assert default.kv_cache_manager.watermark_blocks == 0
    assert default.max_num_active_reqs == 4 and default.local_prefill_interval == 1
    assert default.scheduler_reserve_full_isl is True


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("watermark", 1.0, "a fraction in [0, 1)"),
        ("watermark", -0.1, "a fraction in [0, 1)"),
        ("max_active_seqs", 0, "an int >= 1 (unset: max_num_seqs)"),
        ("prefill_interval", 0, "an int >= 1"),
    ],
)
def test_a_bad_setting_is_refused_with_what_would_be_valid(
    field: str, value: float, valid: str
) -> None:
    setting: dict[str, Any] = {field: value}
    with pytest.raises(ConfigError, match=re.escape(f"invalid {field}={value!r}: {valid}")) as err:
        AdmissionKnobs(**setting)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--watermark", "1"], "--watermark: a fraction in [0, 1)"),
        (["--max-active-seqs", "0"], "--max-active-seqs: an int >= 1 (unset: max_num_seqs)"),
        (["--prefill-interval", "0"], "--prefill-interval: an int >= 1"),
    ],
)
def test_the_check_script_refuses_a_bad_setting_with_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script("vllm_async_check")
    with pytest.raises(SystemExit) as exited:
        script.main(["--programs", "1", *argv])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


def test_the_admission_rules_are_the_loops_rules() -> None:
    assert set(ADMISSION_RULES) <= set(RULES)


@pytest.mark.parametrize(
    "options",
    [
        ALL,
        LoopOptions(watermark=0.1, max_active_seqs=2, prefill_interval=3, pipeline_parallel_size=2),
    ],
    ids=["all-settings", "all-settings-two-stages"],
)
def test_programs_pass_with_the_settings_and_each_rule_is_exercised(options: LoopOptions) -> None:
    """Random programs pass both loops with every setting on; each rule's case comes up:
    admissions under the watermark and the cap, calls the cadence held, and release steps
    that left the engine backed up (which lifts the hold)."""
    totals = {"watermark_admissions": 0, "capped_admissions": 0, "held_steps": 0}
    totals["backed_up_releases"] = 0
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            run = run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)
            for name in totals:
                totals[name] += getattr(run, name)
    assert all(totals.values()), totals


def test_sessions_waiting_for_input_count_against_the_active_cap() -> None:
    """Session programs pass with an active cap of 2 (and the stall fix, which they need
    anyway), sessions waiting for their next input holding their seat (vLLM counts them; so
    does `active_cap`, by status); a scheduler that forgets them fails `active_cap`."""
    options = LoopOptions(max_active_seqs=2, fix=make_fixes([SESSION_STALL]))
    capped = beside_sessions = 0
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            run = run_loop(
                session_program(seed), async_scheduling=async_scheduling, options=options
            )
            capped += run.capped_admissions
            beside_sessions += run.capped_beside_sessions
    assert capped > beside_sessions > 0, (capped, beside_sessions)
    forgetful = replace(options, mutate=waiting_sessions_not_counted)
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(session_program(seed), async_scheduling=True, options=forgetful),
        until="active_cap",
    )
    assert "active_cap" in seen and "waiting for input: " in seen["active_cap"], seen


SEEDED: list[tuple[Callable[[Any], None], LoopOptions, str, tuple[str, ...]]] = [
    (
        active_seat_past_the_cap,
        LoopOptions(max_active_seqs=1),
        "active_cap",
        ("admitted", "active; max_num_active_seqs=1"),
    ),
    (
        watermark_ignored,
        LoopOptions(watermark=0.2),
        "watermark",
        ("blocks free; the watermark keeps", "watermark=0.2 of"),
    ),
    (
        cadence_counts_empty_calls,
        LoopOptions(prefill_interval=3, pipeline_parallel_size=2),
        "prefill_cadence",
        ("carried prefill", "while a request decodes", "prefill_schedule_interval=3"),
    ),
]


@pytest.mark.parametrize(
    ("bug", "options", "rule", "words"), SEEDED, ids=[rule for _b, _o, rule, _w in SEEDED]
)
def test_each_admission_rule_catches_its_seeded_bug(
    bug: Callable[[Any], None], options: LoopOptions, rule: str, words: tuple[str, ...]
) -> None:
    """The suite FAILS on each seeded bug (the asynchronous loop is the mutant's), naming the
    call, what it admitted or carried, and the setting it broke; the same programs pass
    without the bug."""
    _assert_caught(replace(options, mutate=bug), options, rule, words, async_scheduling=True)


def _assert_caught(
    mutated: LoopOptions,
    options: LoopOptions,
    rule: str,
    words: tuple[str, ...],
    *,
    async_scheduling: bool,
) -> None:
    """Some random program fails `rule` in one loop under `mutated`, its message naming the
    call and holding `words`; the first 8 programs pass that loop under `options`."""
    mode = "async" if async_scheduling else "sync"

    def run(seed: int) -> None:
        run_loop(core_program(seed), async_scheduling=async_scheduling, options=mutated)

    seen = first_violations(60, run, until=rule)
    assert rule in seen, seen
    assert all(w in seen[rule] for w in words), seen[rule]
    assert seen[rule].startswith(f"[{rule}] {mode} loop: schedule ")
    for seed in range(8):
        run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)


#: The rules of the synchronous loop alone, with their seeded bugs (planted through `fix`,
#: which both loops get: `mutate` is the asynchronous loop's).
SYNC_SEEDED: list[tuple[Callable[[Any], None], LoopOptions, str, tuple[str, ...]]] = [
    (
        held_step_defers_decodes,
        LoopOptions(prefill_interval=3),
        "idle_step",
        ("scheduled nothing while", "stayed running"),
    ),
]


@pytest.mark.parametrize(
    ("bug", "options", "rule", "words"),
    SYNC_SEEDED,
    ids=[rule for _b, _o, rule, _w in SYNC_SEEDED],
)
def test_each_sync_rule_catches_its_seeded_bug(
    bug: Callable[[Any], None], options: LoopOptions, rule: str, words: tuple[str, ...]
) -> None:
    """The synchronous loop FAILS on the seeded bug, naming the call and the requests it left
    running unscheduled; the same programs pass without the bug."""
    _assert_caught(replace(options, fix=bug), options, rule, words, async_scheduling=False)


#: Random program 597 under `prefill_schedule_interval=3`, shrunk
#: (docs/shrunk/vllm-cadence-empty-hold.json): 7 usable blocks of one token, both taken in
#: step 1 by r13's first chunk (5 tokens, the long-prefill threshold) and r14's prompt.
EMPTY_HOLD = CoreProgram(
    ArConfig(
        block_size=1,
        num_blocks=8,
        max_num_batched_tokens=7,
        max_num_seqs=2,
        max_model_len=7,
        long_prefill_token_threshold=5,
    ),
    arrivals=((ArRequest("r13", 6, 1), ArRequest("r14", 2, 2)),),
    aborts=((),),
)


def test_finding_in_the_engine_core_loop_a_held_step_whose_only_decode_preempts_itself() -> None:
    """Step 2 is held (r14 decodes, the interval is 3), so r13's next chunk is skipped; r14
    needs a block, none is free, and r14, the tail, preempts itself: the call schedules
    nothing while r13 stays running (`idle_step`; the AR suite's `progress` on the same
    finding). Every other rule passes. With `lift-empty-hold` the hold lifts, r13's chunk
    runs in that call and the run drains; without the cadence there is nothing to lift."""
    cadence = LoopOptions(prefill_interval=3)
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(EMPTY_HOLD, async_scheduling=False, options=cadence)
    assert str(err.value) == (
        "[idle_step] sync loop: schedule 2 scheduled nothing while ['r13'] stayed running; "
        "it preempted ['r14']"
    )
    trace: list[str] = []
    fixed = replace(cadence, fix=make_fixes([LIFT_EMPTY_HOLD]), trace=trace)
    run = run_loop(EMPTY_HOLD, async_scheduling=False, options=fixed)
    assert run.emptied_holds == 1 and run.reasons == {"r13": "length", "r14": "length"}
    assert any(line.startswith("step 2: schedule 2: r13 1 token") for line in trace), trace
    plain = run_loop(EMPTY_HOLD, async_scheduling=False, options=LoopOptions())
    assert plain.emptied_holds == 0 and plain.held_steps == 0


def test_a_call_whose_every_running_request_preempts_itself_may_schedule_nothing() -> None:
    """`idle_step` asks only that a request left running be scheduled: streaming-input
    sessions waiting for input hold KV, so a running request short of a block preempts
    itself and its call schedules nothing (vLLM admits nothing after a preemption). Those
    programs pass, and such a call comes up."""
    trace: list[str] = []
    options = LoopOptions(fix=make_fixes([SESSION_STALL]), trace=trace)
    for seed in (6, 8, 12):
        run_loop(session_program(seed), async_scheduling=False, options=options)
    assert any(re.search(r"schedule \d+: nothing; preempted", line) for line in trace)


#: Random program 302 with asynchronous KV loads that never fail, shrunk: a pool of 6 usable
#: blocks of 4 tokens; r2 (priority 3) loads its 13 tokens into the 4 free blocks while r4
#: (priority 2) runs in the other 2.
LOADS_FILL_THE_POOL = CoreProgram(
    ArConfig(
        block_size=4,
        num_blocks=7,
        max_num_batched_tokens=6,
        max_num_seqs=2,
        max_model_len=14,
        policy=Policy.PRIORITY,
    ),
    arrivals=(
        (ArRequest("r0", 2, 1),),
        (ArRequest("r1", 2, 1), ArRequest("r2", 13, 1, priority=3), ArRequest("r3", 9, 1)),
        (ArRequest("r4", 7, 3, priority=2),),
        (ArRequest("r5", 12, 1),),
        (ArRequest("r9", 5, 2),),
    ),
    aborts=((),) * 5,
)
#: The connector's loads, all asynchronous and none failing, under the program's draws.
LOADS = LoopOptions(
    kv_connector="recompute", kv_sync_loads=False, kv_load_failures=False, draw_seed=1386197677
)


def test_finding_without_full_sequence_reservation_loads_deadlock_the_engine() -> None:
    """`LOADS_FILL_THE_POOL` with `scheduler_reserve_full_isl=False`, synchronous loop: r4
    needs a third block for its next token; none is free, so vLLM preempts it, and re-admits
    it at once as an asynchronous load of its 7 prompt tokens into the 2 blocks it freed. An
    asynchronous load is admitted if it fits in the free blocks less the other in-flight
    prefills' reservations ("to avoid deadlock"), but without the whole-sequence check
    nothing keeps room for the request's own next step. Both loads done, r4 heads the queue
    of requests holding KV (priority 2 before r2's 3), finds no block, and vLLM's waiting loop
    stops there; r2, which needs no new block, waits behind it for good (`progress`). With
    vLLM's default (`scheduler_reserve_full_isl=True`) r4's reload needs its whole sequence's
    3 blocks, is not admitted, and the program passes; so it does with the setting off and
    the candidate fix `loads-reserve-their-sequence` (a load is admitted only if its whole
    sequence fits). No load fails: this is the load path alone."""
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            LOADS_FILL_THE_POOL,
            async_scheduling=False,
            options=replace(LOADS, reserve_full_isl=False),
        )
    assert caught.value.rule == "progress", caught.value
    assert "0 running, 2 waiting, 0 batches in flight" in caught.value.detail
    run = run_loop(LOADS_FILL_THE_POOL, async_scheduling=False, options=LOADS)
    assert run.loads >= 5 and run.loads_failed == run.blocks_invalid == 0, run
    fixed = replace(LOADS, reserve_full_isl=False, fix=make_fixes([LOAD_RESERVATION]))
    run_loop(LOADS_FILL_THE_POOL, async_scheduling=False, options=fixed)


def test_the_load_reservation_fix_is_one_patch_of_vllms_scheduler(tmp_path: Path) -> None:
    """`scripts/engine_fixes_diff.py vllm-load-reservation` prints the edit the tests run (one
    line of `Scheduler.schedule`'s waiting loop): applied with `git apply -p1` to a copy of
    vLLM's `scheduler.py`, it gives the very text they run."""
    diff, patched = apply_fix_set(tmp_path, LOAD_RESERVATION_FIXES)
    assert diff.count("\n-    ") == 1, diff
    assert "self.scheduler_reserve_full_isl or load_kv_async" in next(iter(patched.values()))
