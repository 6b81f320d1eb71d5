"""The dLLM adapter for SGLang 0.5.23: the spec's `SchedulerAdapter` over SGLang's real path.

Each call drives SGLang's own code (see `integrations.sglang.engine` for what runs for real and
what is stubbed) and turns what happened into the spec's events. SGLang emits no events, so:

- pool events (`Admitted`, `KvAllocated`, `KvFreed`, `RowReleased`) are reconstructed with
  `spec.reconstruct` from pool views read from SGLang's own pools: the request-to-token table
  (`ReqToTokenPool.req_to_token`, each held row up to the request's `kv.kv_allocated_len`) and
  the allocator's free list (`get_all_free_pages`). A view is taken before the round, after
  `get_next_batch_to_run` (admissions and allocations, before the first forward) and after
  `process_batch_result_dllm` (frees, before each `Finished`);
- `Forward` is emitted when SGLang's `DllmAlgorithm.run` calls the model runner, `StepResult`
  when it calls `step`, `BlockCommitted` / `Finished` from the requests' state after
  `process_batch_result_dllm` (a done row's block is committed; `req.finished()`).

The spec's ids vs SGLang's (`DllmPolicy.reserved_kv_pages = 1`, `reserved_rows = 1`): SGLang
keeps KV page 0 and request-pool row 0 for padding, so spec slot = engine slot - page_size and
spec row = engine row - 1; the spec's pool is the rest.

Where SGLang's contract differs from the spec's, the adapter makes the spec's hold and says so:
- SGLang aborts every request whose id *starts with* the given id (`abort_request`,
  managers/scheduler.py:5688; `DllmManager.pop_aborted_reqs`): aborting `r1` would abort `r10`.
  The adapter gives SGLang ids that are never prefixes of each other
  (`<len>:<spec id>|`).
- SGLang ignores an abort of an unknown id; the spec requires `UnknownRequest`. The adapter
  checks its own table of live requests first.
- SGLang finishes a request whose output holds any negative token id
  (`Req._check_vocab_boundary_finish`). The spec's prompts are >= 0 and the scripted step only
  writes tokens in 1..98, so this never fires; a finish that is neither length nor EOS would be
  reported as an implementation error.
- SGLang's sync `DllmAlgorithm._run_sync` skips the step when every row of the batch is a
  complete prompt block (one forward writes their KV); the adapter reports that forward's step
  results as done (the block had no mask), which is what the step would have returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from integrations.sglang.engine import Engine, build, run_worker
from spec.adapter import EventSink
from spec.config import DllmConfig, RequestSpec, validate_request
from spec.errors import DuplicateRequest, SchedulerStalled, UnknownRequest
from spec.events import (
    Aborted,
    BlockCommitted,
    ControlReturned,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    StepResult,
    Submitted,
)
from spec.reconstruct import PoolView, acquire_events, release_events
from spec.snapshot import FinishedOutput, SlotOwner, Snapshot


def engine_request_id(request_id: str) -> str:
    """SGLang's id for a spec request id: never a prefix of another such id (SGLang aborts by
    prefix), because the length comes first and `|` ends it."""
    return f"{len(request_id)}:{request_id}|"


class SglangDllmAdapter:
    """Implements `spec.adapter.SchedulerAdapter` (and `ReportsOutputs`) over SGLang 0.5.23."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        self._config = config
        self.sink = sink
        self._spec_id: dict[int, str] = {}
        self.engine: Engine = build(config, self._spec_id)
        self.engine.record.on_forward = self._on_forward
        self.engine.record.on_step = self._on_step
        self.live: dict[str, Any] = {}  # spec id -> SGLang Req, submitted and not yet terminal
        self.seen: set[str] = set()
        self.admission_order: list[str] = []
        self.round_index = 0
        self._carried: set[str] = set()  # requests whose block was carried into this round
        self._view = PoolView()
        self._owners: dict[int, SlotOwner] = {}  # spec slot -> last known owner
        self._outputs: dict[str, FinishedOutput] = {}
        self._row_block: dict[str, int] = {}  # request -> block index fed in this round
        self._extend: dict[str, int] = {}  # request -> tokens fed in this round
        self._ending: list[Any] = []  # requests leaving now (their rows are still read)

    @property
    def config(self) -> DllmConfig:
        return self._config

    # ------------------------------------------------------------------ pool views
    def _engine_rows(self) -> dict[int, Any]:
        """Engine row -> the live or just-ended Req holding it (from each request's kv info)."""
        rows: dict[int, Any] = {}
        for req in list(self.live.values()) + list(self._ending):
            idx = req.kv.req_pool_idx
            if idx is not None:
                rows[int(idx)] = req
        return rows

    def _free_slots(self) -> frozenset[int]:
        p = self.config.page_size
        pages = self.engine.allocator.get_all_free_pages()
        free = set()
        for page in [] if pages is None else pages.tolist():
            for off in range(p):
                free.add(int(page) * p + off - p)
        return frozenset(s for s in free if 0 <= s < self.config.kv_slots)

    def _read_view(self) -> PoolView:
        """SGLang's pools now, in spec ids. A slot that no row references any more but that the
        allocator has not freed stays with its last owner: a leak shows up as KV the request
        still owns (terminal_owns_nothing), not as a silent gap."""
        p = self.config.page_size
        b = self.config.block_size
        table = self.engine.req_to_token_pool.req_to_token
        slots: dict[int, SlotOwner] = {}
        rows: dict[int, str] = {}
        for row, req in self._engine_rows().items():
            rid = self._spec_id[id(req)]
            rows[row - 1] = rid
            n = int(req.kv.kv_allocated_len)
            for pos, slot in enumerate(table[row, :n].tolist()):
                slots[int(slot) - p] = (rid, pos // b)
        free = self._free_slots()
        for slot, owner in self._owners.items():
            if slot not in slots and slot not in free:
                slots[slot] = owner
        self._owners = dict(slots)
        held = set(rows.values())
        running = tuple(r for r in self.admission_order if r in held)
        return PoolView(slots, rows, running)

    def _sync_pools(self, *, acquire: bool) -> None:
        """Emit the pool events from the previous view to SGLang's pools now."""
        before = self._view
        for req in self._engine_rows().values():
            rid = self._spec_id[id(req)]
            if rid not in self.admission_order:
                self.admission_order.append(rid)
        after = self._read_view()
        for event in release_events(before, after):
            self.sink(event)
        if acquire:
            for event in acquire_events(before, after):
                self.sink(event)
        self._view = after

    # ------------------------------------------------------------------ API
    def submit(self, request: RequestSpec) -> None:
        validate_request(self.config, request)
        rid = request.request_id
        if rid in self.seen:
            raise DuplicateRequest(rid)
        m = self._modules()
        params = m["SamplingParams"](max_new_tokens=request.max_new_tokens, temperature=0.0)
        params.normalize(None)
        eos = self.config.eos_token_id
        req = m["Req"](
            engine_request_id(rid),
            "",
            _array(request.prompt),
            params,
            dllm_config=self.engine.sg_config,
            vocab_size=1 << 30,
            eos_token_ids=None if eos is None else {eos},
        )
        self.seen.add(rid)
        self._spec_id[id(req)] = rid
        self.live[rid] = req
        self.engine.scheduler.waiting_queue.append(req)
        self.sink(Submitted(rid, request.prompt, request.max_new_tokens))

    def abort(self, request_id: str) -> None:
        req = self.live.get(request_id)
        if req is None:  # SGLang would ignore it silently; the spec requires a typed refusal
            raise UnknownRequest(request_id, len(self.live))
        m = self._modules()
        self._ending = [req]
        del self.live[request_id]
        self.engine.scheduler.abort_request(m["AbortReq"](rid=engine_request_id(request_id)))
        self._sync_pools(acquire=False)
        self._ending = []
        self.sink(Aborted(request_id))

    def run_round(self) -> None:
        s = self.engine.scheduler
        self._carried = {
            rid
            for rid, req in self.live.items()
            if len(req.dllm_incomplete_ids) and req.kv.req_pool_idx is not None
        }
        plan = s.get_next_batch_to_run(s.running_batch, s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        for req in [] if batch is None else batch.reqs:  # admission order = batch order
            rid = self._spec_id[id(req)]
            if req.kv.req_pool_idx is not None and rid not in self.admission_order:
                self.admission_order.append(rid)
        self._sync_pools(acquire=True)
        if batch is not None:
            self._row_block = {
                self._spec_id[id(req)]: int(prefix) // self.config.block_size
                for req, prefix in zip(batch.reqs, batch.prefix_lens, strict=True)
            }
            self._extend = {
                self._spec_id[id(req)]: int(n)
                for req, n in zip(batch.reqs, batch.extend_lens, strict=True)
            }
            result = run_worker(self.engine, batch)
            if self.engine.record.steps_after_forward == 0:
                # sync, every row a complete prompt block: SGLang skips the step (see docstring)
                self._on_step([(req, True, 0) for req in batch.reqs])
            s.process_batch_result_dllm(batch, result)
            self._complete(batch)
        s.last_batch = batch
        self.sink(ControlReturned(self.round_index))
        self.round_index += 1

    def drain(self, max_rounds: int = 100_000) -> None:
        for _ in range(max_rounds):
            if not self.live:
                return
            self.run_round()
        if self.live:
            raise SchedulerStalled(max_rounds, f"{len(self.live)} requests still live")

    def snapshot(self) -> Snapshot:
        view = self._read_view()
        return Snapshot(
            free_slots=self._free_slots(),
            slot_owners=dict(view.slots),
            rows=dict(view.rows),
            running=frozenset(view.running),
            carrying=frozenset(
                rid
                for rid, req in self.live.items()
                if len(req.dllm_incomplete_ids) and req.kv.req_pool_idx is not None
            ),
        )

    def collect_outputs(self) -> Mapping[str, FinishedOutput]:
        out, self._outputs = self._outputs, {}
        return out

    # ------------------------------------------------------------------ worker callbacks
    def _on_forward(self, forward_batch: Any) -> None:
        b = self.config.block_size
        mask = self.config.mask_token_id
        flat = forward_batch.input_ids.tolist()
        rows: list[ForwardRow] = []
        offset = 0
        for req in forward_batch.reqs:
            rid = self._spec_id[id(req)]
            n = self._extend.get(rid, b)
            ids = flat[offset : offset + n]
            offset += n
            rows.append(
                ForwardRow(
                    request_id=rid,
                    block_index=self._row_block[rid],
                    reused=rid in self._carried,
                    num_tokens=n,
                    masked=sum(1 for t in ids if t == mask),
                )
            )
        self.sink(Forward(tuple(rows)))

    def _on_step(self, rows: list[tuple[Any, bool, int]]) -> None:
        b = self.config.block_size
        for req, done, remaining in rows:
            rid = self._spec_id[id(req)]
            self.sink(StepResult(rid, self._row_block[rid], b if done else 0, remaining))

    # ------------------------------------------------------------------ completion
    def _complete(self, batch: Any) -> None:
        """Commit done blocks, then frees, then `Finished` for requests SGLang finished."""
        b = self.config.block_size
        finished: list[tuple[str, Any]] = []
        for req in batch.reqs:
            rid = self._spec_id[id(req)]
            if len(req.dllm_incomplete_ids):
                continue  # carried: not done
            k = self._row_block[rid]
            fill = req.full_untruncated_fill_ids
            tokens = tuple(int(t) for t in fill[k * b : k * b + b])
            self.sink(BlockCommitted(rid, k, tokens))
            if req.finished():
                finished.append((rid, req))
        self._ending = [req for _, req in finished]
        for rid, _ in finished:
            self.live.pop(rid, None)
        self._sync_pools(acquire=False)
        self._ending = []
        for rid, req in finished:
            reason = _reason(req)
            n = req.finished_len if req.finished_len is not None else len(req.output_ids)
            self._outputs[rid] = FinishedOutput(tuple(int(t) for t in req.output_ids[:n]), reason)
            self.sink(Finished(rid, reason))

    @staticmethod
    def _modules() -> dict[str, Any]:
        from integrations.sglang.engine import import_engine

        return import_engine()


def _reason(req: Any) -> FinishReason:
    name = type(req.finished_reason).__name__
    if name == "FINISH_LENGTH":
        return FinishReason.LENGTH
    if name == "FINISH_MATCHED_TOKEN":
        return FinishReason.EOS
    raise RuntimeError(f"SGLang finished {req.rid!r} with {name}, neither length nor EOS")


def _array(tokens: tuple[int, ...]) -> Any:
    from array import array

    return array("q", tokens)


def make_sglang_dllm(config: DllmConfig, sink: EventSink) -> SglangDllmAdapter:
    """Factory: SGLang 0.5.23's real dLLM scheduler path for `config` (imports SGLang lazily)."""
    return SglangDllmAdapter(config, sink)


__all__ = ["SglangDllmAdapter", "engine_request_id", "make_sglang_dllm"]
