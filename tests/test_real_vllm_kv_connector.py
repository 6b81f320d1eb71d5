"""vLLM 0.33.0's KV connector path in its engine-core loop (`integrations.vllm.kv_connector`:
a real connector class that vLLM's own factory loads, a remote store and its worker), the
checks it adds, and its findings under `kv_load_failure_policy="recompute"`: a request whose
KV load failed counts its own reservation against itself when it loads again, and heads the
queue of requests holding KV when it no longer holds any, stranding the finished loads behind
it; blocks computed over a failed block stay in the prefix cache, even with the first fix of
that when the request that loaded it has ended; a second holder of a failed block reads it
before it is recomputed. (With drafts, a load that fills the pool is never admitted:
tests/test_real_vllm_draft_margin.py.) And one known upstream: under async scheduling a
failed synchronous load leaves the request's output placeholders counted (vLLM issue #45138),
which, with drafts and a producer's request finished by that stale output, also hands the
connector less than its prompt's KV (`kv_delivered`).

The first finding's program: one request r0, a 10-token prompt all in the remote store, a pool of 19
usable blocks of one token; r0's first load fails as a whole, under
`kv_load_failure_policy="recompute"`. vLLM frees r0's blocks but leaves it in
`_inflight_prefills`, reserving its 10 blocks; the store offers the hit again, so the retry is
an asynchronous load, admitted only into the free blocks less every reservation: 19 - 10 < 10.
r0 waits for ever, and the engine with it.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.patches import EngineFix
from integrations.vllm import MANIFEST, cache_writes
from integrations.vllm.adapter import SPACE, RealVllmScheduler
from integrations.vllm.cache_writes import CacheWrites
from integrations.vllm.draft_margin_fix import DRAFT_MARGIN_FIX
from integrations.vllm.engine_core import (
    RULES,
    CoreProgram,
    EngineCoreLoop,
    EngineCoreViolation,
    LoopOptions,
    core_program,
    program_seed,
    run_loop,
)
from integrations.vllm.kv_connector import RemoteKv, Transfer
from integrations.vllm.kv_load_fixes import (
    KV_LOAD_FIXES,
    STALE_AFTER_FAILED_LOAD_FIX,
    apply_drop_stale_reservation_fix,
    apply_kv_load_fixes,
    fix_as_diff,
)
from integrations.vllm.patches import SCHEDULER_MODULE, ScheduleFix
from integrations.vllm.spec_pad_fix import SPEC_PAD_FIX
from integrations.vllm.speculative import SpeculativeModel
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.tier import depth, full_tier

LOOPS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
#: The connector programs checked here (`core_program`), each through both loops: 40 in the
#: full tier, 20 per push.
PROGRAMS = range(depth(20, 40))


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


class _OneFailedLoad(RemoteKv):
    """r0's whole prompt is in the store; its first load fails as a whole, every transfer is
    reported in the batch that starts it, nothing is sent. With `reoffer` the store offers the
    hit again after the failure (vLLM's offloading connector looks every request up afresh);
    without it, once (a P/D decode instance's remote prefill)."""

    def __init__(self, *, reoffer: bool, block_size: int) -> None:
        super().__init__(0, block_size, sync_loads=False)
        self.reoffer: bool = reoffer

    def remote_tokens(self, request: Any) -> int:
        return int(request.num_prompt_tokens) if request.request_id == "r0" else 0

    def matched(self, request: Any, num_computed_tokens: int) -> int:
        if not self.reoffer and self.counts.loads:
            return 0
        return super().matched(request, num_computed_tokens)

    def produces(self, rid: str) -> bool:
        return False

    def delay(self, transfer: Transfer) -> int:
        return 0

    def outcome(self, load: Transfer) -> str | int:
        return "failed" if self.counts.loads_failed == 0 else "ok"


def _lone(prompt_len: int, block_size: int = 1, num_blocks: int = 20) -> CoreProgram:
    """r0 (`prompt_len` tokens, 3 new) alone, in a pool of `num_blocks` - 1 usable blocks of
    `block_size` tokens (default: 19 of one token)."""
    config = ArConfig(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=64,
        max_num_seqs=2,
        max_model_len=64,
        long_prefill_token_threshold=0,
        enable_chunked_prefill=True,
    )
    return CoreProgram(config, ((ArRequest("r0", prompt_len, 3),),), ((),))


def _loop(
    program: CoreProgram,
    async_scheduling: bool,
    *,
    reoffer: bool = True,
    mutate: Callable[[Any], None] | None = None,
) -> EngineCoreLoop:
    """The loop over `program` with `_OneFailedLoad`'s store, under the recompute policy."""
    config = program.config
    return EngineCoreLoop(
        config,
        async_scheduling=async_scheduling,
        kv_connector="recompute",
        remote_kv=_OneFailedLoad(reoffer=reoffer, block_size=config.block_size),
        mutate=mutate,
    )


@LOOPS
@pytest.mark.parametrize(
    "program",
    [_lone(10), _lone(40, block_size=16, num_blocks=6)],
    ids=["10-of-19-blocks-of-1", "3-of-5-blocks-of-16"],
)
def test_finding_a_retried_load_counts_its_own_reservation(
    program: CoreProgram, async_scheduling: bool
) -> None:
    """The engine never drains (`progress`): r0 waits holding nothing, its own reservation of
    all its prompt's blocks still counted, with every block free. At block size 16 the same:
    a 40-token prompt (3 blocks) in 5 usable blocks. vLLM 0.33.0 keeps the reservation in
    `_inflight_prefills`; 0.34.0 keeps a parked load's apart (`_parked_reservations`) and
    refreshes it when the load is promoted, to every block the request then needs."""
    loop = _loop(program, async_scheduling)
    with pytest.raises(EngineCoreViolation) as caught:
        loop.run(program)
    assert caught.value.rule == "progress", caught.value
    assert "0 running, 1 waiting" in caught.value.detail, caught.value.detail
    sched = loop.sched
    r0 = sched.requests["r0"]
    assert r0.status.name == "WAITING" and r0.num_computed_tokens == 0
    parked = getattr(sched, "_parked_reservations", None)
    assert r0 in (sched._inflight_prefills if parked is None else parked)
    config = program.config
    usable = config.num_blocks - 1
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == usable
    prompt_blocks = -(-program.arrivals[0][0].prompt_len // config.block_size)
    assert sched._inflight_prefill_reserved_blocks() == prompt_blocks
    assert usable < 2 * prompt_blocks
    assert loop.remote is not None and loop.remote.counts.loads_failed == 1


@LOOPS
def test_the_retry_gets_in_below_half_the_pool_or_as_a_local_prefill(
    async_scheduling: bool,
) -> None:
    """The controls: a 9-token prompt fits twice in 19 blocks (and at block size 16 a 40-token
    one in 6 usable blocks), and a store that does not offer the hit again makes the retry a
    local prefill, which no reservation gates."""
    controls = (
        (_lone(9), True),
        (_lone(40, block_size=16, num_blocks=7), True),
        (_lone(10), False),
    )
    for program, reoffer in controls:
        run = _loop(program, async_scheduling, reoffer=reoffer).run(program)
        assert len(run.outputs["r0"]) == 3 and run.reasons["r0"] == "length"
        assert run.loads_failed == 1 and run.loads == (2 if reoffer else 1)


@LOOPS
def test_the_drop_stale_reservation_fix_lets_the_retry_in(async_scheduling: bool) -> None:
    """With the fix (`drop-stale-reservation`) r0 loads again, and finishes."""
    loop = _loop(_lone(10), async_scheduling, mutate=apply_drop_stale_reservation_fix)
    run = loop.run(_lone(10))
    assert len(run.outputs["r0"]) == 3 and run.reasons["r0"] == "length"
    assert (run.loads, run.loads_failed) == (2, 1)


def test_the_fixes_are_edits_of_vllms_scheduler() -> None:
    """Ten hunks of vLLM 0.33.0's `scheduler.py`, one file: the promotion of a request whose
    load is done, what a load that failed as a whole leaves of its request, a failed block's
    sharers and a truncated request's steps in flight, two evictions, and the step's output
    handed to the handler of failed blocks, which evicts by it, with the state (set up in
    `__init__`, which `apply` sets on a built scheduler) and the method that evict an ended
    loader's later steps. On 0.34.0 the fixes as written for it: an eleventh hunk gives up the
    parked reservation at promotion, the requeued request is no longer counted as a load, and
    a resumed request is found among the new ones (0.34.0 has no `resumed_req_ids`)."""
    diff = fix_as_diff()
    assert diff.startswith("--- a/vllm/v1/core/sched/scheduler.py\n")
    parks = "self._reserve_parked(request)" in KV_LOAD_FIXES.installed_text(SCHEDULER_MODULE)
    assert diff.count("@@ ") == (11 if parks else 10)
    assert ("+                self._unreserve_parked(request)" in diff) == parks
    assert ("+                    self._set_kv_fetch_stage(request, None)" in diff) == parks
    assert ("cached.resumed_req_ids" in diff) != parks
    assert "+        self._failed_ended_loaders: dict[str, int] = {}" in diff
    sched = RealVllmScheduler(_lone(4).config, lambda _e: None, SPACE).sched
    apply_kv_load_fixes(sched)
    assert sched._failed_ended_loaders == {}
    assert KV_LOAD_FIXES.names == (
        "drop-stale-reservation",
        "requeue-failed-load",
        "evict-failed-blocks",
        "every-sharer-recomputes",
        "stale-after-failed-load",
        "evict-ended-loader-blocks",
    )
    assert "+                self._inflight_prefills.discard(request)" in diff
    assert "+                    and not self._holds_kv_blocks(request)" in diff
    assert (
        "+                        self.kv_cache_manager.evict_blocks(set(req_block_ids[idx:]))"
        in diff
    )


@pytest.mark.parametrize(
    ("async_scheduling", "policy", "sync_loads"),
    [
        (False, "recompute", True),
        (False, "fail", True),
        (True, "recompute", True),
        (True, "recompute", False),
        (True, "fail", True),
    ],
    ids=[
        "sync-recompute",
        "sync-fail",
        "async-recompute",
        "async-recompute-async-loads",
        "async-fail",
    ],
)
def test_connector_programs_pass_with_the_fixes(
    async_scheduling: bool, policy: str, sync_loads: bool
) -> None:
    """Forty random programs with the connector pass every check with the fixes made, and take
    its paths: synchronous and asynchronous loads, loads that fail as a whole and in one block,
    sends, aborts during a load."""
    names = ("loads", "sync_loads", "loads_failed", "blocks_invalid", "sends", "aborted_loading")
    totals = dict.fromkeys((*names, "load_errors"), 0)
    options = LoopOptions(kv_connector=policy, kv_sync_loads=sync_loads, fix=apply_kv_load_fixes)
    for seed in PROGRAMS:
        run = run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)
        for name in totals:
            totals[name] += getattr(run, name)
    expected = [n for n in names if n != "sync_loads" or sync_loads]
    assert all(totals[n] > 0 for n in expected), totals
    assert (totals["sync_loads"] > 0) == sync_loads, totals
    assert (totals["load_errors"] > 0) == (policy == "fail"), totals


def _frees_sending_blocks(sched: Any) -> None:
    """Seeded bug: the connector's "keep the blocks, I am sending them" is ignored."""
    connector_finished = sched._connector_finished

    def patched(request: Any) -> tuple[bool, Any]:
        _delay, params = connector_finished(request)
        return False, params

    sched._connector_finished = patched


def _promotes_before_load(sched: Any) -> None:
    """Seeded bug: a loading request is promoted without waiting for its load."""
    handle = sched._handle_blocked_waiting_request

    def patched(request: Any) -> bool:
        if request.status.name == "WAITING_FOR_REMOTE_KVS":
            sched.finished_recving_kv_req_ids.add(request.request_id)
        return bool(handle(request))

    sched._handle_blocked_waiting_request = patched


def _ignores_failed_loads(sched: Any) -> None:
    """Seeded bug: a load that failed as a whole counts as done."""
    sched._handle_failed_recving = lambda _ids: set()


def _keeps_running_on_failed_blocks(sched: Any) -> None:
    """Seeded bug: a running request whose synchronous load failed in a block carries on as if
    it had not."""
    update = sched._update_requests_with_invalid_blocks

    def patched(
        requests: Any, invalid: set[int], scheduled: dict[str, int], evict_blocks: bool = True
    ) -> Any:
        if evict_blocks:  # the running requests' (synchronous loads')
            return set(), 0, set()
        return update(requests, invalid, scheduled, evict_blocks)

    sched._update_requests_with_invalid_blocks = patched


#: Each connector rule's seeded bug: (bug, the rule that catches it, what its message says).
SEEDED_BUGS: tuple[tuple[Callable[[Any], None], str, str], ...] = (
    (_frees_sending_blocks, "transfer_blocks_held", "is free, but the send of"),
    (_promotes_before_load, "load_before_compute", "whose KV load is still in flight"),
    (_ignores_failed_loads, "cache_hit_written", "starts from the prefix cache with block"),
    (_keeps_running_on_failed_blocks, "kv_written", "running, reads block"),
)


@pytest.mark.parametrize(
    ("mutant", "rule", "says"),
    SEEDED_BUGS,
    ids=[
        "frees_sending_blocks",
        "promotes_before_load",
        "ignores_failed_loads",
        "keeps_running_on_failed_blocks",
    ],
)
def test_each_connector_rule_catches_its_seeded_bug(
    mutant: Callable[[Any], None], rule: str, says: str
) -> None:
    """The first of the programs that fails with the seeded bug fails with its rule, and says
    which block or request; the same programs pass without it (above)."""

    def fixed_and_seeded(sched: Any) -> None:
        apply_kv_load_fixes(sched)
        mutant(sched)

    options = LoopOptions(kv_connector="recompute", fix=fixed_and_seeded)
    for seed in PROGRAMS:
        try:
            run_loop(core_program(seed), async_scheduling=False, options=options)
        except EngineCoreViolation as err:
            assert err.rule == rule, err
            assert says in err.detail, err.detail
            return
    pytest.fail(f"no program of {PROGRAMS} caught the seeded bug {mutant.__name__}")


def _drops_no_stale_output(sched: Any) -> None:
    """Seeded bug: a request preempted with a step in flight keeps that step's output, even
    when the connector must deliver its KV (`requires_kv_delivery` off)."""
    sched.requires_kv_delivery = False


#: The producer role's seeded bug: (bug, the rule that catches it, what its message says).
PRODUCER_SEEDED_BUGS: tuple[tuple[Callable[[Any], None], str, str], ...] = (
    (_drops_no_stale_output, "kv_delivered", "its KV is to be sent, but the connector was"),
)


def test_a_producer_only_connector_frees_with_steps_in_flight_and_delivers() -> None:
    """With `kv_role="kv_producer"` (a P/D prefill instance: it only sends) vLLM does not defer
    frees, so under async scheduling it preempts requests with a step in flight, and, as the
    connector must deliver their KV, drops that step's output (`requires_kv_delivery`): the
    forty programs pass every check in both loops, with such preemptions, sends, and no load.
    In both roles vLLM sets `requires_kv_delivery` (our connector produces)."""
    options = LoopOptions(kv_connector="recompute", kv_role="kv_producer")
    stale = sends = loads = 0
    for seed in PROGRAMS:
        for async_scheduling in (False, True):
            run = run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)
            stale += run.stale
            sends += run.sends
            loads += run.loads
    assert stale > 0 and sends > 0 and loads == 0, (stale, sends, loads)
    for role in ("kv_both", "kv_producer"):
        adapter = RealVllmScheduler(
            _lone(4).config, lambda _e: None, SPACE, kv_connector="fail", kv_role=role
        )
        assert adapter.sched.requires_kv_delivery is True


@pytest.mark.parametrize(("mutant", "rule", "says"), PRODUCER_SEEDED_BUGS, ids=["stale_output"])
def test_the_delivery_rule_catches_its_seeded_bug(
    mutant: Callable[[Any], None], rule: str, says: str
) -> None:
    """The first of the forty producer programs that fails with the seeded bug fails
    `kv_delivered` in the asynchronous loop, naming the request and its prompt: its blocks
    were freed at the preemption, and the step in flight finished it."""
    options = LoopOptions(kv_connector="recompute", kv_role="kv_producer", mutate=mutant)
    for seed in PROGRAMS:
        try:
            run_loop(core_program(seed), async_scheduling=True, options=options)
        except EngineCoreViolation as err:
            assert err.rule == rule, err
            assert says in err.detail and "-token prompt" in err.detail, err.detail
            return
    pytest.fail(f"no program of {PROGRAMS} caught the seeded bug {mutant.__name__}")


@LOOPS
def test_finding_a_failed_load_heads_the_loads_and_strands_them(async_scheduling: bool) -> None:
    """Program 959 (FCFS, prefix caching; asynchronous loads only), with
    `drop-stale-reservation` made: r4's load failed and freed its blocks, yet r4 still heads
    `kv_holding_waiting`; its retry does not fit beside the reservations of r7 and r8, whose
    loads are done, and the waiting loop stops at r4, so they are never promoted (`progress`).
    With `requeue-failed-load` too, it passes."""
    program = core_program(959)
    loop = EngineCoreLoop(
        program.config,
        async_scheduling=async_scheduling,
        kv_connector="recompute",
        mutate=apply_drop_stale_reservation_fix,
        draft_seed=program_seed(program),
        kv_sync_loads=False,
    )
    with pytest.raises(EngineCoreViolation) as caught:
        loop.run(program)
    assert caught.value.rule == "progress" and "0 running" in caught.value.detail
    sched = loop.sched
    head, *behind = list(sched.kv_holding_waiting)
    assert head.status.name == "WAITING" and head.num_computed_tokens == 0
    assert not sched.kv_cache_manager.get_block_ids(head.request_id)[0]
    assert behind and all(r.status.name == "WAITING_FOR_REMOTE_KVS" for r in behind)
    assert all(r.request_id in sched.finished_recving_kv_req_ids for r in behind)
    options = LoopOptions(kv_connector="recompute", kv_sync_loads=False, fix=apply_kv_load_fixes)
    run_loop(program, async_scheduling=async_scheduling, options=options)


def _fixes(*names: str) -> Callable[[Any], None]:
    """The named fixes of `integrations.vllm.kv_load_fixes`, made together."""
    return ScheduleFix(*(f for f in KV_LOAD_FIXES.fixes if f.name in names)).apply


#: The two fixes of the hangs above.
RESERVATION_FIXES = ("drop-stale-reservation", "requeue-failed-load")


def _violation(seed: int, async_scheduling: bool, fix: Callable[[Any], None]) -> Any:
    """The violation program `seed` (recompute policy) raises with `fix` made, or None."""
    options = LoopOptions(kv_connector="recompute", fix=fix)
    try:
        run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)
    except EngineCoreViolation as err:
        return err
    return None


