"""Vidur's stage scheduler: a replica split into `num_stages` pipeline stages.

A replica with `num_stages = S` runs up to S micro-batches at once, one per stage: every tick
(one stage time, constant) the batch in the last stage completes, every other batch moves one
stage on, and when stage 0 is free the replica scheduler forms a new batch into it. A request in
a batch in flight is not schedulable until its batch leaves the last stage (Vidur: requests of
a batch in flight are not in `_preempted_requests`), so it is in at most one batch, and only
the requests not in flight can be restarted (preempted) to make room.

The replica scheduler makes every decision (admission, KV blocks, restarts); this module only
moves batches through the stages: `VidurReplicaBase` subclasses driven with `pipelined=True`.
LightLLM keeps refusing `num_stages > 1` (`ConfigError`), as in Vidur.

With `sequence_parallel=True` (Vidur's sequence pipeline parallelism; Sarathi as released and
Mnemosyne) a request's prefill chunk sends it back for its next chunk when its batch leaves
stage 0 rather than the last stage, so several chunks of one request are in flight at once; its
first decode still waits for its last chunk's batch to end. At the end of a tick the batch
leaving stage 0 is handled before the batch leaving the pipeline, as Vidur's event loop handles
every stage end of an instant before the batch end it brings.

Events go to the sink as they happen: the batch's allocations, schedules and restarts at
formation; at the end of each tick `ArStepEnd(tick)`, then the finishes of the completing batch.
With one stage this is the replica's own step, event for event, and `ArSpecMachine` checks it;
with several stages a request computes its tokens S ticks after it was scheduled, which the AR
spec (one batch per step) does not model: `check_pipeline` checks what holds instead
(`spec.ar.pipeline`: the stage cadence, one batch per stage, a request in at most one batch in
flight, requests and KV blocks conserved).
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.ar.base import ArReq
from reference.ar.mnemosyne import MnemosyneOneQueue, VidurMnemosyne
from reference.ar.vidur import (
    VidurFasterTransformer,
    VidurOrca,
    VidurReplicaBase,
    VidurSarathi,
    VidurVllm,
)
from reference.ar.vidur_released import VidurSarathiReleased, VidurVllmReleased
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArStepEnd
from spec.ar.pipeline import BatchInFlight, PipelineSnapshot, check_pipeline
from spec.errors import ConfigError, SchedulerStalled

STAGE_REPLICAS: dict[str, type[VidurReplicaBase]] = {
    "vidur-vllm": VidurVllm,
    "vidur-sarathi": VidurSarathi,
    "vidur-orca": VidurOrca,
    "vidur-ft": VidurFasterTransformer,
    # Mnemosyne FCFS fixed-chunk: 0.0.26's partial-prefill queue, 0.0.25's one queue
    "vidur-mnemosyne": VidurMnemosyne,
    "vidur-mnemosyne-one-queue": MnemosyneOneQueue,
    # as Vidur's releases decide (`reference.ar.vidur_released`): the twins of the real classes
    "vidur-vllm-released": VidurVllmReleased,
    "vidur-sarathi-released": VidurSarathiReleased,
}


@dataclass(slots=True)
class MicroBatch:
    """One batch in flight: the requests and the tokens each computes, formed at `formed_at`;
    `decodes`: the requests whose prefill was complete when it formed."""

    batch_id: int
    formed_at: int
    tokens: dict[str, int]
    requests: list[ArReq]
    decodes: frozenset[str]


class StageScheduler:
    """Pipeline stages over one Vidur replica scheduler (one batch per stage in flight; with
    sequence parallelism, prefill chunks of one request in several)."""

    def __init__(
        self,
        config: ArConfig,
        sink: ArEventSink,
        replica: str = "vidur-vllm",
        *,
        sequence_parallel: bool = False,
    ) -> None:
        cls = STAGE_REPLICAS.get(replica)
        if cls is None:
            raise ConfigError(
                "replica", replica, f"one of {sorted(STAGE_REPLICAS)} (LightLLM has no stages)"
            )
        self.config = config
        self.sink = sink
        self.replica: VidurReplicaBase = cls(
            config, sink, pipelined=True, sequence_parallel=sequence_parallel
        )
        self.stages: list[MicroBatch | None] = [None] * config.num_stages
        self.tick: int = 0
        self.next_batch: int = 0
        self.aborting: set[str] = set()
        self.submitted: set[str] = set()
        self.aborted: set[str] = set()
        self.peak_in_flight: int = 0  # most batches running at once (during a tick)

    # ------------------------------------------------------------------ operations
    def submit(self, request: ArRequest) -> None:
        """Submit to the replica scheduler (its validation and `ArSubmitted`); the id is recorded as
        submitted for `check_pipeline`."""
        self.replica.submit(request)
        self.submitted.add(request.request_id)

    def abort(self, request_id: str) -> None:
        """Abort now, or, for a request in a batch in flight, when the last batch that holds it
        completes (it gets no further chunk meanwhile)."""
        if request_id in self.in_flight():
            self.aborting.add(request_id)
            self.replica.unqueue(request_id)
            return
        self.replica.abort(request_id)
        self.aborted.add(request_id)

    def in_flight(self) -> dict[str, int]:
        """Request id -> the last stage of a batch that holds it."""
        return {rid: k for k, b in enumerate(self.stages) if b is not None for rid in b.tokens}

    def occupancy(self) -> tuple[int | None, ...]:
        """The batch id in each stage (None: the stage is free)."""
        return tuple(None if b is None else b.batch_id for b in self.stages)

    def is_idle(self) -> bool:
        """The replica has nothing waiting or running and every stage is free."""
        return self.replica.is_idle() and all(b is None for b in self.stages)

    def step(self) -> None:
        """One tick: form a batch into stage 0 if it is free, run every stage, complete the batch
        in the last stage, move the others one stage on. With sequence parallelism the batch
        leaving stage 0 first sends its unfinished prefills back for their next chunk (Vidur
        handles every stage end of an instant before the batch end it brings)."""
        if self.stages[0] is None:
            self.stages[0] = self._form()
        self.peak_in_flight = max(self.peak_in_flight, sum(b is not None for b in self.stages))
        self.sink(ArStepEnd(self.tick))
        done, leaving = self.stages[-1], self.stages[0]
        self.stages = [None, *self.stages[:-1]]
        if self.replica.sequence_parallel and leaving is not None:
            for req in leaving.requests:
                if req.rid not in self.aborting:
                    self.replica.stage_zero_done(req, leaving.tokens[req.rid])
        if done is not None:
            self._complete(done)
        for req in self.replica.waiting:
            req.waited += 1
        self.tick += 1
        self.replica.step_index = self.tick

    def drain(self, max_ticks: int = 100_000) -> None:
        """Tick until idle; after `max_ticks` ticks with work left raise `SchedulerStalled` naming
        the stages' occupancy."""
        for _ in range(max_ticks):
            if self.is_idle():
                return
            self.step()
        if not self.is_idle():
            raise SchedulerStalled(max_ticks, f"pipeline busy: {self.occupancy()}", "ticks")

    # ------------------------------------------------------------------ internals
    def _form(self) -> MicroBatch | None:
        r = self.replica
        r.scheduled = {}
        r.step_preempted = []
        r.step_index = self.tick
        r._schedule()
        batch, r.batch = r.batch, []
        if not batch:
            return None
        self.next_batch += 1
        decodes = frozenset(req.rid for req in batch if r.decoding(req))
        return MicroBatch(self.next_batch - 1, self.tick, dict(r.scheduled), batch, decodes)

    def _complete(self, batch: MicroBatch) -> None:
        r = self.replica
        for req in batch.requests:
            n = batch.tokens[req.rid]
            req.num_computed += n
            req.attained += n
            if req.num_computed == req.known:
                req.num_output += 1
                if req.first_token is None:
                    req.first_token = self.tick
        r.step_index = self.tick
        flying = self.in_flight()  # with sequence parallelism: other chunks still running
        for req in batch.requests:
            if req.rid in self.aborting:
                if req.rid not in flying:
                    self.aborting.discard(req.rid)
                    r.abort(req.rid)  # out of running, its blocks freed, `ArAborted`
                    self.aborted.add(req.rid)
                continue
            reason = req.finish_reason()
            if reason is not None:
                r._finish(req, reason)
            else:
                r._requeue(req)  # Vidur's `on_batch_end` (the released Sarathi's prefill flag)

    # ------------------------------------------------------------------ invariants
    def pipeline_snapshot(self) -> PipelineSnapshot:
        """The pipeline between ticks (`spec.ar.pipeline`): `stages[k]` runs stage k in tick
        `self.tick`; held blocks are the running requests' block tables, and their KV tokens
        their computed tokens plus those of their batches in flight."""
        r = self.replica
        batches = tuple(
            BatchInFlight(b.batch_id, b.formed_at, k, tuple(b.tokens), b.decodes)
            for k, b in enumerate(self.stages)
            if b is not None
        )
        held = {q.rid: len(q.blocks) for q in r.running}
        # FasterTransformer's batch-end free: finished requests holding blocks, and the static
        # batch of each of those and of the running requests
        batch_of = {rid: n for rid in held if (n := r.static_batch(rid)) is not None}
        for req, batch in r.kept_until_batch_end():
            held[req.rid] = len(req.blocks)
            batch_of[req.rid] = batch
        computing: dict[str, int] = {}  # tokens of the batches in flight, by request
        for b in filter(None, self.stages):
            for rid, n in b.tokens.items():
                computing[rid] = computing.get(rid, 0) + n
        return PipelineSnapshot(
            tick=self.tick,
            num_stages=len(self.stages),
            batches=batches,
            waiting=tuple(q.rid for q in r.waiting),
            pending=tuple(q.rid for q in r.between_batches()),
            finished=tuple(r.finished),
            aborted=tuple(self.aborted),
            submitted=frozenset(self.submitted),
            held_blocks=held,
            free_blocks=r.pool.num_free,
            usable_blocks=self.config.usable_blocks,
            sequence_parallel=r.sequence_parallel,
            block_size=self.config.block_size,
            kv_tokens={q.rid: q.num_computed + computing.get(q.rid, 0) for q in r.running},
            batch_end_free=r.rules.free_at_batch_end,
            static_batch_of=batch_of,
        )

    def check_pipeline(self) -> None:
        """Raise `SpecViolation` (a `spec.ar.pipeline.PipelineRule`) unless the pipeline rules
        hold on `pipeline_snapshot()`."""
        check_pipeline(self.pipeline_snapshot())


def make_stage_scheduler(
    config: ArConfig,
    sink: ArEventSink,
    replica: str = "vidur-vllm",
    *,
    sequence_parallel: bool = False,
) -> StageScheduler:
    """Factory: a `StageScheduler` over the Vidur replica scheduler `replica` (a key of
    `STAGE_REPLICAS`; `ConfigError` for another, for a config that replica refuses, or for
    sequence parallelism over a replica that has none)."""
    return StageScheduler(config, sink, replica, sequence_parallel=sequence_parallel)


__all__ = [
    "STAGE_REPLICAS",
    "MicroBatch",
    "StageScheduler",
    "make_stage_scheduler",
]
