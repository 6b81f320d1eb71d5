"""vLLM 0.33.0's engine-core loop with generation paused, as RL trainers pause it around a
weight update (`LoopOptions(pauses=MODE)`, `--pauses MODE`; `integrations.vllm.pauses`): before
one engine step in 16 the loop pauses the scheduler as `EngineCore.pause_scheduler(MODE)` does
("keep": `PAUSED_ALL`; "wait": `PAUSED_NEW`; "abort": every request aborted, then `PAUSED_NEW`),
steps while the engine has work, then clears the caches as `_finish_pause` does
(`reset_prefix_cache(reset_running_requests=True, reset_connector=True)`, which preempts the
running requests) and resumes.

The rule `pause`: under `PAUSED_ALL` a `schedule()` call schedules nothing; under `PAUSED_NEW`
only requests that were running, or held KV, before it. Every other rule holds across pauses:
outputs whole and in order after the reset's preemption (their steps in flight dropped as
stale), the pool, the runner's tables. Released vLLM passes in each mode; two seeded bugs (a
pause ignored, a "keep" pause taken as "wait") fail `pause`. With vLLM's offloading connector
a "keep" pause clears the caches while a request holds the blocks a CPU-tier load wrote into,
and vLLM raises, a case it names unsupported (reproduced as a known limitation); "wait" and
"abort" pass, and so does "keep" with the candidate fix `reset-loaded-holders`
(`integrations.vllm.reset_holders_fix`), which has the reset take those blocks back.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import EngineFix
from integrations.vllm import MANIFEST
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, LoopOptions, core_program, run_loop
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES
from integrations.vllm.loop_arguments import FIXES, make_fixes
from integrations.vllm.patches import ScheduleFix
from integrations.vllm.pauses import PAUSE_MODES
from integrations.vllm.reset_holders_fix import (
    RESET_HOLDERS,
    RESET_HOLDERS_FIXES,
)
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.patch_check import git_apply_to_copies
from tests.script_module import load_script
from tests.vllm_seeded_bugs import keep_pause_runs_the_running, pause_ignored

PROGRAMS = 40


def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


@pytest.mark.parametrize("mode", PAUSE_MODES)
def test_released_vllm_pauses_and_resumes_in_each_mode(mode: str) -> None:
    """The first programs pass both loops with pauses; pauses happen, and in mode "keep" the
    caches' reset preempts running requests, which then finish with their whole output."""
    _vllm()
    options = LoopOptions(pauses=mode)
    pauses = preempted = aborted = 0
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            run = run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)
            pauses += run.pauses
            preempted += run.pause_preempted
            aborted += sum(reason == "abort" for reason in run.reasons.values())
    assert pauses > 0
    assert (preempted > 0) == (mode == "keep"), preempted
    baseline = sum(
        reason == "abort"
        for seed in range(PROGRAMS)
        for reason in run_loop(core_program(seed), async_scheduling=True).reasons.values()
    )
    if mode == "abort":  # a pause aborts what runs, beyond the programs' own aborts
        assert aborted > 2 * baseline, (aborted, baseline)


#: (seeded bug, the pause mode it shows in, words of the message).
SEEDED_BUGS: list[tuple[Callable[[Any], None], str, tuple[str, ...]]] = [
    (pause_ignored, "wait", ("neither running nor holding KV", "PAUSED_NEW")),
    (keep_pause_runs_the_running, "keep", ("PAUSED_ALL: nothing is scheduled",)),
]


@pytest.mark.parametrize(
    ("bug", "mode", "words"), SEEDED_BUGS, ids=[bug.__name__ for bug, _, _ in SEEDED_BUGS]
)
def test_the_pause_rule_catches_each_seeded_bug(
    bug: Callable[[Any], None], mode: str, words: tuple[str, ...]
) -> None:
    _vllm()
    options = LoopOptions(pauses=mode, mutate=bug)
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(core_program(seed), async_scheduling=True, options=options),
        until="pause",
    )
    assert "pause" in seen, seen
    assert all(w in seen["pause"] for w in words), seen["pause"]


def test_an_unknown_pause_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A typed error for an unknown mode; the sweep's usage error says the same."""
    _vllm()
    with pytest.raises(ConfigError) as err:
        run_loop(core_program(0), async_scheduling=False, options=LoopOptions(pauses="sleep"))
    assert err.value.field == "pauses", err.value
    script = load_script("vllm_async_check")
    with pytest.raises(SystemExit) as exit_:
        script.main(["--programs", "1", "--pauses", "sleep"])
    assert exit_.value.code == 2
    assert "--pauses" in capsys.readouterr().err