def test_finding_blocks_computed_over_a_failed_block_stay_cached() -> None:
    """Program 367, synchronous loop, the reservation fixes made: r10's synchronous load fails
    in its first block; vLLM truncates r10 and recomputes, but under the recompute policy it
    evicts neither the failed block nor the blocks that step computed over it; r10 is preempted
    before it recomputes them, and on resuming hits its block 10, computed over the failed
    block (`cache_hit_written`). With `evict-failed-blocks` too it passes."""
    err = _violation(367, False, _fixes(*RESERVATION_FIXES))
    assert err is not None and err.rule == "cache_hit_written", err
    assert "'r10' starts from the prefix cache with block 30 as its block 10" in err.detail
    assert _violation(367, False, _fixes(*RESERVATION_FIXES, "evict-failed-blocks")) is None


def test_finding_a_failed_block_whose_loader_is_gone_stays_cached() -> None:
    """Program 1048, asynchronous loop, vLLM's default policy `fail`: r0's synchronous load
    into block 1 fails, and r0 is aborted before vLLM learns it; with no request left to fail,
    vLLM evicts nothing, and r2 hits block 1 (`cache_hit_written`). With
    `evict-failed-blocks` it passes."""
    options = LoopOptions(kv_connector="fail")
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(core_program(1048), async_scheduling=True, options=options)
    assert caught.value.rule == "cache_hit_written", caught.value
    assert "'r2' starts from the prefix cache with block 1 as its block 0" in caught.value.detail
    fixed = LoopOptions(kv_connector="fail", fix=_fixes("evict-failed-blocks"))
    run_loop(core_program(1048), async_scheduling=True, options=fixed)


