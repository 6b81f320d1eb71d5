"""vLLM 0.33.0's KV cache events, checked as a KV-aware router reads them
(`LoopOptions(kv_events=True)`, `integrations.vllm.kv_events`): after every
`update_from_output`, the keys the published events leave cached, copies counted, are exactly
the keys of the prefix cache. Released vLLM passes over branching prompts, one group or
hybrid; two seeded bugs (an eviction not announced, stores not announced) fail the rule with
messages naming the key; programs do hold one key in two blocks at once, which is why the
reader counts copies; and the "full" report mode, which announces a hit as a store, leaves a
counting reader one copy too many (known upstream). The reader itself is checked without
vLLM.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1
(the reader's own tests run without it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.patches import FixDoesNotApply
from integrations.vllm import MANIFEST
from integrations.vllm.adapter import SPACE_PREFIX, OffloadingOptions, RealVllmScheduler
from integrations.vllm.branching_prompt_programs import branching_prompt_program
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, CoreRun, LoopOptions, run_loop
from integrations.vllm.kv_events import KvEventView, check_kv_events, pool_keys
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.offload_events_fix import MANAGER_MODULE
from integrations.vllm.offload_hit_fix import give_methods
from integrations.vllm.offload_restore_fix import tracker_rebuilt
from integrations.vllm.offload_window_fixes import OFFLOADING_FIXES
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.test_real_vllm_hybrid_loop import CONFIG
from tests.vllm_seeded_bugs import later_stores_not_announced, removal_not_announced

PROGRAMS = 60
EVENTS = LoopOptions(kv_events=True)


def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _run(seed: int, async_scheduling: bool, options: LoopOptions) -> CoreRun | None:
    """Branching-prompt program `seed` with prefix caching through one loop (None without)."""
    program = branching_prompt_program(seed)
    if not program.config.enable_prefix_caching:
        return None
    try:
        return run_loop(program, async_scheduling=async_scheduling, options=options)
    except ConfigError as err:  # a Mamba group needs chunked prefill with prefix caching
        assert err.field == "mamba", err
        return None


@pytest.mark.parametrize(
    "options",
    [
        EVENTS,
        replace(EVENTS, sliding_window=3),
        replace(EVENTS, mamba=True, mamba_block_scale=2),
        replace(EVENTS, cache_resets=True),
    ],
    ids=["one-group", "window", "mamba", "cache-resets"],
)
def test_released_vllm_announces_its_prefix_cache_exactly(options: LoopOptions) -> None:
    """The first branching programs with prefix caching pass both loops with the events on,
    blocks announced stored and removed (and, with cache resets, cleared). With full attention
    alone every store's parent key is cached when it arrives (a radix-tree router files each
    under its parent); a sliding window's or Mamba group's store follows blocks it skipped,
    so its parent is one no event stored."""
    _vllm()
    runs = [
        run
        for seed in range(PROGRAMS)
        for async_scheduling in (False, True)
        if (run := _run(seed, async_scheduling, options)) is not None
    ]
    assert runs
    assert sum(r.events_stored for r in runs) and sum(r.events_removed for r in runs)
    if options.cache_resets:
        assert sum(r.events_cleared for r in runs)
    orphans = sum(r.events_orphan_stores for r in runs)
    assert (orphans > 0) == (options.sliding_window is not None or options.mamba), orphans


def test_one_key_is_held_by_two_blocks_so_the_reader_counts_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM caches a block without looking for an identical one (its block tables are
    append-only), so one key is held by two blocks at times, each stored and removed on its
    own: a reader that dropped a key at its first removal would lose a key still cached. The
    programs reach that, and pass with copies counted."""
    _vllm()
    both: list[int] = []

    def counting(view: KvEventView, sched: Any, kv_utils: Any, where: str) -> None:
        both.extend(1 for n in view.copies.values() if n > 1)
        check_kv_events(view, sched, kv_utils, where)

    monkeypatch.setattr("integrations.vllm.engine_core.check_kv_events", counting)
    for seed in range(PROGRAMS):
        _run(seed, True, EVENTS)
    assert both


