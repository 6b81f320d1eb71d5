"""vLLM's engine-core loop over one of its real schedulers, and the checks every such loop makes.

`EngineCore.step` (synchronous) and `EngineCore.step_with_batch_queue` (asynchronous, a batch
queue of two; `vllm/v1/engine/core.py`) in one `engine_step()`: schedule a batch while the
queue has room, else apply the oldest batch's output; a batch whose sampling must wait for that
output (`defers`: structured output under async scheduling) is scheduled, the oldest output
applied, and then the batch is sampled and queued. `BatchQueueLoop` is that loop; a subclass
says how the (fabricated) model runs a batch and what else it checks: `EngineCoreLoop`
(`integrations.vllm.engine_core`, autoregressive) and `DllmCoreLoop`
(`integrations.vllm.diffusion`, diffusion LLMs).

Checked by every loop: `pool_accounting` after every `schedule()`, `update_from_output()` and
abort; `runner_tables` after every `schedule()` (the model runner's block tables, rebuilt from
the outputs alone, are the scheduler's: `integrations.vllm.runner_tables`); `no_leak` and every
request's output (`check_content`) once drained; `progress` (the loop drains); vLLM raising is
`implementation_error`.
"""

from __future__ import annotations

import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from integrations.vllm.adapter import (
    GroupTables,
    all_group_tables,
    group_block_sizes,
    mamba_mode,
    waiting_requests,
    window_tokens,
)
from integrations.vllm.free_queue import FreeQueueCorrupt, free_block_ids
from integrations.vllm.runner_tables import RunnerTables
from integrations.vllm.trace import output_line, schedule_line
from spec.source_statement import statement_of

if TYPE_CHECKING:  # it raises this module's EngineCoreViolation
    from integrations.vllm.cache_aware_check import CacheAwareCheck

#: The engine core's batch queue: 2 with async scheduling (`max_concurrent_batches`), else 1.
ASYNC_BATCH_QUEUE = 2
ABORTED = "abort"

#: The rules `BatchQueueLoop` checks of every `schedule()` call, for both loops' RULES.
SCHEDULE_RULES = (
    "token_budget",
    "seat_cap",
    "admission_order",
    "preemption_victim",
    "kv_covers_scheduled",
    "pp_cadence",
    "runner_tables",
)


