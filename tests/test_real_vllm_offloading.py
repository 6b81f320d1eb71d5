"""vLLM's own KV offloading connector in the engine-core loop (`LoopOptions(offload_chunks=N)`):
its real `OffloadingConnector` scheduler side and CPU manager over N CPU chunks, the worker
fabricated (`integrations.vllm.offloading_worker`), what each GPU block and CPU chunk holds
moved with the transfers and checked (`store_content`, `load_content`, `kv_written`).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import FixDoesNotApply
from integrations.vllm import MANIFEST
from integrations.vllm.adapter import SPACE_PREFIX, OffloadingOptions, RealVllmScheduler
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import (
    CoreProgram,
    CoreRun,
    EngineCoreLoop,
    LoopOptions,
    run_loop,
)
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.offload_hit_fix import OFFLOAD_HIT_FIXES, apply_offload_hit_fix
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.patch_check import git_apply_to_copies
from tests.script_module import load_script
from tests.vllm_seeded_bugs import (
    offload_flush_dropped,
    offload_load_from_chunk_start,
    offload_load_off_by_one,
    offload_reset_without_flush,
)

#: Generated programs each test runs through both loops.
PROGRAMS = 24
OFFLOADING = LoopOptions(offload_chunks=16, offload_outputs=True)
CONFIG = ArConfig(
    block_size=4,
    num_blocks=16,
    max_num_batched_tokens=16,
    max_num_seqs=2,
    max_model_len=16,
    enable_prefix_caching=True,
)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _passing_runs(
    options: LoopOptions, programs: int, loops: tuple[bool, ...] = (False, True)
) -> Iterator[CoreRun]:
    """The runs of the first `programs` shared-prompt programs through `loops` (async or not)
    that pass; each one that fails must be the one-token finding below."""
    for seed in range(programs):
        program = shared_prompt_program(seed)
        for async_scheduling in loops:
            try:
                yield run_loop(program, async_scheduling=async_scheduling, options=options)
            except EngineCoreViolation as err:
                assert _one_token_finding(program, err), f"seed {seed}: {err}"


def _first_violation(options: LoopOptions, programs: int) -> EngineCoreViolation:
    """The first violation of the first `programs` shared-prompt programs in the asynchronous
    loop (a seeded bug's); the test fails if none breaks a rule."""
    for seed in range(programs):
        try:
            run_loop(shared_prompt_program(seed), async_scheduling=True, options=options)
        except EngineCoreViolation as err:
            return err
    pytest.fail(f"none of {programs} programs broke a rule")


def _one_token_finding(program: CoreProgram, err: EngineCoreViolation) -> bool:
    """The finding below: a never-drained loop, blocks of one token, and a one-token prompt
    that other requests share (so its one block is offloaded and hit)."""
    shared = [r for batch in program.arrivals for r in batch if r.prompt is not None]
    return (
        err.rule == "progress"
        and program.config.block_size == 1
        and any(r.prompt_len == 1 for r in shared)
    )


def test_vllm_serves_its_own_offloading_connector_with_the_chunks_asked() -> None:
    sched = RealVllmScheduler(
        CONFIG, lambda _event: None, SPACE_PREFIX, offloading=OffloadingOptions(8, outputs=True)
    ).sched
    connector = sched.connector
    assert type(connector).__name__ == "OffloadingConnector"
    assert connector.connector_scheduler.manager._num_chunks == 8
    assert not connector.connector_scheduler.config.offload_prompt_only


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: OffloadingOptions(0), "offloading.chunks"),
        (lambda: LoopOptions(offload_outputs=True).offloading, "offload_chunks"),
        (
            lambda: RealVllmScheduler(
                CONFIG,
                lambda _event: None,
                SPACE_PREFIX,
                kv_connector="recompute",
                offloading=OffloadingOptions(4),
            ),
            "offloading",
        ),
    ],
    ids=["no-chunks", "options-without-chunks", "two-connectors"],
)
def test_bad_offloading_options_are_typed_errors(build: Callable[[], Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field, err.value


def test_generated_programs_pass_and_take_every_offloading_path() -> None:
    """Shared-prompt programs through both loops with vLLM's connector offloading prompts and
    outputs to 16 CPU chunks: vLLM stores, flushes stores whose blocks it reallocates, and
    loads hits back, and every block read holds its request's own KV. The one failure
    allowed is the one-token finding below."""
    totals: Counter[str] = Counter()
    passed = 0
    for run in _passing_runs(OFFLOADING, PROGRAMS):
        passed += 1
        for key in ("offload_stores", "offload_flushes", "offload_loads", "lookups_put_off"):
            totals[key] += getattr(run, key)
    assert passed >= 2 * PROGRAMS - 4, passed
    # lookups put off ("ask again later": a hit still being stored, a transfer in flight)
    # are taken too, and vLLM's skipping them passes `admission_order`
    keys = ("offload_stores", "offload_flushes", "offload_loads", "lookups_put_off")
    assert all(totals[k] > 0 for k in keys), totals


def test_synchronous_loads_pass_and_are_taken() -> None:
    options = LoopOptions(offload_chunks=16, offload_sync_loads=True)
    sync_loads = sum(run.offload_sync_loads for run in _passing_runs(options, PROGRAMS // 2))
    assert sync_loads > 0


def test_pipeline_stages_pass_with_every_workers_report() -> None:
    """With 2 pipeline stages vLLM's connector counts a job done once each of its 2 workers
    reported it (`num_workers`); the worker's report is the aggregate the engine hands over.
    Programs then drain as with one stage (a report counted once would leave every stored
    request's jobs pending, and the requests sharing its prompt put off for ever)."""
    options = LoopOptions(offload_chunks=16, offload_outputs=True, pipeline_parallel_size=2)
    runs = _passing_runs(options, PROGRAMS // 3, loops=(True,))
    assert sum(run.offload_stores for run in runs) > 0


def test_guided_batches_sampled_late_carry_the_workers_report() -> None:
    """With structured output the asynchronous loop defers sampling a batch whose guided
    request still has an output in flight; vLLM runs its forward at once (`execute_model`, the
    worker's loads and stores with it) and hands the worker's report over with its output
    once sampled. Programs pass as without a grammar, and deferred batches carry reports."""
    options = LoopOptions(offload_chunks=16, offload_outputs=True, structured_output=True)
    totals: Counter[str] = Counter()
    keys = ("deferred", "offload_deferred_reports", "offload_loads", "guided_rows")
    for run in _passing_runs(options, PROGRAMS, loops=(True,)):
        for key in keys:
            totals[key] += getattr(run, key)
    assert all(totals[k] > 0 for k in keys), totals


#: (seeded bug, the rule it fails, words of the message): tests/test_real_vllm.py counts these
#: rules as covered.
SEEDED_BUGS = [
    (offload_flush_dropped, "store_content", "not the KV of a key it stores"),
    (offload_load_off_by_one, "load_content", "not a key of the job"),
]


@pytest.mark.parametrize(
    ("mutant", "rule", "words"),
    SEEDED_BUGS,
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_checks_catch_each_seeded_bug(mutant: Callable[[Any], None], rule: str, words: str) -> None:
    """Each offloading rule has teeth: with no flush, a store reads a block a later request
    was given and wrote; with loads one chunk off, a load reads another key's KV. Both in the
    first shared-prompt programs, with a message that says which job, block and chunk."""
    options = LoopOptions(offload_chunks=16, offload_outputs=True, mutate=mutant)
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(shared_prompt_program(seed), async_scheduling=True, options=options),
        until=rule,
    )
    assert rule in seen, f"no program failed [{rule}]; failures seen: {seen}"
    assert words in seen[rule] and "job" in seen[rule], seen[rule]


@pytest.mark.parametrize("blocks_per_chunk", [2, 3])
def test_chunks_of_several_blocks_pass_and_loads_start_inside_them(blocks_per_chunk: int) -> None:
    """With CPU chunks of 2 or 3 GPU blocks (vLLM's `blocks_per_chunk`: a chunk stored whole,
    keyed by its last block) every shared-prompt program passes both loops with the fix, and
    some loads start inside a chunk (the request computed its first blocks itself), where the
    load's `block_indices` says which block of the chunk comes first."""
    options = LoopOptions(
        offload_chunks=8,
        offload_outputs=True,
        offload_blocks_per_chunk=blocks_per_chunk,
        fix=make_fixes(["no-pointless-hit"]),
    )
    totals: Counter[str] = Counter()
    for seed in range(300):  # loads that start inside a chunk are rare: 8 of 393 at 2 blocks
        program = shared_prompt_program(seed)
        for async_scheduling in (False, True):
            run = run_loop(program, async_scheduling=async_scheduling, options=options)
            totals["stores"] += run.offload_stores
            totals["mid"] += run.offload_mid_chunk_loads
    assert totals["stores"] > 0 and totals["mid"] > 0, totals


def test_a_load_told_to_start_at_its_chunks_first_block_is_caught() -> None:
    """The chunk offset has teeth: a seeded bug that reports every load as starting at a
    chunk's first block makes a load that starts inside one write each block with another
    block's KV, which the request then reads (`cache_hit_written` or `kv_written`)."""
    options = LoopOptions(
        offload_chunks=8,
        offload_outputs=True,
        offload_blocks_per_chunk=2,
        fix=make_fixes(["no-pointless-hit"]),
        mutate=offload_load_from_chunk_start,
    )
    err = _first_violation(options, 5 * PROGRAMS)
    assert err.rule in ("cache_hit_written", "kv_written") and "wrote block" in err.detail, err


def test_cache_resets_between_steps_pass_and_are_fenced() -> None:
    """With the prefix cache and the connector's cache reset before one engine step in 16
    (requests running, stores and loads in flight), every shared-prompt program passes both
    loops with the fix: the reset flushes the jobs in flight before new stores can take the
    chunks it freed. Resets happen, and some are done by the prefix cache too."""
    options = LoopOptions(
        offload_chunks=16,
        offload_outputs=True,
        cache_resets=True,
        fix=make_fixes(["no-pointless-hit"]),
    )
    totals: Counter[str] = Counter()
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            run = run_loop(
                shared_prompt_program(seed), async_scheduling=async_scheduling, options=options
            )
            totals["resets"] += run.cache_resets
            totals["done"] += run.cache_resets_done
            totals["flushes"] += run.offload_flushes
    assert totals["resets"] > 0 and totals["done"] > 0 and totals["flushes"] > 0, totals


def test_a_reset_that_drops_its_jobs_unflushed_is_caught() -> None:
    """The fence has teeth: a seeded bug whose reset drops the jobs in flight without
    flushing them lets a store from before the reset write a chunk the reset freed, read by
    `store_content` or `load_content`."""
    options = LoopOptions(
        offload_chunks=16,
        offload_outputs=True,
        cache_resets=True,
        fix=make_fixes(["no-pointless-hit"]),
        mutate=offload_reset_without_flush,
    )
    err = _first_violation(options, 2 * PROGRAMS)
    assert err.rule in ("store_content", "load_content") and "chunk" in err.detail, err


def test_cache_resets_are_refused_with_schedspecs_connector() -> None:
    with pytest.raises(ConfigError) as err:
        EngineCoreLoop(CONFIG, async_scheduling=False, kv_connector="recompute", cache_resets=True)
    assert err.value.field == "cache_resets"


def _one_token_program(block_size: int) -> CoreProgram:
    """r0, a one-token prompt, finishes and its block is offloaded; r1, the same prompt, comes
    three steps later and hits it."""
    config = ArConfig(
        block_size=block_size,
        num_blocks=8,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=4,
    )
    first, later = ArRequest("r0", 1, 1, prompt=(100,)), ArRequest("r1", 1, 1, prompt=(100,))
    return CoreProgram(config, ((first,), (), (), (), (later,)), ((),) * 5)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_finding_a_one_token_prompt_offloaded_at_block_size_1_loads_for_ever(
    async_scheduling: bool,
) -> None:
    """Finding: with blocks of one token, r1's one-token prompt hits r0's offloaded block
    whole. vLLM loads it asynchronously, then recomputes the last token of a whole-prompt hit
    (`num_computed_tokens = num_tokens - 1`), which leaves nothing computed; the next
    `schedule()` looks r1 up afresh and loads it again, for ever. With blocks of 2 the one
    token is no full block, nothing is offloaded, and the program drains."""
    trace: list[str] = []
    options = LoopOptions(offload_chunks=4, trace=trace)
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(_one_token_program(1), async_scheduling=async_scheduling, options=options)
    assert err.value.rule == "progress" and "1 waiting" in err.value.detail
    loads = [line for line in trace if "load job" in line and "of r1 submitted" in line]
    assert len(loads) > 100, loads[:3]
    run = run_loop(
        _one_token_program(2),
        async_scheduling=async_scheduling,
        options=LoopOptions(offload_chunks=4),
    )
    assert run.reasons == {"r0": "length", "r1": "length"} and run.offload_loads == 0


def test_a_trace_says_the_transfers_and_changes_no_verdict() -> None:
    for seed in range(6):
        program = shared_prompt_program(seed)
        for async_scheduling in (False, True):
            results = []
            traces: tuple[list[str] | None, ...] = (None, [])
            for trace in traces:
                options = LoopOptions(offload_chunks=16, offload_outputs=True, trace=trace)
                try:
                    results.append(
                        repr(run_loop(program, async_scheduling=async_scheduling, options=options))
                    )
                except EngineCoreViolation as err:
                    results.append(str(err))
            assert results[0] == results[1], seed
    lines: list[str] = []
    options = LoopOptions(offload_chunks=16, offload_outputs=True, trace=lines)
    run_loop(shared_prompt_program(1), async_scheduling=True, options=options)
    assert any(line.split(": ", 1)[1].startswith("offload: store job") for line in lines), lines
    assert any("done" in line for line in lines if "offload:" in line), lines


def test_the_check_script_runs_vllms_offloading_and_refuses_bad_combinations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = load_script("vllm_async_check")
    argv = ["--programs", "3", "--programs-from", "shared-prompts", "--offload-chunks", "16"]
    assert script.main(argv) == 0
    out = capsys.readouterr().out
    assert "vLLM's OffloadingConnector (16 CPU chunks, prompt blocks)" in out, out
    assert "store jobs of vLLM's OffloadingConnector" in out, out
    # with structured output too (its deferred batches' reports counted)
    assert script.main([*argv, "--structured-output"]) == 0
    assert "deferred batches whose output carried the worker's report" in (capsys.readouterr().out)
    for bad in (
        ["--offload-chunks", "0"],
        ["--offload-chunks", "4", "--kv-connector", "recompute"],
        ["--offload-outputs"],
        ["--offload-blocks-per-chunk", "2"],
        ["--cache-resets", "--kv-connector", "recompute"],
    ):
        with pytest.raises(SystemExit) as leaving:
            script.main(["--programs", "1", *bad])
        assert leaving.value.code == 2, bad
        last = capsys.readouterr().err.splitlines()[-1]
        assert "offload" in last or "--cache-resets" in last, bad


# ---------------------------------------------------------------- the finding's fix
def test_the_fix_drains_the_findings_program() -> None:
    """With `no-pointless-hit` the connector offers r1 no hit (the rollback of its one token
    would leave nothing loaded), so r1 is computed locally: both loops drain, nothing loads."""
    options = LoopOptions(offload_chunks=4, fix=make_fixes(["no-pointless-hit"]))
    for async_scheduling in (False, True):
        run = run_loop(_one_token_program(1), async_scheduling=async_scheduling, options=options)
        assert run.reasons == {"r0": "length", "r1": "length"}, run.reasons
        assert run.offload_stores == 1 and run.offload_loads == 0, run


def test_the_fix_holds_wherever_it_runs_and_changes_nothing_else() -> None:
    """With the fix every shared-prompt program passes both loops, also with synchronous
    loads; where no program has a one-token shared prompt at blocks of one token, the runs
    are those of vLLM as released, path counts included."""
    fixed = make_fixes(["no-pointless-hit"])
    compared = 0
    for sync_loads in (False, True):
        released = LoopOptions(
            offload_chunks=16, offload_outputs=True, offload_sync_loads=sync_loads
        )
        with_fix = LoopOptions(
            offload_chunks=16, offload_outputs=True, offload_sync_loads=sync_loads, fix=fixed
        )
        for seed in range(PROGRAMS):
            program = shared_prompt_program(seed)
            for async_scheduling in (False, True):
                run = run_loop(program, async_scheduling=async_scheduling, options=with_fix)
                if program.config.block_size > 1:
                    as_released = run_loop(
                        program, async_scheduling=async_scheduling, options=released
                    )
                    assert run == as_released, seed
                    compared += 1
    assert compared > PROGRAMS, compared


def test_the_fix_is_one_patch_of_vllms_file_and_refuses_another_connector(
    tmp_path: Path,
) -> None:
    """`scripts/engine_fixes_diff.py vllm-offloading` prints the edit the tests run: applied
    with `git apply -p1` to a copy of vLLM's file, it gives the very text they run. A scheduler
    without vLLM's offloading connector is refused, with a message naming it."""
    names = OFFLOAD_HIT_FIXES.names
    sources = OFFLOAD_HIT_FIXES.fixed_sources(names)
    patched = git_apply_to_copies(tmp_path, sources, OFFLOAD_HIT_FIXES.as_diff(names))
    assert patched == {module: fixed for module, (_, fixed) in sources.items()}
    assert "num_hit_tokens = 0" in next(iter(patched.values()))
    plain = RealVllmScheduler(CONFIG, lambda _event: None, SPACE_PREFIX).sched
    with pytest.raises(FixDoesNotApply, match="edits vLLM's offloading connector"):
        apply_offload_hit_fix(plain)