def test_finding_blocks_computed_over_a_failed_block_outlive_their_loader() -> None:
    """Program 9972, asynchronous loop with two pipeline stages, every other fix made: r2's
    synchronous load into blocks 10 and 11 fails in block 10, and its step computes blocks 12
    and 13 over it; r2 is aborted before vLLM learns of the failure, so vLLM finds no request
    holding block 10 and `evict-failed-blocks` evicts block 10 alone. r3 recomputes r2's first
    block elsewhere, which makes r2's chain reachable again: r4 hits block 11 (loaded: valid)
    and block 12, computed over the failed block (`cache_hit_written`). With
    `evict-ended-loader-blocks`, which evicts by the failed step's own block ids, it passes."""
    others = tuple(n for n in KV_LOAD_FIXES.names if n != "evict-ended-loader-blocks")

    def run(fix: Callable[[Any], None]) -> None:
        options = LoopOptions(kv_connector="recompute", fix=fix, pipeline_parallel_size=2)
        run_loop(core_program(9972), async_scheduling=True, options=options)

    with pytest.raises(EngineCoreViolation) as caught:
        run(_fixes(*others))
    assert caught.value.rule == "cache_hit_written", caught.value
    assert "'r4' starts from the prefix cache with block 12 as its block 2" in caught.value.detail
    run(apply_kv_load_fixes)


