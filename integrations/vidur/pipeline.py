"""`VidurPipeline`: Vidur's REAL replica schedulers, with several pipeline stages and several
replicas, run by Vidur's own event loop and checked after every tick against `spec.ar.pipeline`
(each replica) and `spec.ar.routing` (the global scheduler).

What runs for real (vidur 0.0.25, or 0.0.26 with `SCHEDSPEC_VIDUR_VERSION`): `num_replicas`
replica schedulers (vLLM, Sarathi, Orca, FasterTransformer or Mnemosyne FCFS with a fixed
chunk), each built by its own `__init__` with `num_stages` = `config.num_stages`
(its `on_schedule` gate: fewer than S batches running and stage 0 free; its micro-batch size
`batch_size_cap // S`) and its S `ReplicaStageScheduler`s; the `Batch`, `BatchStage` and
`Request` entities; Vidur's event classes (`RequestArrivalEvent` -> `GlobalScheduleEvent` ->
`ReplicaScheduleEvent` -> `BatchStageArrivalEvent` -> `ReplicaStageScheduleEvent` ->
`BatchStageEndEvent` -> ... -> `BatchEndEvent`), handled in the order Vidur's `Simulator.run`
handles them (a heap of each event's `_priority_number`, every arrival pushed before the run);
and the global scheduler's `schedule`: round robin or least outstanding requests (LOR).

Stand-ins and private state, each with why:

- the execution-time predictor: `_ConstantTime` (every stage of every batch takes 1 s, so a
  tick is one stage time and a batch formed at tick f leaves at tick f + S); Vidur's predictors
  need profiling data and scikit-learn;
- the metrics store: `_NoMetrics` records nothing (Vidur's plots with plotly and logs to W&B);
  its module's imports are placeholders (`engine.EVENT_LOOP_STUBBED_ROOTS`);
- the global scheduler is made without its `__init__`, which builds an execution-time
  predictor and the replica schedulers from a `SimulationConfig`: its `_replica_schedulers`,
  `_num_replicas`, `_request_queue` and `_request_counter` are set instead;
- each replica scheduler's `_replica_id` is set to its index: Vidur numbers replicas with a
  class counter, from 0 in a fresh process, and its global schedulers name replicas by
  `replica_id` (LOR) or by index (round robin), which agree only then;
- a request arrives at the tick it is given (its `RequestArrivalEvent` time); its `arrived_at`,
  which Vidur's schedulers sort by, is its index in the program (as `VidurAdapter`'s), so two
  requests arriving at one tick keep the program's order;
- `free` is wrapped on each instance to see restarts (a freed request whose `num_restarts`
  grew) in the order they happen and to reset vidur's stage counters after one (see
  `integrations.vidur.adapter`: without it a restarted request raises AssertionError);
- read only: `_allocation_map` and `_num_allocated_blocks` (the KV ledger; Mnemosyne's
  `_req_block_counter` and `_kvp_group_num_allocated_blocks`), `get_pending_requests()` and
  `num_pending_requests`, `_preempted_requests` and FasterTransformer's `_preempted_batches`
  (the requests between batches; Mnemosyne's admitted requests between chunks are in its
  pending queues, holding blocks), and the handled
  events' `_replica_id`, `_batch`, `_batch_stage`, `_stage_id`, `_request` and
  `_request_mapping` (which batch formed where, which stage each batch runs, which request
  arrived and where the global scheduler sent it).

After all events of a tick, a snapshot of each replica (`spec.ar.pipeline.PipelineSnapshot`) is
read from those and checked (`check_pipeline`); each routing round is checked as it happens
(`spec.ar.routing.check_routing`). A run ends when every request has finished; if Vidur's event
queue empties first, that is `progress` (Vidur's own simulator then asserts "Simulation ended
with pending requests").
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from integrations.vidur.adapter import _reset_stage_counters, _scheduled, kv_ledger
from integrations.vidur.batch_context import check_batch_context
from integrations.vidur.profiles import PROFILES
from spec.ar.config import ArConfig, ArRequest, validate_ar_request
from spec.ar.pipeline import BatchInFlight, PipelineSnapshot, check_pipeline
from spec.ar.routing import ROUTINGS, check_routing
from spec.errors import (
    ConfigError,
    DuplicateRequest,
    RequestTooLarge,
    SchedulerStalled,
    SpecViolation,
)

#: The schedulers whose pipelines run here (LightLLM asserts one stage itself).
PIPELINE_KINDS: tuple[str, ...] = ("vllm", "sarathi", "orca", "ft", "mnemosyne")
#: The schedulers Vidur runs with sequence pipeline parallelism (its `SimulationConfig` asserts
#: Sarathi or a Mnemosyne scheduler; of those, Mnemosyne FCFS fixed-chunk runs here).
SEQUENCE_PARALLEL_KINDS: tuple[str, ...] = ("sarathi", "mnemosyne")


@dataclass(frozen=True, slots=True)
class KvParallelism:
    """Mnemosyne's KV parallelism (Vidur's `kv_parallel_size` and
    `max_num_tokens_per_kvp_group`): `groups` KV-parallel groups, each a pool of
    `config.usable_blocks` blocks, a request's KV spread over as many as its prefill needs at
    `group_tokens` tokens a group."""

    groups: int
    group_tokens: int

    def check(self, kind: str, config: ArConfig) -> None:
        """`ConfigError` naming the field for what Vidur refuses or asserts against."""
        if kind != "mnemosyne":
            raise ConfigError(
                "kv_parallel", self.groups, f"none for {kind}: only Mnemosyne has KV parallelism"
            )
        if self.groups < 1:
            raise ConfigError("kv_parallel.groups", self.groups, "at least 1")
        block = config.block_size
        if self.group_tokens <= block or self.group_tokens % block:
            raise ConfigError(
                "kv_parallel.group_tokens",
                self.group_tokens,
                f"a multiple of the block size {block} above it (Vidur asserts both)",
            )
        if self.group_tokens // block >= config.usable_blocks:
            raise ConfigError(
                "kv_parallel.group_tokens",
                self.group_tokens,
                f"fewer than {config.usable_blocks} blocks' worth ({config.usable_blocks * block}"
                " tokens): Vidur asserts a group's pool holds more than one group's share",
            )

    def check_request(self, request: ArRequest) -> None:
        """`RequestTooLarge` for a request whose KV (prompt and outputs) exceeds its groups'
        shares: Vidur never admits a prefill longer than `groups * group_tokens` (it logs a
        warning and skips it for ever), and a restart makes the prefill every token so far."""
        share = self.groups * self.group_tokens
        needed = request.prompt_len + request.final_output
        if needed > share:
            raise RequestTooLarge(request.request_id, needed, share)


def check_pipeline_config(
    kind: str, config: ArConfig, routing: str = "round_robin", sequence_parallel: bool = False
) -> None:
    """Refuse, with a `ConfigError` naming the field, what a Vidur `kind` pipeline cannot run:
    another kind or routing, sequence parallelism for a kind Vidur refuses it to, or the
    profile's space (FCFS, no prefix cache, ...) at `config.num_stages` stages."""
    if kind not in PIPELINE_KINDS:
        raise ConfigError(
            "kind",
            kind,
            f"one of {', '.join(PIPELINE_KINDS)} (LightLLM runs one stage)",
        )
    if routing not in ROUTINGS:
        raise ConfigError("routing", routing, f"one of {', '.join(ROUTINGS)}")
    if sequence_parallel and kind not in SEQUENCE_PARALLEL_KINDS:
        raise ConfigError(
            "sequence_parallel",
            True,
            f"False for {kind}: Vidur runs sequence pipeline parallelism with "
            f"{' and '.join(SEQUENCE_PARALLEL_KINDS)} only",
        )
    space = dataclasses.replace(PROFILES[kind].space, stages=frozenset({config.num_stages}))
    space.check(config)