#: (seeded bug, the rule it fails, words of the message).
SEEDED_BUGS: list[tuple[Callable[[Any], None], str, tuple[str, ...]]] = [
    (removal_not_announced, "kv_events", ("leave", "cached that the prefix cache no longer holds")),
    (later_stores_not_announced, "kv_events", ("the prefix cache holds", "do not leave cached")),
]


@pytest.mark.parametrize(("bug", "rule", "words"), SEEDED_BUGS, ids=["removal", "store"])
def test_events_that_miss_a_change_are_caught(
    bug: Callable[[Any], None], rule: str, words: tuple[str, ...]
) -> None:
    """Seeded bugs: an eviction whose `BlockRemoved` is never queued (a router keeps the key),
    and stores announced only for a request's first blocks (a router never learns the rest).
    Each fails `kv_events`, naming the key's group and its tokens or blocks."""
    _vllm()
    options = replace(EVENTS, mutate=bug)
    seen = first_violations(PROGRAMS, lambda seed: _run(seed, True, options), until=rule)
    assert rule in seen, seen
    assert all(w in seen[rule] for w in words), seen
    assert "of KV cache group 0" in seen[rule], seen


#: `scripts/vllm_shrink.py --seed 8 --loop sync --rule kv_events --programs-from
#: branching-prompts --kv-events --kv-report-full`: r3 (more urgent) preempts r1, which resumes
#: from its own cached blocks.
RESUMED_FROM_ITS_OWN_BLOCKS = CoreProgram(
    ArConfig(
        block_size=1,
        num_blocks=16,
        max_num_batched_tokens=6,
        max_num_seqs=2,
        max_model_len=11,
        policy=Policy.PRIORITY,
        enable_prefix_caching=True,
    ),
    arrivals=((ArRequest("r1", 7, 2, priority=3),), (ArRequest("r3", 8, 3),)),
    aborts=((), ()),
)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_known_upstream_full_report_mode_announces_a_hit_as_a_store(
    async_scheduling: bool,
) -> None:
    """vLLM 0.33.0, `kv_cache_report_mode="full"`: a request that hits the prefix cache gets a
    `BlockStored` for each block its hit reuses (`emit_cached_block_events`), the same event a
    newly cached copy gets (open: vLLM PR #51699 proposes telling them apart). A reader that
    counts copies, as routers must since vLLM announces each copy of a key, then counts one
    copy too many: when the one block holding the key is evicted, the key stays cached for the
    router. Here r1, preempted by r3, resumes from its own blocks, and one of them is later
    evicted (`kv_events`). With the default "incremental" mode the program passes."""
    _vllm()
    options = replace(EVENTS, kv_report_mode="full")
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(RESUMED_FROM_ITS_OWN_BLOCKS, async_scheduling=async_scheduling, options=options)
    assert err.value.rule == "kv_events", err.value
    assert "no longer holds" in err.value.detail and "1 copy(ies) left" in err.value.detail
    run_loop(RESUMED_FROM_ITS_OWN_BLOCKS, async_scheduling=async_scheduling, options=EVENTS)


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"kv_events": "yes"}, "kv_events"), ({"kv_report_mode": "full"}, "kv_report_mode")],
)
def test_bad_event_options_are_typed_errors(fields: dict[str, Any], field: str) -> None:
    """`kv_events` not a bool; a report mode other than the default without events on."""
    _vllm()
    with pytest.raises(ConfigError) as err:
        RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, **fields)
    assert err.value.field == field and err.value.valid, err.value


def test_the_check_script_checks_the_events(capsys: pytest.CaptureFixture[str]) -> None:
    _vllm()
    script = load_script("vllm_async_check")
    argv = ["--programs", "8", "--programs-from", "branching-prompts", "--kv-events"]
    assert script.main(argv) == 0
    out = capsys.readouterr().out
    assert "KV cache events checked" in out and "keys KV cache events announced stored" in out
    with pytest.raises(SystemExit) as leaving:
        script.main(["--programs", "1", "--kv-report-full"])
    assert leaving.value.code == 2
    assert "--kv-report-full: only with --kv-events" in capsys.readouterr().err
    with pytest.raises(SystemExit) as leaving:
        script.main(["--programs", "1", "--kv-events", "--offload-self-describing-events"])
    assert leaving.value.code == 2
    assert "only with --offload-chunks and --kv-events" in capsys.readouterr().err


