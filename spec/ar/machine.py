"""`ArSpecMachine`: replays AR scheduler events against the specification.

Each event must be enabled in the current abstract state; otherwise `apply` raises a
`SpecViolation` naming the rule (see `spec.ar.rules`), the event and the state before it.
`check_snapshot` compares the implementation's own pools and queues with the abstract state
between steps; `check_invariants` evaluates the named state invariants.

Token accounting (vLLM v1's): a request knows prompt_len + num_output tokens; it has computed
num_computed of them. A step computes the scheduled tokens; a request that caught up with its
known tokens samples one output token. Preemption discards every computed token (recompute:
the outputs so far are folded into what must be prefilled again, as Vidur's restart does).
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from spec.ar.config import (
    AdmissionOrder,
    ArConfig,
    ArRequest,
    ArRules,
    VictimOrder,
    validate_ar_request,
)
from spec.ar.events import (
    ArAborted,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.invariants import check_all
from spec.ar.lifecycles import (
    AR_ACTIVE_PHASES,
    AR_QUEUED_PHASES,
    AR_REQUEST_LIFECYCLE,
    ArPhase,
)
from spec.ar.profile import ArPolicy
from spec.ar.snapshot import ArSnapshot
from spec.ar.state import ArRequestState, ArState, render
from spec.errors import RequestError, SpecViolation


@dataclass(slots=True)
class _Req:
    request_id: str
    arrival: int
    prompt_len: int
    max_tokens: int
    stop_after: int | None
    priority: int
    predicted_len: int | None
    phase: ArPhase = ArPhase.WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    attained: int = 0
    waited: int = 0

    @property
    def known(self) -> int:
        return self.prompt_len + self.num_output

    @property
    def expected_output(self) -> int:
        return self.max_tokens if self.predicted_len is None else self.predicted_len


@dataclass(slots=True)
class _Step:
    index: int = 0
    scheduled: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    in_schedule_phase: bool = False


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


class ArSpecMachine:
    """The executable specification of an autoregressive scheduler, driven by events."""

    def __init__(self, config: ArConfig, policy: ArPolicy | ArRules | None = None) -> None:
        """`policy`: the implementation's declared `ArPolicy` (its options are parameters of the
        rules); a bare `ArRules` (older callers) is the policy with those rules and every option
        off; None is the idealised spec under `config.policy`."""
        self.config = config
        if isinstance(policy, ArRules):
            policy = ArPolicy(rules=policy)
        self.policy = policy if policy is not None else ArPolicy()
        self.rules = self.policy.rules_for(config)
        self.watermark = self.policy.watermark_blocks(config)
        self._requests: dict[str, _Req] = {}
        self._waiting: list[str] = []
        self._running: list[str] = []
        self._owner: dict[int, str] = {}
        self._step = _Step()
        self._arrivals = 0
        self.events_applied = 0

    # ------------------------------------------------------------------ views
    def state(self) -> ArState:
        reqs = {
            rid: ArRequestState(
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
                r.waited,
            )
            for rid, r in self._requests.items()
        }
        return ArState(
            config=self.config,
            rules=self.rules,
            requests=reqs,
            waiting=tuple(self._waiting),
            running=tuple(self._running),
            block_owners=dict(self._owner),
            step_index=self._step.index,
            scheduled=dict(self._step.scheduled),
            preempted=tuple(self._step.preempted),
        )

    def render(self) -> str:
        return render(self.state())

    def copy(self) -> ArSpecMachine:
        return _copy.deepcopy(self)

    @property
    def step_index(self) -> int:
        return self._step.index

    def is_idle(self) -> bool:
        return not self._waiting and not self._running

    def request_phase(self, request_id: str) -> ArPhase | None:
        r = self._requests.get(request_id)
        return None if r is None else r.phase

    def outputs(self) -> dict[str, int]:
        """Output tokens produced by every finished request."""
        return {
            rid: r.num_output for rid, r in self._requests.items() if r.phase is ArPhase.FINISHED
        }

    # ------------------------------------------------------------------ errors
    def _fail(self, rule: str, detail: str, event: object | None) -> SpecViolation:
        return SpecViolation(rule, detail, event, self.render())

    def _get(self, request_id: str, event: ArEvent) -> _Req:
        r = self._requests.get(request_id)
        if r is None:
            raise self._fail("known_request", f"request {request_id!r} was never submitted", event)
        return r

    def _active(self, request_id: str, event: ArEvent) -> _Req:
        r = self._get(request_id, event)
        if r.phase not in AR_ACTIVE_PHASES:
            raise self._fail("known_request", f"request {request_id!r} is {r.phase.value}", event)
        return r

    # ------------------------------------------------------------------ replay
    def apply_all(self, events: Iterable[ArEvent]) -> None:
        for e in events:
            self.apply(e)

    def apply(self, event: ArEvent) -> None:
        """Check that `event` is enabled and apply its effect; raise SpecViolation if not."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise self._fail("lifecycle", f"unknown event type {type(event).__name__}", event)
        handler(self, event)
        self.events_applied += 1

    def enabled(self, event: ArEvent) -> str | None:
        """None if `event` is enabled now, else the name of the rule it would break."""
        try:
            self.copy().apply(event)
        except SpecViolation as v:
            return v.rule
        return None

    def _enter_schedule_phase(self, event: ArEvent) -> None:
        st = self._step
        if st.in_schedule_phase:
            return
        self._check_finished_released(event)
        st.in_schedule_phase = True

    def _check_finished_released(self, event: ArEvent | None) -> None:
        for rid in self._running:
            r = self._requests[rid]
            due = finish_reason(r)
            if due is not None:
                raise self._fail(
                    "finish_released",
                    f"{rid!r} met its finish condition ({due.value}: {r.num_output} outputs) "
                    f"but is still running",
                    event,
                )

    # --- between steps --------------------------------------------------------
    def _submitted(self, e: ArSubmitted) -> None:
        if e.request_id in self._requests:
            raise self._fail("unique_submission", f"{e.request_id!r} submitted twice", e)
        req = ArRequest(
            e.request_id, e.prompt_len, e.max_tokens, e.stop_after, e.priority, e.predicted_len
        )
        try:
            validate_ar_request(self.config, req)
        except RequestError as err:
            raise self._fail("valid_request", f"accepted an invalid request: {err}", e) from None
        self._requests[e.request_id] = _Req(
            e.request_id,
            self._arrivals,
            e.prompt_len,
            e.max_tokens,
            e.stop_after,
            e.priority,
            e.predicted_len,
        )
        self._arrivals += 1
        self._waiting.append(e.request_id)

    def _aborted(self, e: ArAborted) -> None:
        r = self._active(e.request_id, e)
        if r.blocks:
            raise self._fail(
                "terminal_holds_nothing",
                f"{r.request_id!r} aborted still holding blocks {r.blocks}",
                e,
            )
        if r.request_id in self._waiting:
            self._waiting.remove(r.request_id)
        if r.request_id in self._running:
            self._running.remove(r.request_id)
        self._step.scheduled.pop(r.request_id, None)
        r.phase = ArPhase.ABORTED

    # --- scheduling phase -----------------------------------------------------
    def _blocks_allocated(self, e: ArBlocksAllocated) -> None:
        cfg = self.config
        r = self._active(e.request_id, e)
        self._enter_schedule_phase(e)
        if r.phase in AR_QUEUED_PHASES:
            self._check_soft_preemption_admission(r, e)
        if r.phase is ArPhase.PREEMPTED and not self.rules.admit_after_preemption:
            raise self._fail(
                "no_admission_after_preemption",
                f"{r.request_id!r} gets blocks in the step that preempted it",
                e,
            )
        if not e.blocks or len(set(e.blocks)) != len(e.blocks):
            raise self._fail("kv_exclusive", f"blocks {list(e.blocks)} empty or repeated", e)
        for b in e.blocks:
            if not 0 <= b < cfg.num_blocks:
                raise self._fail(
                    "kv_exclusive", f"block {b} outside the pool [0, {cfg.num_blocks})", e
                )
            if b == cfg.null_block:
                raise self._fail("null_block_reserved", f"allocated the null block {b}", e)
            if b in self._owner:
                raise self._fail(
                    "kv_exclusive", f"block {b} is already held by {self._owner[b]!r}", e
                )
        if len(r.blocks) + len(e.blocks) > cfg.max_blocks_per_request:
            raise self._fail(
                "kv_bounded",
                f"{r.request_id!r} would hold {len(r.blocks) + len(e.blocks)} blocks; "
                f"max_model_len={cfg.max_model_len} needs at most {cfg.max_blocks_per_request}",
                e,
            )
        for b in e.blocks:
            self._owner[b] = r.request_id
            r.blocks.append(b)

    def _scheduled(self, e: ArScheduled) -> None:
        cfg, rules, st = self.config, self.rules, self._step
        r = self._active(e.request_id, e)
        self._enter_schedule_phase(e)
        n = e.num_tokens
        if r.request_id in st.scheduled:
            raise self._fail(
                "one_schedule_per_step",
                f"{r.request_id!r} scheduled twice in step {st.index}",
                e,
            )
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise self._fail("one_schedule_per_step", f"scheduled {n!r} tokens (>= 1)", e)
        uncomputed = r.known - r.num_computed
        if n > uncomputed:
            raise self._fail(
                "no_compute_past_known",
                f"{r.request_id!r} scheduled {n} tokens but only {uncomputed} are known and "
                f"uncomputed ({r.known} known, {r.num_computed} computed)",
                e,
            )
        used = sum(st.scheduled.values())
        if rules.token_budget and used + n > cfg.max_num_batched_tokens:
            raise self._fail(
                "token_budget",
                f"step {st.index} would schedule {used + n} tokens; "
                f"max_num_batched_tokens={cfg.max_num_batched_tokens}",
                e,
            )
        if not cfg.enable_chunked_prefill and n != uncomputed:
            raise self._fail(
                "no_chunking_when_disabled",
                f"{r.request_id!r} scheduled {n} of its {uncomputed} uncomputed tokens with "
                f"chunked prefill off",
                e,
            )
        if (
            cfg.long_prefill_token_threshold
            and n > cfg.long_prefill_token_threshold
            and not (self.policy.lone_request_threshold_exempt and self._is_alone(r))
        ):
            raise self._fail(
                "long_prefill_threshold",
                f"{r.request_id!r} scheduled {n} tokens > long_prefill_token_threshold="
                f"{cfg.long_prefill_token_threshold}",
                e,
            )
        if rules.token_cap is not None and n > rules.token_cap:
            raise self._fail(
                "token_fairness_cap",
                f"{r.request_id!r} scheduled {n} tokens > cap {rules.token_cap}",
                e,
            )
        have = len(r.blocks) * cfg.block_size
        if have < r.num_computed + n:
            raise self._fail(
                "kv_covers_scheduled",
                f"{r.request_id!r} computes {r.num_computed} + {n} tokens but holds "
                f"{len(r.blocks)} blocks ({have} tokens)",
                e,
            )
        if r.phase in AR_QUEUED_PHASES:
            self._check_admission(r, e)
            target = AR_REQUEST_LIFECYCLE.target(r.phase.value, "ar_scheduled")
            assert target is not None  # both queued phases allow it
            self._waiting.remove(r.request_id)
            self._running.append(r.request_id)
            r.phase = ArPhase(target)
            r.waited = 0
            st.admitted.append(r.request_id)
        st.scheduled[r.request_id] = n

    def _is_alone(self, r: _Req) -> bool:
        """Nothing but `r` is running or waiting (vLLM's lone-request threshold exemption)."""
        return len(self._running) + len(self._waiting) == 1

    def _check_gates(self, r: _Req, e: ArScheduled) -> None:
        """The declared admission gates: full-sequence fit and the watermark. Blocks for this
        step's chunk are already allocated (they precede `ArScheduled`)."""
        cfg = self.config
        free = cfg.usable_blocks - len(self._owner)
        if self.policy.full_sequence_admission:
            rest = cfg.blocks_for(r.known) - len(r.blocks)
            if rest > free:
                raise self._fail(
                    "full_sequence_admission",
                    f"admitted {r.request_id!r} whose whole sequence ({r.known} tokens) needs "
                    f"{rest} more block(s) than it holds, with {free} free",
                    e,
                )
        if self.watermark and free < self.watermark:
            raise self._fail(
                "admission_watermark",
                f"admitting {r.request_id!r} leaves {free} free block(s) < watermark "
                f"{self.watermark}",
                e,
            )

    def _check_soft_preemption_admission(self, r: _Req, e: ArEvent) -> None:
        """soft_preemption: a step that preempted gives a waiting request nothing."""
        st = self._step
        if self.rules.soft_preemption and st.preempted:
            raise self._fail(
                "soft_preemption",
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
                "no_admission_after_preemption",
                f"{r.request_id!r} re-admitted in the step that preempted it",
                e,
            )
        if st.preempted and not rules.admit_after_preemption:
            raise self._fail(
                "no_admission_after_preemption",
                f"admitted {r.request_id!r} in a step that preempted {st.preempted}",
                e,
            )
        if len(self._running) + 1 > cfg.max_num_seqs:
            raise self._fail(
                "seat_cap",
                f"admitting {r.request_id!r} makes {len(self._running) + 1} running; "
                f"max_num_seqs={cfg.max_num_seqs}",
                e,
            )
        older = [q for q in self._running if q not in st.admitted]
        if rules.static_batches and older:
            raise self._fail(
                "static_batch",
                f"admitted {r.request_id!r} while the batch {older} is still running",
                e,
            )
        queued = [self._requests[q] for q in self._waiting]
        if rules.max_wait_steps is not None:
            aged = [q for q in queued if q.waited >= rules.max_wait_steps]
            if aged:
                oldest = min(aged, key=lambda q: q.arrival)
                if oldest is not r:
                    raise self._fail(
                        "aging_bound",
                        f"admitted {r.request_id!r} while {oldest.request_id!r} has waited "
                        f"{oldest.waited} >= max_wait_steps={rules.max_wait_steps} steps",
                        e,
                    )
                return
        if rules.admission is AdmissionOrder.FCFS:
            if self._waiting[0] != r.request_id:
                raise self._fail(
                    "fcfs_admission",
                    f"admitted {r.request_id!r} while {self._waiting[0]!r} is ahead of it "
                    f"(waiting {self._waiting})",
                    e,
                )
            return
        best = min(queued, key=lambda q: admission_key(rules, q))
        if admission_key(rules, r) != admission_key(rules, best):
            raise self._fail(
                "policy_admission",
                f"{rules.admission.value}: admitted {r.request_id!r} (key "
                f"{admission_key(rules, r)}) while {best.request_id!r} has key "
                f"{admission_key(rules, best)}",
                e,
            )

    def _preempted(self, e: ArPreempted) -> None:
        rules, st = self.rules, self._step
        r = self._active(e.request_id, e)
        self._enter_schedule_phase(e)
        if r.phase is not ArPhase.RUNNING:
            raise self._fail("lifecycle", f"preempted {r.request_id!r}, which is not running", e)
        any_running = rules.victim is VictimOrder.LOWEST_PRIORITY_ANY
        if r.request_id in st.scheduled and not any_running:
            raise self._fail(
                "no_preempt_scheduled",
                f"{r.request_id!r} was already scheduled {st.scheduled[r.request_id]} tokens in "
                f"step {st.index}",
                e,
            )
        candidates = [
            self._requests[q] for q in self._running if any_running or q not in st.scheduled
        ]
        if rules.victim is VictimOrder.NONE:
            raise self._fail(
                "preemption_victim", "this scheduler declared that it never preempts", e
            )
        if rules.victim is VictimOrder.TAIL:
            expected = candidates[-1]
        else:
            expected = max(candidates, key=lambda q: (q.priority, q.arrival))
        if rules.soft_preemption:
            self._check_soft_preemption_needed(r, e)
        if expected is not r:
            raise self._fail(
                "preemption_victim",
                f"preempted {r.request_id!r}; the {rules.victim.value} victim is "
                f"{expected.request_id!r}",
                e,
            )
        for b in e.freed:
            if self._owner.get(b) != r.request_id:
                raise self._fail(
                    "free_owned_only",
                    f"{r.request_id!r} freed block {b}, held by {self._owner.get(b)!r}",
                    e,
                )
        if len(set(e.freed)) != len(e.freed):
            raise self._fail("free_owned_only", f"blocks {list(e.freed)} freed twice", e)
        if sorted(e.freed) != sorted(r.blocks):
            raise self._fail(
                "preempt_frees_all",
                f"preempted {r.request_id!r} freed {sorted(e.freed)} of its blocks "
                f"{sorted(r.blocks)}",
                e,
            )
        for b in e.freed:
            del self._owner[b]
        # LOWEST_PRIORITY_ANY: a victim scheduled in this step is unscheduled, its tokens
        # returned to the budget.
        st.scheduled.pop(r.request_id, None)
        r.blocks.clear()
        r.num_computed = 0
        r.phase = ArPhase.PREEMPTED
        self._running.remove(r.request_id)
        self._waiting.insert(0, r.request_id)
        st.preempted.append(r.request_id)

    def _check_soft_preemption_needed(self, r: _Req, e: ArPreempted) -> None:
        """soft_preemption: some running request not yet scheduled needs a block for its next
        token and none is free."""
        cfg, st = self.config, self._step
        free = cfg.usable_blocks - len(self._owner)
        short = [
            q
            for q in self._running
            if q not in st.scheduled
            and cfg.blocks_for(self._requests[q].num_computed + 1) - len(self._requests[q].blocks)
            > free
        ]
        if not short:
            raise self._fail(
                "soft_preemption",
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
                "step_order", f"step {e.step_index} ended; expected step {st.index}", e
            )
        if not st.in_schedule_phase:
            self._check_finished_released(e)
        total = sum(st.scheduled.values())
        if total == 0 and (self._running or self._waiting):
            raise self._fail(
                "progress",
                f"step {st.index} scheduled nothing with {len(self._running)} running and "
                f"{len(self._waiting)} waiting",
                e,
            )
        if rules.token_floor and len(self._running) <= cfg.max_num_batched_tokens:
            starved = [q for q in self._running if q not in st.scheduled]
            if starved:
                raise self._fail(
                    "token_fairness_floor",
                    f"running {starved} got no token in step {st.index}",
                    e,
                )
        for rid, n in st.scheduled.items():
            r = self._requests[rid]
            if len(r.blocks) * cfg.block_size < r.num_computed + n:
                raise self._fail(
                    "kv_covers_scheduled",
                    f"{rid!r} computes {r.num_computed} + {n} tokens but holds {len(r.blocks)} "
                    f"blocks at the end of the step",
                    e,
                )
            r.num_computed += n
            r.attained += n
            if r.num_computed == r.known:
                r.num_output += 1  # caught up: the model samples the next token
        for rid in self._waiting:
            r = self._requests[rid]
            if r.phase is ArPhase.PREEMPTED:
                r.phase = ArPhase.WAITING
            r.waited += 1
        self._step = _Step(index=st.index + 1)

    # --- update phase -----------------------------------------------------------
    def _blocks_freed(self, e: ArBlocksFreed) -> None:
        r = self._get(e.request_id, e)
        if not e.blocks or len(set(e.blocks)) != len(e.blocks):
            raise self._fail("free_owned_only", f"blocks {list(e.blocks)} empty or repeated", e)
        for b in e.blocks:
            if self._owner.get(b) != r.request_id:
                what = "free" if b not in self._owner else f"held by {self._owner[b]!r}"
                raise self._fail(
                    "free_owned_only",
                    f"{r.request_id!r} freed block {b}, which is {what} (double free or foreign)",
                    e,
                )
        for b in e.blocks:
            del self._owner[b]
            r.blocks.remove(b)

    def _finished(self, e: ArFinished) -> None:
        r = self._active(e.request_id, e)
        if r.phase is not ArPhase.RUNNING:
            raise self._fail("lifecycle", f"{r.request_id!r} finished while {r.phase.value}", e)
        due = finish_reason(r)
        if due is None:
            raise self._fail(
                "finish_condition",
                f"{r.request_id!r} finished with {r.num_output}/{r.max_tokens} outputs and no "
                f"end token (stop_after={r.stop_after})",
                e,
            )
        allowed = {due}
        if r.num_output >= r.max_tokens:
            allowed.add(ArFinishReason.LENGTH)
        if e.reason not in allowed:
            raise self._fail(
                "finish_condition", f"reason {e.reason.value}; what holds is {due.value}", e
            )
        if r.blocks:
            raise self._fail(
                "terminal_holds_nothing",
                f"{r.request_id!r} finished still holding blocks {r.blocks}",
                e,
            )
        self._running.remove(r.request_id)
        self._step.scheduled.pop(r.request_id, None)
        r.phase = ArPhase.FINISHED

    # ------------------------------------------------------------------ checks
    def check_invariants(self, between_steps: bool = False) -> None:
        failure = check_all(self.state(), between_steps)
        if failure is not None:
            raise self._fail(failure[0], failure[1], None)

    def check_snapshot(self, snap: ArSnapshot) -> None:
        """Between steps: the implementation's pools and queues equal the abstract state, and
        no running request is overdue to finish. Raises SpecViolation."""
        self.check_invariants(between_steps=True)
        self._check_finished_released(None)
        st = self.state()
        problems: list[str] = []
        if snap.free_blocks != st.free_blocks:
            problems.append(
                f"free blocks differ: implementation also frees "
                f"{sorted(snap.free_blocks - st.free_blocks)}, lacks "
                f"{sorted(st.free_blocks - snap.free_blocks)}"
            )
        if dict(snap.block_owners) != dict(st.block_owners):
            diff = {
                b: (snap.block_owners.get(b), st.block_owners.get(b))
                for b in set(snap.block_owners) | set(st.block_owners)
                if snap.block_owners.get(b) != st.block_owners.get(b)
            }
            problems.append(f"block owners differ (block: implementation, spec): {diff}")
        if set(snap.running) != set(st.running) or len(snap.running) != len(st.running):
            problems.append(
                f"running differs: implementation {list(snap.running)}, spec {list(st.running)}"
            )
        if sorted(snap.waiting) != sorted(st.waiting):
            problems.append(
                f"waiting differs: implementation {list(snap.waiting)}, spec {list(st.waiting)}"
            )
        active = {rid: r.num_computed for rid, r in st.requests.items() if rid in st.running}
        active.update({rid: 0 for rid in st.waiting})
        if dict(snap.num_computed) != active:
            problems.append(
                f"computed tokens differ: implementation {dict(snap.num_computed)}, spec {active}"
            )
        if problems:
            raise self._fail("snapshot_matches", "; ".join(problems), None)
        if self.rules.admission is AdmissionOrder.FCFS and tuple(snap.waiting) != st.waiting:
            raise self._fail(
                "waiting_order",
                f"implementation queue {list(snap.waiting)}, FCFS order {list(st.waiting)}",
                None,
            )


_HANDLERS: dict[type, Callable[[ArSpecMachine, Any], None]] = {
    ArSubmitted: ArSpecMachine._submitted,
    ArBlocksAllocated: ArSpecMachine._blocks_allocated,
    ArScheduled: ArSpecMachine._scheduled,
    ArPreempted: ArSpecMachine._preempted,
    ArStepEnd: ArSpecMachine._step_end,
    ArBlocksFreed: ArSpecMachine._blocks_freed,
    ArFinished: ArSpecMachine._finished,
    ArAborted: ArSpecMachine._aborted,
}

__all__ = ["ArSpecMachine", "admission_key", "finish_reason"]
