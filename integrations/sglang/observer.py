"""What one SGLang 0.5.23 dLLM scheduler and its worker do, as the spec's events.

SGLang emits no events, so `SglangObserver` derives them, and both the conformance adapter
(`integrations.sglang.adapter`, which drives SGLang itself) and the live event log
(`integrations.sglang.event_log`, which watches a scheduler that something else drives) use
this one derivation:

- pool events (`Admitted`, `KvAllocated`, `KvFreed`, `RowReleased`) are reconstructed with
  `spec.reconstruct` from pool views read from SGLang's own pools: the request-to-token table
  (`ReqToTokenPool.req_to_token`, each held row up to the request's `kv.kv_allocated_len`) and
  the allocator's free list (`get_all_free_pages`). A view is taken after the batch is planned
  (admissions and allocations, before the first forward), after the batch's results are
  processed (frees, before each `Finished`) and after an abort;
- `Forward` is emitted when the algorithm calls the worker's model runner (`forward`) and
  `StepResult` when it calls its `step`, whatever the algorithm (every SGLang algorithm runs
  in `DllmAlgorithm.run`'s loops, dllm/algorithm/base.py): both are wrapped on the instances
  by `attach_worker`. A row's masks remaining are counted in the batch's `input_ids` after the
  step (SGLang's steps write them in place);
- `BlockCommitted` and `Finished` come from the requests' state after
  `process_batch_result_dllm` (a row without `dllm_incomplete_ids` committed its block;
  `req.finished()`).

With the radix cache on (`DllmConfig.prefix_cache`, SGLang's default for dLLMs), a view also
reads the tree's slots (`all_values_flatten`): a row position whose slot the tree holds is a
read of a cached block, not an owned slot, and `spec.reconstruct` derives `KvCached`,
`CacheHit`, `CacheReleased` and `CacheEvicted` from two views.

Ids (`DllmPolicy.reserved_kv_pages = 1`, `reserved_rows = 1`): SGLang keeps KV page 0 and
request-pool row 0 for padding, so spec slot = engine slot - page_size and spec row = engine
row - 1; the spec's pool is the rest.

SGLang's sync `DllmAlgorithm._run_sync` skips the step when every row of the batch is a
complete prompt block (one forward writes their KV); the observer reports that forward's step
results as done (the block had no mask), which is what the step would have returned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from integrations.instance_hooks import InstanceHooks
from spec.adapter import EventSink
from spec.config import DllmConfig
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

# SGLang's finish reasons (managers/schedule_batch.py) as the spec's. A matched token is EOS
# when it is the model's EOS and STOP otherwise (a stop token id, a grammar's end); any other
# reason (an abort: `to_finish`, an invalid regex) has no name in the spec's `Finished`.
_REASONS = {
    "FINISH_LENGTH": FinishReason.LENGTH,
    "FINISH_MATCHED_TOKEN": FinishReason.EOS,
    "FINISH_MATCHED_STR": FinishReason.STOP,
    "FINISHED_MATCHED_REGEX": FinishReason.STOP,
}


class UnnamedFinish(RuntimeError):
    """SGLang finished a request for a reason the spec's `Finished` has no name for."""


def stop_token_ids(req: Any, config: DllmConfig) -> tuple[int, ...]:
    """The token ids other than the configuration's EOS on which SGLang ends `req`
    (`Submitted.stop_token_ids`, sorted): its `stop_token_ids`, the model's other EOS ids and
    its tokenizer's EOS and extra stop ids, as `Req._check_token_based_finish` matches them.
    SGLang reports a match as `FINISH_MATCHED_TOKEN`, the observer as STOP. (Under
    `ignore_eos` SGLang matches none of them, and neither does the spec.) The mask id is left
    out: a step never commits it, so it ends nothing, and the spec refuses it as a stop id."""
    ids = set(req.sampling_params.stop_token_ids or ())
    ids |= set(getattr(req, "eos_token_ids", None) or ())
    tokenizer = req.tokenizer
    if tokenizer is not None:
        ids.add(getattr(tokenizer, "eos_token_id", None))
        ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
    ids -= {None, config.eos_token_id, config.mask_token_id}
    return tuple(sorted(int(t) for t in ids))


def has_sampled_stop(req: Any) -> bool:
    """Whether SGLang may end `req` on a condition the spec cannot evaluate
    (`Submitted.stop_sampled`): stop strings or a stop regex (matched on decoded text), or a
    grammar (which ends the request when it terminates). Its stop token ids the spec evaluates
    itself (`stop_token_ids`)."""
    params = req.sampling_params
    grammar = (params.json_schema, params.regex, params.ebnf, params.structural_tag)
    return bool(params.stop_strs or params.stop_regex_strs or any(grammar))


