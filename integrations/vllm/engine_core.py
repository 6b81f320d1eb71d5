"""vLLM 0.33.0's engine-core loop over its real scheduler, synchronous or asynchronous, and
the checks that hold of both.

vLLM schedules asynchronously by default (`SchedulerConfig.async_scheduling`; the scheduler is
then `AsyncScheduler`). `EngineCore.step_with_batch_queue` (`vllm/v1/engine/core.py`) keeps a
batch queue of two: it schedules step N+1 while step N still runs, and applies N's output only
afterwards. So a decode request is scheduled for the output token its previous step has not yet
sampled (`Request.num_output_placeholders`); a request preempted while a step of it is in flight
gets that step's output later, as stale output (`num_stale_output_tokens`), and is not resumed
before it drains; an abort can land while a step of the request is in flight; a request that
stops at step N has already been scheduled at N+1, whose work is then thrown away.

The AR spec's step contract has one batch in flight (`spec.ar.events`), so the conformance
suite cannot follow this loop event by event. `EngineCoreLoop` runs it the way the engine core
does, with the adapter's fabricated model (`integrations.vllm.adapter`), and checks what must
hold whatever the timing:

- content (`output_content`): every request's output tokens are exactly its own tokens
  1..k, k its stop index or max_tokens — an aborted request's a prefix of them — since the
  fabricated model fixes each token by request and index, a token lost, repeated or out of
  order shows; the finish reason is the one k implies (`finish_reason`);
- pool (`pool_accounting`), after every `schedule()`, `update_from_output()` and abort: each
  non-null block is free or held, not both; without prefix caching held by at most one request;
  with it, its reference count is the number of requests holding it;
- end (`no_leak`): once the loop is drained, no request is left and every block is free;
- progress (`progress`): the loop drains within a bound;
- vLLM raising is `implementation_error`.

`check_both(program)` runs a program through the synchronous loop (the control) and the
asynchronous one. The content rule fixes every output and reason, so it also says that both
loops produce the same. Depends on `spec` and the adapter; vLLM is imported when the first
loop is built.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from integrations.vllm.adapter import SPACE, SPACE_PREFIX, RealVllmScheduler
from integrations.vllm.differential import program as decision_program
from spec.ar.config import ArConfig, ArRequest
from spec.errors import RequestError

#: The engine core's batch queue: 2 with async scheduling (`max_concurrent_batches`), else 1.
ASYNC_BATCH_QUEUE = 2
ABORTED = "abort"


class EngineCoreViolation(Exception):
    """A rule the engine-core loop broke: `rule` (one of `RULES`) and what was seen."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"[{rule}] {detail}")
        self.rule = rule
        self.detail = detail


RULES = (
    "output_content",
    "finish_reason",
    "pool_accounting",
    "no_leak",
    "progress",
    "implementation_error",
)


@dataclass(frozen=True, slots=True)
class CoreProgram:
    """A configuration and, per engine step, the requests that arrive and the ids aborted
    before it (then the loop drains)."""

    config: ArConfig
    arrivals: tuple[tuple[ArRequest, ...], ...]
    aborts: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if len(self.aborts) != len(self.arrivals):
            raise ValueError(
                f"CoreProgram: {len(self.arrivals)} steps of arrivals but {len(self.aborts)} "
                "of aborts; give one tuple of aborts per step (empty for none)"
            )


@dataclass(frozen=True, slots=True)
class CoreRun:
    """What one loop did: outputs and reasons per request, and how often the asynchronous
    paths were taken."""

    outputs: dict[str, tuple[int, ...]]
    reasons: dict[str, str]
    engine_steps: int
    schedules: int
    ahead: int  # requests scheduled with an output of theirs still in flight
    stale: int  # preemptions with a step of the request in flight (its output then stale)
    aborts_in_flight: int  # aborts of a request with a step in flight
    discarded: int  # scheduled steps of a request that had finished when their output came


@dataclass
class _Counts:
    engine_steps: int = 0
    schedules: int = 0
    ahead: int = 0
    stale: int = 0
    aborts_in_flight: int = 0
    discarded: int = 0