@dataclass(frozen=True, slots=True)
class PipelineTick:
    """What one replica's scheduler decided in one tick: the batch it formed, as (request id,
    tokens) in batch order, and the requests it restarted, in order."""

    tick: int
    replica: int
    scheduled: tuple[tuple[str, int], ...]
    restarted: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PipelineRun:
    """A finished run: its decisions (per replica, the ticks that formed a batch or restarted a
    request, in tick then replica order), its routes ((request id, replica) in routing order),
    its finishes as (tick, request id) in order, the last tick, the most batches in flight at
    once on one replica and the number of replica snapshots checked."""

    decisions: tuple[PipelineTick, ...]
    routes: tuple[tuple[str, int], ...]
    finished: tuple[tuple[int, str], ...]
    ticks: int
    peak_in_flight: int
    snapshots_checked: int

    def of_replica(self, replica: int) -> tuple[PipelineTick, ...]:
        """The decisions of one replica."""
        return tuple(d for d in self.decisions if d.replica == replica)


@dataclass(slots=True)
class _Batch:
    batch_id: int
    replica: int
    formed_at: int
    stage: int
    vidur: Any  # vidur.entities.Batch
    decodes: frozenset[str]  # its requests whose prefill was complete when it formed
    tokens: tuple[tuple[str, int], ...]  # (request id, tokens) in the order scheduled