#: The candidate fixes of schedspec's KV connector's findings (`--kv-connector`).
KV_FIXES = list(KV_LOAD_FIXES.names)
#: vLLM's named limitation: a cache reset with a connector's load still in flight.
LOAD_IN_FLIGHT = "waiting for remote KV transfer, which is not supported yet"


@pytest.mark.parametrize("mode", PAUSE_MODES)
def test_pauses_beside_schedspecs_kv_connector(mode: str) -> None:
    """Beside schedspec's KV connector (loads, sends, failed loads recomputed) "abort" and
    "wait" pauses pass the first programs in both loops. A "keep" pause reaches vLLM's named
    limitation whenever a load is still in flight at its cache reset (the load writes into its
    blocks, so `reset-loaded-holders` leaves them held and the reset raises), and only it."""
    _vllm()
    options = LoopOptions(
        kv_connector="recompute", pauses=mode, fix=make_fixes([*KV_FIXES, RESET_HOLDERS])
    )
    pauses = 0
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            try:
                run = run_loop(
                    core_program(seed), async_scheduling=async_scheduling, options=options
                )
            except EngineCoreViolation as err:
                assert mode == "keep" and LOAD_IN_FLIGHT in str(err), err
                continue
            pauses += run.pauses
    assert pauses > 0


#: Shrunk from program 12 ("keep", async, the connector's fixes and `reset-loaded-holders`):
#: r5's asynchronous load fails in its one block before the pause; the cache reset takes its
#: blocks back.
FAILED_LOAD_BEFORE_PAUSE = CoreProgram(
    ArConfig(
        block_size=2,
        num_blocks=4,
        max_num_batched_tokens=1,
        max_num_seqs=1,
        max_model_len=6,
        policy=Policy.PRIORITY,
    ),
    arrivals=((ArRequest("r5", 5, 1),),),
    aborts=((),),
)


def test_the_reset_fix_forgets_the_prefill_in_flight_of_a_request_it_takes_back() -> None:
    """A request whose load was reported (here, failed in a block) is counted as a prefill in
    flight, which reserves blocks for it; the fix takes its blocks back at the reset, and must
    drop that count too, as the stall fix does. Its first version did not: r5 waited for good
    with 3 blocks free (`progress`)."""
    _vllm()
    fixes = [*KV_FIXES, RESET_HOLDERS]
    options = LoopOptions(
        kv_connector="recompute", pauses="keep", fix=make_fixes(fixes), draw_seed=3177777003
    )
    run = run_loop(FAILED_LOAD_BEFORE_PAUSE, async_scheduling=True, options=options)
    assert run.reasons == {"r5": "length"} and run.pause_taken_back == 1, run
    (installed,) = RESET_HOLDERS_FIXES.installed_variant([RESET_HOLDERS])
    module, before, after = installed.edits[0]
    forgets = (
        "                # else its prefill, counted in flight, keeps reserving blocks\n"
        "                self._inflight_prefills.discard(request)\n"
    )
    assert after.count(forgets) == 1
    if "_unreserve_parked" in after:
        # on 0.34.0 this program passes without the line; what 0.34.0's version of the fix
        # adds (the fetch stage) has its own test (tests/test_real_vllm_inflight_loads.py)
        return
    first = EngineFix(
        RESET_HOLDERS, ((module, before, after.replace(forgets, "")),), installed.methods
    )
    variant = ScheduleFix(first, *(FIXES[n] for n in KV_FIXES)).apply
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            FAILED_LOAD_BEFORE_PAUSE, async_scheduling=True, options=replace(options, fix=variant)
        )
    assert caught.value.rule == "progress", caught.value


OFFLOADED = LoopOptions(
    offload_chunks=8, offload_outputs=True, fix=make_fixes(["no-pointless-hit"])
)


#: The limitation's program, shrunk from shared-prompt program 11 (545 runs): r1 runs and its
#: block is offloaded; r4, the same 2-token prompt, hits it in the CPU tier.
CPU_HIT_WAITS = CoreProgram(
    ArConfig(block_size=2, num_blocks=2, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=3),
    arrivals=(
        (ArRequest("r1", 2, 1, prompt=(100, 101)),),
        (ArRequest("r4", 2, 1, prompt=(100, 101)),),
    ),
    aborts=((), ()),
)


