"""vLLM 0.33.0's diffusion-LLM path: its own `DiffusionScheduler` / `DiffusionAsyncScheduler` in
the engine-core loop (`integrations.vllm.diffusion`), the checks' teeth, and the findings.

Needs the engine installed (`schedspec install-engines vllm`); without it every test fails
naming that command, unless SCHEDSPEC_SKIP_ENGINES=1 (then they are skipped).
SCHEDSPEC_VLLM_DLLM_PROGRAMS (default 150) sets how many generated programs the tests run.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.async_hold_fixes import (
    MODEL_LEN_HOLD,
    READ_ONLY_HOLD,
    apply_model_len_hold_fix,
    apply_read_only_hold_fix,
    fixed_async_class,
    fixed_module_source,
)
from integrations.vllm.async_hold_fixes import fix_as_diff as hold_fix_as_diff
from integrations.vllm.core_loop import BatchQueueLoop, EngineCoreViolation
from integrations.vllm.diffusion import (
    RULES,
    DllmCoreLoop,
    DllmProgram,
    DllmRequest,
    DllmRun,
    DllmServing,
    check_both,
    dllm_program,
)
from integrations.vllm.fixes import VLLM_DLLM_FIXES
from integrations.vllm.patches import print_patch
from integrations.vllm.pauses import PAUSE_MODES
from integrations.vllm.token_ids import output_token_id
from integrations.vllm.whole_canvas_fix import (
    FixDoesNotApply,
    apply_whole_canvas_fix,
    fix_as_diff,
    fixed_schedule,
    fixed_source,
)
from spec.errors import ConfigError, InvalidRequest, PromptTooLong, RequestTooLarge, UnknownRequest
from tests.engine_core_programs import first_violations, passing_runs
from tests.engine_gate import require_engine
from tests.patch_check import git_apply_to_copies
from tests.script_module import load_script
from tests.tier import depth
from tests.vllm_seeded_bugs import (
    abort_in_flight_leaks,
    active_seat_past_the_cap,
    adapters_past_max_loras,
    budget_raised,
    cadence_counts_empty_calls,
    extra_seat,
    held_step_defers_decodes,
    keep_pause_runs_the_running,
    lifo_admission,
    new_blocks_not_announced,
    pause_ignored,
    preemption_in_flight_raises,
    removal_not_announced,
    stop_reported_as_length,
    stores_unchained,
    under_allocate,
    watermark_ignored,
)

PROGRAMS = int(os.environ.get("SCHEDSPEC_VLLM_DLLM_PROGRAMS", depth(75, 150)))


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _serving(**changes: Any) -> DllmServing:
    base = DllmServing(
        canvas_length=4,
        max_denoising_steps=4,
        block_size=4,
        num_blocks=40,
        max_num_seqs=2,
        max_num_batched_tokens=64,
        max_model_len=64,
    )
    return replace(base, **changes)


def _one_step(serving: DllmServing, *requests: DllmRequest) -> DllmProgram:
    return DllmProgram(serving, (tuple(requests),), ((),))


def _run(program: DllmProgram, *, async_scheduling: bool, mutate: Any = None) -> DllmRun:
    loop = DllmCoreLoop(program.serving, async_scheduling=async_scheduling, mutate=mutate)
    return loop.run(program)


def test_vllm_builds_its_own_diffusion_schedulers() -> None:
    """A diffusion model makes vLLM pick `DiffusionScheduler` (sync) or
    `DiffusionAsyncScheduler` (async, the flag on as a GPU build leaves it); the canvas is its
    spec-token count, and no token is sampled besides the canvas."""
    for async_scheduling, name in (
        (False, "DiffusionScheduler"),
        (True, "DiffusionAsyncScheduler"),
    ):
        sched = DllmCoreLoop(_serving(), async_scheduling=async_scheduling).sched
        assert type(sched).__name__ == name
        assert sched.vllm_config.scheduler_config.async_scheduling is async_scheduling
        assert sched.vllm_config.model_config.is_diffusion
        assert (sched.num_spec_tokens, sched.num_sampled_tokens_per_step) == (4, 0)


def test_a_request_is_prefilled_then_denoised_and_committed_canvas_by_canvas() -> None:
    """Prompt 5, 10 outputs, canvas 4, each canvas converging after 2 denoise steps: one prefill
    step, then three canvases of 2 denoise steps and a commit each (the last canvas emits 4
    tokens, vLLM keeps 2: max_tokens). Both loops give outputs 1..10 and finish on length."""
    program = _one_step(_serving(), DllmRequest("r", 5, 10, converge_after=(2,)))
    sync, run = check_both(program)
    for r in (sync, run):
        assert r.outputs == {"r": tuple(output_token_id(0, i) for i in range(1, 11))}
        assert r.reasons == {"r": "length"}
        assert (r.denoise_steps, r.commits) == (6, 3)
    # and one empty schedule() that hands the finished id to the runner
    assert sync.schedules == 1 + 3 * 3 + 1
    assert sync.discarded == 0


def test_a_canvas_is_cut_where_it_reaches_max_model_len() -> None:
    """Prompt 13 and 17 outputs in max_model_len 32, canvas 4: canvases start at 13, 17, 21,
    25 and 29, and the last holds the 3 positions left, the cut vLLM's runner is written for.
    The synchronous loop passes with one cut canvas and the request's 17 tokens."""
    program = _one_step(_serving(max_model_len=32), DllmRequest("r", 13, 17, converge_after=(2,)))
    run = _run(program, async_scheduling=False)
    assert run.cut_canvas_steps == 3  # the last canvas: 2 denoise steps and its commit
    assert len(run.outputs["r"]) == 17 and run.reasons["r"] == "length"


def test_generated_programs_pass_both_loops_and_take_every_path() -> None:
    """vLLM's dLLM path on generated programs (narrow canvases, read-only requests, stop tokens,
    preemptions, aborts): every program passes both loops, and the asynchronous one does run a
    step ahead: aborts land with a step in flight and steps of finished requests are thrown
    away."""
    runs = passing_runs(PROGRAMS, lambda seed: check_both(dllm_program(seed)))
    taken = {
        key: sum(getattr(run, key) for _, run in runs)
        for key in ("preemptions", "aborts_in_flight", "discarded")
    }
    assert all(n > 0 for n in taken.values()), taken
    denoised = sum(sync.denoise_steps for sync, _ in runs)
    committed = sum(sync.commits for sync, _ in runs)
    assert denoised > committed > 0


