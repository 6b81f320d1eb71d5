"""Vidur's REAL replica schedulers with several pipeline stages, run by Vidur's own event loop
(`integrations.vidur.pipeline`) and checked against `spec.ar.pipeline` after every tick, with
every decision compared with the project's stage scheduler (`scripts/vidur_pipeline_check.py`).

- With the fixes of their findings (`PIPELINE_FIXES_OF`), vLLM, Sarathi, Orca,
  FasterTransformer and Mnemosyne keep every pipeline rule and decide as their twins at 2 and 4
  stages; the twin comparison alone tells apart what the rules cannot (vLLM's needless restart,
  Mnemosyne's batch order and its release's queues).
- Finding: Vidur's vLLM, Sarathi and Mnemosyne split `batch_size_cap` over the stages with a floor
  division, so with fewer seats than stages no batch is ever formed (`progress`);
  `micro-batch-floor` is the candidate fix.
- Behind Vidur's real global scheduler (round robin, least outstanding requests), three
  replicas route as `spec.ar.routing` says and each decides as its twin.
- Each pipeline rule, and the routing rule, has a seeded bug in Vidur's classes that the check
  catches.

Needs `schedspec install-engines vidur` (skipped with SCHEDSPEC_SKIP_ENGINES=1).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.vidur import MANIFEST
from integrations.vidur.adapter import _ExecutionTime
from integrations.vidur.fixes import PIPELINE_FIXES_OF, vidur_fixed
from integrations.vidur.manifest import VIDUR_VERSION, manifest_of
from integrations.vidur.pipeline import (
    PIPELINE_KINDS,
    SEQUENCE_PARALLEL_KINDS,
    KvParallelism,
    PipelineTick,
    VidurPipeline,
)
from spec.ar.config import ArConfig, ArRequest
from spec.ar.pipeline import PipelineSnapshot, check_pipeline
from spec.errors import (
    ConfigError,
    DuplicateRequest,
    RequestError,
    RequestTooLarge,
    SchedulerStalled,
    SpecViolation,
)
from spec.profile import ConfigOutsideProfile
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.tier import depth, full_tier

ROOT = Path(__file__).resolve().parents[1]
check = load_script("vidur_pipeline_check")


@pytest.fixture(autouse=True)
def vidur() -> None:
    require_engine(MANIFEST, "vidur", "Vidur")


def config(**changes: Any) -> ArConfig:
    base = ArConfig(
        block_size=2,
        num_blocks=40,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=16,
        num_stages=2,
        enable_chunked_prefill=False,
    )
    return base.replace(**changes)


def first_failure(kind: str, stages: int, programs: int) -> str | None:
    for seed in range(programs):
        failure: str | None = check.check_one(kind, stages, seed)
        if failure is not None:
            return f"seed {seed}: {failure}"
    return None


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("kind", PIPELINE_KINDS)
def test_fixed_pipelines_keep_the_rules_and_decide_as_their_twins(kind: str, stages: int) -> None:
    """150 generated programs each (2,000 each at 2, 4 and 8 stages passed once, docs)."""
    if kind in ("orca", "ft") and VIDUR_VERSION != "0.0.25":
        pytest.skip(f"Vidur {VIDUR_VERSION} has no {kind} scheduler")
    with vidur_fixed(PIPELINE_FIXES_OF[kind]):
        assert first_failure(kind, stages, 150) is None


@pytest.mark.parametrize("stages", [2, 4])
def test_fasterTransformers_batch_end_hold_matters_in_a_pipeline(stages: int) -> None:
    """With several stages a new static batch forms while another is in flight, so the hold of
    FasterTransformer's batch-end free changes what is admitted. Its faithful fix
    (`ft-free-at-batch-end`, `PIPELINE_FIXES_OF["ft"]`) keeps the pipeline rules only because
    they read the declaration (`batch_end_free`: without it some of 60 programs fail
    `pipeline_blocks_conserved`), and the alternative that frees at the finish
    (`ft-free-on-finish`) decides otherwise than the stage twin, which holds, on some."""
    if VIDUR_VERSION != "0.0.25":
        pytest.skip(f"Vidur {VIDUR_VERSION} has no FasterTransformer scheduler")

    def undeclared(snapshot: PipelineSnapshot) -> None:
        check_pipeline(dataclasses.replace(snapshot, batch_end_free=False))

    broken = differ = 0
    programs = [check.program("ft", stages, seed, 1) for seed in range(60)]
    with vidur_fixed(PIPELINE_FIXES_OF["ft"]):
        for config, requests in programs:
            try:
                VidurPipeline("ft", config, on_snapshot=undeclared).run(requests)
            except SpecViolation as err:
                assert err.rule == "pipeline_blocks_conserved", err
                broken += 1
    with vidur_fixed(["ft-free-on-finish", "reservation-ceil"]):
        for config, requests in programs:
            real = VidurPipeline("ft", config).run(requests)
            twin = check.twin_run("ft", config, requests, False)
            differ += check.first_difference(real, 0, twin) is not None
    assert broken > 0 and differ > 0, (broken, differ)


def test_the_twin_tells_vidurs_needless_restart_apart() -> None:
    """vLLM with `micro-batch-floor` but not `vllm-decode-block`: the pipeline rules hold, and
    the twin comparison is what finds the finding, a restart the twin does not make."""
    with vidur_fixed(["micro-batch-floor"]):
        found = first_failure("vllm", 2, 40)
    assert found is not None and found.startswith("seed 8: twin_decisions: Vidur PipelineTick("), (
        found
    )
    assert "restarted=('r9',)) / twin PipelineTick(tick=32" in found


def without(kind: str, fix: str) -> tuple[str, ...]:
    """`kind`'s pipeline fixes less `fix`."""
    assert fix in PIPELINE_FIXES_OF[kind]
    return tuple(f for f in PIPELINE_FIXES_OF[kind] if f != fix)


