"""`VidurAdapter`: one of Vidur's REAL replica schedulers as a `spec.ar.adapter.ArSchedulerAdapter`.

What runs for real (vidur 0.0.25): the replica scheduler class itself, built by its own
`__init__` from Vidur's own config dataclasses (`ReplicaConfig`, the scheduler's config,
`SyntheticRequestGeneratorConfig` carrying max_model_len as `max_tokens`) and a real `Replica`;
`on_schedule` (its `_get_next_batch`, `_can_allocate_request`, `allocate`, `free`, restarts,
`can_allocate`), `on_stage_end`, `on_batch_end`; the real `ReplicaStageScheduler`, `Batch`,
`BatchStage` and `Request` entities (`Request.on_batch_end` does the token accounting and
completion, `Request.restart` the recompute). One step is exactly what Vidur's event loop does
for one batch on a one-stage replica: ReplicaScheduleEvent (`on_schedule`, `Batch.on_schedule`),
BatchStageArrival / ReplicaStageSchedule (`add_batch`, stage `on_schedule`,
`BatchStage.on_schedule`), BatchStageEnd (`BatchStage.on_stage_end`, stage `on_stage_end`,
replica `on_stage_end`) and BatchEnd (`Batch.on_batch_end`, replica `on_batch_end`). One
difference: at a batch end Vidur's loop calls `on_schedule` twice at the same instant (the
ReplicaScheduleEvents of stage 0's end and of the batch's end), so an attempt that forms no
batch after restarting its own request is retried at once; the adapter makes that retry its
next step, with an empty step in between. Only Vidur's vLLM restarts a request and then forms
nothing, and with one stage only as released (vLLM v0's needless restart, which its profile
declares: `preemption_may_empty_step`);
`integrations.vidur.pipeline` runs Vidur's loop itself.

Stubs and private state the adapter touches, each with why:

- execution-time predictor: `_ConstantTime`, a duck-typed stand-in whose
  `get_execution_time(batch, stage)` returns 1.0 s for every batch (the scheduler decisions do
  not depend on it; Vidur's predictors need profiling data and scikit-learn);
- `integrations.vidur.engine`: placeholder modules for sklearn / pandas / fasteners /
  huggingface_hub while Vidur's modules are imported (never called);
- `allocate` and `free` (public methods of `BaseReplicaScheduler`) are wrapped on the instance:
  each call goes through unchanged, then the adapter diffs `_allocation_map` (request id ->
  block count, Vidur's only record of KV; Mnemosyne's is `_req_block_counter`) against its own
  block names and emits `ArBlocksAllocated` / `ArPreempted` / `ArBlocksFreed`. Vidur counts
  blocks and never names them, so the adapter names them: ids 0..n-1 (1..n with the null block
  reserved: Vidur has no null block, so it gets the usable blocks) from a FIFO free list. A
  removal inside `on_schedule` of a request whose `num_restarts` grew is a preemption (Vidur's
  restart); anything else is a free. A request given more blocks than the pool has free (a
  subclass's `allocate` without Vidur's assertion) is a `kv_exclusive` violation;
- `_allocation_map` (read), `get_pending_requests()` (Vidur's `_request_queue`, read and, for
  an abort, edited), `_preempted_requests` and, for FasterTransformer, `_preempted_batches`
  (edited only by an abort): Vidur has no abort, so the adapter removes the request from
  those queues (dropping a FasterTransformer batch the abort left with nothing to run, no
  request or only completed ones, which Vidur itself never has) and calls the real `free`. A
  subclass that keeps pending requests elsewhere (still listed by `get_pending_requests()`
  once out of those queues) cannot be driven: the abort raises `CannotDrive`;
- `Request._num_stage_processed_tokens` / `_is_prefill_stage_complete` (written): vidur
  0.0.25's `Request.restart()` resets the processed tokens but not these pipeline-stage
  counters (added in 0.0.2x for sequence pipeline parallelism; microsoft/vidur's main branch
  has no such counters), so every restarted request raises AssertionError in
  `Request.on_batch_stage_end` / `on_batch_end` at its next batch: Vidur's own simulator
  cannot survive a restart. The adapter resets them right after a restart (inside the wrapped
  `free` that follows it), so the replica schedulers' decisions can be checked past the first
  restart; `fix_restart=False` turns this off (the regression test shows the crash);
- `FasterTransformerReplicaScheduler._preempted_batches`: vidur 0.0.25 never initialises it
  (microsoft/vidur's main branch does, in the class's `__init__`); without it the class raises
  AttributeError at the first batch that does not finish entirely, so the adapter sets it to
  an empty list after construction.

Transcript: `native_calls()` says the calls made on the scheduler, in Vidur's terms
(`integrations.vidur.transcript`), recorded as the adapter makes them: what a failing example
prints after its spec calls.

Requests: Vidur knows each request's decode length in advance, so a request is submitted with
`num_decode_tokens` = its final output length (max_tokens, or stop_after when that comes
first; the finish reason is then STOP). Priorities and predicted lengths are ignored (Vidur's
replica schedulers are FCFS).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from integrations.vidur.batch_context import check_batch_context
from integrations.vidur.transcript import VidurTranscript, read
from spec.ar.adapter import ArEventSink, drain_steps
from spec.ar.config import ArConfig, ArRequest, ArRules, validate_ar_request
from spec.ar.events import (
    ArAborted,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArFinished,
    ArFinishReason,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.rules import ArRule
from spec.ar.snapshot import ArSnapshot
from spec.errors import CannotDrive, DuplicateRequest, SpecViolation, UnknownRequest

BATCH_TIME = 1.0  # seconds per batch: Vidur's clock advances, nothing depends on the value
#: Vidur's queues of pending requests the adapter edits for an abort: `_request_queue` (every
#: scheduler) and Mnemosyne 0.0.26's `_partial_prefill_queue`.
_PENDING_QUEUES: tuple[str, ...] = ("_request_queue", "_partial_prefill_queue")


@dataclass(frozen=True, slots=True)
class _ExecutionTime:
    """What `BatchStage` reads from Vidur's `ExecutionTime`: total and model time."""

    total_time: float = BATCH_TIME
    model_time: float = BATCH_TIME

    def to_dict(self) -> dict[str, float]:
        return {"total_time": self.total_time, "model_time": self.model_time}


