"""`ArSpecMachine`: replays AR scheduler events against the specification.

Each event must be enabled in the current abstract state; otherwise `apply` raises a
`SpecViolation` naming the rule (see `spec.ar.rules`), the event and the state before it.
`check_snapshot` compares the implementation's own pools and queues with the abstract state
between steps; `check_invariants` evaluates the named state invariants.

Token accounting (vLLM v1's): a request knows prompt_len + num_output tokens; it has computed
num_computed of them. A step computes the scheduled tokens; a request that caught up with its
known tokens samples one output token. Preemption discards every computed token (recompute:
the outputs so far are folded into what must be prefilled again, as Vidur's restart does).

Prefix caching (`ArConfig.enable_prefix_caching`): a block is referenced by every request whose
block table lists it (its reference count is the number of holders). A full block whose tokens
are scheduled becomes cached under its content: the request's tokens up to the block's end
(prompt token ids when the request carries them, else tokens private to the request; output
tokens by the ids `ArOutputTokens` names, else private to the request: a block holding an
output is keyed afresh when its id is named). A cache hit takes references to cached blocks whose
content is the request's own prefix. A free cached block stays cached until it is allocated
afresh (implicit eviction) or evicted (`ArCacheEvicted`). A request preempted in the step that
scheduled it (victim order `LOWEST_PRIORITY_ANY`) loses what that scheduling cached: the
forward never writes it.

Cost: every event costs time proportional to what it changes (its blocks, the running set and,
for the policy orders, the waiting queue), and `check_invariants` checks only the requests and
blocks touched since the last check; `check_invariants_full` checks the whole state (used by
the test that both agree). Finished and aborted requests are retired: only their outcome stays,
except, where declared (`ArRules.free_at_batch_end`), a finished request that still holds
blocks until it frees them at its static batch's end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from spec.ar.cache_aware import cache_aware_order, pool_usage
from spec.ar.config import (
    AdmissionOrder,
    ArConfig,
    ArRequest,
    ArRules,
    Policy,
    VictimOrder,
    validate_ar_request,
)
from spec.ar.events import (
    AR_PAUSE_STATES,
    ArAborted,
    ArAwaiting,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheEvicted,
    ArCacheHit,
    ArCacheReset,
    ArDraftsProposed,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArInputFailed,
    ArOutputTokens,
    ArPauseSet,
    ArPreempted,
    ArReady,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.invariants import check_all
from spec.ar.lifecycles import (
    AR_QUEUED_PHASES,
    AR_REQUEST_LIFECYCLE,
    ArPhase,
)
from spec.ar.profile import ArPolicy
from spec.ar.rules import ArRule
from spec.ar.snapshot import AR_SNAPSHOT_FIELDS, ArSnapshot
from spec.ar.state import ArRequestState, ArState, render
from spec.errors import ConfigError, RequestError
from spec.machine_base import MachineBase
from spec.snapshot import wrong_container

Token = int | tuple[str, int] | tuple[str, str, int]


@dataclass(slots=True)
class _Req:
    """The machine's own mutable record of an active request (`ArRequestState` is its frozen
    view)."""

    request_id: str
    arrival: int
    prompt_len: int
    max_tokens: int
    stop_after: int | None
    priority: int
    predicted_len: int | None
    prompt: tuple[int, ...] | None = None
    cache_read_limit: int | None = None  # `ArRequest.cache_read_limit`
    lora: int | None = None  # `ArRequest.lora`
    phase: ArPhase = ArPhase.WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    attained: int = 0
    wait_since: int = 0  # the step index at which it (re-)entered the queue
    keys: list[int] = field(default_factory=list)  # content keys of its blocks 0, 1, ...
    cached_upto: int = 0  # its leading blocks registered in the cache
    stop_sampled: bool = False  # its end token is sampled, not scripted (`ArSubmitted`)
    output_step: int = -1  # the step in which it last produced an output token
    # when it started decoding (its prefill completed), counted over the run; None while it
    # is in its prefill (VictimOrder.LAST_DECODING)
    decoding_since: int | None = None
    fresh: bool = True  # never scheduled (vLLM's status WAITING; cache-aware admission)
    # its last chunk ended short of its known tokens (vLLM's `is_prefill_chunk`)
    prefilling: bool = False
    # running, it gave back the blocks holding its computed tokens (all of them): it may only
    # finish or be aborted now, not take blocks or tokens again (kv_covers_computed)
    released: bool = False
    # draft tokens the step that just ended computed, awaiting their `ArDraftsVerified`
    drafts: int = 0
    # the drafts proposed for its next step (`ArDraftsProposed`), until it is scheduled or
    # preempted; None: none
    proposed: int | None = None
    # the ids of its first outputs, as `ArOutputTokens` named them (the rest are private)
    output_ids: list[int] = field(default_factory=list)
    # its outputs before the last step that scheduled it (the update phase after that step
    # may name those after them, not these)
    outputs_before_step: int = 0
    # block index k -> the blocks it cached there under a key covering an output not named
    # yet: keyed afresh when it is named, held still or not (freed, they stay cached)
    private_keyed: dict[int, set[int]] = field(default_factory=dict)
    # why it may not be admitted yet (`ArAwaiting`), until its `ArReady`; None: it may be
    awaiting: str | None = None
    # since its `ArAwaiting`, until the admission pass promotes it (`ArReady` with in_step)
    # or admits it: vLLM's blocked status, which the cache-aware window does not move
    unpromoted: bool = False
    # since its `ArAwaiting`, until admitted: vLLM's `deferred_waiting`, which the prefill
    # cadence's capacity escape does not count as work left waiting
    deferred: bool = False
    # deferred because an admission pass skipped it for its LoRA adapter (for the messages)
    adapter_skipped: bool = False
    # its input will never be ready (`ArInputFailed`): the pass that reaches it ends it
    input_failed: bool = False

    @property
    def known(self) -> int:
        return self.prompt_len + self.num_output

    @property
    def expected_output(self) -> int:
        return self.max_tokens if self.predicted_len is None else self.predicted_len

    @property
    def readable(self) -> int:
        """The most tokens a cache hit may give it now: its known tokens less one (the last is
        computed, to sample from), within its `cache_read_limit`."""
        if self.cache_read_limit is None:
            return self.known - 1
        return min(self.known - 1, self.cache_read_limit)


@dataclass(slots=True)
class _Step:
    index: int = 0
    scheduled: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    preempted_with_free: bool = False  # a preemption of this step left a block free before it
    admitted: list[str] = field(default_factory=list)
    drafts: dict[str, int] = field(default_factory=dict)  # of `scheduled`: its draft tokens
    allocated: set[str] = field(default_factory=set)  # requests allocated blocks in the step
    in_schedule_phase: bool = False
    admission_phase: bool = False  # an event of a queued request was seen (cache-aware order)
    queued_seen: bool = False  # an event of a queued request (its admission) was seen
    found_ready: list[str] = field(default_factory=list)  # `ArReady(in_step)` in this pass
    # requests whose input failed that this step's admission pass reached (to be aborted)
    reached_failed: list[str] = field(default_factory=list)
    usage: float | None = None  # the pool's usage when the cache-aware order was decided


def finish_reason(r: ArRequestState | _Req) -> ArFinishReason | None:
    """Why the request must finish now, or None (STOP wins when both hold)."""
    if r.stop_after is not None and r.num_output >= r.stop_after:
        return ArFinishReason.STOP
    if r.num_output >= r.max_tokens:
        return ArFinishReason.LENGTH
    return None


def admission_key(rules: ArRules, r: _Req) -> tuple[int, int]:
    """The policy key a waiting request is admitted by (smallest first)."""
    a = rules.admission
    if a is AdmissionOrder.PRIORITY:
        return (r.priority, r.arrival)
    if a is AdmissionOrder.SJF:
        return (r.prompt_len + r.expected_output, r.arrival)
    if a is AdmissionOrder.SRPT:
        remaining = max(0, r.expected_output - r.num_output) + (r.known - r.num_computed)
        return (remaining, r.arrival)
    if a is AdmissionOrder.LAS:
        return (r.attained, r.arrival)
    return (0, r.arrival)


class ArSpecMachine(MachineBase[ArEvent, ArRule]):
    """The executable specification of an autoregressive scheduler, driven by events (its
    skeleton, shared with the dLLM machine, is `spec.machine_base.MachineBase`)."""

    lifecycle_rule: ClassVar[str] = ArRule.LIFECYCLE

    def __init__(self, config: ArConfig, policy: ArPolicy | ArRules | None = None) -> None:
        """`policy`: the implementation's declared `ArPolicy` (its options are parameters of the
        rules); a bare `ArRules` (older callers) is the policy with those rules and every option
        off; None is the idealised spec under `config.policy`."""
        super().__init__()
        self.config = config
        if isinstance(policy, ArRules):
            policy = ArPolicy(rules=policy)
        self.policy: ArPolicy = policy if policy is not None else ArPolicy()
        self.rules: ArRules = self.policy.rules_for(config)
        if config.max_loras and self.policy.prefill_interval > 1 and not self._pass_is_known():
            raise ConfigError(
                "max_loras",
                config.max_loras,
                f"no LoRA adapters (0) under a prefill cadence (prefill_interval="
                f"{self.policy.prefill_interval}) with admission {self.rules.admission.value}"
                f"{' and a look-ahead' if self.rules.fcfs_lookahead is not None else ''}: its "
                "capacity escape leaves out the requests the pass skipped for their adapter, "
                "which the spec follows only for vLLM's pass (FCFS or priority, no look-ahead, "
                "aging or static batches)",
            )
        self.watermark: int = self.policy.watermark_blocks(config)  # blocks admission leaves free
        self._requests: dict[str, _Req] = {}  # active requests only
        self._ended: dict[str, tuple[ArPhase, int]] = {}  # retired: (phase, outputs)
        # finished requests still holding blocks until their static batch ends (retired too;
        # `ArRules.free_at_batch_end`)
        self._batch_held: dict[str, _Req] = {}
        self._waiting: list[str] = []
        self._running: list[str] = []
        self._holders: dict[int, set[str]] = {}  # referenced blocks -> holders
        self._cache: dict[int, int] = {}  # cached blocks -> content key
        # content key -> the blocks cached under it (`_cache` inverted: the longest hit)
        self._cached_as: dict[int, set[int]] = {}
        self._key_ids: dict[tuple[int, tuple[Token, ...]], int] = {}
        self._adapters_seen: set[int] = {0}  # every submission's LoRA adapter (0: none)
        # (prefix key, the tokens after it) -> key, under `ArPolicy.hash_lookahead_tokens`
        self._ahead_ids: dict[tuple[int, tuple[Token, ...]], int] = {}
        # blocks uncached because their content was never computed -> why (for the messages)
        self._unwritten: dict[int, str] = {}
        self._step = _Step()
        self._pause = "unpaused"  # `ArPauseSet`: the operator's pause state
        self._reset_pending: list[str] = []  # preempted by a reset whose `ArCacheReset` is due
        self._unverified: set[str] = set()  # requests whose drafts await `ArDraftsVerified`
        # the log names the drafter's proposals (`ArDraftsProposed`): every draft is one
        self._proposals_named = False
        # failed-input requests the last step's admission pass reached: ended by now
        self._last_reached_failed: list[str] = []
        self._arrivals = 0
        self._decode_entries = 0  # requests that have started decoding, over the run
        # the prefill cadence (`ArPolicy.prefill_interval`): executed steps, the last that
        # carried prefill, the capacity escape, and whether this step is held / carried prefill
        self._executed = 0
        self._last_prefill = -self.policy.prefill_interval
        self._capacity_bound = False
        # the deferred requests the last release step left waiting, all it left, each with
        # why (for the messages)
        self._deferred_left: list[str] = []
        self._held = False
        self._carried_prefill = False
        self._reordered_at: int | None = None  # the last step the cache-aware order moved
        self._dirty: set[str] = set()  # requests touched since the last invariant check
        self._dirty_blocks: set[int] = set()
        self._dirty_pairs: set[tuple[str, int]] = set()  # (request, block) table changes
        self._dirty_between: set[str] = set()  # ... since the last between-steps check

    # ------------------------------------------------------------------ views
    def _waited(self, r: _Req) -> int:
        return self._step.index - r.wait_since if r.phase in AR_QUEUED_PHASES else 0

    def _request_state(self, r: _Req) -> ArRequestState:
        return ArRequestState(
            r.request_id,
            r.arrival,
            r.prompt_len,
            r.max_tokens,
            r.stop_after,
            r.priority,
            r.predicted_len,
            r.phase,
            r.num_computed,
            r.num_output,
            tuple(r.blocks),
            r.attained,
            self._waited(r),
            r.cache_read_limit,
            r.awaiting,
            r.lora,
        )

    def state(self) -> ArState:
        """The whole abstract state: active requests, and finished ones still holding blocks
        to their batch's end (`free_at_batch_end`); other retired ones hold nothing."""
        requests = {rid: self._request_state(r) for rid, r in self._requests.items()}
        requests.update({rid: self._request_state(r) for rid, r in self._batch_held.items()})
        return ArState(
            config=self.config,
            rules=self.rules,
            requests=requests,
            waiting=tuple(self._waiting),
            running=tuple(self._running),
            block_holders={b: frozenset(h) for b, h in self._holders.items()},
            step_index=self._step.index,
            scheduled=dict(self._step.scheduled),
            preempted=tuple(self._step.preempted),
            cached=dict(self._cache),
            pause=self._pause,
        )

    def render(self) -> str:
        """The current state in words (shown in every violation)."""
        return render(self.state())

    @property
    def step_index(self) -> int:
        """The step in progress (0 before the first `ArStepEnd`)."""
        return self._step.index

    @property
    def free_blocks(self) -> int:
        """Usable blocks no request references now."""
        return self.config.usable_blocks - len(self._holders)

    def is_idle(self) -> bool:
        """No waiting and no running request."""
        return not self._waiting and not self._running

    def queue_sizes(self) -> tuple[int, int]:
        """(waiting, running) request counts."""
        return len(self._waiting), len(self._running)

    def unfinished_ids(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The ids of the waiting requests and of the running ones, each in its order: what a
        log that ends here leaves unfinished."""
        return tuple(self._waiting), tuple(self._running)

    def request_phase(self, request_id: str) -> ArPhase | None:
        """The request's phase, also after it ended; None for an id never submitted."""
        r = self._requests.get(request_id)
        if r is not None:
            return r.phase
        ended = self._ended.get(request_id)
        return None if ended is None else ended[0]

    def decoding_requests(self) -> list[str]:
        """The running requests that decode (an output sampled, every known token but the
        last computed, no drafts awaiting verification), in running order: those a drafter
        may propose drafts for (`ArDraftsProposed`)."""
        return [
            rid
            for rid in self._running
            if (r := self._requests[rid]).num_output > 0
            and r.num_computed >= r.known - 1
            and not r.drafts
        ]

    def num_output(self, request_id: str) -> int:
        """Output tokens the request has produced so far (0 if unknown)."""
        r = self._requests.get(request_id)
        if r is not None:
            return r.num_output
        ended = self._ended.get(request_id)
        return 0 if ended is None else ended[1]

    def outputs(self) -> dict[str, int]:
        """Output tokens produced by every finished request."""
        return {rid: n for rid, (p, n) in self._ended.items() if p is ArPhase.FINISHED}

    # ------------------------------------------------------------------ errors
    def _active(self, request_id: str, event: ArEvent) -> _Req:
        r = self._requests.get(request_id)
        if r is None:
            ended = self._ended.get(request_id)
            what = "was never submitted" if ended is None else f"is {ended[0].value}"
            raise self._fail(ArRule.KNOWN_REQUEST, f"request {request_id!r} {what}", event)
        return r

    def _touch(self, r: _Req) -> None:
        self._dirty.add(r.request_id)
        self._dirty_between.add(r.request_id)

    # ------------------------------------------------------------------ replay
    def _enter_schedule_phase(self, event: ArEvent) -> None:
        st = self._step
        if st.in_schedule_phase:
            return
        self._check_finished_released(event)
        self._check_batch_end_released(event)
        self._check_reset_done(event)
        self._check_drafts_verified(event)
        self._check_failed_ended(event)
        st.in_schedule_phase = True
        self._begin_cadence()

    def _pause_set(self, e: ArPauseSet) -> None:
        if e.state not in AR_PAUSE_STATES:
            raise self._fail(
                ArRule.PAUSE, f"pause state {e.state!r}: one of {list(AR_PAUSE_STATES)}", e
            )
        self._check_drafts_verified(e)
        if self._step.in_schedule_phase:
            raise self._fail(
                ArRule.PAUSE,
                f"the pause state set to {e.state} inside step {self._step.index}'s schedule "
                "phase: an operator pauses or resumes between steps",
                e,
            )
        self._pause = e.state

    def _cache_reset(self, e: ArCacheReset) -> None:
        """`cache_reset`: between steps, nothing running or held; every cached block goes."""
        self._check_drafts_verified(e)
        if self._step.in_schedule_phase:
            raise self._fail(
                ArRule.CACHE_RESET,
                f"the prefix cache reset inside step {self._step.index}'s schedule phase: an "
                "operator resets between steps",
                e,
            )
        if self._running or self._holders:
            holders = sorted({h for held in self._holders.values() for h in held})
            raise self._fail(
                ArRule.CACHE_RESET,
                f"the prefix cache reset with {list(self._running)} running and "
                f"{holders} holding blocks: a reset first preempts every running request "
                "(ar_preempted with reset), or is refused",
                e,
            )
        self._dirty_blocks.update(self._cache)
        self._cache.clear()
        self._cached_as.clear()
        self._unwritten.clear()
        self._reset_pending.clear()

    def _check_reset_done(self, event: ArEvent) -> None:
        if self._reset_pending:
            raise self._fail(
                ArRule.CACHE_RESET,
                f"a cache reset preempted {self._reset_pending}, and no ar_cache_reset "
                f"followed before step {self._step.index}",
                event,
            )

    def _check_pause(self, r: _Req, e: ArEvent) -> None:
        """`pause`: paused_all schedules nothing; paused_new admits no request."""
        if self._pause == "paused_all":
            raise self._fail(
                ArRule.PAUSE,
                f"{type(e).__name__} for {r.request_id!r} while the scheduler is paused_all: "
                "a step then schedules, allocates and preempts nothing",
                e,
            )
        if self._pause == "paused_new" and r.phase in AR_QUEUED_PHASES:
            raise self._fail(
                ArRule.PAUSE,
                f"{type(e).__name__} for {r.request_id!r} ({r.phase.value}) while the "
                "scheduler is paused_new: only requests that run are scheduled, none admitted",
                e,
            )

    def _enter_admission_phase(self, r: _Req, e: ArEvent) -> None:
        """The first event of a queued request in a step starts its admission phase: the
        moment vLLM applies the cache-aware order (after every running request's blocks). An
        awaiting request (`ArAwaiting`) is not admitted (`awaiting`)."""
        if r.awaiting is not None:
            raise self._fail(
                ArRule.AWAITING,
                f"{type(e).__name__} for {r.request_id!r}, which awaits its {r.awaiting} "
                "(ar_awaiting) and has had no ar_ready: it may not be admitted yet",
                e,
            )
        st = self._step
        if r.phase in AR_QUEUED_PHASES:
            self._start_admission_pass()
            st.queued_seen = True
        elif st.found_ready:
            raise self._fail(
                ArRule.AWAITING,
                f"{type(e).__name__} for running {r.request_id!r} after step {st.index}'s "
                f"admission pass found {st.found_ready} ready: the running requests are "
                "scheduled before the waiting pass, so an in_step ar_ready comes after them",
                e,
            )

    def _start_admission_pass(self) -> None:
        """Start the step's admission pass, once: the cache-aware reorder runs first."""
        if not self._step.admission_phase:
            self._step.admission_phase = True
            self._reorder_cache_aware()

    def _reorder_cache_aware(self) -> None:
        """`ArPolicy.cache_aware_window`: reorder the waiting queue's head now, if the policy,
        the step and the pool's usage engage it (`spec.ar.cache_aware`)."""
        window = self.policy.cache_aware_window
        if (
            not window
            or self.config.policy is not Policy.FCFS
            or not self.config.enable_prefix_caching
            or self._step.preempted
            or self._held
            or len(self._waiting) < 2
        ):
            return
        usage = self._step.usage = pool_usage(self.free_blocks, self.config.usable_blocks)
        if usage < self.policy.cache_aware_threshold:
            return
        cached_keys = set(self._cache.values())

        def cached_tokens(rid: str) -> int:
            r = self._requests[rid]
            most = r.readable // self.config.block_size  # past `_hashable` no key matches
            k = 0
            while k < most and self._key(r, k) in cached_keys:
                k += 1
            return k * self.config.block_size

        def slot(rid: str) -> bool:  # vLLM moves only requests of status WAITING
            r = self._requests[rid]
            return r.fresh and not r.unpromoted

        order = cache_aware_order(self._waiting, window, slot, cached_tokens)
        if order != self._waiting:
            self._waiting = order
            self._reordered_at = self._step.index

    def _begin_cadence(self) -> None:
        """At a step's start: whether the prefill cadence holds it (see `ArPolicy`)."""
        interval = self.policy.prefill_interval
        self._carried_prefill = False
        self._held = (
            interval > 1
            and not self._capacity_bound
            and (self._executed + 1) - self._last_prefill < interval
            and any(not self._requests[q].prefilling for q in self._running)
        )

    def _end_cadence(self, scheduled: int, preempted: bool) -> None:
        """At a step's end: count it if it scheduled a token, restart the interval if it
        carried prefill; a release step that preempted nothing records whether it left
        requests waiting (the capacity escape)."""
        if scheduled:
            self._executed += 1
        if self._carried_prefill:
            self._last_prefill = self._executed
        if not self._held and not preempted:  # vLLM: num_waiting > len(deferred_waiting)
            self._capacity_bound = any(not self._requests[q].deferred for q in self._waiting)
            self._deferred_left = [] if self._capacity_bound else self._deferred_said()

    def _pass_is_known(self) -> bool:
        """Whether the spec can tell which waiting requests a step's admission pass reached:
        vLLM's pass, in queue order (FCFS) or the priority key's, with no look-ahead, aging or
        static batches."""
        rules = self.rules
        return (
            rules.admission in (AdmissionOrder.FCFS, AdmissionOrder.PRIORITY)
            and rules.fcfs_lookahead is None
            and rules.max_wait_steps is None
            and not rules.static_batches
        )

    def _defers_adapter_skips(self) -> bool:
        """Whether requests the pass skips for their adapter are tracked as deferred: only
        where the capacity escape reads them (a prefill cadence with LoRA adapters)."""
        return self.policy.prefill_interval > 1 and self.config.max_loras > 0

    def _pass_queue(self) -> list[str]:
        """The waiting queue in the order vLLM's admission pass takes it: the priority key's,
        else the queue's."""
        if self.rules.admission is AdmissionOrder.PRIORITY:
            return sorted(self._waiting, key=lambda q: admission_key(self.rules, self._requests[q]))
        return list(self._waiting)

    def _defer_passed_over(self, admitted: _Req) -> None:
        """Under a prefill cadence with adapters, as `admitted` is admitted: the waiting
        requests before it in the pass's order whose adapter finds no room were reached and
        skipped, and join vLLM's `deferred_waiting` (until admitted), which the capacity
        escape does not count. The admission rules let the pass go past only requests
        awaiting their input or skipped for their adapter, and the adapters in use only grow
        within a pass, so one blocked when the pass reached it is blocked now."""
        for q in self._pass_queue():
            if q == admitted.request_id:
                return
            r = self._requests[q]
            if self._adapter_blocked(r):
                r.deferred = r.adapter_skipped = True

    def _defer_skipped_at_end(self, total: int) -> None:
        """At a step's end (`total` tokens scheduled), as `_defer_passed_over` for the requests
        past its last admission: vLLM's pass (`Scheduler.schedule`) goes on from there only
        while the budget has a token left beyond the drafting rows and a seat is free (its
        loop's head; skipping spends neither), then skips every request awaiting its input or
        whose adapter finds no room, and stops at the first other one. It runs only in an
        unpaused step that preempted nothing."""
        cfg, st = self.config, self._step
        if st.preempted or self._pause != "unpaused":
            return
        rows = cfg.num_drafting_slots
        left = cfg.max_num_batched_tokens - total - rows * len(st.scheduled)
        if left <= rows or len(self._running) >= cfg.max_num_seqs:
            return
        for q in self._pass_queue():
            r = self._requests[q]
            if r.awaiting is not None:
                continue
            if not self._adapter_blocked(r):
                return
            r.deferred = r.adapter_skipped = True

    def _hold_is_empty(self) -> bool:
        """A held step with nothing scheduled yet, one that preempted, and no decoding request
        left running: nothing a held step may run is left, so the hold may lift (the candidate
        fix of a vLLM finding; vLLM 0.33.0 schedules nothing instead, which `progress`
        reports)."""
        st = self._step
        return (
            bool(st.preempted)
            and not st.scheduled
            and all(self._requests[q].prefilling for q in self._running)
        )

    def _check_cadence(self, r: _Req, n: int, e: ArScheduled) -> None:
        """prefill_cadence: a held step carries no prefill; then record `r`'s chunk."""
        admitting = r.phase in AR_QUEUED_PHASES
        prefill = r.num_computed < r.known - 1 if admitting else r.prefilling
        if prefill and self._held and self._hold_is_empty():
            self._held = False  # every decode it held for is gone: nothing else could run
        if prefill and self._held:
            what = (
                f"admitted with {r.known - r.num_computed} tokens to compute"
                if admitting
                else f"scheduled {n} tokens of its prefill"
            )
            decoding = [q for q in self._running if not self._requests[q].prefilling]
            raise self._fail(
                ArRule.PREFILL_CADENCE,
                f"{r.request_id!r} {what} in step {self._step.index}, which the prefill cadence "
                f"holds: prefill_interval={self.policy.prefill_interval}, executed step "
                f"{self._executed + 1}, the last to carry prefill {self._last_prefill}; "
                f"decoding {decoding[:8]}{self._escape_note()}",
                e,
            )
        self._carried_prefill |= prefill
        r.prefilling = r.num_computed + n < r.known

    def _deferred_said(self) -> list[str]:
        """The waiting requests (the first 8), each with why it is deferred."""
        said = []
        for q in self._waiting[:8]:
            why = "skipped for its adapter" if self._requests[q].adapter_skipped else None
            said.append(f"{q!r} ({why or 'its input awaited'})")
        return said

    def _escape_note(self) -> str:
        """Why the capacity escape did not lift a hold, where the last release step left
        requests waiting: all of them were deferred."""
        if not self._deferred_left:
            return ""
        return (
            "; no capacity escape: the last release step left waiting only requests its pass "
            f"deferred, {', '.join(self._deferred_left)}, which vLLM's escape does not count"
        )

    def _check_finished_released(self, event: ArEvent | None) -> None:
        for rid in self._running:
            r = self._requests[rid]
            due = finish_reason(r)
            if due is not None:
                raise self._fail(
                    ArRule.FINISH_RELEASED,
                    f"{rid!r} met its finish condition ({due.value}: {r.num_output} outputs) "
                    f"but is still running",
                    event,
                )

    def _check_batch_end_released(self, event: ArEvent | None) -> None:
        """`free_at_batch_end`: once nothing of the static batch runs (its last request
        finished or was aborted), its finished requests hold nothing."""
        failure = self._batch_end_failure()
        if failure is not None:
            raise self._fail(ArRule.TERMINAL_HOLDS_NOTHING, failure, event)

    def _first_kept(self) -> str:
        """The first finished request still holding blocks, and them, in words."""
        rid, r = next(iter(self._batch_held.items()))
        return f"finished {rid!r} still holds blocks {r.blocks}"

    def _batch_end_failure(self) -> str | None:
        if not self._batch_held or self._running:
            return None
        return (
            f"{self._first_kept()} after its static batch ended "
            f"(nothing runs; free_at_batch_end lets a finished request keep its blocks only "
            f"while a request of its batch runs)"
        )

    def _retire(self, r: _Req, phase: ArPhase) -> None:
        r.phase = phase
        del self._requests[r.request_id]
        self._ended[r.request_id] = (phase, r.num_output)
        self._dirty.discard(r.request_id)
        self._dirty_between.discard(r.request_id)

    # --- prefix-cache content ----------------------------------------------------
    def _token(self, r: _Req, i: int) -> Token:
        if i < r.prompt_len:
            return r.prompt[i] if r.prompt is not None else (r.request_id, i)
        if i - r.prompt_len < len(r.output_ids):
            return r.output_ids[i - r.prompt_len]
        return (r.request_id, "o", i)

    def _prefix_key(self, r: _Req, k: int) -> int:
        """The content key of the request's tokens [0, (k + 1) * block_size) under its LoRA
        adapter (vLLM hashes a request's adapter into each of its blocks: the same tokens under
        another adapter, or the base model, are other content)."""
        bs = self.config.block_size
        while len(r.keys) <= k:
            j = len(r.keys)
            # negative roots: never equal to a key, which counts up from 0
            prev = r.keys[-1] if r.keys else -1 - (r.lora or 0)
            toks = tuple(self._token(r, i) for i in range(j * bs, (j + 1) * bs))
            r.keys.append(self._key_ids.setdefault((prev, toks), len(self._key_ids)))
        return r.keys[k]

    def _apart_by_adapter(self, r: _Req, k: int, key: int) -> str:
        """Where the content key `key` is `r`'s tokens [0, (k + 1) * block_size) under another
        LoRA adapter than `r`'s (or the base model), words saying so; else ""."""
        bs = self.config.block_size
        for lora in sorted(self._adapters_seen - {r.lora or 0}):
            prev: int | None = -1 - lora
            for j in range(k + 1):
                toks = tuple(self._token(r, i) for i in range(j * bs, (j + 1) * bs))
                prev = self._key_ids.get((prev, toks)) if prev is not None else None
            if prev == key:
                theirs = f"LoRA adapter {lora}" if lora else "the base model"
                ours = f"adapter {r.lora}" if r.lora else "the base model"
                return (
                    f": the same tokens under {theirs}, but {r.request_id!r} runs {ours} "
                    "(cached blocks are keyed by adapter, as vLLM hashes them)"
                )
        return ""

    def _key(self, r: _Req, k: int) -> int:
        """The cache key of the request's block k: its tokens [0, (k + 1) * block_size), and
        with `ArPolicy.hash_lookahead_tokens` = L the L tokens after them too (the caller
        makes sure they are known: `_hashable`)."""
        prefix = self._prefix_key(r, k)
        ahead = self.policy.hash_lookahead_tokens
        if not ahead:
            return prefix
        start = (k + 1) * self.config.block_size
        toks = tuple(self._token(r, i) for i in range(start, start + ahead))
        # negative: never equal to a prefix key, which counts up from 0
        return self._ahead_ids.setdefault((prefix, toks), -1 - len(self._ahead_ids))

    def _hashable(self, r: _Req) -> int:
        """How many leading blocks of `r` have a cache key now: every full block of its known
        tokens, less `hash_lookahead_tokens` (the tokens after a block must be known)."""
        return max(0, r.known - self.policy.hash_lookahead_tokens) // self.config.block_size

    def _register_cached(self, r: _Req, upto_tokens: int) -> None:
        """Full blocks of `r` within its first `upto_tokens` tokens become cached."""
        full = min(min(upto_tokens, r.known) // self.config.block_size, self._hashable(r))
        for k in range(r.cached_upto, min(full, len(r.blocks))):
            b = r.blocks[k]
            self._cache_put(b, self._key(r, k))
            self._unwritten.pop(b, None)
            self._dirty_blocks.add(b)
            if self._covers_unnamed(r, k):
                r.private_keyed.setdefault(k, set()).add(b)
        r.cached_upto = max(r.cached_upto, min(full, len(r.blocks)))

    def _covers_unnamed(self, r: _Req, k: int) -> bool:
        """Whether the key of `r`'s block k covers an output of `r` no `ArOutputTokens` named
        yet (with `hash_lookahead_tokens`, the tokens after the block count)."""
        covered = (k + 1) * self.config.block_size + self.policy.hash_lookahead_tokens
        return covered > r.prompt_len + len(r.output_ids)

    def _cache_put(self, b: int, key: int) -> None:
        """Block `b` caches the content `key` (whatever it cached before is gone)."""
        self._cache_drop(b)
        self._cache[b] = key
        self._cached_as.setdefault(key, set()).add(b)

    def _cache_drop(self, b: int) -> None:
        """Block `b` caches nothing (a no-op where it cached nothing)."""
        key = self._cache.pop(b, None)
        if key is not None:
            blocks = self._cached_as[key]
            blocks.discard(b)
            if not blocks:
                del self._cached_as[key]

    def _longest_hit(self, r: _Req) -> list[int]:
        """For each leading block of `r`'s prefix, while one is cached, a block caching it:
        the longest hit within what `r` may read (`readable`; past `_hashable` no key
        matches)."""
        found: list[int] = []
        most = r.readable // self.config.block_size
        while len(found) < most and (blocks := self._cached_as.get(self._key(r, len(found)))):
            found.append(min(blocks))
        return found

    def _check_longest_hit(self, r: _Req, taken: int, e: ArEvent) -> None:
        """`cache_hit_longest` (declared): `r`, admitted from the queue, takes `taken` cached
        blocks; the cache held its first `len(_longest_hit(r))`."""
        if not (self.policy.longest_cache_hit and self.config.enable_prefix_caching):
            return
        longest = self._longest_hit(r)
        if taken < len(longest):
            took = f"a hit of {taken} block(s)" if taken else "no cache hit"
            raise self._fail(
                ArRule.CACHE_HIT_LONGEST,
                f"{r.request_id!r} was admitted with {took}, but the cache held its first "
                f"{len(longest)} prefix block(s) (blocks {longest}, within the "
                f"{r.readable} tokens it may read): an admission takes the longest cached "
                "prefix (longest_cache_hit)",
                e,
            )

    def _uncache_unwritten(self, r: _Req, why: str = "it was preempted in that step") -> None:
        """`r` was scheduled in this step and left its batch (`why`: preempted, or its blocks
        freed): the blocks its scheduling cached (from its first uncomputed token on) hold
        content no forward writes."""
        bs, index = self.config.block_size, self._step.index
        for k in range(r.num_computed // bs, r.cached_upto):
            b = r.blocks[k]
            if self._cache.get(b) == self._key(r, k):
                self._cache_drop(b)
                tokens = f"token {k}" if bs == 1 else f"tokens {k * bs}..{(k + 1) * bs - 1}"
                self._unwritten[b] = (
                    f"prefix block {k} of {r.request_id!r} ({tokens}), cached when "
                    f"{r.request_id!r} was scheduled in step {index} and never computed: {why}"
                )
                self._dirty_blocks.add(b)
        r.cached_upto = min(r.cached_upto, r.num_computed // bs)

    def _drop_refs(self, r: _Req, blocks: Iterable[int]) -> None:
        for b in blocks:
            holders = self._holders[b]
            holders.discard(r.request_id)
            if not holders:
                del self._holders[b]
            self._dirty_blocks.add(b)
            self._dirty_pairs.add((r.request_id, b))

    # --- between steps --------------------------------------------------------
    def _submitted(self, e: ArSubmitted) -> None:
        if e.request_id in self._requests or e.request_id in self._ended:
            raise self._fail(ArRule.UNIQUE_SUBMISSION, f"{e.request_id!r} submitted twice", e)
        if e.stop_sampled and e.stop_after is not None:
            raise self._fail(
                ArRule.VALID_REQUEST,
                f"{e.request_id!r} has stop_after={e.stop_after} and stop_sampled: a stop is "
                "either scripted (stop_after) or sampled, not both",
                e,
            )
        req = ArRequest(
            e.request_id,
            e.prompt_len,
            e.max_tokens,
            e.stop_after,
            e.priority,
            e.predicted_len,
            prompt=e.prompt,
            cache_read_limit=e.cache_read_limit,
            lora=e.lora,
        )
        try:
            validate_ar_request(self.config, req)
        except RequestError as err:
            raise self._fail(
                ArRule.VALID_REQUEST, f"accepted an invalid request: {err}", e
            ) from None
        r = _Req(
            e.request_id,
            self._arrivals,
            e.prompt_len,
            e.max_tokens,
            e.stop_after,
            e.priority,
            e.predicted_len,
            e.prompt,
            e.cache_read_limit,
            e.lora,
            wait_since=self._step.index,
            stop_sampled=e.stop_sampled,
        )
        self._requests[e.request_id] = r
        self._adapters_seen.add(e.lora or 0)
        self._arrivals += 1
        self._waiting.append(e.request_id)
        self._touch(r)

    def _admissible(self) -> list[str]:
        """The waiting queue without its awaiting requests (`ArAwaiting`) and those whose LoRA
        adapter finds no room now (`lora_slots`), in order."""
        return [
            q
            for q in self._waiting
            if self._requests[q].awaiting is None and not self._adapter_blocked(self._requests[q])
        ]

    def _adapters(self) -> set[int]:
        """The LoRA adapters the running requests use (those admitted in this step included)."""
        return {lora for q in self._running if (lora := self._requests[q].lora) is not None}

    def _adapter_blocked(self, r: _Req) -> bool:
        """`lora_slots`: `r` needs an adapter no running request uses while they use
        `max_loras` already (vLLM's scheduler passes over it: "Scheduling would exceed
        max_loras, skip")."""
        if r.lora is None:
            return False
        adapters = self._adapters()
        return r.lora not in adapters and len(adapters) >= self.config.max_loras

    def _awaiting(self, e: ArAwaiting) -> None:
        """`awaiting`: a request submitted in this gap between steps, never scheduled, may not
        be admitted until its `ArReady`."""
        r = self._active(e.request_id, e)
        st = self._step
        if not isinstance(e.what, str) or not e.what:
            raise self._fail(
                ArRule.AWAITING,
                f"{r.request_id!r} awaits {e.what!r}: what it awaits is a non-empty string "
                "(vLLM: 'grammar')",
                e,
            )
        if r.awaiting is not None:
            raise self._fail(
                ArRule.AWAITING, f"{r.request_id!r} already awaits its {r.awaiting}", e
            )
        if st.in_schedule_phase or r.wait_since != st.index or not r.fresh:
            raise self._fail(
                ArRule.AWAITING,
                f"{r.request_id!r} said to await its {e.what} "
                + (
                    f"inside step {st.index}'s schedule phase"
                    if st.in_schedule_phase
                    else "after it was scheduled"
                    if not r.fresh
                    else f"{st.index - r.wait_since} step(s) after its submission"
                )
                + ": ar_awaiting comes between steps, in the gap of the request's ar_submitted",
                e,
            )
        r.awaiting = e.what
        r.unpromoted = r.deferred = True
        self._touch(r)

    def _ready(self, e: ArReady) -> None:
        """`awaiting`: between steps, the awaiting request's input is ready and it may be
        admitted from now on (it stays unpromoted: the cache-aware window does not move it);
        with `in_step`, the step's admission pass promotes it (vLLM's pass reaching it),
        starting the pass if none has (after the cache-aware reorder). A request still
        awaiting is promoted at the pass's start, before any waiting request's event; one whose
        input was ready already, anywhere in the pass."""
        r = self._active(e.request_id, e)
        st = self._step
        if r.awaiting is None and not (e.in_step and r.unpromoted):
            raise self._fail(
                ArRule.AWAITING,
                f"ar_ready for {r.request_id!r}, which awaits nothing"
                + (" and is promoted already" if e.in_step else "")
                + ": an ar_ready follows the request's ar_awaiting (between steps once, and "
                "with in_step once, where its admission pass promotes it)",
                e,
            )
        if not e.in_step and st.in_schedule_phase:
            raise self._fail(
                ArRule.AWAITING,
                f"ar_ready for {r.request_id!r} inside step {st.index}'s schedule phase "
                "without in_step: between steps, or in_step where the step's admission pass "
                "promotes it",
                e,
            )
        if e.in_step:
            if r.awaiting is not None and st.queued_seen:
                raise self._fail(
                    ArRule.AWAITING,
                    f"ar_ready for {r.request_id!r}, awaiting, in step {st.index} after a "
                    "waiting request's admission events: a request still awaiting is found "
                    "ready at the start of the admission pass, before the first event of a "
                    "waiting request (or between steps)",
                    e,
                )
            if st.preempted or self._pause != "unpaused":
                why = f"preempted {st.preempted}" if st.preempted else f"is {self._pause}"
                raise self._fail(
                    ArRule.AWAITING,
                    f"ar_ready for {r.request_id!r} in step {st.index}'s admission pass, but "
                    f"the step {why}: no waiting pass runs there to promote it",
                    e,
                )
            self._enter_schedule_phase(e)
            self._start_admission_pass()
            st.found_ready.append(r.request_id)
            r.unpromoted = False
        r.awaiting = None
        self._touch(r)

    def _input_failed(self, e: ArInputFailed) -> None:
        """`awaiting`: between steps, the awaiting request's input will never be ready; the
        admission pass that reaches it ends it (`_check_failed_ended`)."""
        r = self._active(e.request_id, e)
        if r.awaiting is None or r.input_failed or self._step.in_schedule_phase:
            raise self._fail(
                ArRule.AWAITING,
                f"ar_input_failed for {r.request_id!r}"
                + (
                    f" inside step {self._step.index}'s schedule phase"
                    if self._step.in_schedule_phase
                    else ", whose input failed already"
                    if r.input_failed
                    else ", which awaits nothing"
                )
                + ": it follows the request's ar_awaiting, once, between steps",
                e,
            )
        r.input_failed = True
        self._touch(r)

    def _note_failed_reached(self, admitted: _Req | None) -> None:
        """The failed-input requests this step's admission pass reached: those before
        `admitted` in the pass's order (FCFS: the queue's; else the policy key's), or, with
        `admitted` None (nothing admitted, nothing running), the whole queue up to its first
        request that may be admitted."""
        st, rules = self._step, self.rules
        if admitted is None:
            ahead = []
            for q in self._waiting:
                if self._requests[q].awaiting is None:
                    break
                ahead.append(q)
        elif rules.admission is AdmissionOrder.FCFS:
            ahead = self._waiting[: self._waiting.index(admitted.request_id)]
        else:
            key = admission_key(rules, admitted)
            ahead = [q for q in self._waiting if admission_key(rules, self._requests[q]) < key]
        for q in ahead:
            if self._requests[q].input_failed and q not in st.reached_failed:
                st.reached_failed.append(q)

    def _check_failed_ended(self, event: ArEvent | None) -> None:
        """A request whose input failed, reached by the last step's pass, ended in its update
        phase (vLLM finishes it with an error there)."""
        left = [q for q in self._last_reached_failed if q in self._requests]
        self._last_reached_failed = []
        if left:
            raise self._fail(
                ArRule.AWAITING,
                f"{left} failed to get their input (ar_input_failed) and step "
                f"{self._step.index - 1}'s admission pass reached them, but they were not "
                "ended in its update phase (ar_aborted): vLLM ends such a request with an error "
                "in the step whose pass reaches it",
                event,
            )

    def _aborted(self, e: ArAborted) -> None:
        r = self._active(e.request_id, e)
        if r.blocks:
            raise self._fail(
                ArRule.TERMINAL_HOLDS_NOTHING,
                f"{r.request_id!r} aborted still holding blocks {r.blocks}",
                e,
            )
        if r.phase in AR_QUEUED_PHASES:
            self._waiting.remove(r.request_id)
        else:
            self._running.remove(r.request_id)
        self._step.scheduled.pop(r.request_id, None)
        self._step.drafts.pop(r.request_id, None)
        self._retire(r, ArPhase.ABORTED)

    # --- scheduling phase -----------------------------------------------------
    def _check_readmission(self, r: _Req, e: ArEvent) -> None:
        if r.phase in AR_QUEUED_PHASES:
            self._check_soft_preemption_admission(r, e)
        if r.phase is ArPhase.PREEMPTED and not self.rules.admit_after_preemption:
            raise self._fail(
                ArRule.NO_ADMISSION_AFTER_PREEMPTION,
                f"{r.request_id!r} gets {type(e).__name__} in the step that preempted it",
                e,
            )

    def _cache_hit(self, e: ArCacheHit) -> None:
        cfg = self.config
        r = self._active(e.request_id, e)
        self._check_pause(r, e)
        self._enter_schedule_phase(e)
        self._enter_admission_phase(r, e)
        if not cfg.enable_prefix_caching:
            raise self._fail(ArRule.CACHE_HIT_ENABLED, "a cache hit with prefix caching off", e)
        if r.phase not in AR_QUEUED_PHASES or r.blocks or r.num_computed:
            raise self._fail(
                ArRule.LIFECYCLE,
                f"cache hit for {r.request_id!r} ({r.phase.value}, {len(r.blocks)} blocks, "
                f"{r.num_computed} computed): only a queued request holding nothing hits",
                e,
            )
        self._check_readmission(r, e)
        if not e.blocks or len(set(e.blocks)) != len(e.blocks):
            raise self._fail(
                ArRule.CACHE_HIT_CACHED, f"blocks {list(e.blocks)} empty or repeated", e
            )
        tokens = len(e.blocks) * cfg.block_size
        if tokens > r.known - 1:
            raise self._fail(
                ArRule.CACHE_HIT_BOUNDED,
                f"{r.request_id!r} hits {tokens} tokens of its {r.known} known: at most "
                f"{r.known - 1} (the last token is computed, to sample from)",
                e,
            )
        if tokens > r.readable:
            raise self._fail(
                ArRule.CACHE_HIT_BOUNDED,
                f"{r.request_id!r} hits {tokens} tokens but its cache_read_limit is "
                f"{r.cache_read_limit}: at most {r.readable // cfg.block_size * cfg.block_size} "
                + (
                    "(it skips reading the prefix cache)"
                    if r.cache_read_limit == 0
                    else f"(its prompt is scored from row {r.cache_read_limit} on, so those rows "
                    "must be computed by its own forwards)"
                ),
                e,
            )
        ahead = self.policy.hash_lookahead_tokens
        if len(e.blocks) > self._hashable(r):
            raise self._fail(
                ArRule.CACHE_HIT_BOUNDED,
                f"{r.request_id!r} hits {len(e.blocks)} blocks of its {r.known} known tokens, "
                f"but a block's key also covers the {ahead} token(s) after it "
                f"(hash_lookahead_tokens={ahead}): at most {self._hashable(r)} blocks",
                e,
            )
        for k, b in enumerate(e.blocks):
            key = self._cache.get(b)
            if key is None:
                why = f": {self._unwritten[b]}" if b in self._unwritten else ""
                raise self._fail(
                    ArRule.CACHE_HIT_CACHED,
                    f"{r.request_id!r} claims block {b} as its prefix block {k}, but block {b} "
                    f"is not cached (cached: {sorted(self._cache)}){why}",
                    e,
                )
            if key != self._key(r, k):
                raise self._fail(
                    ArRule.CACHE_HIT_CACHED,
                    f"{r.request_id!r} claims block {b} as its prefix block {k}, but block {b} "
                    "caches other content"
                    + (
                        f" (or other tokens after it: hash_lookahead_tokens={ahead})"
                        if ahead
                        else self._apart_by_adapter(r, k, key)
                    ),
                    e,
                )
        self._check_longest_hit(r, len(e.blocks), e)
        for b in e.blocks:
            self._holders.setdefault(b, set()).add(r.request_id)
            self._dirty_blocks.add(b)
            self._dirty_pairs.add((r.request_id, b))
        r.blocks.extend(e.blocks)
        r.num_computed = tokens
        r.cached_upto = len(e.blocks)
        self._touch(r)

    def _cache_evicted(self, e: ArCacheEvicted) -> None:
        if self._pause == "paused_all":
            raise self._fail(
                ArRule.PAUSE,
                f"evicted cached blocks {list(e.blocks)} while the scheduler is paused_all: it "
                "allocates nothing, so evicts nothing (an operator's reset is ar_cache_reset)",
                e,
            )
        if not e.blocks or len(set(e.blocks)) != len(e.blocks):
            raise self._fail(
                ArRule.EVICT_UNREFERENCED_ONLY, f"blocks {list(e.blocks)} empty or repeated", e
            )
        for b in e.blocks:
            if b not in self._cache:
                raise self._fail(ArRule.EVICT_UNREFERENCED_ONLY, f"block {b} is not cached", e)
            if b in self._holders:
                raise self._fail(
                    ArRule.EVICT_UNREFERENCED_ONLY,
                    f"evicted block {b}, still referenced by {sorted(self._holders[b])}",
                    e,
                )
        for b in e.blocks:
            self._cache_drop(b)
            self._dirty_blocks.add(b)

    def _blocks_allocated(self, e: ArBlocksAllocated) -> None:
        cfg = self.config
        r = self._active(e.request_id, e)
        self._check_pause(r, e)
        self._enter_schedule_phase(e)
        self._enter_admission_phase(r, e)
        self._check_readmission(r, e)
        self._check_not_released(r, e)
        if not e.blocks or len(set(e.blocks)) != len(e.blocks):
            raise self._fail(ArRule.KV_EXCLUSIVE, f"blocks {list(e.blocks)} empty or repeated", e)
        if r.phase in AR_QUEUED_PHASES and not r.blocks:
            self._check_longest_hit(r, 0, e)  # admitted with no hit
        for b in e.blocks:
            if not 0 <= b < cfg.num_blocks:
                raise self._fail(
                    ArRule.KV_EXCLUSIVE, f"block {b} outside the pool [0, {cfg.num_blocks})", e
                )
            if b == cfg.null_block:
                raise self._fail(ArRule.NULL_BLOCK_RESERVED, f"allocated the null block {b}", e)
            if b in self._holders:
                raise self._fail(
                    ArRule.KV_EXCLUSIVE,
                    f"block {b} is already held by {sorted(self._holders[b])} (a fresh "
                    f"allocation takes a free block; sharing is only through a cache hit)",
                    e,
                )
        if len(r.blocks) + len(e.blocks) > cfg.max_blocks_per_request:
            raise self._fail(
                ArRule.KV_BOUNDED,
                f"{r.request_id!r} would hold {len(r.blocks) + len(e.blocks)} blocks; "
                f"max_model_len={cfg.max_model_len} needs at most {cfg.max_blocks_per_request}",
                e,
            )
        for b in e.blocks:
            self._holders[b] = {r.request_id}
            self._cache_drop(b)  # a fresh allocation evicts what the block cached
            self._unwritten.pop(b, None)
            r.blocks.append(b)
            self._dirty_blocks.add(b)
            self._dirty_pairs.add((r.request_id, b))
        self._step.allocated.add(r.request_id)
        self._touch(r)

    def _scheduled(self, e: ArScheduled) -> None:
        cfg, rules, st = self.config, self.rules, self._step
        r = self._active(e.request_id, e)
        self._check_pause(r, e)
        self._enter_schedule_phase(e)
        self._enter_admission_phase(r, e)
        self._check_not_released(r, e)
        n = e.num_tokens
        if r.request_id in st.scheduled:
            raise self._fail(
                ArRule.ONE_SCHEDULE_PER_STEP,
                f"{r.request_id!r} scheduled twice in step {st.index}",
                e,
            )
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise self._fail(ArRule.ONE_SCHEDULE_PER_STEP, f"scheduled {n!r} tokens (>= 1)", e)
        uncomputed = r.known - r.num_computed
        drafts = self._check_drafts(r, e)
        if n - drafts > uncomputed:
            raise self._fail(
                ArRule.NO_COMPUTE_PAST_KNOWN,
                f"{r.request_id!r} scheduled {n} tokens but only {uncomputed} are known and "
                f"uncomputed ({r.known} known, {r.num_computed} computed)",
                e,
            )
        slots = cfg.num_drafting_slots  # the drafter's input rows per scheduled request
        used = sum(st.scheduled.values()) + slots * len(st.scheduled)
        if rules.token_budget and used + n + slots > cfg.max_num_batched_tokens:
            what = (
                f"take {used + n + slots} input rows ({sum(st.scheduled.values()) + n} tokens "
                f"and {slots} drafting slot(s) per scheduled request)"
                if slots
                else f"schedule {used + n} tokens"
            )
            raise self._fail(
                ArRule.TOKEN_BUDGET,
                f"step {st.index} would {what}; max_num_batched_tokens="
                f"{cfg.max_num_batched_tokens}",
                e,
            )
        if not cfg.enable_chunked_prefill and n - drafts != uncomputed:
            raise self._fail(
                ArRule.NO_CHUNKING_WHEN_DISABLED,
                f"{r.request_id!r} scheduled {n} of its {uncomputed} uncomputed tokens with "
                f"chunked prefill off",
                e,
            )
        limit = self._prefill_limit()
        if (
            limit
            and n > limit
            and not (self.policy.lone_request_threshold_exempt and self._is_alone())
        ):
            cap = f"long_prefill_token_threshold={cfg.long_prefill_token_threshold}"
            if limit != cfg.long_prefill_token_threshold:
                cap = (
                    f"{limit}, the adaptive floor max_num_batched_tokens="
                    f"{cfg.max_num_batched_tokens} // {len(self._running) + len(self._waiting)} "
                    f"requests over {cap}"
                )
            raise self._fail(
                ArRule.LONG_PREFILL_THRESHOLD, f"{r.request_id!r} scheduled {n} tokens > {cap}", e
            )
        if rules.token_cap is not None and n > rules.token_cap:
            raise self._fail(
                ArRule.TOKEN_FAIRNESS_CAP,
                f"{r.request_id!r} scheduled {n} tokens > cap {rules.token_cap}",
                e,
            )
        have = len(r.blocks) * cfg.block_size
        # and the drafter's lookahead slots past them, which vLLM caps at max_model_len
        need = min(r.num_computed + n + cfg.num_lookahead_tokens, cfg.max_model_len)
        if (
            cfg.num_lookahead_tokens
            and r.request_id in st.allocated
            and len(r.blocks) > cfg.blocks_for(need)
        ):
            # vLLM allocates up to the lookahead slots, never past them
            raise self._fail(
                ArRule.KV_BOUNDED,
                f"{r.request_id!r} was allocated blocks in step {st.index} up to {len(r.blocks)} "
                f"for {r.num_computed} computed + {n} scheduled tokens and "
                f"{cfg.num_lookahead_tokens} lookahead slot(s) (within max_model_len="
                f"{cfg.max_model_len}: {need} tokens, {cfg.blocks_for(need)} blocks)",
                e,
            )
        if have < max(need, r.num_computed + n):
            ahead = (
                f" and {cfg.num_lookahead_tokens} lookahead slot(s) (within max_model_len="
                f"{cfg.max_model_len}: {need} tokens)"
                if cfg.num_lookahead_tokens
                else ""
            )
            raise self._fail(
                ArRule.KV_COVERS_SCHEDULED,
                f"{r.request_id!r} computes {r.num_computed} + {n} tokens{ahead} but holds "
                f"{len(r.blocks)} blocks ({have} tokens)",
                e,
            )
        if self.policy.prefill_interval > 1:
            self._check_cadence(r, n, e)
        if r.phase in AR_QUEUED_PHASES:
            self._note_failed_reached(r)
            self._check_admission(r, e)
            if self._defers_adapter_skips():
                self._defer_passed_over(r)
            target = AR_REQUEST_LIFECYCLE.target(r.phase.value, "ar_scheduled")
            assert target is not None  # both queued phases allow it
            self._waiting.remove(r.request_id)
            self._running.append(r.request_id)
            r.phase = ArPhase(target)
            r.fresh = r.unpromoted = r.deferred = r.adapter_skipped = False
            st.admitted.append(r.request_id)
        st.scheduled[r.request_id] = n
        r.proposed = None  # scheduled: the proposal is spent (vLLM clears it)
        if drafts:
            st.drafts[r.request_id] = drafts
        if r.decoding_since is None and r.num_computed + n - drafts == r.known:
            r.decoding_since = self._decode_entries
            self._decode_entries += 1
        if cfg.enable_prefix_caching:
            self._register_cached(r, r.num_computed + n)
        self._touch(r)

    def _prefill_limit(self) -> int:
        """The most tokens one request may be scheduled in a step: the long-prefill threshold
        (0: none), floored at max_num_batched_tokens // (running + waiting) under
        `adaptive_long_prefill_threshold`. Within a step's scheduling phase the sum of running
        and waiting requests does not change (an admission or a preemption moves one across)."""
        cfg = self.config
        limit = cfg.long_prefill_token_threshold
        if limit and self.policy.adaptive_long_prefill_threshold:
            limit = max(
                limit, cfg.max_num_batched_tokens // (len(self._running) + len(self._waiting))
            )
        return limit

    def _is_alone(self) -> bool:
        """Nothing else is running or waiting (vLLM's lone-request threshold exemption)."""
        return len(self._running) + len(self._waiting) == 1

    def _binding_watermark(self) -> int:
        """The watermark an admission now must respect: the declared one, or 0 where it binds
        only beside a running request (`watermark_beside_running`) and none runs. Called
        before the admitted request joins the running ones."""
        if self.policy.watermark_beside_running and not self._running:
            return 0
        return self.watermark

    def _check_gates(self, r: _Req, e: ArScheduled) -> None:
        """The declared admission gates: full-sequence fit and the watermark. Blocks for this
        step's chunk are already allocated (they precede `ArScheduled`)."""
        cfg = self.config
        free = self.free_blocks
        mark = self._binding_watermark()
        if mark and free < mark:
            beside = f" beside running {self._running[:8]}" if self._running else ""
            raise self._fail(
                ArRule.ADMISSION_WATERMARK,
                f"admitting {r.request_id!r}{beside} leaves {free} free block(s) < watermark "
                f"{mark}",
                e,
            )
        if self.policy.full_sequence_admission:
            rest = cfg.blocks_for(r.known) - len(r.blocks)
            if rest + mark > free:
                above = f" above the watermark ({mark})" if mark else ""
                raise self._fail(
                    ArRule.FULL_SEQUENCE_ADMISSION,
                    f"admitted {r.request_id!r} whose whole sequence ({r.known} tokens) needs "
                    f"{rest} more block(s) than it holds, with {free} free{above}",
                    e,
                )

    def _progress_applies(self) -> bool:
        """Whether `admission_progress` is asked of this step: declared, under FCFS or
        priority without the rules that let a pass stop early (a cadence, a look-ahead, static
        batches, aging, a token cap, soft preemption), unpaused, and nothing preempted."""
        rules = self.rules
        return (
            self.policy.admission_progress
            and self.policy.prefill_interval <= 1
            and rules.admission in (AdmissionOrder.FCFS, AdmissionOrder.PRIORITY)
            and rules.token_budget
            and not (rules.static_batches or rules.soft_preemption)
            and rules.fcfs_lookahead is None
            and rules.max_wait_steps is None
            and rules.token_cap is None
            and self._pause == "unpaused"
            and not self._step.preempted
        )

    def _check_admission_progress(self, e: ArStepEnd, total: int) -> None:
        """`admission_progress` (declared): the step's schedule phase ends (`total` tokens
        scheduled, drafts included); the first waiting request the admission rules allow is
        still waiting only where it does not fit: whole, or with chunked prefill its first
        chunk."""
        cfg = self.config
        if len(self._running) >= cfg.max_num_seqs or not self._waiting:
            return
        if not self._progress_applies():
            return
        queue = self._admissible()
        if not queue:
            return
        by_key = self.rules.admission is AdmissionOrder.PRIORITY
        place = {q: i for i, q in enumerate(self._waiting)}

        def order(q: str) -> tuple[int, int]:  # the pass's order: the queue's, or the key's
            return admission_key(self.rules, self._requests[q]) if by_key else (0, place[q])

        queue.sort(key=order)
        r = self._requests[queue[0]]
        fit = self._progress_fit(r, total)
        if fit is None:
            return
        passed = sorted(
            (q for q in self._waiting if q not in queue and order(q) < order(queue[0])), key=order
        )
        over = f" (past {self._passed_over(passed)})" if passed else ""
        raise self._fail(
            ArRule.ADMISSION_PROGRESS,
            f"step {self._step.index} left {r.request_id!r} waiting, the first request the "
            f"admission rules allow{over}, though {fit}: a pass that stops only at a request "
            "it cannot admit admits it",
            e,
        )

    def _progress_fit(self, r: _Req, total: int) -> str | None:
        """How the waiting request `r` fits what the step (`total` tokens scheduled) left,
        said for `admission_progress`, or None where it may not fit. Whole: a seat, the
        budget for all its known tokens, the blocks for them. With chunked prefill, a chunk:
        the budget for one token, and blocks for what the chunk reaches at most (its cache
        hit and the budget left, or all its known tokens under the whole-sequence gate).
        Every bound is vLLM's largest, so a request that may not fit is never asked."""
        cfg = self.config
        rows = cfg.num_drafting_slots
        left = cfg.max_num_batched_tokens - total - rows * len(self._step.scheduled)
        # vLLM may pad a one-token request to a draft's length (its blocks then cover the
        # drafts too), and adds a drafter's rows and lookahead slots
        extra = cfg.num_speculative_tokens
        chunk = cfg.enable_chunked_prefill and r.known + extra + rows > left
        tokens = (1 if chunk else r.known) + extra + rows
        reach, hit = r.known, 0
        if chunk and not self.policy.full_sequence_admission:
            # a hit's evictable blocks leave the free ones too: the chunk starts past it
            hit = len(self._longest_hit(r)) * cfg.block_size if cfg.enable_prefix_caching else 0
            reach = min(r.known, hit + left - rows)
        slots = reach + extra + cfg.num_lookahead_tokens
        blocks = cfg.blocks_for(min(slots, cfg.max_model_len))
        mark = self._binding_watermark()
        free = self.free_blocks
        if tokens > left or blocks + mark > free:
            return None
        above = f" above the watermark ({mark})" if mark else ""
        seat = f"a seat free ({len(self._running)} of {cfg.max_num_seqs} running)"
        room = f"its {blocks} block(s) within the {free} free{above}"
        if not chunk:
            return (
                f"it fits whole: {seat}, its {tokens} token(s) within the {left} left of "
                f"the budget, {room}"
            )
        past = f" past its cache hit of {hit}" if hit else ""
        return (
            f"a chunk of it fits (chunked prefill): {seat}, {left} token(s) left of the "
            f"budget for its {r.known}{past}, {room}"
        )

    def _passed_over(self, rids: list[str]) -> str:
        """The waiting requests `rids` an admission pass passes over, each with why."""
        said = []
        for q in rids:
            r = self._requests[q]
            if r.awaiting is not None:
                said.append(f"{q!r}, awaiting its {r.awaiting}")
            elif r.lora is not None and self._adapter_blocked(r):
                said.append(f"{q!r}, whose adapter {r.lora} finds no room")
            else:
                said.append(repr(q))
        return "; ".join(said)

    def _check_soft_preemption_admission(self, r: _Req, e: ArEvent) -> None:
        """soft_preemption: a step that preempted gives a waiting request nothing."""
        st = self._step
        if self.rules.soft_preemption and st.preempted:
            raise self._fail(
                ArRule.SOFT_PREEMPTION,
                f"{r.request_id!r} (waiting) gets {type(e).__name__} in a step that preempted "
                f"{st.preempted}: under soft preemption a waiting request never evicts",
                e,
            )

    def _check_admission(self, r: _Req, e: ArScheduled) -> None:
        cfg, rules, st = self.config, self.rules, self._step
        self._check_soft_preemption_admission(r, e)
        self._check_gates(r, e)
        if r.phase is ArPhase.PREEMPTED and not rules.admit_after_preemption:
            raise self._fail(
                ArRule.NO_ADMISSION_AFTER_PREEMPTION,
                f"{r.request_id!r} re-admitted in the step that preempted it",
                e,
            )
        if st.preempted and not rules.admit_after_preemption:
            raise self._fail(
                ArRule.NO_ADMISSION_AFTER_PREEMPTION,
                f"admitted {r.request_id!r} in a step that preempted {st.preempted}",
                e,
            )
        if self._adapter_blocked(r):
            raise self._fail(
                ArRule.LORA_SLOTS,
                f"admitting {r.request_id!r} (LoRA adapter {r.lora}) makes the running requests "
                f"use adapters {sorted(self._adapters() | {r.lora or 0})}; "
                f"max_loras={cfg.max_loras}",
                e,
            )
        if len(self._running) + 1 > cfg.max_num_seqs:
            raise self._fail(
                ArRule.SEAT_CAP,
                f"admitting {r.request_id!r} makes {len(self._running) + 1} running; "
                f"max_num_seqs={cfg.max_num_seqs}",
                e,
            )
        if rules.static_batches:
            older = [q for q in self._running if q not in st.admitted]
            if older:
                raise self._fail(
                    ArRule.STATIC_BATCH,
                    f"admitted {r.request_id!r} while the batch {older} is still running",
                    e,
                )
            if self._batch_held:  # a new batch: the last one ended, an abort in this step too
                raise self._fail(
                    ArRule.TERMINAL_HOLDS_NOTHING,
                    f"admitted {r.request_id!r}, a new static batch, while {self._first_kept()} "
                    f"(of the batch that ended)",
                    e,
                )
        admissible = self._admissible()
        if rules.max_wait_steps is not None:
            queued = [self._requests[q] for q in admissible]
            aged = [q for q in queued if self._waited(q) >= rules.max_wait_steps]
            if aged:
                oldest = min(aged, key=lambda q: q.arrival)
                if oldest is not r:
                    raise self._fail(
                        ArRule.AGING_BOUND,
                        f"admitted {r.request_id!r} while {oldest.request_id!r} has waited "
                        f"{self._waited(oldest)} >= max_wait_steps={rules.max_wait_steps} steps",
                        e,
                    )
                return
        if rules.admission is AdmissionOrder.FCFS:
            if rules.fcfs_lookahead is not None:
                self._check_lookahead(r, e, rules.fcfs_lookahead)
            elif admissible[0] != r.request_id:
                passed = [q for q in self._waiting if q not in admissible]
                raise self._fail(
                    ArRule.FCFS_ADMISSION,
                    f"admitted {r.request_id!r} while {admissible[0]!r} is ahead of it "
                    f"(waiting {self._waiting[:8]}{' ...' if len(self._waiting) > 8 else ''}"
                    f"{f'; awaiting {passed[:8]}' if passed else ''})"
                    f"{self._order_note()}",
                    e,
                )
            return
        mine = admission_key(rules, r)
        best = min((self._requests[q] for q in admissible), key=lambda q: admission_key(rules, q))
        if mine != admission_key(rules, best):
            raise self._fail(
                ArRule.POLICY_ADMISSION,
                f"{rules.admission.value}: admitted {r.request_id!r} (key {mine}) while "
                f"{best.request_id!r} has key {admission_key(rules, best)}",
                e,
            )

    def _order_note(self) -> str:
        """How the declared cache-aware admission orders the queue, for FCFS messages."""
        p = self.policy
        if not p.cache_aware_window or not self.config.enable_prefix_caching:
            return ""
        usage = self._step.usage
        now = f"; usage {usage:.3g} at this step's admission" if usage is not None else ""
        last = (
            f"; last reordered in step {self._reordered_at}"
            if self._reordered_at is not None
            else "; never reordered yet"
        )
        return (
            f" (cache-aware: the first {p.cache_aware_window} never-scheduled waiting requests "
            f"deepest cached prefix first at usage >= {p.cache_aware_threshold:g}{now}{last})"
        )

    def _check_lookahead(self, r: _Req, e: ArScheduled, limit: int) -> None:
        """FCFS with look-ahead: at most `limit` waiting requests ahead of `r`, none of which
        fits. Every block `r` holds came in this step and no block is freed between a request
        passed over and `r`'s admission, so the pool had at least `free + len(r.blocks)` free
        when each of them was passed over."""
        admissible = set(self._admissible())  # awaiting and adapter-blocked ones passed over
        ahead = [
            self._requests[q]
            for q in self._waiting[: self._waiting.index(r.request_id)]
            if q in admissible
        ]
        if len(ahead) > limit:
            raise self._fail(
                ArRule.FCFS_ADMISSION,
                f"admitted {r.request_id!r} with {len(ahead)} waiting requests ahead of it "
                f"({[q.request_id for q in ahead][:8]}); fcfs_lookahead={limit}",
                e,
            )
        room = self.free_blocks + len(r.blocks) - self._binding_watermark()
        for q in ahead:
            need = self.config.blocks_for(q.known)
            if need <= room:
                raise self._fail(
                    ArRule.FCFS_ADMISSION,
                    f"admitted {r.request_id!r} past {q.request_id!r}, whose {q.known} known "
                    f"tokens need {need} block(s) and fit the {room} free above the watermark",
                    e,
                )

    def _preempted(self, e: ArPreempted) -> None:
        if e.reset:
            self._reset_preempted(e)
            return
        rules, st = self.rules, self._step
        r = self._active(e.request_id, e)
        if st.found_ready:
            raise self._fail(
                ArRule.AWAITING,
                f"{r.request_id!r} preempted after step {st.index}'s admission pass found "
                f"{st.found_ready} ready: no waiting pass runs in a step that preempts, and "
                "preemptions come before it",
                e,
            )
        self._check_pause(r, e)
        self._enter_schedule_phase(e)
        st.preempted_with_free |= self.free_blocks > 0  # `preemption_may_empty_step` reads it
        if r.phase is not ArPhase.RUNNING:
            raise self._fail(
                ArRule.LIFECYCLE, f"preempted {r.request_id!r}, which is not running", e
            )
        any_running = rules.victim is VictimOrder.LOWEST_PRIORITY_ANY
        if r.request_id in st.scheduled and not any_running:
            raise self._fail(
                ArRule.NO_PREEMPT_SCHEDULED,
                f"{r.request_id!r} was already scheduled {st.scheduled[r.request_id]} tokens in "
                f"step {st.index}",
                e,
            )
        if rules.victim is VictimOrder.NONE:
            raise self._fail(
                ArRule.PREEMPTION_VICTIM, "this scheduler declared that it never preempts", e
            )
        candidates = [
            self._requests[q] for q in self._running if any_running or q not in st.scheduled
        ]
        if rules.victim is VictimOrder.TAIL:
            expected = candidates[-1]
        elif rules.victim is VictimOrder.LAST_DECODING:
            decoding = [q for q in candidates if q.decoding_since is not None]
            if not decoding:
                raise self._fail(
                    ArRule.PREEMPTION_VICTIM,
                    f"preempted {r.request_id!r}, but no running request not scheduled in this "
                    f"step has completed its prefill (the last_decoding victims)",
                    e,
                )
            expected = max(decoding, key=lambda q: q.decoding_since or 0)
        else:
            expected = max(candidates, key=lambda q: (q.priority, q.arrival))
        if rules.soft_preemption:
            self._check_soft_preemption_needed(r, e)
        if expected is not r:
            raise self._fail(
                ArRule.PREEMPTION_VICTIM,
                f"preempted {r.request_id!r}; the {rules.victim.value} victim is "
                f"{expected.request_id!r}",
                e,
            )
        self._take_back(r, e)
        st.preempted.append(r.request_id)

    def _reset_preempted(self, e: ArPreempted) -> None:
        """An operator's cache reset preempts a running request between steps (`ArPreempted`
        with `reset`): no victim rule applies, and the next step may readmit it."""
        r = self._active(e.request_id, e)
        self._check_drafts_verified(e)
        if self._step.in_schedule_phase:
            raise self._fail(
                ArRule.LIFECYCLE,
                f"{r.request_id!r} preempted by a cache reset inside step {self._step.index}'s "
                f"schedule phase: a reset preempts between steps",
                e,
            )
        if r.phase is not ArPhase.RUNNING:
            raise self._fail(
                ArRule.LIFECYCLE, f"preempted {r.request_id!r}, which is not running", e
            )
        due = finish_reason(r)
        if due is not None:
            raise self._fail(
                ArRule.FINISH_RELEASED,
                f"{r.request_id!r} met its finish condition ({due.value}: {r.num_output} "
                "outputs) and was preempted by a cache reset instead of finishing",
                e,
            )
        if self._running[-1] != r.request_id:
            raise self._fail(
                ArRule.CACHE_RESET,
                f"a cache reset preempted {r.request_id!r} before {self._running[-1]!r}: it "
                "preempts the last running request first, so they wait in running order",
                e,
            )
        self._take_back(r, e)
        self._reset_pending.append(r.request_id)
        r.phase = ArPhase.WAITING  # between steps: it waits from now, the next step may admit it

    def _take_back(self, r: _Req, e: ArPreempted) -> None:
        """A preemption's effect: every block freed, the computed tokens discarded, the
        request at the head of the queue (in arrival order under a look-ahead)."""
        st = self._step
        for b in e.freed:
            if r.request_id not in self._holders.get(b, ()):
                raise self._fail(
                    ArRule.FREE_OWNED_ONLY,
                    f"{r.request_id!r} freed block {b}, held by {sorted(self._holders.get(b, ()))}",
                    e,
                )
        if len(set(e.freed)) != len(e.freed):
            raise self._fail(ArRule.FREE_OWNED_ONLY, f"blocks {list(e.freed)} freed twice", e)
        if sorted(e.freed) != sorted(r.blocks):
            raise self._fail(
                ArRule.PREEMPT_FREES_ALL,
                f"preempted {r.request_id!r} freed {sorted(e.freed)} of its blocks "
                f"{sorted(r.blocks)}",
                e,
            )
        self._drop_refs(r, e.freed)
        # LOWEST_PRIORITY_ANY: a victim scheduled in this step is unscheduled, its tokens
        # returned to the budget, and what that scheduling cached is uncached: the forward
        # never writes it.
        if st.in_schedule_phase and st.scheduled.pop(r.request_id, None) is not None:
            st.drafts.pop(r.request_id, None)  # a readmission in this step schedules anew
            self._uncache_unwritten(r)
        r.blocks.clear()
        r.num_computed = 0
        r.proposed = None  # vLLM drops a preempted request's drafts
        r.cached_upto = 0
        r.released = False
        r.phase = ArPhase.PREEMPTED
        r.wait_since = st.index
        r.decoding_since = None
        self._running.remove(r.request_id)
        if self.rules.fcfs_lookahead is None:
            self._waiting.insert(0, r.request_id)
        else:  # the look-ahead's queue is in arrival order
            place = sum(1 for q in self._waiting if self._requests[q].arrival < r.arrival)
            self._waiting.insert(place, r.request_id)
        self._touch(r)

    def _check_soft_preemption_needed(self, r: _Req, e: ArPreempted) -> None:
        """soft_preemption: some running request not yet scheduled needs a block for its next
        token and none is free."""
        cfg, st = self.config, self._step
        free = self.free_blocks
        short = [
            q
            for q in self._running
            if q not in st.scheduled
            and cfg.blocks_for(self._requests[q].num_computed + 1) - len(self._requests[q].blocks)
            > free
        ]
        if not short:
            raise self._fail(
                ArRule.SOFT_PREEMPTION,
                f"preempted {r.request_id!r} with {free} free block(s), enough for the next "
                f"token of every running request: under soft preemption only a running "
                f"request short of KV may cause a preemption",
                e,
            )

    # --- model execution --------------------------------------------------------
    def _step_end(self, e: ArStepEnd) -> None:
        cfg, rules, st = self.config, self.rules, self._step
        if e.step_index != st.index:
            raise self._fail(
                ArRule.STEP_ORDER, f"step {e.step_index} ended; expected step {st.index}", e
            )
        if not st.in_schedule_phase:
            self._check_finished_released(e)
            self._check_batch_end_released(e)
            self._check_reset_done(e)
            self._check_drafts_verified(e)
            self._check_failed_ended(e)
            self._begin_cadence()
        paused_all = self._pause == "paused_all"
        # a step that admitted nothing still reorders (vLLM), unless paused_all: vLLM's
        # waiting-queue pass, which reorders, is skipped then
        if not paused_all:
            self._start_admission_pass()
        total = sum(st.scheduled.values())
        # declared (vLLM v0's recompute): a step whose preemptions, each made with no block
        # free, left nothing running; the next step then has nothing to preempt, and schedules
        emptied = (
            rules.preemption_may_empty_step
            and bool(st.preempted)
            and not st.preempted_with_free
            and not self._running
        )
        # paused: nothing is asked of a step (paused_all) or of the waiting requests (paused_new)
        asked = {
            "unpaused": bool(self._running or self._admissible()),
            "paused_new": bool(self._running),
        }
        if total == 0 and asked.get(self._pause, False) and not emptied:
            awaiting = len(self._waiting) - len(self._admissible())
            raise self._fail(
                ArRule.PROGRESS,
                f"step {st.index} scheduled nothing with {len(self._running)} running and "
                f"{len(self._waiting)} waiting"
                + (f" ({awaiting} of them awaiting)" if awaiting else ""),
                e,
            )
        self._check_admission_progress(e, total)
        if (
            rules.token_floor
            and len(self._running) <= cfg.max_num_batched_tokens
            and self._pause != "paused_all"
        ):
            starved = [q for q in self._running if q not in st.scheduled]
            if starved:
                raise self._fail(
                    ArRule.TOKEN_FAIRNESS_FLOOR,
                    f"running {starved} got no token in step {st.index}",
                    e,
                )
        for rid, n in st.scheduled.items():
            r = self._requests[rid]
            if len(r.blocks) * cfg.block_size < r.num_computed + n:
                raise self._fail(
                    ArRule.KV_COVERS_SCHEDULED,
                    f"{rid!r} computes {r.num_computed} + {n} tokens but holds {len(r.blocks)} "
                    f"blocks at the end of the step",
                    e,
                )
            drafts = st.drafts.get(rid, 0)
            r.outputs_before_step = r.num_output
            r.num_computed += n
            r.attained += n - drafts  # the drafts count once verified, those accepted
            if r.num_computed - drafts == r.known:
                r.num_output += 1  # caught up: the model samples the next token
                r.output_step = st.index
                if self.policy.hash_lookahead_tokens and cfg.enable_prefix_caching and not drafts:
                    # the sampled token may complete a block's key: vLLM publishes the blocks
                    # of its computed tokens as it takes the output (a drafted request's at
                    # its verification)
                    self._register_cached(r, r.num_computed)
            if drafts:
                r.drafts = drafts
                self._unverified.add(rid)
            self._touch(r)
        for rid in st.preempted:
            victim = self._requests.get(rid)
            if victim is not None and victim.phase is ArPhase.PREEMPTED:
                victim.phase = ArPhase.WAITING
                self._touch(victim)
        if self._defers_adapter_skips():
            self._defer_skipped_at_end(total)
        if not paused_all:  # vLLM leaves its prefill cadence untouched in a paused_all step
            self._end_cadence(total, bool(st.preempted))
        if total == 0 and not self._running and not st.preempted and self._pause == "unpaused":
            self._note_failed_reached(None)  # the pass went through the queue's head
        self._last_reached_failed = st.reached_failed
        self._step = _Step(index=st.index + 1)

    # --- update phase -----------------------------------------------------------
    def _blocks_freed(self, e: ArBlocksFreed) -> None:
        rid = e.request_id
        r = self._requests.get(rid)
        if r is None and rid in self._batch_held:
            r = self._batch_held[rid]  # declared: a finished request frees at its batch's end
        elif r is None and rid in self._ended:
            raise self._fail(
                ArRule.FREE_OWNED_ONLY,
                f"{rid!r} ({self._ended[rid][0].value}, holding nothing) freed blocks "
                f"{list(e.blocks)} (double free or foreign)",
                e,
            )
        else:
            r = self._active(rid, e)
        if r.drafts:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{rid!r} freed blocks {list(e.blocks)} before its {r.drafts} draft(s) of step "
                f"{self._step.index - 1} were verified (vLLM rolls the rejected drafts back "
                "before it frees)",
                e,
            )
        if not e.blocks or len(set(e.blocks)) != len(e.blocks):
            raise self._fail(
                ArRule.FREE_OWNED_ONLY, f"blocks {list(e.blocks)} empty or repeated", e
            )
        for b in e.blocks:
            holders = self._holders.get(b, set())
            if rid not in holders:
                what = "free" if not holders else f"held by {sorted(holders)}"
                raise self._fail(
                    ArRule.FREE_OWNED_ONLY,
                    f"{rid!r} freed block {b}, which is {what} (double free or foreign)",
                    e,
                )
        gone = set(e.blocks)
        # the first position freed: the blocks after it shift down, so what they held (computed
        # tokens, cache registrations) no longer lines up with the request's tokens
        first = min(k for k, b in enumerate(r.blocks) if b in gone)
        if r.phase is not ArPhase.FINISHED:
            self._check_free_keeps_computed(r, e, first)
        self._drop_refs(r, e.blocks)
        r.blocks = [b for b in r.blocks if b not in gone]
        r.cached_upto = min(r.cached_upto, first)
        if r.phase is ArPhase.FINISHED:
            if not r.blocks:
                del self._batch_held[rid]
            return
        self._touch(r)

    def _check_free_keeps_computed(self, r: _Req, e: ArBlocksFreed, first: int) -> None:
        """kv_covers_computed, at a free: the blocks holding computed tokens go back all at
        once. A queued request giving back all it took (a cache hit included) holds nothing and
        has computed nothing again; a running one that does may only finish or be aborted next.
        A request keeping some blocks frees only blocks past its computed tokens: freeing one
        before them would leave computed tokens with no KV, or blocks never written at their
        positions (which the cache would then register as that content). kv_covers_scheduled,
        in the schedule phase that scheduled it: it keeps the blocks this step's forward uses,
        or frees all it holds and leaves the batch, what its scheduling cached then uncached."""
        bs = self.config.block_size
        st = self._step
        n = st.scheduled.get(r.request_id) if st.in_schedule_phase else None
        if len(e.blocks) == len(r.blocks):
            if n is not None:  # it leaves the batch (an abort or finish must follow)
                self._uncache_unwritten(r, "it freed its blocks in that step")
            if r.phase is ArPhase.RUNNING:
                r.released = r.released or r.num_computed > 0 or n is not None
            else:
                r.num_computed = 0
            return
        if n is not None and first * bs < r.num_computed + n:
            # its forward of this step writes (and reads) those blocks
            raise self._fail(
                ArRule.KV_COVERS_SCHEDULED,
                f"{r.request_id!r} was scheduled {n} tokens in step {st.index} after "
                f"{r.num_computed} computed, and then freed block {r.blocks[first]}, its block "
                f"{first}, which that step's forward uses, keeping "
                f"{[b for b in r.blocks if b not in set(e.blocks)]}",
                e,
            )
        if first * bs < r.num_computed:
            raise self._fail(
                ArRule.KV_COVERS_COMPUTED,
                f"{r.request_id!r} ({r.phase.value}, {r.num_computed} computed tokens in blocks "
                f"{r.blocks}) freed block {r.blocks[first]}, its block {first}, and keeps "
                f"{[b for b in r.blocks if b not in set(e.blocks)]}: the blocks holding computed "
                f"tokens are freed all at once (a preemption, a finish, an abort); only blocks "
                f"from position {-(-r.num_computed // bs)} on may be freed alone",
                e,
            )

    def _check_not_released(self, r: _Req, e: ArEvent) -> None:
        """A running request that gave back the blocks of its computed tokens takes nothing
        again: it finishes or is aborted (only a preemption makes it recompute)."""
        if r.released:
            raise self._fail(
                ArRule.KV_COVERS_COMPUTED,
                f"running {r.request_id!r} freed all its blocks ({r.num_computed} computed "
                f"tokens, or scheduled in this step) and then got {type(e).__name__}: after "
                f"such a free it may only finish or be aborted (a preemption would make it "
                f"recompute)",
                e,
            )

    # --- speculative decoding --------------------------------------------------
    def _check_drafts(self, r: _Req, e: ArScheduled) -> int:
        """`speculative_drafts`, at scheduling: the step's draft tokens of `r` (`e.drafts`)
        number at most `num_speculative_tokens`, follow every known token and leave one known
        token before them (the last, which the drafts continue)."""
        d, n = e.drafts, e.num_tokens
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise self._fail(ArRule.SPECULATIVE_DRAFTS, f"drafts={d!r}: an integer >= 0", e)
        if d == 0:
            return 0
        k = self.config.num_speculative_tokens
        if d > k:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{r.request_id!r} scheduled {d} draft token(s); num_speculative_tokens={k}"
                + (" (speculative decoding is off)" if k == 0 else ""),
                e,
            )
        # (a waiting request's drafts are vLLM's padding of a new decode, proposed by none)
        if self._proposals_named and r.phase is ArPhase.RUNNING and d > (r.proposed or 0):
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{r.request_id!r} scheduled {d} draft token(s); the drafter proposed "
                f"{r.proposed or 0} for this step (ar_drafts_proposed): a step schedules at most "
                "the drafts proposed since the request was last scheduled",
                e,
            )
        if r.num_computed + n > self.config.max_model_len - 1:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{r.request_id!r} scheduled {n} tokens with {d} draft(s) after "
                f"{r.num_computed} computed: positions up to {r.num_computed + n - 1}, past "
                f"max_model_len={self.config.max_model_len} less the one the step samples "
                "(vLLM trims the drafts to fit)",
                e,
            )
        if r.num_computed + n - d != r.known:  # (a running request knows one uncomputed)
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{r.request_id!r} scheduled {n} tokens with {d} draft(s) after "
                f"{r.num_computed} computed of {r.known} known: drafts follow every known "
                f"token, the last included (its {r.known - r.num_computed} uncomputed, then "
                "the drafts)",
                e,
            )
        return d

    def _check_drafts_verified(self, event: ArEvent) -> None:
        """`speculative_drafts`: the drafts a step computed are verified before anything but
        the update phase's events happens."""
        if self._unverified:
            pending = sorted(self._unverified)
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"the drafts of {pending} computed in step {self._step.index - 1} were never "
                "verified (ar_drafts_verified follows the step, before the next is scheduled)",
                event,
            )

    def _drafts_verified(self, e: ArDraftsVerified) -> None:
        """`speculative_drafts`: the model kept `accepted` of the drafts the last step
        computed, as outputs after the token it sampled; the rest are no longer computed (their
        blocks stay held, to be overwritten). The accepted tokens' KV is computed now, so with
        prefix caching their full blocks are cached (vLLM caches after the output)."""
        r = self._active(e.request_id, e)
        st, a = self._step, e.accepted
        # (a request with drafts runs: every way out of running checks them verified first)
        if r.drafts == 0:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{r.request_id!r}'s drafts verified after step {st.index - 1}, which scheduled "
                "none of its drafts",
                e,
            )
        if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a <= r.drafts:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{r.request_id!r} accepted {a!r} of the {r.drafts} draft(s) step "
                f"{st.index - 1} verified",
                e,
            )
        end = r.max_tokens if r.stop_after is None else min(r.max_tokens, r.stop_after)
        if r.num_output + a > end:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{r.request_id!r} accepted {a} draft(s) after {r.num_output} outputs: past its "
                f"end at {end} (max_tokens={r.max_tokens}, stop_after={r.stop_after}); the "
                "tokens past the end are cut, and rolled back with the rejected ones",
                e,
            )
        r.num_computed -= r.drafts - a
        r.num_output += a
        r.attained += a
        r.drafts = 0
        self._unverified.discard(r.request_id)
        if self.config.enable_prefix_caching:
            self._register_cached(r, r.num_computed)
        self._touch(r)

    def _drafts_proposed(self, e: ArDraftsProposed) -> None:
        """`speculative_drafts`: between steps, after the drafts of the step that just ended
        were verified, the drafter proposed 1 to `num_speculative_tokens` drafts for a
        running request that decodes (vLLM ignores drafts for a prefill chunk); they replace
        any proposed before, and from now on every scheduled draft must be proposed."""
        r = self._active(e.request_id, e)
        rid, d, k = r.request_id, e.drafts, self.config.num_speculative_tokens
        self._check_drafts_verified(e)
        if self._step.in_schedule_phase:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"drafts proposed for {rid!r} inside step {self._step.index}'s schedule phase: "
                "the drafter proposes between steps, after the update phase",
                e,
            )
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= k:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{rid!r} proposed drafts={d!r}: an integer in [1, num_speculative_tokens={k}]"
                + (" (speculative decoding is off)" if k == 0 else ""),
                e,
            )
        if r.phase is not ArPhase.RUNNING or r.num_output == 0 or r.num_computed < r.known - 1:
            what = "is not running" if r.phase is not ArPhase.RUNNING else "is in its prefill"
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"drafts proposed for {rid!r}, which {what}: a drafter proposes for a running "
                "request that decodes (vLLM ignores drafts for a prefill chunk)",
                e,
            )
        r.proposed = d
        self._proposals_named = True
        self._touch(r)

    def _output_tokens(self, e: ArOutputTokens) -> None:
        """`output_tokens`: in the update phase of the step that produced them (after its
        `ArDraftsVerified`), the ids of the request's outputs that no earlier event named. The
        blocks it cached under keys covering them while they were private (the step end's
        lookahead publication, the verification's registration; none another request could
        hit) are keyed by them now, held still or freed."""
        r = self._active(e.request_id, e)
        rid, named, tokens = r.request_id, len(r.output_ids), e.tokens
        last = self._step.index - 1  # the step that just ended
        which = f"output {named + 1}" + (f"..{named + len(tokens)}" if len(tokens) > 1 else "")
        if self._step.in_schedule_phase:
            raise self._fail(
                ArRule.OUTPUT_TOKENS,
                f"{rid!r}'s {which} named inside step {self._step.index}'s schedule phase: a "
                "step's outputs are named in its update phase, before the next is scheduled",
                e,
            )
        bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int)]
        if bad:
            raise self._fail(
                ArRule.OUTPUT_TOKENS, f"{rid!r}'s output ids {bad} are not integers", e
            )
        if r.drafts:
            raise self._fail(
                ArRule.OUTPUT_TOKENS,
                f"{rid!r}'s {which} named before its {r.drafts} draft(s) of step {last} were "
                "verified: the accepted drafts are outputs too, named after ar_drafts_verified",
                e,
            )
        if named + len(tokens) > r.num_output:
            raise self._fail(
                ArRule.OUTPUT_TOKENS,
                f"{rid!r} names the id of its {which} but has produced {r.num_output} (named "
                f"so far: {named}; each output is named once)",
                e,
            )
        if tokens and (r.output_step != last or named < r.outputs_before_step):
            produced = (
                f"step {r.output_step}" if named >= r.outputs_before_step else "an earlier step"
            )
            raise self._fail(
                ArRule.OUTPUT_TOKENS,
                f"{rid!r} names the id of its {which}, produced in {produced} ({r.num_output} "
                f"outputs, {named} named): a step's outputs are named in its update phase "
                f"(after step {last} here), or never",
                e,
            )
        first = r.prompt_len + named  # the first token whose id is new
        before = {k: self._key(r, k) for k in r.private_keyed}
        r.output_ids.extend(tokens)
        del r.keys[first // self.config.block_size :]
        for k, blocks in list(r.private_keyed.items()):
            new = self._key(r, k)
            for b in blocks:
                if self._cache.get(b) == before[k]:
                    self._cache_put(b, new)
                    self._dirty_blocks.add(b)
            if not self._covers_unnamed(r, k):
                del r.private_keyed[k]
        self._touch(r)

    def _finished(self, e: ArFinished) -> None:
        r = self._active(e.request_id, e)
        if r.phase is not ArPhase.RUNNING:
            raise self._fail(
                ArRule.LIFECYCLE, f"{r.request_id!r} finished while {r.phase.value}", e
            )
        if r.drafts:
            raise self._fail(
                ArRule.SPECULATIVE_DRAFTS,
                f"{r.request_id!r} finished before its {r.drafts} draft(s) of step "
                f"{self._step.index - 1} were verified (ar_drafts_verified comes first: the "
                "accepted drafts are outputs the finish condition counts)",
                e,
            )
        due = finish_reason(r)
        if r.stop_sampled and e.reason is ArFinishReason.STOP:
            # the model sampled the end token as the output token of the step that just ended
            if r.output_step != self._step.index - 1 or self._step.in_schedule_phase:
                raise self._fail(
                    ArRule.FINISH_CONDITION,
                    f"{r.request_id!r} finished with reason stop but produced no output token "
                    f"in the step that just ended (its last was in step {r.output_step})",
                    e,
                )
            due = ArFinishReason.STOP
        if due is None:
            raise self._fail(
                ArRule.FINISH_CONDITION,
                f"{r.request_id!r} finished with {r.num_output}/{r.max_tokens} outputs and no "
                f"end token (stop_after={r.stop_after})",
                e,
            )
        allowed = {due}
        if r.num_output >= r.max_tokens:
            allowed.add(ArFinishReason.LENGTH)
        if e.reason not in allowed:
            raise self._fail(
                ArRule.FINISH_CONDITION, f"reason {e.reason.value}; what holds is {due.value}", e
            )
        if r.blocks and not self.rules.free_at_batch_end:
            raise self._fail(
                ArRule.TERMINAL_HOLDS_NOTHING,
                f"{r.request_id!r} finished still holding blocks {r.blocks}",
                e,
            )
        self._running.remove(r.request_id)
        self._step.scheduled.pop(r.request_id, None)
        self._step.drafts.pop(r.request_id, None)
        self._retire(r, ArPhase.FINISHED)
        if r.blocks:  # declared: it keeps them until its static batch ends
            self._batch_held[r.request_id] = r

    # ------------------------------------------------------------------ checks
    def check_invariants(self, between_steps: bool = False) -> None:
        """The named invariants, over what changed since the last check (see
        `check_invariants_full` for the same check over the whole state)."""
        failure = self._incremental_failure(between_steps)
        if failure is not None:
            raise self._fail(failure[0], failure[1], None)

    def check_invariants_full(self, between_steps: bool = False) -> None:
        """The named invariants over the whole state (`spec.ar.invariants.check_all`)."""
        failure = check_all(self.state(), between_steps)
        if failure is not None:
            raise self._fail(ArRule(failure[0]), failure[1], None)
        if between_steps:
            self._check_batch_end_released(None)

    def _incremental_failure(self, between_steps: bool) -> tuple[ArRule, str] | None:
        cfg = self.config
        reqs = [self._requests[q] for q in self._dirty if q in self._requests]
        blocks = list(self._dirty_blocks)
        self._dirty.clear()
        self._dirty_blocks.clear()
        # block_conservation, over the (request, block) pairs events changed: the block is in
        # the request's table exactly when the request is among its holders (free + referenced
        # = usable follows: free is the rest of the pool).
        pairs = list(self._dirty_pairs)
        self._dirty_pairs.clear()
        for rid, b in pairs:
            if not 0 <= b < cfg.num_blocks:
                return ArRule.BLOCK_CONSERVATION, f"block {b} outside the pool"
            r = self._requests.get(rid) or self._batch_held.get(rid)
            listed = r is not None and b in r.blocks
            held = rid in self._holders.get(b, ())
            if listed != held:
                where = "lists" if listed else "does not list"
                return (
                    ArRule.BLOCK_CONSERVATION,
                    f"{rid!r} {where} block {b}, held by {sorted(self._holders.get(b, ()))}",
                )
        if not cfg.enable_prefix_caching:
            for b in blocks:
                if len(self._holders.get(b, ())) > 1:
                    return (
                        ArRule.KV_EXCLUSIVE,
                        f"block {b} is held by {sorted(self._holders[b])} with prefix caching off",
                    )
        null = cfg.null_block
        if null is not None and null in self._holders:
            return ArRule.NULL_BLOCK_RESERVED, f"the null block {null} is held"
        for r in reqs:
            if (
                r.phase is ArPhase.PREEMPTED
                and (r.blocks or r.num_computed)
                and not self.rules.admit_after_preemption
            ):
                return (
                    ArRule.PREEMPTED_HOLDS_NOTHING,
                    f"preempted request {r.request_id!r} holds blocks {list(r.blocks)} and "
                    f"{r.num_computed} computed tokens",
                )
        if len(self._running) > cfg.max_num_seqs:
            return (
                ArRule.SEAT_CAP,
                f"{len(self._running)} running > max_num_seqs={cfg.max_num_seqs}",
            )
        cap = cfg.max_blocks_per_request
        for r in reqs:
            if len(r.blocks) > cap:
                return (
                    ArRule.KV_BOUNDED,
                    f"{r.request_id!r} holds {len(r.blocks)} blocks; max_model_len needs at "
                    f"most {cap}",
                )
        if not between_steps:
            return None
        kept = self._batch_end_failure()
        if kept is not None:
            return ArRule.TERMINAL_HOLDS_NOTHING, kept
        between = [self._requests[q] for q in self._dirty_between if q in self._requests]
        self._dirty_between.clear()
        for rid in self._running:
            r = self._requests[rid]
            if len(r.blocks) * cfg.block_size < r.num_computed:
                return (
                    ArRule.KV_COVERS_COMPUTED,
                    f"running {rid!r} computed {r.num_computed} tokens but holds only "
                    f"{len(r.blocks)} blocks of {cfg.block_size}",
                )
        for r in between:
            if r.phase in AR_QUEUED_PHASES and (r.blocks or r.num_computed):
                return (
                    ArRule.WAITING_HOLDS_NOTHING,
                    f"waiting {r.request_id!r} holds blocks {list(r.blocks)} / "
                    f"{r.num_computed} computed tokens between steps",
                )
        return None

    def _holders_differ(self, snap: ArSnapshot) -> bool:
        mine = self._holders
        if snap.block_holders is None:  # exclusive blocks: compare owners without copies
            owners = snap.block_owners
            if len(owners) != len(mine):
                return True
            for b, rid in owners.items():
                h = mine.get(b)
                if h is None or len(h) != 1 or rid not in h:
                    return True
            return False
        theirs = snap.block_holders
        return len(theirs) != len(mine) or any(set(h) != mine.get(b) for b, h in theirs.items())

    def check_snapshot(self, snap: ArSnapshot) -> None:
        """Between steps: the implementation's pools and queues equal the abstract state, and
        no running request is overdue to finish. Raises SpecViolation; `snapshot_matches` also
        when `snap` is not an `ArSnapshot` or a field is not of its declared container type (any
        set where a frozenset is declared, a list where a tuple is), named in one line."""
        if not isinstance(snap, ArSnapshot):
            raise self._fail(
                ArRule.SNAPSHOT_MATCHES,
                f"snapshot() returned {type(snap).__name__}, not a spec.ar.ArSnapshot",
                None,
            )
        wrong = wrong_container(snap, AR_SNAPSHOT_FIELDS)
        if wrong is not None:  # a set of running ids has no order to compare
            raise self._fail(ArRule.SNAPSHOT_MATCHES, wrong, None)
        self.check_invariants(between_steps=True)
        self._check_finished_released(None)
        cfg = self.config
        if snap.block_refcounts is not None:
            bad = {
                b: (n, len(self._holders.get(b, ())))
                for b, n in snap.block_refcounts.items()
                if n != len(self._holders.get(b, ()))
            }
            bad.update(
                {b: (0, len(h)) for b, h in self._holders.items() if b not in snap.block_refcounts}
            )
            if bad:
                raise self._fail(
                    ArRule.REFCOUNT_MATCHES,
                    f"reference counts differ (block: implementation, holders in the spec): "
                    f"{dict(sorted(bad.items()))}",
                    None,
                )
        problems: list[str] = []
        null = cfg.null_block
        spec_free = {b for b in range(cfg.num_blocks) if b != null and b not in self._holders}
        if snap.free_blocks != spec_free:
            problems.append(
                f"free blocks differ: implementation also frees "
                f"{sorted(snap.free_blocks - spec_free)}, lacks "
                f"{sorted(spec_free - snap.free_blocks)}"
            )
        if self._holders_differ(snap):
            holders = snap.holders()
            diff = {
                b: (sorted(holders.get(b, ())), sorted(self._holders.get(b, ())))
                for b in set(holders) | set(self._holders)
                if set(holders.get(b, ())) != self._holders.get(b, set())
            }
            problems.append(f"block holders differ (block: implementation, spec): {diff}")
        if snap.cached_blocks is not None and snap.cached_blocks != set(self._cache):
            unwritten = [
                f"block {b}: {self._unwritten[b]}"
                for b in sorted(snap.cached_blocks - set(self._cache))
                if b in self._unwritten
            ]
            problems.append(
                f"cached blocks differ: implementation {sorted(snap.cached_blocks)}, spec "
                f"{sorted(self._cache)}" + (f" ({'; '.join(unwritten)})" if unwritten else "")
            )
        if set(snap.running) != set(self._running) or len(snap.running) != len(self._running):
            problems.append(
                f"running differs: implementation {list(snap.running)}, spec {self._running}"
            )
        if len(snap.waiting) != len(self._waiting) or set(snap.waiting) != set(self._waiting):
            problems.append(
                f"waiting differs: implementation {list(snap.waiting)}, spec {self._waiting}"
            )
        active = {rid: self._requests[rid].num_computed for rid in self._running}
        active.update({rid: 0 for rid in self._waiting})
        if dict(snap.num_computed) != active:
            problems.append(
                f"computed tokens differ: implementation {dict(snap.num_computed)}, spec {active}"
            )
        if problems:
            raise self._fail(ArRule.SNAPSHOT_MATCHES, "; ".join(problems), None)
        if self.rules.admission is AdmissionOrder.FCFS and list(snap.waiting) != self._waiting:
            raise self._fail(
                ArRule.WAITING_ORDER,
                f"implementation queue {list(snap.waiting)}, FCFS order {self._waiting}"
                f"{self._order_note()}",
                None,
            )


ArSpecMachine.handlers = MappingProxyType(
    {
        ArSubmitted: ArSpecMachine._submitted,
        ArCacheHit: ArSpecMachine._cache_hit,
        ArCacheEvicted: ArSpecMachine._cache_evicted,
        ArBlocksAllocated: ArSpecMachine._blocks_allocated,
        ArScheduled: ArSpecMachine._scheduled,
        ArPreempted: ArSpecMachine._preempted,
        ArStepEnd: ArSpecMachine._step_end,
        ArBlocksFreed: ArSpecMachine._blocks_freed,
        ArFinished: ArSpecMachine._finished,
        ArAborted: ArSpecMachine._aborted,
        ArPauseSet: ArSpecMachine._pause_set,
        ArCacheReset: ArSpecMachine._cache_reset,
        ArDraftsVerified: ArSpecMachine._drafts_verified,
        ArDraftsProposed: ArSpecMachine._drafts_proposed,
        ArOutputTokens: ArSpecMachine._output_tokens,
        ArAwaiting: ArSpecMachine._awaiting,
        ArReady: ArSpecMachine._ready,
        ArInputFailed: ArSpecMachine._input_failed,
    }
)

__all__ = ["ArSpecMachine", "admission_key", "finish_reason"]
