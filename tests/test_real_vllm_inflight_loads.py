"""vLLM 0.34.0's cap on in-flight KV loads (`max_num_inflight_kv_loads`) in its engine-core loop
with a KV connector (`LoopOptions.max_inflight_kv_loads`, `--max-inflight-kv-loads N`): the
programs pass both loops with the cap reached and the admission order kept, and the rule
`inflight_kv_loads` catches the cap ignored. The requests the connector may load
asynchronously queue apart (`async_kv_waiting`); vLLM takes from that queue and the plain one
by comparing their heads, so `admission_order` holds across the two, but for a queue vLLM holds
back (the asynchronous one at the cap, the plain one with no running slot or token budget left,
when only loads start) and for a request behind a head that arrived later (a preempted request
goes back to the plain queue's head). Seeded bugs that take from one queue first whatever the
heads fail it.

With failing loads (`kv_load_failure_policy="recompute"`) the programs pass with the six KV
load fixes (`integrations.vllm.kv_load_fixes`) as written for 0.34.0; one of them, as written
for 0.33.0, leaves a requeued failed load counted against the cap, holding back for ever a load
queued ahead of it.

These run on 0.34.0 in `test_real_vllm_newest`. On 0.33.0, which has no such setting, each
checks instead that asking for it is a `ConfigError` naming the setting and the release."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import pytest

from integrations.patches import EngineFix
from integrations.vllm import MANIFEST
from integrations.vllm.engine_core import (
    RULES,
    CoreProgram,
    EngineCoreLoop,
    EngineCoreViolation,
    LoopOptions,
    check_both,
    core_program,
    run_loop,
)
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES, REQUEUE_FAILED_LOAD, apply_kv_load_fixes
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.offload_hit_fix import OFFLOAD_HIT
from integrations.vllm.patches import ScheduleFix
from integrations.vllm.reset_holders_fix import RESET_HOLDERS, RESET_HOLDERS_FIXES
from integrations.vllm.session_stall_fix import SESSION_STALL, SESSION_STALL_FIX
from integrations.vllm.sessions import SessionInput, session_program
from integrations.vllm.settings_034 import Vllm034Settings
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script

PROGRAMS = range(int(os.environ.get("SCHEDSPEC_VLLM_PROGRAMS", "30")))
CAPPED = LoopOptions(kv_connector="fail", max_inflight_kv_loads=1)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _has_the_setting() -> bool:
    """Whether the loaded release caps in-flight loads; on one without (0.33.0), asking for it
    must be a `ConfigError` naming the setting and the release that has it."""
    try:
        run_loop(core_program(0), async_scheduling=False, options=CAPPED)
    except ConfigError as err:
        assert "max_num_inflight_kv_loads" in str(err), err
        assert "new in vLLM 0.34.0" in str(err), err
        return False
    return True


def test_capped_programs_pass_both_loops_and_reach_the_cap() -> None:
    """With one load at most holding blocks, the programs pass every check in both loops
    (the admission order across the two waiting queues included), calls leave the cap
    reached, and requests of a queue held back are passed by the other's."""
    if not _has_the_setting():
        return
    assert "inflight_kv_loads" in RULES
    reached = loads = passes = 0
    for seed in PROGRAMS:
        sync_run, async_run = check_both(core_program(seed), CAPPED)
        reached += sync_run.inflight_cap_reached + async_run.inflight_cap_reached
        loads += sync_run.loads + async_run.loads
        passes += sync_run.queue_passes + async_run.queue_passes
    assert reached > 0 and loads > 0 and passes > 0, (reached, loads, passes)


def _ignores_the_cap(sched: Any) -> None:
    """Seeded bug: every new asynchronous load is admitted, whatever the cap."""
    sched._admits_inflight_kv_load = lambda: True


def _plain_queue_first(sched: Any) -> None:
    """Seeded bug: the plain waiting queue is taken from before the asynchronous-load one,
    whichever head arrived first."""
    merged = sched._next_waiting_queue
    sched._next_waiting_queue = lambda take_async_kv: (
        sched.waiting if sched.waiting else merged(take_async_kv)
    )


