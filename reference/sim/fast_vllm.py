"""`FastVidurVllm`: Vidur's vLLM replica scheduler for the simulator, decision-identical to
`ArReplica(reference.ar.vidur.make_vidur_vllm, config)` (a test holds the two to the same batches
and metrics, restarts included) and fast enough for large sweeps.

What makes it fast: between admissions, finishes and restarts every running request decodes one
token per batch, so a request's computed tokens are `base + G`, where G counts decode batches.
Blocks held are ceil(computed / block_size) (Vidur allocates a prefill's blocks at admission and
one more block when a decode outgrows them), so a decode batch at counter G needs a new block for
each request with (base + G) % block_size == 0: a histogram of `base % block_size` gives every
batch's block demand in O(1). A *decode stretch* is the run of batches before the next finish,
the first batch whose demand would run the pool dry (a restart: that batch runs one by one, in
Vidur's order) or an admission; the cluster loop runs a stretch as one event (`decode_stretch`).

Decision rules (Vidur's `vllm_replica_scheduler.py`, as in `reference/ar/vidur.py`): a batch is
either a prefill-only batch of waiting requests in FCFS order (free blocks for the whole prompt,
padded len x max <= the token budget, seat cap), or, if none was admitted, a decode-only batch of
every running request in arrival order; a request needing a block when none is free restarts the
latest-arrived remaining request (or itself), which frees all its blocks and goes back to the head
of the queue to prefill prompt + outputs so far.

`FastVidurVllmReleased` decides as `reference.ar.vidur_released.VidurVllmReleased` (the rules
of Vidur's releases): a prefill batch's tokens summed against the budget, and a new request
admitted only when it leaves Vidur's watermark free. Like that class it keeps the idealisation
`vllm-decode-block` (a decode that needs no new block never restarts anyone), where Vidur's own
vLLM demands a free block for every running request: under KV pressure its decisions can
differ from Vidur's.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from dataclasses import dataclass

from reference.ar.vidur import WATERMARK_FRACTION
from reference.sim.fast_common import FastReplicaCore
from reference.sim.replica import BatchPlan
from spec.ar.config import ArConfig


@dataclass(slots=True)
class _Req:
    req: int  # the simulator's request number
    arrival: int  # submission order on this replica (Vidur's victim order)
    prompt: int
    max_tokens: int
    outputs: int = 0  # while running: computed - prompt + 1 (kept up to date on restart)
    base: int = 0  # computed tokens = base + G while running
    finish_at: int = -1  # the decode counter G at which it finishes (while running)
    seen: bool = False


class FastVidurVllm(FastReplicaCore):
    """See the module doc. `ReplicaScheduler` protocol plus the decode-stretch extension."""

    name = "vidur-vllm"
    # `FastReplicaCore`'s counters, declared again because this class's methods update them
    free: int
    base_sum: int
    G: int

    def __init__(self, config: ArConfig) -> None:
        from reference.ar.vidur import VidurVllm

        VidurVllm(config, lambda _e: None)  # the reference class validates the configuration
        super().__init__(config)
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []  # by arrival
        self.keys: list[int] = []  # arrivals of `running`, for bisect
        self.hist: list[int] = [0] * config.block_size  # running requests by base % block_size
        self.finishes: list[tuple[int, int, int]] = []  # heap (G, arrival, epoch)
        self.epoch: dict[int, int] = {}  # arrival -> finish epoch (stale heap entries differ)
        self.by_arrival: dict[int, _Req] = {}
        self._arrivals = 0

    # ------------------------------------------------------------------ protocol
    def add(self, req: int, prefill: int, decode: int) -> None:
        """Queue `req` at the back after validating it (`Unschedulable` if the spec refuses it for
        this configuration)."""
        self._validate(req, prefill, decode)
        r = _Req(req, self._arrivals, prefill, decode)
        self._arrivals += 1
        self.waiting.append(r)

    def next_batch(self) -> BatchPlan | None:
        """The next batch by Vidur vLLM's rules (module doc): prefill-only if a waiting request is
        admitted, else decode-only, restarting as needed; None with nothing queued or running.
        `Unschedulable` when the batch would run and restart nothing."""
        if not self.waiting and not self.running:
            return None
        self._new = []
        plan = self._prefill_batch()
        if plan is None:
            plan = self._decode_batch()
        if plan.seqs == 0 and not self._result[2]:  # nothing runs: the head is never admitted
            h = self.waiting[0] if self.waiting else None
            raise self._stalled((h.req, h.prompt + h.outputs) if h else None)
        return plan

    # ------------------------------------------------------------------ bookkeeping
    def _kv(self) -> int:
        return self.base_sum + self.G * len(self.running)

    def _blocks_of(self, r: _Req) -> int:
        return -(-(r.base + self.G) // self.bs)

    def _join(self, r: _Req, computed: int) -> None:
        r.base = computed - self.G
        r.finish_at = r.prompt + r.max_tokens - 1 - r.base  # computed = prompt + max - 1
        i = bisect.bisect_left(self.keys, r.arrival)
        self.keys.insert(i, r.arrival)
        self.running.insert(i, r)
        self.by_arrival[r.arrival] = r
        self.hist[r.base % self.bs] += 1
        self.base_sum += r.base
        ep = self.epoch.get(r.arrival, 0) + 1
        self.epoch[r.arrival] = ep
        heapq.heappush(self.finishes, (r.finish_at, r.arrival, ep))

    def _leave(self, r: _Req) -> None:
        """Out of the running set: its blocks return to the pool."""
        i = bisect.bisect_left(self.keys, r.arrival)
        del self.keys[i]
        del self.running[i]
        self.hist[r.base % self.bs] -= 1
        self.base_sum -= r.base
        self.free += self._blocks_of(r)
        self.epoch[r.arrival] += 1  # its finish entry is stale now

    def _pop_finished(self) -> list[int]:
        done: list[int] = []
        fin = self.finishes
        while fin and fin[0][0] <= self.G:
            _, arrival, ep = heapq.heappop(fin)
            if self.epoch.get(arrival) != ep:
                continue
            r = self.by_arrival.pop(arrival)
            self._leave(r)
            del self.epoch[arrival]
            done.append(r.req)
        return done

    # ------------------------------------------------------------------ one batch
    def _prefill_batch(self) -> BatchPlan | None:
        cfg = self.config
        admitted: list[_Req] = []
        longest = total = 0
        while self.waiting:
            r = self.waiting[0]
            n = r.prompt + r.outputs
            need = -(-n // self.bs)
            if self.free - need < self.watermark:
                break
            if self._over_budget(len(admitted), longest, total, n):
                break
            if len(self.running) + len(admitted) >= cfg.max_num_seqs or len(admitted) >= self.cap:
                break
            self.waiting.popleft()
            self.free -= need
            admitted.append(r)
            longest = max(longest, n)
            total += n
        if not admitted:
            return None
        kv = self._kv()
        pre = pairs = 0
        first: list[int] = []
        done: list[int] = []
        for r in admitted:
            n = r.prompt + r.outputs
            pre += n
            pairs += n * (n + 1) // 2
            if not r.seen:
                r.seen = True
                self._new.append(r.req)
            r.outputs += 1
            if r.outputs == 1:
                first.append(r.req)
            if r.outputs >= r.max_tokens:
                self.free += -(-n // self.bs)
                done.append(r.req)
            else:
                self._join(r, n)
        self._result = (first, done, [])
        return BatchPlan(pre, 0, kv, pairs, len(admitted))

    def _over_budget(self, count: int, longest: int, total: int, n: int) -> bool:
        """Adding a prefill of `n` tokens to `count` admitted ones (the longest `longest`,
        `total` in all) passes the budget: padded to the longest, as the reference."""
        return (count + 1) * max(longest, n) > self.config.max_num_batched_tokens

    def _decode_batch(self) -> BatchPlan:
        """Every running request decodes, in arrival order, restarting victims on demand."""
        bs, G, running = self.bs, self.G, self.running
        restarted: list[int] = []
        kv = self._kv()  # ArReplica reads computed tokens before the step, victims included
        i = 0
        while i < len(running):
            r = running[i]
            if (r.base + G) % bs == 0:  # its next token needs a new block
                gone = False
                while self.free < 1:
                    victim = running[-1]  # the latest arrival not yet in the batch, or r
                    self._restart(victim)
                    restarted.append(victim.req)
                    gone = victim is r
                    if gone:
                        break
                if gone:
                    continue
                self.free -= 1
            i += 1
        n = len(running)
        pairs = self._kv() + n
        self.G += 1
        self._result = ([], self._pop_finished(), restarted)
        return BatchPlan(0, n, kv, pairs, n)

    def _restart(self, r: _Req) -> None:
        """Vidur's restart: all blocks freed, back to the head of the queue; the next prefill
        is prompt + outputs so far."""
        r.outputs = r.base + self.G - r.prompt + 1
        self._leave(r)
        del self.by_arrival[r.arrival]
        self.waiting.appendleft(r)

    # ------------------------------------------------------------------ decode stretches
    def would_admit(self) -> bool:
        """The next batch would be a prefill batch (admits the head of the queue)."""
        if not self.waiting:
            return False
        cfg = self.config
        n = self.waiting[0].prompt + self.waiting[0].outputs
        return (
            self.free - -(-n // self.bs) >= self.watermark
            and n <= cfg.max_num_batched_tokens
            and len(self.running) < cfg.max_num_seqs
        )

    def _demand(self, k: int) -> tuple[int, int]:
        """(batches of the next k decode batches that run without a restart, their blocks)."""
        bs, G, hist, n = self.bs, self.G, self.hist, len(self.running)
        cycles = min(k // bs, self.free // n) if n else k // bs
        total = cycles * n
        j = cycles * bs
        while j < k:
            d = hist[(-(G + j)) % bs]
            if total + d > self.free:
                return j, total
            total += d
            j += 1
        return k, total

    def decode_stretch(self) -> int:
        """Decode batches from now with nothing admitted, restarted or finished before the last
        (0 when the next batch is a prefill batch or would restart)."""
        if not self.running or self.would_admit():
            return 0
        fin = self.finishes
        while self.epoch.get(fin[0][1]) != fin[0][2]:
            heapq.heappop(fin)
        k, _ = self._demand(fin[0][0] - self.G)
        return k

    def next_batch_plan_decode(self) -> tuple[int, int]:
        """(decoding requests, KV tokens) at the start of a stretch."""
        self._new = []
        return len(self.running), self._kv()

    def end_decode(self, k: int) -> tuple[list[int], list[int], list[int]]:
        """`k` decode batches of a stretch ended (k may stop short of the stretch)."""
        _, blocks = self._demand(k)
        self.free -= blocks
        self.G += k
        return [], self._pop_finished(), []


class FastVidurVllmReleased(FastVidurVllm):
    """Vidur's releases' vLLM rules: summed prefill tokens, Vidur's watermark; not its restart
    of a decode that needs no block (see the module doc)."""

    name = "vidur-vllm-released"
    watermark_fraction = WATERMARK_FRACTION

    def _over_budget(self, count: int, longest: int, total: int, n: int) -> bool:
        return total + n > self.config.max_num_batched_tokens