# ------------------------------------------------------------------ the reader, without vLLM
def _event(kind: str, **fields: Any) -> Any:
    """An event whose class is named as vLLM's `kind` (the reader reads the name)."""
    event = type(kind, (), {})()
    for name, value in fields.items():
        setattr(event, name, value)
    return event


def _fake_sched(held: dict[tuple[int, int], list[int]]) -> tuple[Any, Any]:
    """A scheduler whose pool caches `held` ((key, group) -> block ids), and kv_utils whose
    full keys are those pairs."""
    cache = {
        key: {b: SimpleNamespace(block_id=b) for b in blocks}
        if len(blocks) > 1
        else SimpleNamespace(block_id=blocks[0])
        for key, blocks in held.items()
    }
    pool = SimpleNamespace(cached_block_hash_to_block=SimpleNamespace(_cache=cache))
    sched = SimpleNamespace(kv_cache_manager=SimpleNamespace(block_pool=pool))
    kv_utils = SimpleNamespace(
        maybe_convert_block_hash=lambda h: h,
        get_block_hash=lambda k: k[0],
        get_group_id=lambda k: k[1],
    )
    return sched, kv_utils


def test_pool_keys_follow_the_setting_that_names_keys_by_integers() -> None:
    """The pool's keys are converted as vLLM's conversion says under the setting read at the
    call (keys already converted under another setting are not reused)."""
    sched, kv_utils = _fake_sched({(7, 0): [3], (9, 1): [4, 5]})
    kv_utils.envs = SimpleNamespace(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=False)
    kv_utils.maybe_convert_block_hash = lambda h: (
        -h if kv_utils.envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES else h
    )
    assert pool_keys(sched, kv_utils) == {(7, 0): [3], (9, 1): [4, 5]}
    kv_utils.envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
    assert pool_keys(sched, kv_utils) == {(-7, 0): [3], (-9, 1): [4, 5]}
    kv_utils.envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False
    assert pool_keys(sched, kv_utils) == {(7, 0): [3], (9, 1): [4, 5]}


def test_the_reader_counts_copies_and_compares_both_ways() -> None:
    """Two stores of key 7 and one removal leave it cached; a removal of a key with no copy
    is ignored; a reset clears all; a CPU-tier event counts in the CPU tier's view; a store
    whose tokens span a skipped block is counted as sparse. The check passes on the same keys
    and names a key missing either way."""
    view = KvEventView()
    store = {"token_ids": [1, 2], "block_size": 2, "group_idx": 0, "medium": "GPU"}
    view.apply(_event("BlockStored", block_hashes=[7], **store))
    view.apply(_event("BlockStored", block_hashes=[7], **store))
    view.apply(_event("BlockRemoved", block_hashes=[7], group_idx=0, medium="GPU"))
    view.apply(_event("BlockStored", block_hashes=[9], **{**store, "medium": "CPU"}))
    view.apply(_event("BlockStored", block_hashes=[8], **{**store, "token_ids": [1, 2, 3, 4]}))
    view.apply(_event("BlockRemoved", block_hashes=[5], group_idx=0, medium="GPU"))
    assert view.cached() == {(7, 0), (8, 0)} and view.copies[(5, 0)] == 0  # unknown: ignored
    assert view.cpu_copies == {(9, 0): 1}
    assert (view.stored, view.removed, view.other_media, view.sparse_stores) == (3, 2, 1, 1)
    check_kv_events(view, *_fake_sched({(7, 0): [3, 5], (8, 0): [4]}), "here")
    with pytest.raises(EngineCoreViolation) as gone:
        check_kv_events(view, *_fake_sched({(7, 0): [3]}), "here")
    assert "no longer holds" in gone.value.detail and "[1, 2, 3, 4]" in gone.value.detail
    with pytest.raises(EngineCoreViolation) as unseen:
        check_kv_events(view, *_fake_sched({(7, 0): [3], (8, 0): [4], (6, 1): [2]}), "here")
    assert "of KV cache group 1, in block(s) [2]" in unseen.value.detail, unseen.value
    view.apply(_event("AllBlocksCleared"))
    assert view.cached() == set() and not view.cpu_copies and view.cleared == 1


