"""`DllmEngine`: the torch block-diffusion serving engine, as a `spec.adapter.SchedulerAdapter`.

Structure (SGLang's dLLM path in miniature):

    DllmEngine (scheduler)   waiting queue -> FCFS admission -> rounds -> commits / finishes
      ReqToTokenPool         gpu/request_pool.py: rows x max_context int32 table, row allocator
      PagedKvAllocator       gpu/allocator.py: per-slot owner tensors, free-page heap, reservation
      ModelRunner            gpu/model_runner.py: BlockDiffusionLM.forward_blocks on PagedKvCache
      algorithm              gpu/algorithms.py: LowConfidence / JointThreshold `step`
      BlockCache             gpu/prefix_cache.py: committed blocks kept for later prompts
                             (only with `DllmConfig.prefix_cache`)

A round:
1. admission: while a seat (max_running_requests), a free row and the head's worst-case pages
   (reserved now, so no later allocation can fail) are available, admit the head of the queue;
2. allocation: every running request without a current block starts its next block (prompt
   tokens at prompt positions, the tokenizer's MASK elsewhere) on fresh KV slots; a carried
   block either keeps its slots (in-place reuse) or gets fresh ones (no reuse);
3. worker: sync loops forward->step until every row is done; FDFO runs one forward->step, and
   with re-loop repeats while no block of the batch finished;
4. completion: done blocks are committed (streamed to `on_block`), requests that reached
   max_new_tokens or EOS are finished and release their KV and row at once; unfinished FDFO
   blocks become carries (`incomplete_ids` + `algo_state`), and without in-place reuse their
   KV slots are freed (with `rows_released_between_rounds` their request-pool rows too, taken
   again at the start of the next round, before admission: SGLang's FDFO before #27877);
5. `ControlReturned`.

With a prefix cache an admitted request first reads its cached whole prompt blocks (1), an
allocation that finds no free page evicts an unread cached block (2), and every commit hands
its block to the cache (4); a finished or aborted request stops reading (`gpu.prefix_cache`).

Mode (sync / fdfo) and algorithm are independent. Every decision is reported to the sink as a
`spec.events` event, in the order the spec describes; `snapshot()` reads the allocator's owner
tensors, the row-owner tensor and the running list, never the event log.

Bounded state: nothing in the engine grows with the number of requests it has served. A finished
or aborted request leaves no `EngineRequest`, handle or row behind; what outlives it is capped:
its output (`outputs`, until taken with `take_output` / `take_outputs`, at most
`max_retained_outputs`), its id (the duplicate-id window, `retired_id_window`) and, only when
`record` is on, its forward records (`forward_log`, a ring of `forward_log_cap`).

Token ids: events carry the config's ids; the model runs on the tokenizer's ids. See
`gpu.token_map` for the fixed bijection (the conformance suite's mask -1 / ids 0..15 land on
the model's characters '0'..'9', 'a'..'f').
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch

from gpu.allocator import PagedKvAllocator
from gpu.device_name import device_name
from gpu.gemm_probe import uneven_products
from gpu.kv_cache import PagedKvCache
from gpu.model import BlockDiffusionLM, BlockPlan
from gpu.model_config import ModelConfig
from gpu.model_runner import ModelRunner
from gpu.prefix_cache import BlockCache
from gpu.request import Carry, EngineRequest, StreamChunk
from gpu.request_pool import ReqToTokenPool
from gpu.token_map import TokenMap
from gpu.tokenizer import EOS_ID, MASK_ID, VOCAB_SIZE
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec, validate_request
from spec.errors import (
    ConfigError,
    DuplicateRequest,
    SchedSpecError,
    SchedulerStalled,
    UnknownRequest,
)
from spec.events import (
    Aborted,
    Admitted,
    BlockCommitted,
    ControlReturned,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    RowAcquired,
    RowReleased,
    StepResult,
)
from spec.golden import GoldenBranch, GoldenTie
from spec.implementation import DllmImplementation
from spec.machine import finish_of, output_of
from spec.profile import DllmConfigSpace, DllmPolicy, DllmProfile
from spec.snapshot import FinishedOutput, Snapshot


class DeviceUnavailable(ConfigError):
    """The requested device cannot be used here (e.g. `cuda` on a machine without CUDA)."""

    def __init__(self, device: str, detail: str) -> None:
        super().__init__("device", device, detail)


class NoRetainedOutput(SchedSpecError, KeyError):
    """`take_output` / `output_text` of a request id whose output the engine does not hold."""

    def __init__(self, request_id: str, retained: int, cap: int) -> None:
        self.request_id = request_id
        super().__init__(
            f"no retained output for request id {request_id!r}: it has not finished, was "
            f"aborted, was already taken, or was dropped past max_retained_outputs={cap} "
            f"({retained} outputs retained)"
        )

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0])


def wait_for_device(device: torch.device) -> None:
    """Block until `device` has run everything queued on it (nothing to wait for on the CPU):
    what a timer reads after this includes the device's work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device(device: str | torch.device) -> torch.device:
    """`cpu`, `cuda[:n]` or `auto` (CUDA when available) -> a usable torch device."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                name,
                "CUDA is not available on this machine (torch.cuda.is_available() is "
                "False); use --device cpu",
            )
        try:
            dev = torch.device(name)
        except RuntimeError as err:
            raise DeviceUnavailable(name, f"not a valid CUDA device ({err})") from None
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceUnavailable(name, f"only {torch.cuda.device_count()} CUDA devices")
        return dev
    raise DeviceUnavailable(name, "one of 'cpu', 'cuda', 'cuda:N', 'auto'")


class StepAlgorithm(Protocol):
    """What the engine needs of a dLLM step algorithm (gpu.algorithms.DllmAlgorithm)."""

    def init_step_state(self, block_tokens: torch.Tensor) -> object:
        """The state a fresh block [B] starts with (the engine passes the host copy)."""
        ...

    def step(self, tokens: torch.Tensor, logits: torch.Tensor, states: list[object]) -> list[bool]:
        """Update tokens [b, B] in place from logits [b, B, V]; return done per row (complete
        when the step started). May replace entries of `states`."""
        ...

    def step_counted(
        self, tokens: torch.Tensor, logits: torch.Tensor, states: list[object]
    ) -> tuple[list[bool], list[int]]:
        """As `step`, also returning the masks left per row, both from one device-to-host
        copy: the only call the engine makes per forward."""
        ...


@dataclass(frozen=True, slots=True)
class ForwardRecord:
    """One forward of the engine, for the parity and differential properties."""

    round_index: int
    rows: tuple[tuple[str, int], ...]  # (request id, block index) per row
    done: tuple[bool, ...]  # the step's done flag per row (sticky within the round)
    digest: str | None  # sha256 of the raw logits bytes


OnBlock = Callable[[StreamChunk], None]

# Default caps of the engine's retained state (see `DllmEngine`): each holds at most this many
# entries, so a long-lived engine's memory stays flat whatever its caller collects.
FORWARD_LOG_CAP = 65_536
MAX_RETAINED_OUTPUTS = 65_536
RETIRED_ID_WINDOW = 4_096


class DllmEngine:
    """The engine. Implements `spec.adapter.SchedulerAdapter`.

    model: a `BlockDiffusionLM` (on `device`); algorithm: a step algorithm
    (`gpu.algorithms.make_algorithm`); device: "cpu", "cuda[:N]" or "auto"; kv_dtype: the KV
    pool's dtype; on_block: streaming callback, called with a `StreamChunk` for every committed
    block (the way a server gets every output without retaining any);
    rows_released_between_rounds: under FDFO without in-place reuse a carried block gives back
    its request-pool row with its KV, and the request takes the lowest free row again (its
    committed blocks' table entries rewritten) at the start of the next round (the profile
    option `spec.profile.DllmPolicy.rows_released_between_rounds`; `releases_rows` says whether
    it acts under this config: never under sync or with reuse); priority_order and
    longest_output_first: the waiting queue in `spec.profile.DllmPolicy.queue_key` order
    (lower priority value first; the longer `max_new_tokens` first; both: priority, then
    length), submission order breaking ties, where the default is submission order (SGLang's
    `--enable-priority-scheduling` and `--schedule-policy lof`; the profile options of the same
    names). Admission stays head-of-line in either order: the head is admitted while it fits.
    With `config.prefix_cache` (page_size must equal block_size) committed blocks are kept in
    `prefix_cache` (`gpu.prefix_cache.BlockCache`) for later requests with the same prefix.

    Retained state, all bounded (memory does not grow with the number of requests served):

    - record (opt-in, default off): keep `forward_log`, per forward the rows, done flags and the
      sha256 of the raw logits (for the parity and differential properties; costs a host copy
      of the logits). It is a ring of the last `forward_log_cap` forwards; `forward_log_dropped`
      counts the older ones it let go.
    - `outputs`: request id -> output of every finished request not yet taken, in finishing
      order. `take_output(rid)` / `take_outputs()` hand outputs over and forget them; beyond
      `max_retained_outputs` untaken outputs the oldest is dropped (`outputs_dropped` counts
      them). Aborted requests have no output.
    - duplicate ids: a queued or running id is always refused with `DuplicateRequest`; a retired
      (finished or aborted) id is refused while it is among the last `retired_id_window`
      retired ids. The spec asks ids to be unique for the engine's lifetime: beyond the window,
      keeping them unique is the caller's part (a server's ids are UUIDs).
    """

    def __init__(
        self,
        config: DllmConfig,
        sink: EventSink,
        *,
        model: BlockDiffusionLM,
        algorithm: StepAlgorithm,
        device: str | torch.device = "cpu",
        kv_dtype: torch.dtype = torch.float32,
        record: bool = False,
        forward_log_cap: int = FORWARD_LOG_CAP,
        max_retained_outputs: int = MAX_RETAINED_OUTPUTS,
        retired_id_window: int = RETIRED_ID_WINDOW,
        on_block: OnBlock | None = None,
        rows_released_between_rounds: bool = False,
        priority_order: bool = False,
        longest_output_first: bool = False,
    ) -> None:
        for name, cap in (
            ("forward_log_cap", forward_log_cap),
            ("max_retained_outputs", max_retained_outputs),
            ("retired_id_window", retired_id_window),
        ):
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
                raise ConfigError(name, cap, "an integer >= 0")
        for name, flag in (
            ("rows_released_between_rounds", rows_released_between_rounds),
            ("priority_order", priority_order),
            ("longest_output_first", longest_output_first),
        ):
            if not isinstance(flag, bool):  # a truthy string would switch a policy on silently
                raise ConfigError(name, flag, "a bool (True or False)")
        # K/V are activations: an integer pool would truncate them to garbage without an error
        if not isinstance(kv_dtype, torch.dtype) or not kv_dtype.is_floating_point:
            raise ConfigError(
                "kv_dtype", kv_dtype, "a floating-point torch dtype (torch.float32, torch.bfloat16)"
            )
        self._config = config
        self.sink = sink
        self.device: torch.device = resolve_device(device)
        mc: ModelConfig = model.config
        if config.max_context > mc.max_context:
            raise ConfigError(
                "max_context",
                config.max_context,
                f"at most the model's max_context={mc.max_context}",
            )
        self.model_config: ModelConfig = mc
        self.model = model
        self.algorithm = algorithm
        # What golden_output decodes with: the algorithm as configured, so a code path that
        # swaps in another one (or other parameters) is measured against what was asked for.
        self.configured_algorithm = algorithm
        self.tokens: TokenMap = TokenMap(config, mc.vocab_size, MASK_ID, EOS_ID)
        self.mask_id: int = MASK_ID
        self.allocator: PagedKvAllocator = PagedKvAllocator(
            config.kv_pages, config.page_size, config.block_size, sink
        )
        if config.prefix_cache and config.page_size != config.block_size:
            raise ConfigError(
                "page_size",
                config.page_size,
                f"equal to block_size={config.block_size} with prefix_cache on (the engine "
                "caches whole pages of one block each, as SGLang's dLLM path)",
            )
        # committed blocks kept for later requests with the same prefix (`gpu.prefix_cache`)
        self.prefix_cache: BlockCache | None = (
            BlockCache(self.allocator, sink) if config.prefix_cache else None
        )
        self.req_pool: ReqToTokenPool = ReqToTokenPool(
            config.req_pool_rows, config.max_context, self.device
        )
        self.kv: PagedKvCache = PagedKvCache(
            mc.n_layers, mc.n_heads, mc.head_dim, config.kv_slots, kv_dtype, self.device
        )
        self.runner: ModelRunner = ModelRunner(
            model, self.kv, self.req_pool, MASK_ID, record_digests=record
        )
        # the padding is measured now, not in the first round: on CUDA its probe reads the
        # device back, and a round reads back only its done flags
        model.product_rows()
        self.record = record
        self.on_block = on_block
        # SGLang's FDFO before #27877: a carried block gives back its row with its KV (only
        # FDFO without in-place reuse has carried blocks whose KV goes back)
        self.releases_rows: bool = (
            rows_released_between_rounds and config.mode is Mode.FDFO and not config.in_place_reuse
        )
        # the order `_enqueue` keeps the waiting queue in (its other fields are not used)
        self.queue_order: DllmPolicy = DllmPolicy(
            priority_order=priority_order, longest_output_first=longest_output_first
        )
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []  # admission order = batch order
        self._live: set[str] = set()  # ids queued or running
        # The last `retired_id_window` retired ids, oldest first (the set mirrors the deque).
        self._retired: deque[str] = deque()
        self._retired_set: set[str] = set()
        self.retired_id_window = retired_id_window
        self.round_index: int = 0
        self.outputs: dict[str, tuple[int, ...]] = {}  # untaken outputs, finishing order
        self._reasons: dict[str, FinishReason] = {}  # their finish reasons, in step with it
        self.max_retained_outputs = max_retained_outputs
        self.outputs_dropped: int = 0
        self.forward_log: deque[ForwardRecord] = deque(maxlen=forward_log_cap)
        self.forward_log_dropped: int = 0
        self.step_seconds: float = 0.0  # wall time in the algorithm's step
        # wall time allocating / freeing block KV and writing the table
        self.kv_seconds: float = 0.0
        self.rows_forwarded: int = 0  # sum over forwards of the rows (blocks) they ran
        self.row_rounds: int = 0  # sum over rounds of the rows (running requests) in the round
        self.blocks_allocated: int = 0  # block KV allocations (new blocks and re-allocated carries)
        # A block never needs more steps than this (LowConfidence: B + 1; JointThreshold:
        # B + max_post_edit_steps + 1); beyond it the engine stops instead of looping forever.
        self.max_block_steps: int = 4 * config.block_size + 256

    @property
    def config(self) -> DllmConfig:
        """The configuration given to the constructor (token ids, pool sizes, mode)."""
        return self._config

    # ------------------------------------------------------------------ API
    def submit(self, request: RequestSpec) -> None:
        """Validate and queue; a bad request raises a `spec.errors.RequestError` subclass and
        changes nothing."""
        if request.request_id in self._live or request.request_id in self._retired_set:
            raise DuplicateRequest(request.request_id)
        shape = validate_request(self.config, request)
        self.tokens.check_prompt(request.request_id, request.prompt)
        handle = self.allocator.register(request.request_id)
        self._live.add(request.request_id)
        self._enqueue(
            EngineRequest(
                spec=request,
                handle=handle,
                prompt_ids=self.tokens.to_internal(request.prompt),
                pages_needed=shape.pages,
            )
        )
        self.sink(request.submitted())

    def _enqueue(self, req: EngineRequest) -> None:
        """Queue `req` at the tail; under an ordered queue (`queue_order`) behind every
        waiting request whose key is not greater than its own instead (a stable insertion:
        what re-sorting the whole queue before every round, as SGLang does, gives)."""
        if not self.queue_order.orders_queue:
            self.waiting.append(req)
            return
        key = self._queue_key(req)
        at = len(self.waiting)
        while at and self._queue_key(self.waiting[at - 1]) > key:
            at -= 1
        self.waiting.insert(at, req)

    def _queue_key(self, req: EngineRequest) -> tuple[int, int]:
        return self.queue_order.queue_key(req.spec.priority, req.spec.max_new_tokens)

    def abort(self, request_id: str) -> None:
        """Between rounds: free everything the request holds, then report `Aborted`."""
        for req in self.waiting:
            if req.rid == request_id:
                self.waiting.remove(req)
                self.allocator.unregister(req.handle)
                self._retire(request_id)
                self.sink(Aborted(request_id))
                return
        for req in self.running:
            if req.rid == request_id:
                self._release(req)
                self.running.remove(req)
                self.allocator.unregister(req.handle)
                self._retire(request_id)
                self.sink(Aborted(request_id))
                return
        raise UnknownRequest(request_id, len(self.waiting) + len(self.running))

    def run_round(self) -> None:
        """FCFS admission (a seat, a free row and the head's worst-case pages, reserved), a
        block with KV slots for every running request, then under `torch.inference_mode` the
        worker's forwards and steps over the whole batch and the commits, finishes and carries;
        ends with `ControlReturned(round_index)` and advances `round_index`. Raises
        `SchedulerStalled` when the round's forwards (sync, or FDFO with re-loop) reach
        `max_block_steps` without the round ending. With rows released between rounds, the
        running requests that gave their row back take one again first, before admission."""
        if self.releases_rows:
            t0 = time.perf_counter()
            self._reacquire_rows()
            self.kv_seconds += time.perf_counter() - t0
        self._admit()
        t0 = time.perf_counter()
        batch = self._prepare_batch()
        self.kv_seconds += time.perf_counter() - t0
        if batch:
            self.row_rounds += len(batch)
            with torch.inference_mode():
                tokens, states, done, masks = self._run_worker(batch)
                self._complete(batch, tokens, states, done, masks)
        self.sink(ControlReturned(self.round_index))
        self.round_index += 1

    def drain(self, max_rounds: int = 100_000) -> None:
        """`run_round` until `is_idle`; `SchedulerStalled` (with the waiting and running
        counts) when work is left after `max_rounds` rounds."""
        for _ in range(max_rounds):
            if self.is_idle():
                return
            self.run_round()
        if not self.is_idle():
            raise SchedulerStalled(
                max_rounds, f"{len(self.waiting)} waiting, {len(self.running)} running"
            )

    def is_idle(self) -> bool:
        """True when no request is waiting or running."""
        return not self.waiting and not self.running

    def snapshot(self) -> Snapshot:
        """Read from the allocator's owner tensors, the row-owner tensor and the running list."""
        return Snapshot(
            free_slots=self.allocator.free_slot_set(),
            slot_owners=self.allocator.slot_owners(),
            rows={row: self.allocator.name(h) for row, h in self.req_pool.held_rows().items()},
            running=frozenset(r.rid for r in self.running),
            carrying=frozenset(r.rid for r in self.running if r.carry is not None),
            cached_slots=None if self.prefix_cache is None else self.allocator.cached_slot_set(),
        )

    # ------------------------------------------------------------------ scheduler phase
    def _reacquire_rows(self) -> None:
        """Rows released between rounds: each running request without a row takes the lowest
        free one (batch order) and gets its committed blocks' table entries back in it (the
        carried block's come with its new KV in `_prepare_batch`); one that finds no free row
        waits a round."""
        b = self.config.block_size
        writes: list[tuple[int, int, int]] = []
        for req in self.running:
            if req.row is None:
                if not self.req_pool.has_free():
                    break
                req.row = self.req_pool.acquire(req.handle)
                self.sink(RowAcquired(req.rid, req.row))
                writes.extend((req.row, k * b, f) for k, f in enumerate(req.block_first_slots))
        self.req_pool.write_blocks(writes, b)

    def _admit(self) -> None:
        """Head of line: admit the head of the waiting queue while it fits; stop at the first
        that does not (FCFS, or the queue's order)."""
        while self.waiting and len(self.running) < self.config.max_running_requests:
            head = self.waiting[0]
            if not self.req_pool.has_free() or not self.allocator.can_reserve(head.pages_needed):
                return
            self.waiting.popleft()
            self.allocator.reserve(head.pages_needed)
            head.row = self.req_pool.acquire(head.handle)
            self.running.append(head)
            self.sink(Admitted(head.rid, head.row))
            if self.prefix_cache is not None:
                self._read_cached_prompt(head, self.prefix_cache)

    def _read_cached_prompt(self, req: EngineRequest, cache: BlockCache) -> None:
        """A newly admitted request reads the longest run of its whole prompt blocks the
        cache holds (`CacheHit` each) and commits them without a forward; their table entries
        point at the cached slots."""
        b = self.config.block_size
        prompt = req.spec.prompt
        assert req.row is not None  # just admitted
        writes: list[tuple[int, int, int]] = []
        while (req.committed_blocks + 1) * b <= len(prompt):
            k = req.committed_blocks
            block = prompt[k * b : (k + 1) * b]
            digest = req.next_digest(block)
            first = cache.hit(req.rid, k, digest)
            if first is None:
                break
            req.committed_spec.extend(block)
            req.committed_blocks += 1
            req.block_first_slots.append(first)
            req.digests.append(digest)
            writes.append((req.row, k * b, first))
        self.req_pool.write_blocks(writes, b)

    def _prepare_batch(self) -> list[EngineRequest]:
        """Give every running request a block that holds KV slots; record new slots in the
        request-to-token table (one indexed write for the whole batch)."""
        self._start_blocks([req for req in self.running if not req.has_block])
        writes: list[tuple[int, int, int]] = []
        for req in self.running:
            if req.row is not None and self._ensure_block_kv(req):
                assert req.block_first_slot is not None
                pos = req.committed_blocks * self.config.block_size
                writes.append((req.row, pos, req.block_first_slot))
        self.req_pool.write_blocks(writes, self.config.block_size)
        if self.releases_rows:  # a request still without a row waits for one
            return [req for req in self.running if req.row is not None]
        return list(self.running)

    def _ensure_block_kv(self, req: EngineRequest) -> bool:
        """True when the request's block got new slots this round: a new block (started by
        `_start_blocks`), or a carried block whose slots were freed (no reuse). A carried block
        that kept its slots (in-place reuse) keeps its row, slots and table entries as they
        are."""
        if req.block_first_slot is None:
            self._allocate_block_kv(req)
            return True
        return False

    def _start_blocks(self, reqs: list[EngineRequest]) -> None:
        """The next block of each request: prompt tokens at prompt positions, MASK elsewhere
        (one tensor for all of them; each request holds its row's view). KV comes next."""
        if not reqs:
            return
        b = self.config.block_size
        rows: list[list[int]] = []
        for req in reqs:
            start = req.committed_blocks * b
            ids = req.prompt_ids[start : start + b]  # prompt ids never include MASK (TokenMap)
            req.fresh_masks = b - len(ids)
            ids.extend([self.mask_id] * req.fresh_masks)
            rows.append(ids)
        host = torch.tensor(rows, dtype=torch.long)
        host_rows = host.unbind(0)
        blocks = host_rows if self.device.type == "cpu" else host.to(self.device).unbind(0)
        for req, tokens, host_tokens in zip(reqs, blocks, host_rows, strict=True):
            req.fresh_tokens = tokens
            # states read the host copy: reading `tokens` on CUDA would wait for the device
            req.fresh_state = self.algorithm.init_step_state(host_tokens)

    def _allocate_block_kv(self, req: EngineRequest) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.make_room()  # evicts an unread cached block if no page is free
        prev_last = (
            req.block_first_slots[-1] + self.config.block_size - 1
            if req.block_first_slots
            else None
        )
        req.block_first_slot = self.allocator.allocate_block(
            req.handle, req.committed_blocks, prev_last
        )
        req.block_alloc_round = self.round_index
        self.blocks_allocated += 1

    # ------------------------------------------------------------------ worker phase
    def _block_inputs(self, req: EngineRequest) -> tuple[torch.Tensor, object, int | None]:
        """The block tokens, algorithm state and (when known on the host) mask count a row
        starts the round with."""
        carry = req.carry
        if carry is not None:
            return carry.incomplete_ids, carry.algo_state, carry.masks_left
        assert req.fresh_tokens is not None
        return req.fresh_tokens, req.fresh_state, req.fresh_masks

    def _plan_batch(self, starts: list[int], rows: list[int]) -> BlockPlan:
        """The round's batch layout (positions, block slots, each row's packed context): read
        from the request-to-token table once, after this round's table writes."""
        return self.runner.plan(starts, rows, self.config.block_size)

    def _run_worker(
        self, batch: list[EngineRequest]
    ) -> tuple[torch.Tensor, list[object], list[bool], list[int]]:
        """The round's forwards. Returns the block tokens [b, B] (updated in place by every
        step), the algorithm states, the done flags and the masks left per row. The only
        device-to-host copy per forward is the step's (done flags and mask counts together)."""
        cfg = self.config
        b = cfg.block_size
        n = len(batch)
        token_rows: list[torch.Tensor] = []
        states: list[object] = []
        masks: list[int] = []
        unknown: list[int] = []  # rows whose mask count is not known on the host
        starts: list[int] = []
        rows: list[int] = []
        heads: list[tuple[str, int, bool]] = []  # (request id, block, reused) per row
        for i, req in enumerate(batch):
            row_tokens, state, count = self._block_inputs(req)
            token_rows.append(row_tokens)
            states.append(state)
            if count is None:
                unknown.append(i)
                count = 0
            masks.append(count)
            k = req.committed_blocks
            starts.append(k * b)
            assert req.row is not None
            rows.append(req.row)
            heads.append((req.rid, k, req.block_alloc_round < self.round_index))
        tokens = torch.stack(token_rows)  # a copy: rows are updated in place
        if unknown:
            counted: list[int] = (tokens[unknown] == self.mask_id).sum(dim=1).tolist()
            for i, count in zip(unknown, counted, strict=True):
                masks[i] = count
        plan = self._plan_batch(starts, rows)  # one layout for every forward of the round
        done = [False] * n
        sync = cfg.mode is Mode.SYNC
        sink = self.sink
        for _ in range(self.max_block_steps):
            sink(
                Forward(
                    tuple(
                        ForwardRow(rid, k, reused, b, masks[i])
                        for i, (rid, k, reused) in enumerate(heads)
                    )
                )
            )
            logits = self.runner.forward(tokens, starts, rows, plan)
            self.rows_forwarded += n
            t0 = time.perf_counter()
            step_done, masks = self.algorithm.step_counted(tokens, logits, states)
            self.step_seconds += time.perf_counter() - t0
            newly_done = False
            for i, d in enumerate(step_done):
                if d and not done[i]:
                    done[i] = True
                    newly_done = True
            for i, (rid, k, _) in enumerate(heads):
                sink(StepResult(rid, k, b if done[i] else 0, masks[i]))
            if self.record:
                self._record_forward(heads, done)
            if sync:
                if all(done):
                    return tokens, states, done, masks
            elif newly_done or not cfg.reloop:
                return tokens, states, done, masks
        raise SchedulerStalled(
            self.max_block_steps, f"round {self.round_index}: blocks did not finish", "forwards"
        )

    def _record_forward(self, heads: list[tuple[str, int, bool]], done: list[bool]) -> None:
        if len(self.forward_log) == self.forward_log.maxlen:
            self.forward_log_dropped += 1
        self.forward_log.append(
            ForwardRecord(
                self.round_index,
                tuple((rid, k) for rid, k, _ in heads),
                tuple(done),
                self.runner.last_digest,
            )
        )

    # ------------------------------------------------------------------ completion
    def _complete(
        self,
        batch: list[EngineRequest],
        tokens: torch.Tensor,
        states: Sequence[object],
        done: list[bool],
        masks: list[int],
    ) -> None:
        rows: list[list[int]] | None = None
        views: tuple[torch.Tensor, ...] = ()
        for i, req in enumerate(batch):
            if done[i]:
                if rows is None:
                    rows = tokens.tolist()
                self._commit(req, rows[i])
            else:
                if not views:
                    views = tokens.unbind(0)  # one call for every row's view
                view = views[i]  # a view: next round's stack copies it
                self._carry(req, view, states[i])
                carry = req.carry
                if carry is not None and carry.incomplete_ids is view:
                    carry.masks_left = masks[i]  # the step's count of exactly these tokens

    def _commit(self, req: EngineRequest, block: list[int]) -> None:
        k = req.committed_blocks
        spec_tokens = self.tokens.to_spec(block)
        self.sink(BlockCommitted(req.rid, k, spec_tokens))
        before = len(self._output_of(req)) if self.on_block is not None else 0
        req.committed_spec.extend(spec_tokens)
        assert req.block_first_slot is not None
        req.block_first_slots.append(req.block_first_slot)
        req.committed_blocks += 1
        req.block_first_slot = None
        req.fresh_tokens = None
        req.fresh_state = None
        req.carry = None
        if self.prefix_cache is not None:
            self._cache_committed(req, k, spec_tokens, self.prefix_cache)
        reason = self._finish_reason(req)
        if reason is not None:
            self._finish(req, reason, self._output_of(req))
        if self.on_block is not None:
            output = self._output_of(req)
            self.on_block(StreamChunk(req.rid, k, spec_tokens, output[before:], reason))

    def _cache_committed(
        self, req: EngineRequest, k: int, tokens: tuple[int, ...], cache: BlockCache
    ) -> None:
        """The block just committed enters the cache (or, a duplicate, is read from the
        cached copy: the table entry moves there and the request's own copy is freed)."""
        digest = req.next_digest(tokens)
        req.digests.append(digest)
        own = req.block_first_slots[-1]
        first = cache.insert(req.rid, req.handle, k, own, digest)
        if first != own:
            req.block_first_slots[-1] = first
            if req.row is not None:
                b = self.config.block_size
                self.req_pool.write_blocks([(req.row, k * b, first)], b)

    def _carry(self, req: EngineRequest, incomplete_ids: torch.Tensor, algo_state: object) -> None:
        """FDFO: the unfinished block and its algorithm state travel to the next round; without
        in-place reuse its KV slots go back to the pool now."""
        req.carry = Carry(incomplete_ids, algo_state)
        req.fresh_tokens = None
        req.fresh_state = None
        if not self.config.in_place_reuse:
            self._drop_block_kv(req)
            if self.releases_rows:
                self._release_row(req)

    def _drop_block_kv(self, req: EngineRequest) -> None:
        if req.block_first_slot is not None:
            t0 = time.perf_counter()
            self.allocator.free_block(req.handle, req.block_first_slot)
            req.block_first_slot = None
            self.kv_seconds += time.perf_counter() - t0

    def _finish_reason(self, req: EngineRequest) -> FinishReason | None:
        end = finish_of(self.config, req.spec, req.generated)
        return None if end is None else end[0]

    def _output_of(self, req: EngineRequest) -> tuple[int, ...]:
        """The output so far (streamed before the request finishes): the spec's `output_of`."""
        return output_of(self.config, req.spec, req.generated)

    def _finish(self, req: EngineRequest, reason: FinishReason, output: tuple[int, ...]) -> None:
        self._release(req)
        self.running.remove(req)
        self.allocator.unregister(req.handle)
        req.output = output
        self._retain_output(req.rid, output, reason)
        self._retire(req.rid)
        self.sink(Finished(req.rid, reason))

    def _retain_output(
        self, request_id: str, output: tuple[int, ...], reason: FinishReason
    ) -> None:
        """Keep the output and its reason until taken; past the cap the oldest untaken one is
        dropped."""
        if self.max_retained_outputs == 0:
            self.outputs_dropped += 1
            return
        if len(self.outputs) >= self.max_retained_outputs:
            oldest = next(iter(self.outputs))
            del self.outputs[oldest], self._reasons[oldest]
            self.outputs_dropped += 1
        self.outputs[request_id] = output
        self._reasons[request_id] = reason

    def _retire(self, request_id: str) -> None:
        """The request ended: it leaves the live ids and enters the duplicate-id window."""
        self._live.discard(request_id)
        if self.retired_id_window == 0:
            return
        if len(self._retired) >= self.retired_id_window:
            self._retired_set.discard(self._retired.popleft())
        self._retired.append(request_id)
        self._retired_set.add(request_id)

    def _release(self, req: EngineRequest) -> None:
        """Free every KV slot the allocator records for the request (committed blocks and a
        retained in-progress block), stop reading its cached blocks, free its row; give back
        its page reservation."""
        self.allocator.free_all(req.handle)
        if self.prefix_cache is not None:
            self.prefix_cache.release(req.rid)
            req.digests.clear()
        req.block_first_slot = None
        req.block_first_slots.clear()
        req.carry = None
        req.fresh_tokens = None
        self._release_row(req)
        self.allocator.unreserve(req.pages_needed)

    def _release_row(self, req: EngineRequest) -> None:
        if req.row is not None:
            self.req_pool.release(req.row, req.handle)
            self.sink(RowReleased(req.rid, req.row))
            req.row = None

    # ------------------------------------------------------------------ outputs
    def take_output(self, request_id: str) -> tuple[int, ...]:
        """The finished request's output, handed over and forgotten. Raises `NoRetainedOutput`
        when it has none (not finished, aborted, taken or dropped)."""
        try:
            output = self.outputs.pop(request_id)
        except KeyError:
            raise NoRetainedOutput(
                request_id, len(self.outputs), self.max_retained_outputs
            ) from None
        del self._reasons[request_id]
        return output

    def take_outputs(self) -> dict[str, tuple[int, ...]]:
        """Every retained output (finishing order), handed over and forgotten."""
        taken, self.outputs, self._reasons = self.outputs, {}, {}
        return taken

    def collect_outputs(self) -> dict[str, FinishedOutput]:
        """`spec.adapter.ReportsOutputs`: every retained output with its finish reason
        (finishing order), handed over and forgotten as `take_outputs` does. The suites call it
        after every round, so what a client of the engine receives is checked against the spec
        (rule `reported_output`), not only the events."""
        reasons = self._reasons
        return {rid: FinishedOutput(out, reasons[rid]) for rid, out in self.take_outputs().items()}

    def retained_sizes(self) -> dict[str, int]:
        """Entries held by each per-request or per-forward container (for the soak and the
        bounded-state tests): none may grow with the number of requests served."""
        return {
            "waiting": len(self.waiting),
            "running": len(self.running),
            "live_ids": len(self._live),
            "retired_ids": len(self._retired_set),
            "outputs": len(self.outputs),
            "forward_log": len(self.forward_log),
            "allocator_handles": self.allocator.live_handles(),
            "held_rows": len(self.req_pool.held_rows()),
            # the prefix cache (0 without one): its blocks live in the pool's pages, and only
            # running requests read them
            "cached_blocks": 0 if self.prefix_cache is None else len(self.prefix_cache.blocks),
            "cache_readers": 0 if self.prefix_cache is None else len(self.prefix_cache.reads),
        }

    # ------------------------------------------------------------------ helpers
    def output_text(self, request_id: str) -> str:
        """A retained output (see `outputs`) decoded with the character tokenizer; raises
        `NoRetainedOutput` when the engine does not hold it."""
        from gpu.tokenizer import TOKENIZER

        if request_id not in self.outputs:
            raise NoRetainedOutput(request_id, len(self.outputs), self.max_retained_outputs)
        ids = self.tokens.to_internal(list(self.outputs[request_id]))
        return TOKENIZER.decode(ids, stop_at_eos=True)

    def golden_output(self, request: RequestSpec) -> FinishedOutput:
        """`spec.golden.GoldenDecoder`: the request decoded alone, dense, unpaged and unbatched,
        by this engine's model and algorithm (`gpu.golden`); changes nothing here."""
        from gpu.golden import engine_golden

        return engine_golden(self, request)

    def batch_numerics_note(self, most_rows: int) -> str:
        """`spec.batch_numerics.ReportsBatchNumerics`: '' when the model's products are
        batch-invariant up to `most_rows` rows on this device at torch's current thread count
        (`gpu.gemm_probe`); otherwise the uneven shapes with the device, as a possible cause."""
        found = uneven_products(self.model, most_rows)
        if not found:
            return ""
        shapes = "; ".join(product.describe() for product in found)
        return (
            f"matrix products on {device_name(self.device)} are not batch-invariant ({shapes}), "
            "so a batch-dependent difference can come from the platform's numerics rather than "
            "from scheduling"
        )

    def golden_near_tie(self, request: RequestSpec) -> GoldenTie | None:
        """`spec.golden.ReportsGoldenTies`: where the golden decoding of `request` first took
        a decision within float noise of flipping (`gpu.near_tie`), or None. The golden path
        is dense and this engine's paged, so past such a decision the two may part without
        either being wrong."""
        from gpu.golden import engine_near_tie

        return engine_near_tie(self, request)

    def golden_output_past_ties(
        self, request: RequestSpec, actual: FinishedOutput
    ) -> GoldenBranch | None:
        """`spec.golden.DecodesPastGoldenTies`: the golden decoding of `request` with near-ties
        taken the other way (within float noise, `gpu.golden.golden_past_ties`) whose output is
        `actual`, or None. Both sides of such a tie are correct decodings; the paged path may
        take the side the dense one did not."""
        from gpu.golden import engine_past_ties

        return engine_past_ties(self, request, actual)


# ---------------------------------------------------------------------------- factories
ASSETS = Path(__file__).resolve().parent / "assets"


@functools.lru_cache(maxsize=8)
def _shipped_model(device: str) -> BlockDiffusionLM:
    from gpu.weights import load_model

    model, _ = load_model(ASSETS, device)
    return model


TINY_MODEL = ModelConfig(
    vocab_size=VOCAB_SIZE, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_context=64
)
TINY_SEED = 1234


@functools.lru_cache(maxsize=8)
def tiny_model(device: str = "cpu", seed: int = TINY_SEED) -> BlockDiffusionLM:
    """A tiny randomly initialised model, identical on every build (its own seeded generator).

    Weights are drawn from N(0, 0.3^2) (instead of the training init's 0.02) and the LM head is
    scaled by 6, so the model is context-sensitive and its confidences spread: LowConfidence
    blocks of 4 take 2 to 5 steps, JointThreshold makes post-completion edits. The EOS row of
    the head is scaled by a further 1.5 so EOS finishing happens (about one request in five).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BlockDiffusionLM(TINY_MODEL)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                torch.nn.init.normal_(param, std=0.3, generator=gen)
        model.lm_head.weight.mul_(6.0)
        model.lm_head.weight[EOS_ID].mul_(1.5)
    model.to(torch.device(device))
    model.eval()
    return model


def _algorithm(name: str, **params: float) -> StepAlgorithm:
    from gpu.algorithms import make_algorithm

    algo: StepAlgorithm = make_algorithm(name, params)
    return algo


def make_engine(config: DllmConfig, sink: EventSink) -> DllmEngine:
    """The shipped model with LowConfidence, on CUDA when available, else CPU. A serving
    configuration: no per-forward record (no logits digest, no host copy of the logits)."""
    device = resolve_device("auto")
    return DllmEngine(
        config,
        sink,
        model=_shipped_model(str(device)),
        algorithm=_algorithm("LowConfidence"),
        device=device,
        record=False,
    )


def make_small_engine(config: DllmConfig, sink: EventSink) -> DllmEngine:
    """The conformance-suite engine (registry name "engine", batch parity: the default).

    The shipped model on CPU with LowConfidence. It is fast enough for the suite: a round of 4
    rows of block 4 costs about 3.7 ms of CPU time (measured on the 2-core development machine,
    docs/engine.md), under the 5 ms bound that would have sent the suite to `tiny_model`.
    The suite's ids (mask -1, prompts over 0..15, EOS 15) are mapped onto the model's
    vocabulary by `gpu.token_map.TokenMap` ('0'..'9', 'a'..'f'; EOS 15 is the model's EOS).

    Batch parity holds: on CPU a row's logits are bit-identical at any batch size (ragged
    attention, small GEMMs padded as `gpu.gemm_rows` calibrates them), so every output equals the
    request's solo sync output, in every mode and at every batch size.

    A checking engine: `record` is on (the differential property reads `forward_log`).
    """
    return _checking_engine(config, sink, _algorithm("LowConfidence"))


def _checking_engine(
    config: DllmConfig,
    sink: EventSink,
    algorithm: StepAlgorithm,
    *,
    rows_released_between_rounds: bool = False,
    priority_order: bool = False,
    longest_output_first: bool = False,
) -> DllmEngine:
    """The shipped model on CPU with `record` on (what the conformance factories share), with
    the engine's policy options as given."""
    return DllmEngine(
        config,
        sink,
        model=_shipped_model("cpu"),
        algorithm=algorithm,
        record=True,
        rows_released_between_rounds=rows_released_between_rounds,
        priority_order=priority_order,
        longest_output_first=longest_output_first,
    )


#: The engine's profile: the idealised spec, and it takes requests that ignore EOS.
ENGINE_PROFILE = DllmProfile(ignore_eos=True, stop_token_ids=True)


def _engine_profile(policy: DllmPolicy) -> DllmProfile:
    """The engine's profile with a policy option declared (everything else as
    `ENGINE_PROFILE`)."""
    return replace(ENGINE_PROFILE, policy=policy)


#: The conformance-suite engine as the registry's "engine" declares it.
SMALL_ENGINE = DllmImplementation(
    make_small_engine, ENGINE_PROFILE, "the torch engine on CPU (shipped model, LowConfidence)"
)


#: SGLang's FDFO without in-place reuse before #27877: a carried block gives back its
#: request-pool row with its KV, and takes one again in the next round.
ROWS_RELEASED_POLICY = DllmPolicy(rows_released_between_rounds=True)


def make_small_rows_released_engine(config: DllmConfig, sink: EventSink) -> DllmEngine:
    """As `make_small_engine`, and FDFO without in-place reuse gives a carried block's
    request-pool row back with its KV at the end of every round, taking one again (the lowest
    free, its committed blocks' table entries rewritten) in the next: SGLang's FDFO before
    #27877 freed and re-allocated both. `record` on."""
    return _checking_engine(
        config, sink, _algorithm("LowConfidence"), rows_released_between_rounds=True
    )


#: The rows-released engine as the registry's "engine-rows-released" declares it.
SMALL_ENGINE_ROWS_RELEASED = DllmImplementation(
    make_small_rows_released_engine,
    _engine_profile(ROWS_RELEASED_POLICY),
    "the torch engine with rows released between rounds (FDFO without in-place reuse)",
)


#: SGLang's orders of the waiting queue: `--enable-priority-scheduling` (lower value first)
#: and `--schedule-policy lof` (the longer `max_new_tokens` first).
PRIORITY_POLICY = DllmPolicy(priority_order=True)
LONGEST_OUTPUT_FIRST_POLICY = DllmPolicy(longest_output_first=True)


def make_small_priority_engine(config: DllmConfig, sink: EventSink) -> DllmEngine:
    """As `make_small_engine`, the waiting queue by priority, lower value first (submission
    order breaking ties). `record` on."""
    return _checking_engine(config, sink, _algorithm("LowConfidence"), priority_order=True)


def make_small_lof_engine(config: DllmConfig, sink: EventSink) -> DllmEngine:
    """As `make_small_engine`, the waiting queue by `max_new_tokens`, longest first
    (submission order breaking ties), as SGLang's `--schedule-policy lof`. `record` on."""
    return _checking_engine(config, sink, _algorithm("LowConfidence"), longest_output_first=True)


#: The priority-ordered engine as the registry's "engine-priority" declares it.
SMALL_ENGINE_PRIORITY = DllmImplementation(
    make_small_priority_engine,
    _engine_profile(PRIORITY_POLICY),
    "the torch engine with the waiting queue by priority (lower value first)",
)

#: The longest-output-first engine as the registry's "engine-lof" declares it.
SMALL_ENGINE_LOF = DllmImplementation(
    make_small_lof_engine,
    _engine_profile(LONGEST_OUTPUT_FIRST_POLICY),
    "the torch engine with the waiting queue by max_new_tokens, longest first (SGLang's lof)",
)


#: The engine with its prefix cache (`gpu.prefix_cache`): whole pages of one block each,
#: always with the cache (the suites then draw prompts that share stems).
CACHED_ENGINE_PROFILE = replace(
    ENGINE_PROFILE,
    space=DllmConfigSpace(page_multiples=frozenset({1}), prefix_cache=frozenset({True})),
)

#: The caching engine as the registry's "engine-cached" declares it: `make_small_engine`,
#: whose configurations carry `prefix_cache` (the parity check's solo runs have none).
SMALL_ENGINE_CACHED = DllmImplementation(
    make_small_engine,
    CACHED_ENGINE_PROFILE,
    "the torch engine with a prefix cache (committed blocks kept, read, evicted: SGLang's "
    "radix cache for dLLMs)",
)


def make_small_joint_engine(config: DllmConfig, sink: EventSink) -> DllmEngine:
    """As `make_small_engine` with JointThreshold (max_post_edit_steps=4, like the reference's
    JointThreshold built-in): stateful, so it exercises the carried algo_state. `record` on."""
    return _checking_engine(config, sink, _algorithm("JointThreshold", max_post_edit_steps=4))


def make_tiny_engine(config: DllmConfig, sink: EventSink) -> DllmEngine:
    """`tiny_model` (random, seeded, about 2.5x faster than the shipped model) with
    LowConfidence: for long property runs where speed matters more than a trained model.
    `record` on, like the other checking factories."""
    return DllmEngine(
        config,
        sink,
        model=tiny_model("cpu"),
        algorithm=_algorithm("LowConfidence"),
        record=True,
    )


def make_tiny_joint_engine(config: DllmConfig, sink: EventSink) -> DllmEngine:
    """`tiny_model` with JointThreshold (max_post_edit_steps=4); its spread confidences make
    post-completion edits frequent, so a lost algorithm state changes outputs. `record` on."""
    return DllmEngine(
        config,
        sink,
        model=tiny_model("cpu"),
        algorithm=_algorithm("JointThreshold", max_post_edit_steps=4),
        record=True,
    )
