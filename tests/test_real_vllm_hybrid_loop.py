"""vLLM 0.33.0's engine-core loop over a hybrid KV cache (`LoopOptions(sliding_window=W)`): a
full-attention group beside a sliding-window group of W tokens sharing one pool, vLLM's own
`HybridKVCacheCoordinator` deciding, with and without vLLM's own offloading connector.

Each rule reads every group's table: `pool_accounting` counts holders in every group,
`kv_covers_scheduled` also says a sliding window keeps the blocks its attention still reads,
and the content record (`cache_hit_written`, `kv_written`, `store_content`, `load_content`)
knows which group wrote a block. Seeded bugs show each has teeth on the hybrid cache.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import FixDoesNotApply
from integrations.vllm import MANIFEST
from integrations.vllm.adapter import (
    SPACE_PREFIX,
    OffloadingOptions,
    RealVllmScheduler,
    group_block_sizes,
    group_tables,
    hybrid_pool,
    kv_groups,
    window_tokens,
)
from integrations.vllm.cache_writes import CacheWrites
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, EngineCoreLoop, LoopOptions, run_loop
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.offload_restore_fix import tracker_rebuilt
from integrations.vllm.offload_window_fixes import (
    OFFLOADING_FIXES,
    apply_forget_stale_window,
    apply_whole_window_chunks,
)
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.patch_check import git_apply_to_copies
from tests.script_module import load_script
from tests.vllm_seeded_bugs import (
    cross_group_hit,
    offload_groups_swapped,
    window_blocks_counted_in_hash_blocks,
    window_freed_but_held,
    window_freed_early,
)

#: Generated programs a test runs through both loops.
PROGRAMS = 40
CONFIG = ArConfig(
    block_size=2,
    num_blocks=12,
    max_num_batched_tokens=8,
    max_num_seqs=2,
    max_model_len=16,
    enable_prefix_caching=True,
)
#: vLLM's offloading connector over the hybrid cache, with the fix of its one-token finding.
OFFLOADING = LoopOptions(
    sliding_window=3, offload_chunks=16, offload_outputs=True, fix=make_fixes(["no-pointless-hit"])
)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _totals(options: LoopOptions, programs: int = PROGRAMS) -> Counter[str]:
    """The counts of the first `programs` shared-prompt programs through both loops; each
    must pass."""
    totals: Counter[str] = Counter()
    for seed in range(programs):
        for async_scheduling in (False, True):
            run = run_loop(
                shared_prompt_program(seed), async_scheduling=async_scheduling, options=options
            )
            totals.update({k: v for k, v in asdict(run).items() if isinstance(v, int)})
    return totals


def test_vllm_builds_two_groups_over_a_pool_for_each() -> None:
    sched = RealVllmScheduler(CONFIG, lambda _event: None, SPACE_PREFIX, sliding_window=3).sched
    assert kv_groups(sched) == 2
    assert [window_tokens(sched, g) for g in (0, 1)] == [None, 3]
    assert len(sched.kv_cache_manager.block_pool.blocks) == hybrid_pool(12) == 23
    assert type(sched.kv_cache_manager.coordinator).__name__ == "HybridKVCacheCoordinator"


def test_the_window_drops_blocks_it_no_longer_reads() -> None:
    """A request decoding past its window holds the null block in the sliding-window group
    where its first blocks were, and real blocks for every token in the full-attention
    group."""
    loop = EngineCoreLoop(CONFIG, async_scheduling=False, sliding_window=2)
    program = shared_prompt_program(0)
    request = program.arrivals[0][0]
    loop.submit(request)
    for _ in range(4):
        loop.engine_step()
    rid = request.request_id
    full, window = group_tables(loop.sched, 0)[rid], group_tables(loop.sched, 1)[rid]
    computed = loop.sched.requests[rid].num_computed_tokens
    assert computed > 2 * CONFIG.block_size, computed
    assert None not in full and window[0] is None, (full, window)
    assert len(full) == len(window)


@pytest.mark.parametrize("window", [1, 2, 5])
def test_generated_programs_pass_on_a_hybrid_cache(window: int) -> None:
    """Shared-prompt programs, a third with prefix caching, pass both loops with windows
    smaller and larger than a block; requests hit the cache and some are preempted."""
    totals = _totals(LoopOptions(sliding_window=window))
    assert totals["schedules"] > 0 and totals["stale"] > 0, totals


@pytest.mark.parametrize("blocks_per_chunk", [1, 2])
def test_vllms_offloading_moves_both_groups_and_passes(blocks_per_chunk: int) -> None:
    """vLLM's offloading connector stores and loads blocks of both groups (a chunk holds one
    group's), and every program passes both loops with the fix of its one-token finding.
    With chunks of 2 blocks a sliding window's first chunk may start past a block that left
    the window."""
    options = replace(OFFLOADING, offload_blocks_per_chunk=blocks_per_chunk)
    totals = _totals(options)
    assert totals["offload_window_stored_blocks"] > 0, totals
    assert totals["offload_stored_blocks"] > totals["offload_window_stored_blocks"], totals
    assert totals["offload_window_loaded_blocks"] > 0, totals


#: (seeded bug, offloading on, the rule it fails, words of the message)
SEEDED_BUGS: list[tuple[Callable[[Any], None], bool, str, str]] = [
    (window_freed_early, False, "kv_covers_scheduled", "holds the null block as its block"),
    (window_freed_but_held, False, "pool_accounting", " (group 1)"),
    (cross_group_hit, False, "cache_hit_written", "KV cache group 0 wrote it last, not group 1"),
    (offload_groups_swapped, True, "store_content", "wrote it last, not group"),
]


@pytest.mark.parametrize("full_block_scale", [1, 2], ids=["blocks-of-one-size", "full-larger"])
@pytest.mark.parametrize(
    ("mutant", "offloading", "rule", "words"),
    SEEDED_BUGS,
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_checks_catch_each_seeded_bug_on_a_hybrid_cache(
    mutant: Callable[[Any], None], offloading: bool, rule: str, words: str, full_block_scale: int
) -> None:
    """Each per-group check has teeth: a window that frees a block it still reads; one that
    frees blocks it keeps in the table; a prefix-cache lookup that hands the sliding window
    the full-attention group's block; an offloading store whose spec lists the groups in the
    wrong order. Each is caught in the first shared-prompt programs, the message naming the
    group, with the groups' blocks of one size and with the full-attention group's twice the
    window's."""
    base = OFFLOADING if offloading else LoopOptions(sliding_window=3)
    options = replace(base, mutate=mutant, full_block_scale=full_block_scale)
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(shared_prompt_program(seed), async_scheduling=True, options=options),
        until=rule,
    )
    assert rule in seen, f"no program failed [{rule}]; failures seen: {seen}"
    assert words in seen[rule] and "group" in seen[rule], seen[rule]