def test_the_reader_counts_stores_whose_parent_it_does_not_hold() -> None:
    """A store naming a parent key counts as an orphan (a radix-tree router skips it) unless
    the parent has a copy in its tier and group when it arrives: no parent, a parent stored
    before, one of another group, one removed, and the CPU tier counted apart."""
    view = KvEventView()
    store = {"token_ids": [1, 2], "block_size": 2, "group_idx": 0, "medium": "GPU"}
    view.apply(_event("BlockStored", block_hashes=[1], parent_block_hash=None, **store))
    view.apply(_event("BlockStored", block_hashes=[2], parent_block_hash=1, **store))
    assert view.orphan_stores == 0
    view.apply(
        _event("BlockStored", block_hashes=[3], parent_block_hash=1, **{**store, "group_idx": 1})
    )
    view.apply(_event("BlockRemoved", block_hashes=[2], group_idx=0, medium="GPU"))
    view.apply(_event("BlockStored", block_hashes=[4], parent_block_hash=2, **store))
    assert view.orphan_stores == 2
    cpu = {**store, "medium": "CPU"}
    view.apply(_event("BlockStored", block_hashes=[5], parent_block_hash=1, **cpu))
    view.apply(_event("BlockStored", block_hashes=[6], parent_block_hash=5, **cpu))
    assert (view.orphan_stores, view.cpu_orphan_stores) == (2, 1)


# ------------------------------------------------ the CPU tier of vLLM's offloading connector
#: docs/shrunk/vllm-offloading-reset-events.json: one request, its blocks offloaded chunk by
#: chunk, and a reset while it runs (the connector's draws seeded as recorded).
ONE_REQUEST_OFFLOADED = CoreProgram(
    ArConfig(block_size=2, num_blocks=4, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=7),
    arrivals=((ArRequest("r0", 1, 6),),),
    aborts=((),),
)
OFFLOADED = replace(
    EVENTS,
    offload_chunks=16,
    offload_outputs=True,
    cache_resets=True,
    fix=make_fixes(["no-pointless-hit"]),
    draw_seed=2896518988,
)


def test_finding_a_connector_reset_empties_the_cpu_tier_without_an_event() -> None:
    """vLLM 0.33.0, its offloading connector, KV cache events on: a reset with r0 running
    (`reset_prefix_cache(reset_connector=True)`, as after a weight update) fails for the prefix
    cache, KV being in use, and resets the connector anyway. Its CPU manager drops the chunk
    whose store it announced and queues no event (an eviction queues one), and no
    `AllBlocksCleared` comes either: a router keeps the CPU-tier key (`kv_events`). With the
    candidate fix `announce-cpu-reset` the reset announces the removal of every chunk
    announced stored, and the program passes."""
    _vllm()
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(ONE_REQUEST_OFFLOADED, async_scheduling=False, options=OFFLOADED)
    assert err.value.rule == "kv_events", err.value
    words = ("leave cached in the CPU tier keys", "offloading connector no longer holds")
    assert all(w in err.value.detail for w in words), err.value
    fixed = replace(OFFLOADED, fix=make_fixes(["no-pointless-hit", "announce-cpu-reset"]))
    run_loop(ONE_REQUEST_OFFLOADED, async_scheduling=False, options=fixed)