@dataclass(slots=True)
class _Tick:
    scheduled: list[tuple[str, int]] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)


def _allocated(scheduler: Any) -> int:
    """The blocks Vidur counts as allocated: `_num_allocated_blocks`, or the sum of Mnemosyne's
    per-KV-parallel-group counts."""
    groups = getattr(scheduler, "_kvp_group_num_allocated_blocks", None)
    count: int = sum(groups) if groups is not None else scheduler._num_allocated_blocks
    return count


#: Calls of Mnemosyne's `_can_append_slot` within one event that mean its loop does not end
#: (a batch asks it a few times per decode; a run of these programs, some tens in all).
LOOP_LIMIT = 100_000


class _EndlessLoop(Exception):
    """Vidur is caught in a loop that does not end (`VidurPipeline._counted`)."""


def _kv_tokens(vreq: Any, computing: int) -> int:
    """Tokens whose KV the request has written or is writing: Vidur's processed tokens (less the
    token sampled at the end of its prefill, whose KV its next decode writes) and `computing`,
    its tokens in the batches in flight."""
    sampled = 1 if vreq.is_prefill_complete else 0
    tokens: int = vreq.num_processed_tokens - sampled + computing
    return tokens


def _chunks_done(vreq: Any) -> bool:
    """The request has computed a prefill chunk since its last restart, or (with sequence
    parallelism) has one past stage 0."""
    return bool(vreq.num_processed_tokens or vreq.num_stage_processed_tokens)


def _model_layers(vidur: Any) -> int:
    """The layer count of the model Vidur's `ReplicaConfig` defaults to (Llama-2-7B: 32)."""
    replica = vidur.ReplicaConfig(
        num_pipeline_stages=1, tensor_parallel_size=1, enable_sequence_pipeline_parallel=False
    )
    layers: int = replica.model_config.num_layers
    return layers


def _ignore(*args: object, **kwargs: object) -> None:
    return None


