"""vLLM 0.33.0's KV connector path in its engine-core loop (`integrations.vllm.kv_connector`:
a real connector class that vLLM's own factory loads, a remote store and its worker), the
checks it adds, and its findings: a request whose KV load failed counts its own reservation
against itself when it loads again, and heads the queue of requests holding KV when it no
longer holds any, stranding the finished loads behind it; with drafts, a load that fills the
pool is never admitted.

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
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import KV_FAILURE_POLICIES, SPACE, RealVllmScheduler
from integrations.vllm.engine_core import (
    RULES,
    CoreProgram,
    EngineCoreLoop,
    EngineCoreViolation,
    LoopOptions,
    core_program,
    run_loop,
)
from integrations.vllm.kv_connector import RemoteKv, Transfer
from integrations.vllm.kv_load_fixes import (
    apply_drop_stale_reservation_fix,
    apply_kv_load_fixes,
    fix_as_diff,
)
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script

LOOPS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
#: The connector programs checked here (`core_program`), each through both loops.
PROGRAMS = range(40)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


class _OneFailedLoad(RemoteKv):
    """r0's whole prompt is in the store; its first load fails as a whole, every transfer is
    reported in the batch that starts it, nothing is sent. With `reoffer` the store offers the
    hit again after the failure (vLLM's offloading connector looks every request up afresh);
    without it, once (a P/D decode instance's remote prefill)."""

    def __init__(self, *, reoffer: bool, block_size: int) -> None:
        super().__init__(0, block_size)
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
    a 40-token prompt (3 blocks) in 5 usable blocks."""
    loop = _loop(program, async_scheduling)
    with pytest.raises(EngineCoreViolation) as caught:
        loop.run(program)
    assert caught.value.rule == "progress", caught.value
    assert "0 running, 1 waiting" in caught.value.detail, caught.value.detail
    sched = loop.sched
    r0 = sched.requests["r0"]
    assert r0.status.name == "WAITING" and r0.num_computed_tokens == 0
    assert r0 in sched._inflight_prefills
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


class _WholePrompts(RemoteKv):
    """Every prompt is in the store (`hit`) or none is; every load succeeds at once, nothing
    is sent."""

    def __init__(self, *, hit: bool) -> None:
        super().__init__(0, 1)
        self.hit: bool = hit

    def remote_tokens(self, request: Any) -> int:
        return int(request.num_prompt_tokens) if self.hit else 0

    def produces(self, rid: str) -> bool:
        return False

    def delay(self, transfer: Transfer) -> int:
        return 0

    def outcome(self, load: Transfer) -> str | int:
        return "ok"


@LOOPS
def test_finding_with_drafts_a_remote_hit_that_fills_the_pool_never_loads(
    async_scheduling: bool,
) -> None:
    """With 2 drafts a step, an asynchronous load is admitted only if its blocks and one
    decode step's draft blocks (3, `_spec_decode_step_blocks`) fit in the free pool, a margin
    not capped at `max_model_len`: r0 (4-token prompt all in the store, 2 new) in 6 usable
    blocks, the least vLLM accepts for `max_model_len` 6, needs 7 and waits for ever
    (`progress`). It needs 6 at most: without the hit it runs, and so it does with 7 blocks."""

    def run(num_blocks: int, hit: bool) -> Any:
        config = ArConfig(
            block_size=1,
            num_blocks=num_blocks,
            max_num_batched_tokens=12,
            max_num_seqs=2,
            max_model_len=6,
            long_prefill_token_threshold=0,
            enable_chunked_prefill=True,
        )
        program = CoreProgram(config, ((ArRequest("r0", 4, 2),),), ((),))
        loop = EngineCoreLoop(
            config,
            async_scheduling=async_scheduling,
            kv_connector="recompute",
            remote_kv=_WholePrompts(hit=hit),
            speculative_tokens=2,
        )
        return loop.run(program)

    with pytest.raises(EngineCoreViolation) as caught:
        run(7, hit=True)
    assert caught.value.rule == "progress", caught.value
    assert "0 running, 1 waiting" in caught.value.detail, caught.value.detail
    assert run(7, hit=False).reasons["r0"] == "length"
    assert run(8, hit=True).loads == 1


def test_the_fixes_are_edits_of_vllms_scheduler() -> None:
    """Two hunks of vLLM's `scheduler.py`: the promotion of a request whose load is done, and
    what a load that failed as a whole leaves of its request."""
    diff = fix_as_diff()
    assert diff.startswith("--- a/vllm/v1/core/sched/scheduler.py\n")
    assert diff.count("@@ ") == 2
    assert "+                self._inflight_prefills.discard(request)" in diff
    assert "+                    and not self._holds_kv_blocks(request)" in diff


@LOOPS
@pytest.mark.parametrize("policy", KV_FAILURE_POLICIES)
def test_connector_programs_pass_with_the_fixes(async_scheduling: bool, policy: str) -> None:
    """Forty random programs with the connector pass every check with the two fixes made, and
    take its paths: loads that fail as a whole and in one block, sends, aborts during a
    load."""
    totals = dict.fromkeys(("loads", "loads_failed", "blocks_invalid", "sends"), 0)
    totals["aborted_loading"] = totals["load_errors"] = 0
    options = LoopOptions(kv_connector=policy, fix=apply_kv_load_fixes)
    for seed in PROGRAMS:
        run = run_loop(core_program(seed), async_scheduling=async_scheduling, options=options)
        for name in totals:
            totals[name] += getattr(run, name)
    assert all(totals[n] > 0 for n in ("loads", "loads_failed", "blocks_invalid", "sends")), totals
    assert totals["aborted_loading"] > 0, totals
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


#: Each connector rule's seeded bug: (bug, the rule that catches it, what its message says).
SEEDED_BUGS: tuple[tuple[Callable[[Any], None], str, str], ...] = (
    (_frees_sending_blocks, "transfer_blocks_held", "is free, but the send of"),
    (_promotes_before_load, "load_before_compute", "whose KV load is still in flight"),
    (_ignores_failed_loads, "cache_hit_written", "but no batch wrote it"),
)


@pytest.mark.parametrize(
    ("mutant", "rule", "says"),
    SEEDED_BUGS,
    ids=["frees_sending_blocks", "promotes_before_load", "ignores_failed_loads"],
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


@LOOPS
def test_finding_a_failed_load_heads_the_loads_and_strands_them(async_scheduling: bool) -> None:
    """Program 959 (FCFS, prefix caching), with `drop-stale-reservation` made: r4's load
    failed and freed its blocks, yet r4 still heads `kv_holding_waiting`; its retry does not
    fit beside the reservations of r7 and r8, whose loads are done, and the waiting loop stops
    at r4, so they are never promoted (`progress`). With `requeue-failed-load` too, it
    passes."""
    program = core_program(959)
    loop = EngineCoreLoop(
        program.config,
        async_scheduling=async_scheduling,
        kv_connector="recompute",
        mutate=apply_drop_stale_reservation_fix,
        draft_seed=_draft_seed(program),
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
    options = LoopOptions(kv_connector="recompute", fix=apply_kv_load_fixes)
    run_loop(program, async_scheduling=async_scheduling, options=options)


def _draft_seed(program: CoreProgram) -> int:
    """The seed `LoopOptions.loop` gives a program's loop (its remote store's draws)."""
    return zlib.crc32(repr(program).encode())


def test_the_async_check_script_takes_the_connector_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--kv-connector recompute`: some of 30 programs hang (`progress`, exit 1); with
    `--fix drop-stale-reservation --fix requeue-failed-load` all 30 pass, and the JSON says which
    connector ran."""
    script = load_script("vllm_async_check")
    argv = ["--programs", "30", "--kv-connector", "recompute"]
    assert script.main(argv) == 1
    out = capsys.readouterr().out
    assert "a KV connector (failed loads: recompute)" in out, out
    assert "FAIL [progress, sync loop]" in out and "FAIL [progress, async loop]" in out, out
    out_json = tmp_path / "kv.json"
    fixes = ["--fix", "drop-stale-reservation", "--fix", "requeue-failed-load"]
    assert script.main([*argv, *fixes, "--json", str(out_json)]) == 0
    assert "30 pass both loops" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["kv_connector"] == "recompute" and data["failures"] == {}


def test_the_connector_rules_are_the_loops_rules() -> None:
    """The rules the connector adds are listed with the loop's (`RULES`)."""
    assert {"load_before_compute", "transfer_blocks_held"} <= set(RULES)


def test_an_unknown_failure_policy_is_refused() -> None:
    """`kv_connector` is None or one of vLLM's failure policies; anything else is a
    `ConfigError` naming them."""
    config = _lone(4).config
    with pytest.raises(ConfigError, match="recompute, fail"):
        RealVllmScheduler(config, lambda _e: None, SPACE, kv_connector="retry")
    adapter = RealVllmScheduler(config, lambda _e: None, SPACE, kv_connector="fail")
    assert type(adapter.sched.connector).__name__ == "SchedspecKvConnector"
    assert adapter.sched.recompute_kv_load_failures is False