def test_pipeline_parallel_programs_pass_and_keep_the_cadence() -> None:
    """The asynchronous loop with 2 and 3 pipeline stages (vLLM's V2 model runner: a batch queue
    of stages + 1, and `next_decode_eligible_step` holding a request back between its canvas
    steps): every program passes, every rule checked, `pp_cadence` included, and the cadence
    does hold requests back."""
    for stages, programs in ((2, PROGRAMS), (3, max(1, PROGRAMS // 3))):

        def run(seed: int, p: int = stages) -> tuple[DllmRun, DllmRun]:
            return check_both(dllm_program(seed), pipeline_parallel_size=p)

        runs = passing_runs(programs, run, f"{stages} stages: ")
        assert sum(run.cadence_waits for _, run in runs) > 0, stages


def test_prefix_caching_programs_pass_and_hit_the_cache() -> None:
    """vLLM's default for a decoder, prefix caching, on: half the prompts share a prefix, so
    requests hit blocks other requests filled (some in the same step, by design). Every program
    passes both loops, `kv_writes` included: no canvas is denoised in a block another request
    holds or the cache holds; and with 2 pipeline stages too."""
    for stages, programs in ((1, PROGRAMS), (2, max(1, PROGRAMS // 3))):

        def run(seed: int, p: int = stages) -> tuple[DllmRun, DllmRun]:
            return check_both(dllm_program(seed, prefix_caching=True), pipeline_parallel_size=p)

        runs = passing_runs(programs, run, f"{stages} stages: ")
        assert sum(s.prefix_hit_tokens + a.prefix_hit_tokens for s, a in runs) > 0, stages


def test_priority_policy_programs_pass_and_preempt() -> None:
    """vLLM's priority policy (each request a priority in 0..2): every program passes both
    loops, `preemption_victim` and `admission_order` in the policy's order included, and
    requests are preempted; with the whole-canvas fix under a binding budget too."""
    runs = passing_runs(PROGRAMS, lambda seed: check_both(dllm_program(seed, priority_policy=True)))
    assert sum(s.preemptions + a.preemptions for s, a in runs) > 0
    passing_runs(
        max(1, PROGRAMS // 3),
        lambda seed: check_both(
            dllm_program(seed, priority_policy=True, budget_binds=True), apply_whole_canvas_fix
        ),
        "whole-canvas fix: ",
    )


def test_the_batch_queue_is_vllms_max_concurrent_batches() -> None:
    """The loop keeps as many batches in flight as vLLM's engine core would
    (`VllmConfig.max_concurrent_batches`, checked when the loop is built): 2 with async
    scheduling, stages + 1 with pipeline stages, 1 synchronously."""
    assert DllmCoreLoop(_serving(), async_scheduling=False).queue_size == 1
    assert DllmCoreLoop(_serving(), async_scheduling=True).queue_size == 2
    staged = _serving(pipeline_parallel_size=3)
    assert DllmCoreLoop(staged, async_scheduling=True).queue_size == 4


# ---------------------------------------------------------------- seeded bugs
def _no_rollback(sched: Any) -> None:
    """Seeded bug: a denoise step's canvas stays counted as computed (no rollback)."""
    original = sched.update_from_output

    def update(out: Any, runner_output: Any) -> Any:
        result = original(out, runner_output)
        for rid, canvas in out.scheduled_spec_decode_tokens.items():
            req, i = sched.requests.get(rid), runner_output.req_ids.index(rid)
            if req is not None and not runner_output.sampled_token_ids[i]:
                req.num_computed_tokens += len(canvas)
        return result

    sched.update_from_output = update


def _request_width_ignored(sched: Any) -> None:
    """Seeded bug: the diffusion scheduler's trims to the request's canvas width are lost (the
    base classes' `update_draft_token_ids`, and `AsyncScheduler.schedule`)."""
    scheduler = __import__("vllm.v1.core.sched.scheduler", fromlist=["Scheduler"])
    sched.update_draft_token_ids = scheduler.Scheduler.update_draft_token_ids.__get__(sched)
    if type(sched).__name__ == "DiffusionAsyncScheduler":
        asynchronous = __import__("vllm.v1.core.sched.async_scheduler", fromlist=["x"])
        sched.schedule = asynchronous.AsyncScheduler.schedule.__get__(sched)


def _first_token_only(sched: Any) -> None:
    """Seeded bug: a commit appends only the first token of its canvas."""
    original = sched._update_request_with_output

    def update(request: Any, new_token_ids: list[int], is_stale: bool = False) -> Any:
        return original(request, new_token_ids[:1], is_stale)

    sched._update_request_with_output = update


def _over_allocate(sched: Any) -> None:
    """Seeded bug: every allocation reserves one canvas more."""
    manager = sched.kv_cache_manager
    original = manager.allocate_slots

    def allocate(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        return original(request, num_new_tokens + sched.num_spec_tokens, *args, **kwargs)

    manager.allocate_slots = allocate


def _no_pipeline_cadence(sched: Any) -> None:
    """Seeded bug: the scheduler staggers a request's decodes by 1 step, whatever the pipeline
    stages (the XPU setting without microbatching, applied where the runner needs the cadence)."""
    sched.decode_stagger = 1


def _share_denoising_block(sched: Any) -> None:
    """Seeded bug: when a request's canvas is allocated, its last block is also handed to
    another running request (its reference count raised, as a prefix-cache hit would), so the
    provisional KV of the canvas is in a block another request reads."""
    manager = sched.kv_cache_manager
    original = manager.allocate_slots
    tables = manager.coordinator.single_type_managers[0].req_to_blocks

    def allocate(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        result = original(request, num_new_tokens, *args, **kwargs)
        if result is not None and request.spec_token_ids:
            others = (r for r in sched.running if r is not request and tables.get(r.request_id))
            other = next(others, None)
            if other is not None:
                block = tables[request.request_id][-1]
                manager.block_pool.touch([block])
                tables[other.request_id].append(block)
        return result

    manager.allocate_slots = allocate


def _abort_keeps_its_table(sched: Any) -> None:
    """Seeded bug: an aborted request's blocks are freed, but its block table is kept."""
    original = sched._free_blocks
    tables = sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks

    def free(request: Any) -> None:
        kept = list(tables.get(request.request_id, ()))
        original(request)
        if request.status.name == "FINISHED_ABORTED" and kept:
            tables[request.request_id] = kept

    sched._free_blocks = free


SEEDED_BUGS = [
    # nothing left to compute, the synchronous loop's next call schedules nothing at all
    (_no_rollback, False, "idle_step", "scheduled nothing while"),
    (_no_rollback, True, "progress", "not drained"),
    (_request_width_ignored, False, "canvas_whole", "wide and"),
    (_request_width_ignored, True, "canvas_whole", "wide and"),
    (_first_token_only, False, "output_content", "expected"),
    (_first_token_only, True, "kv_bounded", "canvas(es) of"),
    (_over_allocate, False, "kv_bounded", "canvas(es) of"),
    (_over_allocate, True, "kv_bounded", "canvas(es) of"),
    (abort_in_flight_leaks, True, "no_leak", "drained, but"),
    (under_allocate, False, "kv_covers_scheduled", "computed or scheduled but holds"),
    (under_allocate, True, "kv_covers_scheduled", "computed or scheduled but holds"),
    (extra_seat, False, "seat_cap", "max_num_seqs="),
    (extra_seat, True, "seat_cap", "max_num_seqs="),
    (lifo_admission, True, "admission_order", "for the first time while"),
    (_abort_keeps_its_table, True, "pool_accounting", "is free and held"),
    (stop_reported_as_length, False, "finish_reason", "finished with length, expected stop"),
    (preemption_in_flight_raises, True, "implementation_error", "AssertionError"),
    (new_blocks_not_announced, False, "runner_tables", "but its outputs gave the runner"),
    (new_blocks_not_announced, True, "runner_tables", "but its outputs gave the runner"),
]


@pytest.mark.parametrize(
    ("mutant", "async_scheduling", "rule", "words"),
    SEEDED_BUGS,
    ids=lambda v: getattr(v, "__name__", str(v))[:24],
)
def test_checks_catch_each_seeded_bug(
    mutant: Callable[[Any], None], async_scheduling: bool, rule: str, words: str
) -> None:
    """Each rule has teeth: a seeded bug in vLLM's diffusion scheduler fails it, with a message
    that says what went wrong."""
    seen = first_violations(
        PROGRAMS,
        lambda seed: _run(dllm_program(seed), async_scheduling=async_scheduling, mutate=mutant),
        until=rule,
    )
    assert rule in seen, f"no program failed [{rule}]; failures seen: {seen}"
    assert seen[rule].startswith(f"[{rule}] ") and words in seen[rule], seen[rule]


def test_the_budget_check_catches_a_scheduler_over_its_budget() -> None:
    """Seeded bug: a budget 3 tokens over the configured one, on programs whose budget binds
    (with the whole-canvas fix, so no canvas is cut first): `token_budget` fails."""

    def fixed_over_budget(sched: Any) -> None:
        apply_whole_canvas_fix(sched)
        budget_raised(sched)

    seen = first_violations(
        PROGRAMS,
        lambda seed: check_both(dllm_program(seed, budget_binds=True), fixed_over_budget),
    )
    assert set(seen) == {"token_budget"}, seen
    assert "max_num_batched_tokens=" in seen["token_budget"], seen


#: Rules whose seeded bug has a test of its own (below), not a row of SEEDED_BUGS.
OWN_TESTS = {
    "token_budget": "test_the_budget_check_catches_a_scheduler_over_its_budget",
    "pp_cadence": "test_the_pipeline_cadence_check_catches_a_scheduler_without_it",
    "preemption_victim": "test_the_victim_check_catches_a_priority_scheduler_preempting_fcfs",
    "kv_writes": "test_the_kv_writes_check_catches_a_canvas_in_a_shared_block",
    "kv_events": "test_the_kv_events_check_reads_the_diffusion_path_too",
    "kv_event_content": "test_the_event_content_check_reads_the_diffusion_path_too",
    "max_loras": "test_lora_adapters_on_the_diffusion_path",
    "pause": "test_pauses_on_the_diffusion_path",
    "active_cap": "test_admission_settings_on_the_diffusion_path",
    "watermark": "test_admission_settings_on_the_diffusion_path",
    "prefill_cadence": "test_admission_settings_on_the_diffusion_path",
    "idle_step": "test_the_idle_step_check_catches_a_held_step_that_skips_its_decodes",
}
#: Rules whose seeded bug a test of another module plants (it needs vLLM 0.34.0): the module.
ELSEWHERE = {
    "cache_aware_order": (
        "tests.test_real_vllm_cache_aware_loop",
        "test_the_diffusion_loop_holds_the_window_too",
    ),
}


def _with_events(seed: int) -> DllmProgram:
    """Program `seed` with prefix caching, served with KV cache events on."""
    program = dllm_program(seed, prefix_caching=True)
    return replace(program, serving=replace(program.serving, kv_events=True))


def _run_with_events(seed: int, *, async_scheduling: bool) -> DllmRun:
    """`_with_events(seed)` through one loop, with an eviction that queues no `BlockRemoved`."""
    return _run(_with_events(seed), async_scheduling=async_scheduling, mutate=removal_not_announced)


def test_the_kv_events_check_reads_the_diffusion_path_too() -> None:
    """With KV cache events on (`DllmServing(kv_events=True)`), diffusion programs with prefix
    caching pass both loops, blocks announced stored and removed; an eviction whose
    `BlockRemoved` is never queued (seeded bug) fails `kv_events` in either loop."""
    runs = [run for seed in range(PROGRAMS) for run in check_both(_with_events(seed))]
    assert sum(r.events_stored for r in runs) and sum(r.events_removed for r in runs)
    for async_scheduling in (False, True):
        run = partial(_run_with_events, async_scheduling=async_scheduling)
        seen = first_violations(PROGRAMS, run, until="kv_events")
        assert "kv_events" in seen, seen
        assert "cached that the prefix cache no longer holds" in seen["kv_events"], seen


def _run_unchained(seed: int, *, async_scheduling: bool) -> DllmRun:
    """`_with_events(seed)` through one loop, its stores naming no parent."""
    return _run(_with_events(seed), async_scheduling=async_scheduling, mutate=stores_unchained)


def test_the_event_content_check_reads_the_diffusion_path_too() -> None:
    """With KV cache events on, every key the diffusion path stores is checked against its
    block (`kv_event_content`); stores that name no parent (seeded bug) fail the rule in
    either loop."""
    runs = [run for seed in range(PROGRAMS // 2) for run in check_both(_with_events(seed))]
    described = sum(r.events_keys_described for r in runs)
    assert described and described == sum(r.events_stored for r in runs), described
    for async_scheduling in (False, True):
        run = partial(_run_unchained, async_scheduling=async_scheduling)
        seen = first_violations(PROGRAMS, run, until="kv_event_content")
        assert "follows parent_block_hash None" in seen.get("kv_event_content", ""), seen


def _with_loras(seed: int) -> DllmProgram:
    """`_with_events(seed)` serving two LoRA adapters, one at a time."""
    program = _with_events(seed)
    return replace(program, serving=replace(program.serving, loras=2))


def _run_past_max_loras(seed: int, *, async_scheduling: bool) -> DllmRun:
    """`_with_loras(seed)` through one loop, its scheduler blind to `max_loras`."""
    return _run(
        _with_loras(seed), async_scheduling=async_scheduling, mutate=adapters_past_max_loras
    )


def test_lora_adapters_on_the_diffusion_path() -> None:
    """With two LoRA adapters and `max_loras=1` (`DllmServing(loras=2)`) diffusion programs
    pass both loops: requests wait for room for their adapter, and may be passed for it
    (`admission_order`), every store names its writer's adapter (`kv_event_content`). A
    scheduler that reads a `max_loras` far above the configured one (seeded bug) fails
    `max_loras` in either loop."""
    runs = [run for seed in range(PROGRAMS // 2) for run in check_both(_with_loras(seed))]
    assert sum(r.adapter_waits for r in runs) and sum(r.events_keys_described for r in runs)
    for async_scheduling in (False, True):
        run = partial(_run_past_max_loras, async_scheduling=async_scheduling)
        seen = first_violations(PROGRAMS, run, until="max_loras")
        assert "max_loras=1" in seen.get("max_loras", ""), seen


@pytest.mark.parametrize("mode", PAUSE_MODES)
def test_pauses_on_the_diffusion_path(mode: str) -> None:
    """Generation paused now and then (`DllmServing(pauses=MODE)`), the caches cleared once
    idle, then resumed: programs pass both loops in each mode, and in mode "keep" the reset
    preempts running requests, whose canvases in flight are dropped as stale and whose output
    is still whole. Seeded bugs fail `pause` in either loop: a pause ignored ("wait"), and a
    "keep" pause taken as "wait"."""
    paused: list[DllmRun] = []
    for seed in range(PROGRAMS // 3):
        program = dllm_program(seed)
        program = replace(program, serving=replace(program.serving, pauses=mode))
        paused.extend(check_both(program))
    assert sum(r.pauses for r in paused)
    assert (sum(r.pause_preempted for r in paused) > 0) == (mode == "keep")
    bug = {"wait": pause_ignored, "keep": keep_pause_runs_the_running}.get(mode)
    if bug is None:
        return
    for async_scheduling in (False, True):
        run = partial(_run_paused, mode=mode, bug=bug, async_scheduling=async_scheduling)
        seen = first_violations(PROGRAMS, run, until="pause")
        assert f"paused in mode {mode!r}" in seen.get("pause", ""), seen


def _run_paused(
    seed: int, *, mode: str, bug: Callable[[Any], None], async_scheduling: bool
) -> DllmRun:
    """Program `seed` paused in `mode`, through one loop, with seeded bug `bug`."""
    program = dllm_program(seed)
    program = replace(program, serving=replace(program.serving, pauses=mode))
    return _run(program, async_scheduling=async_scheduling, mutate=bug)


def test_every_rule_has_a_seeded_bug() -> None:
    """Each rule the dLLM loop checks is failed by at least one seeded bug."""
    covered = {rule for _, _, rule, _ in SEEDED_BUGS} | set(OWN_TESTS) | set(ELSEWHERE)
    assert covered == set(RULES), sorted(set(RULES) ^ covered)
    assert all(callable(globals().get(name)) for name in OWN_TESTS.values())
    for module, name in ELSEWHERE.values():
        assert callable(getattr(importlib.import_module(module), name, None)), (module, name)


def _admitted(seed: int, mutate: Any = None, **settings: Any) -> DllmRun:
    """Program `seed` served with vLLM's admission `settings`, asynchronous loop."""
    program = dllm_program(seed)
    program = replace(program, serving=replace(program.serving, **settings))
    return _run(program, async_scheduling=True, mutate=mutate)


def test_admission_settings_on_the_diffusion_path() -> None:
    """`DiffusionScheduler` admits through `Scheduler.schedule`, so vLLM's admission settings
    apply there too (`DllmServing(watermark=..., max_active_seqs=..., prefill_interval=...,
    adaptive_threshold=...)`): programs pass with all four set, each rule's case coming up,
    and each rule fails its seeded bug (the cadence's with two pipeline stages)."""
    every = {"watermark": 0.1, "max_active_seqs": 2, "prefill_interval": 3}
    totals = dict.fromkeys(("watermark_admissions", "capped_admissions", "held_steps"), 0)
    for seed in range(40):
        run = _admitted(seed, adaptive_threshold=True, **every)
        for name in totals:
            totals[name] += getattr(run, name)
    assert all(totals.values()), totals
    bugs: list[tuple[Callable[[Any], None], dict[str, Any], str, str]] = [
        (active_seat_past_the_cap, {"max_active_seqs": 1}, "active_cap", "max_num_active_seqs=1"),
        (watermark_ignored, {"watermark": 0.2}, "watermark", "the watermark keeps"),
        (
            cadence_counts_empty_calls,
            {"prefill_interval": 3, "pipeline_parallel_size": 2},
            "prefill_cadence",
            "prefill_schedule_interval=3",
        ),
    ]
    for bug, settings, rule, words in bugs:
        seen = first_violations(PROGRAMS, partial(_admitted, mutate=bug, **settings), until=rule)
        assert rule in seen and words in seen[rule], seen


def test_the_idle_step_check_catches_a_held_step_that_skips_its_decodes() -> None:
    """`idle_step` binds on the diffusion path too (`DiffusionScheduler` holds through
    `Scheduler.schedule`): under a prefill cadence of 3, the seeded bug that makes a held step
    skip its running requests' canvases as well fails the synchronous loop at the empty call,
    naming the requests it left running; the same programs pass without it."""

    def held(seed: int, mutate: Any = None) -> DllmRun:
        program = dllm_program(seed)
        program = replace(program, serving=replace(program.serving, prefill_interval=3))
        return _run(program, async_scheduling=False, mutate=mutate)

    seen = first_violations(PROGRAMS, partial(held, mutate=held_step_defers_decodes))
    assert set(seen) == {"idle_step"}, seen
    assert re.fullmatch(
        r"\[idle_step\] schedule \d+ scheduled nothing while \['r\d+_\d+'(, 'r\d+_\d+')*\] "
        r"stayed running",
        seen["idle_step"],
    ), seen
    assert sum(held(seed).held_steps for seed in range(8)) > 0


def test_the_pipeline_cadence_check_catches_a_scheduler_without_it() -> None:
    seen = first_violations(
        PROGRAMS,
        lambda seed: check_both(dllm_program(seed), _no_pipeline_cadence, pipeline_parallel_size=2),
    )
    assert set(seen) == {"pp_cadence"}, seen
    assert "fewer than pipeline_parallel_size=2 apart" in seen["pp_cadence"], seen


def test_the_victim_check_catches_a_priority_scheduler_preempting_fcfs() -> None:
    """Seeded bug: the scheduler forgets its priority policy when it preempts (it pops the
    newest running request): `preemption_victim` fails, naming the request it should have
    preempted."""

    def fcfs_victim(sched: Any) -> None:
        sched.policy = type(sched.policy).FCFS

    seen = first_violations(
        PROGRAMS, lambda seed: check_both(dllm_program(seed, priority_policy=True), fcfs_victim)
    )
    assert set(seen) == {"preemption_victim"}, seen
    assert "the largest (priority, arrival)" in seen["preemption_victim"], seen


def test_the_kv_writes_check_catches_a_canvas_in_a_shared_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With prefix caching on (so sharing a block is no pool_accounting error by itself), a
    canvas denoised in a block another request holds fails `kv_writes`. The seeded bug grows
    the other request's table behind the model runner's back, which `runner_tables` catches
    first; with that check off, `kv_writes` catches the shared canvas."""

    def run(seed: int) -> object:
        return check_both(dllm_program(seed, prefix_caching=True), _share_denoising_block)

    assert set(first_violations(PROGRAMS, run)) == {"runner_tables"}
    monkeypatch.setattr(BatchQueueLoop, "check_runner_tables", lambda self, out: None)
    seen = first_violations(PROGRAMS, run)
    assert set(seen) == {"kv_writes"}, seen
    assert "denoises canvas positions" in seen["kv_writes"], seen
    assert "reference count" in seen["kv_writes"], seen


# ---------------------------------------------------------------- findings
def test_finding_token_budget_cuts_a_running_requests_canvas() -> None:
    """Finding: two requests denoising canvases of 4 under a token budget of 6. vLLM gives the
    first its canvas and the second the 2 tokens left, so the runner denoises and commits a
    2-token canvas (its `valid_canvas_len`), which it expects only near max_model_len. With a
    budget of 8, which holds both canvases, the same program passes."""
    requests = (DllmRequest("a", 3, 8, (3,)), DllmRequest("b", 3, 8, (3,)))
    with pytest.raises(EngineCoreViolation) as err:
        _run(_one_step(_serving(max_num_batched_tokens=6), *requests), async_scheduling=False)
    assert err.value.rule == "canvas_whole"
    assert "'b' was scheduled a canvas of 2 at position 3" in str(err.value)
    run = _run(_one_step(_serving(max_num_batched_tokens=8), *requests), async_scheduling=False)
    assert run.reasons == {"a": "length", "b": "length"}


# ---------------------------------------------------------------- the first finding's fix
def test_whole_canvas_fix_serves_the_findings_program_whole() -> None:
    """With the candidate fix (`integrations.vllm.whole_canvas_fix`), the first finding's program
    passes both loops under the budget of 6: 'b' waits for a step instead of taking a cut
    canvas, and both requests get all 8 tokens."""
    requests = (DllmRequest("a", 3, 8, (3,)), DllmRequest("b", 3, 8, (3,)))
    program = _one_step(_serving(max_num_batched_tokens=6), *requests)
    for run in check_both(program, mutate=apply_whole_canvas_fix):
        assert run.reasons == {"a": "length", "b": "length"}
        assert all(len(out) == 8 for out in run.outputs.values())


def test_whole_canvas_fix_holds_wherever_the_budget_binds() -> None:
    """Programs with a token budget below every seat's canvas: vLLM as released cuts canvases in
    some of them (`canvas_whole`), and with the fix every one passes both loops, every rule
    checked (preemptions, aborts in flight and read-only requests included)."""
    released: list[str] = []
    fixed: list[str] = []
    for seed in range(PROGRAMS):
        program = dllm_program(seed, budget_binds=True)
        try:
            check_both(program)
        except EngineCoreViolation as err:
            released.append(err.rule)
        try:
            check_both(program, mutate=apply_whole_canvas_fix)
        except EngineCoreViolation as err:
            fixed.append(f"seed {seed}: {err}")
    assert released and set(released) == {"canvas_whole"}, released
    assert not fixed, f"{len(fixed)} of {PROGRAMS} programs fail with the fix; first: {fixed[:3]}"


def test_whole_canvas_fix_changes_nothing_where_the_budget_does_not_bind() -> None:
    """Where every canvas fits the budget the fix never skips a request: the runs, path counts
    included, are exactly those of vLLM as released."""
    for seed in range(min(PROGRAMS, 40)):
        program = dllm_program(seed)
        assert check_both(program, mutate=apply_whole_canvas_fix) == check_both(program), seed


def test_the_fixs_cost_on_the_findings_program() -> None:
    """What `scripts/vllm_whole_canvas_cost.py` counts, on the first finding's program (budget
    6, two canvases of 4, each converging after 3 denoise steps; synchronous loop). As released,
    with short canvases tolerated, 'b' denoises 2-token canvases beside 'a' for 8 steps (two
    canvases of 2), then one whole canvas: 20 canvas steps, 'b' done at engine step 13. With the
    fix 'b' waits out the 8 schedule() calls in which 'a' runs its two canvases, then runs its
    own two: 16 canvas steps, but 'b' done at engine step 17."""
    requests = (DllmRequest("a", 3, 8, (3,)), DllmRequest("b", 3, 8, (3,)))
    program = _one_step(_serving(max_num_batched_tokens=6), *requests)
    loop = DllmCoreLoop(program.serving, async_scheduling=False, tolerate_short_canvases=True)
    released = loop.run(program)
    fixed = _run(program, async_scheduling=False, mutate=apply_whole_canvas_fix)
    for run in (released, fixed):
        assert run.reasons == {"a": "length", "b": "length"}
        assert all(len(out) == 8 for out in run.outputs.values())
    assert (released.short_canvas_steps, fixed.short_canvas_steps) == (8, 0)
    assert released.denoise_steps + released.commits == 20
    assert fixed.denoise_steps + fixed.commits == 16
    assert (released.engine_steps, fixed.engine_steps) == (14, 18)
    assert released.latencies == {"a": 9, "b": 13}
    assert fixed.latencies == {"a": 9, "b": 17}
    assert (released.canvas_waits, released.longest_canvas_wait) == (0, 0)
    assert (fixed.canvas_waits, fixed.longest_canvas_wait) == (8, 8)


def test_tolerating_short_canvases_relaxes_nothing_else() -> None:
    """`tolerate_short_canvases` lets a budget-cut canvas through and nothing more: a scheduler
    over its budget still fails `token_budget`, and an aborted request has no latency."""

    def released_over_budget(seed: int) -> DllmRun:
        program = dllm_program(seed, budget_binds=True)
        loop = DllmCoreLoop(
            program.serving,
            async_scheduling=False,
            mutate=budget_raised,
            tolerate_short_canvases=True,
        )
        return loop.run(program)

    seen = first_violations(PROGRAMS, released_over_budget)
    assert set(seen) == {"token_budget"}, seen
    program = DllmProgram(
        _serving(max_num_batched_tokens=6),
        ((DllmRequest("a", 3, 8, (3,)), DllmRequest("b", 3, 8, (3,))), ()),
        ((), ("b",)),
    )
    run = DllmCoreLoop(program.serving, async_scheduling=False, tolerate_short_canvases=True).run(
        program
    )
    assert run.reasons["b"] == "abort" and set(run.latencies) == {"a"}, run


def test_the_cost_script_sums_and_pairs_the_runs(tmp_path: Path) -> None:
    """`scripts/vllm_whole_canvas_cost.py` on 12 programs: its JSON's totals are the sums of
    the four runs per program, and its paired figures cover exactly the programs the fix
    changed."""
    script = load_script("vllm_whole_canvas_cost")
    out = tmp_path / "cost.json"
    assert script.main(["--programs", "12", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    for mode in ("sync", "async"):
        runs = {
            variant: [
                script._run(dllm_program(seed, budget_binds=True), variant, mode == "async", 1)
                for seed in range(12)
            ]
            for variant in ("released", "fix")
        }
        for variant, variant_runs in runs.items():
            got = figures["figures"][f"{mode}/{variant}"]
            assert got["engine_steps"] == sum(r.engine_steps for r in variant_runs)
            assert got["short_canvas_steps"] == sum(r.short_canvas_steps for r in variant_runs)
            assert got["finished_requests"] == sum(len(r.latencies) for r in variant_runs)
        changed = sum(a != b for a, b in zip(runs["released"], runs["fix"], strict=True))
        assert figures["programs_changed_by_the_fix"][mode] == changed > 0
        assert figures["figures"][f"{mode}/fix"]["short_canvas_steps"] == 0


def test_whole_canvas_fix_as_a_patch_of_vllms_file_only_adds_the_skip() -> None:
    """`fix_as_diff` is a patch of vLLM's scheduler.py that removes nothing and adds the three
    statements: the wanted length before the budget cap, and the skip after it."""
    diff = fix_as_diff().splitlines()
    assert diff[:2] == [
        "--- a/vllm/v1/core/sched/scheduler.py",
        "+++ b/vllm/v1/core/sched/scheduler.py",
    ]
    body = diff[2:]
    assert sum(line.startswith("@@") for line in body) == 1
    assert not [line for line in body if line.startswith("-")]
    added = [line[1:].strip() for line in body if line.startswith("+")]
    assert added[0] == "num_wanted_tokens = num_new_tokens"
    assert added[-2:] == ["req_index += 1", "continue"]
    assert "and request.spec_token_ids" in added


def test_whole_canvas_fix_refuses_a_vllm_without_the_statement_it_edits() -> None:
    source = "def schedule(self):\n    num_new_tokens = min(num_new_tokens, budget)\n"
    with pytest.raises(FixDoesNotApply, match=r"scheduler.py has 0 copies of `num_new_tokens"):
        fixed_source(source)


def test_every_vllm_fix_is_one_patch_of_vllms_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scripts/engine_fixes_diff.py vllm` prints the three fixes as one patch of vLLM's two
    scheduler files; `git apply -p1` makes exactly the edited files, and the fixed
    `Scheduler.schedule` the checks give a scheduler is compiled from that very text, reading
    vLLM's own module globals."""
    assert load_script("engine_fixes_diff").main(["vllm"]) == 0
    diff = capsys.readouterr().out
    assert diff == VLLM_DLLM_FIXES.as_diff(VLLM_DLLM_FIXES.names)
    sources = VLLM_DLLM_FIXES.fixed_sources(VLLM_DLLM_FIXES.names)
    assert list(sources) == [
        "vllm.v1.core.sched.scheduler",
        "vllm.v1.core.sched.diffusion_scheduler",
    ]
    patched = git_apply_to_copies(tmp_path, sources, diff)
    assert patched == {module: fixed for module, (_, fixed) in sources.items()}
    text, fixed = sources["vllm.v1.core.sched.scheduler"]
    assert fixed == fixed_source(text)
    schedule = fixed_schedule()
    vllm_scheduler = importlib.import_module("vllm.v1.core.sched.scheduler")
    assert schedule.__globals__ is vars(vllm_scheduler)
    assert schedule is not vllm_scheduler.Scheduler.schedule
    assert "num_wanted_tokens" in schedule.__code__.co_varnames
    assert "num_wanted_tokens" not in vllm_scheduler.Scheduler.schedule.__code__.co_varnames


def test_read_only_hold_fix_as_a_patch_of_vllms_file_only_adds_the_counted_hold() -> None:
    """`fix_as_diff` of the hold fix is a patch of vLLM's diffusion_scheduler.py that changes two
    lines (the hold's condition, which keeps vLLM's own test, and the return of `schedule`) and
    adds the step cap, the counter and the count; the validated class runs that very file."""
    diff = hold_fix_as_diff().splitlines()
    assert diff[:2] == [
        "--- a/vllm/v1/core/sched/diffusion_scheduler.py",
        "+++ b/vllm/v1/core/sched/diffusion_scheduler.py",
    ]
    removed = [line[1:].strip() for line in diff[2:] if line.startswith("-")]
    added = [line[1:].strip() for line in diff[2:] if line.startswith("+")]
    assert removed == [
        "if _read_in_flight(request, width):",
        "return super().schedule(throttle_prefills)",
    ]
    assert "if _read_in_flight(request, width) or (" in added
    assert "self._read_steps: dict[str, int] = {}" in added
    assert added[-1] == "return output"
    assert "_read_step_cap" in fixed_async_class().schedule.__globals__


def test_a_patch_script_prints_the_patch_or_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/vllm_*_diff.py` print the diff, or say in one line why there is none."""

    def missing() -> str:
        raise FixDoesNotApply("scheduler.py has 0 copies of `x`")

    assert print_patch(lambda: "--- a/f\n+++ b/f\n") == 0
    assert capsys.readouterr().out == "--- a/f\n+++ b/f\n"
    assert print_patch(missing) == 2
    err = capsys.readouterr().err
    assert err == "error: scheduler.py has 0 copies of `x`\n", err


def test_read_only_hold_fix_refuses_a_vllm_without_the_places_it_edits() -> None:
    source = "class DiffusionScheduler(Scheduler):\n    pass\n"
    with pytest.raises(FixDoesNotApply, match="has 0 copies of `class DiffusionAsyncScheduler"):
        fixed_module_source("\n\n" + source)


def test_read_only_hold_fix_goes_first_and_composes_with_the_whole_canvas_fix() -> None:
    """The hold fix replaces vLLM's class and the whole-canvas fix subclasses what it finds, so
    both run in that order (a budget-binding program passes both loops with both), and the
    other order is refused rather than silently dropping the first fix."""
    program = dllm_program(9, budget_binds=True)

    def both(sched: Any) -> None:
        apply_read_only_hold_fix(sched)
        apply_whole_canvas_fix(sched)

    for run in check_both(program, mutate=both):
        assert run.reasons
    sched = DllmCoreLoop(_serving(), async_scheduling=True).sched
    apply_whole_canvas_fix(sched)
    with pytest.raises(FixDoesNotApply, match="apply the hold fixes first"):
        apply_read_only_hold_fix(sched)


def test_finding_async_cuts_a_canvas_early_near_max_model_len() -> None:
    """Finding: the program of the max_model_len test above, asynchronously. vLLM caps a step at
    `max_model_len - num_computed_tokens`, and with a denoise step in flight that count still
    holds the in-flight canvas, which will be rolled back. So at position 25, with 7 positions
    left, the canvas is cut to 3; the synchronous loop cuts only the canvas at 29."""
    program = _one_step(_serving(max_model_len=32), DllmRequest("r", 13, 17, converge_after=(2,)))
    with pytest.raises(EngineCoreViolation) as err:
        _run(program, async_scheduling=True)
    assert err.value.rule == "canvas_whole"
    assert "canvas of 3 at position 25" in str(err.value)
    assert "7 positions remain" in str(err.value)


def test_model_len_hold_fix_cuts_only_at_max_model_len() -> None:
    """The candidate fix of that finding: near max_model_len a request whose canvas the cap
    would cut waits while it has a canvas step in flight, so the cap is taken from an exact
    count. The finding's program then passes asynchronously, with the sync loop's outputs and
    finish reason; the sync loop, which has no step in flight, runs exactly as before."""
    program = _one_step(_serving(max_model_len=32), DllmRequest("r", 13, 17, converge_after=(2,)))
    sync = _run(program, async_scheduling=False)
    fixed = _run(program, async_scheduling=True, mutate=apply_model_len_hold_fix)
    outputs = {"r": tuple(output_token_id(0, i) for i in range(1, 18))}
    assert fixed.outputs == sync.outputs == outputs
    assert fixed.reasons == sync.reasons == {"r": "length"}
    assert _run(program, async_scheduling=False, mutate=apply_model_len_hold_fix) == sync


def test_model_len_hold_fix_holds_wherever_it_runs() -> None:
    """Generated programs whose requests may run into max_model_len: vLLM as released fails
    some asynchronously (`canvas_whole`, the finding); with the fix every one passes both loops,
    at 1 and 2 pipeline stages, and with the read-only hold fix too."""
    programs = [dllm_program(seed, reach_model_len=True) for seed in range(PROGRAMS // 3)]
    released = [p for p in programs if _fails(p)]
    assert released, "no generated program reaches the finding"
    for program in programs:
        check_both(program, mutate=apply_model_len_hold_fix)
    for program in released:
        check_both(program, mutate=apply_model_len_hold_fix, pipeline_parallel_size=2)

        def both(sched: Any) -> None:
            apply_read_only_hold_fix(sched)
            apply_model_len_hold_fix(sched)

        check_both(program, mutate=both)


def _fails(program: DllmProgram) -> bool:
    try:
        check_both(program)
    except EngineCoreViolation as err:
        assert err.rule == "canvas_whole", err
        return True
    return False


def test_the_hold_fixes_compose_in_either_order_as_one_edit_of_vllms_file() -> None:
    """Applied one after the other, in either order, the two hold fixes give the scheduler the
    class of the file edited with both; as a patch they are the two sets of edits together."""
    classes = []
    for order in (
        (apply_read_only_hold_fix, apply_model_len_hold_fix),
        (apply_model_len_hold_fix, apply_read_only_hold_fix),
    ):
        sched = DllmCoreLoop(_serving(), async_scheduling=True).sched
        for fix in order:
            fix(sched)
        classes.append(type(sched))
        assert sched._read_steps == {}
    assert classes[0] is classes[1] is fixed_async_class([READ_ONLY_HOLD, MODEL_LEN_HOLD])
    both = hold_fix_as_diff([READ_ONLY_HOLD, MODEL_LEN_HOLD])
    added = [
        line for line in both.splitlines() if line.startswith("+") and not line.startswith("+++")
    ]
    alone = [
        [
            line
            for line in hold_fix_as_diff([name]).splitlines()
            if line.startswith("+") and not line.startswith("+++")
        ]
        for name in (READ_ONLY_HOLD, MODEL_LEN_HOLD)
    ]
    assert sorted(added) == sorted(alone[0] + alone[1])
    assert "self.max_model_len" in "\n".join(alone[1])


def _discarded_read_only_steps(
    converge: int,
    max_steps: int | None,
    *,
    served_steps: int = 4,
    stages: int = 1,
    mutate: Any = None,
) -> int:
    """Steps of one read-only request (converging after `converge` denoise steps, its
    `diffusion_max_steps` = `max_steps`) thrown away in the asynchronous loop."""
    request = DllmRequest("r", 5, 4, (converge,), read_only=True, max_steps=max_steps)
    serving = _serving(pipeline_parallel_size=stages, max_denoising_steps=served_steps)
    run = _run(_one_step(serving, request), async_scheduling=True, mutate=mutate)
    assert run.outputs["r"] == tuple(output_token_id(0, i) for i in range(1, 5))
    return run.discarded_read_only


def test_read_only_deferral_saves_a_step_only_for_single_step_reads() -> None:
    """`DiffusionAsyncScheduler` holds a read-only request back once all its denoise steps are in
    flight, so no step is scheduled after the one that emits. With `diffusion_max_steps=1` that
    works: no step is thrown away (without the hold, one is). With 2 steps it counts the steps
    in flight against all of them, not the ones left: after the first returns, a third step is
    scheduled and thrown away. It reads only the request's own `diffusion_max_steps`: above the
    served `max_denoising_steps` (which the runner caps it at), or not given (the runner runs
    the served number), the hold never comes and a step is thrown away too."""
    discarded = _discarded_read_only_steps
    assert discarded(1, 1) == 0
    assert discarded(1, 1, mutate=_request_width_ignored) == 1  # AsyncScheduler: no hold
    assert discarded(2, 2) == 1
    # pipeline stages lengthen the hold ("max keeps a longer pipeline-parallel wait"), no more
    assert [discarded(steps, steps, stages=3) for steps in (1, 2)] == [0, 1]
    assert discarded(9, 2, served_steps=1) == 1  # the runner caps 2 at the served 1
    assert discarded(9, None, served_steps=1) == 1  # no own cap: the served 1


def test_read_only_hold_fix_throws_no_step_away_at_the_cap() -> None:
    """With the candidate fix (`integrations.vllm.async_hold_fixes`) the hold counts the steps
    scheduled against the step cap the runner applies, so no step is thrown away when the
    request converges at its cap, with any cap, any pipeline depth, the served cap or none of
    its own. A request that converges before its cap still loses the step already in flight:
    the scheduler cannot know it converged early."""
    fix = apply_read_only_hold_fix
    for steps in (1, 2, 3, 4):
        assert _discarded_read_only_steps(steps, steps, mutate=fix) == 0, steps
        assert _discarded_read_only_steps(steps, steps, stages=3, mutate=fix) == 0, steps
    assert _discarded_read_only_steps(9, 2, served_steps=1, mutate=fix) == 0
    assert _discarded_read_only_steps(9, None, served_steps=1, mutate=fix) == 0
    assert _discarded_read_only_steps(1, 3, mutate=fix) == 1


def test_read_only_hold_fix_holds_wherever_it_runs() -> None:
    """With the fix every generated program passes both loops, every rule checked (it holds
    back requests, so admission, budget and cadence are checked with it), and the
    asynchronous loop throws fewer read-only steps away. The synchronous scheduler, with no
    step in flight, is left as built."""
    released = fixed = 0
    for seed in range(PROGRAMS):
        program = dllm_program(seed)
        released_sync, released_async = check_both(program)
        released += released_async.discarded_read_only
        sync_run, async_run = check_both(program, mutate=apply_read_only_hold_fix)
        assert sync_run == released_sync, seed
        fixed += async_run.discarded_read_only
    assert fixed < released, (fixed, released)
    sched = DllmCoreLoop(_serving(), async_scheduling=False).sched
    built = type(sched)
    apply_read_only_hold_fix(sched)
    assert type(sched) is built


# ---------------------------------------------------------------- clear errors
def test_bad_serving_configurations_are_typed_errors() -> None:
    with pytest.raises(ConfigError, match="canvas_length"):
        _serving(canvas_length=0)
    with pytest.raises(ConfigError, match="null block"):
        _serving(num_blocks=1)
    with pytest.raises(ConfigError, match="one canvas must fit a step"):
        _serving(canvas_length=8, max_num_batched_tokens=4)
    with pytest.raises(ConfigError, match="pipeline_parallel_size"):
        _serving(pipeline_parallel_size=0)
    with pytest.raises(ConfigError, match="'fcfs' or 'priority'"):
        _serving(policy="lifo")
    with pytest.raises(ConfigError, match="kv_events"):
        _serving(kv_events="yes")
    with pytest.raises(ConfigError, match="invalid loras=-1"):
        _serving(loras=-1)
    with pytest.raises(ConfigError, match=r"max_loras=2: 1 where no LoRA adapter is served"):
        _serving(max_loras=2)
    with pytest.raises(ConfigError, match="invalid pauses='sleep'"):
        _serving(pauses="sleep")
    with pytest.raises(ConfigError, match="1 in the synchronous loop"):
        DllmCoreLoop(_serving(pipeline_parallel_size=2), async_scheduling=False)
    with pytest.raises(ConfigError, match="must be greater than or equal to max_num_seqs"):
        DllmCoreLoop(_serving(max_num_seqs=8, max_num_batched_tokens=4), async_scheduling=False)


def test_bad_requests_are_typed_errors() -> None:
    loop = DllmCoreLoop(_serving(max_model_len=16, num_blocks=4), async_scheduling=False)
    with pytest.raises(PromptTooLong):
        loop.submit(DllmRequest("long", 10, 7))
    with pytest.raises(RequestTooLarge):
        loop.submit(DllmRequest("big", 6, 6))
    with pytest.raises(InvalidRequest, match="no larger than the served canvas"):
        loop.submit(DllmRequest("wide", 2, 2, width=5))
    with pytest.raises(InvalidRequest, match="converge_after"):
        loop.submit(DllmRequest("never", 2, 2, converge_after=()))
    with pytest.raises(UnknownRequest):
        loop.abort("nobody")
    with pytest.raises(ValueError, match="2 steps of arrivals but 1 of aborts"):
        DllmProgram(_serving(), ((), ()), ((),))