class SglangObserver:
    """Derives the spec's events from one SGLang scheduler's pools and requests.

    The caller reports what happened, in the order SGLang does it: `submitted` for each new
    request, then per round `begin_round` (before `get_next_batch_to_run`), `planned` (after
    it, with the batch to run), the worker's forwards and steps (seen through
    `attach_worker`), `completed` (after `process_batch_result_dllm`) and `end_round`;
    `aborted` after SGLang ended requests outside a round.

    `request_id(req)` is the spec's id of a SGLang `Req`. With `strict`, a finish the spec has
    no name for raises `UnnamedFinish` (the conformance suite reports it as an implementation
    error); without, it is logged as `Aborted` (a live log must not stop the server). With
    `keep_outputs` the outputs of finished requests are kept for `collect_outputs`; a live log
    passes False (nothing collects them, and a server's memory must not grow with them).
    `priority_sign` -1 writes each request's priority negated (`priority`), for a scheduler
    that serves higher priority values first: the spec's order is lower first.
    """

    def __init__(
        self,
        config: DllmConfig,
        sink: EventSink,
        scheduler: Any,
        request_id: Callable[[Any], str],
        *,
        strict: bool = True,
        keep_outputs: bool = True,
        priority_sign: int = 1,
    ) -> None:
        self.config = config
        self.priority_sign = priority_sign
        self.sink = sink
        self.scheduler = scheduler
        self.request_id = request_id
        self.strict = strict
        self.keep_outputs = keep_outputs
        self.live: dict[str, Any] = {}  # spec id -> SGLang Req, submitted and not yet terminal
        self.round_index: int = 0
        self._admitted: dict[str, None] = {}  # live requests in the order they got a row
        self._carried: set[str] = set()  # requests whose block was carried into this round
        self._view = PoolView()
        self._owners: dict[int, SlotOwner] = {}  # spec slot -> last known owner
        self._outputs: dict[str, FinishedOutput] = {}
        self._batch: list[Any] = []  # the requests of the batch being run, in row order
        self._row_block: dict[str, int] = {}  # request -> block index fed in this round
        self._extend: dict[str, int] = {}  # request -> tokens fed in this round
        self._ending: list[Any] = []  # requests leaving now (their rows are still read)
        self._steps_since_forward = 0

    # ------------------------------------------------------------------ the worker
    def attach_worker(self, worker: Any, hooks: InstanceHooks) -> None:
        """Wrap `worker`'s model runner `forward` and its algorithm's `step` on those
        instances (their classes are untouched); `hooks.restore()` unwraps them."""
        runner, algorithm = worker.model_runner, worker.dllm_algorithm

        def logged_forward(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            self.forward(forward_batch)
            return forward(forward_batch, *args, **kwargs)

        def logged_step(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            done = step(forward_batch, *args, **kwargs)
            self.stepped(forward_batch, done)
            return done

        forward = hooks.replace(runner, "forward", logged_forward)
        step = hooks.replace(algorithm, "step", logged_step)

    # ------------------------------------------------------------------ pool views
    def _engine_rows(self) -> dict[int, Any]:
        """Engine row -> the live or just-ended Req holding it (from each request's kv info)."""
        rows: dict[int, Any] = {}
        for req in list(self.live.values()) + list(self._ending):
            idx = req.kv.req_pool_idx
            if idx is not None:
                rows[int(idx)] = req
        return rows

    def free_slots(self) -> frozenset[int]:
        """The spec's slots SGLang's allocator holds free."""
        p = self.config.page_size
        pages = self.scheduler.token_to_kv_pool_allocator.get_all_free_pages()
        slots = self.config.kv_slots
        free: set[int] = set()
        for page in [] if pages is None else pages.tolist():
            # engine page k holds engine slots k*p .. k*p+p-1; the spec's are p lower
            first = int(page) * p - p
            free.update(range(max(first, 0), min(first + p, slots)))
        return frozenset(free)

    def cached_slots(self) -> frozenset[int]:
        """The spec's slots SGLang's radix tree holds (none with the cache disabled)."""
        if not self.config.prefix_cache:
            return frozenset()
        tree = self.scheduler.tree_cache
        if getattr(tree, "disable", True):
            return frozenset()
        p = self.config.page_size
        return frozenset(int(v) - p for v in tree.all_values_flatten().tolist())

    def read_view(self) -> PoolView:
        """SGLang's pools now, in spec ids. A slot that no row references any more but that the
        allocator has not freed (nor the tree holds) stays with its last owner: a leak shows up
        as KV the request still owns (terminal_owns_nothing), not as a silent gap."""
        p = self.config.page_size
        b = self.config.block_size
        table = self.scheduler.req_to_token_pool.req_to_token
        cached = self.cached_slots()
        slots: dict[int, SlotOwner] = {}
        reads: dict[SlotOwner, list[int]] = {}
        rows: dict[int, str] = {}
        for row, req in self._engine_rows().items():
            rid = self.request_id(req)
            rows[row - 1] = rid
            n = int(req.kv.kv_allocated_len)
            for pos, slot in enumerate(table[row, :n].tolist()):
                spec_slot = int(slot) - p
                if spec_slot in cached:
                    reads.setdefault((rid, pos // b), []).append(spec_slot)
                else:
                    slots[spec_slot] = (rid, pos // b)
        free = self.free_slots()
        for slot, owner in self._owners.items():
            if slot not in slots and slot not in free and slot not in cached:
                slots[slot] = owner
        self._owners = dict(slots)
        held = set(rows.values())
        running = tuple(r for r in self._admitted if r in held)
        frozen_reads = {owner: tuple(read) for owner, read in reads.items()}
        return PoolView(slots, rows, running, cached, frozen_reads)

    def _sync_pools(self, *, acquire: bool) -> None:
        """Emit the pool events from the previous view to SGLang's pools now."""
        before = self._view
        for req in self._engine_rows().values():
            self._admitted.setdefault(self.request_id(req), None)
        after = self.read_view()
        for event in release_events(before, after):
            self.sink(event)
        if acquire:
            for event in acquire_events(before, after):
                self.sink(event)
        self._view = after

    def carrying(self) -> frozenset[str]:
        """Live requests that hold their row with an unfinished block."""
        return frozenset(
            rid
            for rid, req in self.live.items()
            if len(req.dllm_incomplete_ids) and req.kv.req_pool_idx is not None
        )

    def snapshot(self) -> Snapshot:
        """The spec's `Snapshot` of SGLang's pools now (`read_view`, `free_slots`, `carrying`); a
        slot no row references but the allocator has not freed stays with its last owner."""
        view = self.read_view()
        return Snapshot(
            free_slots=self.free_slots(),
            slot_owners=dict(view.slots),
            rows=dict(view.rows),
            running=frozenset(view.running),
            carrying=self.carrying(),
            cached_slots=view.cached if self.config.prefix_cache else None,
        )

    def collect_outputs(self) -> Mapping[str, FinishedOutput]:
        """The output of each request `completed` saw finish since the previous call, each once
        (always empty without `keep_outputs`)."""
        out, self._outputs = self._outputs, {}
        return out

    # ------------------------------------------------------------------ what happened
    def submitted(self, req: Any) -> None:
        """`req` entered the scheduler's waiting queue."""
        rid = self.request_id(req)
        self.live[rid] = req
        prompt = tuple(int(t) for t in req.origin_input_ids)
        params = req.sampling_params
        self.sink(
            Submitted(
                rid,
                prompt,
                int(params.max_new_tokens),
                stop_sampled=has_sampled_stop(req),
                ignore_eos=bool(params.ignore_eos),
                stop_token_ids=stop_token_ids(req, self.config),
                priority=self.priority(req),
            )
        )

    def priority(self, req: Any) -> int:
        """`req`'s priority as the spec reads it (`Submitted.priority`, lower first): SGLang's
        `Req.priority` (0 when it has none), negated when `priority_sign` is -1 (a scheduler
        that serves higher values first)."""
        value = getattr(req, "priority", None)
        return 0 if value is None else self.priority_sign * int(value)

    def begin_round(self) -> None:
        """Before `get_next_batch_to_run`: note which blocks are carried into the round."""
        self._carried = set(self.carrying())

    def planned(self, batch: Any) -> None:
        """After `get_next_batch_to_run` chose `batch` (None: nothing to run)."""
        reqs = [] if batch is None else list(batch.reqs)
        for req in reqs:  # admission order = batch order
            if req.kv.req_pool_idx is not None:
                self._admitted.setdefault(self.request_id(req), None)
        self._sync_pools(acquire=True)
        self._batch = reqs
        if batch is None:
            return
        b = self.config.block_size
        self._row_block = {
            self.request_id(req): int(prefix) // b
            for req, prefix in zip(reqs, batch.prefix_lens, strict=True)
        }
        self._extend = {
            self.request_id(req): int(n) for req, n in zip(reqs, batch.extend_lens, strict=True)
        }

    def forward(self, forward_batch: Any) -> None:
        """The worker is about to run the model on the planned batch."""
        b = self.config.block_size
        mask = self.config.mask_token_id
        flat = forward_batch.input_ids.tolist()
        rows: list[ForwardRow] = []
        offset = 0
        for req in self._batch:
            rid = self.request_id(req)
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
        self._steps_since_forward = 0
        self.sink(Forward(tuple(rows)))

    def stepped(self, forward_batch: Any, done: list[bool]) -> None:
        """The algorithm's step returned `done` per row, having written `input_ids` in place.
        Only the batch's own rows are read: rows past them (padding a server may add for a
        captured graph) are no request's."""
        b = self.config.block_size
        mask = self.config.mask_token_id
        n = len(self._batch)
        ids = forward_batch.input_ids.view(-1, b)[:n].tolist()
        prompt = forward_batch.dllm_prompt_mask
        in_prompt = [[False] * b] * n if prompt is None else prompt[:n].tolist()
        self._steps_since_forward += 1
        for req, row, skip, is_done in zip(self._batch, ids, in_prompt, done[:n], strict=True):
            remaining = sum(1 for t, p in zip(row, skip, strict=True) if t == mask and not p)
            self._step_result(req, bool(is_done), remaining)

    def _step_result(self, req: Any, done: bool, remaining: int) -> None:
        rid = self.request_id(req)
        committed = self.config.block_size if done else 0
        self.sink(StepResult(rid, self._row_block[rid], committed, remaining))

    def completed(self, batch: Any) -> None:
        """After `process_batch_result_dllm(batch, ...)`: commit done blocks, then frees, then
        `Finished` (or `Aborted`) for requests SGLang ended."""
        if self._steps_since_forward == 0:
            # sync, every row a complete prompt block: SGLang skipped the step (see module)
            for req in self._batch:
                self._step_result(req, True, 0)
        b = self.config.block_size
        ended: list[tuple[str, Any]] = []
        for req in batch.reqs:
            rid = self.request_id(req)
            if len(req.dllm_incomplete_ids):
                continue  # carried: not done
            k = self._row_block[rid]
            fill = req.full_untruncated_fill_ids
            tokens = tuple(int(t) for t in fill[k * b : k * b + b])
            self.sink(BlockCommitted(rid, k, tokens))
            if req.finished():
                ended.append((rid, req))
        self._leave([req for _, req in ended])
        for rid, req in ended:
            reason = self._reason(req.finished_reason)
            if reason is None:
                if self.strict:
                    raise UnnamedFinish(
                        f"SGLang finished {req.rid!r} with "
                        f"{type(req.finished_reason).__name__}, neither length, EOS nor a stop"
                    )
                self.sink(Aborted(rid))
                continue
            n = req.finished_len if req.finished_len is not None else len(req.output_ids)
            if self.keep_outputs:
                tokens = tuple(int(t) for t in req.output_ids[:n])
                self._outputs[rid] = FinishedOutput(tokens, reason)
            self.sink(Finished(rid, reason))

    def _reason(self, finished: Any) -> FinishReason | None:
        reason = _REASONS.get(type(finished).__name__)
        if reason is FinishReason.EOS and finished.matched != self.config.eos_token_id:
            return FinishReason.STOP  # a stop token id, or a grammar that ended on this token
        return reason

    def aborted(self, reqs: list[Any]) -> None:
        """SGLang ended `reqs` outside a round's results (an abort): frees, then `Aborted`."""
        ending = [req for req in reqs if self.request_id(req) in self.live]
        self._leave(ending)
        for req in ending:
            self.sink(Aborted(self.request_id(req)))

    def _leave(self, reqs: list[Any]) -> None:
        """`reqs` are terminal: log what SGLang freed, reading their rows one last time."""
        self._ending = reqs
        for req in reqs:
            rid = self.request_id(req)
            self.live.pop(rid, None)
        self._sync_pools(acquire=False)
        self._ending = []
        for req in reqs:
            self._admitted.pop(self.request_id(req), None)

    def end_round(self) -> None:
        """The scheduler is back in control: `ControlReturned` for this round."""
        self.sink(ControlReturned(self.round_index))
        self.round_index += 1


__all__ = ["SglangObserver", "UnnamedFinish"]
