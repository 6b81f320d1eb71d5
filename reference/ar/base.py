"""Shared machinery of the reference AR schedulers: the KV block pool, request records, the
adapter operations (submit, abort, drain, snapshot) and the model step at constant batch time.

A subclass decides one thing: `_schedule()`, the scheduling phase of a step (allocate blocks,
schedule tokens, preempt). Everything a scheduler does is reported to the sink as it happens.
Methods are small so the mutant catalogue can seed one bug by overriding one of them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from spec.ar.adapter import ArEventSink, drain_steps
from spec.ar.config import ArConfig, ArRequest, ArRules, rules_for, validate_ar_request
from spec.ar.events import (
    ArAborted,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArDraftsVerified,
    ArFinished,
    ArFinishReason,
    ArOutputTokens,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.snapshot import ArSnapshot
from spec.errors import DuplicateRequest, UnknownRequest


class BlockPool:
    """Paged KV blocks: a FIFO free list (vLLM's free block queue), block ids 0..n-1, the null
    block (0) reserved when configured. Reports allocations and frees to the sink."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        self.config = config
        self.sink = sink
        first = 1 if config.reserve_null_block else 0
        self.free_queue: deque[int] = deque(range(first, config.num_blocks))
        self.owner: dict[int, str] = {}

    @property
    def num_free(self) -> int:
        """Blocks on the free queue: what can be allocated now."""
        return len(self.free_queue)

    def allocate(self, rid: str, n: int) -> list[int]:
        """Take `n` free blocks for `rid` (caller checked they exist); emits the event."""
        assert n <= len(self.free_queue), "caller must check num_free first"
        blocks = [self.free_queue.popleft() for _ in range(n)]
        for b in blocks:
            self.owner[b] = rid
        self.sink(ArBlocksAllocated(rid, tuple(blocks)))
        return blocks

    def release(self, rid: str, blocks: list[int]) -> None:
        """Return blocks to the pool without an event (the caller reports them)."""
        for b in blocks:
            assert self.owner.get(b) == rid, f"block {b} is not held by {rid!r}"
            del self.owner[b]
            self.free_queue.append(b)

    def free(self, rid: str, blocks: list[int]) -> None:
        """Return `rid`'s `blocks` to the pool (`release`) and emit `ArBlocksFreed`;
        nothing for an empty list."""
        if blocks:
            self.release(rid, blocks)
            self.sink(ArBlocksFreed(rid, tuple(blocks)))

    def holders(self) -> dict[int, frozenset[str]]:
        """Block id -> its one holder, for every held block."""
        return {b: frozenset({r}) for b, r in self.owner.items()}


ContentKey = tuple[object, ...]


class CachingBlockPool(BlockPool):
    """Prefix caching (vLLM's design, written anew): full blocks are cached by content (a key
    chained over the tokens up to the block's end); blocks are shared with reference counts;
    a block whose count drops to 0 goes to the tail of the free queue still cached, and is
    evicted when it is allocated afresh from the head (least recently freed first). Blocks of
    equal content are not de-duplicated: each stays cached until it is evicted itself, and a
    lookup takes the earliest cached one still there (vLLM's `BlockHashToBlockMap`)."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink)
        self.refs: dict[int, set[str]] = {}
        self.cache: dict[int, ContentKey] = {}
        self.index: dict[ContentKey, dict[int, None]] = {}  # content -> blocks, in cache order

    def _evict(self, b: int) -> None:
        key = self.cache.pop(b, None)
        if key is not None:
            same = self.index[key]
            del same[b]
            if not same:
                del self.index[key]

    def allocate(self, rid: str, n: int) -> list[int]:
        """Take `n` blocks from the head of the free queue for `rid` (caller checked they exist),
        evicting their cached content, `rid` their only reference; emits `ArBlocksAllocated`."""
        assert n <= len(self.free_queue), "caller must check num_free first"
        blocks = [self.free_queue.popleft() for _ in range(n)]
        for b in blocks:
            self._evict(b)
            self.refs[b] = {rid}
        self.sink(ArBlocksAllocated(rid, tuple(blocks)))
        return blocks

    def release(self, rid: str, blocks: list[int]) -> None:
        """Drop `rid`'s references, tail block first. A block left unreferenced goes back to
        the free queue in vLLM's eviction order (its `BlockPool.free_blocks`, fed the blocks in
        reverse): an uncached block to the head, to be reused first (it evicts nothing); a
        cached one to the tail, so that a request's deepest blocks are evicted before its first
        ones, which are the prefixes other requests share."""
        reuse_first: list[int] = []
        for b in reversed(blocks):
            holders = self.refs[b]
            assert rid in holders, f"block {b} is not held by {rid!r}"
            holders.discard(rid)
            if not holders:
                del self.refs[b]
                if b in self.cache:
                    self.free_queue.append(b)
                else:
                    reuse_first.append(b)
        self.free_queue.extendleft(reversed(reuse_first))  # reuse_first[0] at the head

    def lookup(self, keys: list[ContentKey]) -> list[int]:
        """The cached blocks holding the longest prefix of `keys`."""
        hit: list[int] = []
        for key in keys:
            same = self.index.get(key)
            if not same:
                break
            hit.append(next(iter(same)))
        return hit

    def newly_referenced(self, blocks: list[int]) -> int:
        """How many of `blocks` are free now (a hit on them takes them off the free queue)."""
        return sum(1 for b in blocks if b not in self.refs)

    def touch(self, rid: str, blocks: list[int]) -> None:
        """`rid` takes a reference to cached `blocks` (the caller emits `ArCacheHit`)."""
        for b in blocks:
            if b not in self.refs:
                self.free_queue.remove(b)
                self.refs[b] = set()
            self.refs[b].add(rid)

    def uncache(self, b: int) -> None:
        """Forget what block `b` caches (a content that will never be written)."""
        self._evict(b)

    def reset(self) -> None:
        """Forget every cached block (an operator's cache reset, with no block referenced);
        the free queue keeps its order (vLLM's `BlockPool.reset_prefix_cache`)."""
        assert not self.refs, f"blocks {sorted(self.refs)} are still referenced"
        self.cache.clear()
        self.index.clear()

    def register(self, b: int, key: ContentKey) -> None:
        """Cache block `b` under content `key` (last in the key's cache order); a block already
        cached keeps its key."""
        if b not in self.cache:
            self.cache[b] = key
            self.index.setdefault(key, {})[b] = None

    @property
    def owner(self) -> dict[int, str]:
        """Block id -> one holder (the least request id) of every referenced block; derived from the
        reference counts, which are the truth here."""
        return {b: min(h) for b, h in self.refs.items()}

    @owner.setter
    def owner(self, value: dict[int, str]) -> None:
        """Ignored: `BlockPool.__init__` assigns it; the reference counts are the truth."""
        pass  # BlockPool.__init__ assigns it; the reference counts are the truth here

    def holders(self) -> dict[int, frozenset[str]]:
        """Block id -> every request holding a reference to it."""
        return {b: frozenset(h) for b, h in self.refs.items()}


@dataclass(slots=True, eq=False)  # identity: queues hold the objects themselves
class ArReq:
    """One AR request as the reference schedulers track it (compared by identity)."""

    spec: ArRequest
    arrival: int
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    attained: int = 0
    waited: int = 0
    num_restarts: int = 0
    # an input it awaits before it may be admitted (`ArAwaiting`); until the waiting pass
    # promotes it (vLLM's blocked status); until admitted (vLLM's `deferred_waiting`)
    awaiting: str | None = None
    unpromoted: bool = False
    deferred: bool = False
    keys: list[ContentKey] = field(default_factory=list)  # content keys of blocks 0, 1, ...
    # speculative decoding (`ArDraftingAdapter`): the drafts proposed for its next step, and
    # how many of them the model will accept
    proposed: int = 0
    accept: int = 0
    # timings (in steps) for metrics
    first_scheduled: int | None = None
    first_token: int | None = None
    completed: int | None = None

    @property
    def rid(self) -> str:
        """The request id."""
        return self.spec.request_id

    @property
    def known(self) -> int:
        """Prompt plus sampled outputs (Vidur: the prefill of a restarted request)."""
        return self.spec.prompt_len + self.num_output

    @property
    def uncomputed(self) -> int:
        """Known tokens not computed yet."""
        return self.known - self.num_computed

    def token(self, i: int) -> object:
        """Token i's identity: a prompt token id, an output's scripted id
        (`ArRequest.outputs`), else private to the request."""
        s = self.spec
        if i < s.prompt_len:
            return s.prompt[i] if s.prompt is not None else (self.rid, i)
        j = i - s.prompt_len
        if s.outputs is not None and j < len(s.outputs):
            return s.outputs[j]
        return (self.rid, "o", i)

    def key(self, k: int, block_size: int, ahead: int = 0) -> ContentKey:
        """The content key of block k: the chained tokens [0, (k + 1) * block_size), under the
        request's LoRA adapter (vLLM hashes it into each block), and with `ahead` the tokens
        after them too (vLLM's `num_hash_lookahead_tokens`, an EAGLE drafter's; the caller
        makes sure they are known: `hashable`)."""
        while len(self.keys) <= k:
            j = len(self.keys)
            parent: object = self.keys[-1] if self.keys else ("lora", self.spec.lora)
            toks = tuple(self.token(i) for i in range(j * block_size, (j + 1) * block_size))
            self.keys.append((parent, toks))
        if not ahead:
            return self.keys[k]
        start = (k + 1) * block_size
        return ("ahead", self.keys[k], tuple(self.token(i) for i in range(start, start + ahead)))

    def hashable(self, block_size: int, ahead: int = 0) -> int:
        """How many leading blocks have a content key now: every full block of its known
        tokens, less `ahead` (the tokens after a block must be known)."""
        return max(0, self.known - ahead) // block_size

    @property
    def prefill_done(self) -> bool:
        """It decodes: an output was sampled and at most its last known token is uncomputed (a
        request restarted after sampling, one token short of its recompute, counts too)."""
        return self.num_computed >= self.known - 1 and self.num_output > 0

    def finish_reason(self) -> ArFinishReason | None:
        """STOP once `stop_after` outputs were sampled, else LENGTH once `max_tokens` were; None
        while neither."""
        s = self.spec
        if s.stop_after is not None and self.num_output >= s.stop_after:
            return ArFinishReason.STOP
        if self.num_output >= s.max_tokens:
            return ArFinishReason.LENGTH
        return None


class ArSchedulerBase:
    """Implements `spec.ar.adapter.ArSchedulerAdapter`, less the scheduling decision.

    Bounded state for long-lived use: `finished` keeps only the latest `retain_finished`
    finished requests (metrics readers take them as they go; `num_finished` counts all); what
    grows with the number of requests is only `seen`, the set of ids (duplicate ids must be
    refused for ever).
    """

    name = "base"
    retain_finished = 10_000
    # with prefix caching, a block's content key covers this many tokens after it (vLLM's
    # `num_hash_lookahead_tokens`: 1 with an EAGLE drafter), and it is cached once they are
    # known, as the request takes its output
    hash_ahead: int = 0
    # samples the scripted outputs a request names (`ArRequest.outputs`) and, with prefix
    # caching, names them (`ArOutputTokens`): a decision twin replays a log's next-turn hits
    names_outputs = True

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        self._config = config
        self.sink = sink
        caching = config.enable_prefix_caching
        self.pool: BlockPool = (CachingBlockPool if caching else BlockPool)(config, sink)
        self.waiting: deque[ArReq] = deque()
        self.running: list[ArReq] = []
        self.finished: dict[str, ArReq] = {}
        self.num_finished: int = 0
        self.seen: set[str] = set()
        self.step_index: int = 0
        self.arrivals: int = 0
        self.scheduled: dict[str, int] = {}  # this step: request id -> tokens
        self.step_drafts: dict[str, int] = {}  # this step: request id -> its draft tokens
        self.step_preempted: list[ArReq] = []

    @property
    def config(self) -> ArConfig:
        """The configuration it was built for."""
        return self._config

    @property
    def rules(self) -> ArRules:
        """`rules_for(config)`: what a vLLM-v1-style scheduler promises under `config.policy`; a
        subclass that decides otherwise overrides it."""
        return rules_for(self._config)

    # ------------------------------------------------------------------ adapter API
    def submit(self, request: ArRequest) -> None:
        """`validate_ar_request`, then `DuplicateRequest` for an id submitted before, ever (both
        before any change); else queue it (`_enqueue`) with the next arrival index and emit
        `ArSubmitted`."""
        validate_ar_request(self.config, request)
        if request.request_id in self.seen:
            raise DuplicateRequest(request.request_id)
        self.seen.add(request.request_id)
        req = ArReq(request, self.arrivals)
        self.arrivals += 1
        self._enqueue(req)
        s = request
        self.sink(
            ArSubmitted(
                s.request_id,
                s.prompt_len,
                s.max_tokens,
                s.stop_after,
                s.priority,
                s.predicted_len,
                s.prompt,
                cache_read_limit=s.cache_read_limit,
                lora=s.lora,
            )
        )

    def _enqueue(self, req: ArReq) -> None:
        self.waiting.append(req)

    def abort(self, request_id: str) -> None:
        """Take the request out of `waiting` or `running`, free what it holds (`ArBlocksFreed`, if
        any) and emit `ArAborted`; an id in neither raises `UnknownRequest`, changing nothing."""
        for req in list(self.waiting):
            if req.rid == request_id:
                self.waiting.remove(req)
                self._free_all(req)
                self.sink(ArAborted(request_id))
                return
        for req in self.running:
            if req.rid == request_id:
                self.running.remove(req)
                self._free_all(req)
                self.sink(ArAborted(request_id))
                return
        raise UnknownRequest(request_id, len(self.waiting) + len(self.running))

    def step(self) -> None:
        """One step: `_schedule` (the subclass's scheduling phase), `_execute` (`ArStepEnd`, then
        the scheduled tokens computed at constant batch time), `_update` (running requests at a
        finish reason finish, freeing their blocks); then `step_index` advances."""
        self.scheduled = {}
        self.step_drafts = {}
        self.step_preempted = []
        self._schedule()
        self._execute()
        self._update()
        self.step_index += 1

    def drain(self, max_steps: int = 100_000) -> None:
        """`drain_steps` over `step` and `is_idle`: after `max_steps` steps with work left,
        `SchedulerStalled` naming the waiting and running counts."""
        drain_steps(
            self.step, self.is_idle, lambda: (len(self.waiting), len(self.running)), max_steps
        )

    def is_idle(self) -> bool:
        """Nothing waiting or running."""
        return not self.waiting and not self.running

    def snapshot(self) -> ArSnapshot:
        """Read from the pool and the queues: free blocks are the free queue (with prefix caching,
        cached blocks nobody references included); block owners, or with prefix caching block
        holders, reference counts and cached blocks; computed tokens of running and waiting
        requests."""
        computed = {r.rid: r.num_computed for r in self.running}
        computed.update({r.rid: r.num_computed for r in self.waiting})
        pool = self.pool
        caching = isinstance(pool, CachingBlockPool)
        return ArSnapshot(
            free_blocks=frozenset(pool.free_queue),
            block_owners={} if caching else dict(pool.owner),
            running=tuple(r.rid for r in self.running),
            waiting=tuple(r.rid for r in self.waiting),
            num_computed=computed,
            block_holders=pool.holders() if caching else None,
            block_refcounts=self._refcounts() if caching else None,
            cached_blocks=frozenset(pool.cache) if isinstance(pool, CachingBlockPool) else None,
        )

    def _refcounts(self) -> dict[int, int]:
        """The pool's reference count of every referenced block (prefix caching)."""
        pool = self.pool
        assert isinstance(pool, CachingBlockPool)
        return {b: len(h) for b, h in pool.refs.items()}

    # ------------------------------------------------------------------ helpers
    def _schedule(self) -> None:  # pragma: no cover - subclasses decide
        raise NotImplementedError

    def _blocks_needed(self, req: ArReq, num_tokens: int) -> int:
        """New blocks so the request holds computed + num_tokens tokens (and a drafter's
        lookahead slots past them, `_blocks_upto`)."""
        return max(0, self._blocks_upto(req.num_computed + num_tokens) - len(req.blocks))

    def _blocks_upto(self, tokens: int) -> int:
        """The blocks a request computing up to `tokens` holds: those tokens and the
        drafter's `num_lookahead_tokens` slots after them, within `max_model_len` (vLLM's
        `allocate_slots`)."""
        cfg = self.config
        ahead = cfg.num_lookahead_tokens
        return cfg.blocks_for(min(tokens + ahead, cfg.max_model_len) if ahead else tokens)

    def _grow(self, req: ArReq, n_blocks: int) -> None:
        if n_blocks > 0:
            req.blocks.extend(self.pool.allocate(req.rid, n_blocks))

    def _emit_scheduled(self, req: ArReq, num_tokens: int, drafts: int = 0) -> None:
        """`num_tokens` for the request this step, the last `drafts` of them its drafts; its
        proposal is spent."""
        self.scheduled[req.rid] = num_tokens
        req.proposed = 0
        if drafts:
            self.step_drafts[req.rid] = drafts
        if req.first_scheduled is None:
            req.first_scheduled = self.step_index
        self.sink(ArScheduled(req.rid, num_tokens, drafts))
        self._cache_full_blocks(req, req.num_computed + num_tokens)

    def _cache_full_blocks(self, req: ArReq, upto: int) -> None:
        """Prefix caching: the full blocks of the first `upto` tokens become cached (as vLLM
        caches at scheduling the blocks this step fills), those with a content key
        (`hash_ahead`: the tokens after a block known)."""
        pool = self.pool
        if not isinstance(pool, CachingBlockPool):
            return
        bs, ahead = self.config.block_size, self.hash_ahead
        full = min(min(upto, req.known) // bs, req.hashable(bs, ahead))
        for k in range(min(full, len(req.blocks))):
            pool.register(req.blocks[k], req.key(k, bs, ahead))

    def _preempt(self, victim: ArReq, reset: bool = False) -> None:
        """Free every block, discard computed tokens, wait at the head of the queue. With
        `reset`, an operator's cache reset between steps preempted it (not the step)."""
        freed = list(victim.blocks)
        self.pool.release(victim.rid, freed)
        victim.blocks = []
        victim.num_computed = 0
        victim.proposed = 0  # vLLM drops a preempted request's drafts
        victim.num_restarts += 1
        self.running.remove(victim)
        self.waiting.appendleft(victim)
        if not reset:
            self.step_preempted.append(victim)
        self.sink(ArPreempted(victim.rid, tuple(freed), reset=reset))

    def _free_all(self, req: ArReq) -> None:
        blocks, req.blocks = req.blocks, []
        self.pool.free(req.rid, blocks)

    def _execute(self) -> None:
        """The model runs the batch (constant batch time): computed tokens advance and a request
        that caught up with its known tokens samples one output token; where the step carried
        its drafts, the model then accepts the first `accept` of them, up to the request's end
        (`ArDraftsVerified`), and the rest are no longer computed."""
        self.sink(ArStepEnd(self.step_index))
        for req in self.running:
            n = self.scheduled.get(req.rid)
            if n is None:
                continue
            drafts = self.step_drafts.get(req.rid, 0)
            req.num_computed += n
            req.attained += n - drafts
            if req.num_computed - drafts == req.known:
                req.num_output += 1
                if req.first_token is None:
                    req.first_token = self.step_index
                accepted = self._verify(req, drafts) if drafts else 0
                if self.hash_ahead and not drafts:  # its last block's next token is known now
                    self._cache_full_blocks(req, req.num_computed)
                self._name_output(req, 1 + accepted)
        for req in self.waiting:
            req.waited += 1

    def _verify(self, req: ArReq, drafts: int) -> int:
        """The step's `drafts` of `req` verified: the first `accept` become outputs, cut at the
        request's end; the rest are rolled back (their blocks stay held). With prefix caching
        the accepted tokens' full blocks are cached, as vLLM caches after the output."""
        accepted = min(req.accept, drafts, req.spec.final_output - req.num_output)
        req.num_computed -= drafts - accepted
        req.num_output += accepted
        req.attained += accepted
        self.sink(ArDraftsVerified(req.rid, accepted))
        self._cache_full_blocks(req, req.num_computed)
        return accepted

    def _name_output(self, req: ArReq, count: int = 1) -> None:
        """With prefix caching, name the `count` outputs just sampled where the request scripts
        their ids (`ArOutputTokens`, in the step's update phase, as vLLM's log names them)."""
        scripted = req.spec.outputs
        first = req.num_output - count
        if self.config.enable_prefix_caching and scripted is not None and first < len(scripted):
            self.sink(ArOutputTokens(req.rid, tuple(scripted[first : req.num_output])))

    def _update(self) -> None:
        for req in list(self.running):
            reason = req.finish_reason()
            if reason is not None:
                self._finish(req, reason)

    def _finish(self, req: ArReq, reason: ArFinishReason) -> None:
        self.running.remove(req)
        self._free_all(req)
        req.completed = self.step_index
        self._retire(req)
        self.sink(ArFinished(req.rid, reason))

    def _retire(self, req: ArReq) -> None:
        self.finished[req.rid] = req
        self.num_finished += 1
        while len(self.finished) > self.retain_finished:
            del self.finished[next(iter(self.finished))]  # the oldest