def test_the_twin_tells_mnemosynes_batch_order_apart() -> None:
    """Mnemosyne without `mnemosyne-batch-order` (a `KVParallelBatch` lists its requests in a
    set's order, i.e. by address, so which programs differ changes from run to run): every
    pipeline rule holds, and only the twin sees the decodes out of order (in an ad-hoc run,
    137 of 200 programs at one stage differed)."""
    with vidur_fixed(without("mnemosyne", "mnemosyne-batch-order")):
        found = [check.check_one("mnemosyne", 1, seed) for seed in range(20)]
    failures = [f for f in found if f is not None]
    assert failures, "no program's decodes came out of order"
    assert all(f.startswith("twin_decisions: Vidur PipelineTick(") for f in failures), failures
    assert " / twin PipelineTick(" in failures[0]


def test_the_twin_tells_mnemosynes_releases_apart() -> None:
    """The other release's Mnemosyne as the twin (0.0.25 keeps admitted requests between chunks
    in its request queue, 0.0.26 reads them first from a queue of their own): a program where
    a partial prefill and a new request compete for the chunk tells them apart."""
    other = {"vidur-mnemosyne": "vidur-mnemosyne-one-queue"}.get(
        check.TWIN_OF["mnemosyne"], "vidur-mnemosyne"
    )
    with pytest.MonkeyPatch.context() as patch, vidur_fixed(PIPELINE_FIXES_OF["mnemosyne"]):
        patch.setitem(check.TWIN_OF, "mnemosyne", other)
        found = first_failure("mnemosyne", 2, 40)
    assert found is not None and found.startswith("seed 27: twin_decisions: Vidur PipelineTick("), (
        found
    )
    assert "tick=5" in found


def test_mnemosynes_skipped_new_request_keeps_its_prefill_in_a_pipeline() -> None:
    """The one-stage finding (`mnemosyne-skip-frees`) in a pipeline: a new request allocated its
    whole prefill, then skipped because the chunk was spent, waits holding those blocks."""
    with vidur_fixed(without("mnemosyne", "mnemosyne-skip-frees")):
        found = first_failure("mnemosyne", 2, 40)
    assert found is not None and found.startswith("seed 26: pipeline_blocks_conserved:"), found
    assert "'r3' (waiting) holds 8 blocks" in found and "waiting ['r3']" in found


LONE = [(0, ArRequest("a", 4, 3)), (0, ArRequest("b", 4, 2))]


