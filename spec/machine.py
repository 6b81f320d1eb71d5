"""`SpecMachine`: replays events against the specification.

Each event must be enabled in the current abstract state; otherwise `apply` raises a
`SpecViolation` naming the rule, the event and the state (rendered before the event). Enabled
events have their effect applied. `check_snapshot` compares an implementation's own view of its
pools with the abstract state; `check_invariants` evaluates the named state invariants.

The machine is deliberately direct: each guard is a few lines that read like the rule in
`spec.rules`. It is the oracle, so clarity wins over speed. The one place that trades some for
speed is the incremental check: `_changed_hold` tests every invariant on what an event changed
in one pass and, when anything looks wrong, defers to `_changed_failure`, the ordered check that
decides and names the rule (tests/test_trace_fastpaths.py holds the two to each other).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from spec.config import DllmConfig, Mode, RequestSpec, request_shape, validate_request
from spec.errors import RequestError
from spec.events import (
    Aborted,
    Admitted,
    BlockCommitted,
    CacheEvicted,
    CacheHit,
    CacheReleased,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    KvAllocated,
    KvCached,
    KvFreed,
    RowAcquired,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.lifecycles import (
    BLOCK_LIFECYCLE,
    REQUEST_LIFECYCLE,
    STEP_DONE,
    STEP_NOT_DONE_COMPLETE,
    STEP_NOT_DONE_MASKED,
    BlockPhase,
    Lifecycle,
    RequestPhase,
)
from spec.machine_base import MachineBase
from spec.prefix_cache import ROOT, BlockKey, CacheEntry, CacheRefused, PrefixCache, chain
from spec.profile import DllmAdmission, DllmPolicy
from spec.rules import Rule
from spec.snapshot import (
    SNAPSHOT_FIELDS,
    FinishedOutput,
    Snapshot,
    wrong_container,
    wrong_outputs,
)
from spec.state import (
    ACTIVE_PHASES,
    CARRIED_BLOCK_PHASES,
    TERMINAL_PHASES,
    UNFINISHED_BLOCK_PHASES,
    AbstractState,
    BlockState,
    RequestState,
    RoundState,
    SlotOwner,
    render,
)


@dataclass(slots=True)
class _Block:
    index: int
    phase: BlockPhase
    slots: tuple[int, ...] | None
    alloc_round: int | None
    masks: int | None = None


# Shared, never written: most requests read nothing from a cache, and a retired one holds
# nothing, so neither keeps a dict or a list of its own (`_reads_of`, `_digests_of` copy them
# on the first write).
_NO_READS: dict[int, CacheEntry] = {}
_NO_DIGESTS: list[bytes] = []


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    phase: RequestPhase = RequestPhase.QUEUED
    row: int | None = None
    committed_blocks: int = 0
    tokens: list[int] = field(default_factory=list)
    current: _Block | None = None
    reason: FinishReason | None = None  # set by its Finished event
    stop_sampled: bool = False  # it may finish with STOP (`Submitted.stop_sampled`)
    last_commit_round: int | None = None  # the round of its latest BlockCommitted
    ignore_eos: bool = False  # no token ends it (`Submitted.ignore_eos`)
    stop_token_ids: tuple[int, ...] = ()  # they end it with STOP (`Submitted.stop_token_ids`)
    priority: int = 0  # its queue order under `DllmPolicy.priority_order` (`Submitted.priority`)
    # block -> the cached block it reads; `_NO_READS` until its first read (copy on write)
    reads: dict[int, CacheEntry] = field(default_factory=lambda: _NO_READS)
    hit_round: int | None = None  # the round of its latest hit on its next block
    # with a prefix cache: the chained digest of each committed block (`spec.prefix_cache`)
    digests: list[bytes] = field(default_factory=lambda: _NO_DIGESTS)


@dataclass(slots=True)
class _Round:
    index: int = 0
    forwards: int = 0
    batch: tuple[SlotOwner, ...] = ()
    pending: dict[SlotOwner, int] = field(default_factory=dict)  # row -> input mask count
    newly_done_in_last_forward: bool = False
    committed: int = 0
    admitted: int = 0


_FINISHED, _ABORTED = RequestPhase.FINISHED, RequestPhase.ABORTED
_ADMITTED, _RUNNING = RequestPhase.ADMITTED, RequestPhase.RUNNING


def _set_difference(implementation: frozenset[int], spec: frozenset[int], verb: str) -> str:
    """'also frees [3], lacks [1]' of two sets of slots, naming only the non-empty sides."""
    extra, missing = sorted(implementation - spec), sorted(spec - implementation)
    parts = ([f"also {verb} {extra}"] if extra else []) + ([f"lacks {missing}"] if missing else [])
    return ", ".join(parts)


def _reads_of(r: _Request) -> dict[int, CacheEntry]:
    """`r.reads`, made its own before the first write."""
    if r.reads is _NO_READS:
        r.reads = {}
    return r.reads


def _digests_of(r: _Request) -> list[bytes]:
    """`r.digests`, made its own before the first write."""
    if r.digests is _NO_DIGESTS:
        r.digests = []
    return r.digests


PhaseT = TypeVar("PhaseT", RequestPhase, BlockPhase)


def _next_phases(phase_type: type[PhaseT], lifecycle: Lifecycle) -> dict[str, dict[PhaseT, PhaseT]]:
    """trigger -> {source phase: target phase}: the lifecycle's table, looked up per event
    without string conversions (the first matching transition, as `Lifecycle.target`)."""
    sources = {p.value for p in phase_type}
    table: dict[str, dict[PhaseT, PhaseT]] = {}
    for t in lifecycle.transitions:
        if t.source in sources:
            table.setdefault(t.trigger, {}).setdefault(phase_type(t.source), phase_type(t.target))
    return table


_REQUEST_NEXT = _next_phases(RequestPhase, REQUEST_LIFECYCLE)
_BLOCK_NEXT = _next_phases(BlockPhase, BLOCK_LIFECYCLE)
_NO_TRANSITION: dict[Any, Any] = {}
# looked up at import, so a renamed trigger fails here and not in the middle of a replay
_ON_KV_ALLOCATED = _REQUEST_NEXT["kv_allocated"]
_ON_BLOCK_COMMITTED = _REQUEST_NEXT["block_committed"]
_ON_FINISHED = _REQUEST_NEXT["finished"]


def initial_masks(config: DllmConfig, prompt_len: int, block_index: int) -> int:
    """Mask tokens in block `block_index` before any step: its positions past the prompt."""
    b = config.block_size
    start = block_index * b
    return max(0, min(b, start + b - prompt_len))


class _Stops(Protocol):
    """What decides where a request ends (a `RequestSpec`, `RequestState` or the machine's own
    record)."""

    @property
    def max_new_tokens(self) -> int: ...

    @property
    def ignore_eos(self) -> bool: ...

    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...


def _end(
    config: DllmConfig, request: _Stops, generated: Sequence[int]
) -> tuple[FinishReason | None, int]:
    """Why `generated` ends `request` (None: not yet), and the length of its output: the first
    EOS or stop token id within max_new_tokens (neither with `ignore_eos`) ends it with EOS or
    STOP, the output cut after it; else LENGTH once it reaches max_new_tokens."""
    head = generated[: request.max_new_tokens]
    if not request.ignore_eos:
        eos, stops = config.eos_token_id, request.stop_token_ids
        if stops:
            for i, tok in enumerate(head):
                if tok == eos or tok in stops:
                    return (FinishReason.EOS if tok == eos else FinishReason.STOP), i + 1
        elif eos is not None and eos in head:  # the common case, without a Python loop
            return FinishReason.EOS, head.index(eos) + 1
    done = len(generated) >= request.max_new_tokens
    return (FinishReason.LENGTH if done else None), len(head)


def finish_condition(config: DllmConfig, request: RequestState) -> FinishReason | None:
    """Why the request must finish now, or None: EOS or STOP at the first EOS or stop token id
    within max_new_tokens (neither with `ignore_eos`), else LENGTH at max_new_tokens."""
    return _end(config, request, request.generated)[0]


def finish_of(
    config: DllmConfig, request: RequestSpec, generated: Sequence[int]
) -> tuple[FinishReason, tuple[int, ...]] | None:
    """(reason, output) once `generated` (the request's committed tokens past its prompt) ends
    `request`, else None: what an implementation reports when it finishes the request right
    after a commit (a sampled STOP, which the spec cannot see, aside). The first EOS or stop
    token id within max_new_tokens (none with `ignore_eos`) ends it with EOS or STOP and cuts
    the output after it; else LENGTH at max_new_tokens."""
    reason, length = _end(config, request, generated)
    return None if reason is None else (reason, tuple(generated[:length]))


def output_of(
    config: DllmConfig, request: RequestSpec, generated: Sequence[int]
) -> tuple[int, ...]:
    """The output so far of `request` with these generated tokens (what an implementation
    streams): cut at max_new_tokens and after the first EOS or stop token id (none with
    `ignore_eos`)."""
    return tuple(generated[: _end(config, request, generated)[1]])


def request_output(config: DllmConfig, request: RequestState) -> tuple[int, ...]:
    """The request's output: generated tokens, cut at max_new_tokens and after the first EOS or
    stop token id (neither with `ignore_eos`). (After a sampled STOP the engine may cut it
    earlier: `stop_output_lengths`.)"""
    return request.generated[: _end(config, request, request.generated)[1]]


def finished_output(
    config: DllmConfig, request: RequestState, reason: FinishReason
) -> tuple[int, ...]:
    """The output of a request that finished with `reason`: `request_output`, or after a STOP
    of a request with `stop_sampled` the longest output `stop_output_lengths` allows (its
    generated tokens up to max_new_tokens: where inside the block the stop lies, only the
    engine knows, and SGLang matches a stop string before it looks at tokens)."""
    if reason is FinishReason.STOP and request.stop_sampled:
        return request.generated[: request.max_new_tokens]
    return request_output(config, request)


def stop_output_lengths(config: DllmConfig, request: RequestState) -> range:
    """The output lengths a request with `stop_sampled` that finished with STOP may report: its
    engine found the stop inside the block it committed last, so the output is its generated
    tokens (at most max_new_tokens) cut after one of that block's generated positions."""
    before_last = max(0, (request.committed_blocks - 1) * config.block_size - len(request.prompt))
    return range(before_last + 1, min(len(request.generated), request.max_new_tokens) + 1)


class SpecMachine(MachineBase[Event, Rule]):
    """The executable specification of a dLLM scheduler, driven by events.

    `policy` carries the implementation's declared choices (`spec.profile.DllmPolicy`); the
    default is the idealised spec.
    """

    def __init__(
        self, config: DllmConfig, policy: DllmPolicy | None = None, *, retain_finished: bool = True
    ) -> None:
        """retain_finished=False (trace checking): a finished or aborted request keeps only its
        id and phase, so a long log checks in memory that does not grow with tokens; its output
        is then no longer available (`outputs`, `check_outputs`)."""
        super().__init__()
        self.config = config
        self.policy: DllmPolicy = policy if policy is not None else DllmPolicy()
        self.retain_finished = retain_finished
        # waiting queue as an ordered set (O(1) head, removal and membership)
        self._queue: dict[str, None] = {}
        self._requests: dict[str, _Request] = {}
        self._owner: dict[int, SlotOwner] = {}
        self._rows: dict[int, str] = {}
        self._cache = PrefixCache()  # empty unless config.prefix_cache
        # Indexes kept in step with the tables above, so every guard and the incremental
        # invariant check cost what an event touches, not the size of the whole state.
        self._running: dict[str, _Request] = {}  # active (admitted or running), admission order
        self._blocks: dict[str, dict[int, set[int]]] = {}  # request -> block -> owned slots
        self._claimed_pages = 0  # worst-case pages of the active requests
        self._dirty: dict[str, None] = {}  # requests touched since the last check
        self._dirty_rows: set[int] = set()
        self._dirty_blocks: set[SlotOwner] = set()  # (request, block) whose slots changed
        self._round = _Round()
        self._unreported: dict[str, None] = {}  # finished, output not yet reported (in order)

    # ------------------------------------------------------------------ views
    def state(self) -> AbstractState:
        """The current abstract state as frozen values."""
        reqs = {rid: self._request_state(r) for rid, r in self._requests.items()}
        rnd = self._round
        return AbstractState(
            config=self.config,
            queue=tuple(self._queue),
            requests=reqs,
            slot_owners=dict(self._owner),
            rows=dict(self._rows),
            cache=self._cache.blocks(),
            round=RoundState(
                index=rnd.index,
                forwards=rnd.forwards,
                batch=rnd.batch,
                pending_steps=tuple(rnd.pending),
                committed=rnd.committed,
                pending_masks=dict(rnd.pending),
                newly_done_in_last_forward=rnd.newly_done_in_last_forward,
                admitted=rnd.admitted,
            ),
        )

    @staticmethod
    def _request_state(r: _Request) -> RequestState:
        cur = r.current
        return RequestState(
            request_id=r.request_id,
            prompt=r.prompt,
            max_new_tokens=r.max_new_tokens,
            phase=r.phase,
            row=r.row,
            committed_blocks=r.committed_blocks,
            tokens=tuple(r.tokens),
            current=None
            if cur is None
            else BlockState(cur.index, cur.phase, cur.slots, cur.alloc_round, cur.masks),
            stop_sampled=r.stop_sampled,
            last_commit_round=r.last_commit_round,
            ignore_eos=r.ignore_eos,
            stop_token_ids=r.stop_token_ids,
            priority=r.priority,
            cache_reads={k: entry.slots for k, entry in r.reads.items()},
            hit_round=r.hit_round,
        )

    def render(self) -> str:
        """The current state in words (shown in every violation)."""
        return render(self.state())

    @property
    def round_index(self) -> int:
        """The round in progress (0 before the first `ControlReturned`)."""
        return self._round.index

    def is_idle(self) -> bool:
        """No queued and no running request."""
        return not self._queue and not self._running

    def unfinished_ids(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The ids of the requests still queued and of those active (admitted or running),
        each in its order: what a log that ends here leaves unfinished."""
        return tuple(self._queue), tuple(self._running)

    def outputs(self) -> dict[str, tuple[int, ...]]:
        """Output of every finished request (`finished_output`)."""
        st = self.state()
        out: dict[str, tuple[int, ...]] = {}
        for rid, r in st.requests.items():
            reason = self._requests[rid].reason
            if r.phase is RequestPhase.FINISHED and reason is not None:
                out[rid] = finished_output(self.config, r, reason)
        return out

    def request_phase(self, request_id: str) -> RequestPhase | None:
        """The request's phase, also after it ended; None for an id never submitted."""
        r = self._requests.get(request_id)
        return None if r is None else r.phase

    # ------------------------------------------------------------------ errors
    def _active(self, request_id: str, event: Event) -> _Request:
        r = self._requests.get(request_id)
        if r is None:
            raise self._fail(
                Rule.KNOWN_REQUEST, f"request {request_id!r} was never submitted", event
            )
        phase = r.phase
        if phase is not _ADMITTED and phase is not _RUNNING:  # not in ACTIVE_PHASES
            raise self._fail(
                Rule.KNOWN_REQUEST,
                f"request {request_id!r} is {r.phase.value}, not in the running set",
                event,
            )
        return r

    # --- between rounds -------------------------------------------------------
    def _submitted(self, e: Submitted) -> None:
        if e.request_id in self._requests:
            raise self._fail(Rule.UNIQUE_SUBMISSION, f"{e.request_id!r} submitted twice", e)
        try:
            validate_request(
                self.config,
                RequestSpec(
                    e.request_id,
                    tuple(e.prompt),
                    e.max_new_tokens,
                    stop_token_ids=tuple(e.stop_token_ids),
                    priority=e.priority,
                ),
            )
        except RequestError as err:
            raise self._fail(Rule.VALID_REQUEST, f"accepted an invalid request: {err}", e) from None
        self._requests[e.request_id] = _Request(
            e.request_id,
            tuple(e.prompt),
            e.max_new_tokens,
            stop_sampled=e.stop_sampled,
            ignore_eos=e.ignore_eos,
            stop_token_ids=tuple(e.stop_token_ids),
            priority=e.priority,
        )
        self._enqueue(e.request_id)
        self._dirty[e.request_id] = None

    def _queue_key(self, request_id: str) -> tuple[int, int]:
        r = self._requests[request_id]
        return self.policy.queue_key(r.priority, r.max_new_tokens)

    def _enqueue(self, request_id: str) -> None:
        """Queue a submitted request at the tail; under an ordered queue
        (`DllmPolicy.queue_key`) behind every queued request whose key is not greater than its
        own instead (submission order breaks ties)."""
        tail = next(reversed(self._queue), None)
        key = self._queue_key(request_id)
        if not self.policy.orders_queue or tail is None or self._queue_key(tail) <= key:
            self._queue[request_id] = None
            return
        ordered = list(self._queue)
        at = next(i for i, rid in enumerate(ordered) if self._queue_key(rid) > key)
        ordered.insert(at, request_id)
        self._queue = dict.fromkeys(ordered)

    def _aborted(self, e: Aborted) -> None:
        r = self._requests.get(e.request_id)
        if r is None or r.phase not in (RequestPhase.QUEUED, *ACTIVE_PHASES):
            phase = "never submitted" if r is None else r.phase.value
            raise self._fail(Rule.KNOWN_REQUEST, f"abort of {e.request_id!r}, which is {phase}", e)
        if any(k[0] == e.request_id for k in self._round.pending):
            raise self._fail(Rule.STEP_PER_ROW, "aborted while a step result is pending", e)
        if self._round.forwards and not (
            self.policy.aborts_after_commit and self._committed_generated_this_round(r)
        ):
            also = (
                "; under aborts_after_commit also right after the request committed a block "
                "holding a generated token in the round"
                if self.policy.aborts_after_commit
                else ""
            )
            raise self._fail(
                Rule.SCHEDULER_PHASE,
                "aborted in the middle of a round (after its first forward); aborts happen "
                f"between rounds{also}",
                e,
            )
        self._require_owns_nothing(r, e)
        self._queue.pop(r.request_id, None)
        self._set_phase(r, RequestPhase.ABORTED)
        r.current = None

    # --- indexes ------------------------------------------------------------------
    def _set_phase(self, r: _Request, phase: RequestPhase) -> None:
        """Change a request's phase, keeping the active index and claimed pages in step."""
        # `in ACTIVE_PHASES`, by identity (an enum's hash is a Python call)
        was = r.phase is _ADMITTED or r.phase is _RUNNING
        now = phase is _ADMITTED or phase is _RUNNING
        r.phase = phase
        self._dirty[r.request_id] = None
        if now and not was:
            self._running[r.request_id] = r
            self._claimed_pages += self._pages(r)
        elif was and not now:
            del self._running[r.request_id]
            self._claimed_pages -= self._pages(r)
        if not self.retain_finished and (phase is _FINISHED or phase is _ABORTED):
            r.prompt, r.tokens = (), []  # retired: only the id and the phase are needed
            r.reads, r.digests = _NO_READS, _NO_DIGESTS

    def reindex(self) -> None:
        """Rebuild the derived indexes (active requests, per-request blocks, claimed pages)
        from the primary tables and mark everything changed. Only needed after editing the
        machine's internals directly, as the Z3 drift guard's perturbations do."""
        self._running = {rid: r for rid, r in self._requests.items() if r.phase in ACTIVE_PHASES}
        self._claimed_pages = sum(self._pages(r) for r in self._running.values())
        self._blocks = {}
        for slot, (rid, block) in self._owner.items():
            self._blocks.setdefault(rid, {}).setdefault(block, set()).add(slot)
        self._dirty = dict.fromkeys(self._requests)
        self._dirty_rows = set(self._rows)
        self._dirty_blocks = {owner for owner in self._owner.values()}
        if self.policy.orders_queue:  # the queue's order derives from the requests' keys
            position = {rid: i for i, rid in enumerate(self._requests)}
            self._queue = dict.fromkeys(
                sorted(self._queue, key=lambda rid: (self._queue_key(rid), position[rid]))
            )

    def _pages(self, r: _Request) -> int:
        return request_shape(self.config, len(r.prompt), r.max_new_tokens).pages

    def _own(self, slot: int, owner: SlotOwner) -> None:
        self._owner[slot] = owner
        self._blocks.setdefault(owner[0], {}).setdefault(owner[1], set()).add(slot)
        self._dirty_blocks.add(owner)

    def _disown(self, slot: int) -> None:
        rid, block = self._owner.pop(slot)
        self._dirty_blocks.add((rid, block))
        blocks = self._blocks[rid]
        blocks[block].discard(slot)
        if not blocks[block]:
            del blocks[block]
        if not blocks:
            del self._blocks[rid]

    def _queue_keys(self, request_ids: list[str]) -> str:
        """What orders these queued requests, for a violation: `r1: priority 0, r0: priority 1`,
        `r1: max_new_tokens 9`, or both (`r1: priority 0 max_new_tokens 9`)."""

        def key(rid: str) -> str:
            r = self._requests[rid]
            parts = [
                *([f"priority {r.priority}"] if self.policy.priority_order else []),
                *(
                    [f"max_new_tokens {r.max_new_tokens}"]
                    if self.policy.longest_output_first
                    else []
                ),
            ]
            return f"{rid}: {' '.join(parts)}"

        return ", ".join(key(rid) for rid in request_ids)

    def _queue_head(self) -> str | None:
        return next(iter(self._queue), None)

    def _require_owns_nothing(self, r: _Request, e: Event) -> None:
        by_block = self._blocks.get(r.request_id, {})
        owned = sorted(s for slots in by_block.values() for s in slots)
        if owned:
            blocks = sorted(by_block)
            raise self._fail(
                Rule.TERMINAL_OWNS_NOTHING,
                f"request {r.request_id!r} ends still owning {len(owned)} KV slots "
                f"(blocks {blocks}, slots {owned}) at its {type(e).__name__}: free them "
                f"(KvFreed) before the {type(e).__name__} event; a KvFreed after the request "
                "has ended is too late",
                e,
            )
        if r.row is not None:
            raise self._fail(
                Rule.TERMINAL_OWNS_NOTHING,
                f"request {r.request_id!r} ends still holding request-pool row {r.row}",
                e,
            )
        if r.reads:
            raise self._fail(
                Rule.TERMINAL_OWNS_NOTHING,
                f"request {r.request_id!r} ends still reading cached blocks {sorted(r.reads)} "
                f"(release them first: CacheReleased)",
                e,
            )

    # --- scheduler phase ------------------------------------------------------
    def _admitted(self, e: Admitted) -> None:
        r = self._requests.get(e.request_id)
        if r is None or r.phase is not RequestPhase.QUEUED:
            phase = "never submitted" if r is None else r.phase.value
            raise self._fail(Rule.LIFECYCLE, f"admission of {e.request_id!r}, which is {phase}", e)
        if self._round.forwards:
            raise self._fail(Rule.SCHEDULER_PHASE, "admission after the round's first forward", e)
        head = self._queue_head()
        if (
            head != e.request_id
            and not self.policy.free_queue_order
            and not self._passes_only_decode_requests(r)
        ):
            ahead = list(self._queue)[:8]
            why = (
                "; under PREFILL_FIRST only a request whose first block is prompt-only may pass, "
                "and only requests whose first block is not"
                if self.policy.admission is DllmAdmission.PREFILL_FIRST
                else ""
            )
            if self.policy.orders_queue:
                why += f"; {self.policy.describe_queue_order()} ({self._queue_keys(ahead)})"
            raise self._fail(
                Rule.FCFS_ADMISSION,
                f"admitted {e.request_id!r} while {head!r} is ahead of it (queue {ahead}"
                f"{' ...' if len(self._queue) > 8 else ''}){why}",
                e,
            )
        running = len(self._running)
        if running >= self.config.max_running_requests:
            raise self._fail(
                Rule.MAX_RUNNING,
                f"admission would make {running + 1} running requests; "
                f"max_running_requests={self.config.max_running_requests}",
                e,
            )
        self._take_row(r, e.row, e)
        del self._queue[e.request_id]
        self._set_phase(r, RequestPhase.ADMITTED)
        self._round.admitted += 1

    def _passes_only_decode_requests(self, r: _Request) -> bool:
        """Under PREFILL_FIRST the prefill batch is formed before the decode batch, so a queued
        request whose first block is prompt-only may be admitted ahead of queued requests whose
        first block is not (prompt shorter than a block); within each kind the order is FCFS."""
        if self.policy.admission is not DllmAdmission.PREFILL_FIRST:
            return False
        if not self._is_prefill_block(r, 0):
            return False
        for request_id in self._queue:
            if request_id == r.request_id:
                return True
            if self._is_prefill_block(self._requests[request_id], 0):
                return False
        return False

    def _row_acquired(self, e: RowAcquired) -> None:
        r = self._active(e.request_id, e)
        if self._round.forwards:
            raise self._fail(
                Rule.SCHEDULER_PHASE, "a row acquired after the round's first forward", e
            )
        if r.row is not None:
            raise self._fail(
                Rule.ROW_EXCLUSIVE,
                f"{r.request_id!r} acquired row {e.row} while holding row {r.row}",
                e,
            )
        self._take_row(r, e.row, e)

    def _take_row(self, r: _Request, row: int, e: Event) -> None:
        if not 0 <= row < self.config.req_pool_rows:
            raise self._fail(
                Rule.ROW_EXCLUSIVE,
                f"row {row} outside the request pool [0, {self.config.req_pool_rows})",
                e,
            )
        if row in self._rows:
            raise self._fail(
                Rule.ROW_EXCLUSIVE, f"row {row} is already held by {self._rows[row]!r}", e
            )
        self._rows[row] = r.request_id
        r.row = row
        self._dirty[r.request_id] = None
        self._dirty_rows.add(row)

    def _kv_allocated(self, e: KvAllocated) -> None:
        cfg = self.config
        r = self._active(e.request_id, e)
        if self._round.forwards:
            raise self._fail(
                Rule.SCHEDULER_PHASE, "KV allocated after the round's first forward", e
            )
        if r.row is None:
            raise self._fail(Rule.ROW_EXCLUSIVE, f"{r.request_id!r} allocates KV without a row", e)
        if e.block_index != r.committed_blocks:
            raise self._fail(
                Rule.WHOLE_BLOCK_ALLOC,
                f"allocated block {e.block_index} but the next uncommitted block is "
                f"{r.committed_blocks}",
                e,
            )
        if len(e.slots) != cfg.block_size:
            raise self._fail(
                Rule.WHOLE_BLOCK_ALLOC,
                f"allocated {len(e.slots)} slots for a block of {cfg.block_size}",
                e,
            )
        total = cfg.kv_slots
        bad = [s for s in e.slots if not 0 <= s < total]
        if bad:
            raise self._fail(
                Rule.KV_EXCLUSIVE, f"slots {bad} outside the pool [0, {cfg.kv_slots})", e
            )
        taken: dict[int, object] = {s: self._owner[s] for s in e.slots if s in self._owner}
        if self._cache:  # cached slots are taken too (an empty cache: nothing to look up)
            taken.update({s: "prefix cache" for s in e.slots if self._cache.holds(s)})
        if taken or len(set(e.slots)) != len(e.slots):
            raise self._fail(
                Rule.KV_EXCLUSIVE, f"slots already owned (slot: owner) {taken or 'duplicated'}", e
            )
        self._check_page_alignment(r, e)
        cur = r.current
        if cur is not None:
            # Re-allocation of a carried block: only legal without in-place reuse.
            if cur.slots is not None:
                raise self._fail(
                    Rule.WHOLE_BLOCK_ALLOC, f"block {cur.index} already holds its slots", e
                )
            if cfg.in_place_reuse:
                raise self._fail(
                    Rule.REUSE_KEEPS_SLOTS,
                    f"block {cur.index} of {r.request_id!r} was re-allocated instead of reused "
                    f"in place",
                    e,
                )
            cur.slots = tuple(e.slots)
            cur.alloc_round = self._round.index
        else:
            target = _ON_KV_ALLOCATED.get(r.phase)
            if target is None:  # pragma: no cover - ADMITTED always allows it
                raise self._fail(Rule.LIFECYCLE, f"{r.phase.value} cannot allocate", e)
            r.current = _Block(e.block_index, BlockPhase.MASKED, tuple(e.slots), self._round.index)
            self._set_phase(r, target)
        for s in e.slots:
            self._own(s, (r.request_id, e.block_index))
        self._dirty[r.request_id] = None

    def _check_page_alignment(self, r: _Request, e: KvAllocated) -> None:
        cfg = self.config
        p = cfg.page_size
        slots = e.slots
        if slots != tuple(range(slots[0], slots[0] + len(slots))):
            raise self._fail(Rule.PAGE_ALIGNMENT, f"slots {list(slots)} are not contiguous", e)
        offset = (e.block_index * cfg.block_size) % p
        if slots[0] % p != offset:
            raise self._fail(
                Rule.PAGE_ALIGNMENT,
                f"block {e.block_index} starts at page offset {offset} but slot {slots[0]} is at "
                f"offset {slots[0] % p} (page_size={p})",
                e,
            )
        if offset == 0:
            page = slots[0] // p
            users = sorted(
                {str(self._owner[s]) for s in range(page * p, page * p + p) if s in self._owner}
            )
            if self._cache and any(self._cache.holds(s) for s in range(page * p, page * p + p)):
                users.append("prefix cache")
            if users:
                raise self._fail(
                    Rule.PAGE_ALIGNMENT,
                    f"block {e.block_index} starts page {page}, which is not wholly free "
                    f"(owners {', '.join(users)})",
                    e,
                )
        else:
            page = slots[0] // p
            others = sorted(
                {
                    owner[0]
                    for s in range(page * p, page * p + p)
                    if (owner := self._owner.get(s)) is not None and owner[0] != r.request_id
                }
            )
            if others:  # with the cache, a page can be continued after another left part of it
                raise self._fail(
                    Rule.PAGE_ALIGNMENT,
                    f"block {e.block_index} continues page {page}, where {', '.join(others)} "
                    f"still own{'s' if len(others) == 1 else ''} slots: a page holds the blocks "
                    "of one request",
                    e,
                )
            prev = self._owner.get(slots[0] - 1)
            read = r.reads.get(e.block_index - 1)
            if read is not None and slots[0] - 1 in read.slots:
                return  # it continues the page of the cached block it reads as its previous
            if prev != (r.request_id, e.block_index - 1):
                raise self._fail(
                    Rule.PAGE_ALIGNMENT,
                    f"block {e.block_index} continues a page, so slot {slots[0] - 1} must hold "
                    f"block {e.block_index - 1} of {r.request_id!r}; it is owned by {prev}",
                    e,
                )

    # --- worker phase -----------------------------------------------------------
    def _forward(self, e: Forward) -> None:
        cfg = self.config
        rnd = self._round
        if rnd.pending:
            raise self._fail(
                Rule.STEP_PER_ROW, f"forward while rows {list(rnd.pending)} await a step result", e
            )
        if not e.rows:
            raise self._fail(Rule.FORWARD_READY, "a forward with no rows", e)
        if rnd.forwards == 0:
            self._check_work_conserving(e)
        keys = tuple((row.request_id, row.block_index) for row in e.rows)
        if len({k[0] for k in keys}) != len(keys):
            raise self._fail(Rule.FORWARD_READY, "a request appears twice in one forward", e)
        if self.policy.admission is DllmAdmission.PREFILL_FIRST:
            self._check_prefill_first(e)
        if rnd.committed:
            raise self._fail(
                Rule.FORWARD_POLICY, "a forward after a block was committed in this round", e
            )
        if rnd.forwards:
            if set(keys) != set(rnd.batch):
                raise self._fail(
                    Rule.BATCH_STABLE,
                    f"rows {sorted(keys)} differ from this round's batch {sorted(rnd.batch)}",
                    e,
                )
            if cfg.mode is Mode.SYNC:
                currents = [self._requests[k[0]].current for k in keys]
                if all(c is not None and c.phase is BlockPhase.DONE for c in currents):
                    raise self._fail(
                        Rule.FORWARD_POLICY, "sync forward although every row is already done", e
                    )
            elif not cfg.reloop:
                raise self._fail(
                    Rule.FORWARD_POLICY, "a second forward in one FDFO round without re-loop", e
                )
            elif rnd.newly_done_in_last_forward:
                raise self._fail(
                    Rule.FORWARD_POLICY,
                    "FDFO re-loop continued after a block finished (it must yield)",
                    e,
                )
        pending: dict[SlotOwner, int] = {}
        for row in e.rows:
            r = self._active(row.request_id, e)
            cur = r.current
            if r.row is None:
                raise self._fail(Rule.FORWARD_READY, f"{r.request_id!r} has no request-pool row", e)
            if cur is None:  # no KvAllocated since its last commit (or ever)
                raise self._fail(
                    Rule.FORWARD_READY,
                    f"{r.request_id!r} forwards block {row.block_index} but has no KvAllocated "
                    f"for block {row.block_index} before the forward: allocate a block's KV "
                    "slots (KvAllocated) before the Forward that feeds it",
                    e,
                )
            if cur.index != row.block_index:
                raise self._fail(
                    Rule.FORWARD_READY,
                    f"{r.request_id!r} forwards block {row.block_index} but its current block "
                    f"is {cur.index}",
                    e,
                )
            if row.num_tokens != cfg.block_size:
                raise self._fail(
                    Rule.WHOLE_BLOCK_ROWS,
                    f"row of {r.request_id!r} feeds {row.num_tokens} tokens; rows must be whole "
                    f"blocks of {cfg.block_size}",
                    e,
                )
            if cur.slots is None or not self._owns_all(cur.slots, (r.request_id, cur.index)):
                rule = Rule.REUSE_KEEPS_SLOTS if cfg.in_place_reuse else Rule.FORWARD_READY
                raise self._fail(
                    rule,
                    f"block {cur.index} of {r.request_id!r} is forwarded without owning its KV "
                    f"slots",
                    e,
                )
            self._check_prefix(r, e)
            retained = cur.alloc_round is not None and cur.alloc_round < rnd.index
            if row.reused != retained:
                raise self._fail(
                    Rule.REUSE_KEEPS_SLOTS,
                    f"row of {r.request_id!r} says reused={row.reused} but its slots were "
                    f"allocated in round {cur.alloc_round} (now {rnd.index})",
                    e,
                )
            expected = (
                initial_masks(cfg, len(r.prompt), cur.index) if cur.masks is None else cur.masks
            )
            if row.masked != expected:
                raise self._fail(
                    Rule.CARRIER_CONTINUITY,
                    f"block {cur.index} of {r.request_id!r} is fed with {row.masked} masks but "
                    f"it had {expected} (incomplete_ids lost or corrupted)",
                    e,
                )
            pending[(r.request_id, cur.index)] = row.masked
        rnd.forwards += 1
        rnd.batch = keys
        rnd.pending = pending
        rnd.newly_done_in_last_forward = False

    def _owns_all(self, slots: tuple[int, ...], owner: SlotOwner) -> bool:
        get = self._owner.get
        for s in slots:  # noqa: SIM110 - a plain loop: all() over a generator is slower here
            if get(s) != owner:
                return False
        return True

    def _check_prefix(self, r: _Request, e: Event) -> None:
        b = self.config.block_size
        by_block = self._blocks.get(r.request_id, {})
        for k in range(r.committed_blocks):
            held = len(by_block.get(k, ()))
            if held != b and k not in r.reads:
                raise self._fail(
                    Rule.COMMITTED_PREFIX_KEPT,
                    f"committed block {k} of {r.request_id!r} holds {held} of its "
                    f"{b} KV slots while the request is still active",
                    e,
                )

    def _step_result(self, e: StepResult) -> None:
        cfg = self.config
        key = (e.request_id, e.block_index)
        if key not in self._round.pending:
            raise self._fail(
                Rule.STEP_PER_ROW,
                f"step result for {key}, which is not awaiting one "
                f"(pending {list(self._round.pending)})",
                e,
            )
        masked_in = self._round.pending[key]
        if e.accept_length not in (0, cfg.block_size):
            raise self._fail(
                Rule.ACCEPT_LENGTH,
                f"accept_length={e.accept_length}; it must be 0 or block_size={cfg.block_size}",
                e,
            )
        if not 0 <= e.masks_remaining <= masked_in:
            raise self._fail(
                Rule.ACCEPT_LENGTH,
                f"masks_remaining={e.masks_remaining} but the input had {masked_in} masks",
                e,
            )
        done = e.accept_length == cfg.block_size
        if done and masked_in != 0:
            raise self._fail(
                Rule.FINAL_FORWARD_BEFORE_COMMIT,
                f"block {e.block_index} of {e.request_id!r} reported done although its step "
                f"started with {masked_in} masks (the final-KV forward has not run)",
                e,
            )
        r = self._requests[e.request_id]
        cur = r.current
        assert cur is not None  # pending rows always have a current block
        trigger = (
            STEP_DONE
            if done
            else (STEP_NOT_DONE_MASKED if e.masks_remaining else STEP_NOT_DONE_COMPLETE)
        )
        target = _BLOCK_NEXT.get(trigger, _NO_TRANSITION).get(cur.phase)
        if target is None:
            raise self._fail(
                Rule.LIFECYCLE, f"block in phase {cur.phase.value} cannot take {trigger}", e
            )
        if done and cur.phase is not BlockPhase.DONE:
            self._round.newly_done_in_last_forward = True
        cur.phase = target
        cur.masks = e.masks_remaining
        self._dirty[r.request_id] = None
        del self._round.pending[key]

    # --- completion ---------------------------------------------------------------
    def _block_committed(self, e: BlockCommitted) -> None:
        cfg = self.config
        r = self._active(e.request_id, e)
        if self._round.pending:
            raise self._fail(
                Rule.STEP_PER_ROW, f"commit while rows {list(self._round.pending)} await a step", e
            )
        cur = r.current
        if cur is None or cur.index != e.block_index:
            raise self._fail(
                Rule.LIFECYCLE,
                f"commit of block {e.block_index}; current block is "
                f"{None if cur is None else cur.index}",
                e,
            )
        if cur.phase is not BlockPhase.DONE:
            raise self._fail(
                Rule.FINAL_FORWARD_BEFORE_COMMIT,
                f"block {cur.index} of {r.request_id!r} committed in phase {cur.phase.value}; "
                f"only a done block (after its final-KV forward) may be committed",
                e,
            )
        if len(e.tokens) != cfg.block_size or cfg.mask_token_id in e.tokens:
            raise self._fail(
                Rule.PROMPT_PRESERVED,
                f"committed tokens {list(e.tokens)} are not {cfg.block_size} unmasked tokens",
                e,
            )
        start = cur.index * cfg.block_size
        for i, tok in enumerate(e.tokens):
            pos = start + i
            if pos < len(r.prompt) and r.prompt[pos] != tok:
                raise self._fail(
                    Rule.PROMPT_PRESERVED,
                    f"position {pos} holds {tok} but the prompt has {r.prompt[pos]}",
                    e,
                )
        target = _ON_BLOCK_COMMITTED.get(r.phase)
        if target is None:  # pragma: no cover - RUNNING always allows it
            raise self._fail(Rule.LIFECYCLE, f"{r.phase.value} cannot commit", e)
        r.tokens.extend(e.tokens)
        if cfg.prefix_cache:
            _digests_of(r).append(chain(r.digests[-1] if r.digests else ROOT, e.tokens))
        r.committed_blocks += 1
        r.last_commit_round = self._round.index
        r.current = None
        self._set_phase(r, target)
        self._round.committed += 1

    def _kv_freed(self, e: KvFreed) -> None:
        r = self._requests.get(e.request_id)
        if r is None:
            raise self._fail(Rule.KNOWN_REQUEST, f"request {e.request_id!r} was never submitted", e)
        if len(set(e.slots)) != len(e.slots):
            raise self._fail(Rule.FREE_OWNED_ONLY, f"slots {list(e.slots)} freed twice at once", e)
        for s in e.slots:
            owner = self._owner.get(s)
            if owner is None or owner[0] != e.request_id:
                what = self._slot_in_words(s)
                raise self._fail(
                    Rule.FREE_OWNED_ONLY,
                    f"{e.request_id!r} freed slot {s}, which is {what} (double free or foreign)",
                    e,
                )
        freed = set(e.slots)
        by_block = self._blocks.get(e.request_id, {})
        for block in {self._owner[s][1] for s in e.slots}:
            if not freed.issuperset(by_block.get(block, ())):
                raise self._fail(
                    Rule.FREE_OWNED_ONLY,
                    f"block {block} of {e.request_id!r} freed partially; blocks are freed whole",
                    e,
                )
        cur = r.current
        for s in e.slots:
            self._disown(s)
            if cur is not None and cur.slots is not None and s in cur.slots:
                cur.slots = None  # the block no longer holds (all of) its KV
        self._dirty[r.request_id] = None

    def _row_released(self, e: RowReleased) -> None:
        r = self._requests.get(e.request_id)
        if r is None or r.row != e.row or self._rows.get(e.row) != e.request_id:
            raise self._fail(
                Rule.FREE_OWNED_ONLY,
                f"{e.request_id!r} released row {e.row}, which it does not hold "
                f"(held by {self._rows.get(e.row)!r})",
                e,
            )
        del self._rows[e.row]
        r.row = None
        self._dirty[r.request_id] = None
        self._dirty_rows.add(e.row)

    def _finished(self, e: Finished) -> None:
        r = self._active(e.request_id, e)
        target = _ON_FINISHED.get(r.phase)
        if target is None:
            raise self._fail(
                Rule.LIFECYCLE,
                f"{r.request_id!r} finished in phase {r.phase.value} (its block "
                f"{None if r.current is None else r.current.index} is not committed)",
                e,
            )
        st = self._request_state(r)
        if e.reason is FinishReason.EOS and r.ignore_eos:
            raise self._fail(
                Rule.FINISH_CONDITION,
                f"{r.request_id!r} finished with reason eos but was submitted with ignore_eos "
                f"(no end-of-sequence or stop token ends it; valid: length at max_new_tokens, "
                f"or stop when submitted with stop_sampled)",
                e,
            )
        due = finish_condition(self.config, st)
        if e.reason is FinishReason.STOP and due is not FinishReason.STOP:
            self._require_stop_allowed(r, e)
            due = FinishReason.STOP
        if due is None:
            raise self._fail(
                Rule.FINISH_CONDITION,
                f"{r.request_id!r} finished with {len(st.generated)}/{r.max_new_tokens} tokens "
                f"and no end-of-sequence or stop token",
                e,
            )
        allowed = {due}
        if len(st.generated) >= r.max_new_tokens:
            allowed.add(FinishReason.LENGTH)
        if e.reason not in allowed:
            raise self._fail(
                Rule.FINISH_CONDITION,
                f"reason {e.reason.value}; the condition that holds is {due.value}",
                e,
            )
        self._require_owns_nothing(r, e)
        self._set_phase(r, target)
        r.reason = e.reason
        if self.retain_finished:
            self._unreported[r.request_id] = None

    def _committed_generated_this_round(self, r: _Request) -> bool:
        """`r` committed a block holding a generated token in this round: where an engine
        checks a request's stops and applies its pending abort."""
        return r.last_commit_round == self._round.index and bool(
            stop_output_lengths(self.config, self._request_state(r))
        )

    def _require_stop_allowed(self, r: _Request, e: Finished) -> None:
        """A STOP its committed tokens do not call for: only for a request whose stop the
        engine samples, and only in a round in which it committed a block holding a generated
        token (where an engine checks stops)."""
        if not r.stop_sampled:
            tokens = (
                "no stop token id ends it under ignore_eos"
                if r.ignore_eos
                else f"none of its stop_token_ids {list(r.stop_token_ids)} is the first "
                f"committed token that ends it"
                if r.stop_token_ids
                else "it has no stop_token_ids"
            )
            raise self._fail(
                Rule.FINISH_CONDITION,
                f"{r.request_id!r} finished with reason stop but was not submitted with "
                f"stop_sampled and {tokens} (valid: the reason its committed tokens call "
                f"for: eos, stop at a stop token id, or length at max_new_tokens)",
                e,
            )
        if not self._committed_generated_this_round(r):
            raise self._fail(
                Rule.FINISH_CONDITION,
                f"{r.request_id!r} finished with reason stop but committed no block holding a "
                f"generated token in round {self._round.index} (its latest commit was in round "
                f"{r.last_commit_round}); a stop is found in the tokens a round commits",
                e,
            )

    def _control_returned(self, e: ControlReturned) -> None:
        cfg = self.config
        rnd = self._round
        if e.round_index != rnd.index:
            raise self._fail(
                Rule.ROUND_ORDER, f"round {e.round_index} ended; expected round {rnd.index}", e
            )
        if rnd.pending:
            raise self._fail(
                Rule.STEP_PER_ROW, f"control returned while {list(rnd.pending)} await a step", e
            )
        active = list(self._running.values())
        for r in active:
            if r.row is None and not self._may_lack_row(r):
                raise self._fail(
                    Rule.ROW_EXCLUSIVE, f"{r.request_id!r} is running without a row", e
                )
            self._check_prefix(r, e)
            if _end(cfg, r, r.tokens[len(r.prompt) :])[0] is not None:
                raise self._fail(
                    Rule.FDFO_RELEASES_SAME_ROUND,
                    f"{r.request_id!r} met its finish condition but is still running at the end "
                    f"of the round",
                    e,
                )
            cur = r.current
            if cur is None:
                continue
            if cfg.mode is Mode.SYNC:
                raise self._fail(
                    Rule.SYNC_YIELDS_WHEN_ALL_DONE,
                    f"sync returned control while block {cur.index} of {r.request_id!r} is "
                    f"{cur.phase.value}",
                    e,
                )
            if cur.phase is BlockPhase.DONE:
                raise self._fail(
                    Rule.FDFO_RELEASES_SAME_ROUND,
                    f"block {cur.index} of {r.request_id!r} is done but not committed at the "
                    f"end of the round",
                    e,
                )
            if cur.phase in UNFINISHED_BLOCK_PHASES:
                holds = cur.slots is not None
                if cfg.in_place_reuse and not holds:
                    raise self._fail(
                        Rule.REUSE_KEEPS_SLOTS,
                        f"unfinished block {cur.index} of {r.request_id!r} lost its slots "
                        f"under in-place reuse",
                        e,
                    )
                if not cfg.in_place_reuse and holds:
                    raise self._fail(
                        Rule.NO_REUSE_RELEASES,
                        f"unfinished block {cur.index} of {r.request_id!r} still holds its "
                        f"slots at the end of the round without in-place reuse",
                        e,
                    )
        if rnd.forwards == 0:
            if active:
                raise self._fail(
                    Rule.PROGRESS,
                    f"a round with {len(active)} running requests ran no forward",
                    e,
                )
            if self._queue and not self._owner and not self._rows:
                raise self._fail(
                    Rule.PROGRESS,
                    f"idle system with {len(self._queue)} queued requests admitted none",
                    e,
                )
            self._check_work_conserving(e)
        self._round = _Round(index=rnd.index + 1)

    def _may_lack_row(self, r: _Request) -> bool:
        """Between rounds, only a carried FDFO block without in-place reuse may give up its row
        (it takes one again with `RowAcquired`)."""
        cfg = self.config
        cur = r.current
        return (
            self.policy.rows_released_between_rounds
            and cfg.mode is Mode.FDFO
            and not cfg.in_place_reuse
            and cur is not None
            and cur.phase in CARRIED_BLOCK_PHASES
        )

    # --- policy rules -------------------------------------------------------------
    def _check_work_conserving(self, e: Event) -> None:
        """At the end of the scheduler phase: a round that admitted nothing must not leave a
        seat, a row and the head's worst-case pages idle (see Rule.WORK_CONSERVING). Under
        `DllmPolicy.free_queue_order` any queued request may be the engine's head, so only
        the largest queued request's pages are asked for (every queued request fits)."""
        if not self.policy.work_conserving or self._round.admitted or not self._queue:
            return
        cfg = self.config
        active = self._running
        if len(active) >= cfg.max_running_requests or len(self._rows) >= cfg.req_pool_rows:
            return
        claimed = self._claimed_pages
        head, need = self._work_conserving_candidate()
        if claimed + need <= cfg.kv_pages:
            every = "every queued request fits, " if self.policy.free_queue_order else ""
            raise self._fail(
                Rule.WORK_CONSERVING,
                f"the round admitted nothing although {every}{head.request_id!r} fits: "
                f"{len(active)}/{cfg.max_running_requests} running, "
                f"{cfg.req_pool_rows - len(self._rows)} free rows, {cfg.kv_pages - claimed} "
                f"unclaimed pages >= {need} needed",
                e,
            )

    def _work_conserving_candidate(self) -> tuple[_Request, int]:
        """The queued request `work_conserving` asks to fit, with its worst-case pages: the
        queue's head, or under a free order the first of those needing the most pages."""

        def pages(rid: str) -> int:
            r = self._requests[rid]
            return request_shape(self.config, len(r.prompt), r.max_new_tokens).pages

        queued = list(self._queue) if self.policy.free_queue_order else [self._queue_head()]
        rid = max((q for q in queued if q is not None), key=pages)
        return self._requests[rid], pages(rid)

    def _is_prefill_block(self, r: _Request, block_index: int) -> bool:
        """A block that holds only prompt tokens (fed once, to write the prompt's KV)."""
        return (block_index + 1) * self.config.block_size <= len(r.prompt)

    def _prefill_kind(self, r: _Request, block_index: int) -> bool:
        """A row of the prefill batch under PREFILL_FIRST: a prompt-only block, or the first
        block computed after cache hits in this round (SGLang classifies an incoming request
        by its prompt length, before the cache match that may cover the whole prompt)."""
        return self._is_prefill_block(r, block_index) or (
            r.hit_round == self._round.index and block_index == r.committed_blocks
        )

    def _check_prefill_first(self, e: Forward) -> None:
        kinds = {
            self._prefill_kind(self._requests[row.request_id], row.block_index)
            for row in e.rows
            if row.request_id in self._requests
        }
        if len(kinds) > 1:
            raise self._fail(
                Rule.PREFILL_FIRST,
                "a forward mixes prefill rows (prompt-only blocks) and decode rows; under "
                "PREFILL_FIRST a batch is prefill-only or decode-only",
                e,
            )
        if kinds != {False}:
            return
        fed = {row.request_id for row in e.rows}
        for r in self._running.values():
            cur = r.current
            if (
                r.request_id not in fed
                and cur is not None
                and cur.phase is BlockPhase.MASKED
                and cur.slots is not None
                and self._prefill_kind(r, cur.index)
            ):
                raise self._fail(
                    Rule.PREFILL_FIRST,
                    f"a decode forward ran while prompt block {cur.index} of {r.request_id!r} "
                    f"waits; under PREFILL_FIRST the prefill batch goes first",
                    e,
                )

    # --- prefix cache ---------------------------------------------------------------
    def _slot_in_words(self, slot: int) -> str:
        """What `slot` is now, for a message: free, owned by (request, block), or cached."""
        owner = self._owner.get(slot)
        if owner is not None:
            return f"owned by {owner}"
        entry = self._cache.entry_of(slot)
        if entry is not None:
            return f"held by the prefix cache (block {list(entry.slots)})"
        return "free"

    def _block_key(self, r: _Request, k: int) -> BlockKey:
        """The content key of committed block `k` of `r`."""
        b = self.config.block_size
        return BlockKey(k, tuple(r.tokens[k * b : (k + 1) * b]), r.digests[k])

    def _require_cache(self, e: Event) -> None:
        if not self.config.prefix_cache:
            raise self._fail(
                Rule.PREFIX_CACHE_ON,
                f"a {e.kind} event, but the configuration has no prefix cache (set "
                f"prefix_cache=True for an engine that caches blocks, as SGLang's radix cache)",
                e,
            )

    def _kv_cached(self, e: KvCached) -> None:
        self._require_cache(e)
        r = self._active(e.request_id, e)
        k, rid = e.block_index, r.request_id
        if not 0 <= k < r.committed_blocks:
            raise self._fail(
                Rule.CACHE_COMMITTED_ONLY,
                f"{rid!r} caches block {k}, which it has not committed ({r.committed_blocks} "
                f"committed): only a committed block's KV is final",
                e,
            )
        if k in r.reads:
            raise self._fail(
                Rule.CACHE_COMMITTED_ONLY,
                f"{rid!r} caches block {k}, which it already reads from cached slots "
                f"{list(r.reads[k].slots)}",
                e,
            )
        owned = self._blocks.get(rid, {}).get(k, set())
        if tuple(e.slots) != tuple(sorted(owned)):
            raise self._fail(
                Rule.CACHE_COMMITTED_ONLY,
                f"{rid!r} caches slots {list(e.slots)} as block {k} but owns "
                f"{sorted(owned) or 'none'} for it (a block enters the cache whole, in position "
                f"order)",
                e,
            )
        for slot in e.slots:
            self._disown(slot)
        _reads_of(r)[k] = self._cache.insert(tuple(e.slots), self._block_key(r, k), (rid, k))
        self._dirty[rid] = None

    def _cache_hit(self, e: CacheHit) -> None:
        self._require_cache(e)
        r = self._active(e.request_id, e)
        b, k, rid = self.config.block_size, e.block_index, r.request_id
        nxt = k == r.committed_blocks
        if nxt:
            if self._round.forwards:
                raise self._fail(
                    Rule.SCHEDULER_PHASE, "a cache hit after the round's first forward", e
                )
            if r.row is None:
                raise self._fail(Rule.ROW_EXCLUSIVE, f"{rid!r} reads the cache without a row", e)
            if r.current is not None:
                raise self._fail(
                    Rule.CACHE_HIT_CONTENT,
                    f"{rid!r} hits block {k}, its current block ({r.current.phase.value}): a "
                    f"block being denoised is not read from the cache",
                    e,
                )
            if (k + 1) * b > len(r.prompt):
                raise self._fail(
                    Rule.CACHE_HIT_CONTENT,
                    f"{rid!r} hits block {k}, which is not wholly inside its prompt of "
                    f"{len(r.prompt)} tokens (its other tokens are not known before they are "
                    f"generated)",
                    e,
                )
            block = tuple(r.prompt[k * b : (k + 1) * b])
            want = BlockKey(k, block, chain(r.digests[-1] if r.digests else ROOT, block))
        elif 0 <= k < r.committed_blocks:
            if k in r.reads:
                raise self._fail(
                    Rule.CACHE_HIT_CONTENT,
                    f"{rid!r} hits block {k}, which it already reads from cached slots "
                    f"{list(r.reads[k].slots)}",
                    e,
                )
            want = self._block_key(r, k)
        else:
            raise self._fail(
                Rule.CACHE_HIT_CONTENT,
                f"{rid!r} hits block {k}, past its next block {r.committed_blocks}",
                e,
            )
        try:
            entry = self._cache.lookup(tuple(e.slots), self._slot_in_words)
        except CacheRefused as refused:
            raise self._fail(refused.rule, refused.detail, e) from None
        if entry.key != want:
            raise self._fail(
                Rule.CACHE_HIT_CONTENT,
                f"{rid!r} hits cached block {list(entry.slots)} as its block {k}, but the "
                f"cached content is not its own: {entry.key.difference(want)}",
                e,
            )
        entry.readers[(rid, k)] = None
        _reads_of(r)[k] = entry
        if nxt:  # the block is committed without a forward: its KV is the cache's
            r.tokens.extend(want.tokens)
            _digests_of(r).append(want.digest)
            r.committed_blocks += 1
            r.hit_round = self._round.index
        self._dirty[rid] = None

    def _cache_released(self, e: CacheReleased) -> None:
        self._require_cache(e)
        r = self._active(e.request_id, e)
        entry = r.reads.get(e.block_index)
        if entry is None or entry.slots != tuple(e.slots):
            reads = "no cached block" if entry is None else f"cached slots {list(entry.slots)}"
            raise self._fail(
                Rule.FREE_OWNED_ONLY,
                f"{r.request_id!r} releases cached slots {list(e.slots)} as its block "
                f"{e.block_index}, but reads {reads} for it",
                e,
            )
        del entry.readers[(r.request_id, e.block_index)]
        del r.reads[e.block_index]
        self._dirty[r.request_id] = None

    def _cache_evicted(self, e: CacheEvicted) -> None:
        self._require_cache(e)
        try:
            self._cache.evict(e.slots, self._slot_in_words)
        except CacheRefused as refused:
            raise self._fail(refused.rule, refused.detail, e) from None

    # ------------------------------------------------------------------ checks
    def check_snapshot(self, snap: Snapshot) -> None:
        """Raise SpecViolation('snapshot_matches') if the implementation's pools disagree, or
        if `snap` is not a `Snapshot` or a field is not of its declared container type (any set
        where a frozenset is declared, any mapping where a Mapping is), named in one line."""
        if not isinstance(snap, Snapshot):
            raise self._fail(
                Rule.SNAPSHOT_MATCHES,
                f"snapshot() returned {type(snap).__name__}, not a spec.Snapshot",
                None,
            )
        wrong = wrong_container(snap, SNAPSHOT_FIELDS)
        if wrong is not None:  # a list of slots would compare unequal to every set below
            raise self._fail(Rule.SNAPSHOT_MATCHES, wrong, None)
        st = self.state()
        problems: list[str] = []
        if snap.free_slots != st.free_slots:
            problems.append(
                "free slots differ: implementation "
                + _set_difference(snap.free_slots, st.free_slots, "frees")
            )
        if dict(snap.slot_owners) != dict(st.slot_owners):
            diff = {
                s: (snap.slot_owners.get(s), st.slot_owners.get(s))
                for s in set(snap.slot_owners) | set(st.slot_owners)
                if snap.slot_owners.get(s) != st.slot_owners.get(s)
            }
            problems.append(f"slot owners differ (slot: implementation, spec): {diff}")
        if dict(snap.rows) != dict(st.rows):
            problems.append(f"rows differ: implementation {dict(snap.rows)}, spec {dict(st.rows)}")
        if snap.running != st.running:
            problems.append(
                f"running set differs: implementation {sorted(snap.running)}, "
                f"spec {sorted(st.running)}"
            )
        if snap.cached_slots is not None and snap.cached_slots != st.cached_slots:
            problems.append(
                "cached slots differ: implementation "
                + _set_difference(snap.cached_slots, st.cached_slots, "caches")
            )
        if snap.carrying != st.carrying:
            problems.append(
                f"carriers differ (requests with incomplete_ids): implementation "
                f"{sorted(snap.carrying)}, spec {sorted(st.carrying)}"
            )
        if problems:
            # a carrier-only disagreement has its own rule; anything else is a pool mismatch
            only_carriers = len(problems) == 1 and problems[0].startswith("carriers")
            rule = Rule.CARRIERS_IFF_UNFINISHED if only_carriers else Rule.SNAPSHOT_MATCHES
            raise self._fail(rule, "; ".join(problems), None)

    def _check_stop_output(self, st: RequestState, tokens: tuple[int, ...]) -> None:
        """After a STOP: a prefix of the generated tokens ending inside the last block."""
        lengths = stop_output_lengths(self.config, st)
        gen = st.generated
        if len(tokens) not in lengths or tokens != gen[: len(tokens)]:
            raise self._fail(
                Rule.REPORTED_OUTPUT,
                f"{st.request_id!r} finished with reason stop and reported {len(tokens)} tokens "
                f"{list(tokens)}; valid: its generated tokens {list(gen[: lengths.stop - 1])} "
                f"cut after {lengths.start} to {lengths.stop - 1} tokens (the stop is found in "
                f"the block it committed last)",
                None,
            )

    def check_outputs(self, reported: Mapping[str, FinishedOutput]) -> None:
        """Compare the outputs an implementation reports with the spec (`reported_output`).

        `reported` holds the requests finished since the previous report, each reported once:
        its tokens must equal `request_output` and its reason the one its `Finished` event gave;
        every request finished since the previous report must be in it. Anything else than a
        Mapping of request id to `FinishedOutput` breaks the rule, saying what it was.
        """
        wrong = wrong_outputs(reported)
        if wrong is not None:
            raise self._fail(Rule.REPORTED_OUTPUT, wrong, None)
        for rid, out in reported.items():
            r = self._requests.get(rid)
            if r is None or r.phase is not RequestPhase.FINISHED:
                phase = "never submitted" if r is None else r.phase.value
                raise self._fail(
                    Rule.REPORTED_OUTPUT, f"reported an output for {rid!r}, which is {phase}", None
                )
            if rid not in self._unreported:
                raise self._fail(
                    Rule.REPORTED_OUTPUT, f"reported the output of {rid!r} a second time", None
                )
            st = self._request_state(r)
            if r.reason is FinishReason.STOP and r.stop_sampled:
                self._check_stop_output(st, tuple(out.tokens))
                want = tuple(out.tokens)
            else:
                want = request_output(self.config, st)
            if tuple(out.tokens) != want:
                raise self._fail(
                    Rule.REPORTED_OUTPUT,
                    f"{rid!r} reported {len(out.tokens)} tokens {list(out.tokens)}; the spec's "
                    f"output is {len(want)} tokens {list(want)} (max_new_tokens="
                    f"{r.max_new_tokens}, eos={self.config.eos_token_id})",
                    None,
                )
            if out.reason is not r.reason:
                raise self._fail(
                    Rule.REPORTED_OUTPUT,
                    f"{rid!r} reported finish reason {out.reason.value} but finished with "
                    f"{None if r.reason is None else r.reason.value}",
                    None,
                )
        missing = [rid for rid in self._unreported if rid not in reported]
        if missing:
            raise self._fail(
                Rule.REPORTED_OUTPUT,
                f"finished requests {missing} were not reported with their outputs",
                None,
            )
        self._unreported.clear()

    def check_changed(self) -> None:
        """Evaluate the state invariants on what changed since the previous check.

        Every event marks the requests and rows it touched; this checks the named invariants
        (same rules, same order as `spec.invariants.INVARIANTS`) for those only, at a cost
        proportional to the change. Run after every event it fails exactly when
        `check_invariants` (the full check, kept for audits) fails, naming the same rule.
        """
        reqs: list[_Request] = []
        if self._dirty:
            reqs = [self._requests[rid] for rid in self._dirty]
            self._dirty = {}
        rows, blocks = self._dirty_rows, self._dirty_blocks
        if rows:  # new containers only when used (most events touch no row or block)
            self._dirty_rows = set()
        if blocks:
            self._dirty_blocks = set()
        if not reqs and not rows and not blocks:
            failure = None  # nothing changed (a forward, a step, an end of round)
            if len(self._running) > self.config.max_running_requests:
                failure = self._changed_failure(reqs, rows, blocks)
        elif self._changed_hold(reqs, rows, blocks):
            failure = None
        else:
            failure = self._changed_failure(reqs, rows, blocks)
        if failure is not None:
            raise self._fail(failure[0], failure[1], None)

    def _changed_hold(self, reqs: list[_Request], rows: set[int], blocks: set[SlotOwner]) -> bool:
        """True only if every invariant `_changed_failure` checks holds for the changes: the
        same conditions in one pass per changed thing, without ordering or messages. When it
        says False, `_changed_failure` finds (or clears) the violation, so the verdict and the
        rule named are exactly its."""
        cfg = self.config
        if len(self._running) > cfg.max_running_requests:
            return False
        owners, by_request, running = self._owner, self._blocks, self._running
        if blocks:
            b, p, total = cfg.block_size, cfg.page_size, cfg.kv_slots
        for rid, block in blocks:
            held = by_request.get(rid)
            slots = None if held is None else held.get(block)
            if slots is None:
                continue  # freed: nothing left to check
            first, last = min(slots), max(slots)
            if (
                len(slots) != b  # whole_block_alloc
                or first < 0  # no_leak
                or last >= total
                or last - first + 1 != b  # page_alignment: contiguous (b distinct slots)
                or first % p != (block * b) % p
                or first // p != last // p
            ):
                return False
            if self._cache and any(self._cache.holds(s) for s in slots):
                return False  # no_leak: an owned slot is not also cached
            page = first - first % p  # page_alignment: the page's other slots have no other user
            for s in (*range(page, first), *range(last + 1, page + p)):
                o = owners.get(s)
                if o is not None and o[0] != rid:
                    return False
        for r in reqs:
            rid, cur, row = r.request_id, r.current, r.row
            held = by_request.get(rid)
            if held is not None:
                if r.phase is _FINISHED or r.phase is _ABORTED:
                    return False  # terminal_owns_nothing
                # no_leak: every owned block is committed or the current one; blocks are
                # distinct, so the highest being below the committed count or the current
                # block right after them says so without a loop
                top, done = max(held), r.committed_blocks
                if top >= done and (cur is None or not top == cur.index == done):
                    return False
            if row is not None and (
                r.phase is _FINISHED or r.phase is _ABORTED or self._rows.get(row) != rid
            ):
                return False  # terminal_owns_nothing, row_exclusive
            if r.reads and (r.phase is _FINISHED or r.phase is _ABORTED):
                return False  # terminal_owns_nothing
            if cur is not None:
                if rid not in running:
                    return False  # carriers_iff_unfinished
                if cur.masks is None and cur.phase in CARRIED_BLOCK_PHASES:
                    return False
                if cur.slots:  # reuse_keeps_slots: `_blocks` indexes `_owner` by owner
                    owned = None if held is None else held.get(cur.index)
                    if owned is None or not owned.issuperset(cur.slots):
                        return False
        for row in rows:
            rid_or_none = self._rows.get(row)
            if rid_or_none is None:
                continue
            holder = self._requests.get(rid_or_none)
            if (
                holder is None
                or holder.phase in TERMINAL_PHASES  # terminal_owns_nothing
                or not 0 <= row < cfg.req_pool_rows  # row_exclusive
                or holder.row != row
            ):
                return False
        return True

    def _changed_failure(
        self, reqs: list[_Request], rows: set[int], blocks: set[SlotOwner]
    ) -> tuple[Rule, str] | None:
        """The first invariant broken by the changed requests, rows and blocks (in the order
        of `INVARIANTS`). Per-slot work only for blocks whose slots changed."""
        cfg = self.config
        total, b, p = cfg.kv_slots, cfg.block_size, cfg.page_size
        changed = sorted(
            (owner, sorted(self._blocks[owner[0]][owner[1]]))
            for owner in blocks
            if owner[1] in self._blocks.get(owner[0], ())
        )
        for (cache_rid, block), owned in changed:  # no_leak: slots inside the pool, none cached
            if owned[0] < 0 or owned[-1] >= total:
                bad = owned[0] if owned[0] < 0 else owned[-1]
                return Rule.NO_LEAK, f"slot {bad} outside the pool"
            if self._cache:
                both = [slot for slot in owned if self._cache.holds(slot)]
                if both:
                    return Rule.NO_LEAK, (
                        f"slots {both} are both owned (by block {block} of {cache_rid!r}) and "
                        f"cached: free + owned + cached counts them twice"
                    )
        for r in reqs:  # no_leak: owned blocks are live
            cur = r.current
            for block, slots in self._blocks.get(r.request_id, {}).items():
                live = block < r.committed_blocks or (cur is not None and cur.index == block)
                if not live:
                    return Rule.NO_LEAK, (
                        f"slot {min(slots)} owned by block {block} of {r.request_id!r}, which "
                        f"is not live"
                    )
        for r in reqs:  # terminal_owns_nothing
            if r.phase is _FINISHED or r.phase is _ABORTED:
                if r.request_id in self._blocks:
                    return Rule.TERMINAL_OWNS_NOTHING, (
                        f"{r.phase.value} request {r.request_id!r} owns KV slots"
                    )
                if r.row is not None:
                    return Rule.TERMINAL_OWNS_NOTHING, (
                        f"{r.phase.value} request {r.request_id!r} holds a row"
                    )
                if r.reads:
                    return Rule.TERMINAL_OWNS_NOTHING, (
                        f"{r.phase.value} request {r.request_id!r} reads cached blocks"
                    )
        for row in rows:
            holder = self._requests.get(self._rows.get(row, ""))
            if holder is not None and holder.phase in TERMINAL_PHASES:
                return Rule.TERMINAL_OWNS_NOTHING, (
                    f"{holder.phase.value} request {holder.request_id!r} holds a row"
                )
        if len(self._running) > cfg.max_running_requests:  # max_running
            return Rule.MAX_RUNNING, (
                f"{len(self._running)} running > max_running_requests={cfg.max_running_requests}"
            )
        for row in sorted(rows):  # row_exclusive
            rid = self._rows.get(row)
            if rid is None:
                continue
            if not 0 <= row < cfg.req_pool_rows:
                return Rule.ROW_EXCLUSIVE, f"row {row} outside the request pool"
            holder = self._requests.get(rid)
            if holder is None or holder.row != row:
                return Rule.ROW_EXCLUSIVE, f"row {row} is held by {rid!r}, which does not record it"
        for r in reqs:
            if r.row is not None and self._rows.get(r.row) != r.request_id:
                return Rule.ROW_EXCLUSIVE, (
                    f"{r.request_id!r} records row {r.row}, which the pool gives to "
                    f"{self._rows.get(r.row)!r}"
                )
        for owner, ordered in changed:  # whole_block_alloc
            if len(ordered) != b:
                return Rule.WHOLE_BLOCK_ALLOC, f"block {owner} owns {len(ordered)} slots, not {b}"
        for (rid, block), ordered in changed:  # page_alignment
            first, last = ordered[0], ordered[-1]
            if last - first + 1 != len(ordered):
                return Rule.PAGE_ALIGNMENT, f"block {block} of {rid!r} is not contiguous: {ordered}"
            if first % p != (block * b) % p or first // p != last // p:
                return Rule.PAGE_ALIGNMENT, (
                    f"block {block} of {rid!r} is misaligned in its page: {ordered}"
                )
            page = first // p
            users = {self._owner[s][0] for s in range(page * p, page * p + p) if s in self._owner}
            if len(users) > 1:
                return Rule.PAGE_ALIGNMENT, f"page {page} is shared by {sorted(users)}"
        for r in reqs:  # reuse_keeps_slots
            cur = r.current
            if cur is not None and cur.slots is not None and r.request_id in self._running:
                for slot in cur.slots:
                    if self._owner.get(slot) != (r.request_id, cur.index):
                        return Rule.REUSE_KEEPS_SLOTS, (
                            f"block {cur.index} of {r.request_id!r} records slot {slot}, owned by "
                            f"{self._owner.get(slot)!r}"
                        )
        for r in reqs:  # carriers_iff_unfinished
            cur = r.current
            if cur is not None and cur.phase in CARRIED_BLOCK_PHASES and cur.masks is None:
                return Rule.CARRIERS_IFF_UNFINISHED, (
                    f"carried block {cur.index} of {r.request_id!r} has no mask count"
                )
            if cur is not None and r.request_id not in self._running:
                return Rule.CARRIERS_IFF_UNFINISHED, (
                    f"{r.phase.value} request {r.request_id!r} still has a current block"
                )
        return None

    def check_invariants(self) -> None:
        """Evaluate every named state invariant; raise SpecViolation on the first that fails."""
        from spec.invariants import check_all  # local: invariants import this module's helpers

        failure = check_all(self.state())
        if failure is not None:
            raise self._fail(Rule(failure[0]), failure[1], None)


SpecMachine.handlers = MappingProxyType(
    {
        Submitted: SpecMachine._submitted,
        Admitted: SpecMachine._admitted,
        KvAllocated: SpecMachine._kv_allocated,
        KvFreed: SpecMachine._kv_freed,
        RowAcquired: SpecMachine._row_acquired,
        RowReleased: SpecMachine._row_released,
        Forward: SpecMachine._forward,
        StepResult: SpecMachine._step_result,
        BlockCommitted: SpecMachine._block_committed,
        Finished: SpecMachine._finished,
        Aborted: SpecMachine._aborted,
        ControlReturned: SpecMachine._control_returned,
        KvCached: SpecMachine._kv_cached,
        CacheHit: SpecMachine._cache_hit,
        CacheReleased: SpecMachine._cache_released,
        CacheEvicted: SpecMachine._cache_evicted,
    }
)

__all__ = [
    "CARRIED_BLOCK_PHASES",
    "SpecMachine",
    "finish_condition",
    "initial_masks",
    "request_output",
]
