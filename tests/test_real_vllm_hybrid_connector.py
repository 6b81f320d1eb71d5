"""schedspec's KV connector on vLLM's hybrid KV cache (`LoopOptions(kv_connector=...,
sliding_window=W)`): a full-attention group beside a sliding-window group, the connector
declaring vLLM's `SupportsHMA` so that vLLM keeps the groups apart and hands it every group's
blocks (`integrations.vllm.kv_connector`).

Every transfer moves the same tokens' blocks in each group (a sliding window's null blocks
left out); `transfer_blocks_held`, `kv_written` and `cache_hit_written` read every group. Three
findings reproduce in vLLM 0.33.0 and 0.34.0 alike (docs/engines/vllm-kv.md, "A KV connector on a
hybrid cache"): a whole-request load recomputes its last token over the window's null block
(fix `hit-leaves-last-token`), a sliding window's admission cap counts null slots as held
blocks and the requests holding KV deadlock (fix `cap-blocks-held`), and a failed synchronous
load has no way to be reported on several groups (fix `hear-failed-sync-load`). Seeded bugs
show the connector's checks have teeth on both groups, and that a request the fix ends with an
error must hold a block of the failed load.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.patches import FixDoesNotApply
from integrations.vllm import MANIFEST
from integrations.vllm.adapter import SPACE_PREFIX, RealVllmScheduler
from integrations.vllm.cache_writes import CacheWrites
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, LoopOptions, core_program, run_loop
from integrations.vllm.hybrid_sync_load_fix import HYBRID_SYNC_LOAD, HYBRID_SYNC_LOAD_FIXES
from integrations.vllm.kv_connector import GroupBlocks, RemoteKv, Transfer
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.window_cap_fix import (
    WINDOW_CAP,
    WINDOW_CAP_FIXES,
    apply_window_cap_fix,
)
from integrations.vllm.window_hit_fix import WINDOW_HIT, WINDOW_HIT_FIXES
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.patch_check import git_apply_to_copies
from tests.tier import full_tier
from tests.vllm_seeded_bugs import (
    connector_loads_first_group_only,
    failed_load_fails_a_bystander,
    restart_skips_the_drain,
    window_freed_under_a_send,
)

ROOT = Path(__file__).resolve().parents[1]
#: Generated programs a test runs through both loops.
PROGRAMS = 40
#: The fixes of the findings that need no failed synchronous load.
FIXED = make_fixes([WINDOW_HIT, WINDOW_CAP])
#: All three findings' fixes.
ALL_FIXED = make_fixes([WINDOW_HIT, WINDOW_CAP, HYBRID_SYNC_LOAD])
#: The same under the recompute policy, with the six fixes of vLLM's own failed-load paths
#: (tests/test_real_vllm_kv_connector.py), which that policy needs.
ALL_FIXED_RECOMPUTE = make_fixes([*KV_LOAD_FIXES.names, WINDOW_HIT, WINDOW_CAP, HYBRID_SYNC_LOAD])

#: Finding 1 (docs/shrunk/vllm-window-whole-hit.json), shrunk from program 2 of
#: `--sliding-window 4 --kv-connector fail --kv-no-failed-loads`: r8's whole 4-token prompt
#: is loaded asynchronously; its window of 4 at 4 tokens leaves token 0 (block 0 of the window
#: group is null), then vLLM recomputes token 3, whose window reads token 0.
WHOLE_PROMPT_HIT = CoreProgram(
    ArConfig(block_size=1, num_blocks=5, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=5),
    arrivals=((ArRequest("r8", 4, 1),),),
    aborts=((),),
)
WHOLE_PROMPT_OPTIONS = LoopOptions(
    kv_connector="fail", kv_load_failures=False, sliding_window=4, draw_seed=2018563268
)

#: Finding 2 (docs/shrunk/vllm-window-cap.json), shrunk from program 1279 of
#: `--sliding-window 4 --kv-connector fail --kv-no-failed-loads --fix hit-leaves-last-token`
#: (its first fix made): r2 loads 16 of its
#: 17 tokens, r3 then 11 of its 12 into what r2's reservation leaves; r2, loaded, heads the
#: queue and needs two blocks (one per group), the pool has one; r3, loaded, needs none.
CAPPED_RESERVATION = CoreProgram(
    ArConfig(
        block_size=4, num_blocks=6, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=18
    ),
    arrivals=((ArRequest("r2", 17, 1),), (ArRequest("r3", 12, 1),)),
    aborts=((), ()),
)
CAPPED_OPTIONS = LoopOptions(
    kv_connector="fail",
    kv_load_failures=False,
    sliding_window=4,
    draw_seed=3062951287,
    fix=make_fixes([WINDOW_HIT]),
)

#: Finding 3, shrunk from program 591 of `--sliding-window 4 --kv-connector fail --fix
#: hit-leaves-last-token`: r1's synchronous load of 12 tokens fails as a whole; r2 shares r1's
#: prompt and hits r1's blocks once r1 has finished.
SHARED_PROMPT = tuple(range(100, 113))
FAILED_SYNC_LOAD = CoreProgram(
    ArConfig(
        block_size=4,
        num_blocks=5,
        max_num_batched_tokens=1,
        max_num_seqs=1,
        max_model_len=14,
        enable_prefix_caching=True,
    ),
    arrivals=(
        (
            ArRequest("r1", 13, 1, prompt=SHARED_PROMPT),
            ArRequest("r2", 13, 1, prompt=SHARED_PROMPT),
        ),
    ),
    aborts=((),),
)
FAILED_SYNC_OPTIONS = LoopOptions(
    kv_connector="fail", sliding_window=4, draw_seed=897277174, fix=make_fixes([WINDOW_HIT])
)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _violation(program: CoreProgram, options: LoopOptions, async_scheduling: bool) -> Any:
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(program, async_scheduling=async_scheduling, options=options)
    return err.value


def _run(program: CoreProgram, options: LoopOptions, async_scheduling: bool) -> Any:
    return run_loop(program, async_scheduling=async_scheduling, options=options)


def _passes(program: CoreProgram, options: LoopOptions) -> None:
    for async_scheduling in (False, True):
        run = run_loop(program, async_scheduling=async_scheduling, options=options)
        assert set(run.reasons.values()) <= {"length", "stop"}, run


# ---------------------------------------------------------------- the connector's side


def test_a_transfer_moves_each_groups_blocks_of_its_tokens() -> None:
    """On a hybrid cache a load takes, in every group, the blocks holding its tokens in that
    group's block size, the null block as None; a send keeps every group's blocks, vLLM's null
    block (id 0) as None; the blocks a transfer holds are all of them but the null ones."""
    remote = RemoteKv(7, 2)
    remote.serve_groups((2, 4))
    request = SimpleNamespace(request_id="r0", num_tokens=9, num_prompt_tokens=9)
    remote.matched(request, 2)  # computed tokens 0..1 locally
    remote.allocated(request, [10, 11, 12, 13], 5, groups=[[None, 21, 22]])
    load = remote.in_flight[("load", "r0")]
    # tokens 2..6: blocks 1..3 of size 2, blocks 0..1 of size 4 (block 0 null)
    assert (load.first, load.blocks) == (1, (11, 12, 13))
    assert load.groups == (GroupBlocks(1, 0, (None, 21)),)
    assert load.all_blocks() == (11, 12, 13, 21)
    send = Transfer("send", "r1", request, (30, 31), 0, groups=(GroupBlocks(1, 0, (None, 32)),))
    free = {32}
    with pytest.raises(EngineCoreViolation, match="block 32 is free, but the send of 'r1'"):
        remote.in_flight[("send", "r1")] = send
        remote.check_held(free, {"r1": (30, 31)}, "here")


def test_a_failed_block_is_reported_as_a_failed_load_on_several_groups() -> None:
    """vLLM raises on `invalid_block_ids` with several KV cache groups and asks connectors for
    `failed_recving`: a load drawn to fail in one block fails as a whole there, and a
    synchronous one is reported so too (marked `lost`), where one group reports its block."""

    class OneBlockFails(RemoteKv):
        def outcome(self, load: Transfer) -> str | int:
            return 0

    outputs = SimpleNamespace(KVConnectorOutput=lambda **kw: SimpleNamespace(**kw))
    for groups, sync in (((2,), False), ((2,), True), ((2, 2), False), ((2, 2), True)):
        remote = OneBlockFails(1, 2)
        remote.serve_groups(groups)
        request = SimpleNamespace(request_id="r0", num_tokens=5, num_prompt_tokens=5)
        load = Transfer("load", "r0", request, (3, 4), 0, sync=sync)
        remote._register(load)
        remote.metadata()
        load.started = load.due = 1
        reported, loaded = remote.execute(SimpleNamespace(transfers=[]), outputs)
        if len(groups) == 1:
            assert reported.invalid_block_ids == {3} and not reported.failed_recving
            assert loaded == [load] and load.bad == 0 and not load.lost
        else:
            assert reported.failed_recving == {"r0"} and not reported.invalid_block_ids
            assert load.bad is None and load.lost == sync and loaded == ([load] if sync else [])


def test_vllm_keeps_the_groups_apart_beside_the_connector_and_it_moves_both() -> None:
    """Served as vLLM serves an HMA connector: the scheduler keeps two groups, the trace shows
    loads and sends naming the window group's blocks (null where the window has left them),
    and the run counts its loads."""
    trace: list[str] = []
    options = replace(WHOLE_PROMPT_OPTIONS, fix=FIXED, trace=trace)
    run = run_loop(WHOLE_PROMPT_HIT, async_scheduling=True, options=options)
    assert run.loads == 1 and run.reasons == {"r8": "length"}, run
    (load,) = [line for line in trace if "asynchronous load of r8" in line]
    # with the fix r8 loads tokens 0..2, and its window (4 tokens at 3 computed) keeps them all
    assert "r8's tokens 0..2 into blocks" in load and "group 1: [" in load, trace
    assert "null" not in load, load
    sends: list[str] = []
    for seed in range(PROGRAMS):
        trace = []
        run_loop(
            core_program(seed),
            async_scheduling=True,
            options=replace(WHOLE_PROMPT_OPTIONS, fix=FIXED, trace=trace, draw_seed=None),
        )
        sends += [line for line in trace if "connector: send of" in line and "group 1:" in line]
    assert any("'null'" in line for line in sends), sends[:5]


def test_connector_programs_pass_on_a_hybrid_cache_with_the_fixes() -> None:
    """The first programs pass both loops with both fixes, loads failing or not (the failures
    asynchronous: a failed synchronous load is finding 3), under either failure policy."""
    for options in (
        LoopOptions(kv_connector="fail", kv_load_failures=False, sliding_window=3, fix=FIXED),
        LoopOptions(kv_connector="fail", kv_sync_loads=False, sliding_window=3, fix=FIXED),
        LoopOptions(kv_connector="fail", kv_role="kv_producer", sliding_window=3, fix=FIXED),
    ):

        def both(seed: int, checked: LoopOptions = options) -> None:
            for loop in (False, True):
                run_loop(core_program(seed), async_scheduling=loop, options=checked)

        assert first_violations(PROGRAMS, both) == {}, options


# ---------------------------------------------------------------- seeded bugs


@pytest.mark.parametrize(
    ("mutant", "rule", "words"),
    [
        (connector_loads_first_group_only, "cache_hit_written", "(in KV cache group 1)"),
        (window_freed_under_a_send, "transfer_blocks_held", "is free, but the send of"),
    ],
)
def test_the_connector_checks_catch_a_seeded_bug_in_either_group(
    mutant: Any, rule: str, words: str
) -> None:
    """A connector that loads the full-attention group only leaves the window's blocks
    unwritten, and a request starting from them breaks `cache_hit_written` in group 1; a
    scheduler that frees a sent request's window blocks while
    its send reads them breaks `transfer_blocks_held`. The asynchronous loop (where the seeded
    bug is planted) fails within the first programs; the synchronous one, the control, passes
    them."""
    base = LoopOptions(kv_connector="fail", kv_load_failures=False, sliding_window=3, fix=FIXED)
    mutated = replace(base, mutate=mutant)
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(core_program(seed), async_scheduling=True, options=mutated),
        until=rule,
    )
    assert rule in seen and words in seen[rule], seen
    assert (
        first_violations(
            PROGRAMS,
            lambda seed: run_loop(core_program(seed), async_scheduling=False, options=mutated),
        )
        == {}
    )


# ---------------------------------------------------------------- the findings


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finding_a_whole_request_load_recomputes_its_last_token_over_a_null_block(
    async_scheduling: bool,
) -> None:
    """Finding 1: r8's whole prompt is loaded; the window group is allocated for 4 computed
    tokens (token 0 left the window: its block is null); vLLM then computes token 3 again,
    whose window reads token 0 from the null block. With `hit-leaves-last-token` the load stops
    at token 2 and the window keeps token 0; with one group (no window) it passes as released."""
    err = _violation(WHOLE_PROMPT_HIT, WHOLE_PROMPT_OPTIONS, async_scheduling)
    assert err.rule == "kv_covers_scheduled", err
    assert (
        "'r8' is scheduled from token 3 with a window of 4 tokens, but holds the null block "
        "as its block 0 in KV cache group 1" in err.detail
    ), err
    _passes(WHOLE_PROMPT_HIT, replace(WHOLE_PROMPT_OPTIONS, fix=make_fixes([WINDOW_HIT])))
    _passes(WHOLE_PROMPT_HIT, replace(WHOLE_PROMPT_OPTIONS, sliding_window=None))


def test_finding_a_capped_reservation_strands_the_requests_holding_kv() -> None:
    """Finding 2 (the synchronous loop; the asynchronous one orders the loads otherwise and
    passes): with the window's cap counting r2's three null slots as held blocks, r3's load is
    admitted into blocks r2's next step needs; r2 heads the queue short of a block, r3 waits
    behind it though it needs none, and nothing runs again. The scheduler at the stall says
    why: the capped count vLLM reserved by is below what the step allocates. With
    `cap-blocks-held` both finish."""
    held: dict[str, Any] = {}

    def keep(sched: Any) -> None:
        assert CAPPED_OPTIONS.fix is not None
        CAPPED_OPTIONS.fix(sched)
        held["sched"] = sched

    err = _violation(CAPPED_RESERVATION, replace(CAPPED_OPTIONS, fix=keep), False)
    assert err.rule == "progress" and "0 running, 2 waiting" in err.detail, err
    sched = held["sched"]
    window = sched.kv_cache_manager.coordinator.single_type_managers[1]
    r2 = sched.requests["r2"]
    assert r2.num_computed_tokens == 16 and window.max_admission_blocks_per_request == 2
    assert [b.is_null for b in window.req_to_blocks["r2"]] == [True, True, True, False]

    def count(cap: bool) -> int:
        return int(
            window.get_num_blocks_to_allocate(
                request_id="r2",
                num_tokens=17,
                new_computed_blocks=[],
                total_computed_tokens=16,
                num_local_computed_tokens=16,
                num_tokens_main_model=17,
                apply_admission_cap=cap,
            )
        )

    assert (count(True), count(False)) == (0, 1)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 1
    _passes(CAPPED_RESERVATION, replace(CAPPED_OPTIONS, fix=FIXED))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finding_a_failed_synchronous_load_goes_unheard_on_a_hybrid_cache(
    async_scheduling: bool,
) -> None:
    """Finding 3: r1's synchronous load fails as a whole. On several groups vLLM refuses
    `invalid_block_ids` ("Connectors must report failed requests via ... failed_recving
    instead"), and reads `failed_recving` only for requests waiting for an asynchronous load:
    r1, running, finishes on KV that nothing wrote, even under the "fail" policy, and its blocks
    are cached; r2 hits them (`cache_hit_written`). With one group the same failure, reported
    as its first block, ends r1 with an error, and r2, sharing that block, too (the "fail"
    policy). The candidate fix `hear-failed-sync-load` is tested below."""
    err = _violation(FAILED_SYNC_LOAD, FAILED_SYNC_OPTIONS, async_scheduling)
    assert err.rule == "cache_hit_written", err
    assert (
        "'r2' starts from the prefix cache with block 1 as its block 0, but no batch wrote it"
        in err.detail
    )
    for loop in (False, True):
        run = run_loop(
            FAILED_SYNC_LOAD,
            async_scheduling=loop,
            options=replace(FAILED_SYNC_OPTIONS, sliding_window=None),
        )
        assert run.reasons == {"r1": "error", "r2": "error"} and run.blocks_invalid == 1, run


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_fix_hears_a_failed_synchronous_load_under_either_policy(
    async_scheduling: bool,
) -> None:
    """Finding 3 with `hear-failed-sync-load`: the step's failed synchronous load, reported in
    `failed_recving`, ends r1 with an error under "fail", as one group does (r2's own load
    fails too with these draws); under "recompute" r1 is preempted (the next call reports it)
    and loads again until a load succeeds, and both requests produce their tokens."""
    fail = _run(FAILED_SYNC_LOAD, replace(FAILED_SYNC_OPTIONS, fix=ALL_FIXED), async_scheduling)
    assert fail.reasons == {"r1": "error", "r2": "error"} and fail.loads_failed == 2, fail
    trace: list[str] = []
    recompute = _run(
        FAILED_SYNC_LOAD,
        replace(
            FAILED_SYNC_OPTIONS, kv_connector="recompute", fix=ALL_FIXED_RECOMPUTE, trace=trace
        ),
        async_scheduling,
    )
    assert recompute.reasons == {"r1": "length", "r2": "length"}, recompute
    assert recompute.loads_failed >= 1 and recompute.sync_loads > recompute.loads_failed
    assert any("preempted ['r1']" in line for line in trace), trace


#: Shrunk from program 1 of `--kv-connector recompute --sliding-window 3 --pipeline-parallel 2`
#: with the nine fixes (vLLM 0.34.0): r1's synchronous load fails, r1 decodes once more before
#: the failure is heard, and is preempted to recompute with that step still in flight.
PIPELINED_RESTART = CoreProgram(
    ArConfig(block_size=1, num_blocks=6, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=4),
    arrivals=((ArRequest("r0", 1, 1), ArRequest("r1", 2, 2)),),
    aborts=((),),
)


def test_with_pipeline_stages_a_restarted_request_waits_for_its_dropped_steps() -> None:
    """With two pipeline stages the fix preempts r1 while a decode step of it is in flight; it
    resumes only once that step has drained, as vLLM holds back a request whose stale output is
    in flight, and the run passes. The seeded bug resuming it at once decodes r1 in two
    consecutive steps (`pp_cadence`: fewer than pipeline_parallel_size=2 apart)."""
    options = LoopOptions(
        kv_connector="recompute",
        sliding_window=3,
        pipeline_parallel_size=2,
        draw_seed=52307625,
        fix=ALL_FIXED_RECOMPUTE,
    )
    run = _run(PIPELINED_RESTART, options, True)
    assert run.reasons == {"r0": "length", "r1": "length"}, run
    err = _violation(PIPELINED_RESTART, replace(options, mutate=restart_skips_the_drain), True)
    assert err.rule == "pp_cadence" and "fewer than pipeline_parallel_size=2 apart" in err.detail


def test_with_the_fix_programs_whose_synchronous_loads_fail_pass_under_either_policy() -> None:
    """The first programs, synchronous loads failing as a whole among the draws, pass both loops
    with the three fixes, under "fail" and under "recompute" (there with vLLM's six failed-load
    fixes); without `hear-failed-sync-load` some of them break `kv_written` or
    `cache_hit_written` (the control)."""
    for policy, fixed, without in (
        ("fail", ALL_FIXED, FIXED),
        (
            "recompute",
            ALL_FIXED_RECOMPUTE,
            make_fixes([*KV_LOAD_FIXES.names, WINDOW_HIT, WINDOW_CAP]),
        ),
    ):
        options = LoopOptions(kv_connector=policy, sliding_window=4, fix=fixed)

        def both(seed: int, checked: LoopOptions = options) -> None:
            for loop in (False, True):
                run_loop(core_program(seed), async_scheduling=loop, options=checked)

        assert first_violations(PROGRAMS, both) == {}, policy
        control = replace(options, fix=without)

        def sync_loop(seed: int, checked: LoopOptions = control) -> None:
            run_loop(core_program(seed), async_scheduling=False, options=checked)

        seen = first_violations(PROGRAMS, sync_loop)
        assert set(seen) & {"kv_written", "cache_hit_written"}, (policy, seen)


def test_a_request_the_fix_fails_must_hold_a_block_of_the_failed_load() -> None:
    """Seeded bug: the fix ending every running request with an error when one synchronous
    load fails, holders of its blocks or not. A request ended so without holding one of the
    load's blocks (or one its loader computed over them) breaks `output_content`: the check
    lets an error end only the requests that lost KV. The synchronous loop, the control,
    passes."""
    options = LoopOptions(
        kv_connector="fail", sliding_window=4, fix=ALL_FIXED, mutate=failed_load_fails_a_bystander
    )
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(core_program(seed), async_scheduling=True, options=options),
        until="output_content",
    )
    assert "output_content" in seen and "expected" in seen["output_content"], seen
    assert (
        first_violations(
            PROGRAMS,
            lambda seed: run_loop(core_program(seed), async_scheduling=False, options=options),
        )
        == {}
    )


# the full tier's: the script's figures; per push the paths are counted in-process above
@full_tier
def test_the_path_count_script_prints_a_row_per_policy() -> None:
    """`scripts/vllm_failed_sync_load_paths.py` counts the fix's paths over a few programs: a
    row per policy, the synchronous loads heard among them; an empty run is refused (exit 2,
    one line)."""
    script = [sys.executable, "scripts/vllm_failed_sync_load_paths.py", "--programs"]
    res = subprocess.run([*script, "20"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines()[1:]}
    assert set(rows) == {"recompute", "fail"} and int(rows["recompute"][0]) > 0, res.stdout
    bad = subprocess.run([*script, "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr


def test_a_lost_load_forgets_the_loaders_writes_since_its_batch_only() -> None:
    """The check's record after a synchronous load fails as a whole on a hybrid cache: the
    loader's blocks from the load's first on, in each group, hold nothing valid, among the
    writes recorded since the load's batch was scheduled; what the loader wrote in an earlier
    run (before a preemption), and another request's write, keep theirs."""
    loader = SimpleNamespace(request_id="r3", block_hashes=[])
    writes = CacheWrites(1, every_read=True, group_block_sizes=(1, 1))
    writes.put(16, (loader, 2))  # an earlier run computed its block 2
    writes.put(4, (loader, 0), group=1)
    since = writes.puts
    writes.put(8, (loader, 2))  # the load's block 2, group 0
    writes.put(5, (loader, 2), group=1)  # and in the window group
    writes.put(9, (loader, 3))  # computed over it in the same batch
    writes.put(1, (loader, 0))  # the loader's prefix, below the load
    writes.forget_lost_load(loader, {0: 2, 1: 2}, since=since)
    assert sorted(writes.written) == [1, 4, 16]


# ---------------------------------------------------------------- the fixes and refusals


def test_the_fixes_are_edits_of_vllms_files(tmp_path: Path) -> None:
    """Each fix is one edit of the installed vLLM's own file, applied by `git apply`; the cap's
    fix refuses a scheduler without a sliding window (nothing to edit)."""
    for fixes, marker in (
        (WINDOW_HIT_FIXES, "last_token = request.num_tokens - 1"),
        (WINDOW_CAP_FIXES, "self.get_num_skipped_tokens(total_computed_tokens)"),
        (HYBRID_SYNC_LOAD_FIXES, "self._handle_failed_sync_loads(failed_sync_loads)"),
    ):
        sources = fixes.fixed_sources(fixes.names)
        patched = git_apply_to_copies(
            tmp_path / fixes.names[0], sources, fixes.as_diff(fixes.names)
        )
        assert patched == {module: fixed for module, (_, fixed) in sources.items()}
        assert marker in next(iter(patched.values()))
    config = ArConfig(
        block_size=2,
        num_blocks=8,
        max_num_batched_tokens=4,
        max_num_seqs=2,
        max_model_len=8,
        enable_prefix_caching=True,
    )
    plain = RealVllmScheduler(config, lambda _event: None, SPACE_PREFIX).sched
    with pytest.raises(FixDoesNotApply, match="has no such group"):
        apply_window_cap_fix(plain)


def test_the_offload_store_beside_a_window_and_the_cap_fix_without_one_are_refused() -> None:
    """The offload store keys what it holds by the full-attention group's hashes: beside a
    window the loop refuses it (`ConfigError`), and the check script says so (exit 2, one
    line), as it does for `--fix cap-blocks-held` without a window (nothing to edit)."""
    with pytest.raises(ConfigError, match="'draws' beside sliding_window"):
        run_loop(
            WHOLE_PROMPT_HIT,
            async_scheduling=False,
            options=replace(WHOLE_PROMPT_OPTIONS, kv_store="offload"),
        )
    for args in (
        ["--sliding-window", "3", "--kv-connector", "fail", "--kv-store", "offload"],
        ["--fix", WINDOW_CAP],
    ):
        res = subprocess.run(
            [sys.executable, "scripts/vllm_async_check.py", "--programs", "1", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert "error: --sliding-window" in last or f"error: --fix {WINDOW_CAP}" in last, last