@pytest.mark.parametrize("kind", ["vllm", "sarathi", "mnemosyne"])
def test_finding_fewer_seats_than_stages_never_schedule(kind: str) -> None:
    """One seat, two stages: `batch_size_cap // num_stages` = 0 requests a micro-batch, so
    Vidur forms no batch and its event queue empties with both requests waiting. With
    `micro-batch-floor` each micro-batch holds one: the seat cap then lets one request run at a
    time, one stage in two idle, as the project's stage scheduler does."""
    cfg = config(max_num_seqs=1, enable_chunked_prefill=kind in ("sarathi", "mnemosyne"))
    others = PIPELINE_FIXES_OF[kind][:-1]  # its other fixes, not this one
    with vidur_fixed(others), pytest.raises(SpecViolation) as err:
        VidurPipeline(kind, cfg).run(LONE)
    assert err.value.rule == "progress"
    assert "emptied at tick 0 with ['a', 'b'] unfinished" in str(err.value)
    assert "waiting ['a', 'b']" in str(err.value)
    with vidur_fixed(PIPELINE_FIXES_OF[kind]):
        run = VidurPipeline(kind, cfg).run(LONE)
        twin = check.twin_run(kind, cfg, LONE)
        assert (run.decisions, run.finished) == (twin.decisions, twin.finished)
    assert [d.tick for d in run.decisions] == [0, 2, 4, 6, 8] and run.peak_in_flight == 1
    assert run.finished == ((6, "a"), (10, "b"))


def test_finding_fasterTransformer_holds_a_finished_requests_blocks_in_a_pipeline() -> None:
    """The one-stage finding (`ft-free-at-batch-end`) in a pipeline: 'a' finishes at tick 2
    while 'b', its batch mate, runs on; 'a' may keep its reservation until the batch ends
    (FasterTransformer's batch-end free, declared), and keeps it after."""
    if VIDUR_VERSION != "0.0.25":
        pytest.skip(f"Vidur {VIDUR_VERSION} has no FasterTransformer scheduler")
    program = [(0, ArRequest("a", 4, 1)), (0, ArRequest("b", 4, 5))]
    with pytest.raises(SpecViolation) as err:
        VidurPipeline("ft", config()).run(program)
    assert err.value.rule == "pipeline_blocks_conserved"
    assert "'a' (finished) holds 8 blocks after its static batch 0 ended" in str(err.value)
    assert "batch-end free" in str(err.value)
    with vidur_fixed(PIPELINE_FIXES_OF["ft"]):
        assert VidurPipeline("ft", config()).run(program).finished == ((2, "a"), (10, "b"))


def test_in_vidurs_own_loop_the_needless_restart_costs_a_recompute_not_a_step() -> None:
    """`vllm-decode-block`'s counterexample (tests/test_real_vidur.py) in Vidur's own loop, one
    stage: the decode of the 4th token fits r0's two blocks, yet Vidur demands a free one and
    restarts r0, so `on_schedule` forms no batch. The adapter takes that as an empty step
    (`progress`); Vidur's loop calls `on_schedule` again at the same instant (each batch end
    brings two `ReplicaScheduleEvent`s), which re-admits r0 to recompute 4 tokens where a
    1-token decode would do. The fix makes it that decode."""
    cfg = config(num_blocks=3, max_num_seqs=1, max_num_batched_tokens=5, max_model_len=5)
    program = [(0, ArRequest("r0", 3, 2))]
    one = cfg.replace(num_stages=1)
    run = VidurPipeline("vllm", one).run(program)
    assert run.decisions == (
        PipelineTick(0, 0, (("r0", 3),), ()),
        PipelineTick(1, 0, (("r0", 4),), ("r0",)),
    )
    assert run.finished == ((2, "r0"),)
    with vidur_fixed(["vllm-decode-block"]):
        fixed = VidurPipeline("vllm", one).run(program)
    assert fixed.decisions == (
        PipelineTick(0, 0, (("r0", 3),), ()),
        PipelineTick(1, 0, (("r0", 1),), ()),
    )
    assert fixed.finished == run.finished


# ---------------------------------------------------------------------- seeded bugs
Mutant = Callable[[VidurPipeline], None]