class _ConstantTime:
    """Stands in for Vidur's execution-time predictor: every batch takes BATCH_TIME."""

    def get_execution_time(self, batch: object, pipeline_stage: int) -> _ExecutionTime:
        return _ExecutionTime()


@dataclass(slots=True)
class _Tracked:
    spec: ArRequest
    vidur: Any  # vidur.entities.Request
    restarts: int = 0
    finished: bool = False
    aborted: bool = False


class VidurAdapter:
    """Drives `scheduler` (a real Vidur replica scheduler) and reports AR events to `sink`."""

    def __init__(
        self,
        config: ArConfig,
        sink: ArEventSink,
        *,
        kind: str,
        rules: ArRules,
        scheduler: Any,
        request_cls: Any,
        fix_restart: bool = True,
    ) -> None:
        self._config = config
        self._rules = rules
        self.sink = sink
        self.kind = kind
        self.scheduler = scheduler
        self._request_cls = request_cls
        self.fix_restart = fix_restart
        self.stage: Any = scheduler.get_replica_stage_scheduler(0)  # Vidur's stage scheduler
        first = 1 if config.reserve_null_block else 0
        self._free_ids: deque[int] = deque(range(first, config.num_blocks))
        self._names: dict[int, list[int]] = {}  # Vidur request id -> the adapter's block ids
        self._by_vid: dict[int, _Tracked] = {}
        self._by_rid: dict[str, _Tracked] = {}
        self._admitted: list[str] = []  # running, in admission order
        self._in_schedule = False
        self.step_index: int = 0
        self.time: float = 0.0  # simulated seconds
        self._allocate: Callable[..., None] = scheduler.allocate
        self._free: Callable[..., None] = scheduler.free
        scheduler.allocate = self._allocate_wrapped
        scheduler.free = self._free_wrapped
        #: The calls made on Vidur's scheduler, in Vidur's terms (`native_calls`): what a
        #: failing example is printed with after its spec calls.
        self.transcript: VidurTranscript = VidurTranscript(scheduler, BATCH_TIME)

    # ------------------------------------------------------------------ protocol
    @property
    def config(self) -> ArConfig:
        """The `ArConfig` the replica scheduler was built for."""
        return self._config

    @property
    def rules(self) -> ArRules:
        """The ordering rules the factory gave: the Vidur profile's `rules_for(config)`."""
        return self._rules

    def submit(self, request: ArRequest) -> None:
        """`validate_ar_request`, then `DuplicateRequest` for an id submitted before (both before
        any change); else `add_request` a Vidur `Request` (arrival time: its submission index;
        decode tokens: its `final_output`) and emit `ArSubmitted` (without `prompt`)."""
        validate_ar_request(self._config, request)
        if request.request_id in self._by_rid:
            raise DuplicateRequest(request.request_id)
        vreq = self._request_cls(float(len(self._by_rid)), request.prompt_len, request.final_output)
        tracked = _Tracked(request, vreq)
        self._by_rid[request.request_id] = tracked
        self._by_vid[vreq.id] = tracked
        call = self.transcript.added(vreq, request.request_id)
        self.scheduler.add_request(vreq)
        call.result = ()
        self.sink(
            ArSubmitted(
                request.request_id,
                request.prompt_len,
                request.max_tokens,
                request.stop_after,
                request.priority,
                request.predicted_len,
            )
        )

    def abort(self, request_id: str) -> None:
        """Vidur has no abort: take the request out of its pending queues, `_preempted_requests` and
        FasterTransformer's `_preempted_batches` (a batch left with nothing to run dropped, its
        requests' memory freed, with that of the earlier finishers its `_pending_free_map` entry
        carries), call the real `free` if it holds KV (`ArBlocksFreed`), then
        emit `ArAborted`. An unknown, finished or aborted id raises `UnknownRequest`, changing
        nothing. A class that still lists the request as pending (`get_pending_requests()`)
        once it is out of those queues keeps it where the adapter cannot reach: `CannotDrive`
        (`_check_unqueued`), before any event."""
        tracked = self._by_rid.get(request_id)
        if tracked is None or tracked.finished or tracked.aborted:
            raise UnknownRequest(request_id, len(self._waiting()) + len(self._running()))
        vreq = tracked.vidur
        call = self.transcript.aborting(request_id, vreq.id)
        self._remove_pending(vreq)
        self._check_unqueued(request_id, vreq)
        pending = getattr(self.scheduler, "_preempted_requests", [])
        if vreq in pending:
            pending.remove(vreq)
            self.transcript.op("unqueued", vreq.id, "_preempted_requests")
        batches = getattr(self.scheduler, "_preempted_batches", None)
        if batches is not None:
            for batch in batches:
                if vreq in batch.requests:
                    batch.requests.remove(vreq)
                    self.transcript.op("unqueued", vreq.id, "_preempted_batches")
            # A batch the abort left with nothing to run (no request, or only completed ones)
            # would cost FasterTransformer an empty step: `_generate_next_batch_from_preempted`
            # returns no batch for it. Vidur never has one, since a batch whose requests all
            # completed never becomes preempted (`on_batch_end`): treat it so, gone with its
            # memory freed.
            # A batch's earlier finishers, carried to its end (`ft-free-at-batch-end`), go with it.
            done = [b for b in batches if all(r.completed for r in b.requests)]
            batches[:] = [b for b in batches if b not in done]
            carried: dict[int, list[int]] = getattr(self.scheduler, "_pending_free_map", {})
            for batch in done:
                batch_id = read("Batch.id", getattr, batch, "id")
                self.transcript.op("dropped", batch_id, tuple(r.id for r in batch.requests))
                ids = [r.id for r in batch.requests] + carried.pop(batch_id, [])
                for vid in ids:
                    if vid in self._ledger():
                        self.scheduler.free(vid)
        if vreq.id in self._ledger():
            self.scheduler.free(vreq.id)
        self._sync()
        tracked.aborted = True
        if request_id in self._admitted:
            self._admitted.remove(request_id)
        call.result = ()
        self.sink(ArAborted(request_id))

    def step(self) -> None:
        """Vidur's `on_schedule` (`ArBlocksAllocated`, `ArPreempted` for a restart, `ArBlocksFreed`
        emitted as the wrapped `allocate` / `free` run), the batch's attention contexts checked
        (`batch_context`: `integrations.vidur.batch_context`), `ArScheduled` per request of its
        batch, `ArStepEnd`, then the batch through Vidur's stage and batch-end events
        (`BATCH_TIME` on the clock), emitting frees and `ArFinished` (the reason `stop_after`
        implies)."""
        self._in_schedule = True
        call = self.transcript.scheduling(self.time)
        try:
            batch = self.scheduler.on_schedule(self.time)
            self._sync()
        finally:
            self._in_schedule = False
        scheduled = _scheduled(batch) if batch is not None else []
        self.transcript.formed(call, batch, scheduled)
        if batch is not None:
            check_batch_context(batch, self.kind, self.scheduler, self._named)
        if batch is not None:
            for vreq, n in scheduled:
                rid = self._by_vid[vreq.id].spec.request_id
                if rid not in self._admitted:
                    self._admitted.append(rid)
                self.sink(ArScheduled(rid, n))
        self.sink(ArStepEnd(self.step_index))
        if batch is not None:
            self._run(batch)
        self.step_index += 1

    def _named(self, vreq: Any) -> str:
        """A Vidur request as a message names it: the spec's id and Vidur's."""
        return f"{self._by_vid[vreq.id].spec.request_id!r} (Vidur request {vreq.id})"

    def native_calls(self) -> str:
        """The calls this adapter made on Vidur's replica scheduler so far, one per line, in
        Vidur's terms (`integrations.vidur.transcript`): the construction, `add_request`, per
        step `on_schedule` (the batch and the `allocate` / `restart()` / `free` inside) and
        `on_batch_end`, and the adapter's edits for an abort. The optional adapter method a
        failing example's report prints after its spec calls; it never raises."""
        return self.transcript.text()

    def drain(self, max_steps: int = 100_000) -> None:
        """`drain_steps` over `step` and `is_idle`; `SchedulerStalled` names the waiting and running
        counts."""
        drain_steps(
            self.step,
            self.is_idle,
            lambda: (len(self._waiting()), len(self._running())),
            max_steps,
        )

    def is_idle(self) -> bool:
        """No request waiting (pending in Vidur, not admitted since its last restart) and none
        running (admitted, not completed)."""
        return not self._waiting() and not self._running()

    def snapshot(self) -> ArSnapshot:
        """Owners from the adapter's block names, which mirror Vidur's block counts (Vidur names no
        block), every other block free; running: admitted requests not completed, in admission
        order; waiting: Vidur's pending ones; computed: `num_processed_tokens`, less the token
        sampled at the end of a complete prefill."""
        owners = {
            b: self._by_vid[vid].spec.request_id for vid, ids in self._names.items() for b in ids
        }
        first = 1 if self._config.reserve_null_block else 0
        free = frozenset(range(first, self._config.num_blocks)) - owners.keys()
        free = _as_counted(free, owners, self.scheduler)
        running = self._running()
        waiting = self._waiting()
        computed = {rid: self._computed(self._by_rid[rid].vidur) for rid in running + waiting}
        return ArSnapshot(
            free_blocks=free,
            block_owners=owners,
            running=tuple(running),
            waiting=tuple(waiting),
            num_computed=computed,
        )

    # ------------------------------------------------------------------ Vidur's loop
    def _run(self, batch: Any) -> None:
        """One batch through Vidur's event sequence on a one-stage replica."""
        start = self.time
        call = self.transcript.ending(start + BATCH_TIME)
        batch.on_schedule(start)
        self.stage.add_batch(batch)
        _, batch_stage, _ = self.stage.on_schedule()
        batch_stage.on_schedule(start)
        self.time = start + BATCH_TIME
        batch_stage.on_stage_end(self.time)
        self.stage.on_stage_end()
        self.scheduler.on_stage_end(0, batch_stage)
        batch.on_batch_end(self.time)
        self.scheduler.on_batch_end(batch)
        self._sync()
        completed: list[int] = []
        for vreq in batch.requests:
            tracked = self._by_vid[vreq.id]
            if vreq.completed and not tracked.finished:
                completed.append(vreq.id)
                tracked.finished = True
                self._admitted.remove(tracked.spec.request_id)
                self.sink(ArFinished(tracked.spec.request_id, _reason(tracked.spec)))
        call.result = (tuple(completed),)

    def _waiting(self) -> list[str]:
        """Vidur's pending requests not admitted since their last restart. Mnemosyne keeps an
        admitted request whose prefill is unfinished in a queue too (`_request_queue` in
        0.0.25, `_partial_prefill_queue` in 0.0.26); it holds its blocks and runs."""
        pending = (
            self._by_vid[r.id].spec.request_id for r in self.scheduler.get_pending_requests()
        )
        return [rid for rid in pending if rid not in self._admitted]

    def _running(self) -> list[str]:
        return [rid for rid in self._admitted if not self._by_rid[rid].vidur.completed]

    @staticmethod
    def _computed(vreq: Any) -> int:
        """Vidur counts the token sampled at the end of a prefill as processed; the spec counts
        computed (KV-holding) tokens, which lag the known ones by that token."""
        processed: int = vreq.num_processed_tokens
        return processed - 1 if vreq.is_prefill_complete else processed

    def _remove_pending(self, vreq: Any) -> None:
        """Take an aborted request out of Vidur's queues: `_request_queue` (requests, or
        (priority, request) pairs in the Mnemosyne schedulers) and Mnemosyne 0.0.26's
        `_partial_prefill_queue`."""
        for name in _PENDING_QUEUES:
            queue = getattr(self.scheduler, name, None)
            if queue is not None:
                kept = [x for x in queue if _queued_request(x) is not vreq]
                if len(kept) < len(queue):
                    self.transcript.op("unqueued", vreq.id, name)
                queue[:] = kept

    def _check_unqueued(self, request_id: str, vreq: Any) -> None:
        """`CannotDrive` when the scheduler still lists `vreq` among its pending requests
        (`get_pending_requests()`, where the snapshot reads the waiting ones) after
        `_remove_pending`: its class keeps pending requests somewhere the adapter's abort does
        not edit (a staging list of its own, say), so the aborted request would run on."""
        if not any(r is vreq for r in self.scheduler.get_pending_requests()):
            return
        cls = type(self.scheduler)
        queues = [q for q in _PENDING_QUEUES if getattr(self.scheduler, q, None) is not None]
        raise CannotDrive(
            f"{cls.__module__}.{cls.__qualname__} still lists {request_id!r} (Vidur request "
            f"{vreq.id}) in get_pending_requests() after the adapter's abort removed it from "
            f"{' and '.join(queues) or 'its queues'}, the only place the adapter can reach "
            "(Vidur has no abort): keep pending requests in _request_queue, as Vidur's own "
            "replica schedulers do, for the adapter to drive this class"
        )

    # ------------------------------------------------------------------ KV diffing
    def _ledger(self) -> dict[int, int]:
        return kv_ledger(self.scheduler)

    def _allocate_wrapped(self, request_id: int, num_blocks: int, *group: int) -> None:
        self.transcript.allocating(request_id, num_blocks, group)
        self._allocate(request_id, num_blocks, *group)
        self._sync()

    def _free_wrapped(self, *request_ids: int) -> None:
        self.transcript.freeing(request_ids, lambda vid: self._by_vid[vid].vidur)
        self._free(*request_ids)
        self._sync()

    def _sync(self) -> None:
        """Mirror the ledger (`_ledger`) in the adapter's block names, emitting what changed:
        the blocks given back first, then those taken. A request given more blocks than the
        adapter has free names for raises `SpecViolation` `kv_exclusive` (`_beyond_pool`), before
        any of them is named: Vidur's own `allocate` asserts against it, a subclass's may not."""
        counts = self._ledger()
        for vid in [v for v in self._names if v not in counts]:
            self._release(vid, self._names[vid])
        # shrinks before growths: what one request gave back may be what another took
        for vid, count in counts.items():
            held = self._names.get(vid, [])
            if count < len(held):
                self._release(vid, held[count:])
        for vid, count in counts.items():
            ids = self._names.setdefault(vid, [])
            if count > len(ids):
                if count - len(ids) > len(self._free_ids):
                    raise self._beyond_pool(vid, count - len(ids))
                new = [self._free_ids.popleft() for _ in range(count - len(ids))]
                ids.extend(new)
                self.sink(ArBlocksAllocated(self._by_vid[vid].spec.request_id, tuple(new)))

    def _beyond_pool(self, vid: int, wanted: int) -> SpecViolation:
        """The `kv_exclusive` violation (allocated blocks are free and in the pool: the rule
        the spec raises for a block outside it) of Vidur request `vid` given `wanted` more
        blocks than the pool has free."""
        rid = self._by_vid[vid].spec.request_id
        mnemosyne = hasattr(self.scheduler, "_req_block_counter")
        ledger = "_req_block_counter" if mnemosyne else "_allocation_map"
        return SpecViolation(
            ArRule.KV_EXCLUSIVE,
            f"{rid!r} (Vidur request {vid}) was given {wanted} more "
            f"block{'s' if wanted != 1 else ''} with only {len(self._free_ids)} free of a pool "
            f"of {self._config.usable_blocks} (its {ledger} entry went "
            f"from {len(self._names.get(vid, []))} to {self._ledger()[vid]}): an allocation "
            "takes free blocks of the pool (Vidur's own allocate asserts the pool holds them)",
        )

    def _release(self, vid: int, ids: list[int]) -> None:
        tracked = self._by_vid[vid]
        rid = tracked.spec.request_id
        gone = list(ids)
        held = self._names[vid]
        for b in gone:
            held.remove(b)
            self._free_ids.append(b)
        if not held:
            del self._names[vid]
        restarted = tracked.vidur.num_restarts > tracked.restarts
        if self._in_schedule and restarted and not held:
            tracked.restarts = tracked.vidur.num_restarts
            if self.fix_restart:
                _reset_stage_counters(tracked.vidur)
                self.transcript.op("reset", vid)
            if rid in self._admitted:
                self._admitted.remove(rid)
            self.sink(ArPreempted(rid, tuple(gone)))
        elif gone:
            self.sink(ArBlocksFreed(rid, tuple(gone)))


