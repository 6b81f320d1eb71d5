"""The reference vLLM-v1-style scheduler (`vllm-v1`), with the policies beyond FCFS.

One step (decisions as in vLLM v1's `Scheduler.schedule`, read for facts, written anew):
1. Running requests first, in running (admission) order, while token budget is left: each gets
   min(uncomputed, long_prefill_token_threshold if set, budget) tokens (under FAIR also at most
   the cap, leaving one token for each running request after it). If its new KV blocks do not
   fit, preempt the victim — the tail of running (FCFS) or the lowest priority, then latest
   arrival, among requests not yet scheduled this step (priority) — free all its blocks, reset
   its computed tokens and put it at the head of waiting; repeat until the blocks fit or the
   request preempted itself (then go on with the next running request).
2. Only if nothing was preempted: admit waiting requests while a seat and budget are left, in
   the policy's order (FCFS head; or the minimum of priority / SJF / SRPT / LAS keys; under
   AGING a request that waited max_wait_steps steps first). A prefill is chunked to the budget
   (or scheduled whole when chunked prefill is off); admission stops at the first request whose
   blocks do not fit.
   Under PRIORITY_SOFT (priority admission, soft preemption) a running request whose chunk
   does not fit shrinks it to what its blocks and the free blocks hold; it preempts (the lowest
   priority, then latest arrival, among unscheduled running requests) only when not one more
   token fits. Admission never preempts: a high-priority arrival waits for a seat and blocks.
3. The model step; then requests that produced max_tokens or their end token finish and free
   their blocks.

`VllmOptions` switches on vLLM 0.33.0's deliberate choices (read in its `Scheduler.schedule`
and `KVCacheManager.allocate_slots`, confirmed by the differential against the real scheduler
in tests/test_real_vllm.py):
- `full_sequence_admission`: a waiting request is admitted only if the blocks for its whole
  known sequence fit the free blocks (`scheduler_reserve_full_isl=True`);
- `lone_request_threshold_exempt`: with one request in the scheduler (running + waiting) the
  long-prefill threshold is off for the step (nobody to starve);
- `victim_among_all`: under priority the victim is the lowest priority (then latest arrival)
  among *all* running requests; one scheduled earlier in the step is unscheduled, its tokens
  return to the budget and (prefix caching) what its scheduling cached is uncached: no forward
  writes it (vLLM 0.33.0 keeps it cached, a finding in docs/engines/vllm.md). Without it the victim
  is chosen among unscheduled requests only, so a high-priority request can preempt itself
  while a lower-priority one scheduled before it keeps running (a priority inversion).
- `adaptive_threshold` (vLLM's `long_prefill_token_threshold_adaptive`, off by default there and
  here): a set long-prefill threshold is floored at max_num_batched_tokens // (running +
  waiting requests) for the step;
- `prefill_interval` (vLLM's `prefill_schedule_interval`, 1 by default there and here): the
  local prefill cadence. A step starts held when the interval is above 1, the last release
  step did not leave requests waiting (the capacity escape), fewer than `prefill_interval`
  executed steps (steps that scheduled a token) have passed since the last one that carried
  prefill, and a running request decodes (its last chunk reached its known tokens). A held step
  skips running requests still in their prefill and admits no request with more than one token
  to compute after its cache hit (the queue stops there);
- `lift_empty_hold`: the candidate fix of a vLLM finding (docs/engines/vllm.md): a held step whose
  decoding requests are all preempted before anything is scheduled lifts its hold and revisits
  the running requests (vLLM 0.33.0 schedules nothing in that step);
- `watermark` (vLLM's `SchedulerConfig.watermark`, off by default there and here): while a
  request is running, one admitted earlier in the step included, a waiting request is admitted
  only if its chunk, and under `full_sequence_admission` its whole sequence, fits with
  int(watermark * num_blocks) blocks (the null block counted) left free;
- `hash_lookahead` (vLLM's `num_hash_lookahead_tokens`, 1 with an EAGLE drafter, 0 by
  default there and here): with prefix caching a block's content key covers that many tokens
  after it, so it is cached once they are known (as the request takes its output) and a hit
  takes it only where the request's own next tokens match too;
- `cache_aware_window` / `cache_aware_threshold` (vLLM 0.34.0's cache-aware admission, off by
  default there and here): with prefix caching under FCFS, `reference.ar.prefix_cache`
  reorders the head of the waiting queue by cached prefix before it admits.
`make_vllm_v1` is the idealised scheduler (every option off); `VLLM_V1` (the `vllm-v1`
built-in) turns all three on and declares them in its profile.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from reference.ar.base import ArReq, ArSchedulerBase, CachingBlockPool
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter, check_proposal
from spec.ar.config import ArConfig, ArRules, Policy, VictimOrder
from spec.ar.events import (
    AR_PAUSE_STATES,
    ArAwaiting,
    ArCacheReset,
    ArDraftsProposed,
    ArPauseSet,
    ArReady,
)
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile
from spec.errors import ConfigError, UnknownRequest
from spec.implementation import ArImplementation


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """vLLM 0.33.0's deliberate choices (see the module docstring); all off = idealised."""

    full_sequence_admission: bool = False
    lone_request_threshold_exempt: bool = False
    victim_among_all: bool = False
    watermark: float = 0.0
    adaptive_threshold: bool = False
    prefill_interval: int = 1
    lift_empty_hold: bool = False
    cache_aware_window: int = 0
    cache_aware_threshold: float = 0.5
    hash_lookahead: int = 0


