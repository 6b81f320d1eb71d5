"""Replica schedulers as the simulator sees them, and two implementations.

`ReplicaScheduler` is the simulator's own small protocol: the cluster loop adds requests, asks
for the next batch when the replica is free (`next_batch` → the batch's token figures, or None
when nothing can run) and reports the end of that batch (`end_batch` → which requests produced
their first token, finished or were restarted). Timing lives in the simulator, never here.

- `SimpleReplica`: continuous batching with Orca-style reservation (a request reserves
  prompt + output KV at admission, so nothing is ever preempted), FCFS, a seat cap and a
  per-batch prefill token budget; O(1) amortised work per batch (finishes are bucketed by
  iteration), which is what lets a million requests run in seconds.
- `ArReplica`: adapts any `spec.ar` scheduler (the reference vLLM v1, Vidur's replica
  schedulers) through its event sink, so those schedulers run in simulated time unchanged.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import NamedTuple, Protocol

from reference.sim.errors import (
    NeverAdmitted,
    RequestRefused,
    SimConfigError,
    Unschedulable,
    watermark_stall,
)
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArEvent,
    ArFinished,
    ArPreempted,
    ArScheduled,
)
from spec.errors import RequestError


class BatchPlan(NamedTuple):
    """A batch's token figures, as the execution-time model reads them."""

    prefill: int  # prefill tokens (whole or chunked prompts, recomputation)
    decode: int  # decode tokens (one per decoding sequence)
    kv_read: int  # KV tokens held before the batch (read by attention)
    attn_pairs: int  # (query, key) pairs of the batch's attention
    seqs: int  # sequences in the batch


class ReplicaScheduler(Protocol):
    """What the cluster loop needs of a replica's scheduler (module doc); `kv_capacity` is its KV
    pool in tokens."""

    kv_capacity: int

    def add(self, req: int, prefill: int, decode: int) -> None:
        """Queue request `req` (raise `Unschedulable` if it can never run here)."""
        ...

    def next_batch(self) -> BatchPlan | None:
        """Decide the next batch; None if nothing can run now. Requests scheduled for the first
        time are listed in `newly_scheduled` until the next call."""
        ...

    @property
    def newly_scheduled(self) -> list[int]:
        """Requests the last `next_batch` scheduled for the first time."""
        ...

    def end_batch(self) -> tuple[list[int], list[int], list[int]]:
        """The batch ended: (first tokens, finished, restarted) request numbers."""
        ...

    def kv_used(self) -> int:
        """KV tokens in use now (sampled for the occupancy plot)."""
        ...

    def outstanding(self) -> int:
        """Requests added and not yet finished."""
        ...

    def pending(self) -> int:
        """Requests queued and not running (Vidur's `num_pending_requests`, read by LOR)."""
        ...