def _async_queue_first(sched: Any) -> None:
    """Seeded bug: the asynchronous-load queue is taken from first while it may start loads,
    whichever head arrived first."""
    sched._next_waiting_queue = lambda take_async_kv: (
        sched.async_kv_waiting if take_async_kv and sched.async_kv_waiting else sched.waiting
    )


#: The seeded bugs, and the rule that catches each.
SEEDED_BUGS: tuple[tuple[Callable[[Any], None], str], ...] = (
    (_ignores_the_cap, "inflight_kv_loads"),
    (_plain_queue_first, "admission_order"),
    (_async_queue_first, "admission_order"),
)


@pytest.mark.parametrize(
    ("bug", "passed_queue"),
    [(_plain_queue_first, "async_kv_waiting"), (_async_queue_first, "waiting")],
    ids=["plain-first", "async-first"],
)
def test_the_order_across_the_queues_catches_one_queue_taken_first(
    bug: Callable[[Any], None], passed_queue: str
) -> None:
    """A scheduler that takes from one of its waiting queues first, not by their heads, admits
    a request while an earlier one of the other queue waits, with neither queue held back: the
    first program it fails breaks `admission_order`, naming both queues."""
    if not _has_the_setting():
        return
    for seed in PROGRAMS:
        try:
            run_loop(
                core_program(seed),
                async_scheduling=False,
                options=dataclasses.replace(CAPPED, fix=bug),
            )
        except EngineCoreViolation as err:
            assert err.rule == "admission_order", err
            assert f"(in {passed_queue}, " in err.detail, err.detail
            assert "vLLM takes from its waiting queues in that order" in err.detail, err.detail
            return
    pytest.fail(f"no program of {PROGRAMS} caught {bug.__name__}")


def test_the_cap_rule_catches_the_cap_ignored() -> None:
    """The first program that fails with the seeded bug breaks `inflight_kv_loads`, naming the
    requests that hold blocks for a load and the cap."""
    if not _has_the_setting():
        return
    bug, rule = SEEDED_BUGS[0]
    options = LoopOptions(kv_connector="fail", max_inflight_kv_loads=1, fix=bug)
    for seed in PROGRAMS:
        try:
            run_loop(core_program(seed), async_scheduling=False, options=options)
        except EngineCoreViolation as err:
            assert err.rule == rule, err
            assert "hold KV blocks for an asynchronous load" in err.detail, err.detail
            assert "max_num_inflight_kv_loads=1" in err.detail, err.detail
            return
    pytest.fail(f"no program of {PROGRAMS} caught the cap ignored")


def test_the_flag_needs_a_connector_and_a_positive_cap(capsys: pytest.CaptureFixture[str]) -> None:
    """`--max-inflight-kv-loads`: 0, or without `--kv-connector` or `--offload-chunks`, or on a
    release without the setting, is a usage error (exit 2, one line)."""
    check = load_script("vllm_async_check")
    for argv in (
        ["--programs", "1", "--max-inflight-kv-loads", "1"],
        ["--programs", "1", "--kv-connector", "fail", "--max-inflight-kv-loads", "0"],
    ):
        with pytest.raises(SystemExit) as exit_:
            check.main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--max-inflight-kv-loads: an int >= 1, with --kv-connector or --offload" in err, err
    if _has_the_setting():
        return
    # a release without the setting refuses the flag before any program runs
    with pytest.raises(SystemExit) as exit_:
        check.main(["--programs", "1", "--kv-connector", "fail", "--max-inflight-kv-loads", "1"])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--max-inflight-kv-loads: invalid max_num_inflight_kv_loads=1" in last, last
    assert "new in vLLM 0.34.0" in last, last