def _queued_request(entry: Any) -> Any:
    """A queue entry's request: Mnemosyne queues (priority, request) pairs."""
    return entry[1] if isinstance(entry, tuple) else entry


def _scheduled(batch: Any) -> list[tuple[Any, int]]:
    """(request, tokens) of a batch in the order the scheduler added them. A Mnemosyne batch is a
    `KVParallelBatch` of one sub-batch per KV-parallel group, each listing the requests whose KV
    it holds part of, with the request's tokens; with several groups, in group order, each
    request once."""
    mapping = getattr(batch, "batch_mapping", None)
    groups = list(mapping.values()) if mapping is not None else [batch]
    scheduled: dict[Any, int] = {}
    for group in groups:
        for request, tokens in zip(group.requests, group.num_q_tokens, strict=True):
            scheduled.setdefault(request, tokens)
    return list(scheduled.items())


def kv_ledger(scheduler: Any) -> dict[int, int]:
    """Vidur's only record of KV: request id -> block count. `_allocation_map` in every
    scheduler but Mnemosyne's, which counts a request's blocks in `_req_block_counter` (over
    its KV-parallel groups) and leaves `_allocation_map` empty."""
    ledger: dict[int, int] = getattr(scheduler, "_req_block_counter", scheduler._allocation_map)
    return ledger