def no_stage_gate(p: VidurPipeline) -> None:
    """`on_schedule` without its `_num_running_stages == 0` gate: a second batch forms in the
    tick one stage 0 is busy."""
    s = p.scheduler

    def on_schedule(time: float) -> Any:
        if s._num_running_batches >= s._num_stages:
            return None
        batch = s._get_next_batch(time)
        if batch:
            s._num_running_batches += 1
            s._num_running_stages += 1
        return batch or None

    s.on_schedule = on_schedule


def _finish_only(p: VidurPipeline) -> Callable[[Any], None]:
    s = p.scheduler

    def on_batch_end(batch: Any) -> None:
        s._num_running_batches -= 1
        for r in batch.requests:
            if r.completed:
                s.free(r.id)

    return on_batch_end


def back_after_stage_0(p: VidurPipeline) -> None:
    """A batch's requests are schedulable again once it leaves stage 0, not the last stage."""
    s = p.scheduler
    stage_end = s.on_stage_end

    def on_stage_end(stage_id: int, batch_stage: Any) -> None:
        stage_end(stage_id, batch_stage)
        if stage_id == 0:
            s._preempted_requests.extend(batch_stage.requests)

    s.on_stage_end = on_stage_end
    s.on_batch_end = _finish_only(p)


def drop_unfinished(p: VidurPipeline) -> None:
    """`on_batch_end` frees the finished requests and forgets the rest."""
    p.scheduler.on_batch_end = _finish_only(p)


def free_keeps_count(p: VidurPipeline) -> None:
    """`free` forgets a request's blocks but not their count (`_num_allocated_blocks`)."""
    ledger = p.scheduler._allocation_map

    def free(*ids: int) -> None:
        for i in ids:
            ledger.pop(i, None)

    p._frees[0] = free


class _SlowStage:
    def get_execution_time(self, batch: object, stage: int) -> _ExecutionTime:
        return _ExecutionTime(2.0, 2.0)


def slow_last_stage(p: VidurPipeline) -> None:
    """The last stage takes two ticks: the next batch waits in its queue."""
    s = p.scheduler
    s.get_replica_stage_scheduler(s._num_stages - 1)._execution_time_predictor = _SlowStage()


@pytest.mark.parametrize(
    ("mutant", "rule", "message"),
    [
        (no_stage_gate, "one_batch_per_stage", "both run stage 0"),
        (back_after_stage_0, "one_batch_per_request", "is in batch 0 and in batch 1"),
        (drop_unfinished, "requests_conserved", "lost ['r5']"),
        (free_keeps_count, "pipeline_blocks_conserved", "free 8 + held 5 != usable 18"),
        (slow_last_stage, "stage_cadence", "is in stage 1 at tick 5 (expected it gone after"),
    ],
)
def test_each_pipeline_rule_catches_its_seeded_bug(mutant: Mutant, rule: str, message: str) -> None:
    """Vidur's vLLM (fixed) with one seeded bug, over the generated programs at 2 stages: the
    check fails within the first few programs, naming the rule, with the pipeline shown."""
    with vidur_fixed(PIPELINE_FIXES_OF["vllm"]):
        for seed in range(20):
            cfg, requests = check.program("vllm", 2, seed)
            pipeline = VidurPipeline("vllm", cfg)
            mutant(pipeline)
            try:
                pipeline.run(requests)
            except SpecViolation as err:
                assert err.rule == rule and message in str(err), err
                assert "state:\n    tick " in str(err)
                return
    pytest.fail(f"{mutant.__name__} was not caught in 20 programs")


# ---------------------------------------------------------------------- sequence parallelism
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("kind", SEQUENCE_PARALLEL_KINDS)
def test_sequence_parallel_pipelines_keep_the_rules_and_decide_as_their_twins(
    kind: str, stages: int
) -> None:
    """Vidur's sequence pipeline parallelism, declared to the rules: 100 generated programs each
    in the full tier, 50 per push (2,000 each at 2, 4 and 8 stages passed once, docs)."""
    with vidur_fixed(PIPELINE_FIXES_OF[kind]):
        for seed in range(depth(50, 100)):
            assert check.check_one(kind, stages, seed, sequence_parallel=True) is None, seed


LONG = [(0, ArRequest("a", 12, 2))]