#: Shrunk from program 30 (`--kv-connector recompute --kv-async-loads-only
#: --max-inflight-kv-loads 1`, all six fixes, the requeue fix as written for 0.33.0), with the
#: original program's draws: r4's load fails as a whole while r1, preempted, queues for a load.
CAP_PROGRAM = CoreProgram(
    ArConfig(
        block_size=4,
        num_blocks=5,
        max_num_batched_tokens=1,
        max_num_seqs=1,
        max_model_len=10,
        policy=Policy.PRIORITY,
    ),
    arrivals=(
        (ArRequest("r0", 1, 9), ArRequest("r1", 3, 3)),
        (ArRequest("r2", 2, 2), ArRequest("r3", 5, 1), ArRequest("r4", 2, 1)),
    ),
    aborts=((), ()),
)
CAP_DRAWS = 2938568546


def _capped_loop(fix: Callable[[Any], None]) -> EngineCoreLoop:
    """The synchronous loop over `CAP_PROGRAM`: asynchronous loads that may fail, cap 1."""
    return EngineCoreLoop(
        CAP_PROGRAM.config,
        async_scheduling=False,
        kv_connector="recompute",
        kv_sync_loads=False,
        mutate=fix,
        draft_seed=CAP_DRAWS,
        settings_034=Vllm034Settings(max_inflight_kv_loads=1),
    )


def test_a_requeued_failed_load_must_not_count_against_the_cap() -> None:
    """With `requeue-failed-load` as written for 0.33.0, r4 (its load failed as a whole and
    freed its blocks) queues as waiting again but keeps its fetch stage, "completed_waiting",
    which counts against the cap until the waiting loop reaches it; r1, ahead of it, needs an
    asynchronous load and waits for the cap at the head of the queue, so the loop never
    reaches r4 (`progress`). As written for 0.34.0 the fix also clears r4's stage, and the
    program passes both loops, as do the generated ones with failing loads and the cap."""
    if not _has_the_setting():
        return
    as_for_033 = ScheduleFix(
        *(
            dataclasses.replace(f, releases=()) if f.name == REQUEUE_FAILED_LOAD else f
            for f in KV_LOAD_FIXES.fixes
        )
    ).apply
    loop = _capped_loop(as_for_033)
    with pytest.raises(EngineCoreViolation) as caught:
        loop.run(CAP_PROGRAM)
    assert caught.value.rule == "progress", caught.value
    assert "0 running, 2 waiting" in caught.value.detail, caught.value.detail
    sched = loop.sched
    assert [r.request_id for r in sched.waiting] == ["r1", "r4"]
    stages = {r.request_id: stage for r, stage in sched._kv_fetch_stages.items()}
    assert stages == {"r1": "waiting_to_start", "r4": "completed_waiting"}, stages
    assert sched.requests["r4"].num_computed_tokens == 0
    assert not sched._admits_inflight_kv_load()

    _capped_loop(apply_kv_load_fixes).run(CAP_PROGRAM)
    options = LoopOptions(
        kv_connector="recompute", max_inflight_kv_loads=1, fix=apply_kv_load_fixes
    )
    for seed in PROGRAMS:
        check_both(core_program(seed), options)


def test_a_load_the_reset_takes_back_must_not_count_against_the_cap() -> None:
    """`reset-loaded-holders` (a "keep" pause's cache reset takes back the blocks of waiting
    requests whose load is done) as written for 0.34.0 also clears the fetch stage of a
    request it takes back. Without that, the request counts against the cap while it waits
    to look its prefix up again, and a load queued ahead of it waits for ever: program 93
    (asynchronous loop, failing loads recomputed, a "keep" pause, cap 1) stalls (`progress`)
    and passes with the fix as written."""
    if not _has_the_setting():
        return
    (installed,) = RESET_HOLDERS_FIXES.installed_variant([RESET_HOLDERS])
    module, before, after = installed.edits[0]
    clears = (
        "                # else its load, done, keeps counting against the in-flight cap\n"
        "                self._set_kv_fetch_stage(request, None)\n"
    )
    assert after.count(clears) == 1
    kept = EngineFix(
        RESET_HOLDERS, ((module, before, after.replace(clears, "")),), installed.methods
    )
    program = core_program(93)
    options = LoopOptions(
        kv_connector="recompute",
        pauses="keep",
        max_inflight_kv_loads=1,
        fix=ScheduleFix(installed, *KV_LOAD_FIXES.fixes).apply,
    )
    run = run_loop(program, async_scheduling=True, options=options)
    assert run.pause_taken_back > 0, run
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            program,
            async_scheduling=True,
            options=dataclasses.replace(options, fix=ScheduleFix(kept, *KV_LOAD_FIXES.fixes).apply),
        )
    assert caught.value.rule == "progress", caught.value