class _NoMetrics:
    """Stands in for Vidur's `MetricsStore`: every `on_*` call is accepted and ignored."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return _ignore


class VidurPipeline:
    """`config.num_replicas` real Vidur `kind` replica schedulers of `config.num_stages` stages
    each, behind Vidur's `routing` global scheduler, in Vidur's event loop."""

    def __init__(
        self,
        kind: str,
        config: ArConfig,
        *,
        routing: str = "round_robin",
        sequence_parallel: bool = False,
        kv_parallel: KvParallelism | None = None,
        fix_restart: bool = True,
        on_snapshot: Callable[[PipelineSnapshot], None] = check_pipeline,
    ) -> None:
        """`ConfigError` for what `check_pipeline_config` or `KvParallelism.check` refuses, or a
        stage count Vidur's model cannot split (its layers must divide evenly);
        `EngineNotInstalled` without Vidur. `sequence_parallel` turns on Vidur's sequence
        pipeline parallelism (Sarathi and Mnemosyne only; with one stage Vidur turns it off),
        declared to the rules through each snapshot. `kv_parallel`: Mnemosyne's KV parallelism
        (each group a pool of `config.usable_blocks`; the snapshot's pool is all of them).
        `on_snapshot` sees every tick's snapshot of every replica (default: `check_pipeline`)."""
        check_pipeline_config(kind, config, routing, sequence_parallel)
        if kv_parallel is not None:
            kv_parallel.check(kind, config)
        groups = kv_parallel.groups if kv_parallel is not None else 1
        self._pool = groups * config.usable_blocks  # every KV-parallel group's blocks
        from integrations.vidur import MANIFEST, engine, replica_scheduler

        MANIFEST.require_shipped(f"real-vidur-{kind}")
        vidur = engine.load()
        loop = engine.load_event_loop()
        self.kind = kind
        self.config = config
        self.kv_parallel = kv_parallel
        self.routing = routing
        self.fix_restart = fix_restart
        self.on_snapshot = on_snapshot
        self.schedulers: list[Any] = []
        self._frees: list[Callable[..., None]] = []  # each replica's own `free`
        self._index: dict[Any, int] = {}  # Vidur's replica id -> replica index
        for i in range(config.num_replicas):
            try:
                scheduler = replica_scheduler(
                    kind,
                    config,
                    vidur,
                    sequence_parallel,
                    None if kv_parallel is None else (groups, kv_parallel.group_tokens),
                )
            except AssertionError:  # Vidur's ReplicaConfig: the layers split evenly
                layers = _model_layers(vidur)
                divisors = [n for n in range(1, layers + 1) if layers % n == 0]
                raise ConfigError(
                    "num_stages",
                    config.num_stages,
                    f"a divisor of the {layers} layers of Vidur's model: {divisors}",
                ) from None
            scheduler._replica_id = loop.replica_id(i)  # (module docstring)
            self._index[scheduler._replica_id] = i
            self._frees.append(scheduler.free)
            scheduler.free = self._free_wrapper(i)
            if hasattr(scheduler, "_can_append_slot"):  # Mnemosyne's loop may not end
                scheduler._can_append_slot = self._counted(scheduler._can_append_slot)
            self.schedulers.append(scheduler)
        self.scheduler: Any = self.schedulers[0]  # the first (or only) replica's scheduler
        self._request_cls = vidur.Request
        self._arrival_event = loop.RequestArrivalEvent
        # the global scheduler without its __init__ (module docstring)
        glob = object.__new__(loop.global_schedulers[routing])
        glob._replicas = {}
        glob._num_replicas = config.num_replicas
        glob._replica_schedulers = {s._replica_id: s for s in self.schedulers}
        glob._request_queue = []
        glob._request_counter = 0
        self.global_scheduler: Any = glob
        self._rid: dict[int, str] = {}  # Vidur request id -> request id
        self._requests: dict[str, Any] = {}
        self._restarts: dict[int, int] = {}
        self._batches: dict[int, _Batch] = {}  # id(vidur batch) -> the batch in flight
        self._ticks: dict[tuple[int, int], _Tick] = {}  # (tick, replica) -> its decisions
        self._finished: list[tuple[int, str]] = []
        self._finished_ids: set[str] = set()
        self._arrived: set[str] = set()
        self._routes: list[tuple[str, int]] = []
        self._replica_of: dict[str, int] = {}
        self._formed = 0  # batches formed so far (the next batch's id)
        self._static_batch_of: dict[str, int] = {}  # request -> the batch first scheduling it
        # FasterTransformer's batch-end free, as its profile declares (`free_at_batch_end`)
        rules = PROFILES[kind].policy.rules
        self._batch_end_free = rules is not None and rules.free_at_batch_end
        self._calls = 0  # `_can_append_slot` calls in the event being handled
        self._now = 0

    # ------------------------------------------------------------------ run
    def run(self, program: Sequence[tuple[int, ArRequest]], max_ticks: int = 10_000) -> PipelineRun:
        """Run `program` ((arrival tick, request) pairs) to its end: every request finished.
        A pipeline runs one program (`ConfigError` for a second).

        Raises `InvalidRequest` and its kin (`validate_ar_request`) or `DuplicateRequest` before
        anything runs; `SpecViolation` naming a `spec.ar.pipeline` rule when a tick's snapshot
        of a replica breaks one, `routing_order` when the global scheduler routes a request
        elsewhere than its routing says, `progress` when Vidur's event queue empties with
        requests unfinished, or `implementation_error` when Vidur raises while handling an
        event (its own assertions); `SchedulerStalled` past `max_ticks` ticks."""
        if self._requests:
            raise ConfigError("program", "a second one", "one program per VidurPipeline")
        seen: set[str] = set()
        for tick, request in program:
            # a request may need more than one group's pool: the pool is all of them
            validate_ar_request(self.config.replace(num_blocks=self._pool + 1), request)
            if self.kv_parallel is not None:
                self.kv_parallel.check_request(request)
            if request.request_id in seen:
                raise DuplicateRequest(request.request_id)
            if tick < 0:
                raise ConfigError("arrival tick", tick, "a tick >= 0")
            seen.add(request.request_id)
        queue: list[tuple[Any, Any]] = []
        for index, (tick, request) in enumerate(program):
            vreq = self._request_cls(float(index), request.prompt_len, request.final_output)
            self._rid[vreq.id] = request.request_id
            self._requests[request.request_id] = vreq
            self._restarts[vreq.id] = 0
            self._push(queue, self._arrival_event(float(tick), vreq))
        checked = peak = 0
        while queue:
            self._now = int(queue[0][1].time)
            if self._now > max_ticks:
                raise SchedulerStalled(max_ticks, self._stall_detail(), "ticks")
            # every event of this tick, including those its events add at the same time
            while queue and int(queue[0][1].time) == self._now:
                event = heapq.heappop(queue)[1]
                # the replicas' waiting counts before a routing round, for `check_routing`
                # (read only before one: most events are a stage's)
                routing = type(event).__name__ == "GlobalScheduleEvent"
                waiting = [s.num_pending_requests for s in self.schedulers] if routing else []
                self._calls = 0
                try:
                    added = event.handle_event(self.global_scheduler, _NoMetrics())
                except _EndlessLoop as loop:
                    raise SpecViolation(
                        "progress",
                        f"Vidur's {type(event).__name__} at tick {self._now} never returns: "
                        f"{loop} (an endless loop)",
                        state="\n".join(
                            self.snapshot(i).describe() for i in range(len(self.schedulers))
                        ),
                    ) from None
                except Exception as exc:  # Vidur's own assertions: a finding, not a crash
                    raise SpecViolation(
                        "implementation_error",
                        f"Vidur's {type(event).__name__} raised {type(exc).__name__}: {exc} "
                        f"at tick {self._now}",
                    ) from exc
                for new in added:
                    self._push(queue, new)
                self._observe(event, waiting)
            for replica in range(len(self.schedulers)):
                peak = max(peak, sum(b.replica == replica for b in self._batches.values()))
                self.on_snapshot(self.snapshot(replica))
                checked += 1
        unfinished = self._unfinished()
        if unfinished:
            raise SpecViolation(
                "progress",
                f"Vidur's event queue emptied at tick {self._now} with {unfinished} unfinished "
                "(its simulator asserts 'Simulation ended with pending requests')",
                state="\n".join(self.snapshot(i).describe() for i in range(len(self.schedulers))),
            )
        decisions = tuple(
            PipelineTick(t, replica, tuple(d.scheduled), tuple(d.restarted))
            for (t, replica), d in sorted(self._ticks.items())
        )
        return PipelineRun(
            decisions, tuple(self._routes), tuple(self._finished), self._now, peak, checked
        )

    def snapshot(self, replica: int = 0) -> PipelineSnapshot:
        """One replica now, read from Vidur's queues, ledger and the batches in flight; its
        submitted requests are those that arrived and were routed to it."""
        s = self.schedulers[replica]
        ledger = kv_ledger(s)
        queued = s.get_pending_requests()
        # Mnemosyne queues an admitted request between chunks with the new ones (0.0.25) or
        # in its partial-prefill queue (0.0.26): it has computed a chunk (with sequence
        # parallelism: its chunk has passed stage 0), so it is pending; a queued request that
        # computed nothing is waiting, whatever it holds (as released, a skipped new request
        # keeps the prefill it was allocated: `mnemosyne-skip-frees`)
        chunked = {r.id for r in queued if r.id in ledger and _chunks_done(r)}
        waiting = [self._rid[r.id] for r in queued if r.id not in chunked]
        between = list(getattr(s, "_preempted_requests", []))
        between.extend(r for r in queued if r.id in chunked)
        for batch in getattr(s, "_preempted_batches", []):
            between.extend(batch.requests)
        pending = [self._rid[r.id] for r in between if not r.completed]
        batches = tuple(
            BatchInFlight(
                b.batch_id,
                b.formed_at,
                b.stage,
                tuple(self._rid[r.id] for r in b.vidur.requests),
                b.decodes,
            )
            for b in self._batches.values()
            if b.replica == replica
        )
        held = {self._rid.get(vid, f"vidur:{vid}"): n for vid, n in ledger.items()}
        computing: dict[str, int] = {}  # tokens of this replica's batches in flight
        for b in self._batches.values():
            for rid, n in b.tokens if b.replica == replica else ():
                computing[rid] = computing.get(rid, 0) + n
        kv_tokens = {
            rid: _kv_tokens(self._requests[rid], computing.get(rid, 0))
            for rid in held
            if rid in self._requests
        }
        mine = {rid for rid in self._arrived if self._replica_of.get(rid) == replica}
        return PipelineSnapshot(
            tick=self._now,
            num_stages=self.config.num_stages,
            batches=batches,
            waiting=tuple(waiting),
            pending=tuple(pending),
            finished=tuple(rid for _, rid in self._finished if rid in mine),
            aborted=(),
            submitted=frozenset(mine),
            held_blocks=held,
            free_blocks=self._pool - _allocated(s),
            usable_blocks=self._pool,
            sequence_parallel=s.is_sequence_pipeline_parallel_enabled,
            block_size=self.config.block_size,
            kv_tokens=kv_tokens,
            batch_end_free=self._batch_end_free,
            static_batch_of={
                rid: b for rid, b in self._static_batch_of.items() if rid in held and rid in mine
            },
        )

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _push(queue: list[tuple[Any, Any]], event: Any) -> None:
        heapq.heappush(queue, (event._priority_number, event))

    def _unfinished(self) -> list[str]:
        return sorted(rid for rid, vreq in self._requests.items() if not vreq.completed)

    def _stall_detail(self) -> str:
        return f"unfinished {self._unfinished()}, batches in flight {len(self._batches)}"

    def _free_wrapper(self, replica: int) -> Callable[..., None]:
        """Replica `replica`'s `free`: records restarts, repairs the stage counters, then calls
        `self._frees[replica]` (the scheduler's own, read at each call)."""

        def free(*request_ids: int) -> None:
            for vid in request_ids:
                vreq = self._requests[self._rid[vid]]
                if vreq.num_restarts > self._restarts[vid]:
                    self._restarts[vid] = vreq.num_restarts
                    self._tick(replica).restarted.append(self._rid[vid])
                    if self.fix_restart:
                        _reset_stage_counters(vreq)
            self._frees[replica](*request_ids)

        return free

    def _counted(self, method: Callable[..., bool]) -> Callable[..., bool]:
        """`method`, raising `_EndlessLoop` once called `LOOP_LIMIT` times within one event:
        Mnemosyne's `_ensure_can_append_slot` asks it in a `while` loop that may never end."""

        def counted(*args: Any) -> bool:
            self._calls += 1
            if self._calls > LOOP_LIMIT:
                raise _EndlessLoop(f"_can_append_slot asked {LOOP_LIMIT:,} times in one event")
            return method(*args)

        return counted

    def _tick(self, replica: int) -> _Tick:
        return self._ticks.setdefault((self._now, replica), _Tick())

    def _observe(self, event: Any, waiting: list[int]) -> None:
        """Follow a handled event: a request arrived (`RequestArrivalEvent`), routed
        (`GlobalScheduleEvent`, checked against the routing with the replicas' `waiting` counts
        from before it), a batch formed (`ReplicaScheduleEvent`, its attention contexts checked:
        `batch_context`), running a stage
        (`ReplicaStageScheduleEvent`), gone (`BatchEndEvent`, its finishes recorded)."""
        kind = type(event).__name__
        if kind == "RequestArrivalEvent":
            self._arrived.add(self._rid[event._request.id])
            return
        if kind == "GlobalScheduleEvent":
            routed = [(self._rid[r.id], self._index[rid]) for rid, r in event._request_mapping]
            check_routing(self.routing, len(self._routes), waiting, routed)
            self._routes.extend(routed)
            self._replica_of.update(routed)
            return
        batch = getattr(event, "_batch", None)
        if batch is None:
            return
        if kind == "ReplicaScheduleEvent":
            replica = self._index[event._replica_id]
            check_batch_context(
                batch, self.kind, self.schedulers[replica], lambda r: repr(self._rid[r.id])
            )
            decodes = frozenset(self._rid[r.id] for r in batch.requests if r.is_prefill_complete)
            tokens = tuple((self._rid[r.id], n) for r, n in _scheduled(batch))
            self._batches[id(batch)] = _Batch(
                self._formed, replica, self._now, 0, batch, decodes, tokens
            )
            for rid, _ in tokens:
                self._static_batch_of.setdefault(rid, self._formed)
            self._formed += 1
            self._tick(replica).scheduled.extend(tokens)
        elif kind == "ReplicaStageScheduleEvent" and event._batch_stage is not None:
            self._batches[id(batch)].stage = event._stage_id
        elif kind == "BatchEndEvent":
            del self._batches[id(batch)]
            for r in batch.requests:
                rid = self._rid[r.id]
                if r.completed and rid not in self._finished_ids:
                    self._finished_ids.add(rid)
                    self._finished.append((self._now, rid))


__all__ = [
    "PIPELINE_KINDS",
    "SEQUENCE_PARALLEL_KINDS",
    "KvParallelism",
    "PipelineRun",
    "PipelineTick",
    "VidurPipeline",
    "check_pipeline_config",
]