def test_finding_the_loader_gone_under_the_default_policy() -> None:
    """The same finding under vLLM's default policy, `fail`, with one pipeline stage: program
    1890 with put-off lookups (block size 2), asynchronous loop. r1's synchronous load into
    block 3 fails, its step computes block 4 over it, and r1 is aborted before vLLM learns of
    the failure. vLLM fails r2, which hit block 3 in the meantime, and evicts r2's blocks from
    block 3 on, but not block 4, which only r1 held; r4 computes r1's first block again (block
    5), and r6 hits block 5 and then block 4. `evict-failed-blocks` (the failed block, whoever
    holds it) is not enough; with `evict-ended-loader-blocks` too it passes."""

    def run(fix: Callable[[Any], None] | None) -> None:
        options = LoopOptions(kv_connector="fail", kv_pending_lookups=True, fix=fix)
        run_loop(core_program(1890), async_scheduling=True, options=options)

    for fix in (None, _fixes("evict-failed-blocks")):
        with pytest.raises(EngineCoreViolation) as caught:
            run(fix)
        assert caught.value.rule == "cache_hit_written", caught.value
        assert "'r6' starts from the prefix cache with block 4 as its block 1" in (
            caught.value.detail
        )
    run(_fixes("evict-failed-blocks", "evict-ended-loader-blocks"))