class EngineCoreViolation(Exception):
    """A rule an engine-core loop broke: `rule` and what was seen."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"[{rule}] {detail}")
        self.rule = rule
        self.detail = detail


@dataclass
class LoopCounts:
    """How often the loop's paths were taken (a subclass's counts extend these)."""

    engine_steps: int = 0
    schedules: int = 0
    cadence_waits: int = 0  # running requests held back for the pipeline cadence, per schedule
    aborts_in_flight: int = 0  # aborts of a request with a step in flight
    discarded: int = 0  # scheduled steps of a request that had finished when their output came


CountsT = TypeVar("CountsT", bound=LoopCounts)


class PauseHook(Protocol):
    """What pauses generation between engine steps (`integrations.vllm.pauses.PauseDriver`):
    `step` before each, `paused` while it holds the engine, and the counts it keeps."""

    paused: Any
    pauses: int
    preempted: int
    taken_back: int

    def step(self, step: int, live: Iterable[str], in_flight: bool, outputs: int) -> set[str]:
        """Pause or resume before engine step `step`; the requests a reset preempted."""
        ...

    def before_schedule(self) -> None:
        """Note what a `schedule()` call may schedule while paused."""
        ...

    def check_schedule(self, out: Any, where: str) -> None:
        """`pause`: what the call scheduled while paused."""
        ...


class BatchQueueLoop(Generic[CountsT]):
    """The engine core over `sched`: `engine_step()` is one call of `step_with_batch_queue`
    (async: a batch queue of 2, or `queue_size`, vLLM's `max_concurrent_batches`) or of `step`
    (sync: 1).

    Subclasses implement `execute` (the model run of a scheduled batch, in execution order),
    `runner_output` (what `update_from_output` gets of it), `reason` and `check_request`; the
    other hooks are optional."""

    def __init__(
        self,
        sched: Any,
        counts: CountsT,
        *,
        async_scheduling: bool,
        queue_size: int | None = None,
    ) -> None:
        self.sched = sched
        self.n = counts
        #: Requests a first admission from another of vLLM's waiting queues passed, as vLLM
        #: may (`queue_held`, `came_after_a_head`), summed over the calls: how often that
        #: allowance was used.
        self.queue_passes: int = 0
        self.async_scheduling = async_scheduling
        if queue_size is None:
            queue_size = ASYNC_BATCH_QUEUE if async_scheduling else 1
        self.queue_size = queue_size
        self.queue: deque[tuple[Any, Any]] = deque()
        self.outputs: dict[str, list[int]] = {}
        self.reasons: dict[str, str] = {}
        #: Request id -> the schedule of its latest decode step still in flight.
        self.last_decode: dict[str, int] = {}
        #: Each batch in flight (by `id`) -> its schedule number.
        self._schedule_number: dict[int, int] = {}
        self.ever_scheduled: set[str] = set()
        self.running_before: list[str] = []
        #: Waiting requests that held computed KV before `schedule()` (`record_running`).
        self.holding_before: set[str] = set()
        #: vLLM's two waiting queues before `schedule()`, in order, and their requests'
        #: arrivals (`record_running`, `came_after_a_head`).
        self.queues_before: dict[str, list[str]] = {}
        self.arrivals_before: dict[str, float] = {}
        #: Requests preempted between `schedule()` calls (a cache reset that preempts the
        #: running requests, or a preemption while an output is applied, which vLLM keeps in
        #: `reset_preempted_req_ids`): the next call's output reports them, not as its own
        #: victims.
        self.preempted_between: set[str] = set()
        #: Pauses generation between engine steps (`integrations.vllm.pauses`), if set.
        self.pause: PauseHook | None = None
        #: vLLM 0.34.0's cache-aware window, where a subclass serves it: rule
        #: `cache_aware_order`, and the order `admission_order` holds first admissions to.
        self.cache_aware: CacheAwareCheck | None = None
        #: The model runner's block tables, built from the outputs alone (`runner_tables`).
        self.runner_tables: RunnerTables = RunnerTables()
        #: With a list, one line per event (`note`, `integrations.vllm.trace`).
        self.trace: list[str] | None = None
        #: Whether a trace says a request's spec tokens as a diffusion canvas (not drafts).
        self.canvas_trace: bool = False
        self._schedule_of: dict[int, int] = {}  # id of a queued output -> its schedule number

    def note(self, line: str) -> None:
        """Append `line` to the trace, if one is kept, with the engine step it happened in."""
        if self.trace is not None:
            self.trace.append(f"step {self.n.engine_steps}: {line}")

    # ------------------------------------------------------------------ hooks
    def execute(self, out: Any) -> Any:
        """Run the model on batch `out` as it is scheduled; the result is queued with `out` until
        its output is applied. Subclasses implement it."""
        raise NotImplementedError

    def runner_output(self, executed: Any) -> Any:
        """The model output `update_from_output()` gets for `executed` (what `execute` returned).
        Subclasses implement it."""
        raise NotImplementedError

    def reason(self, finish_reason: Any) -> str:
        """vLLM's finish reason as the loop records it (`check_content`'s "stop" / "length").
        Subclasses implement it."""
        raise NotImplementedError

    def check_request(self, rid: str, tokens: Sequence[int]) -> None:
        """Check request `rid`'s output `tokens` once the loop is drained (`play`), raising
        `EngineCoreViolation`. Subclasses implement it."""
        raise NotImplementedError

    def before_schedule(self) -> None:
        """Called before each `schedule()`."""

    def after_schedule(self, out: Any) -> None:
        """Called after each `schedule()` and its execution (the batch is queued), or, for a
        batch whose sampling is deferred, after its forward pass."""

    def defers(self, out: Any) -> bool:
        """Whether batch `out`'s sampling waits until the oldest batch's output is applied
        (vLLM: an async batch with a structured-output request whose previous output is still
        in flight, `pending_structured_output_tokens`). Default: never."""
        return False

    def execute_deferred(self, out: Any) -> Any:
        """Sample deferred batch `out` once the oldest batch's output is applied (what
        `execute` returns). Subclasses that defer implement it."""
        raise NotImplementedError

    def after_output(self, out: Any, executed: Any) -> None:
        """Called after each `update_from_output()` (`EngineCore.post_step`'s place)."""

    def on_discarded(self, rid: str) -> None:
        """Called for each step of a finished request whose output arrives."""

    def check_pool(self, where: str) -> None:
        """`pool_accounting` at `where` without prefix caching (`check_pool`); a subclass serving
        with prefix caching overrides it."""
        check_pool(self.sched, False, where)

    def lookup_put_off(self, rid: str) -> bool:
        """Whether a KV connector told vLLM to ask again later about request `rid` (vLLM then
        skips it in that `schedule()` call, by design). Default: never."""
        return False

    def waits_for_adapter(self, request: Any) -> bool:
        """Whether waiting `request` needs a LoRA adapter that the running requests' adapters,
        as many as `max_loras` allows, leave no room for (vLLM then skips it, by design).
        Default: never."""
        return False

    def waits_for_encoder(self, rid: str) -> bool:
        """Whether the current `schedule()` call's encoder scheduling cut request `rid`, which it
        left unscheduled, as its multimodal items found no room in the encoder budget or cache
        (vLLM then requeues a waiting one and skips a running one, by design). Default:
        never."""
        return False

    def admission_queue(self, rid: str) -> str:
        """Which of vLLM's waiting queues request `rid` is admitted from, where vLLM keeps
        arrival order only within a queue. Default: one queue for all (0.34.0 with
        `max_num_inflight_kv_loads` keeps the requests its connector may load asynchronously
        in a queue of their own, `async_kv_waiting`)."""
        return "waiting"

    def queue_held(self, queue: str, out: Any) -> bool:
        """Whether vLLM may have stopped taking from its waiting queue `queue` in call `out`
        while it admitted from another (so a request there may be passed by a later one of the
        other queue: `admission_order`). Default: never (one queue)."""
        return False

    # ------------------------------------------------------------------ decisions
    def record_running(self) -> None:
        """Before `schedule()`: the running queue's order and the waiting requests holding
        computed KV, for `check_decisions` (and the cache-aware window's call begins)."""
        if self.cache_aware is not None:
            self.cache_aware.before_schedule(self.n.schedules + 1)
        self.running_before = [r.request_id for r in self.sched.running]
        self.holding_before = {
            r.request_id for r in self.waiting_requests() if r.num_computed_tokens > 0
        }
        # the queues vLLM takes from by their heads (0.34.0's asynchronous-load queue is empty
        # or absent unless it caps in-flight loads)
        async_kv = getattr(self.sched, "async_kv_waiting", ())
        queues = (("waiting", self.sched.waiting), ("async_kv_waiting", async_kv))
        self.queues_before = {name: [r.request_id for r in q] for name, q in queues}
        self.arrivals_before = {r.request_id: r.arrival_time for _, q in queues for r in q}

    def came_after_a_head(self, waiting: str, passer: str, priority: bool) -> bool:
        """Whether a request at or ahead of `waiting` in its queue, as vLLM took from it in
        the call, arrived after `passer`, a request of the other queue. vLLM takes from its
        two waiting queues by comparing their heads' arrivals (`_next_waiting_queue`), and a
        queue is not always in arrival order (a preempted request goes back to its head; the
        cache-aware window moves a later arrival ahead), so such a head lets the other
        queue's request go first, and `waiting`, at or behind it, is passed. A priority queue
        pops in order: never."""
        if priority:
            return False
        arrival = self.sched.requests[passer].arrival_time

        def passed_in(order: list[str]) -> bool:
            if waiting not in order:
                return False
            ahead = order[: order.index(waiting) + 1]
            return any(self.arrivals_before.get(h, arrival) > arrival for h in ahead)

        queue = self.admission_queue(waiting)
        passed = passed_in(self.queue_order(queue))
        if passed and self.cache_aware is not None and self.cache_aware.left is not None:
            # counted where only the window's order puts a later arrival at or ahead of it
            self.cache_aware.counts.window_passes += not passed_in(
                self.queues_before.get(queue, [])
            )
        return passed

    def queue_order(self, queue: str) -> list[str]:
        """vLLM's waiting queue `queue` as the call took from it: as it stood before the
        call, but the plain queue as the cache-aware window left it where the window ran."""
        left = self.cache_aware.left if self.cache_aware is not None else None
        if queue == "waiting" and left is not None:
            return left
        return self.queues_before.get(queue, [])

    def queue_key(self, rid: str, priority: bool) -> tuple[float, ...]:
        """vLLM's order within a waiting queue, smaller first: the policy's (`policy_key`);
        with the cache-aware window, the order it left (`CacheAwareCheck.key`)."""
        if self.cache_aware is not None:
            return (self.cache_aware.key(rid),)
        return self.policy_key(rid, priority)

    def policy_key(self, rid: str, priority: bool) -> tuple[float, ...]:
        """The policy's order, smaller first: arrival under FCFS, (priority, arrival) under
        the priority policy. vLLM compares its two waiting queues' heads by it, the window
        not counted."""
        r = self.sched.requests[rid]
        return (r.priority, r.arrival_time) if priority else (r.arrival_time,)

    def precedes(self, waiting: str, rid: str, priority: bool) -> bool:
        """Whether `waiting` comes before `rid` in vLLM's admission order: in the order of
        their queue (`queue_key`) where they share one, else in the policy's (`policy_key`),
        by which vLLM merges its queues."""
        if self.admission_queue(waiting) == self.admission_queue(rid):
            return self.queue_key(waiting, priority) < self.queue_key(rid, priority)
        return self.policy_key(waiting, priority) < self.policy_key(rid, priority)

    def check_decisions(
        self, out: Any, *, max_num_batched_tokens: int, max_num_seqs: int, priority: bool
    ) -> None:
        """What holds of one `schedule()` call whatever is in flight (`record_running` called
        before it): `token_budget` (at most `max_num_batched_tokens` scheduled), `seat_cap`
        (at most `max_num_seqs` running), `preemption_victim` (the k requests it preempted
        are the last k of the running queue before it under FCFS, the k largest by
        (priority, arrival) under priority: vLLM admits nothing after a preemption in the same
        call, so the queue only shrank), `admission_order` (a request scheduled for the first
        time passes no waiting, never-scheduled request before it in the policy's order; a
        resumed request may be skipped while its stale output drains, a fresh one never; one
        waiting for its grammar to compile, or for its KV to load through a KV connector, or
        whose connector lookup was put off (`lookup_put_off`), or whose LoRA adapter finds
        no room among the running requests' (`waits_for_adapter`), or whose multimodal items
        found no room for the encoder (`waits_for_encoder`), may be passed, as vLLM
        skips it by design; a request given blocks to load its KV into is
        admitted in that call, since vLLM then serves it before the waiting queue; where vLLM
        keeps more than one waiting queue (`admission_queue`), it holds across them too, in
        the policy's order, the window's holding within the plain queue (`precedes`), but a
        request of a queue vLLM held back in the call (`queue_held`), or one at or behind a
        head that arrived later (`came_after_a_head`), may be passed by one of another)."""
        where = f"schedule {self.n.schedules}"
        if out.total_num_scheduled_tokens > max_num_batched_tokens:
            raise EngineCoreViolation(
                "token_budget",
                f"{where} scheduled {out.total_num_scheduled_tokens} tokens; "
                f"max_num_batched_tokens={max_num_batched_tokens}",
            )
        if len(self.sched.running) > max_num_seqs:
            raise EngineCoreViolation(
                "seat_cap",
                f"{where} left {len(self.sched.running)} requests running; "
                f"max_num_seqs={max_num_seqs}",
            )
        preempted = set(out.preempted_req_ids or ()) - self.preempted_between
        self.preempted_between = set()
        self.check_waiting_drops(out, preempted - set(self.running_before), where)
        preempted &= set(self.running_before)
        if preempted:
            before = self.running_before
            ordered = sorted(before, key=lambda r: self.queue_key(r, True)) if priority else before
            expected = set(ordered[len(ordered) - len(preempted) :])
            if preempted != expected:
                order = "largest (priority, arrival)" if priority else "last"
                raise EngineCoreViolation(
                    "preemption_victim",
                    f"{where} preempted {sorted(preempted)} of running {before}; the "
                    f"{order} {len(preempted)} are {sorted(expected)}",
                )
        waiting = self.waiting_requests()
        admitted = [rid for rid in out.num_scheduled_tokens if rid not in self.ever_scheduled]
        # a request given blocks to load its KV into (KV connector) is admitted then
        admitted += [
            r.request_id
            for r in waiting
            if waiting_for_remote_kv(r) and r.request_id not in self.ever_scheduled
        ]
        # vLLM skips a request whose grammar is still compiling, whose KV is still loading
        # from a KV connector, or whose connector said "ask again later", by design: it may
        # be passed
        fresh = [
            r.request_id
            for r in (waiting if admitted else ())  # only an admission can pass one
            if r.request_id not in self.ever_scheduled
            and not waiting_for_grammar(r)
            and not waiting_for_remote_kv(r)
            and not self.lookup_put_off(r.request_id)
            and not self.waits_for_adapter(r)
            and not self.waits_for_encoder(r.request_id)
        ]
        for rid in admitted:
            queue = self.admission_queue(rid)
            earlier = [w for w in fresh if self.precedes(w, rid, priority)]
            held = [
                w
                for w in earlier
                if self.admission_queue(w) != queue
                and (
                    self.queue_held(self.admission_queue(w), out)
                    or self.came_after_a_head(w, rid, priority)
                )
            ]
            self.queue_passes += len(held)
            passed = [w for w in earlier if w not in held]
            if passed:
                policy = "priority" if priority else "fcfs"
                other = sorted({self.admission_queue(w) for w in passed} - {queue})
                across = (
                    f" (in {', '.join(other)}, {rid!r} in {queue}: vLLM takes from its waiting "
                    "queues in that order unless it holds one back, the asynchronous one with "
                    "the load cap reached, the plain one with no running slot or token budget "
                    "left, and this call held neither; no head ahead of them arrived later)"
                    if other
                    else ""
                )
                raise EngineCoreViolation(
                    "admission_order",
                    f"{where} admitted {rid!r} for the first time while {passed} "
                    f"(never scheduled, earlier in the {policy} order) still wait{across}",
                )
        self.ever_scheduled.update(admitted)

    def serve_cache_aware(
        self,
        window: int,
        threshold: float,
        block_size: int,
        read_limit: Callable[[str], int | None] = lambda _rid: None,
    ) -> None:
        """Check vLLM 0.34.0's cache-aware window (`CacheAwareCheck`) over this loop's
        scheduler, blocks of `block_size` tokens, each request's cache read limit as
        `read_limit` says (default: none). A subclass calls it where vLLM applies the window
        (FCFS with prefix caching); each request it submits then joins with
        `cache_aware.submit`."""
        # imported here: the check raises this module's EngineCoreViolation
        from integrations.vllm.cache_aware_check import CacheAwareCheck

        self.cache_aware = CacheAwareCheck(
            self.sched,
            window=window,
            threshold=threshold,
            block_size=block_size,
            read_limit=read_limit,
            ever_scheduled=self.ever_scheduled,
            note=self.note,
        )

    def check_cache_aware(self, out: Any, *, held: bool) -> None:
        """`cache_aware_order` over the call that returned `out` (`held`: whether the prefill
        cadence held it), where the window is served; before `check_decisions`, which takes
        its order."""
        if self.cache_aware is None:
            return
        admitted = [rid for rid in out.num_scheduled_tokens if rid not in self.ever_scheduled]
        self.cache_aware.after_schedule(admitted, f"schedule {self.n.schedules}", held=held)

    def check_waiting_drops(self, out: Any, dropped: set[str], where: str) -> None:
        """`preemption_victim` of the requests a call reports preempted that were not running
        before it: each must have waited holding computed KV (a streaming session's kept KV)
        and hold none after the call, unscheduled. That is a waiting request's KV dropped and
        told to the workers and the KV connector as a preemption is (the candidate fix
        `drop-stalled-session-kv`); released vLLM reports only running requests."""
        for rid in sorted(dropped):
            req = self.sched.requests.get(rid)
            kept = req is not None and req.num_computed_tokens > 0
            if rid not in self.holding_before or kept or rid in out.num_scheduled_tokens:
                raise EngineCoreViolation(
                    "preemption_victim",
                    f"{where} preempted {rid!r}, which was not running "
                    f"{list(self.running_before)}"
                    + (
                        " and held no computed KV waiting"
                        if rid not in self.holding_before
                        else ", and kept its KV or was scheduled: a waiting request's drop "
                        "frees its KV and leaves it waiting"
                    ),
                )

    def check_idle_step(self, out: Any) -> None:
        """`idle_step` (the synchronous loop): a `schedule()` call that schedules nothing
        leaves no request running that it did not preempt, unless generation is paused.
        A running request left over could have run: its blocks are its own and the budget
        is untouched. A call whose every running request preempted itself may schedule
        nothing (vLLM admits nothing after a preemption), and under async scheduling an
        empty call is the batch queue's normal wait, so neither is checked; nor is a request
        whose multimodal items found no room for the encoder (`waits_for_encoder`), which vLLM
        skips by design."""
        if self.async_scheduling or out.total_num_scheduled_tokens:
            return
        preempted = set(out.preempted_req_ids or ())
        left = [
            rid
            for rid in self.running_before
            if rid not in preempted and not self.waits_for_encoder(rid)
        ]
        paused = self.pause is not None and self.pause.paused is not None
        if left and not paused:
            gone = f"; it preempted {sorted(preempted)}" if preempted else ""
            raise EngineCoreViolation(
                "idle_step",
                f"schedule {self.n.schedules} scheduled nothing while {left} stayed running{gone}",
            )

    def check_kv_covers(self, out: Any) -> None:
        """`kv_covers_scheduled`: after `schedule()`, every request it scheduled holds blocks
        for all its computed tokens, this call's and those in flight included
        (`num_computed_tokens`, which `schedule()` has advanced), in every KV cache group, each
        in blocks of its own size. A sliding-window group of W tokens may hold the null block
        for a block that left its window, but not for one its attention still reads: the
        blocks of the W - 1 tokens before the first token the call schedules, and those after
        it, are real blocks. A Mamba group (`check_state_blocks`) holds the state its step
        reads and the one it writes instead."""
        sizes = group_block_sizes(self.sched)
        for group, tables in enumerate(all_group_tables(self.sched)):
            window = window_tokens(self.sched, group)
            block_size = sizes[group]
            where = f" in KV cache group {group}" if group else ""
            mode = mamba_mode(self.sched, group)
            if mode is not None:
                self.check_state_blocks(out, tables, block_size, mode, where)
                continue
            for rid, scheduled in out.num_scheduled_tokens.items():
                computed = self.sched.requests[rid].num_computed_tokens
                table = tables.get(rid, ())
                if len(table) * block_size < computed:
                    raise EngineCoreViolation(
                        "kv_covers_scheduled",
                        f"schedule {self.n.schedules}: {rid!r} has {computed} tokens computed or "
                        f"scheduled but holds {len(table)} blocks of {block_size}{where}",
                    )
                if window is None:
                    continue
                start = computed - scheduled
                first = max(0, start - window + 1) // block_size
                nulls = [k for k in range(first, -(-computed // block_size)) if table[k] is None]
                if nulls:
                    raise EngineCoreViolation(
                        "kv_covers_scheduled",
                        f"schedule {self.n.schedules}: {rid!r} is scheduled from token {start} "
                        f"with a window of {window} tokens, but holds the null block as its "
                        f"block {nulls[0]}{where} (its window reads tokens from "
                        f"{max(0, start - window + 1)} on)",
                    )

    def check_state_blocks(
        self,
        out: Any,
        tables: dict[str, tuple[int | None, ...]],
        block_size: int,
        mode: str,
        where: str,
    ) -> None:
        """`kv_covers_scheduled` in a Mamba group: a step of a request scheduled from token s to
        token e reads the state after s and leaves the state after e. In "align" mode vLLM's
        worker copies the state from the block of token s - 1 into the block of token e - 1
        before the forward, which updates it there (`preprocess_mamba`): both are real
        blocks. In "none" mode the state lives in the request's first block, updated in
        place: a real block."""
        for rid, scheduled in out.num_scheduled_tokens.items():
            end = self.sched.requests[rid].num_computed_tokens
            start = end - scheduled
            table = tables.get(rid, ())
            wanted = (
                {0}
                if mode != "align"
                else {(end - 1) // block_size} | ({(start - 1) // block_size} if start else set())
            )
            for k in sorted(wanted):
                if k >= len(table) or table[k] is None:
                    held = "holds no block" if k >= len(table) else "holds the null block"
                    raise EngineCoreViolation(
                        "kv_covers_scheduled",
                        f"schedule {self.n.schedules}: {rid!r} is scheduled from token {start} "
                        f"to {end} but {held} as its block {k}{where}, a Mamba state block its "
                        f"step reads or writes ({mode} mode)",
                    )

    def check_runner_tables(self, out: Any) -> None:
        """`runner_tables`: the model runner, handed `out`, holds for every request it
        schedules the block table the scheduler holds, and holds no request vLLM freed without
        reporting it (`integrations.vllm.runner_tables`)."""
        tables = self.runner_tables
        problem = (
            tables.apply(out) or tables.mismatch(self.sched, out) or tables.orphans(self.sched)
        )
        if problem is not None:
            raise EngineCoreViolation("runner_tables", f"schedule {self.n.schedules}: {problem}")

    # ------------------------------------------------------------------ pipeline cadence
    def count_cadence_waits(self) -> None:
        """Before `schedule()`: count the running requests it will hold back for the pipeline
        cadence (it advances `current_step`, then skips a request below its
        `next_decode_eligible_step`)."""
        step = self.sched.current_step + 1
        self.n.cadence_waits += sum(step < r.next_decode_eligible_step for r in self.sched.running)

    def check_cadence(self, decoded: Iterable[str], stages: int) -> None:
        """`pp_cadence`: two decode steps of one request (`decoded`: the requests batch
        `self.n.schedules` decodes) are at least `stages` schedules apart while the first is
        in flight. vLLM: "V2+PP+async: enforce `pp_size` steps between same-req decodes to
        match worker-side sampled-tokens broadcast slot ring cadence". Once the first step's
        output is applied the pipeline holds no step of the request (a pause drains it, and
        a cache reset then preempts the request to recompute at once): `last_decode` forgets
        it then."""
        now = self.n.schedules
        for rid in decoded:
            last = self.last_decode.get(rid)
            if last is not None and now - last < stages:
                raise EngineCoreViolation(
                    "pp_cadence",
                    f"{rid!r} was scheduled decode steps at schedules {last} and {now}, "
                    f"fewer than pipeline_parallel_size={stages} apart",
                )
            self.last_decode[rid] = now

    # ------------------------------------------------------------------ the loop
    def engine_step(self) -> None:
        """One engine-core step: schedule a batch if the queue has room (and, async, return at
        once while it still has room), else apply the oldest batch's output."""
        sched = self.sched
        if self.pause is not None:  # pause or resume generation first
            live = [rid for rid in self.outputs if rid not in self.reasons]
            outputs = sum(map(len, self.outputs.values()))
            self.preempted_between |= self.pause.step(
                self.n.engine_steps, live, bool(self.queue), outputs
            )
        self.n.engine_steps += 1
        deferred = None
        if sched.has_requests():
            self.before_schedule()
            out = call_vllm("schedule", sched.schedule)
            self.n.schedules += 1
            self._schedule_number[id(out)] = self.n.schedules
            if self.trace is not None:
                self._schedule_of[id(out)] = self.n.schedules
                line = schedule_line(out, canvas=self.canvas_trace)
                self.note(f"schedule {self.n.schedules}: {line}")
            self.check_pool(f"after schedule() {self.n.schedules}")
            self.check_runner_tables(out)
            if out.total_num_scheduled_tokens > 0 and self.defers(out):
                deferred = out
                self.after_schedule(out)
                if not self.queue:  # vLLM would pop an empty batch queue
                    raise EngineCoreViolation(
                        "implementation_error",
                        f"schedule {self.n.schedules} deferred sampling for a previous output, "
                        "but no batch is in flight",
                    )
            else:
                self.queue.appendleft((out, self.execute(out)))
                self.after_schedule(out)
                room = len(self.queue) < self.queue_size
                if room and (out.total_num_scheduled_tokens > 0 or sched.has_requests()):
                    return
        elif not self.queue:
            return
        out, executed = self.queue.pop()
        landed = self._schedule_number.pop(id(out), None)
        for rid in out.num_scheduled_tokens:
            if self.last_decode.get(rid) == landed:
                del self.last_decode[rid]  # its step is out of the pipeline
            if rid in self.reasons:
                self.n.discarded += 1
                self.on_discarded(rid)
        model_output = self.runner_output(executed)
        engine_outputs = call_vllm(
            "update_from_output", lambda: sched.update_from_output(out, model_output)
        )
        # a request preempted while the output was applied (the candidate fix
        # `hear-failed-sync-load` preempts the holders of a failed load's blocks) is
        # reported by the next schedule() as a preemption, not as one of its victims
        self.preempted_between |= set(getattr(sched, "reset_preempted_req_ids", ()))
        if self.trace is not None:
            number = self._schedule_of.pop(id(out), 0)
            self.note(f"output of schedule {number}: {output_line(engine_outputs)}")
        for per_client in engine_outputs.values():
            for o in per_client.outputs:
                self.outputs[o.request_id].extend(int(t) for t in o.new_token_ids)
                if o.finish_reason is not None:
                    self.finished(o.request_id, self.reason(o.finish_reason))
        self.after_output(out, executed)
        self.check_pool(f"after update_from_output() of schedule {self.n.schedules}")
        if deferred is not None:
            self.queue.appendleft((deferred, self.execute_deferred(deferred)))

    def finished(self, rid: str, reason: str) -> None:
        """vLLM reported `rid` finished with `reason` (as `reason` maps it): it has ended."""
        self.reasons[rid] = reason

    def finish(self, request_id: str, finish: Callable[[], Any]) -> None:
        """Abort `request_id` with `finish` (the scheduler's abort), counting it when a step of
        it is in flight, and check the pool."""
        if any(request_id in o.num_scheduled_tokens for o, _ in self.queue):
            self.n.aborts_in_flight += 1
        self.note(f"abort {request_id}")
        call_vllm("abort", finish)
        self.reasons[request_id] = ABORTED
        self.check_pool(f"after aborting {request_id!r}")

    def waiting_requests(self) -> list[Any]:
        """The scheduler's waiting requests, queue by queue (`adapter.waiting_requests`)."""
        return list(waiting_requests(self.sched))

    def busy(self) -> bool:
        """vLLM still has a request counted unfinished, a batch is in flight, or generation is
        paused (its requests left waiting for the resume)."""
        paused = self.pause is not None and self.pause.paused is not None
        return bool(self.sched.has_requests() or self.queue) or paused

    #: `progress`: the loop must drain within this many engine steps.
    drain_limit = 10_000

    def drain(self) -> None:
        """Engine steps until not `busy`; after `drain_limit` steps with work left raise
        `EngineCoreViolation` (`progress`)."""
        max_engine_steps = self.drain_limit
        for _ in range(max_engine_steps):
            if not self.busy():
                return
            self.engine_step()
        running, waiting = self.sched.get_request_counts()
        raise EngineCoreViolation(
            "progress",
            f"not drained after {max_engine_steps} engine steps: {running} running, "
            f"{waiting} waiting, {len(self.queue)} batches in flight{self.stall_detail()}",
        )

    def stall_detail(self) -> str:
        """What `progress`'s message adds about the requests left (nothing by default)."""
        return ""

    def play(
        self,
        arrivals: Sequence[Sequence[Any]],
        aborts: Sequence[Sequence[str]],
        submit: Callable[[Any], object],
        abort: Callable[[str], None],
        *,
        inputs: Sequence[Sequence[Any]] = (),
        send: Callable[[Any], None] | None = None,
        before_drain: Callable[[], None] | None = None,
    ) -> None:
        """Per engine step its aborts, then its arrivals, then its `inputs` (each given to
        `send`), then the step; then `before_drain`, drain, and check the end state and every
        request's output."""
        for index, (step_aborts, step_arrivals) in enumerate(zip(aborts, arrivals, strict=True)):
            for rid in step_aborts:
                abort(rid)
            for req in step_arrivals:
                submit(req)
            if inputs and send is not None:
                for item in inputs[index]:
                    send(item)
            self.engine_step()
        if before_drain is not None:
            before_drain()
        self.drain()
        check_drained(self.sched)
        orphans = self.runner_tables.orphans(self.sched)
        if orphans is not None:
            raise EngineCoreViolation("runner_tables", f"drained, but {orphans}")
        for rid, tokens in self.outputs.items():
            self.check_request(rid, tokens)


RunT = TypeVar("RunT")


def waiting_for_grammar(request: Any) -> bool:
    """vLLM request `request` waits for its structured-output grammar to compile."""
    return bool(request.status.name == "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR")


def waiting_for_remote_kv(request: Any) -> bool:
    """vLLM request `request` waits for its KV to load through a KV connector."""
    return bool(request.status.name == "WAITING_FOR_REMOTE_KVS")


def run_named(async_scheduling: bool, run: Callable[[bool], RunT]) -> RunT:
    """`run(async_scheduling)`; a violation is raised again with the loop named
    (`"[rule] async loop: ..."`)."""
    try:
        return run(async_scheduling)
    except EngineCoreViolation as err:
        mode = "async" if async_scheduling else "sync"
        raise EngineCoreViolation(err.rule, f"{mode} loop: {err.detail}") from err


def run_both(run: Callable[[bool], RunT]) -> tuple[RunT, RunT]:
    """`run(async_scheduling)` for the synchronous loop, then the asynchronous one, each
    `run_named`: the first violation stops both."""
    return run_named(False, run), run_named(True, run)


def check_program_steps(kind: str, arrivals: Sequence[object], aborts: Sequence[object]) -> None:
    """A program gives one tuple of aborts per step of arrivals (ValueError otherwise)."""
    if len(aborts) != len(arrivals):
        raise ValueError(
            f"{kind}: {len(arrivals)} steps of arrivals but {len(aborts)} of aborts; give one "
            "tuple of aborts per step (empty for none)"
        )


def first_difference(got: Sequence[Any], want: Sequence[Any]) -> int:
    """The first index at which `got` and `want` differ (the shorter one's length if it is a
    prefix of the other; both lengths if they are equal)."""
    return next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
        min(len(got), len(want)),
    )


def check_content(
    rid: str,
    tokens: Sequence[int],
    reason: str | None,
    *,
    max_tokens: int,
    stop_after: int | None,
    token: Callable[[int], int],
) -> None:
    """`output_content` and `finish_reason` of a finished request whose output token number i
    is `token(i)`: exactly tokens 1..k, k its stop index or max_tokens (an aborted request's a
    prefix of them), and the reason k implies."""
    if reason is None:
        raise EngineCoreViolation("progress", f"{rid!r} never finished")
    stop = stop_after if stop_after is not None else max_tokens + 1
    expected = [token(i) for i in range(1, min(stop, max_tokens) + 1)]
    if reason == ABORTED:
        expected = expected[: len(tokens)]
    if list(tokens) != expected:
        at = first_difference(tokens, expected)
        got = "missing" if at >= len(tokens) else _describe(tokens[at], token, max_tokens)
        raise EngineCoreViolation(
            "output_content",
            f"{rid!r} produced {len(tokens)} tokens, expected {len(expected)}; they first "
            f"differ at output {at + 1}: {got}",
        )
    if reason != ABORTED:
        want = "stop" if stop <= max_tokens else "length"
        if reason != want:
            raise EngineCoreViolation(
                "finish_reason", f"{rid!r} finished with {reason}, expected {want}"
            )


def _describe(got: int, token: Callable[[int], int], max_tokens: int) -> str:
    for i in range(1, 2 * max_tokens + 2):
        if token(i) == got:
            return f"got its output {i}"
    return f"got token {got}, not one of its own"


def call_vllm(what: str, call: Callable[[], Any]) -> Any:
    """`call()`; vLLM raising is a finding (`implementation_error`), reported with its type and
    text. A check that runs inside the call (a KV connector's, which vLLM calls) raises its
    own violation, which passes through."""
    try:
        return call()
    except EngineCoreViolation:
        raise
    except Exception as err:
        raise EngineCoreViolation(
            "implementation_error", f"vLLM raised in {what}: {_raised(err)}"
        ) from err


def _raised(err: BaseException) -> str:
    """`Type: text`; for a bare `assert` (no text) the failing statement and where it is."""
    if str(err) or not isinstance(err, AssertionError):
        return f"{type(err).__name__}: {err}"
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "AssertionError"
    last = frames[-1]
    where = last.filename.split("site-packages/")[-1]
    return f"AssertionError at {where}:{last.lineno} ({statement_of(last)})"


def check_pool(sched: Any, prefix_caching: bool, where: str) -> None:
    """`pool_accounting` of a vLLM scheduler: every non-null block free or held, not both; one
    holder each without prefix caching; with it, reference count = holders. A block whose free
    vLLM defers until a step in flight is done (`deferred_frees`: a KV connector's consumer
    under async scheduling) is held by that free. A holder is a request in one KV cache
    group; a hybrid cache's groups share the pool."""
    pool = sched.kv_cache_manager.block_pool
    try:
        free = set(free_block_ids(pool))
    except FreeQueueCorrupt as err:  # a double free: named here, not a hang in vLLM's walk
        raise EngineCoreViolation("pool_accounting", f"{where}: {err}") from None
    groups = all_group_tables(sched)
    deferred = getattr(sched, "deferred_frees", ())
    if not deferred and _pool_consistent(pool, free, groups, prefix_caching):
        return  # the common case, checked in bulk; the walk below names what is wrong
    holders: dict[int, list[str]] = {}
    for group, tables in enumerate(groups):
        for rid, table in tables.items():
            holder = f"{rid} (group {group})" if len(groups) > 1 else rid
            for b in table:
                if b is not None:
                    holders.setdefault(b, []).append(holder)
    for fence, blocks in deferred:
        for block in blocks:
            if not block.is_null:
                holders.setdefault(block.block_id, []).append(f"a free deferred to step {fence}")
    for b, rids in sorted(holders.items()):
        if b in free:
            raise EngineCoreViolation(
                "pool_accounting", f"{where}: block {b} is free and held by {rids}"
            )
        if not prefix_caching and len(rids) > 1:
            raise EngineCoreViolation(
                "pool_accounting", f"{where}: block {b} is held by {rids} (no prefix caching)"
            )
        if prefix_caching and pool.blocks[b].ref_cnt != len(rids):
            raise EngineCoreViolation(
                "pool_accounting",
                f"{where}: block {b} has reference count {pool.blocks[b].ref_cnt} "
                f"but {len(rids)} holders {rids}",
            )


def _pool_consistent(pool: Any, free: set[int], groups: GroupTables, prefix_caching: bool) -> bool:
    """Whether `check_pool` (no deferred frees) finds nothing, decided with C-speed set and
    counter operations on the held blocks rather than naming each block's holders."""
    held = [b for tables in groups for table in tables.values() for b in table if b is not None]
    if not free.isdisjoint(held):
        return False
    if not prefix_caching:
        return len(set(held)) == len(held)
    blocks = pool.blocks
    return all(blocks[b].ref_cnt == n for b, n in Counter(held).items())


def check_drained(sched: Any) -> None:
    """`no_leak` of a drained vLLM scheduler: no request left, every usable block of its pool
    free (block 0 is vLLM's null block)."""
    left = sorted(sched.requests)
    if left:
        raise EngineCoreViolation("no_leak", f"drained, but vLLM still holds requests {left}")
    usable = len(sched.kv_cache_manager.block_pool.blocks) - 1
    free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    if free != usable:
        raise EngineCoreViolation(
            "no_leak", f"drained, but {usable - free} of {usable} usable blocks are not free"
        )


__all__ = [
    "ABORTED",
    "ASYNC_BATCH_QUEUE",
    "SCHEDULE_RULES",
    "BatchQueueLoop",
    "EngineCoreViolation",
    "LoopCounts",
    "call_vllm",
    "check_content",
    "check_drained",
    "check_pool",
    "check_program_steps",
    "first_difference",
    "run_both",
    "run_named",
    "waiting_for_remote_kv",
]