def test_the_cross_group_lookup_passes_on_one_group() -> None:
    """Ignoring the group is harmless with one group: the programs that catch it on a hybrid
    cache pass (what catches it there is the per-group content record, not another rule)."""
    options = LoopOptions(mutate=cross_group_hit)
    for seed in range(PROGRAMS // 4):
        for async_scheduling in (False, True):
            run_loop(
                shared_prompt_program(seed), async_scheduling=async_scheduling, options=options
            )


# ---------------------------------------------------------------- groups of two block sizes
def test_vllm_schedules_by_the_larger_block_and_hashes_by_the_smaller() -> None:
    """A window group of blocks 3 times the program's: vLLM resolves the scheduler block size
    to their least common multiple and the hash block size to their greatest common divisor,
    as its engine core does, and its coordinator aligns hits to the larger block."""
    sched = RealVllmScheduler(
        CONFIG, lambda _event: None, SPACE_PREFIX, sliding_window=3, window_block_scale=3
    ).sched
    assert group_block_sizes(sched) == (2, 6)
    assert (sched.block_size, sched.hash_block_size) == (6, 2)
    assert sched.kv_cache_manager.coordinator.scheduler_block_size == 6


@pytest.mark.parametrize("scale", [2, 3])
def test_generated_programs_pass_with_window_blocks_larger_than_the_full_attention_ones(
    scale: int,
) -> None:
    """Shared-prompt programs pass both loops with the window's blocks `scale` times the
    program's (each group's table read in its own blocks; a hit's window block is checked
    against the request's block hash of its last hash block), with and without vLLM's
    offloading connector (a window chunk then holds `scale` times the tokens)."""
    totals = _totals(LoopOptions(sliding_window=3, window_block_scale=scale))
    assert totals["schedules"] > 0 and totals["stale"] > 0, totals
    offloaded = _totals(replace(OFFLOADING, window_block_scale=scale), PROGRAMS // 2)
    assert offloaded["offload_window_stored_blocks"] > 0, offloaded
    assert offloaded["offload_window_loaded_blocks"] > 0, offloaded


def test_vllm_schedules_by_the_full_attention_block_where_it_is_the_larger() -> None:
    """Full-attention layers with less KV per token get the larger blocks: vLLM schedules by
    them and hashes by the window's; pages are of one size. Without a Mamba group vLLM keeps
    hits on the scheduler block (no hits inside a block, so no copy-on-write), though its
    full-attention manager registers a prompt's tail inside a block for lookups that would
    take one."""
    sched = RealVllmScheduler(
        CONFIG, lambda _event: None, SPACE_PREFIX, sliding_window=3, full_block_scale=3
    ).sched
    assert group_block_sizes(sched) == (6, 2)
    assert (sched.block_size, sched.hash_block_size) == (6, 2)
    coordinator = sched.kv_cache_manager.coordinator
    assert coordinator.scheduler_block_size == 6 and not coordinator.enable_partial_hash_hits
    pages = {m.kv_cache_spec.page_size_bytes for m in coordinator.single_type_managers}
    assert len(pages) == 1, pages


@pytest.mark.parametrize("scale", [2, 3])
def test_generated_programs_pass_with_full_attention_blocks_larger_than_the_windows(
    scale: int,
) -> None:
    """Shared-prompt programs pass both loops with the full-attention group's blocks `scale`
    times the window's (the program's), with and without vLLM's offloading connector (a
    full-attention chunk then holds `scale` times the tokens of a window chunk); requests
    hit the cache and some are preempted. A load needs a hit on the scheduler block: with
    blocks of 6 tokens these programs load rarely (5 load jobs in 300), so loads are
    counted with blocks of 4."""
    totals = _totals(LoopOptions(sliding_window=3, full_block_scale=scale))
    assert totals["schedules"] > 0 and totals["stale"] > 0, totals
    offloaded = _totals(replace(OFFLOADING, full_block_scale=scale), PROGRAMS // 2)
    assert offloaded["offload_window_stored_blocks"] > 0, offloaded
    if scale > 2:
        return
    assert offloaded["offload_stored_blocks"] > offloaded["offload_window_stored_blocks"]
    assert offloaded["offload_window_loaded_blocks"] > 0, offloaded


def test_a_window_freeing_by_hash_blocks_is_caught_only_where_its_blocks_are_larger() -> None:
    """Seeded bug: the window counts the blocks that left it in hash blocks. With window
    blocks twice the program's it frees blocks its attention still reads, which
    `kv_covers_scheduled` catches reading the window group's table in its own blocks; with
    blocks of one size the bug changes nothing, and the same programs pass."""
    larger = LoopOptions(
        sliding_window=3, window_block_scale=2, mutate=window_blocks_counted_in_hash_blocks
    )
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(shared_prompt_program(seed), async_scheduling=True, options=larger),
        until="kv_covers_scheduled",
    )
    assert "kv_covers_scheduled" in seen, seen
    assert "holds the null block as its block" in seen["kv_covers_scheduled"], seen
    assert "in KV cache group 1" in seen["kv_covers_scheduled"], seen
    same = replace(larger, window_block_scale=1)
    for seed in range(PROGRAMS // 4):
        run_loop(shared_prompt_program(seed), async_scheduling=True, options=same)


def test_the_content_record_hashes_a_larger_block_by_its_last_hash_block() -> None:
    """With hash blocks of 2 tokens and a group of 6-token blocks, a request's block k in that
    group carries its block hash 3k + 2; a block past its hashed tokens has none."""

    class Request:
        def __init__(self) -> None:
            self.block_hashes = [bytes([i]) for i in range(7)]

    writes = CacheWrites(2, group_block_sizes=(2, 6))
    request = Request()
    assert writes.block_hash((request, 1)) == bytes([1])
    assert writes.block_hash((request, 0), 1) == bytes([2])
    assert writes.block_hash((request, 1), 1) == bytes([5])
    assert writes.block_hash((request, 2), 1) is None


def test_the_content_record_tells_the_groups_apart() -> None:
    """A block holds what the group that wrote it last wrote: another group's read of it
    finds nothing."""
    writes = CacheWrites(2)
    request = object()
    writes.put(7, (request, 0), 1)
    assert writes.content(7, 1) == (request, 0) and writes.content(7) is None
    writes.put(7, (request, 3))
    assert writes.content(7) == (request, 3) and writes.content(7, 1) is None
    writes.forget([7])
    assert writes.content(7) is None and not writes.written_in


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (
            lambda: RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, sliding_window=0),
            "an integer >= 1",
        ),
        (
            lambda: RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, sliding_window=True),
            "an integer >= 1",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, sliding_window=2
            ).step(),
            "drive a hybrid cache with integrations.vllm.engine_core",
        ),
        (
            lambda: RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, window_block_scale=2),
            "with a sliding window an integer >= 1",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, sliding_window=2, window_block_scale=0
            ),
            "the window group's blocks are that many times the block size",
        ),
        (
            lambda: RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, full_block_scale=2),
            "with a sliding window of window_block_scale 1",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG,
                lambda _e: None,
                SPACE_PREFIX,
                sliding_window=2,
                window_block_scale=2,
                full_block_scale=2,
            ),
            "with a sliding window of window_block_scale 1 and no Mamba group",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, sliding_window=2, full_block_scale=True
            ),
            "the full-attention group's blocks are that many times the block size",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG,
                lambda _e: None,
                SPACE_PREFIX,
                sliding_window=2,
                mamba=True,
                full_block_scale=2,
            ),
            "and no Mamba group an integer >= 1",
        ),
    ],
)
def test_bad_hybrid_options_are_typed_errors(build: Callable[[], Any], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        build()
    fields = ("sliding_window", "window_block_scale", "full_block_scale")
    assert err.value.field in fields, err.value
    assert words in str(err.value), err.value


@pytest.mark.parametrize(
    ("window", "interval", "offloading", "scale"),
    [
        (None, None, None, 1),
        (3, -4, None, 1),
        (3, 3, None, 1),
        (3, 4, OffloadingOptions(8, blocks_per_chunk=3), 1),
        (3, 2, None, 2),
        (3, 8, OffloadingOptions(8, blocks_per_chunk=2), 3),
        (3, 2, None, -2),
        (3, 4, None, -3),
    ],
)
def test_a_retention_interval_vllm_would_refuse_is_a_typed_error(
    window: int | None,
    interval: int | None,
    offloading: OffloadingOptions | None,
    scale: int,
) -> None:
    """Only with a sliding window, and a multiple of vLLM's scheduler block size, the larger
    group's block (`scale` below 0: the full-attention group's blocks are -`scale` times the
    window's; with offloading, of a window CPU chunk): the message says what would be
    valid."""
    with pytest.raises(ConfigError) as err:
        RealVllmScheduler(
            replace(CONFIG, block_size=2),
            lambda _event: None,
            SPACE_PREFIX,
            sliding_window=window,
            retention_interval=interval,
            offloading=offloading,
            window_block_scale=max(scale, 1),
            full_block_scale=max(-scale, 1),
        )
    assert err.value.field == "retention_interval", err.value
    assert "with a sliding window" in err.value.valid, err.value


def test_the_check_script_serves_a_hybrid_cache_and_refuses_bad_combinations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = load_script("vllm_async_check")
    argv = ["--programs", "3", "--programs-from", "shared-prompts", "--sliding-window", "3"]
    assert script.main([*argv, "--offload-chunks", "16"]) == 0
    out = capsys.readouterr().out
    assert "a hybrid KV cache (a sliding window of 3 tokens)" in out, out
    assert "of the blocks stored, the sliding window's" in out, out
    assert script.main([*argv, "--full-block-scale", "2"]) == 0
    out = capsys.readouterr().out
    words = "a sliding window of 3 tokens, full attention in blocks 2 times the block size"
    assert words in out, out
    for bad in (
        ["--sliding-window", "0"],
        ["--sliding-window", "2", "--kv-connector", "fail", "--kv-store", "offload"],
        ["--fix", "cap-blocks-held"],
        ["--retention-interval", "dense"],
        ["--sliding-window", "2", "--retention-interval", "sparse"],
        ["--sliding-window", "2", "--fix", "whole-window-chunks"],
        ["--window-block-scale", "2"],
        ["--sliding-window", "2", "--window-block-scale", "0"],
        ["--full-block-scale", "2"],
        ["--sliding-window", "2", "--window-block-scale", "2", "--full-block-scale", "2"],
        ["--sliding-window", "2", "--mamba", "--full-block-scale", "2"],
    ):
        with pytest.raises(SystemExit) as leaving:
            script.main(["--programs", "1", *bad])
        assert leaving.value.code == 2, bad
        last = capsys.readouterr().err.splitlines()[-1]
        flags = ("--sliding-window", "--retention", "--fix", "--window-block-scale", "--full-block")
        assert any(flag in last for flag in flags), bad


# ---------------------------------------------------------------- findings, and their fixes
def _reset_program() -> CoreProgram:
    """The first finding's shrunk program (docs/shrunk/vllm-offloading-reset-window.json): one
    request of 3 prompt tokens and 7 outputs, blocks of 2, one token a step; the draw seed
    puts a cache reset at engine step 10."""
    config = ArConfig(
        block_size=2, num_blocks=6, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=10
    )
    return CoreProgram(config, ((), (ArRequest("r3", 3, 7),)), ((), ()))


RESET_OPTIONS = LoopOptions(
    sliding_window=3, offload_chunks=8, offload_outputs=True, cache_resets=True, draw_seed=4303629
)


def test_finding_a_cache_reset_re_stores_window_blocks_the_window_freed() -> None:
    """Finding: r3 decodes past its window of 3 tokens, whose first blocks the scheduler frees
    and hands to the full-attention group for later tokens. The connector keeps r3's window
    block ids and clears stale ones only at positions it has not stored yet. The cache reset
    at step 10 sends r3 back to chunk 0, and the store reads the window's old block 2, now
    holding full-attention KV, under r3's key. With `forget-stale-window` the reset clears the
    stored positions' ids and the program passes; without the reset it passes as released."""
    fixes = ["no-pointless-hit"]
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(
            _reset_program(),
            async_scheduling=False,
            options=replace(RESET_OPTIONS, fix=make_fixes(fixes)),
        )
    assert err.value.rule == "store_content", err.value
    assert "of KV cache group 1" in err.value.detail, err.value
    assert "KV cache group 0 wrote it last, not group 1" in err.value.detail, err.value
    fixed = replace(RESET_OPTIONS, fix=make_fixes([*fixes, "forget-stale-window"]))
    no_reset = replace(RESET_OPTIONS, fix=make_fixes(fixes), cache_resets=False)
    for options in (fixed, no_reset):
        for async_scheduling in (False, True):
            run = run_loop(_reset_program(), async_scheduling=async_scheduling, options=options)
            assert run.reasons == {"r3": "length"} and run.offload_stores > 0, run


def _reset_twice_program() -> CoreProgram:
    """Finding 1 with window blocks twice the program's: four requests, blocks of 2, no
    chunked prefill (shrunk from 15 requests, 5 aborts, 272 tokens in 700 runs)."""
    config = ArConfig(
        block_size=2,
        num_blocks=10,
        max_num_batched_tokens=16,
        max_num_seqs=2,
        max_model_len=16,
        enable_chunked_prefill=False,
    )
    arrivals = (
        (ArRequest("r0", 1, 6),),
        (ArRequest("r3", 1, 1),),
        (ArRequest("r4", 2, 11),),
        (ArRequest("r14", 8, 8),),
    )
    return CoreProgram(config, arrivals, ((),) * 4)


def test_finding_a_cache_reset_can_store_one_block_twice_and_vllm_raises() -> None:
    """Finding 1, a third way: r4's window frees its block 3 (window block 0) and the pool
    hands it back to r4 as its window block 2. The connector keeps id 3 at both positions
    (the first already stored, so never zeroed), and the re-store after the reset lists block
    3 twice in one job: when the job is done the connector takes it out of block 3's pending
    jobs twice, and `update_from_output` raises KeyError (an engine core would die). Under
    async scheduling, 1 of 2,000 shared-prompt programs with window blocks twice the
    program's and resets; `forget-stale-window` lifts it, `whole-window-chunks` does not."""
    options = LoopOptions(
        sliding_window=3,
        window_block_scale=2,
        offload_chunks=8,
        offload_outputs=True,
        cache_resets=True,
        draw_seed=4136049911,
    )
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(
            _reset_twice_program(),
            async_scheduling=True,
            options=replace(options, fix=make_fixes(["no-pointless-hit"])),
        )
    assert err.value.rule == "implementation_error", err.value
    assert "update_from_output: KeyError" in err.value.detail, err.value
    unfixed = replace(options, fix=make_fixes(["no-pointless-hit", "whole-window-chunks"]))
    with pytest.raises(EngineCoreViolation):
        run_loop(_reset_twice_program(), async_scheduling=True, options=unfixed)
    fixed = replace(options, fix=make_fixes(["no-pointless-hit", "forget-stale-window"]))
    for async_scheduling in (False, True):
        run = run_loop(_reset_twice_program(), async_scheduling=async_scheduling, options=fixed)
        assert set(run.reasons.values()) == {"length"}, run


def _shorter_prompt_program() -> CoreProgram:
    """The second finding's shrunk program (docs/shrunk/vllm-offloading-window-part.json): r9's
    4-token prompt is a prefix of r7's 10 tokens; r3 and r6 share nothing; blocks of one
    token."""
    config = ArConfig(
        block_size=1, num_blocks=13, max_num_batched_tokens=10, max_num_seqs=2, max_model_len=11
    )
    shared = tuple(range(100, 110))
    arrivals = (
        (ArRequest("r3", 6, 1),),
        (ArRequest("r6", 1, 2),),
        (ArRequest("r7", 10, 1, prompt=shared), ArRequest("r9", 4, 1, prompt=shared[:4])),
    )
    return CoreProgram(config, arrivals, ((),) * 3)


def _mid_chunk_program() -> CoreProgram:
    """The same finding in the store itself, under vLLM's default retention: r7's 13-token
    prompt extends r3's 5 tokens; blocks of 4, one seat, 3 tokens a step."""
    config = ArConfig(
        block_size=4,
        num_blocks=5,
        max_num_batched_tokens=3,
        max_num_seqs=1,
        max_model_len=14,
        policy=Policy.PRIORITY,
        enable_prefix_caching=True,
    )
    shared = tuple(range(100, 113))
    arrivals = (
        (ArRequest("r3", 5, 1, prompt=shared[:5]),),
        (ArRequest("r7", 13, 1, prompt=shared),),
    )
    return CoreProgram(config, arrivals, ((), ()))


def _dense_program() -> CoreProgram:
    """The same finding under dense retention: r4 (8 prompt tokens, 6 outputs) in blocks of 4,
    r8 taking a block the window freed."""
    config = ArConfig(
        block_size=4,
        num_blocks=5,
        max_num_batched_tokens=14,
        max_num_seqs=2,
        max_model_len=14,
        enable_chunked_prefill=False,
    )
    return CoreProgram(config, ((ArRequest("r4", 8, 6),), (ArRequest("r8", 1, 1),)), ((), ()))


#: (program, its options as released with the one-token fix, the loop that breaks, the rule
#: and words of the message)
PART_PROGRAMS = [
    (
        _shorter_prompt_program(),
        LoopOptions(
            sliding_window=8,
            offload_chunks=8,
            offload_blocks_per_chunk=3,
            offload_outputs=True,
            draw_seed=1563501665,
        ),
        False,
        "cache_hit_written",
        "'r9' starts from the prefix cache",
    ),
    (
        _mid_chunk_program(),
        LoopOptions(
            sliding_window=3,
            offload_chunks=8,
            offload_blocks_per_chunk=3,
            offload_sync_loads=True,
            offload_outputs=True,
            draw_seed=2260532251,
        ),
        False,
        "store_content",
        "not block 1 of 'r7', as its key says",
    ),
    (
        _dense_program(),
        LoopOptions(
            sliding_window=3,
            retention_interval=None,
            offload_chunks=8,
            offload_blocks_per_chunk=3,
            offload_outputs=True,
            draw_seed=3434232409,
        ),
        True,
        "store_content",
        "not block 1 of 'r4', as its key says",
    ),
]


@pytest.mark.parametrize(
    ("program", "options", "async_scheduling", "rule", "words"),
    PART_PROGRAMS,
    ids=["shorter", "mid-chunk", "dense"],
)
def test_finding_a_window_chunk_stored_in_part_is_hit_whole(
    program: CoreProgram, options: LoopOptions, async_scheduling: bool, rule: str, words: str
) -> None:
    """Finding: with chunks of 3 blocks, a request stores a sliding-window chunk in part: the
    blocks of it that left its window, or that the store mask did not ask for, are the null
    block and are left out, but the chunk is keyed as a whole. A later request hits it and
    reads the part left out: r9, whose 4-token prompt ends inside r7's (a window of 8 reads
    tokens 0-2, r7 stored only token 2 of that chunk). The null block left out can also be in
    the middle of the chunk, and the blocks after it then land one slot early (vLLM's worker
    fills a chunk's slots one after the other): the connector zeroes a window block id only
    when the pool reallocates the block, so r7's window block 0, a hit on r3's block that
    stays cached once freed, keeps its id while block 1, freed and reallocated, is zeroed, and
    r7's block 2 is stored where block 1 belongs (under vLLM's default retention); and under
    dense retention (`prefix_cache_retention_interval=None`) r4's chunk holds its window block
    0 where block 1 belongs. With `whole-window-chunks` no window chunk holding the null block
    is stored, and all three pass; with chunks of one block no chunk is stored in part, and
    they pass as released. vLLM 0.34.0 fixed the second part (mid-chunk, dense): it stores the
    null block as a placeholder and the blocks after it keep their slots; the first remains."""
    fixes = ["no-pointless-hit"]
    if words.startswith("not block 1") and MANIFEST.version != "0.33.0":
        # vLLM 0.34.0 copies the null block into the chunk as a placeholder ("so later blocks
        # retain their logical offsets"): the blocks after it keep their slots, as released
        for loop in (False, True):
            run = run_loop(
                program, async_scheduling=loop, options=replace(options, fix=make_fixes(fixes))
            )
            assert set(run.reasons.values()) == {"length"}, run
        return
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(
            program,
            async_scheduling=async_scheduling,
            options=replace(options, fix=make_fixes(fixes)),
        )
    assert err.value.rule == rule, err.value
    assert words in err.value.detail and "KV cache group 1" in err.value.detail, err.value
    fixed = replace(options, fix=make_fixes([*fixes, "whole-window-chunks"]))
    one_block = replace(options, fix=make_fixes(fixes), offload_blocks_per_chunk=1)
    for checked in (fixed, one_block):
        for loop in (False, True):
            run = run_loop(program, async_scheduling=loop, options=checked)
            assert set(run.reasons.values()) == {"length"}, run


@pytest.mark.parametrize("blocks_per_chunk", [1, 3])
def test_with_the_fixes_resets_and_chunks_of_several_blocks_pass(blocks_per_chunk: int) -> None:
    """With the three offloading fixes, programs with cache resets, synchronous loads and
    chunks of one or three blocks pass both loops over the hybrid cache, windows of 3 and 8."""
    fixes = ["no-pointless-hit", "forget-stale-window", "whole-window-chunks"]
    options = LoopOptions(
        sliding_window=3 if blocks_per_chunk == 1 else 8,
        offload_chunks=8,
        offload_outputs=True,
        offload_sync_loads=True,
        offload_blocks_per_chunk=blocks_per_chunk,
        cache_resets=True,
        fix=make_fixes(fixes),
    )
    totals = _totals(options)
    assert totals["cache_resets"] > 0 and totals["offload_window_loaded_blocks"] > 0, totals


def test_the_window_fixes_change_nothing_where_their_findings_cannot_occur() -> None:
    """Without cache resets `forget-stale-window` changes no run, and without a sliding window
    neither fix does: the runs, path counts included, are vLLM's as released."""
    base = LoopOptions(offload_chunks=8, offload_outputs=True, offload_blocks_per_chunk=2)
    cases = [
        (replace(base, sliding_window=3), ["forget-stale-window"]),
        (base, ["forget-stale-window", "whole-window-chunks"]),
    ]
    for options, names in cases:
        released = replace(options, fix=make_fixes(["no-pointless-hit"]))
        fixed = replace(options, fix=make_fixes(["no-pointless-hit", *names]))
        for seed in range(PROGRAMS // 2):
            program = shared_prompt_program(seed)
            for async_scheduling in (False, True):
                assert run_loop(program, async_scheduling=async_scheduling, options=fixed) == (
                    run_loop(program, async_scheduling=async_scheduling, options=released)
                ), (seed, names)


def test_the_fixes_are_one_patch_of_vllms_file_and_refuse_another_connector(
    tmp_path: Path,
) -> None:
    """`scripts/engine_fixes_diff.py vllm-offloading` prints the edits the tests run: applied
    with `git apply -p1` to copies of vLLM's files, they give the very text the tests run. A
    scheduler without vLLM's offloading connector is refused, naming it."""
    names = OFFLOADING_FIXES.names
    if tracker_rebuilt():  # 0.34.0: the tracker's finding is gone, and the fix's place
        names = tuple(n for n in names if n != "count-recorded-stores")
    sources = OFFLOADING_FIXES.fixed_sources(names)
    patched = git_apply_to_copies(tmp_path, sources, OFFLOADING_FIXES.as_diff(names))
    assert patched == {module: fixed for module, (_, fixed) in sources.items()}
    text = next(iter(patched.values()))
    assert "group_state.block_ids[j] = 0" in text and "window\n" in text
    plain = RealVllmScheduler(CONFIG, lambda _event: None, SPACE_PREFIX).sched
    for apply in (apply_forget_stale_window, apply_whole_window_chunks):
        with pytest.raises(FixDoesNotApply, match="edits vLLM's offloading connector"):
            apply(plain)
