"""Fast Vidur Orca, FasterTransformer and LightLLM replicas for the simulator, each
decision-identical to `ArReplica` over the class of the same name in `reference/ar/vidur.py`
(tests/test_sim_fast.py compares them batch for batch). `FastVidurVllm` is in `fast_vllm.py`.

None of these preempts, and every running request decodes one token in every batch it is in, so
the shared `_DecodeCounter` keeps a request's computed tokens as `base + G` (G: batches run so
far) and finishes in a heap keyed by the G at which each request is done: a batch costs O(1) plus
its admissions and finishes, not O(running requests).

- Orca: every running request plus new requests that can reserve max_model_len worth of blocks
  (no token budget); decode stretches run until the next finish when the head cannot be admitted.
- FasterTransformer: static batches: admission only when the previous batch is entirely done;
  a stretch runs until the next finish.
- LightLLM (block size 1): a prefill-only batch when nothing runs, or after max_waiting_iters
  decode batches, when admission keeps the peak memory of all requests within the pool; else a
  decode batch of every running request (one more block each).

Sarathi (`FastVidurSarathi`, which does restart requests) keeps per-request records instead;
`FastVidurSarathiReleased` decides as `reference/ar/vidur_released.py`'s class (Vidur's
releases).
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
    req: int
    prompt: int
    max_tokens: int
    base: int = 0  # computed tokens = base + G while running
    seen: bool = False


class _DecodeCounter(FastReplicaCore):
    """The shared bookkeeping (see the module doc); subclasses decide batches."""

    name = "vidur"
    # `FastReplicaCore`'s counters, declared again because this class's methods update them
    free: int
    base_sum: int
    G: int

    def __init__(self, config: ArConfig, reference: type) -> None:
        reference(config, lambda _e: None)  # the reference class validates the configuration
        super().__init__(config)
        self.waiting: deque[_Req] = deque()
        self.running: dict[int, _Req] = {}  # by request number, in admission order
        self.finishes: list[tuple[int, int]] = []  # heap (G when done, request number)

    # ------------------------------------------------------------------ protocol
    def add(self, req: int, prefill: int, decode: int) -> None:
        self._validate(req, prefill, decode)
        self.waiting.append(_Req(req, prefill, decode))

    def next_batch(self) -> BatchPlan | None:
        if not self.waiting and not self.running:
            return None
        self._new = []
        plan = self._batch()
        if plan.seqs == 0:  # nothing runs: the head of the queue is never admitted
            h = self.waiting[0] if self.waiting else None
            raise self._stalled((h.req, h.prompt) if h else None)
        return plan

    def _batch(self) -> BatchPlan:  # pragma: no cover - subclasses decide
        raise NotImplementedError

    # ------------------------------------------------------------------ bookkeeping
    def _kv(self) -> int:
        return self.base_sum + self.G * len(self.running)

    def _held(self, r: _Req) -> int:
        """Blocks a running request holds (a max reservation unless overridden)."""
        return self.config.max_blocks_per_request

    def _prefill(self, admitted: list[_Req], decodes: int) -> BatchPlan:
        """One batch: every running request decodes (if `decodes`) and `admitted` prefill."""
        kv = self._kv()
        n_dec = len(self.running) if decodes else 0
        pre, pairs = 0, kv + n_dec if decodes else 0
        first: list[int] = []
        done: list[int] = []
        if decodes:
            self.G += 1
        for r in admitted:
            n = r.prompt
            pre += n
            pairs += n * (n + 1) // 2
            if not r.seen:
                r.seen = True
                self._new.append(r.req)
            first.append(r.req)
            if r.max_tokens == 1:
                self.free += self._held_at_admission(r)
                done.append(r.req)
            else:
                self._join(r, n)
        done += self._pop_finished()
        self._result = (first, done, [])
        return BatchPlan(pre, n_dec, kv, pairs, n_dec + len(admitted))

    def _held_at_admission(self, r: _Req) -> int:
        return self.config.max_blocks_per_request

    def _join(self, r: _Req, computed: int) -> None:
        r.base = computed - self.G
        self.running[r.req] = r
        self.base_sum += r.base
        heapq.heappush(self.finishes, (r.prompt + r.max_tokens - 1 - r.base, r.req))

    def _pop_finished(self) -> list[int]:
        done: list[int] = []
        fin = self.finishes
        while fin and fin[0][0] <= self.G:
            _, q = heapq.heappop(fin)
            r = self.running.pop(q)
            self.free += self._held(r)
            self.base_sum -= r.base
            done.append(q)
        return done

    # ------------------------------------------------------------------ decode stretches
    def would_admit(self) -> bool:  # pragma: no cover - subclasses decide
        raise NotImplementedError

    def decode_stretch(self) -> int:
        """Decode-only batches from now to the next finish (0 when the next batch admits)."""
        if not self.running or self.would_admit():
            return 0
        return self.finishes[0][0] - self.G

    def next_batch_plan_decode(self) -> tuple[int, int]:
        self._new = []
        return len(self.running), self._kv()

    def end_decode(self, k: int) -> tuple[list[int], list[int], list[int]]:
        self.G += k
        return [], self._pop_finished(), []


class FastVidurOrca(_DecodeCounter):
    """Vidur's Orca: every running request decodes in every batch; waiting requests join in FCFS
    order while there is a seat (`max_num_seqs`, not divided over stages) and room for a
    max_model_len reservation (`max_blocks_per_request` blocks); no token budget."""

    name = "vidur-orca"
    # `FastReplicaCore`'s free-block count, declared again because this class's methods update it
    free: int

    def __init__(self, config: ArConfig) -> None:
        from reference.ar.vidur import VidurOrca

        super().__init__(config, VidurOrca)
        # Vidur's Orca and FasterTransformer fill a batch up to `_max_batch_size` whatever the
        # stages (`VidurOrca.micro_batch_cap`); only its vLLM and Sarathi divide the seats
        self.cap: int = config.max_num_seqs

    def would_admit(self) -> bool:
        """The next batch would admit the head of the queue: a seat under `max_num_seqs`, and
        `max_blocks_per_request` blocks free."""
        n = len(self.running)
        return (
            bool(self.waiting)
            and n < self.cap
            and n < self.config.max_num_seqs
            and self.free >= self.config.max_blocks_per_request
        )

    def _admit(self, seats_used: int) -> list[_Req]:
        cfg = self.config
        m = cfg.max_blocks_per_request
        admitted: list[_Req] = []
        while self.waiting and seats_used + len(admitted) < self.cap:
            if len(self.running) + len(admitted) >= cfg.max_num_seqs or self.free < m:
                break
            admitted.append(self.waiting.popleft())
            self.free -= m
        return admitted

    def _batch(self) -> BatchPlan:
        return self._prefill(self._admit(len(self.running)), decodes=True)


class FastVidurFt(FastVidurOrca):
    """Vidur's FasterTransformer: static batches. A batch in flight decodes, less its finished
    requests, until it is empty; only then are waiting requests admitted as Orca admits them."""

    name = "vidur-ft"

    def __init__(self, config: ArConfig) -> None:
        from reference.ar.vidur import VidurFasterTransformer

        _DecodeCounter.__init__(self, config, VidurFasterTransformer)
        self.cap: int = config.max_num_seqs  # as Orca's

    def would_admit(self) -> bool:
        """The next batch is an admission: nothing runs and requests wait."""
        return not self.running and bool(self.waiting)

    def _batch(self) -> BatchPlan:
        if self.running:  # the static batch in flight continues, less its finished requests
            return self._prefill([], decodes=True)
        return self._prefill(self._admit(0), decodes=False)


class FastVidurLightLlm(_DecodeCounter):
    """Block size 1: a running request holds exactly its computed tokens."""

    name = "vidur-lightllm"
    # `FastReplicaCore`'s free-block count, declared again because this class's methods update it
    free: int

    def __init__(self, config: ArConfig) -> None:
        from reference.ar.vidur import VidurLightLlm

        super().__init__(config, VidurLightLlm)
        self.num_waiting_iters: int = 0
        self._open = False  # a stretch in flight was formed with nobody waiting
        self._keys: list[int] = []  # -(growth left + G) of `_by_growth`, ascending
        self._by_growth: list[_Req] = []  # running requests, largest growth left first

    def _held(self, r: _Req) -> int:
        return r.base + self.G

    def _held_at_admission(self, r: _Req) -> int:
        return r.prompt

    def would_admit(self) -> bool:
        """During a stretch: an arrival now may change a decision in it (the stretch was
        formed with an empty queue, so it runs past the next prefill attempt)."""
        return self._open

    def decode_stretch(self) -> int:
        """Decode batches from now with no prefill attempt, finish or out-of-memory before the
        last: up to the next finish, the next prefill attempt (every max_waiting_iters decode
        batches while requests wait) and as many batches as the free blocks pay for (one block
        per running request per batch)."""
        n = len(self.running)
        if not n or self.free < n:
            return 0
        k = self.finishes[0][0] - self.G
        if self.waiting:
            k = min(k, self.config.max_waiting_iters - self.num_waiting_iters)
        self._open = not self.waiting
        return min(k, self.free // n)

    def end_decode(self, k: int) -> tuple[list[int], list[int], list[int]]:
        """`k` decode batches of a stretch ended: the waiting-iterations counter moves as k batches
        one by one would move it (with nobody waiting, every max_waiting_iters-th one an empty
        prefill attempt), every running request takes k blocks and requests finish."""
        w, m = self.num_waiting_iters, self.config.max_waiting_iters
        if self._open:  # nobody waited: every m-th batch an attempt found nothing, reset to 0
            w = (0 if w >= m else w) + k
            if w > m:
                w = (w - m - 1) % m + 1
            self._open = False
        else:
            w += k
        self.num_waiting_iters = w
        self.free -= len(self.running) * k
        return super().end_decode(k)

    def _join(self, r: _Req, computed: int) -> None:
        super()._join(r, computed)
        # growth left = prompt + max_tokens - 2 - computed = grow_key - G: one order for all G
        key = -(r.prompt + r.max_tokens - 2 - r.base)
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self._by_growth.insert(i, r)

    def _pop_finished(self) -> list[int]:
        done = super()._pop_finished()
        if done:
            running = self.running
            keep = [i for i, r in enumerate(self._by_growth) if r.req in running]
            self._keys = [self._keys[i] for i in keep]
            self._by_growth = [self._by_growth[i] for i in keep]
        return done

    def _peak_fits(self, admitted: list[_Req]) -> bool:
        """Vidur's `need_max_token_num`: running requests (tokens held, tokens still to grow)
        and admitted ones (prompt + first output, max_tokens - 2), largest growth first: the
        peak is the largest growth x (position + 1) + tokens held up to that position. (Requests
        of equal growth may come in any order: the last of them gives the largest value.)"""
        G = self.G
        new = sorted(
            ((max(0, r.max_tokens - 2), r.prompt + min(1, r.max_tokens - 1)) for r in admitted),
            reverse=True,
        )
        limit = self.config.usable_blocks
        need = held = i = j = 0
        for key, r in zip(self._keys, self._by_growth, strict=True):
            left = -key - G
            if left < 0:
                left = 0
            while j < len(new) and new[j][0] >= left:  # admitted ones of larger growth first
                held += new[j][1]
                i += 1
                need = max(need, new[j][0] * i + held)
                j += 1
            held += r.base + G + 1
            i += 1
            v = left * i + held
            if v > need:
                need = v
            if need > limit:
                return False
        for left, has in new[j:]:
            held += has
            i += 1
            need = max(need, left * i + held)
        return need <= limit

    def _prefill_batch(self) -> BatchPlan | None:
        cfg = self.config
        admitted: list[_Req] = []
        tokens = 0
        while self.waiting:
            r = self.waiting[0]
            if tokens + r.prompt > cfg.max_num_batched_tokens:
                break
            if len(self.running) + len(admitted) >= cfg.max_num_seqs or len(admitted) >= self.cap:
                break
            if not self._peak_fits([*admitted, r]):
                break
            self.waiting.popleft()
            self.free -= r.prompt
            admitted.append(r)
            tokens += r.prompt
        if not admitted:
            return None
        return self._prefill(admitted, decodes=False)

    def _batch(self) -> BatchPlan:
        if not self.running:
            plan = self._prefill_batch()
            if plan is not None:
                self.num_waiting_iters = 0
            return plan if plan is not None else BatchPlan(0, 0, 0, 0, 0)
        if self.num_waiting_iters >= self.config.max_waiting_iters:
            self.num_waiting_iters = 0
            plan = self._prefill_batch()
            if plan is not None:
                return plan
        if self.free < len(self.running):
            from reference.ar.vidur import VidurOutOfMemory

            raise VidurOutOfMemory("LightLLM decode batch does not fit (OOM handling)")
        self.num_waiting_iters += 1
        self.free -= len(self.running)
        return self._prefill([], decodes=True)


@dataclass(slots=True, eq=False)
class _SReq:
    req: int
    arrival: int
    prompt: int
    max_tokens: int
    known: int = 0  # prompt + outputs (kept up to date: read in every batch)
    computed: int = 0
    outputs: int = 0
    blocks: int = 0
    running: bool = False
    seen: bool = False
    prefill: int = 0  # Vidur's prefill tokens (FastVidurSarathiReleased: what a restart left)
    prefill_complete: bool = False  # Vidur's flag (FastVidurSarathiReleased)


class FastVidurSarathi(FastReplicaCore):
    """Vidur's Sarathi (chunked prefills): decodes first (one token each, restarting the latest
    remaining request when a needed block is not free), then chunks of running prefills, then new
    requests, all within the chunk size. Per-request records with identity comparison and counts
    instead of list scans; one batch costs O(requests in it)."""

    name = "vidur-sarathi"
    # `FastReplicaCore`'s free-block count, declared again because this class's methods update it
    free: int

    def __init__(self, config: ArConfig) -> None:
        from reference.ar.vidur import VidurSarathi

        VidurSarathi(config, lambda _e: None)  # validates the configuration
        super().__init__(config)
        self.waiting: deque[_SReq] = deque()
        self.order: list[_SReq] = []  # Vidur's list order: running requests between batches
        self.n_running: int = 0
        self.kv: int = 0  # computed tokens of running requests
        self._arrivals = 0

    def add(self, req: int, prefill: int, decode: int) -> None:
        """Queue `req` after validating it (`Unschedulable` if the spec refuses it for this
        configuration)."""
        self._validate(req, prefill, decode)
        self.waiting.append(_SReq(req, self._arrivals, prefill, decode, prefill, prefill=prefill))
        self._arrivals += 1

    def outstanding(self) -> int:  # running requests are counted, not listed
        """Requests queued plus those running (`n_running`)."""
        return len(self.waiting) + self.n_running

    def _restart(self, r: _SReq, restarted: list[int]) -> None:
        self.free += r.blocks
        self.kv -= r.computed
        r.blocks = r.computed = 0
        r.running = False
        self.n_running -= 1
        self.waiting.appendleft(r)
        restarted.append(r.req)

    def _decodes(self, decodes: list[_SReq], restarted: list[int]) -> list[_SReq]:
        """Running requests in Vidur's pending-list order: decodes join `decodes`; running
        prefills are returned in order (the rest of `order` stays for the next batch)."""
        prefills: list[_SReq] = []
        order, bs, cap = self.order, self.bs, self.cap
        i = 0
        while i < len(order) and len(decodes) < cap:
            r = order[i]
            i += 1
            if not self._decodes_now(r):
                prefills.append(r)
                continue
            need = -(-(r.computed + 1) // bs) - r.blocks
            while self.free < self._demanded(need):
                if i < len(order):
                    self._restart(order.pop(), restarted)
                else:
                    self._restart(r, restarted)
                    break
            else:
                if need > 0:
                    r.blocks += need
                    self.free -= need
                decodes.append(r)
        del order[:i]
        return prefills

    def next_batch(self) -> BatchPlan | None:
        """Vidur Sarathi's next batch (class doc); None with nothing queued or running.
        `Unschedulable` when the batch would run and restart nothing."""
        if not self.waiting and not self.n_running:
            return None
        self._new = []
        kv = self.kv
        decodes: list[_SReq] = []
        restarted: list[int] = []
        prefills = self._decodes(decodes, restarted)
        chunks: list[tuple[_SReq, int]] = []
        tokens = self._chunks(prefills, chunks, len(decodes))
        self._admit(chunks, len(decodes), tokens)
        return self._execute(decodes, chunks, restarted, kv)

    def _chunks(self, prefills: list[_SReq], chunks: list[tuple[_SReq, int]], tokens: int) -> int:
        """Chunks of running prefills within the chunk size; those left out keep their place in
        arrival order. Returns the batch's tokens."""
        chunk = self.config.max_num_batched_tokens
        skipped: list[_SReq] = []
        for r in prefills:
            n = max(0, min(self._prefill_left(r), chunk - tokens))
            if n == 0:
                skipped.append(r)
                continue
            chunks.append((r, n))
            tokens += n
        if skipped:
            self.order = sorted(skipped + self.order, key=lambda q: q.arrival)
        else:
            self.order.sort(key=lambda q: q.arrival)
        return tokens

    def _admit(self, chunks: list[tuple[_SReq, int]], decodes: int, tokens: int) -> None:
        """New requests from the head of the queue: seats, cap, blocks for all they know, and a
        first chunk within the chunk size."""
        cfg = self.config
        chunk = cfg.max_num_batched_tokens
        while self.waiting:
            if self.n_running >= cfg.max_num_seqs or decodes + len(chunks) >= self.cap:
                break
            r = self.waiting[0]
            need = self._new_blocks(r)
            if self.free - need < self.watermark:
                break
            n = min(self._prefill_left(r), chunk - tokens)
            if n <= 0:
                break
            self.waiting.popleft()
            r.running = True
            self.n_running += 1
            r.blocks += need
            self.free -= need
            chunks.append((r, n))
            tokens += n

    # ------------------------------------------------------------------ rules (released: below)
    def _decodes_now(self, r: _SReq) -> bool:
        """A running request decodes (one token) rather than taking a prefill chunk: counted
        from tokens, as `VidurSarathi._prefill_complete`."""
        return r.outputs > 0 and r.computed >= r.known - 1

    def _demanded(self, need: int) -> int:
        """Free blocks a decode needing `need` new ones must find, else it restarts a victim."""
        return need

    def _prefill_left(self, r: _SReq) -> int:
        return r.known - r.computed

    def _prefill_tokens(self, r: _SReq) -> int:
        """The tokens a new (or restarted) request is allocated blocks for: all it knows."""
        return r.known

    def _new_blocks(self, r: _SReq) -> int:
        """Blocks a new (or restarted) request is allocated."""
        return -(-self._prefill_tokens(r) // self.bs)

    def _stretch_free(self) -> int:
        """Free blocks a decode stretch may take without a restart in it."""
        return self.free

    def _batch_end(self, r: _SReq) -> None:
        """A request of the batch that did not finish (Vidur's `on_batch_end`)."""

    def _finish(self, r: _SReq, done: list[int]) -> None:
        r.running = False
        self.n_running -= 1
        self.free += r.blocks
        self.kv -= r.computed
        done.append(r.req)

    def _execute(
        self,
        decodes: list[_SReq],
        chunks: list[tuple[_SReq, int]],
        restarted: list[int],
        kv: int,
    ) -> BatchPlan:
        """Run the batch: decodes (one token each) then chunks; finished requests free their
        blocks, the others go to the end of `order` in batch order. The plan counts a token as
        a decode by what it computes, as `ArReplica` does: a lone token that computes the last
        known token of a request with an output. (So the released class's decodes of a
        restarted prompt's rest are prefill tokens, and a recompute's last lone token is a
        decode.)"""
        pre = dec = pairs = 0
        first: list[int] = []
        done: list[int] = []
        order = self.order
        self.kv += len(decodes)
        for r in decodes:
            if r.outputs > 0 and r.computed == r.known - 1:
                dec += 1
            else:
                pre += 1
            c = r.computed + 1
            pairs += c
            r.computed = c
            if c == r.known:  # no output yet while it computes a restarted prompt's rest
                r.known += 1
                r.outputs += 1
                if r.outputs == 1:
                    first.append(r.req)
            if r.outputs >= r.max_tokens:
                self._finish(r, done)
            else:
                self._batch_end(r)
                order.append(r)
        for r, n in chunks:
            c = r.computed
            if n == 1 and r.outputs > 0 and c == r.known - 1:
                dec += 1
            else:
                pre += n
            pairs += n * c + n * (n + 1) // 2
            if not r.seen:
                r.seen = True
                self._new.append(r.req)
            r.computed = c + n
            self.kv += n
            if r.computed == r.known:
                r.outputs += 1
                r.known += 1
                if r.outputs == 1:
                    first.append(r.req)
        for r, _ in chunks:
            if r.outputs >= r.max_tokens:
                self._finish(r, done)
            else:
                self._batch_end(r)
                order.append(r)
        if not decodes and not chunks and not restarted:  # the head is never admitted
            h = self.waiting[0] if self.waiting else None
            raise self._stalled((h.req, self._prefill_tokens(h)) if h else None)
        self._result = (first, done, restarted)
        return BatchPlan(pre, dec, kv, pairs, len(decodes) + len(chunks))

    # ------------------------------------------------------------------ decode stretches
    def would_admit(self) -> bool:
        """The next batch would admit the head of the queue (seats, cap, blocks, chunk left)."""
        if not self.waiting:
            return False
        head = self.waiting[0]
        n = self.n_running
        return (
            n < self.config.max_num_seqs
            and len(self.order) < self.cap
            and self.free - self._new_blocks(head) >= self.watermark
            and self.config.max_num_batched_tokens - n > 0
        )

    def _stretch_demand(self, k: int) -> int:
        """Batches of the next k decode-only batches that need no restart. A request with `room`
        free slots in its blocks needs one at batches room, room + bs, ..."""
        bs, free, order = self.bs, self._stretch_free(), self.order
        if len(order) * (k // bs + 1) <= free:  # even the worst case is paid for
            return k
        first = sorted(r.blocks * bs - r.computed for r in order)
        phase = [0] * bs
        total = a = 0
        for j in range(k):
            while a < len(first) and first[a] <= j:
                phase[first[a] % bs] += 1
                a += 1
            total += phase[j % bs]
            if total > free:
                return j
        return k

    def decode_stretch(self) -> int:
        """Decode-only batches from now with no admission, restart or finish before the last
        (0 when a prefill is in progress or the next batch admits)."""
        if not self.order or self.would_admit():
            return 0
        k = 1 << 62
        for r in self.order:
            # still prefilling (released: or computing its prompt's rest, as decodes)
            if not self._decodes_now(r) or r.outputs == 0 or r.computed < r.known - 1:
                return 0
            left = r.max_tokens - r.outputs
            if left < k:
                k = left
        return self._stretch_demand(k)

    def next_batch_plan_decode(self) -> tuple[int, int]:
        """(decoding requests, KV tokens) at the start of a stretch."""
        self._new = []
        return len(self.order), self.kv

    def end_decode(self, k: int) -> tuple[list[int], list[int], list[int]]:
        """`k` decode batches of a stretch ended (k may stop short of it): every running request
        computes and outputs k tokens, taking a block as each fills; finished ones free their
        blocks."""
        bs = self.bs
        self.kv += len(self.order) * k
        done: list[int] = []
        keep: list[_SReq] = []
        for r in self.order:
            room = r.blocks * bs - r.computed
            if k > room:  # a block at batches room, room + bs, ... (no restart: paid for)
                more = (k - room - 1) // bs + 1
                r.blocks += more
                self.free -= more
            r.computed += k
            r.outputs += k
            r.known += k
            if r.outputs >= r.max_tokens:
                r.running = False
                self.n_running -= 1
                self.free += r.blocks
                self.kv -= r.computed
                done.append(r.req)
            else:
                keep.append(r)
        self.order = keep
        return [], done, []


class FastVidurSarathiReleased(FastVidurSarathi):
    """Vidur's releases' Sarathi, decision-identical to
    `reference.ar.vidur_released.VidurSarathiReleased`: Vidur's watermark; every decode
    demands one free block; whether a request decodes is Vidur's flag, set when a batch brings
    its computed tokens to its prefill; a restart makes the prefill what was processed, so a
    request restarted mid-prompt decodes the rest of its prompt. A decode stretch keeps one
    block free throughout (so no decode in it finds the pool dry)."""

    name = "vidur-sarathi-released"
    watermark_fraction = WATERMARK_FRACTION

    def _decodes_now(self, r: _SReq) -> bool:
        return r.prefill_complete

    def _demanded(self, need: int) -> int:
        return max(need, 1)

    def _prefill_left(self, r: _SReq) -> int:
        return r.prefill - r.computed

    def _prefill_tokens(self, r: _SReq) -> int:
        return r.prefill

    def _stretch_free(self) -> int:
        return self.free - 1

    def _batch_end(self, r: _SReq) -> None:
        if r.computed >= r.prefill:
            r.prefill_complete = True

    def _restart(self, r: _SReq, restarted: list[int]) -> None:
        # Vidur's processed tokens: one past the computed ones once the prefill completed
        r.prefill = r.computed + (1 if r.prefill_complete else 0)
        r.prefill_complete = False
        super()._restart(r, restarted)
