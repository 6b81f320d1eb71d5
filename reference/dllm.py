"""The reference dLLM scheduler: FCFS admission, paged KV, sync and FDFO, in-place reuse and
re-loop, abort at any point. Plain Python, obviously correct rather than fast.

A round:
1. admit queued requests in FCFS order while a seat, a row and the request's worst-case KV
   pages (reserved at admission, so allocation never fails and the pool never deadlocks) are
   available; stop at the first that does not fit;
2. give every running request a block: a fresh one (new KV) after a commit, or its carried one
   (reused in place, or re-allocated when in-place reuse is off);
3. run the worker: sync loops forward→step until every row is done; FDFO runs one forward→step,
   or with re-loop repeats while no block finished;
4. commit done blocks, finish requests that reached max_new_tokens or EOS (freeing their KV and
   row at once), and — FDFO without reuse — free the KV of unfinished blocks;
5. return control.

Four policy options of `spec.profile.DllmPolicy` are implemented (the constructor's `policy`),
each a built-in of its own:
- `admission=PREFILL_FIRST` (SGLang's dLLM order): admission first takes requests whose first
  block is prompt-only (in queue order, while each fits), then FCFS from the head; a round's
  batch is the running requests whose next block is prompt-only if there are any (a prefill
  batch), else all of them (a decode batch); the others get no block this round;
- `rows_released_between_rounds` (FDFO without in-place reuse): a request whose block is
  carried unfinished gives its row back with the block's KV, and takes a free row again at the
  start of the next round, before admission; one that finds none waits a round;
- `priority_order`: the queue is kept by `RequestSpec.priority`, lower first, submission order
  breaking ties; admission (FCFS or PREFILL_FIRST) reads it in that order;
- `longest_output_first`: likewise by `max_new_tokens`, the longest first (after the priority
  when both are on).
The reference is work-conserving whatever the policy says (the spec allows more than asked).

Each step is a small method so the mutant catalogue (tests/mutants.py) can seed one bug by
overriding one method.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from reference.golden import golden_output
from reference.kv_pool import PagedKvPool, RequestPool
from reference.oracle import (
    AlgorithmOracle,
    DenoiseOracle,
    OracleRow,
    RecordedOracle,
    aborts_now,
    stops_now,
)
from spec.adapter import EventSink, ImplementationFactory
from spec.config import DllmConfig, Mode, RequestSpec, validate_request
from spec.errors import ConfigError, DuplicateRequest, SchedulerStalled, UnknownRequest
from spec.events import (
    Aborted,
    Admitted,
    BlockCommitted,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    RowAcquired,
    RowReleased,
    StepResult,
)
from spec.implementation import DllmImplementation
from spec.machine import finish_of
from spec.profile import DllmAdmission, DllmPolicy, DllmProfile
from spec.snapshot import FinishedOutput, Snapshot


@dataclass(slots=True)
class _Req:
    spec: RequestSpec
    pages_needed: int
    row: int | None = None
    committed: list[int] = field(default_factory=list)  # committed tokens, prompt included
    committed_blocks: int = 0
    # the current block
    block_tokens: list[int] | None = None
    block_slots: tuple[int, ...] | None = None
    block_alloc_round: int = -1
    algo_state: object = None
    block_done: bool = False
    # FDFO carriers between rounds
    incomplete_ids: tuple[int, ...] | None = None

    @property
    def rid(self) -> str:
        return self.spec.request_id

    @property
    def generated(self) -> list[int]:
        return self.committed[len(self.spec.prompt) :]


class ReferenceDllmScheduler:
    """Implements `spec.adapter.SchedulerAdapter`."""

    def __init__(
        self,
        config: DllmConfig,
        sink: EventSink,
        oracle: DenoiseOracle | None = None,
        *,
        id_memory: int | None = None,
        policy: DllmPolicy | None = None,
    ) -> None:
        """id_memory: remember only the ids of the last `id_memory` finished or aborted
        requests for duplicate detection (a long-lived server's bounded state); None remembers
        every id, as the spec's `unique_submission` asks of a checked run. policy: the
        admission order and row release to follow (module docstring); reserved pages and rows
        are an engine's id mapping, which the reference does not have."""
        policy = policy if policy is not None else DllmPolicy()
        if policy.reserved_kv_pages or policy.reserved_rows:
            raise ConfigError(
                "policy.reserved_kv_pages/reserved_rows",
                (policy.reserved_kv_pages, policy.reserved_rows),
                "0 for the reference (it reserves nothing for itself)",
            )
        self.policy = policy
        self._config = config
        self.sink = sink
        self.oracle: DenoiseOracle = oracle or AlgorithmOracle.named(
            "LowConfidence", config.mask_token_id
        )
        self.kv: PagedKvPool = PagedKvPool(config, sink)
        self.rows: RequestPool = RequestPool(config.req_pool_rows)
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []  # admission order
        self.seen: set[str] = set()
        self.id_memory = id_memory
        self._retired: deque[str] = deque()
        self.reserved_pages: int = 0
        self.round_index: int = 0
        # outputs finished since the last `collect_outputs` (handed out, then forgotten: bounded)
        self.outputs: dict[str, FinishedOutput] = {}

    @property
    def config(self) -> DllmConfig:
        """The configuration it was built for."""
        return self._config

    # ------------------------------------------------------------------ API
    def submit(self, request: RequestSpec) -> None:
        """`validate_request`, then `DuplicateRequest` for a remembered id (both before any change);
        else queue it with its worst-case KV pages and emit `Submitted`: at the tail, or under
        an ordered queue (`priority_order`, `longest_output_first`) behind every waiting request
        whose `DllmPolicy.queue_key` is not greater."""
        shape = validate_request(self.config, request)
        if request.request_id in self.seen:
            raise DuplicateRequest(request.request_id)
        self.seen.add(request.request_id)
        self._enqueue(_Req(request, shape.pages))
        self.sink(request.submitted())

    def _enqueue(self, req: _Req) -> None:
        key = self._queue_key(req)
        at = len(self.waiting)
        if self.policy.orders_queue:
            at = next((i for i, w in enumerate(self.waiting) if self._queue_key(w) > key), at)
        self.waiting.insert(at, req)

    def _queue_key(self, req: _Req) -> tuple[int, int]:
        return self.policy.queue_key(req.spec.priority, req.spec.max_new_tokens)

    def abort(self, request_id: str) -> None:
        """A waiting request just leaves the queue (it holds nothing); a running one first frees its
        KV slots (`KvFreed`), its row (`RowReleased`) and its page reservation. Then `Aborted`; an
        id neither waiting nor running raises `UnknownRequest`, changing nothing."""
        for req in self.waiting:
            if req.rid == request_id:
                self.waiting.remove(req)
                self._retire(request_id)
                self.sink(Aborted(request_id))
                return
        for req in self.running:
            if req.rid == request_id:
                self._release(req)
                self.running.remove(req)
                self._retire(request_id)
                self.sink(Aborted(request_id))
                return
        raise UnknownRequest(request_id, len(self.waiting) + len(self.running))

    def run_round(self) -> None:
        """One round (module docstring): released rows taken again, admission, a block for each
        request of the batch, the worker, commits, finishes and carries; then `ControlReturned`,
        also with nothing to run."""
        self._reacquire_rows()
        self._admit()
        batch = self._prepare_batch()
        if batch:
            self._run_worker(batch)
            self._complete(batch)
        self.sink(ControlReturned(self.round_index))
        self.round_index += 1

    def drain(self, max_rounds: int = 100_000) -> None:
        """Run rounds until `is_idle`; after `max_rounds` rounds with work left raise
        `SchedulerStalled`."""
        for _ in range(max_rounds):
            if self.is_idle():
                return
            self.run_round()
        if not self.is_idle():
            raise SchedulerStalled(
                max_rounds, f"{len(self.waiting)} waiting, {len(self.running)} running"
            )

    def _retire(self, request_id: str) -> None:
        """A request left for good: with `id_memory`, forget the oldest remembered ids."""
        if self.id_memory is None:
            return
        self._retired.append(request_id)
        while len(self._retired) > self.id_memory:
            self.seen.discard(self._retired.popleft())

    def collect_outputs(self) -> dict[str, FinishedOutput]:
        """Outputs of the requests finished since the previous call (see `ReportsOutputs`)."""
        out, self.outputs = self.outputs, {}
        return out

    def golden_output(self, request: RequestSpec) -> FinishedOutput:
        """`spec.golden.GoldenDecoder`: the request decoded alone by this scheduler's oracle
        (`reference.golden`); changes nothing here."""
        return golden_output(self.config, self.oracle, request)

    def is_idle(self) -> bool:
        """Nothing waiting or running."""
        return not self.waiting and not self.running

    def snapshot(self) -> Snapshot:
        """Read from the KV pool's slot owners, the request pool's rows and the running list;
        carrying: the running requests whose unfinished block is carried to the next round."""
        return Snapshot(
            free_slots=self.kv.free_slots(),
            slot_owners=self.kv.slot_owners(),
            rows=self.rows.rows(),
            running=frozenset(r.rid for r in self.running),
            carrying=frozenset(r.rid for r in self.running if r.incomplete_ids is not None),
        )

    # ------------------------------------------------------------------ round steps
    def _reacquire_rows(self) -> None:
        """Rows released between rounds: each running request without a row takes a free one
        (admission order), before admission can take them."""
        for req in self.running:
            if req.row is None:
                row = self.rows.acquire(req.rid)
                if row is None:
                    return
                req.row = row
                self.sink(RowAcquired(req.rid, row))

    def _admit(self) -> None:
        """FCFS: admit the head while it fits; stop at the first that does not. Under
        PREFILL_FIRST, requests whose first block is prompt-only go first."""
        if self.policy.admission is DllmAdmission.PREFILL_FIRST:
            self._admit_prefill_requests(list(self.waiting))
        self._admit_fcfs()

    def _admit_prefill_requests(self, candidates: list[_Req]) -> None:
        """Admit the candidates whose first block is prompt-only, in order, while each fits
        (FCFS among them: one that does not fit is not passed)."""
        for req in candidates:
            if not self._prompt_only(req, 0):
                continue
            if not self._fits(req):
                return
            self._admit_one(req)

    def _admit_fcfs(self) -> None:
        """Admit the head of the queue while it fits."""
        while self.waiting and self._fits(self.waiting[0]):
            self._admit_one(self.waiting[0])

    def _fits(self, req: _Req) -> bool:
        """A seat, a row and the request's worst-case pages are free."""
        return (
            len(self.running) < self.config.max_running_requests
            and self.rows.has_free()
            and self.reserved_pages + req.pages_needed <= self.config.kv_pages
        )

    def _prompt_only(self, req: _Req, block_index: int) -> bool:
        """Block `block_index` of the request holds only prompt tokens (a prefill block)."""
        return (block_index + 1) * self.config.block_size <= len(req.spec.prompt)

    def _admit_one(self, req: _Req) -> None:
        row = self.rows.acquire(req.rid)
        assert row is not None
        self.waiting.remove(req)
        req.row = row
        self.reserved_pages += req.pages_needed
        self.running.append(req)
        self.sink(Admitted(req.rid, row))

    def _prepare_batch(self) -> list[_Req]:
        batch: list[_Req] = []
        for req in self._batch_candidates():
            if req.block_tokens is None:
                self._start_block(req)
            elif req.block_slots is None:
                self._reallocate_block(req)
            batch.append(req)
        return batch

    def _batch_candidates(self) -> list[_Req]:
        """The running requests that hold a row; under PREFILL_FIRST only those whose next
        block is prompt-only, if there are any (a batch is prefill-only or decode-only, and
        prefill goes first)."""
        if self.policy.admission is DllmAdmission.PREFILL_FIRST:
            prefill = self._prefill_rows()
            if prefill:
                return prefill
        return [r for r in self.running if r.row is not None]

    def _prefill_rows(self) -> list[_Req]:
        """The running requests that hold a row and whose next block is prompt-only."""
        return [
            r
            for r in self.running
            if r.row is not None and self._prompt_only(r, r.committed_blocks)
        ]

    def _start_block(self, req: _Req) -> None:
        """A fresh block: prompt tokens at prompt positions, masks elsewhere."""
        b = self.config.block_size
        k = req.committed_blocks
        prompt = req.spec.prompt
        tokens = [
            prompt[pos] if pos < len(prompt) else self.config.mask_token_id
            for pos in range(k * b, k * b + b)
        ]
        req.block_slots = self.kv.allocate_block(req.rid, k)
        req.block_alloc_round = self.round_index
        req.block_tokens = tokens
        req.algo_state = self.oracle.init_state(tuple(tokens))
        req.block_done = False

    def _reallocate_block(self, req: _Req) -> None:
        """FDFO without reuse: the carried block gets KV slots again."""
        req.block_slots = self.kv.allocate_block(req.rid, req.committed_blocks)
        req.block_alloc_round = self.round_index
        self._restore_carriers(req)

    def _restore_carriers(self, req: _Req) -> None:
        assert req.incomplete_ids is not None
        req.block_tokens = list(req.incomplete_ids)
        if req.algo_state is None:
            req.algo_state = self.oracle.init_state(req.incomplete_ids)

    def _run_worker(self, batch: list[_Req]) -> None:
        for req in batch:
            if req.incomplete_ids is not None:
                self._restore_carriers(req)
        if self.config.mode is Mode.SYNC:
            while not all(r.block_done for r in batch):
                self._forward_and_step(batch)
            return
        while True:
            newly_done = self._forward_and_step(batch)
            if newly_done or not self.config.reloop:
                return

    def _forward_rows(self, batch: list[_Req]) -> tuple[ForwardRow, ...]:
        mask = self.config.mask_token_id
        return tuple(
            ForwardRow(
                request_id=r.rid,
                block_index=r.committed_blocks,
                reused=r.block_alloc_round < self.round_index,
                num_tokens=len(r.block_tokens or ()),
                masked=sum(1 for t in r.block_tokens or () if t == mask),
            )
            for r in batch
        )

    def _forward_and_step(self, batch: list[_Req]) -> bool:
        """One forward over the batch and one step per row; True if a block became done."""
        self.sink(Forward(self._forward_rows(batch)))
        rows = [self._oracle_row(r) for r in batch]
        newly_done = False
        for req, result in zip(batch, self.oracle.step(rows), strict=True):
            req.block_tokens = list(result.tokens)
            req.algo_state = result.state
            if result.done and not req.block_done:
                newly_done = True
            req.block_done = req.block_done or result.done
            masks = sum(1 for t in result.tokens if t == self.config.mask_token_id)
            accept = self.config.block_size if req.block_done else 0
            self.sink(StepResult(req.rid, req.committed_blocks, accept, masks))
        return newly_done

    def _oracle_row(self, req: _Req) -> OracleRow:
        """What the oracle sees of a row: the committed context, the block and its state."""
        return OracleRow(
            req.rid,
            tuple(req.committed),
            req.committed_blocks,
            tuple(req.block_tokens or ()),
            req.algo_state,
        )

    def _complete(self, batch: list[_Req]) -> None:
        for req in batch:
            if req.block_done:
                self._commit(req)
                if self.policy.aborts_after_commit and aborts_now(
                    self.oracle, req.rid, req.committed_blocks
                ):
                    self._abort_after_commit(req)
                    continue
                reason = self._finish_reason(req)
                if reason is not None:
                    self._finish(req, reason)
            else:
                self._carry(req)

    def _commit(self, req: _Req) -> None:
        tokens = tuple(req.block_tokens or ())
        self.sink(BlockCommitted(req.rid, req.committed_blocks, tokens))
        req.committed.extend(tokens)
        req.committed_blocks += 1
        req.block_tokens = None
        req.block_slots = None
        req.algo_state = None
        req.incomplete_ids = None
        req.block_done = False

    def _carry(self, req: _Req) -> None:
        """FDFO: keep the unfinished block's tokens and state for the next round (without
        reuse its KV goes back, and with rows released between rounds its row too)."""
        req.incomplete_ids = tuple(req.block_tokens or ())
        if not self.config.in_place_reuse:
            self._drop_block_kv(req)
            if self.policy.rows_released_between_rounds:
                self._release_row(req)

    def _drop_block_kv(self, req: _Req) -> None:
        if req.block_slots is not None:
            self.kv.free(req.rid, list(req.block_slots))
            req.block_slots = None

    def _finish_reason(self, req: _Req) -> FinishReason | None:
        """Right after a commit: STOP where the oracle says (a sampled stop wins, as SGLang's
        stop strings do), else the spec's `finish_of` (EOS or STOP at the first ending token,
        else LENGTH)."""
        if stops_now(self.oracle, req.spec, req.committed_blocks):
            return FinishReason.STOP
        end = finish_of(self.config, req.spec, req.generated)
        return None if end is None else end[0]

    def _abort_after_commit(self, req: _Req) -> None:
        """The engine's own abort in the completion phase (`aborts_after_commit`), where the
        oracle says: everything freed, then `Aborted`."""
        self._release(req)
        self.running.remove(req)
        self._retire(req.rid)
        self.sink(Aborted(req.rid))

    def _finish(self, req: _Req, reason: FinishReason) -> None:
        self._release(req)
        self.running.remove(req)
        end = finish_of(self.config, req.spec, req.generated)
        # after a sampled STOP the reference cannot locate the stop inside the block: all of it
        if end is None or end[0] is not reason:
            output = tuple(req.generated[: req.spec.max_new_tokens])
        else:
            output = end[1]
        self.outputs[req.rid] = FinishedOutput(output, reason)
        self._retire(req.rid)
        self.sink(Finished(req.rid, reason))

    def _release(self, req: _Req) -> None:
        """Free every KV slot (committed blocks and the current one) and the row."""
        self.kv.free(req.rid, self.kv.slots_of(req.rid))
        req.block_slots = None
        self._release_row(req)
        self.reserved_pages -= req.pages_needed

    def _release_row(self, req: _Req) -> None:
        if req.row is not None:
            self.rows.release(req.row)
            self.sink(RowReleased(req.rid, req.row))
            req.row = None


def make_scheduler(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """Factory for `schedspec verify --impl reference-dllm` (LowConfidence pseudo-logits)."""
    return ReferenceDllmScheduler(config, sink)


def make_joint_threshold_scheduler(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference driven by JointThreshold (stateful: exercises the carried algo_state)."""
    oracle = AlgorithmOracle.named("JointThreshold", config.mask_token_id, max_post_edit_steps=4)
    return ReferenceDllmScheduler(config, sink, oracle)


def make_scripted_scheduler(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference with step-count patterns: block k of request r needs between 1 and
    block_size + 1 steps to unmask, fixed by a hash of (r, k) — from one-shot blocks to
    one-token-per-step blocks, as a real model's spread."""
    from reference.oracle import ScriptedOracle, _seed

    b = config.block_size
    oracle = ScriptedOracle(
        lambda rid, k: 1 + _seed("steps", rid, k) % (b + 1), config.mask_token_id
    )
    return ReferenceDllmScheduler(config, sink, oracle)


PREFILL_FIRST_POLICY = DllmPolicy(admission=DllmAdmission.PREFILL_FIRST)
ROWS_RELEASED_POLICY = DllmPolicy(rows_released_between_rounds=True)
PRIORITY_POLICY = DllmPolicy(priority_order=True)
LONGEST_OUTPUT_FIRST_POLICY = DllmPolicy(longest_output_first=True)


def make_prefill_first_scheduler(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference under PREFILL_FIRST: prefill requests admitted first, and a round's batch
    prefill-only or decode-only, prefill first (SGLang's dLLM order)."""
    return ReferenceDllmScheduler(config, sink, policy=PREFILL_FIRST_POLICY)


def make_rows_released_scheduler(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference with rows released between rounds (FDFO without in-place reuse: a carried
    block gives back its row with its KV, and takes a row again the next round)."""
    return ReferenceDllmScheduler(config, sink, policy=ROWS_RELEASED_POLICY)


def make_priority_scheduler(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference with the queue in priority order (lower `RequestSpec.priority` first,
    submission order breaking ties)."""
    return ReferenceDllmScheduler(config, sink, policy=PRIORITY_POLICY)


def make_longest_output_first_scheduler(
    config: DllmConfig, sink: EventSink
) -> ReferenceDllmScheduler:
    """The reference with the queue by `max_new_tokens`, longest first (submission order breaking
    ties): SGLang's `--schedule-policy lof`."""
    return ReferenceDllmScheduler(config, sink, policy=LONGEST_OUTPUT_FIRST_POLICY)


def replaying_twin(
    cls: type[ReferenceDllmScheduler] | None = None, policy: DllmPolicy | None = None
) -> Callable[[Sequence[Event], DllmConfig], ImplementationFactory]:
    """A decision twin (`properties.decisions.DecisionTwin`): for one run's events and config,
    a factory for `cls` (default this reference) under `policy` that denoises exactly as the
    run did (`RecordedOracle.from_events`), so only the scheduling decisions can differ."""
    scheduler = cls or ReferenceDllmScheduler

    def twin(events: Sequence[Event], config: DllmConfig) -> ImplementationFactory:
        def factory(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
            oracle = RecordedOracle.from_events(events, config)
            return scheduler(config, sink, oracle, policy=policy)

        return factory

    return twin


# Decision twins of the policy-distinct built-ins (`schedspec verify --impl X --twin NAME`). The
# joint and scripted references need none of their own: a replaying twin takes its step outcomes
# from the run it checks, so only the policy tells references apart.
REFERENCE_TWIN = replaying_twin()
PREFILL_FIRST_TWIN = replaying_twin(policy=PREFILL_FIRST_POLICY)
ROWS_RELEASED_TWIN = replaying_twin(policy=ROWS_RELEASED_POLICY)
PRIORITY_TWIN = replaying_twin(policy=PRIORITY_POLICY)
LONGEST_OUTPUT_FIRST_TWIN = replaying_twin(policy=LONGEST_OUTPUT_FIRST_POLICY)


# The built-ins declare themselves with their profiles (`schedspec verify --impl
# reference.dllm:REFERENCE_DLLM`). The reference implements the idealised spec: every
# configuration, FCFS admission, work-conserving, nothing reserved, no deviation; it takes
# requests that ignore EOS.
REFERENCE_PROFILE = DllmProfile(ignore_eos=True, stop_token_ids=True)

REFERENCE_DLLM = DllmImplementation(
    make_scheduler, REFERENCE_PROFILE, "the reference dLLM scheduler (LowConfidence oracle)"
)
REFERENCE_DLLM_JOINT = DllmImplementation(
    make_joint_threshold_scheduler,
    REFERENCE_PROFILE,
    "the reference driven by JointThreshold (carried algorithm state)",
)
REFERENCE_DLLM_SCRIPTED = DllmImplementation(
    make_scripted_scheduler,
    REFERENCE_PROFILE,
    "the reference with scripted step counts (1 to block_size + 1 steps per block)",
)
# Every configuration too; the policy option is the only difference.
REFERENCE_DLLM_PREFILL_FIRST = DllmImplementation(
    make_prefill_first_scheduler,
    DllmProfile(policy=PREFILL_FIRST_POLICY, ignore_eos=True, stop_token_ids=True),
    "the reference under PREFILL_FIRST (prefill admitted first; prefill-only or decode-only "
    "batches, prefill first)",
)
# Every configuration: rows are released where the option applies (FDFO without in-place
# reuse); elsewhere it is the plain reference.
REFERENCE_DLLM_ROWS_RELEASED = DllmImplementation(
    make_rows_released_scheduler,
    DllmProfile(policy=ROWS_RELEASED_POLICY, ignore_eos=True, stop_token_ids=True),
    "the reference with rows released between rounds (FDFO without in-place reuse)",
)
# Every configuration; the queue is in priority order.
REFERENCE_DLLM_PRIORITY = DllmImplementation(
    make_priority_scheduler,
    DllmProfile(policy=PRIORITY_POLICY, ignore_eos=True, stop_token_ids=True),
    "the reference with the queue in priority order (lower priority value first)",
)
# Every configuration; the queue is by max_new_tokens, longest first.
REFERENCE_DLLM_LONGEST_OUTPUT_FIRST = DllmImplementation(
    make_longest_output_first_scheduler,
    DllmProfile(policy=LONGEST_OUTPUT_FIRST_POLICY, ignore_eos=True, stop_token_ids=True),
    "the reference with the queue by max_new_tokens, longest first (SGLang's lof)",
)