def test_the_reset_fix_is_a_patch_of_the_cpu_manager_and_passes_generated_programs() -> None:
    """The fix prints as a diff of vLLM's `kv_offload/cpu/manager.py`; the CPU-tier keys are
    checked in generated programs (stores and removals announced), and with resets the
    programs pass with the fix."""
    _vllm()
    diff = OFFLOADING_FIXES.as_diff(["announce-cpu-reset"])
    assert "+++ b/vllm/v1/kv_offload/cpu/manager.py" in diff
    assert (
        "+            # Every stored chunk goes: announce its removal, as an eviction does." in diff
    )
    fixed = replace(OFFLOADED, fix=make_fixes(["no-pointless-hit", "announce-cpu-reset"]))
    cpu_events = 0
    for seed in range(12):
        for async_scheduling in (False, True):
            program = shared_prompt_program(seed)
            options = replace(fixed, draw_seed=None)
            cpu_events += run_loop(
                program, async_scheduling=async_scheduling, options=options
            ).events_other_media
    assert cpu_events


SELF_DESCRIBING = replace(
    EVENTS,
    offload_chunks=8,
    offload_blocks_per_chunk=2,
    offload_outputs=True,
    offload_self_describing_events=True,
    cache_resets=True,
)


def _manager_part_only(sched: Any) -> None:
    """`no-pointless-hit`, and of `announce-cpu-reset` only its edit of the CPU manager: the
    reset's removals are queued, but the connector drops their payloads before it translates
    them."""
    make_fixes(["no-pointless-hit"])(sched)  # type: ignore[misc]
    methods = OFFLOADING_FIXES.fixed_methods(("announce-cpu-reset",))
    edited = {m.split(".", 1)[1]: f for (where, m), f in methods.items() if where == MANAGER_MODULE}
    manager = sched.connector.connector_scheduler.manager
    give_methods(manager, edited)
    manager._announced_keys = {}