VLLM_033 = VllmOptions(True, True, True)


class VllmV1Scheduler(ArSchedulerBase):
    """The reference vLLM-v1-style scheduler (`vllm-v1`, module docstring) under `config.policy`;
    `options` switch on vLLM 0.33.0's choices (default all off: idealised)."""

    name = "vllm-v1"
    options: VllmOptions = VllmOptions()
    # passes over a request whose LoRA adapter finds no room, as vLLM does (a subclass that
    # changes `_admissible` says again whether it does)
    serves_loras = True

    def __init__(
        self, config: ArConfig, sink: ArEventSink, options: VllmOptions | None = None
    ) -> None:
        super().__init__(config, sink)
        if options is not None:
            self.options = options
        self.hash_ahead: int = self.options.hash_lookahead
        self._threshold = config.long_prefill_token_threshold
        self._restored = 0  # tokens given back by unscheduled victims (victim_among_all)
        # the prefill cadence (`prefill_interval`): executed steps, the last that carried
        # prefill, the capacity escape, the running requests whose last chunk ended short of
        # their known tokens, and this step's state
        self._executed = 0
        self._last_prefill = -self.options.prefill_interval
        self._capacity_bound = False
        self._prefilling: set[str] = set()
        self._held = False
        self._carried_prefill = False
        self._step_running: set[str] = set()
        self._pause = "unpaused"  # the operator's pause state (`set_pause`)
        # input rows a draft model adds per scheduled request (vLLM's draft slots), charged
        # against the budget beside its tokens
        self._rows = config.num_drafting_slots
        # this step's running pass scheduled a request still in its prefill (vLLM's
        # `prefill_scheduled`): no new decode is padded to the drafts' size then
        self._prefill_scheduled = False

    @property
    def rules(self) -> ArRules:
        """`rules_for(config)`; under PRIORITY with `victim_among_all` the victim is chosen among
        all running requests (`LOWEST_PRIORITY_ANY`)."""
        rules = super().rules
        if self._victim_any():
            return dataclasses.replace(rules, victim=VictimOrder.LOWEST_PRIORITY_ANY)
        return rules

    def _victim_any(self) -> bool:
        return self.options.victim_among_all and self.config.policy is Policy.PRIORITY

    def set_pause(self, state: str) -> None:
        """`ArPausingAdapter`: between steps, the operator's pause state (vLLM's
        `set_pause_state`): "paused_new" admits no request (the running ones run; vLLM's
        cache-aware window still reorders), "paused_all" schedules nothing and leaves the
        prefill cadence as it was; emits `ArPauseSet`. `ConfigError` for another state."""
        if state not in AR_PAUSE_STATES:
            raise ConfigError("state", state, f"one of {list(AR_PAUSE_STATES)}")
        self._pause = state
        self.sink(ArPauseSet(state))

    def reset_cache(self) -> None:
        """`ArPausingAdapter`: between steps, an operator's cache reset (vLLM's
        `reset_prefix_cache(reset_running_requests=True)`): every running request is
        preempted, the last first (`ArPreempted` with `reset`), so they wait in running order;
        then every cached block is forgotten (`ArCacheReset`)."""
        for victim in reversed(list(self.running)):
            self._preempt(victim, reset=True)
        pool = self.pool
        if isinstance(pool, CachingBlockPool):
            pool.reset()
        self.sink(ArCacheReset())

    def _schedule(self) -> None:
        if self._pause == "paused_all":
            return  # vLLM: no budget; no pass, so the cadence's escape is not recomputed
        self._threshold = self._step_threshold()
        self._held = self._cadence_holds()
        self._carried_prefill = False
        self._prefill_scheduled = False
        self._step_running = {r.rid for r in self.running}
        # the budget a request may take: vLLM's input budget less the drafter's rows for it
        budget = self._schedule_running(self.config.max_num_batched_tokens - self._rows)
        if not self.step_preempted:
            self._schedule_waiting(budget)
            if not self._held:  # a release step: did it leave requests waiting?
                # vLLM: num_waiting > len(deferred_waiting)
                self._capacity_bound = any(not r.deferred for r in self.waiting)
        if self.scheduled:
            self._executed += 1
        if self._carried_prefill:
            self._last_prefill = self._executed

    def _cadence_holds(self) -> bool:
        """Whether the prefill cadence holds this step's prefill (`prefill_interval`)."""
        interval = self.options.prefill_interval
        return (
            interval > 1
            and not self._capacity_bound
            and (self._executed + 1) - self._last_prefill < interval
            and any(r.rid not in self._prefilling for r in self.running)
        )

    def _lifts_empty_hold(self) -> bool:
        """`lift_empty_hold` (a candidate fix, `integrations.vllm.cadence_fix`): a held step
        with nothing scheduled and no decoding request left running lifts its hold."""
        return (
            self.options.lift_empty_hold
            and self._held
            and not self.scheduled
            and all(r.rid in self._prefilling for r in self.running)
        )

    def _held_back(self, req: ArReq, computed: int) -> bool:
        """A held step admits no request with more than one token to compute after its cache
        hit (`computed`)."""
        return self._held and computed < req.known - 1

    def _emit_scheduled(self, req: ArReq, num_tokens: int, drafts: int = 0) -> None:
        if req.rid in self._step_running:
            self._carried_prefill |= req.rid in self._prefilling
        else:
            self._carried_prefill |= req.num_computed < req.known - 1
        if req.num_computed + num_tokens < req.known:
            self._prefilling.add(req.rid)
        else:
            self._prefilling.discard(req.rid)
        super()._emit_scheduled(req, num_tokens, drafts)

    def _step_threshold(self) -> int:
        """This step's long-prefill threshold (0: none): the configured one; 0 for a lone
        request (`lone_request_threshold_exempt`: nobody to starve); under
        `adaptive_threshold` never below a fair share of the budget among the running and
        waiting requests."""
        threshold = self.config.long_prefill_token_threshold
        eligible = len(self.running) + len(self.waiting)
        if self.options.lone_request_threshold_exempt and eligible <= 1:
            return 0
        if threshold and self.options.adaptive_threshold and eligible:
            return max(threshold, self.config.max_num_batched_tokens // eligible)
        return threshold

    # ------------------------------------------------------------------ running
    def _running_tokens(self, req: ArReq, index: int, budget: int) -> int:
        """Its uncomputed tokens and the drafts proposed for it (vLLM's
        `num_tokens_with_spec`), cut to the threshold, the budget (FAIR: the cap, and a token
        left for each running request after it) and, with drafts, to `max_model_len` less
        the token the step samples."""
        cfg = self.config
        n = req.uncomputed + req.proposed
        if self._threshold:
            n = min(n, self._threshold)
        if cfg.policy is Policy.FAIR:
            if cfg.fair_token_cap:
                n = min(n, cfg.fair_token_cap)
            later = len(self.running) - index - 1  # leave one token for each of them
            budget = max(1, budget - later)
        return self._within_model_len(req, min(n, budget))

    def _within_model_len(self, req: ArReq, n: int) -> int:
        """With drafts proposed, `n` cut to `max_model_len` less the request's computed
        tokens and the token the step samples (vLLM: no input position past the model's
        length)."""
        if not req.proposed:
            return n
        return min(n, self.config.max_model_len - req.num_computed - 1)

    def _schedule_running(self, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if self._held and req.rid in self._prefilling:
                i += 1  # the cadence holds its next chunk
                continue
            self._restored = 0
            n = self._fit_or_preempt(req, self._running_tokens(req, i, budget), i)
            budget += self._restored
            i = self.running.index(req) if req in self.running else i
            if not n:
                # It preempted itself. Under FCFS it was the tail: the loop ends. Under priority
                # a higher-priority request may follow it: keep scheduling (vLLM PR #26765; a
                # plain `break` here can leave a step with nothing scheduled).
                if self._lifts_empty_hold():
                    self._held = False  # revisit the prefill chunks the hold skipped
                    i = 0
                continue
            # the drafts it carries: those of its tokens past its known ones
            drafts = max(0, min(req.proposed, req.num_computed + n - req.known))
            self._prefill_scheduled |= req.rid in self._prefilling
            self._emit_scheduled(req, n, drafts)
            budget -= n + self._rows
            i += 1
        return budget

    def propose_drafts(self, request_id: str, drafts: int, accepted: int) -> None:
        """`ArDraftingAdapter`: between steps, the drafter proposed `drafts` draft tokens for
        the running request's next step (replacing any before; vLLM's
        `update_draft_token_ids`), of which the model will accept the first `accepted`;
        emits `ArDraftsProposed`. `ConfigError` for a count outside [1,
        num_speculative_tokens] or `accepted` outside [0, drafts]; `UnknownRequest` for an id
        that is not running."""
        check_proposal(self.config.num_speculative_tokens, drafts, accepted)
        req = next((r for r in self.running if r.rid == request_id), None)
        if req is None:
            raise UnknownRequest(request_id, len(self.waiting) + len(self.running))
        req.proposed, req.accept = drafts, accepted
        self.sink(ArDraftsProposed(request_id, drafts))

    def _padded(self, req: ArReq, computed: int, n: int, budget: int) -> tuple[int, int] | None:
        """(tokens, drafts) of a waiting request's schedule of `n` tokens after `computed`
        (its cache hit), padded as vLLM pads a new decode with speculative decoding: a
        request with one token left to compute, in a step whose running pass scheduled no
        prefill chunk and scheduled a running request (or one with computed tokens), is
        scheduled 1 + k tokens, k placeholder drafts the model rejects, where they fit
        `max_model_len`; None where the budget cannot take them (vLLM then stops admitting
        rather than schedule it unpadded: with a budget below 1 + k and the drafter's rows, a
        full cache hit then never runs, a finding, `integrations.vllm.spec_pad_fix`). Where
        the long-prefill threshold would cut the padding vLLM 0.33.0 asserts (the same
        finding); this then does not pad, as that fix does."""
        k, cfg = self.config.num_speculative_tokens, self.config
        if not k or req.known - computed != 1 or self._prefill_scheduled:
            return n, 0
        if not computed and not any(rid in self._step_running for rid in self.scheduled):
            return n, 0
        padded = 1 + k
        if (
            computed + padded + 1 > cfg.max_model_len
            or 0 < self._threshold < padded
            # (FAIR, the spec's own policy, caps a schedule: the padding must fit it too)
            or (cfg.policy is Policy.FAIR and 0 < cfg.fair_token_cap < padded)
        ):
            return n, 0
        if padded > budget:
            return None
        req.accept = 0  # placeholders: the model accepts none
        return padded, k

    def _soft_tokens(self, req: ArReq, n: int) -> int:
        """Soft preemption: the tokens (<= n) its blocks and the free blocks hold (without
        chunked prefill never fewer than its uncomputed ones: only its drafts may go)."""
        cfg = self.config
        if cfg.policy is not Policy.PRIORITY_SOFT:
            return n
        room = (len(req.blocks) + self.pool.num_free) * cfg.block_size - req.num_computed
        if room < 1:
            return n
        if not cfg.enable_chunked_prefill:  # no chunk of a prefill: only its drafts may go
            return max(min(n, room), req.uncomputed)
        return min(n, room)

    def _fit_or_preempt(self, req: ArReq, n: int, index: int) -> int:
        """Allocate blocks for `n` more tokens (soft: fewer, if that is what fits), preempting
        victims until they fit; the tokens it got, 0 if the request had to preempt itself."""
        while True:
            n = self._soft_tokens(req, n)
            need = self._blocks_needed(req, n)
            if need <= self.pool.num_free:
                self._grow(req, need)
                return n
            victim = self._pick_victim(req, index)
            unscheduled = self.scheduled.pop(victim.rid, 0)  # victim_among_all
            self.step_drafts.pop(victim.rid, None)
            self._restored += unscheduled + (self._rows if unscheduled else 0)
            if unscheduled:
                self._uncache_unwritten(victim)
            self._preempt(victim)
            if victim is req:
                return 0

    def _uncache_unwritten(self, victim: ArReq) -> None:
        """A victim scheduled in this step: the blocks its scheduling cached, from its first
        uncomputed token on, are never written (it leaves the batch), so they leave the prefix
        cache. vLLM 0.33.0 keeps them cached (a finding, docs/engines/vllm.md); this is its
        candidate fix, `uncache-preempted`."""
        pool = self.pool
        if isinstance(pool, CachingBlockPool):
            for b in victim.blocks[victim.num_computed // self.config.block_size :]:
                pool.uncache(b)

    def _pick_victim(self, req: ArReq, index: int) -> ArReq:
        """Among running requests not scheduled in this step (those from `index` on)."""
        if self._victim_any():
            return max(self.running, key=lambda r: (r.spec.priority, r.arrival))
        candidates = [r for r in self.running if r.rid not in self.scheduled]
        if self.config.policy in (Policy.PRIORITY, Policy.PRIORITY_SOFT):
            return max(candidates, key=lambda r: (r.spec.priority, r.arrival))
        return candidates[-1]

    # ------------------------------------------------------------------ waiting
    def _admission_key(self, req: ArReq) -> tuple[int, int]:
        p, s = self.config.policy, req.spec
        if p in (Policy.PRIORITY, Policy.PRIORITY_SOFT):
            return (s.priority, req.arrival)
        if p in (Policy.SJF, Policy.AGING):
            return (s.prompt_len + s.expected_output, req.arrival)
        if p is Policy.SRPT:
            remaining = max(0, s.expected_output - req.num_output) + req.uncomputed
            return (remaining, req.arrival)
        if p is Policy.LAS:
            return (req.attained, req.arrival)
        return (0, req.arrival)

    # ------------------------------------------------------------------ inputs awaited
    def await_input(self, request_id: str, what: str) -> None:
        """The request just submitted may not be admitted until `input_ready` (vLLM: its
        structured-output grammar is still compiling, status
        `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`); emits `ArAwaiting`. `UnknownRequest` for an
        id that is not waiting."""
        req = self._waiting_request(request_id)
        req.awaiting = what
        req.unpromoted = req.deferred = True
        self.sink(ArAwaiting(request_id, what))

    def input_ready(self, request_id: str) -> None:
        """The awaited input is ready (`ArReady`): the request may be admitted from now on,
        and the waiting pass that reaches it promotes it (`_promote`), as vLLM's pass promotes
        a request whose grammar has compiled. `UnknownRequest` for an id that awaits
        nothing."""
        req = self._waiting_request(request_id)
        if req.awaiting is None:
            raise UnknownRequest(request_id, len(self.waiting) + len(self.running))
        req.awaiting = None
        self.sink(ArReady(request_id))

    def _waiting_request(self, request_id: str) -> ArReq:
        for req in self.waiting:
            if req.rid == request_id:
                return req
        raise UnknownRequest(request_id, len(self.waiting) + len(self.running))

    def _promote(self, req: ArReq) -> None:
        """The waiting pass reached `req`, whose input is ready: vLLM promotes it from its
        blocked status (`ArReady` with `in_step`); the cache-aware window may move it from
        now on."""
        if req.unpromoted:
            req.unpromoted = False
            self.sink(ArReady(req.rid, in_step=True))

    def _admissible(self) -> list[ArReq]:
        """The waiting queue without the requests that await an input and those whose LoRA
        adapter finds no room (vLLM skips them: "Scheduling would exceed max_loras"), in
        order."""
        adapters = {r.spec.lora for r in self.running if r.spec.lora is not None}
        full = len(adapters) >= self.config.max_loras
        return [
            r
            for r in self.waiting
            if r.awaiting is None and not (r.spec.lora and full and r.spec.lora not in adapters)
        ]

    def _peek_waiting(self) -> ArReq:
        cfg = self.config
        queue = self._admissible()
        if cfg.policy in (Policy.FCFS, Policy.FAIR):
            return queue[0]
        if cfg.policy is Policy.AGING:
            aged = [r for r in queue if r.waited >= cfg.max_wait_steps]
            if aged:
                return min(aged, key=lambda r: r.arrival)
        return min(queue, key=self._admission_key)

    def _waiting_tokens(self, req: ArReq, budget: int) -> int | None:
        cfg = self.config
        n = req.uncomputed
        if self._threshold:
            n = min(n, self._threshold)
        if cfg.policy is Policy.FAIR and cfg.fair_token_cap:
            n = min(n, cfg.fair_token_cap)
        if not cfg.enable_chunked_prefill and n > budget:
            return None
        return min(n, budget)

    def _watermark_now(self) -> int:
        """Blocks an admission must leave free now: vLLM's int(watermark * num_blocks) while a
        request runs (`has_scheduled_reqs=bool(self.running)`), else 0."""
        if not self.running:
            return 0
        return int(self.options.watermark * self.config.num_blocks)

    def _sequence_margin(self, mark: int) -> int:
        """Blocks the whole-sequence gate keeps free beyond the sequence: the binding watermark
        (vLLM: `num_blocks_to_allocate + watermark_blocks`)."""
        return mark

    def _defer_skipped(self, upto: ArReq | None) -> None:
        """Under a prefill cadence, the pass reached the waiting requests before `upto` in its
        order (None: all of them) and skipped those whose LoRA adapter finds no room: they
        join vLLM's `deferred_waiting` until admitted, which the capacity escape does not
        count. (The FCFS queue's order, else the priority key's: the cadence is vLLM's.)"""
        if self.options.prefill_interval <= 1 or not self.config.max_loras:
            return
        admissible = {r.rid for r in self._admissible()}
        queue = list(self.waiting)
        if self.config.policy not in (Policy.FCFS, Policy.FAIR):
            queue.sort(key=self._admission_key)
        for req in queue:
            if req is upto:
                return
            if req.awaiting is None and req.rid not in admissible:
                req.deferred = True

    def _next_waiting(self, budget: int) -> ArReq | None:
        """The waiting request the admission pass takes next (promoted, `_promote`), or None
        where the pass ends: no budget or seat left, or no request it may admit. The requests
        it skipped on the way are deferred (`_defer_skipped`)."""
        if self._pause != "unpaused":
            return None  # paused for new requests: vLLM's pass takes none
        if not self.waiting or budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return None
        if not self._admissible():
            self._defer_skipped(None)  # the pass skips all that is left
            return None
        req = self._peek_waiting()
        self._defer_skipped(req)
        self._promote(req)
        return req

    def _schedule_waiting(self, budget: int) -> None:
        while (req := self._next_waiting(budget)) is not None:
            n = self._waiting_tokens(req, budget)
            padded = self._padded(req, req.num_computed, n, budget) if n is not None else None
            if padded is None or self._held_back(req, req.num_computed):
                break
            n, drafts = padded
            need = self._blocks_needed(req, n)
            mark = self._watermark_now()
            free = self.pool.num_free
            if need + mark > free:
                break  # admission stops at the first request whose blocks do not fit
            if self.options.full_sequence_admission and (
                self.config.blocks_for(req.known) - len(req.blocks) + self._sequence_margin(mark)
                > free
            ):
                break  # vLLM's scheduler_reserve_full_isl: the whole sequence must fit
            self._admit(req)
            self._grow(req, need)
            self._emit_scheduled(req, n, drafts)
            budget -= n + self._rows

    def _admit(self, req: ArReq) -> None:
        self.waiting.remove(req)
        req.waited = 0
        req.unpromoted = req.deferred = False
        self.running.append(req)


def make_vllm_v1(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: the idealised reference vLLM-v1 scheduler under `config.policy`."""
    return VllmV1Scheduler(config, sink)


def make_vllm_v1_033(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: the reference with vLLM 0.33.0's options on (`VLLM_033`)."""
    return VllmV1Scheduler(config, sink, VLLM_033)


VLLM_V1 = ArImplementation(
    make_vllm_v1_033,
    ArProfile(
        space=ArConfigSpace(prefix_caching=frozenset({False}), max_loras=None),
        policy=ArPolicy(
            lone_request_threshold_exempt=True,
            full_sequence_admission=True,
            admission_progress=True,
        ),
    ),
    "the reference vLLM-v1-style scheduler with vLLM 0.33.0's options (full-sequence admission "
    "gate, lone-request threshold exemption, priority victim among all running requests); "
    "decision-identical to vLLM 0.33.0 under FCFS and priority (tests/test_real_vllm.py)",
)