class _FirstBlocksFail(RemoteKv):
    """r0's first two prompt tokens are in the store, loaded synchronously; the load fails in
    its first block; nothing else is held or sent."""

    def __init__(self) -> None:
        super().__init__(0, 1)

    def remote_tokens(self, request: Any) -> int:
        return 2 if request.request_id == "r0" else 0

    def loads_async(self, request: Any) -> bool:
        return False

    def produces(self, rid: str) -> bool:
        return False

    def outcome(self, load: Transfer) -> str | int:
        return 0


def _chunked_loader_aborted(fix: Callable[[Any], None]) -> None:
    """r0, a 12-token prompt computed 4 tokens a step after its failing load, with two
    pipeline stages, aborted at step 2 (its first two steps in flight); r1 and r2, the same
    prompt, arrive later. Asynchronous loop, recompute policy, `fix` made."""
    prompt = tuple(range(100, 112))
    config = ArConfig(
        block_size=1,
        num_blocks=60,
        max_num_batched_tokens=4,
        max_num_seqs=4,
        max_model_len=40,
        long_prefill_token_threshold=0,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
    )
    arrivals: list[tuple[ArRequest, ...]] = [()] * 20
    arrivals[0] = (ArRequest("r0", 12, 2, prompt=prompt),)
    arrivals[8] = (ArRequest("r1", 12, 2, prompt=prompt),)
    arrivals[19] = (ArRequest("r2", 12, 2, prompt=prompt),)
    aborts: list[tuple[str, ...]] = [()] * 20
    aborts[2] = ("r0",)
    loop = EngineCoreLoop(
        config,
        async_scheduling=True,
        kv_connector="recompute",
        remote_kv=_FirstBlocksFail(),
        mutate=fix,
        pipeline_parallel_size=2,
    )
    loop.run(CoreProgram(config, tuple(arrivals), tuple(aborts)))


def test_the_ended_loader_fix_covers_its_later_steps_in_flight() -> None:
    """The loader's steps after the failing one, scheduled before its failure was reported,
    computed over the failed block too. Without `evict-ended-loader-blocks`, r2 hits a block
    of the loading step (block 3, r0's block 2); with it, but without its eviction of the later
    steps' blocks (`_evict_failed_ended_loaders` made a no-op), r2 hits a block of r0's next
    step (block 7, r0's block 6); with the whole fix it passes."""
    five = _fixes(*(n for n in KV_LOAD_FIXES.names if n != "evict-ended-loader-blocks"))

    def first_step_only(sched: Any) -> None:
        apply_kv_load_fixes(sched)
        sched._evict_failed_ended_loaders = lambda scheduler_output: None

    for fix, block in (
        (five, "block 3 as its block 2"),
        (first_step_only, "block 7 as its block 6"),
    ):
        with pytest.raises(EngineCoreViolation) as caught:
            _chunked_loader_aborted(fix)
        assert caught.value.rule == "cache_hit_written", caught.value
        assert f"'r2' starts from the prefix cache with {block}" in caught.value.detail
    _chunked_loader_aborted(apply_kv_load_fixes)


#: The six fixes, `pad-what-fits` and `cap-draft-margin` (speculative decoding), as one edit
#: of vLLM's file.
DRAFTS_FIXES = (*KV_LOAD_FIXES.fixes, SPEC_PAD_FIX, DRAFT_MARGIN_FIX)
DRAFTS_FIXED = ScheduleFix(*DRAFTS_FIXES).apply


@LOOPS
def test_drafts_with_a_failed_synchronous_load_pass_with_the_fixes(async_scheduling: bool) -> None:
    """Program 1 with 2 drafts a step and every load kind: r1's synchronous load fails in its
    first block, so vLLM truncates r1 in place (recompute policy) and drops what its step
    sampled. The speculative model follows (`SpeculativeModel.truncated`): with the fixes both
    loops pass, drafts and a failed block included. Without that, the check itself fails the
    program: the synchronous loop reads r1's recomputation as a decode (`decode_position`),
    the asynchronous one records its recomputation's writes at a decode's positions, so its
    first block reads as written by nothing (`kv_written`; before that rule ran with drafts,
    `output_content` caught the dropped output counted)."""
    options = LoopOptions(kv_connector="recompute", speculative_tokens=2, fix=DRAFTS_FIXED)
    run = run_loop(core_program(1), async_scheduling=async_scheduling, options=options)
    assert run.blocks_invalid > 0 and run.drafts_scheduled > 0, run
    rule = "kv_written" if async_scheduling else "decode_position"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SpeculativeModel, "truncated", lambda self: None)
        with pytest.raises(EngineCoreViolation) as caught:
            run_loop(core_program(1), async_scheduling=async_scheduling, options=options)
    assert caught.value.rule == rule, caught.value
    assert "'r1'" in caught.value.detail, caught.value.detail