def test_with_self_describing_events_the_reset_is_translated_before_its_payloads_go() -> None:
    """With `self_describing_kv_events` the connector announces a chunk by its blocks' keys,
    from a payload it keeps per chunk and drops at a reset. As released, the reset leaves those
    keys cached for a router (the finding); with the whole fix the programs pass; with only its
    edit of the manager, the reset's removals are translated after the payloads are dropped,
    name the chunk's own key, and the blocks' keys stay cached (`kv_events` again)."""
    _vllm()
    released = replace(SELF_DESCRIBING, fix=make_fixes(["no-pointless-hit"]))
    fixed = replace(SELF_DESCRIBING, fix=make_fixes(["no-pointless-hit", "announce-cpu-reset"]))
    half = replace(SELF_DESCRIBING, fix=_manager_part_only)
    for options in (released, half):
        seen = first_violations(
            PROGRAMS,
            lambda seed, o=options: run_loop(  # type: ignore[misc]
                shared_prompt_program(seed), async_scheduling=True, options=o
            ),
            until="kv_events",
        )
        assert "kv_events" in seen and "in the CPU tier" in seen["kv_events"], seen
    for seed in range(PROGRAMS // 3):
        run_loop(shared_prompt_program(seed), async_scheduling=True, options=fixed)


def test_offloading_options_are_typed_errors() -> None:
    """Self-describing events without the offloading connector, or not a bool."""
    _vllm()
    with pytest.raises(ConfigError) as err:
        options = replace(EVENTS, offload_self_describing_events=True)
        run_loop(ONE_REQUEST_OFFLOADED, async_scheduling=False, options=options)
    assert err.value.field == "offload_chunks", err.value
    with pytest.raises(ConfigError) as err:
        OffloadingOptions(8, self_describing_events="yes")  # type: ignore[arg-type]
    assert err.value.field == "offloading.self_describing_events", err.value


#: docs/shrunk/vllm-offloading-restore-events.json (program 403, shrunk): a CPU chunk evicted
#: and stored again before the eviction's events are translated (the draws seeded as recorded).
RESTORED_AFTER_EVICTION = CoreProgram(
    ArConfig(
        block_size=1,
        num_blocks=28,
        max_num_batched_tokens=18,
        max_num_seqs=3,
        max_model_len=21,
        policy=Policy.PRIORITY,
    ),
    arrivals=(
        (ArRequest("r0", 1, 4),),
        (),
        (),
        (ArRequest("r6", 2, 3, prompt=(100, 101)),),
        (),
        (ArRequest("r8", 6, 15, prompt=tuple(range(100, 106))), ArRequest("r9", 2, 1)),
        (),
        (
            ArRequest("r11", 11, 3, priority=2, prompt=tuple(range(100, 111))),
            ArRequest("r12", 7, 9, prompt=tuple(range(100, 107))),
        ),
    ),
    aborts=((), (), (), (), (), (), (), ()),
)


def test_finding_a_chunk_evicted_and_stored_again_is_announced_without_its_blocks() -> None:
    """vLLM 0.33.0, its offloading connector with `self_describing_kv_events`, no reset
    (program 403, shrunk to six requests; synchronous loop): a CPU chunk is evicted and a
    store of the same chunk is scheduled before the eviction's events are translated. The
    connector's event tracker records the store's payload under the chunk's key, and the
    eviction's removal then takes that payload's one residency and drops it at the end of the
    batch; when the store completes, the chunk is announced by its own key alone, with no
    tokens, so a reader of blocks' keys never learns them again (`kv_events`: the manager holds
    the chunk, the events do not leave its blocks' keys cached). With the candidate fix
    `count-recorded-stores` (the tracker counts the stores it recorded, and only the last
    one's removal takes the residency) the program passes, and so does the unshrunk program
    403 (docs/engines/vllm-kv.md, "KV cache events")."""
    _vllm()
    options = replace(
        SELF_DESCRIBING,
        cache_resets=False,
        fix=make_fixes(["no-pointless-hit"]),
        draw_seed=877813787,
    )
    if tracker_rebuilt():
        # 0.34.0: both programs pass as released, and the fix has no place to go
        run_loop(RESTORED_AFTER_EVICTION, async_scheduling=False, options=options)
        run_loop(
            shared_prompt_program(403),
            async_scheduling=False,
            options=replace(options, draw_seed=None),
        )
        with pytest.raises(FixDoesNotApply, match="count-recorded-stores"):
            OFFLOADING_FIXES.as_diff(["count-recorded-stores"])
        return
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(RESTORED_AFTER_EVICTION, async_scheduling=False, options=options)
    assert err.value.rule == "kv_events", err.value
    assert "do not leave cached in the CPU tier keys" in err.value.detail, err.value
    fixed = replace(options, fix=make_fixes(["no-pointless-hit", "count-recorded-stores"]))
    run_loop(RESTORED_AFTER_EVICTION, async_scheduling=False, options=fixed)
    run_loop(
        shared_prompt_program(403),
        async_scheduling=False,
        options=replace(fixed, draw_seed=None),
    )


def test_the_store_count_fix_is_a_patch_of_the_event_tracker_and_composes() -> None:
    """`count-recorded-stores` prints as a diff of vLLM's `offloading/events.py` alone, and
    made with `announce-cpu-reset` (whose edit of the connector drains the tracker at a reset)
    the self-describing programs with resets pass in both loops."""
    _vllm()
    if tracker_rebuilt():
        # 0.34.0 needs no such fix (the finding's test); the programs pass with the other
        for seed in range(PROGRAMS // 6):
            for async_scheduling in (False, True):
                run_loop(
                    shared_prompt_program(seed),
                    async_scheduling=async_scheduling,
                    options=replace(
                        SELF_DESCRIBING, fix=make_fixes(["no-pointless-hit", "announce-cpu-reset"])
                    ),
                )
        return
    diff = OFFLOADING_FIXES.as_diff(["count-recorded-stores"])
    assert "+++ b/vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py" in diff
    assert "cpu/manager.py" not in diff and "offloading/scheduler.py" not in diff
    assert "+        self._primary_stores.clear()" in diff
    fixes = ["no-pointless-hit", "announce-cpu-reset", "count-recorded-stores"]
    fixed = replace(SELF_DESCRIBING, fix=make_fixes(fixes))
    for seed in range(PROGRAMS // 6):
        for async_scheduling in (False, True):
            run_loop(shared_prompt_program(seed), async_scheduling=async_scheduling, options=fixed)
