"""`SpecMachine`: replays events against the specification.

Each event must be enabled in the current abstract state; otherwise `apply` raises a
`SpecViolation` naming the rule, the event and the state (rendered before the event). Enabled
events have their effect applied. `check_snapshot` compares an implementation's own view of its
pools with the abstract state; `check_invariants` evaluates the named state invariants.

The machine is deliberately direct: each guard is a few lines that read like the rule in
`spec.rules`. It is the oracle, so clarity wins over speed.
"""

from __future__ import annotations

import copy as _copy
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from spec.config import DllmConfig, Mode, RequestSpec, validate_request
from spec.errors import RequestError, SpecViolation
from spec.events import (
    Aborted,
    Admitted,
    BlockCommitted,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    KvAllocated,
    KvFreed,
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
    RequestPhase,
)
from spec.snapshot import Snapshot
from spec.state import (
    ACTIVE_PHASES,
    CARRIED_BLOCK_PHASES,
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


@dataclass(slots=True)
class _Round:
    index: int = 0
    forwards: int = 0
    batch: tuple[SlotOwner, ...] = ()
    pending: dict[SlotOwner, int] = field(default_factory=dict)  # row -> input mask count
    newly_done_in_last_forward: bool = False
    committed: int = 0


def initial_masks(config: DllmConfig, prompt_len: int, block_index: int) -> int:
    """Mask tokens in block `block_index` before any step: its positions past the prompt."""
    b = config.block_size
    start = block_index * b
    return max(0, min(b, start + b - prompt_len))


def finish_condition(config: DllmConfig, request: RequestState) -> FinishReason | None:
    """Why the request must finish now, or None. EOS wins when both hold."""
    gen = request.generated
    eos = config.eos_token_id
    if eos is not None and eos in gen[: request.max_new_tokens]:
        return FinishReason.EOS
    if len(gen) >= request.max_new_tokens:
        return FinishReason.LENGTH
    return None


def request_output(config: DllmConfig, request: RequestState) -> tuple[int, ...]:
    """The request's output: generated tokens, cut at max_new_tokens and after the first EOS."""
    gen = request.generated[: request.max_new_tokens]
    eos = config.eos_token_id
    if eos is not None and eos in gen:
        gen = gen[: gen.index(eos) + 1]
    return gen


class SpecMachine:
    """The executable specification of a dLLM scheduler, driven by events."""

    def __init__(self, config: DllmConfig) -> None:
        self.config = config
        self._queue: list[str] = []
        self._requests: dict[str, _Request] = {}
        self._owner: dict[int, SlotOwner] = {}
        self._rows: dict[int, str] = {}
        self._round = _Round()
        self.events_applied = 0

    # ------------------------------------------------------------------ views
    def state(self) -> AbstractState:
        """The current abstract state as frozen values."""
        reqs = {
            rid: RequestState(
                request_id=r.request_id,
                prompt=r.prompt,
                max_new_tokens=r.max_new_tokens,
                phase=r.phase,
                row=r.row,
                committed_blocks=r.committed_blocks,
                tokens=tuple(r.tokens),
                current=None
                if r.current is None
                else BlockState(
                    r.current.index,
                    r.current.phase,
                    r.current.slots,
                    r.current.alloc_round,
                    r.current.masks,
                ),
            )
            for rid, r in self._requests.items()
        }
        rnd = self._round
        return AbstractState(
            config=self.config,
            queue=tuple(self._queue),
            requests=reqs,
            slot_owners=dict(self._owner),
            rows=dict(self._rows),
            round=RoundState(
                index=rnd.index,
                forwards=rnd.forwards,
                batch=rnd.batch,
                pending_steps=tuple(rnd.pending),
                committed=rnd.committed,
                pending_masks=dict(rnd.pending),
                newly_done_in_last_forward=rnd.newly_done_in_last_forward,
            ),
        )

    def render(self) -> str:
        return render(self.state())

    def copy(self) -> SpecMachine:
        return _copy.deepcopy(self)

    @property
    def round_index(self) -> int:
        return self._round.index

    def is_idle(self) -> bool:
        """No queued and no running request."""
        return not self._queue and not any(
            r.phase in ACTIVE_PHASES for r in self._requests.values()
        )

    def outputs(self) -> dict[str, tuple[int, ...]]:
        """Output of every finished request (see `request_output`)."""
        st = self.state()
        return {
            rid: request_output(self.config, r)
            for rid, r in st.requests.items()
            if r.phase is RequestPhase.FINISHED
        }

    def request_phase(self, request_id: str) -> RequestPhase | None:
        r = self._requests.get(request_id)
        return None if r is None else r.phase

    # ------------------------------------------------------------------ errors
    def _fail(self, rule: str, detail: str, event: object | None) -> SpecViolation:
        return SpecViolation(rule, detail, event, self.render())

    def _active(self, request_id: str, event: Event) -> _Request:
        r = self._requests.get(request_id)
        if r is None:
            raise self._fail("known_request", f"request {request_id!r} was never submitted", event)
        if r.phase not in ACTIVE_PHASES:
            raise self._fail(
                "known_request",
                f"request {request_id!r} is {r.phase.value}, not in the running set",
                event,
            )
        return r

    # ------------------------------------------------------------------ replay
    def apply_all(self, events: Iterable[Event]) -> None:
        for e in events:
            self.apply(e)

    def apply(self, event: Event) -> None:
        """Check that `event` is enabled and apply its effect; raise SpecViolation if not."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise self._fail("lifecycle", f"unknown event type {type(event).__name__}", event)
        handler(self, event)
        self.events_applied += 1

    def enabled(self, event: Event) -> str | None:
        """None if `event` is enabled now, else the name of the rule it would break."""
        try:
            self.copy().apply(event)
        except SpecViolation as v:
            return v.rule
        return None

    # --- between rounds -------------------------------------------------------
    def _submitted(self, e: Submitted) -> None:
        if e.request_id in self._requests:
            raise self._fail("unique_submission", f"{e.request_id!r} submitted twice", e)
        try:
            validate_request(
                self.config, RequestSpec(e.request_id, tuple(e.prompt), e.max_new_tokens)
            )
        except RequestError as err:
            raise self._fail("valid_request", f"accepted an invalid request: {err}", e) from None
        self._requests[e.request_id] = _Request(e.request_id, tuple(e.prompt), e.max_new_tokens)
        self._queue.append(e.request_id)

    def _aborted(self, e: Aborted) -> None:
        r = self._requests.get(e.request_id)
        if r is None or r.phase not in (RequestPhase.QUEUED, *ACTIVE_PHASES):
            phase = "never submitted" if r is None else r.phase.value
            raise self._fail("known_request", f"abort of {e.request_id!r}, which is {phase}", e)
        if any(k[0] == e.request_id for k in self._round.pending):
            raise self._fail("step_per_row", "aborted while a step result is pending", e)
        if self._round.forwards:
            raise self._fail(
                "scheduler_phase",
                "aborted in the middle of a round (after its first forward); aborts happen "
                "between rounds",
                e,
            )
        self._require_owns_nothing(r, e)
        if r.phase is RequestPhase.QUEUED:
            self._queue.remove(r.request_id)
        r.phase = RequestPhase.ABORTED
        r.current = None

    def _require_owns_nothing(self, r: _Request, e: Event) -> None:
        owned = sorted(s for s, o in self._owner.items() if o[0] == r.request_id)
        if owned:
            blocks = sorted({self._owner[s][1] for s in owned})
            raise self._fail(
                "terminal_owns_nothing",
                f"request {r.request_id!r} ends still owning {len(owned)} KV slots "
                f"(blocks {blocks}, slots {owned})",
                e,
            )
        if r.row is not None:
            raise self._fail(
                "terminal_owns_nothing",
                f"request {r.request_id!r} ends still holding request-pool row {r.row}",
                e,
            )

    # --- scheduler phase ------------------------------------------------------
    def _admitted(self, e: Admitted) -> None:
        r = self._requests.get(e.request_id)
        if r is None or r.phase is not RequestPhase.QUEUED:
            phase = "never submitted" if r is None else r.phase.value
            raise self._fail("lifecycle", f"admission of {e.request_id!r}, which is {phase}", e)
        if self._round.forwards:
            raise self._fail("scheduler_phase", "admission after the round's first forward", e)
        if self._queue[0] != e.request_id:
            raise self._fail(
                "fcfs_admission",
                f"admitted {e.request_id!r} while {self._queue[0]!r} is ahead of it "
                f"(queue {self._queue})",
                e,
            )
        running = sum(1 for x in self._requests.values() if x.phase in ACTIVE_PHASES)
        if running >= self.config.max_running_requests:
            raise self._fail(
                "max_running",
                f"admission would make {running + 1} running requests; "
                f"max_running_requests={self.config.max_running_requests}",
                e,
            )
        if not 0 <= e.row < self.config.req_pool_rows:
            raise self._fail(
                "row_exclusive",
                f"row {e.row} outside the request pool [0, {self.config.req_pool_rows})",
                e,
            )
        if e.row in self._rows:
            raise self._fail(
                "row_exclusive", f"row {e.row} is already held by {self._rows[e.row]!r}", e
            )
        self._queue.pop(0)
        self._rows[e.row] = e.request_id
        r.row = e.row
        r.phase = RequestPhase.ADMITTED

    def _kv_allocated(self, e: KvAllocated) -> None:
        cfg = self.config
        r = self._active(e.request_id, e)
        if self._round.forwards:
            raise self._fail("scheduler_phase", "KV allocated after the round's first forward", e)
        if r.row is None:
            raise self._fail("row_exclusive", f"{r.request_id!r} allocates KV without a row", e)
        if e.block_index != r.committed_blocks:
            raise self._fail(
                "whole_block_alloc",
                f"allocated block {e.block_index} but the next uncommitted block is "
                f"{r.committed_blocks}",
                e,
            )
        if len(e.slots) != cfg.block_size:
            raise self._fail(
                "whole_block_alloc",
                f"allocated {len(e.slots)} slots for a block of {cfg.block_size}",
                e,
            )
        bad = [s for s in e.slots if not 0 <= s < cfg.kv_slots]
        if bad:
            raise self._fail("kv_exclusive", f"slots {bad} outside the pool [0, {cfg.kv_slots})", e)
        taken = {s: self._owner[s] for s in e.slots if s in self._owner}
        if taken or len(set(e.slots)) != len(e.slots):
            raise self._fail(
                "kv_exclusive", f"slots already owned (slot: owner) {taken or 'duplicated'}", e
            )
        self._check_page_alignment(r, e)
        cur = r.current
        if cur is not None:
            # Re-allocation of a carried block: only legal without in-place reuse.
            if cur.slots is not None:
                raise self._fail(
                    "whole_block_alloc", f"block {cur.index} already holds its slots", e
                )
            if cfg.in_place_reuse:
                raise self._fail(
                    "reuse_keeps_slots",
                    f"block {cur.index} of {r.request_id!r} was re-allocated instead of reused "
                    f"in place",
                    e,
                )
            cur.slots = tuple(e.slots)
            cur.alloc_round = self._round.index
        else:
            target = REQUEST_LIFECYCLE.target(r.phase.value, "kv_allocated")
            if target is None:  # pragma: no cover - ADMITTED always allows it
                raise self._fail("lifecycle", f"{r.phase.value} cannot allocate", e)
            r.current = _Block(e.block_index, BlockPhase.MASKED, tuple(e.slots), self._round.index)
            r.phase = RequestPhase(target)
        for s in e.slots:
            self._owner[s] = (r.request_id, e.block_index)

    def _check_page_alignment(self, r: _Request, e: KvAllocated) -> None:
        cfg = self.config
        p = cfg.page_size
        slots = e.slots
        if any(slots[i] != slots[0] + i for i in range(len(slots))):
            raise self._fail("page_alignment", f"slots {list(slots)} are not contiguous", e)
        offset = (e.block_index * cfg.block_size) % p
        if slots[0] % p != offset:
            raise self._fail(
                "page_alignment",
                f"block {e.block_index} starts at page offset {offset} but slot {slots[0]} is at "
                f"offset {slots[0] % p} (page_size={p})",
                e,
            )
        if offset == 0:
            page = slots[0] // p
            users = {self._owner[s] for s in range(page * p, page * p + p) if s in self._owner}
            if users:
                raise self._fail(
                    "page_alignment",
                    f"block {e.block_index} starts page {page}, which is not wholly free "
                    f"(owners {sorted(users)})",
                    e,
                )
        else:
            prev = self._owner.get(slots[0] - 1)
            if prev != (r.request_id, e.block_index - 1):
                raise self._fail(
                    "page_alignment",
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
                "step_per_row", f"forward while rows {list(rnd.pending)} await a step result", e
            )
        if not e.rows:
            raise self._fail("forward_ready", "a forward with no rows", e)
        keys = tuple((row.request_id, row.block_index) for row in e.rows)
        if len({k[0] for k in keys}) != len(keys):
            raise self._fail("forward_ready", "a request appears twice in one forward", e)
        if rnd.committed:
            raise self._fail(
                "forward_policy", "a forward after a block was committed in this round", e
            )
        if rnd.forwards:
            if set(keys) != set(rnd.batch):
                raise self._fail(
                    "batch_stable",
                    f"rows {sorted(keys)} differ from this round's batch {sorted(rnd.batch)}",
                    e,
                )
            if cfg.mode is Mode.SYNC:
                currents = [self._requests[k[0]].current for k in keys]
                if all(c is not None and c.phase is BlockPhase.DONE for c in currents):
                    raise self._fail(
                        "forward_policy", "sync forward although every row is already done", e
                    )
            elif not cfg.reloop:
                raise self._fail(
                    "forward_policy", "a second forward in one FDFO round without re-loop", e
                )
            elif rnd.newly_done_in_last_forward:
                raise self._fail(
                    "forward_policy",
                    "FDFO re-loop continued after a block finished (it must yield)",
                    e,
                )
        pending: dict[SlotOwner, int] = {}
        for row in e.rows:
            r = self._active(row.request_id, e)
            cur = r.current
            if r.row is None:
                raise self._fail("forward_ready", f"{r.request_id!r} has no request-pool row", e)
            if cur is None or cur.index != row.block_index:
                raise self._fail(
                    "forward_ready",
                    f"{r.request_id!r} forwards block {row.block_index} but its current block "
                    f"is {None if cur is None else cur.index}",
                    e,
                )
            if row.num_tokens != cfg.block_size:
                raise self._fail(
                    "whole_block_rows",
                    f"row of {r.request_id!r} feeds {row.num_tokens} tokens; rows must be whole "
                    f"blocks of {cfg.block_size}",
                    e,
                )
            if cur.slots is None or any(
                self._owner.get(s) != (r.request_id, cur.index) for s in cur.slots
            ):
                rule = "reuse_keeps_slots" if cfg.in_place_reuse else "forward_ready"
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
                    "reuse_keeps_slots",
                    f"row of {r.request_id!r} says reused={row.reused} but its slots were "
                    f"allocated in round {cur.alloc_round} (now {rnd.index})",
                    e,
                )
            expected = (
                initial_masks(cfg, len(r.prompt), cur.index) if cur.masks is None else cur.masks
            )
            if row.masked != expected:
                raise self._fail(
                    "carrier_continuity",
                    f"block {cur.index} of {r.request_id!r} is fed with {row.masked} masks but "
                    f"it had {expected} (incomplete_ids lost or corrupted)",
                    e,
                )
            pending[(r.request_id, cur.index)] = row.masked
        rnd.forwards += 1
        rnd.batch = keys
        rnd.pending = pending
        rnd.newly_done_in_last_forward = False

    def _check_prefix(self, r: _Request, e: Event) -> None:
        b = self.config.block_size
        counts = Counter(o[1] for o in self._owner.values() if o[0] == r.request_id)
        for k in range(r.committed_blocks):
            if counts.get(k, 0) != b:
                raise self._fail(
                    "committed_prefix_kept",
                    f"committed block {k} of {r.request_id!r} holds {counts.get(k, 0)} of its "
                    f"{b} KV slots while the request is still active",
                    e,
                )

    def _step_result(self, e: StepResult) -> None:
        cfg = self.config
        key = (e.request_id, e.block_index)
        if key not in self._round.pending:
            raise self._fail(
                "step_per_row",
                f"step result for {key}, which is not awaiting one "
                f"(pending {list(self._round.pending)})",
                e,
            )
        masked_in = self._round.pending[key]
        if e.accept_length not in (0, cfg.block_size):
            raise self._fail(
                "accept_length",
                f"accept_length={e.accept_length}; it must be 0 or block_size={cfg.block_size}",
                e,
            )
        if not 0 <= e.masks_remaining <= masked_in:
            raise self._fail(
                "accept_length",
                f"masks_remaining={e.masks_remaining} but the input had {masked_in} masks",
                e,
            )
        done = e.accept_length == cfg.block_size
        if done and masked_in != 0:
            raise self._fail(
                "final_forward_before_commit",
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
        target = BLOCK_LIFECYCLE.target(cur.phase.value, trigger)
        if target is None:
            raise self._fail(
                "lifecycle", f"block in phase {cur.phase.value} cannot take {trigger}", e
            )
        if done and cur.phase is not BlockPhase.DONE:
            self._round.newly_done_in_last_forward = True
        cur.phase = BlockPhase(target)
        cur.masks = e.masks_remaining
        del self._round.pending[key]

    # --- completion ---------------------------------------------------------------
    def _block_committed(self, e: BlockCommitted) -> None:
        cfg = self.config
        r = self._active(e.request_id, e)
        if self._round.pending:
            raise self._fail(
                "step_per_row", f"commit while rows {list(self._round.pending)} await a step", e
            )
        cur = r.current
        if cur is None or cur.index != e.block_index:
            raise self._fail(
                "lifecycle",
                f"commit of block {e.block_index}; current block is "
                f"{None if cur is None else cur.index}",
                e,
            )
        if cur.phase is not BlockPhase.DONE:
            raise self._fail(
                "final_forward_before_commit",
                f"block {cur.index} of {r.request_id!r} committed in phase {cur.phase.value}; "
                f"only a done block (after its final-KV forward) may be committed",
                e,
            )
        if len(e.tokens) != cfg.block_size or cfg.mask_token_id in e.tokens:
            raise self._fail(
                "prompt_preserved",
                f"committed tokens {list(e.tokens)} are not {cfg.block_size} unmasked tokens",
                e,
            )
        start = cur.index * cfg.block_size
        for i, tok in enumerate(e.tokens):
            pos = start + i
            if pos < len(r.prompt) and r.prompt[pos] != tok:
                raise self._fail(
                    "prompt_preserved",
                    f"position {pos} holds {tok} but the prompt has {r.prompt[pos]}",
                    e,
                )
        target = REQUEST_LIFECYCLE.target(r.phase.value, "block_committed")
        if target is None:  # pragma: no cover - RUNNING always allows it
            raise self._fail("lifecycle", f"{r.phase.value} cannot commit", e)
        r.tokens.extend(e.tokens)
        r.committed_blocks += 1
        r.current = None
        r.phase = RequestPhase(target)
        self._round.committed += 1

    def _kv_freed(self, e: KvFreed) -> None:
        r = self._requests.get(e.request_id)
        if r is None:
            raise self._fail("known_request", f"request {e.request_id!r} was never submitted", e)
        if len(set(e.slots)) != len(e.slots):
            raise self._fail("free_owned_only", f"slots {list(e.slots)} freed twice at once", e)
        for s in e.slots:
            owner = self._owner.get(s)
            if owner is None or owner[0] != e.request_id:
                what = "free" if owner is None else f"owned by {owner}"
                raise self._fail(
                    "free_owned_only",
                    f"{e.request_id!r} freed slot {s}, which is {what} (double free or foreign)",
                    e,
                )
        freed = set(e.slots)
        for block in {self._owner[s][1] for s in e.slots}:
            rest = [s for s, o in self._owner.items() if o == (e.request_id, block)]
            if not freed.issuperset(rest):
                raise self._fail(
                    "free_owned_only",
                    f"block {block} of {e.request_id!r} freed partially; blocks are freed whole",
                    e,
                )
        cur = r.current
        for s in e.slots:
            del self._owner[s]
            if cur is not None and cur.slots is not None and s in cur.slots:
                cur.slots = None  # the block no longer holds (all of) its KV

    def _row_released(self, e: RowReleased) -> None:
        r = self._requests.get(e.request_id)
        if r is None or r.row != e.row or self._rows.get(e.row) != e.request_id:
            raise self._fail(
                "free_owned_only",
                f"{e.request_id!r} released row {e.row}, which it does not hold "
                f"(held by {self._rows.get(e.row)!r})",
                e,
            )
        del self._rows[e.row]
        r.row = None

    def _finished(self, e: Finished) -> None:
        r = self._active(e.request_id, e)
        target = REQUEST_LIFECYCLE.target(r.phase.value, "finished")
        if target is None:
            raise self._fail(
                "lifecycle",
                f"{r.request_id!r} finished in phase {r.phase.value} (its block "
                f"{None if r.current is None else r.current.index} is not committed)",
                e,
            )
        st = self.state().requests[r.request_id]
        due = finish_condition(self.config, st)
        if due is None:
            raise self._fail(
                "finish_condition",
                f"{r.request_id!r} finished with {len(st.generated)}/{r.max_new_tokens} tokens "
                f"and no end-of-sequence token",
                e,
            )
        allowed = {due}
        if len(st.generated) >= r.max_new_tokens:
            allowed.add(FinishReason.LENGTH)
        if e.reason not in allowed:
            raise self._fail(
                "finish_condition",
                f"reason {e.reason.value}; the condition that holds is {due.value}",
                e,
            )
        self._require_owns_nothing(r, e)
        r.phase = RequestPhase(target)

    def _control_returned(self, e: ControlReturned) -> None:
        cfg = self.config
        rnd = self._round
        if e.round_index != rnd.index:
            raise self._fail(
                "round_order", f"round {e.round_index} ended; expected round {rnd.index}", e
            )
        if rnd.pending:
            raise self._fail(
                "step_per_row", f"control returned while {list(rnd.pending)} await a step", e
            )
        active = [r for r in self._requests.values() if r.phase in ACTIVE_PHASES]
        for r in active:
            if r.row is None:
                raise self._fail("row_exclusive", f"{r.request_id!r} is running without a row", e)
            self._check_prefix(r, e)
            st = self.state().requests[r.request_id]
            if finish_condition(cfg, st) is not None:
                raise self._fail(
                    "fdfo_releases_same_round",
                    f"{r.request_id!r} met its finish condition but is still running at the end "
                    f"of the round",
                    e,
                )
            cur = r.current
            if cur is None:
                continue
            if cfg.mode is Mode.SYNC:
                raise self._fail(
                    "sync_yields_when_all_done",
                    f"sync returned control while block {cur.index} of {r.request_id!r} is "
                    f"{cur.phase.value}",
                    e,
                )
            if cur.phase is BlockPhase.DONE:
                raise self._fail(
                    "fdfo_releases_same_round",
                    f"block {cur.index} of {r.request_id!r} is done but not committed at the "
                    f"end of the round",
                    e,
                )
            if cur.phase in UNFINISHED_BLOCK_PHASES:
                holds = cur.slots is not None
                if cfg.in_place_reuse and not holds:
                    raise self._fail(
                        "reuse_keeps_slots",
                        f"unfinished block {cur.index} of {r.request_id!r} lost its slots "
                        f"under in-place reuse",
                        e,
                    )
                if not cfg.in_place_reuse and holds:
                    raise self._fail(
                        "no_reuse_releases",
                        f"unfinished block {cur.index} of {r.request_id!r} still holds its "
                        f"slots at the end of the round without in-place reuse",
                        e,
                    )
        if rnd.forwards == 0:
            if active:
                raise self._fail(
                    "progress",
                    f"a round with {len(active)} running requests ran no forward",
                    e,
                )
            if self._queue and not self._owner and not self._rows:
                raise self._fail(
                    "progress",
                    f"idle system with {len(self._queue)} queued requests admitted none",
                    e,
                )
        self._round = _Round(index=rnd.index + 1)

    # ------------------------------------------------------------------ checks
    def check_snapshot(self, snap: Snapshot) -> None:
        """Raise SpecViolation('snapshot_matches') if the implementation's pools disagree."""
        st = self.state()
        problems: list[str] = []
        if snap.free_slots != st.free_slots:
            extra = sorted(snap.free_slots - st.free_slots)
            missing = sorted(st.free_slots - snap.free_slots)
            problems.append(
                f"free slots differ: implementation also frees {extra}, lacks {missing}"
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
        if snap.carrying != st.carrying:
            problems.append(
                f"carriers differ (requests with incomplete_ids): implementation "
                f"{sorted(snap.carrying)}, spec {sorted(st.carrying)}"
            )
        if problems:
            # a carrier-only disagreement has its own rule; anything else is a pool mismatch
            only_carriers = len(problems) == 1 and problems[0].startswith("carriers")
            rule = "carriers_iff_unfinished" if only_carriers else "snapshot_matches"
            raise self._fail(rule, "; ".join(problems), None)

    def check_invariants(self) -> None:
        """Evaluate every named state invariant; raise SpecViolation on the first that fails."""
        from spec.invariants import check_all  # local: invariants import this module's helpers

        failure = check_all(self.state())
        if failure is not None:
            raise self._fail(failure[0], failure[1], None)


_HANDLERS: dict[type, Callable[[SpecMachine, Any], None]] = {
    Submitted: SpecMachine._submitted,
    Admitted: SpecMachine._admitted,
    KvAllocated: SpecMachine._kv_allocated,
    KvFreed: SpecMachine._kv_freed,
    RowReleased: SpecMachine._row_released,
    Forward: SpecMachine._forward,
    StepResult: SpecMachine._step_result,
    BlockCommitted: SpecMachine._block_committed,
    Finished: SpecMachine._finished,
    Aborted: SpecMachine._aborted,
    ControlReturned: SpecMachine._control_returned,
}

__all__ = [
    "CARRIED_BLOCK_PHASES",
    "SpecMachine",
    "finish_condition",
    "initial_masks",
    "request_output",
]