#: Shrunk from session program 18 (`--programs-from sessions --kv-connector fail
#: --max-inflight-kv-loads 1`, the session stall fix and the KV load fixes), with the original
#: program's draws: r4, a session, loads its prompt while r10 runs; once r10 waits for input
#: the stall fix drops r4's loaded KV (no room for r4, nothing running), and r13 needs a load.
SESSION_CAP_PROGRAM = CoreProgram(
    ArConfig(block_size=1, num_blocks=8, max_num_batched_tokens=5, max_num_seqs=2, max_model_len=7),
    arrivals=(
        (ArRequest("r3", 2, 1), ArRequest("r4", 2, 1)),
        (),
        (),
        (ArRequest("r10", 5, 2),),
        (ArRequest("r13", 2, 1),),
        (),
        (),
    ),
    aborts=((), (), (), (), (), (), ()),
    inputs=((), (), (), (), (), (SessionInput("r4", 0, 0),), (SessionInput("r10", 0, 0),)),
)
SESSION_CAP_DRAWS = 2338173088


def test_a_session_whose_loaded_kv_the_stall_fix_drops_must_not_count_against_the_cap() -> None:
    """`drop-stalled-session-kv` as written for 0.33.0 drops r4's loaded KV but leaves its
    fetch stage, which counts against the cap for good: neither r4's new load nor r13's
    starts (`progress`). As written for 0.34.0 the fix gives up the stage and the parked
    reservation too, and the program passes both loops, as the generated session programs do."""
    if not _has_the_setting():
        return
    options = LoopOptions(kv_connector="fail", max_inflight_kv_loads=1, draw_seed=SESSION_CAP_DRAWS)
    as_for_033 = ScheduleFix(
        dataclasses.replace(SESSION_STALL_FIX, releases=()), *KV_LOAD_FIXES.fixes
    ).apply
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            SESSION_CAP_PROGRAM,
            async_scheduling=False,
            options=dataclasses.replace(options, fix=as_for_033),
        )
    assert caught.value.rule == "progress", caught.value
    assert "0 running, 2 waiting" in caught.value.detail, caught.value.detail
    fixed = dataclasses.replace(options, fix=make_fixes([SESSION_STALL, *KV_LOAD_FIXES.names]))
    check_both(SESSION_CAP_PROGRAM, fixed)
    generated = dataclasses.replace(fixed, draw_seed=None)
    for seed in PROGRAMS:
        check_both(session_program(seed), generated)


#: vLLM's own offloading connector with the cap: its loads queue with the others (it does not
#: answer `may_load_async`), so a load past the cap waits at the head of the one queue.
OFFLOAD_CAPPED = LoopOptions(offload_chunks=8, offload_outputs=True, max_inflight_kv_loads=1)


def test_capped_offloading_programs_pass_and_reach_the_cap() -> None:
    """Shared-prompt programs with vLLM's offloading connector (its one-token finding fixed)
    pass both loops under a cap of 1, calls leave the cap reached, and loads ran."""
    if not _has_the_setting():
        return
    options = dataclasses.replace(OFFLOAD_CAPPED, fix=make_fixes([OFFLOAD_HIT]))
    reached = loads = 0
    for seed in PROGRAMS:
        sync_run, async_run = check_both(shared_prompt_program(seed), options)
        reached += sync_run.inflight_cap_reached + async_run.inflight_cap_reached
        loads += sync_run.offload_loads + async_run.offload_loads
    assert reached > 0 and loads > 0, (reached, loads)