def test_known_limitation_a_keep_pause_clears_the_caches_while_a_cpu_hit_waits() -> None:
    """vLLM's offloading connector and a "keep" pause (`PAUSED_ALL`): a request whose prefix is
    in the CPU tier holds the blocks its KV loads into until it is scheduled, and a "keep"
    pause schedules nothing and counts no request unfinished, so the pause completes with r4
    holding them (its load submitted before the pause, done during it). `_finish_pause`'s
    reset (`reset_running_requests=True`) preempts the running requests only, finds r4's
    blocks in use and raises: "Failed to reset KV cache even when all the running requests
    are preempted ... requests waiting for remote KV transfer, which is not supported yet".
    vLLM names the case unsupported; the pause reaches it. "wait" and "abort" pauses count
    the requests holding KV as unfinished (`PAUSED_NEW`) and pass. With the candidate fix
    `reset-loaded-holders` the reset takes r4's blocks back, and the program passes."""
    _vllm()
    keep = replace(OFFLOADED, pauses="keep", draw_seed=3945307025)
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(CPU_HIT_WAITS, async_scheduling=False, options=keep)
    assert err.value.rule == "implementation_error", err.value
    assert "reset_prefix_cache" in err.value.detail and "not supported" in err.value.detail
    run_loop(
        CPU_HIT_WAITS, async_scheduling=False, options=replace(OFFLOADED, draw_seed=3945307025)
    )
    for mode in ("wait", "abort"):
        for seed in range(PROGRAMS // 4):
            program = shared_prompt_program(seed)
            run_loop(program, async_scheduling=False, options=replace(OFFLOADED, pauses=mode))
    fixed = replace(keep, fix=make_fixes(["no-pointless-hit", RESET_HOLDERS]))
    run = run_loop(CPU_HIT_WAITS, async_scheduling=False, options=fixed)
    assert (run.pauses, run.pause_taken_back) == (1, 1), run
    assert run.reasons == {"r1": "length", "r4": "length"}, run.reasons


def test_with_the_candidate_fix_a_keep_pause_takes_back_the_loaded_blocks() -> None:
    """`reset-loaded-holders` over the first shared-prompt programs with a "keep" pause and
    the offloading connector: every one passes both loops, in some of them the reset takes a
    waiting request's loaded blocks back (and released vLLM raises on one at least), and
    without the connector the fix takes nothing back."""
    _vllm()
    fixed = replace(OFFLOADED, pauses="keep", fix=make_fixes(["no-pointless-hit", RESET_HOLDERS]))
    released = replace(OFFLOADED, pauses="keep")
    taken_back = raised = 0
    for seed in range(PROGRAMS):
        program = shared_prompt_program(seed)
        for async_scheduling in (False, True):
            run = run_loop(program, async_scheduling=async_scheduling, options=fixed)
            taken_back += run.pause_taken_back
            if run.pause_taken_back:
                try:
                    run_loop(program, async_scheduling=async_scheduling, options=released)
                except EngineCoreViolation as err:
                    assert "not supported" in err.detail, err
                    raised += 1
    assert taken_back > 0 and raised > 0, (taken_back, raised)
    plain = LoopOptions(pauses="keep", fix=make_fixes([RESET_HOLDERS]))
    for seed in range(PROGRAMS // 4):
        run = run_loop(core_program(seed), async_scheduling=True, options=plain)
        assert run.pause_taken_back == 0, seed


def test_the_reset_fix_is_one_patch_of_vllms_scheduler(tmp_path: Path) -> None:
    """`scripts/engine_fixes_diff.py vllm-pause` prints the edit the tests run: applied with
    `git apply -p1` to a copy of vLLM's `scheduler.py`, it gives the very text they run, which
    frees the blocks of the waiting requests it takes back."""
    _vllm()
    names = RESET_HOLDERS_FIXES.names
    sources = RESET_HOLDERS_FIXES.fixed_sources(names)
    patched = git_apply_to_copies(tmp_path, sources, RESET_HOLDERS_FIXES.as_diff(names))
    assert patched == {module: fixed for module, (_, fixed) in sources.items()}
    assert "for request in list(self.kv_holding_waiting):" in next(iter(patched.values()))