def test_a_deferred_batch_truncated_under_drops_its_output_with_structured_output() -> None:
    """Program 3 with 2 drafts a step, structured output and every load kind, every fix,
    asynchronous loop: r0's synchronous load fails when its next step is already scheduled,
    and, r0 being guided, vLLM defers sampling that step until the failing step's output is
    applied. By then `stale-after-failed-load` has marked the step's output to be dropped, so
    the speculative model samples nothing for it (`execute(deferred=True)`) and r0's
    recomputation ends a prefill: the program passes. Counted as a decode instead, the
    recomputation would sample output 2 under the row for output 1 (`grammar_mask`, the
    check's false alarm)."""
    options = LoopOptions(
        kv_connector="recompute", speculative_tokens=2, structured_output=True, fix=DRAFTS_FIXED
    )
    run = run_loop(core_program(3), async_scheduling=True, options=options)
    assert run.blocks_invalid > 0 and run.deferred > 0, run
    execute = SpeculativeModel.execute

    def undeferred(self: SpeculativeModel, out: Any, rows: Any = None, **_: Any) -> Any:
        return execute(self, out, rows)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SpeculativeModel, "execute", undeferred)
        with pytest.raises(EngineCoreViolation) as caught:
            run_loop(core_program(3), async_scheduling=True, options=options)
    assert caught.value.rule == "grammar_mask", caught.value
    assert "'r0' samples output 2 under bitmask row 0" in caught.value.detail


def test_a_deferred_batch_may_start_a_request_failed_since() -> None:
    """Program 494 under `fail`, 2 drafts a step, structured output, every fix, asynchronous
    loop: a deferred batch starts r2, whose load vLLM fails (ending it with an error) before
    the batch is sampled; the speculative model skips the request it no longer finds, as it
    skips one finished meanwhile (it once raised `KeyError` there)."""
    options = LoopOptions(
        kv_connector="fail", speculative_tokens=2, structured_output=True, fix=DRAFTS_FIXED
    )
    run = run_loop(core_program(494), async_scheduling=True, options=options)
    assert run.reasons["r2"] == "error" and run.deferred > 0, run


def test_with_drafts_running_reads_are_checked_below_verified_tokens() -> None:
    """`kv_written` with drafts checks a running request's reads below its verified tokens
    (`CacheWrites.verified_reads`). Program 1679, asynchronous loop, every fix but
    `every-sharer-recomputes`: r5, a second holder of a failed block, reads it (the finding
    above, with drafts); with that fix too it passes. Below the tokens of its steps in flight
    the check would be wrong: program 1 with every fix then fails `kv_written` on r0, reading
    a block of its own in-flight drafts' positions, which vLLM rolls back if they are
    rejected."""
    others = tuple(f for f in DRAFTS_FIXES if f.name != "every-sharer-recomputes")
    options = LoopOptions(
        kv_connector="recompute", speculative_tokens=2, fix=ScheduleFix(*others).apply
    )
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(core_program(1679), async_scheduling=True, options=options)
    assert caught.value.rule == "kv_written", caught.value
    assert "'r5', running, reads block 8 as its block 1" in caught.value.detail
    fixed = LoopOptions(kv_connector="recompute", speculative_tokens=2, fix=DRAFTS_FIXED)
    run_loop(core_program(1679), async_scheduling=True, options=fixed)
    init = CacheWrites.__init__

    def unverified(self: CacheWrites, block_size: int, **flags: Any) -> None:
        init(self, block_size, **{**flags, "verified_reads": False})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CacheWrites, "__init__", unverified)
        with pytest.raises(EngineCoreViolation) as caught:
            run_loop(core_program(1), async_scheduling=True, options=fixed)
    assert caught.value.rule == "kv_written", caught.value
    assert "'r0', running, reads block 6 as its block 5" in caught.value.detail


class _Req:
    """A request as `CacheWrites` and `RemoteKv.lookup` read it: an id, its block hashes, and
    a prompt of `prompt` tokens with nothing generated."""

    def __init__(self, rid: str, prompt: int = 0) -> None:
        self.request_id: str = rid
        self.block_hashes: list[bytes] = []
        self.num_prompt_tokens: int = prompt
        self.num_tokens: int = prompt


def test_a_failed_load_forgets_its_failed_block_and_what_was_computed_over_it() -> None:
    """The check's record after a synchronous load fails: the failed block and the blocks the
    loader's batches wrote past the load hold nothing valid, found by writer, so the loader may
    have ended; the load's other blocks (the store wrote them), the blocks before it, and a
    block another request has written since keep their writes."""
    loader, other = _Req("r2"), _Req("r3")
    writes = CacheWrites(1, every_read=True)
    # blocks 8, 9: loader's computed prefix; 10, 11: its load (fails in 10); 12, 13: computed
    # over it in the loading step, 13 then rewritten by another request
    for k, block in enumerate((8, 9, 10, 11, 12, 13)):
        writes.written[block] = (loader, k)
    writes.written[13] = (other, 0)
    writes.forget_failed_load(loader, 10, after=4)
    assert {b: (w[0].request_id, w[1]) for b, w in writes.written.items()} == {
        8: ("r2", 0),
        9: ("r2", 1),
        11: ("r2", 3),
        13: ("r3", 0),
    }


def test_finding_a_second_holder_of_a_failed_block_reads_it() -> None:
    """Program 657, asynchronous loop, three fixes made: r3's synchronous load into block 5
    fails; before vLLM learns it, r7 and r8 hit block 5 from the prefix cache. vLLM makes the
    first, r7, recompute it and lets r8 keep it as computed ("can still consider this block as
    computed when rescheduled"); r8 runs on in the next step, reading block 5 before r7 has
    recomputed it (`kv_written`). With `every-sharer-recomputes` too it passes."""
    three = (*RESERVATION_FIXES, "evict-failed-blocks")
    err = _violation(657, True, _fixes(*three))
    assert err is not None and err.rule == "kv_written", err
    assert "'r8', running, reads block 5 as its block 0" in err.detail, err.detail
    assert _violation(657, True, _fixes(*three, "every-sharer-recomputes")) is None