class EngineCoreLoop:
    """vLLM's engine core over the real scheduler: `engine_step()` is one call of
    `step_with_batch_queue` (batch queue of 2, async) or of `step` (1, sync), the model
    fabricated. `mutate`, if given, is applied to the scheduler once built (seeded bugs)."""

    def __init__(
        self,
        config: ArConfig,
        *,
        async_scheduling: bool,
        mutate: Callable[[Any], None] | None = None,
    ) -> None:
        space = SPACE_PREFIX if config.enable_prefix_caching else SPACE
        self.impl = RealVllmScheduler(
            config, lambda _event: None, space, async_scheduling=async_scheduling
        )
        self.sched: Any = self.impl.sched
        if mutate is not None:
            mutate(self.sched)
        self.config = config
        self.queue_size = ASYNC_BATCH_QUEUE if async_scheduling else 1
        self.queue: deque[tuple[Any, Any]] = deque()
        self.outputs: dict[str, list[int]] = {}
        self.reasons: dict[str, str] = {}
        self.n = _Counts()

    # ------------------------------------------------------------------ driving
    def submit(self, request: ArRequest) -> bool:
        """Add a request; False if it is refused as invalid (both loops refuse alike)."""
        try:
            self.impl.submit(request)
        except RequestError:
            return False
        self.outputs[request.request_id] = []
        return True

    def abort(self, request_id: str) -> None:
        """Abort a live request (one already finished or never submitted: nothing)."""
        if request_id not in self.outputs or request_id in self.reasons:
            return
        req = self.sched.requests.get(request_id)
        if req is not None and req.num_in_flight_tokens > 0:
            self.n.aborts_in_flight += 1
        self._call("abort", lambda: self.impl.abort(request_id))
        self.reasons[request_id] = ABORTED
        self.check_pool(f"after aborting {request_id!r}")

    def engine_step(self) -> None:
        """One engine-core step: schedule a batch if the queue has room (and, async, return at
        once while it still has room), else apply the oldest batch's output."""
        sched = self.sched
        self.n.engine_steps += 1
        if sched.has_requests():
            for req in sched.running:
                if req.num_output_placeholders > 0:
                    self.n.ahead += 1
            stale_before = {r.request_id for r in self.impl._waiting() if r.num_stale_output_tokens}
            out = self._call("schedule", sched.schedule)
            self.n.schedules += 1
            self.n.stale += sum(
                1
                for r in self.impl._waiting()
                if r.num_stale_output_tokens and r.request_id not in stale_before
            )
            self.check_pool(f"after schedule() {self.n.schedules}")
            self.queue.appendleft((out, self.impl._fabricate(dict(out.num_scheduled_tokens))))
            room = len(self.queue) < self.queue_size
            if room and (out.total_num_scheduled_tokens > 0 or sched.has_requests()):
                return
        elif not self.queue:
            return
        out, model_output = self.queue.pop()
        for rid in out.num_scheduled_tokens:
            if rid in self.reasons:
                self.n.discarded += 1
        engine_outputs = self._call(
            "update_from_output", lambda: sched.update_from_output(out, model_output)
        )
        for per_client in engine_outputs.values():
            for o in per_client.outputs:
                self.outputs[o.request_id].extend(int(t) for t in o.new_token_ids)
                if o.finish_reason is not None:
                    self.reasons[o.request_id] = self.impl._reason(o.finish_reason).value
                    self.impl.ended.add(o.request_id)
        self.check_pool(f"after update_from_output() of schedule {self.n.schedules}")

    def busy(self) -> bool:
        return bool(self.sched.has_requests() or self.queue)

    def drain(self, max_engine_steps: int = 10_000) -> None:
        for _ in range(max_engine_steps):
            if not self.busy():
                return
            self.engine_step()
        running, waiting = self.sched.get_request_counts()
        raise EngineCoreViolation(
            "progress",
            f"not drained after {max_engine_steps} engine steps: {running} running, "
            f"{waiting} waiting, {len(self.queue)} batches in flight",
        )

    def run(self, program: CoreProgram) -> CoreRun:
        """The program: per engine step its aborts, then its arrivals, then the step; then
        drain, and check content, reasons and the end state."""
        for aborts, arrivals in zip(program.aborts, program.arrivals, strict=True):
            for rid in aborts:
                self.abort(rid)
            for req in arrivals:
                self.submit(req)
            self.engine_step()
        self.drain()
        self.check_end()
        return CoreRun(
            {rid: tuple(t) for rid, t in self.outputs.items()},
            dict(self.reasons),
            **asdict(self.n),
        )

    # ------------------------------------------------------------------ checks
    def check_pool(self, where: str) -> None:
        """Every non-null block free or held, not both; one holder each without prefix
        caching; with it, reference count = holders."""
        pool = self.sched.kv_cache_manager.block_pool
        free = {b.block_id for b in pool.free_block_queue.get_all_free_blocks() if not b.is_null}
        holders: dict[int, list[str]] = {}
        for rid, table in self.impl._tables().items():
            for b in table:
                holders.setdefault(b, []).append(rid)
        for b, rids in sorted(holders.items()):
            if b in free:
                raise EngineCoreViolation(
                    "pool_accounting", f"{where}: block {b} is free and held by {rids}"
                )
            if not self.config.enable_prefix_caching and len(rids) > 1:
                raise EngineCoreViolation(
                    "pool_accounting", f"{where}: block {b} is held by {rids} (no prefix caching)"
                )
            if self.config.enable_prefix_caching and pool.blocks[b].ref_cnt != len(rids):
                raise EngineCoreViolation(
                    "pool_accounting",
                    f"{where}: block {b} has reference count {pool.blocks[b].ref_cnt} "
                    f"but {len(rids)} holders {rids}",
                )

    def check_end(self) -> None:
        """Drained: nothing left, every block free, every output its request's own tokens."""
        pool = self.sched.kv_cache_manager.block_pool
        left = sorted(self.sched.requests)
        if left:
            raise EngineCoreViolation("no_leak", f"drained, but vLLM still holds requests {left}")
        usable = self.config.num_blocks - 1  # block 0 is vLLM's null block
        free = pool.get_num_free_blocks()
        if free != usable:
            raise EngineCoreViolation(
                "no_leak", f"drained, but {usable - free} of {usable} usable blocks are not free"
            )
        for rid, tokens in self.outputs.items():
            self._check_content(rid, tokens)

    def _check_content(self, rid: str, tokens: Sequence[int]) -> None:
        spec = self.impl.specs[rid]
        reason = self.reasons.get(rid)
        if reason is None:
            raise EngineCoreViolation("progress", f"{rid!r} never finished")
        stop = spec.stop_after if spec.stop_after is not None else spec.max_tokens + 1
        last = min(stop, spec.max_tokens)
        expected = [self.impl._token(rid, i) for i in range(1, last + 1)]
        if reason == ABORTED:
            expected = expected[: len(tokens)]
        if list(tokens) != expected:
            at = next(
                (i for i, (a, b) in enumerate(zip(tokens, expected, strict=False)) if a != b),
                min(len(tokens), len(expected)),
            )
            raise EngineCoreViolation(
                "output_content",
                f"{rid!r} produced {len(tokens)} tokens, expected {len(expected)}; they first "
                f"differ at output {at + 1}: {_describe(self.impl, rid, tokens, at)}",
            )
        if reason != ABORTED:
            want = "stop" if stop <= spec.max_tokens else "length"
            if reason != want:
                raise EngineCoreViolation(
                    "finish_reason", f"{rid!r} finished with {reason}, expected {want}"
                )

    # ------------------------------------------------------------------ helpers
    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as err:  # vLLM raised: a finding, reported with its type and text
            raise EngineCoreViolation(
                "implementation_error", f"vLLM raised in {what}: {type(err).__name__}: {err}"
            ) from err