def _as_counted(free: frozenset[int], owners: Mapping[int, str], scheduler: Any) -> frozenset[int]:
    """The free blocks as Vidur's own counter has them. Vidur keeps two records of its pool:
    the blocks each request holds (`_allocation_map`, which `owners` mirrors) and the count
    of allocated blocks its admission reads (`_num_allocated_blocks`); a change that updates
    one without the other (a `free` that forgets part of the count) must show. With the count
    above the blocks held, the highest free blocks are withheld (held by nobody: a leak); below,
    the highest held blocks are listed free as well (free while held). Mnemosyne counts per
    KV-parallel group (`_kvp_group_num_allocated_blocks`): its record is read as it is."""
    counted = getattr(scheduler, "_num_allocated_blocks", None)
    if not isinstance(counted, int) or hasattr(scheduler, "_req_block_counter"):
        return free
    surplus = counted - len(owners)
    if surplus > 0:
        return free - frozenset(sorted(free)[len(free) - surplus :])
    if surplus < 0:
        return free | frozenset(sorted(owners)[surplus:])
    return free


def _reset_stage_counters(vreq: Any) -> None:
    """What vidur 0.0.25's `Request.restart()` forgets (entities/request.py): the pipeline-stage
    counters. Left as they are, the restarted request's stage count passes its total and
    `on_batch_stage_end` / `on_batch_end` raise AssertionError at its next batch."""
    vreq._num_stage_processed_tokens = 0
    vreq._is_prefill_stage_complete = False


def _reason(request: ArRequest) -> ArFinishReason:
    if request.stop_after is not None and request.stop_after <= request.max_tokens:
        return ArFinishReason.STOP
    return ArFinishReason.LENGTH


__all__ = ["BATCH_TIME", "VidurAdapter", "kv_ledger"]