#: The shrunk program of a sharer's recompute (session program 561 with `--pauses wait`,
#: shrunk to four plain requests): r8 loads its 16-token prefix synchronously into blocks
#: [2, 1, 3, 4] while r9, sharing its first 5 tokens, hits block 2 in the same step.
SHARER_REWRITE = CoreProgram(
    ArConfig(
        block_size=4,
        num_blocks=7,
        max_num_batched_tokens=9,
        max_num_seqs=2,
        max_model_len=18,
        enable_prefix_caching=True,
    ),
    (
        (ArRequest("r4", 2, 1),),
        (),
        (
            ArRequest("r7", 2, 1),
            ArRequest("r8", 17, 1, prompt=tuple(range(100, 117))),
            ArRequest("r9", 5, 1, prompt=tuple(range(100, 105))),
        ),
    ),
    ((), (), ()),
)


def test_a_sharer_recomputing_into_a_shared_block_writes_back_the_same_kv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`SHARER_REWRITE`, synchronous loop, every connector fix made: r8's load fails in block
    2; r8 recomputes the block in full, and `every-sharer-recomputes` sets r9 back to token 0,
    so the next batch has r9 write its token 0 into block 2 while r8 reads it. r9 writes the KV
    already there (same tokens, positions and adapter), so the block still holds r8's block 0
    and the program passes. Recording that partial write as erasing the block (the check's
    first rule) reports `kv_written` for r8."""
    options = LoopOptions(
        kv_connector="recompute",
        fix=ScheduleFix(*KV_LOAD_FIXES.fixes).apply,
        draw_seed=2590970495,
    )
    same_kv, kept = cache_writes._same_kv, []

    def counting(held: Any, req: Any, k: int, end: int) -> bool:
        kept.append(same_kv(held, req, k, end))
        return kept[-1]

    monkeypatch.setattr(cache_writes, "_same_kv", counting)
    run_loop(SHARER_REWRITE, async_scheduling=False, options=options)
    assert any(kept), kept  # the rewrite happened and kept the block's content
    monkeypatch.setattr(cache_writes, "_same_kv", lambda *args: False)
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(SHARER_REWRITE, async_scheduling=False, options=options)
    assert caught.value.rule == "kv_written", caught.value
    assert "'r8', running, reads block 2 as its block 0" in caught.value.detail


@pytest.mark.parametrize(
    ("tokens", "adapter", "index", "kept"),
    [
        ([5, 6, 7], 0, 1, True),
        ([5, 6, 9], 0, 1, False),
        ([5, 6, 7], 1, 1, False),
        ([5, 6, 7], 0, 0, False),
        ([5, 6], 0, 1, False),
    ],
    ids=["same-kv", "other-token", "other-adapter", "other-block", "token-in-flight"],
)
def test_a_partial_write_erases_a_block_unless_it_writes_the_same_kv(
    tokens: list[int], adapter: int, index: int, kept: bool
) -> None:
    """Blocks of 2 tokens: block 7 holds block 1 of 'r1' (tokens 0..3). A batch writing
    token 2 of another request into block 7 as its block `index` keeps that content only
    with the same tokens through token 2, known, and the same LoRA adapter; else the block
    holds the partial write alone."""
    holder = SimpleNamespace(
        request_id="r1", all_token_ids=[5, 6, 7, 8], block_hashes=[], lora_request=None
    )
    lora = SimpleNamespace(lora_int_id=adapter) if adapter else None
    writer = SimpleNamespace(
        request_id="r2", all_token_ids=tokens, block_hashes=[], lora_request=lora
    )
    writes = CacheWrites(2, every_read=True)
    writes.put(7, (holder, 1))
    writes._put_partial(7, writer, index, 3, 0)
    assert (writes.content(7) == (holder, 1)) is kept
    assert (7 in writes.partial) is not kept


def test_known_upstream_a_failed_synchronous_load_under_async_scheduling() -> None:
    """Program 1, the four fixes above made: r1's synchronous load fails in its first block
    while its next step is already scheduled. vLLM truncates r1 to recompute, but its output
    placeholders stay counted (vLLM issue #45138, open), so its recomputation schedules past
    its tokens and its first output is lost: output 2 comes first (`output_content`). The
    synchronous loop passes; with `stale-after-failed-load` too, so does this one."""
    four = (*RESERVATION_FIXES, "evict-failed-blocks", "every-sharer-recomputes")
    err = _violation(1, True, _fixes(*four))
    assert err is not None and err.rule == "output_content", err
    assert "'r1' produced 3 tokens, expected 3" in err.detail and "got its output 2" in err.detail
    assert _violation(1, False, _fixes(*four)) is None
    assert _violation(1, True, apply_kv_load_fixes) is None


def test_known_upstream_with_drafts_a_stale_output_sends_less_than_the_prompt() -> None:
    """The same upstream bug seen by the producer's delivery (`kv_delivered`): program 386,
    2 drafts a step, `pad-what-fits` alone, asynchronous loop. r4's synchronous load fails in
    its first block when the step that ends its 9-token prompt is already scheduled; vLLM
    truncates r4 to recompute, but that step's output still counts (#45138), and it finishes
    r4 at its length while the recomputation has computed 5 tokens: the connector is handed 2
    blocks of 4 to send. The synchronous loop passes; with `stale-after-failed-load` too, so
    does this one."""

    def run(async_scheduling: bool, *fixes: EngineFix) -> None:
        options = LoopOptions(
            kv_connector="recompute", speculative_tokens=2, fix=ScheduleFix(*fixes).apply
        )
        run_loop(core_program(386), async_scheduling=async_scheduling, options=options)

    with pytest.raises(EngineCoreViolation) as caught:
        run(True, SPEC_PAD_FIX)
    assert caught.value.rule == "kv_delivered", caught.value
    assert "'r4' finished (FINISHED_LENGTH_CAPPED)" in caught.value.detail
    assert "handed 2 blocks of 4 for its 9-token prompt" in caught.value.detail
    run(False, SPEC_PAD_FIX)
    run(True, STALE_AFTER_FAILED_LOAD_FIX, SPEC_PAD_FIX)


# the full tier's: the script over 5 x 30 programs; per push the findings and fixes run
# in-process above
@full_tier
def test_the_async_check_script_takes_the_connector_and_the_fixes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--kv-connector recompute --kv-async-loads-only`: some of 30 programs hang (`progress`,
    exit 1); with the two reservation fixes all 30 pass, and the JSON says which connector
    ran; with every load kind under vLLM's default policy, `fail`, all 30 pass, and with
    `--kv-pending-lookups` too, which puts lookups off and says so, and with `--kv-role
    kv_producer`, which only sends and preempts with steps in flight."""
    script = load_script("vllm_async_check")
    argv = ["--programs", "30", "--kv-connector", "recompute", "--kv-async-loads-only"]
    assert script.main(argv) == 1
    out = capsys.readouterr().out
    assert "a KV connector (asynchronous loads, failed loads: recompute)" in out, out
    assert "FAIL [progress, sync loop]" in out and "FAIL [progress, async loop]" in out, out
    out_json = tmp_path / "kv.json"
    fixes = ["--fix", "drop-stale-reservation", "--fix", "requeue-failed-load"]
    assert script.main([*argv, *fixes, "--json", str(out_json)]) == 0
    assert "30 pass both loops" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["kv_connector"] == "recompute" and data["failures"] == {}
    assert data["kv_async_loads_only"] is True
    assert script.main(["--programs", "30", "--kv-connector", "fail"]) == 0
    out = capsys.readouterr().out
    assert "a KV connector (all loads, failed loads: fail)" in out and "30 pass" in out, out
    pending = ["--programs", "30", "--kv-connector", "fail", "--kv-pending-lookups"]
    assert script.main([*pending, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "a KV connector (all loads, lookups put off, failed loads: fail)" in out, out
    data = json.loads(out_json.read_text())
    assert data["kv_pending_lookups"] is True and data["counts"]["sync"]["lookups_put_off"] > 0
    producer = ["--programs", "30", "--kv-connector", "fail", "--kv-role", "kv_producer"]
    assert script.main([*producer, "--json", str(out_json)]) == 0
    assert "a KV connector (sends only, failed loads: fail)" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["kv_role"] == "kv_producer" and data["counts"]["async"]["stale"] > 0


def test_the_connector_rules_are_the_loops_rules() -> None:
    """The rules the connector adds are listed with the loop's (`RULES`)."""
    assert {"load_before_compute", "transfer_blocks_held", "kv_written", "kv_delivered"} <= set(
        RULES
    )


def test_an_unknown_failure_policy_is_refused() -> None:
    """`kv_connector` is None or one of vLLM's failure policies, `kv_role` one of the roles
    checked; anything else is a `ConfigError` naming them."""
    config = _lone(4).config
    with pytest.raises(ConfigError, match="recompute, fail"):
        RealVllmScheduler(config, lambda _e: None, SPACE, kv_connector="retry")
    with pytest.raises(ConfigError, match="kv_both, kv_producer"):
        RealVllmScheduler(config, lambda _e: None, SPACE, kv_connector="fail", kv_role="both")
    adapter = RealVllmScheduler(config, lambda _e: None, SPACE, kv_connector="fail")
    assert type(adapter.sched.connector).__name__ == "SchedspecKvConnector"
    assert adapter.sched.recompute_kv_load_failures is False


def test_with_a_connector_every_request_is_hashed() -> None:
    """vLLM's engine core gives requests a block hasher when prefix caching is on or a KV
    connector is configured (connectors read block hashes); so does the adapter."""
    config = _lone(4).config
    assert not config.enable_prefix_caching
    assert RealVllmScheduler(config, lambda _e: None, SPACE).hasher is None
    adapter = RealVllmScheduler(config, lambda _e: None, SPACE, kv_connector="recompute")
    assert adapter.hasher is not None


def test_a_put_off_lookup_is_answered_after_one_or_two_asks() -> None:
    """With `pending_lookups`, the store answers one request in four "ask again later" (None)
    at its first one or two lookups, then what it holds; without, never."""
    store = RemoteKv(0, 1, sync_loads=False, pending_lookups=True)
    rids = [f"r{i}" for i in range(200)]
    put_off = {rid: store.lookups_put_off(rid) for rid in rids}
    assert {1, 2} <= set(put_off.values()) <= {0, 1, 2}
    assert 30 <= sum(1 for n in put_off.values() if n) <= 70  # about a quarter
    rid = next(r for r, n in put_off.items() if n == 2)
    request = _Req(rid, 8)
    answers = [store.lookup(request, 0) for _ in range(3)]
    assert answers[:2] == [None, None] and answers[2] == store.matched(request, 0)
    assert rid not in store.asked_later and store.counts.lookups_put_off == 2
    plain = RemoteKv(0, 1, sync_loads=False)
    assert all(plain.lookups_put_off(r) == 0 for r in rids)


@LOOPS
def test_a_request_put_off_by_the_connector_may_be_passed(async_scheduling: bool) -> None:
    """vLLM skips a request its connector says to ask about again later, so later requests
    may be admitted before it, by design: with put-off lookups the forty programs pass every
    check with the fixes, and put lookups off; without the check's exemption
    (`lookup_put_off`), `admission_order` reports such a pass."""
    options = LoopOptions(
        kv_connector="recompute", kv_pending_lookups=True, fix=apply_kv_load_fixes
    )
    put_off = 0
    for seed in PROGRAMS:
        run = run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)
        put_off += run.lookups_put_off
    assert put_off > 0

    def no_exemption(self: EngineCoreLoop, rid: str) -> bool:
        return False

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineCoreLoop, "lookup_put_off", no_exemption)
        caught = []
        for seed in PROGRAMS:
            try:
                run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)
            except EngineCoreViolation as err:
                caught.append(err)
    assert caught and all(err.rule == "admission_order" for err in caught), caught