def _describe(impl: RealVllmScheduler, rid: str, tokens: Sequence[int], at: int) -> str:
    if at >= len(tokens):
        return "missing"
    got = tokens[at]
    for i in range(1, impl.specs[rid].max_tokens + 2):
        if impl._token(rid, i) == got:
            return f"got its output {i}"
    return f"got token {got}, not one of its own"


def core_program(seed: int) -> CoreProgram:
    """A random program inside vLLM's space: `integrations.vllm.differential.program`'s
    configuration and arrivals, plus aborts of earlier requests before some steps. For a third
    of the seeds prefix caching is on and half the prompts are prefixes of one shared prompt."""
    config, arrivals = decision_program(seed)
    rnd = random.Random(seed * 7919 + 1)
    prefix = rnd.random() < 1 / 3
    if prefix:
        config = replace(config, enable_prefix_caching=True)
    shared = tuple(range(100, 100 + config.max_model_len))
    seen: list[str] = []
    batches: list[tuple[ArRequest, ...]] = []
    aborts: list[tuple[str, ...]] = []
    for batch in arrivals:
        aborts.append(tuple(rid for rid in seen if rnd.random() < 0.15))
        if prefix:
            batch = [
                replace(r, prompt=shared[: r.prompt_len]) if rnd.random() < 0.5 else r
                for r in batch
            ]
        batches.append(tuple(batch))
        seen.extend(r.request_id for r in batch)
    return CoreProgram(config, tuple(batches), tuple(aborts))


def check_both(
    program: CoreProgram, mutate: Callable[[Any], None] | None = None
) -> tuple[CoreRun, CoreRun]:
    """Run `program` through the synchronous loop and the asynchronous one (`mutate` applied to
    the async one), each checked; raise `EngineCoreViolation` naming the loop on the first rule
    broken. The synchronous loop is the control: the same checks on vLLM's default-off path."""
    runs = []
    for async_scheduling in (False, True):
        try:
            loop = EngineCoreLoop(
                program.config,
                async_scheduling=async_scheduling,
                mutate=mutate if async_scheduling else None,
            )
            runs.append(loop.run(program))
        except EngineCoreViolation as err:
            mode = "async" if async_scheduling else "sync"
            raise EngineCoreViolation(err.rule, f"{mode} loop: {err.detail}") from err
    return runs[0], runs[1]


__all__ = [
    "ABORTED",
    "ASYNC_BATCH_QUEUE",
    "RULES",
    "CoreProgram",
    "CoreRun",
    "EngineCoreLoop",
    "EngineCoreViolation",
    "check_both",
    "core_program",
]