class SimpleReplica:
    """Continuous batching, FCFS, full reservation (see module doc)."""

    def __init__(
        self, max_batch: int = 128, kv_capacity: int = 1 << 20, max_prefill_tokens: int = 4096
    ) -> None:
        for name, v in (
            ("max_batch", max_batch),
            ("kv_capacity", kv_capacity),
            ("max_prefill_tokens", max_prefill_tokens),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SimConfigError(name, v, "an integer >= 1")
        self.max_batch = max_batch
        self.kv_capacity = kv_capacity
        self.max_prefill = max_prefill_tokens
        self.waiting: deque[tuple[int, int, int]] = deque()
        self.n_decoding: int = 0
        self.reserved: int = 0
        self.kv: int = 0
        self.it: int = 0
        self.finish_at: dict[int, list[tuple[int, int, int]]] = {}
        self.finish_keys: list[int] = []  # heap of the iterations in finish_at
        self._new: list[tuple[int, int, int]] = []
        self._out = 0

    @property
    def newly_scheduled(self) -> list[int]:
        """Requests the last `next_batch` admitted (each is admitted once)."""
        return [r for r, _, _ in self._new]

    def add(self, req: int, prefill: int, decode: int) -> None:
        """Queue `req` (FCFS); `Unschedulable` if prefill + decode tokens exceed `kv_capacity`."""
        if prefill + decode > self.kv_capacity:
            raise Unschedulable(req, prefill + decode, self.kv_capacity, "KV tokens")
        self.waiting.append((req, prefill, decode))
        self._out += 1

    def next_batch(self) -> BatchPlan | None:
        """Admit from the head of the queue while a seat, the KV reservation (prefill + decode
        tokens) and the prefill budget allow (the first admitted prompt alone may exceed the
        budget); every decoding request decodes too. None when nothing is admitted or decoding."""
        new = self._new = []
        ptoks = 0
        pairs = 0
        waiting = self.waiting
        while waiting and self.n_decoding + len(new) < self.max_batch:
            r, p, d = waiting[0]
            if self.reserved + p + d > self.kv_capacity:
                break
            if ptoks and ptoks + p > self.max_prefill:
                break
            waiting.popleft()
            new.append((r, p, d))
            self.reserved += p + d
            ptoks += p
            pairs += p * (p + 1) // 2
        if not new and not self.n_decoding:
            return None
        return BatchPlan(
            ptoks, self.n_decoding, self.kv, pairs + self.kv, self.n_decoding + len(new)
        )

    def end_batch(self) -> tuple[list[int], list[int], list[int]]:
        """The batch ended: admitted requests produced their first token (a one-token request
        finishes there), each decoding request one more, and those reaching their last token
        finish; nothing restarts."""
        it = self.it
        self.kv += self.n_decoding
        first: list[int] = []
        done: list[int] = []
        for item in self._new:
            r, p, d = item
            first.append(r)
            self.kv += p
            if d == 1:
                done.append(r)
                self.kv -= p
                self.reserved -= p + d
            else:
                self.n_decoding += 1
                bucket = self.finish_at.get(it + d - 1)
                if bucket is None:
                    self.finish_at[it + d - 1] = [item]
                    heapq.heappush(self.finish_keys, it + d - 1)
                else:
                    bucket.append(item)
        self._new = []
        return self._finish(it, first, done)

    def _finish(
        self, it: int, first: list[int], done: list[int]
    ) -> tuple[list[int], list[int], list[int]]:
        ending = self.finish_at.pop(it, None)
        if ending:
            heapq.heappop(self.finish_keys)
            for r, p, d in ending:
                done.append(r)
                self.kv -= p + d - 1
                self.reserved -= p + d
            self.n_decoding -= len(ending)
        self._out -= len(done)
        self.it = it + 1
        return first, done, []

    # ------------------------------------------------------------------ decode stretches
    def would_admit(self) -> bool:
        """The next batch would admit the head of the queue."""
        if not self.waiting or self.n_decoding >= self.max_batch:
            return False
        _, p, d = self.waiting[0]
        return self.reserved + p + d <= self.kv_capacity

    def decode_stretch(self) -> int:
        """Pure-decode iterations that can run from now with nothing admitted and nothing
        finishing before the last of them (0 when the next batch admits or nothing runs).
        Seats and reservations change only when a request finishes, so a blocked head stays
        blocked for the whole stretch."""
        if not self.n_decoding or self.would_admit():
            return 0
        return self.finish_keys[0] - self.it + 1

    def next_batch_plan_decode(self) -> tuple[int, int]:
        """(decoding requests, KV tokens) at the start of a stretch."""
        self._new = []
        return self.n_decoding, self.kv

    def end_decode(self, k: int) -> tuple[list[int], list[int], list[int]]:
        """`k` pure-decode iterations of a stretch ended (k may stop short of the stretch)."""
        self.kv += self.n_decoding * k
        self.it += k
        return self._finish(self.it - 1, [], [])

    def kv_used(self) -> int:
        """KV tokens cached: the running requests' prompts and the tokens they decoded (at most
        `reserved`)."""
        return self.kv

    def outstanding(self) -> int:
        """Requests added and not yet finished."""
        return self._out

    def pending(self) -> int:
        """Requests queued, not yet admitted."""
        return len(self.waiting)


ArFactory = Callable[[ArConfig, Callable[[ArEvent], None]], object]


class ArReplica:
    """Runs a `spec.ar` scheduler (factory `(ArConfig, sink) -> ArSchedulerAdapter`) in the
    simulator: `next_batch` runs one `step()` and reads its `ArScheduled` events; the step's
    effects are reported at the batch's end time."""

    def __init__(self, factory: ArFactory, config: ArConfig) -> None:
        self.config = config
        self.kv_capacity: int = config.usable_blocks * config.block_size
        self.impl: object = factory(config, self._sink)
        self._step_events: list[ArEvent] = []
        self.prompt: dict[str, int] = {}
        self.computed: dict[str, int] = {}
        self.outputs: dict[str, int] = {}
        self.blocks: int = 0
        self._out = 0
        self._new: list[int] = []
        self._seen: set[str] = set()
        self._result: tuple[list[int], list[int], list[int]] = ([], [], [])

    def _sink(self, e: ArEvent) -> None:
        self._step_events.append(e)

    @property
    def newly_scheduled(self) -> list[int]:
        """Requests the last `next_batch`'s step scheduled for the first time."""
        return self._new

    def add(self, req: int, prefill: int, decode: int) -> None:
        """Submit `req` to the scheduler; a `RequestError` it raises becomes `Unschedulable`."""
        rid = str(req)
        try:
            self.impl.submit(ArRequest(rid, prefill, decode))  # type: ignore[attr-defined]
        except RequestError as err:
            raise RequestRefused(req, prefill + decode, str(err)) from None
        self._step_events.clear()
        self.prompt[rid] = prefill
        self.computed[rid] = 0
        self.outputs[rid] = 0
        self._out += 1

    def next_batch(self) -> BatchPlan | None:
        """Run one `step()` and read the batch off its events: a lone token computing the last known
        token of a request with an output is a decode, every other scheduled token prefill
        (recomputation included); the step's first tokens, finishes and preemptions wait for
        `end_batch`. None with nothing outstanding; `Unschedulable` when the step schedules,
        finishes and preempts nothing."""
        if self._out == 0:
            return None
        self._step_events.clear()
        kv_before = sum(self.computed.values())
        self.impl.step()  # type: ignore[attr-defined]
        pre = dec = pairs = seqs = 0
        first: list[int] = []
        done: list[int] = []
        restarted: list[int] = []
        self._new = []
        for e in self._step_events:
            if isinstance(e, ArScheduled):
                rid, n = e.request_id, e.num_tokens
                c = self.computed[rid]
                known = self.prompt[rid] + self.outputs[rid]
                seqs += 1
                if n == 1 and self.outputs[rid] > 0 and c == known - 1:
                    dec += 1
                    pairs += c + 1
                else:
                    pre += n
                    pairs += n * c + n * (n + 1) // 2
                if rid not in self._seen:
                    self._seen.add(rid)
                    self._new.append(int(rid))
                c += n
                self.computed[rid] = c
                if c == known:
                    self.outputs[rid] += 1
                    if self.outputs[rid] == 1:
                        first.append(int(rid))
            elif isinstance(e, ArPreempted):
                self.computed[e.request_id] = 0
                self.blocks -= len(e.freed)
                restarted.append(int(e.request_id))
            elif isinstance(e, ArBlocksAllocated):
                self.blocks += len(e.blocks)
            elif isinstance(e, ArBlocksFreed):
                self.blocks -= len(e.blocks)
            elif isinstance(e, ArFinished):
                done.append(int(e.request_id))
                for d in (self.prompt, self.computed, self.outputs):
                    d.pop(e.request_id, None)
        if seqs == 0 and not done and not restarted:
            raise self._stalled()
        self._result = (first, done, restarted)
        self._out -= len(done)
        return BatchPlan(pre, dec, kv_before, pairs, seqs)

    def end_batch(self) -> tuple[list[int], list[int], list[int]]:
        """The last step's (first tokens, finished, restarted), reported once."""
        r, self._result = self._result, ([], [], [])
        return r

    def _stalled(self) -> NeverAdmitted:
        """The error of a step that scheduled, finished and restarted nothing: the head of the
        scheduler's queue (its snapshot's) is never admitted. A scheduler with Vidur's watermark
        (`watermark`, `watermark_fraction` of the reference classes) whose head's prefill, prompt
        plus outputs so far, leaves no room above it is `watermark_stall`."""
        name = type(self.impl).__name__
        waiting = tuple(self.impl.snapshot().waiting)  # type: ignore[attr-defined]
        rid = waiting[0] if waiting else next(iter(self.prompt), None)
        if rid is None or rid not in self.prompt:
            return NeverAdmitted(
                -1, 0, name, f"its step made no progress ({self._out} outstanding)"
            )
        tokens = self.prompt[rid] + self.outputs[rid]
        cfg = self.config
        watermark = getattr(self.impl, "watermark", 0)
        fraction = getattr(self.impl, "watermark_fraction", 0.0)
        if (
            isinstance(watermark, int)
            and watermark > 0
            and cfg.blocks_for(tokens) > cfg.usable_blocks - watermark
        ):
            return watermark_stall(
                int(rid), tokens, cfg.block_size, cfg.usable_blocks, float(fraction), name
            )
        return NeverAdmitted(
            int(rid),
            tokens,
            name,
            f"its step scheduled, finished and restarted nothing with {self._out} request(s) "
            f"outstanding, this one at the head of its queue (its admission never takes it)",
        )

    def kv_used(self) -> int:
        """KV tokens in the blocks the scheduler holds (from its block events)."""
        return self.blocks * self.config.block_size

    def outstanding(self) -> int:
        """Requests added and not finished (a finish counts from the `next_batch` whose step emitted
        it)."""
        return self._out

    def pending(self) -> int:
        """The scheduler's waiting requests: its `waiting` queue, else its snapshot's."""
        waiting = getattr(self.impl, "waiting", None)  # the reference classes' queue
        if waiting is not None:
            return len(waiting)
        return len(self.impl.snapshot().waiting)  # type: ignore[attr-defined]