@pytest.mark.parametrize("kind", SEQUENCE_PARALLEL_KINDS)
def test_sequence_parallelism_overlaps_a_requests_prefill_chunks(kind: str) -> None:
    """A 12-token prompt in chunks of 4 over 2 stages: without sequence parallelism each chunk
    waits for the previous one to leave the last stage (ticks 0, 2, 4); with it, for the
    previous one to leave stage 0 (ticks 0, 1, 2), so two chunks of 'a' are in flight at once.
    The rules allow that only when the snapshot declares it: the same run checked without the
    declaration breaks `one_batch_per_request`."""
    cfg = config(block_size=1, max_num_batched_tokens=4, enable_chunked_prefill=True)
    with vidur_fixed(PIPELINE_FIXES_OF[kind]):
        plain = VidurPipeline(kind, cfg).run(LONG)
        parallel = VidurPipeline(kind, cfg, sequence_parallel=True).run(LONG)
        twin = check.twin_run(kind, cfg, LONG, sequence_parallel=True)
        assert (parallel.decisions, parallel.finished) == (twin.decisions, twin.finished)
        undeclared = VidurPipeline(
            kind,
            cfg,
            sequence_parallel=True,
            on_snapshot=lambda s: check_pipeline(dataclasses.replace(s, sequence_parallel=False)),
        )
        with pytest.raises(SpecViolation) as err:
            undeclared.run(LONG)
    chunks = [(d.tick, d.scheduled) for d in plain.decisions][:3]
    assert chunks == [(0, (("a", 4),)), (2, (("a", 4),)), (4, (("a", 4),))]
    chunks = [(d.tick, d.scheduled) for d in parallel.decisions][:3]
    assert chunks == [(0, (("a", 4),)), (1, (("a", 4),)), (2, (("a", 4),))]
    assert parallel.finished == ((6, "a"),) and plain.finished == ((8, "a"),)
    assert err.value.rule == "one_batch_per_request"
    assert "'a' is in batch 0 and in batch 1" in str(err.value)


def decodes_pipelined_like_chunks(p: VidurPipeline) -> None:
    """Sarathi's `on_stage_end` sends a decoding request back when its batch leaves stage 0, as
    it does an unfinished prefill: its next token is scheduled before the last one exists."""
    s = p.scheduler
    stage_end = s.on_stage_end

    def on_stage_end(stage_id: int, batch_stage: Any) -> None:
        stage_end(stage_id, batch_stage)
        if stage_id == 0:
            s._preempted_requests.extend(
                r for r in batch_stage.requests if r.is_prefill_complete and not r.completed
            )

    s.on_stage_end = on_stage_end


def test_a_decode_still_overlaps_nothing_under_sequence_parallelism() -> None:
    """The rule the declaration keeps: a request decoded by a batch in flight is in no other
    batch. Seeded bug `decodes_pipelined_like_chunks`, caught in the first programs."""
    with vidur_fixed(PIPELINE_FIXES_OF["sarathi"]):
        for seed in range(20):
            cfg, requests = check.program("sarathi", 2, seed)
            pipeline = VidurPipeline("sarathi", cfg, sequence_parallel=True)
            decodes_pipelined_like_chunks(pipeline)
            try:
                pipeline.run(requests)
            except SpecViolation as err:
                assert err.rule == "one_batch_per_request", err
                assert "decodes it)" in str(err) and "sequence-parallel prefills" in str(err)
                return
    pytest.fail("decodes_pipelined_like_chunks was not caught in 20 programs")


def test_sarathis_micro_batch_cap_does_not_bound_new_requests() -> None:
    """Vidur's Sarathi stops admitting new requests when the batch holds exactly
    `batch_size_cap // num_stages` (`len(requests) == self._max_micro_batch_size`); running
    prefills are added without that check, so once they take the batch past it, new requests
    are admitted again, up to the seats. With sequence parallelism this happens (4 seats over 4
    stages: a cap of 1, a batch of 3); the twin decides alike (`vidur-sarathi-released`), and no
    rule bounds a micro-batch."""
    cfg, requests = check.program("sarathi", 4, 22)
    assert max(1, cfg.max_num_seqs // cfg.num_stages) == 1
    with vidur_fixed(PIPELINE_FIXES_OF["sarathi"]):
        run = VidurPipeline("sarathi", cfg, sequence_parallel=True).run(requests)
        assert check.check_one("sarathi", 4, 22, sequence_parallel=True) is None
    assert PipelineTick(4, 0, (("r4", 1), ("r1", 1), ("r2", 10)), ()) in run.decisions


# ---------------------------------------------------------------------- KV parallelism
KVP = KvParallelism(2, 8)  # two groups of 8 tokens a request's share, each a pool of 6 blocks
KVP_CONFIG = config(
    num_blocks=7, max_num_batched_tokens=16, num_stages=1, enable_chunked_prefill=True
)
SHORT_GROUP = [(0, ArRequest("a", 6, 2)), (0, ArRequest("b", 12, 2))]


def test_finding_kv_parallelism_allocates_a_request_one_group_short() -> None:
    """'a' takes 3 blocks of group 0; 'b' (12 tokens: 6 blocks, two groups of at most 4) gets
    group 1 whole and its last 2 blocks in group 0, which Vidur chose as its last group, and
    then, testing `if last_kvp_group_id:`, reads group 0 as none chosen: it allocates 'b' 2
    blocks in group 1 alone, and 'b' computes 12 tokens in 2 blocks. `kvp-last-group-zero`
    tests `is not None`."""
    others = without("mnemosyne", "kvp-last-group-zero")
    with vidur_fixed(others), pytest.raises(SpecViolation) as err:
        VidurPipeline("mnemosyne", KVP_CONFIG, kv_parallel=KVP).run(SHORT_GROUP)
    assert err.value.rule == "blocks_cover_tokens"
    assert "'b' (batch 0) holds 2 blocks of 2 tokens for 12 tokens of KV: it needs 6" in str(
        err.value
    )
    with vidur_fixed(PIPELINE_FIXES_OF["mnemosyne"]):
        run = VidurPipeline("mnemosyne", KVP_CONFIG, kv_parallel=KVP).run(SHORT_GROUP)
    assert run.finished == ((2, "a"), (3, "b"))


def test_finding_kv_parallelism_loops_for_ever_without_a_victim() -> None:
    """A decode whose last group is full restarts a queued request holding blocks in that
    group; when none does, `_ensure_can_append_slot`'s loop never ends (Vidur's simulator
    hangs). The pipeline counts the calls in one event and reports `progress`; with
    `kvp-no-victim` the decode restarts itself, as when the queue is empty. Generated program
    37 at one stage, two groups."""
    others = without("mnemosyne", "kvp-no-victim")
    with vidur_fixed(others):
        found = check.check_one("mnemosyne", 1, 37, kv_groups=2)
    assert found is not None and found.startswith("progress: "), found
    assert "ReplicaScheduleEvent at tick 7 never returns: _can_append_slot asked" in found
    with vidur_fixed(PIPELINE_FIXES_OF["mnemosyne"]):
        assert check.check_one("mnemosyne", 1, 37, kv_groups=2) is None


@pytest.mark.parametrize("stages", [1, 2])
def test_fixed_kv_parallel_pipelines_keep_the_rules(stages: int) -> None:
    """Two groups, 80 generated programs, 40 per push (2,000 at 1, 2 and 4 stages passed once,
    docs)."""
    with vidur_fixed(PIPELINE_FIXES_OF["mnemosyne"]):
        for seed in range(depth(40, 80)):
            assert check.check_one("mnemosyne", stages, seed, kv_groups=2) is None, seed


def test_kv_parallelism_refuses_what_vidur_cannot_run() -> None:
    with pytest.raises(ConfigError, match="none for sarathi: only Mnemosyne"):
        VidurPipeline("sarathi", KVP_CONFIG, kv_parallel=KVP)
    with pytest.raises(ConfigError, match="a multiple of the block size 2 above it"):
        VidurPipeline("mnemosyne", KVP_CONFIG, kv_parallel=KvParallelism(2, 7))
    with pytest.raises(ConfigError, match="fewer than 6 blocks' worth"):
        VidurPipeline("mnemosyne", KVP_CONFIG, kv_parallel=KvParallelism(2, 12))
    with pytest.raises(RequestTooLarge, match="needs 10 KV slots but the whole pool has 8"):
        VidurPipeline("mnemosyne", KVP_CONFIG, kv_parallel=KvParallelism(2, 4)).run(
            [(0, ArRequest("a", 6, 4))]
        )


# ---------------------------------------------------------------------- several replicas
@pytest.mark.parametrize("routing", ["round_robin", "lor"])
@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("kind", PIPELINE_KINDS)
def test_replicas_route_as_vidurs_global_scheduler_says_and_decide_as_their_twins(
    kind: str, stages: int, routing: str
) -> None:
    """Three replicas behind Vidur's real global scheduler: every routing round is the
    routing's (`routing_order`), every replica keeps the pipeline rules and decides as its twin
    given the requests routed to it. 40 programs each, 20 per push (2,000 each passed once,
    docs)."""
    if kind in ("orca", "ft") and VIDUR_VERSION != "0.0.25":
        pytest.skip(f"Vidur {VIDUR_VERSION} has no {kind} scheduler")
    with vidur_fixed(PIPELINE_FIXES_OF[kind]):
        for seed in range(depth(20, 40)):
            assert check.check_one(kind, stages, seed, 3, routing) is None, seed


def lor_picks_the_busiest(p: VidurPipeline) -> None:
    """LOR sends each request to the replica with the most waiting requests."""
    glob = p.global_scheduler

    def schedule() -> list[tuple[Any, Any]]:
        glob.sort_requests()
        waiting = {s.replica_id: s.num_pending_requests for s in glob._replica_schedulers.values()}
        mapping = []
        while glob._request_queue:
            replica = max(waiting.items(), key=lambda item: item[1])[0]
            waiting[replica] += 1
            mapping.append((replica, glob._request_queue.pop(0)))
        return mapping

    glob.schedule = schedule


def round_robin_skips_a_turn(p: VidurPipeline) -> None:
    """Round robin advances its counter twice for the first request of every round."""
    glob = p.global_scheduler
    schedule = glob.schedule

    def skipping() -> list[tuple[Any, Any]]:
        if glob._request_queue:
            glob._request_counter += 1
        mapping: list[tuple[Any, Any]] = schedule()
        return mapping

    glob.schedule = skipping


@pytest.mark.parametrize(
    ("routing", "mutant", "message"),
    [
        ("lor", lor_picks_the_busiest, "lor;"),
        ("round_robin", round_robin_skips_a_turn, "round_robin;"),
    ],
)
def test_the_routing_rule_catches_a_seeded_bug(routing: str, mutant: Mutant, message: str) -> None:
    with vidur_fixed(PIPELINE_FIXES_OF["vllm"]):
        for seed in range(20):
            cfg, requests = check.program("vllm", 1, seed, 3)
            pipeline = VidurPipeline("vllm", cfg, routing=routing)
            mutant(pipeline)
            try:
                pipeline.run(requests)
            except SpecViolation as err:
                assert err.rule == "routing_order" and message in str(err), err
                assert "went to replica" in str(err) and "waiting per replica [" in str(err)
                return
    pytest.fail(f"{mutant.__name__} was not caught in 20 programs")


def test_an_unrepaired_restart_is_vidurs_own_assertion() -> None:
    """Without the adapter's repair of vidur's stage counters (`fix_restart=False`), a
    restarted request makes Vidur's `Request.on_batch_stage_end` assert: `implementation_error`
    naming the event."""
    with vidur_fixed(PIPELINE_FIXES_OF["vllm"]):
        for seed in range(200):
            cfg, requests = check.program("vllm", 2, seed)
            run = VidurPipeline("vllm", cfg).run(requests)
            if any(d.restarted for d in run.decisions):
                break
        else:
            pytest.fail("no program of 200 restarts a request")
        with pytest.raises(SpecViolation) as err:
            VidurPipeline("vllm", cfg, fix_restart=False).run(requests)
    assert err.value.rule == "implementation_error"
    assert "raised AssertionError" in str(err.value) and "BatchStageEndEvent" in str(err.value)


# ---------------------------------------------------------------------- clear errors
def test_configurations_and_programs_it_cannot_run_are_typed_errors() -> None:
    with pytest.raises(ConfigError, match="one of vllm, sarathi, orca, ft, mnemosyne"):
        VidurPipeline("lightllm", config(block_size=1))
    divisors = r"a divisor of the 32 layers of Vidur's model: \[1, 2, 4, 8, 16, 32\]"
    with pytest.raises(ConfigError, match=r"num_stages=3: " + divisors):
        VidurPipeline("vllm", config(num_stages=3))
    with pytest.raises(ConfigOutsideProfile):
        VidurPipeline("vllm", config(enable_prefix_caching=True))
    with pytest.raises(ConfigError, match="routing='random'"):
        VidurPipeline("vllm", config(num_replicas=2), routing="random")
    with pytest.raises(ConfigError, match="False for vllm: Vidur runs sequence pipeline"):
        VidurPipeline("vllm", config(), sequence_parallel=True)
    pipeline = VidurPipeline("vllm", config())
    with pytest.raises(DuplicateRequest):
        pipeline.run([(0, ArRequest("a", 4, 2)), (1, ArRequest("a", 3, 1))])
    with pytest.raises(RequestError, match="max_model_len"):
        pipeline.run([(0, ArRequest("a", 40, 2))])
    with pytest.raises(ConfigError, match="arrival tick"):
        pipeline.run([(-1, ArRequest("a", 4, 2))])
    pipeline.run([(0, ArRequest("a", 4, 2))])  # nothing above changed it
    with pytest.raises(SchedulerStalled, match=r"within 3 ticks: unfinished \['a'\]"):
        VidurPipeline("vllm", config()).run([(0, ArRequest("a", 4, 8))], max_ticks=3)
    with pytest.raises(ConfigError, match="one program per VidurPipeline"):
        pipeline.run([(0, ArRequest("b", 4, 2))])


# ---------------------------------------------------------------------- the script
def script(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/vidur_pipeline_check.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_script_passes_fixed_and_fails_as_released_naming_the_finding() -> None:
    fixed = script("--kinds", "vllm,sarathi", "--programs", "40")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "vllm       2       40        40      -" in fixed.stdout
    released = script("--kinds", "sarathi", "--stages", "4", "--programs", "40", "--as-released")
    assert released.returncode == 1, released.stdout + released.stderr
    assert "sarathi, 4 stages, seed" in released.stdout and "[progress]" in released.stdout
    again = released.stdout.split("  again: scripts/vidur_pipeline_check.py ")[1].split()
    alone = script(*again)  # the failing program alone, as the script names it
    assert alone.returncode == 1 and "[progress]" in alone.stdout, alone.stdout
    assert "sarathi    4       1         0" in alone.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stages", "two"], "--stages: comma-separated integers"),
        (["--kinds", "lightllm"], "--kinds: ['lightllm'] unknown"),
        (["--programs", "0"], "must be positive"),
        (["--routing", "random"], "invalid choice: 'random'"),
        (["--kinds", "orca", "--kv-parallel", "2"], "['orca'] unknown with --kv-parallel"),
        (["--kv-parallel", "0"], "must be positive"),
        (
            ["--kinds", "vllm", "--sequence-parallel"],
            "['vllm'] unknown with --sequence-parallel; choose from sarathi,mnemosyne",
        ),
        (["--stages", "3", "--programs", "1"], "error: invalid num_stages=3"),
    ],
)
def test_the_script_refuses_bad_arguments_in_one_line(argv: list[str], message: str) -> None:
    result = script(*argv)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@full_tier
def test_the_newest_release_runs_its_pipelines_too() -> None:
    """vidur 0.0.26 (vLLM, Sarathi, Mnemosyne; it dropped Orca and FasterTransformer): fixed, every
    program passes; as released, the finding."""
    require_engine(
        manifest_of("0.0.26"),
        "vidur",
        "Vidur",
        command="SCHEDSPEC_VIDUR_VERSION=0.0.26 schedspec install-engines vidur",
    )
    env = {**os.environ, "SCHEDSPEC_VIDUR_VERSION": "0.0.26"}
    fixed = script("--kinds", "vllm,sarathi,mnemosyne", "--programs", "40", env=env)
    assert fixed.returncode == 0 and "Vidur 0.0.26, with its fixes" in fixed.stdout, fixed.stdout
    released = script("--kinds", "vllm", "--programs", "40", "--as-released", env=env)
    assert released.returncode == 1 and "[progress]" in released.stdout, released.stdout
