"""The AR seeded-bug catalogue: mutants of the reference AR schedulers.

Each mutant overrides one small method to plant one bug (most shipped in a real scheduler).
`tests/test_ar_mutants.py` asserts the AR conformance suite FAILS on every mutant with the
violation naming `rule`. `configs` narrows generated configurations to where the bug can show;
the suite itself is unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from hypothesis import strategies as st

from properties.ar.strategies import ar_configs
from reference.ar.base import ArReq, ArSchedulerBase, CachingBlockPool
from reference.ar.mnemosyne import VidurMnemosyne
from reference.ar.prefix_cache import VLLM_V1_PREFIX, PrefixCachingVllmV1
from reference.ar.seeded_bugs import BudgetOverflow, DoubleFree, PreemptsHead, SkipsToHead
from reference.ar.vidur import VidurFasterTransformer, VidurLightLlm, VidurOrca, VidurVllm
from reference.ar.vllm_settings import (
    VLLM_033_ADAPTIVE,
    VLLM_033_CADENCE,
    VLLM_033_WATERMARK,
    VLLM_034_CACHE_AWARE,
    VLLM_V1_ADAPTIVE,
    VLLM_V1_CACHE_AWARE,
    VLLM_V1_CADENCE,
    VLLM_V1_WATERMARK,
)
from reference.ar.vllm_v1 import VLLM_033, VLLM_V1, VllmOptions, VllmV1Scheduler
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import ArCacheEvicted, ArFinished, ArFinishReason
from spec.ar.profile import ArConfigSpace, ArProfile
from spec.implementation import ArImplementation


class AdmitsOnePerStep(VllmV1Scheduler):
    """A waiting pass that stops after its first admission, though the next request fits: it
    admits less than vLLM's pass, which stops only at a request it cannot admit."""

    running_before_pass: int | None = None

    def _schedule_waiting(self, budget: int) -> None:
        self.running_before_pass = len(self.running)
        try:
            super()._schedule_waiting(budget)
        finally:
            self.running_before_pass = None

    def _admissible(self) -> list[ArReq]:
        before = self.running_before_pass
        return [] if before is not None and len(self.running) > before else super()._admissible()


class WholePromptsOnly(VllmV1Scheduler):
    """With chunked prefill on, admits a waiting prompt only whole: one longer than the
    budget left waits for a later step, though vLLM admits a chunk of it (only running
    requests are chunked)."""

    def _waiting_tokens(self, req: ArReq, budget: int) -> int | None:
        n = super()._waiting_tokens(req, budget)
        return None if n is not None and budget < req.uncomputed else n


class AdapterSlotsIgnored(VllmV1Scheduler):
    """Admits a waiting request whatever adapters the running requests use: past
    `max_loras` (vLLM would skip it: "Scheduling would exceed max_loras")."""

    def _admissible(self) -> list[ArReq]:
        return [r for r in self.waiting if r.awaiting is None]


class AcceptsEndedIds(VllmV1Scheduler):
    """Refuses an id only while its request is queued or running: an ended request's id is
    taken again (a scheduler that looks ids up among the requests it holds)."""

    def submit(self, request: ArRequest) -> None:
        self.seen = {r.rid for r in self.waiting} | {r.rid for r in self.running}
        super().submit(request)


class PreemptsScheduled(VllmV1Scheduler):
    """vLLM #23347: under priority the victim is the lowest priority among *all* running
    requests, including one already scheduled in this step (its tokens stay in the batch)."""

    def _pick_victim(self, req: ArReq, index: int) -> ArReq:
        return max(self.running, key=lambda r: (r.spec.priority, r.arrival))


class RecyclesOwnOldest(VllmV1Scheduler):
    """A sliding window applied to a full-attention model: each time a running request grows,
    it frees its oldest block, whose KV its attention still reads, and takes one more fresh
    block in its place. It holds as many blocks as its tokens need, so a count of blocks
    against computed tokens never notices."""

    def _grow(self, req: ArReq, n_blocks: int) -> None:
        if n_blocks > 0 and req in self.running and req.num_computed > 0 and req.blocks:
            oldest, req.blocks = req.blocks[:1], req.blocks[1:]
            self.pool.free(req.rid, oldest)
            n_blocks += 1
        super()._grow(req, n_blocks)


class VidurFtMissingFree(VidurFasterTransformer):
    """Vidur's published FasterTransformer scheduler: a request that finishes before the rest
    of its static batch is never freed (`free_batch` frees only the final batch's requests and
    `_pending_free_map` is never filled)."""

    def _finish(self, req: ArReq, reason: ArFinishReason) -> None:
        if any(r is not req and r.finish_reason() is None for r in self.running):
            blocks, req.blocks = req.blocks, []  # dropped, never returned to the pool
            self.running.remove(req)
            self.finished[req.rid] = req
            self.sink(ArFinished(req.rid, reason))
            req.blocks = blocks
            return
        super()._finish(req, reason)


class VidurOneFreeBlock(VidurVllm):
    """Vidur's vLLM check as published: a running request needs one free block even when it
    needs no new block. At an exact-fit pool it restarts the request that holds the whole pool
    and schedules an empty batch (Vidur's simulator then idles forever)."""

    def _decode_or_restart(self, req: ArReq) -> bool:
        while self.pool.num_free < 1:
            if self.pending:
                self._restart(self.pending[-1])
            else:
                self._restart(req)
                return False
        self._grow_existing(req)
        return True


class MnemosyneRestartsHead(VidurMnemosyne):
    """Mnemosyne restarting the head of its decode queue (the request that started decoding
    first) instead of the tail when a decode finds no free block."""

    def _free_block_or_restart(self, req: ArReq) -> bool:
        while self.pool.num_free == 0:
            if not self.pending:
                self._restart(req)
                return False
            self._restart(self.pending[0])
        return True


class MnemosyneUnboundedLookahead(VidurMnemosyne):
    """Mnemosyne reading its whole queue for a request it can admit, past any number of
    requests that do not fit (Vidur stops once it skipped MAX_NUM_SKIPPED_REQUESTS = 10)."""

    def _add_prefills(self, queue: list[ArReq]) -> None:
        skipped = 0
        while len(queue) > skipped:
            if self._prefill_chunk(queue[skipped]):
                queue.pop(skipped)
            else:
                skipped += 1


class VidurLightLlmStrict(VidurLightLlm):
    """Vidur's LightLLM as published: admission needs the peak memory strictly below the pool
    (`<`), so a request whose peak equals the pool is never admitted: a stall."""

    def _peak_fits(self, candidate: ArReq, admitted: list[ArReq]) -> bool:
        fits = super()._peak_fits(candidate, admitted)
        if not fits:
            return False
        items = [self._tuple_tokens(r, True) for r in self.running if r not in admitted]
        items += [self._tuple_tokens(r, False) for r in [*admitted, candidate]]
        items.sort(key=lambda x: -x[1])
        need, held = 0, 0
        for i, (has_run, left) in enumerate(items):
            held += has_run
            need = max(need, left * (i + 1) + held)
        return need < self.config.usable_blocks


class VidurOrcaFloor(VidurOrca):
    """Vidur's Orca as published: it reserves max_model_len // block_size blocks per request,
    one too few when max_model_len is not a multiple of the block size."""

    def _admit_waiting(self) -> None:
        cfg = self.config
        reserve = cfg.max_model_len // cfg.block_size
        while self.waiting and len(self.batch) < self.micro_batch_cap:
            if len(self.running) >= cfg.max_num_seqs or self.pool.num_free < reserve:
                break
            req = self.waiting[0]
            self._admit_new(req, reserve)
            self._add(req, req.uncomputed)


class AgingIgnoresBound(VllmV1Scheduler):
    """Aging without the bound: plain SJF, so a long request waits past max_wait_steps while
    shorter arrivals are admitted ahead of it."""

    def _peek_waiting(self) -> ArReq:
        return min(self.waiting, key=self._admission_key)


class FairNoFloor(VllmV1Scheduler):
    """Fairness floor broken: running prefills are served first (most uncomputed tokens first)
    without reserving one token per running request, so a decode behind a long prefill gets 0
    tokens in a step where the floor applies."""

    def _schedule_running(self, budget: int) -> int:
        cfg = self.config
        for req in sorted(self.running, key=lambda r: -r.uncomputed):
            if budget <= 0:
                break
            if req not in self.running:  # preempted by an earlier one
                continue
            n = min(req.uncomputed, budget)
            if cfg.long_prefill_token_threshold:
                n = min(n, cfg.long_prefill_token_threshold)
            if cfg.fair_token_cap:
                n = min(n, cfg.fair_token_cap)
            got = self._fit_or_preempt(req, n, self.running.index(req))
            if got:
                self._emit_scheduled(req, got)
                budget -= got
        return budget


class FairCapExceeded(VllmV1Scheduler):
    """Fairness cap ignored for running requests: a prefill chunk beyond fair_token_cap."""

    def _running_tokens(self, req: ArReq, index: int, budget: int) -> int:
        later = len(self.running) - index - 1
        n = min(req.uncomputed, max(1, budget - later))
        if self.config.long_prefill_token_threshold:
            n = min(n, self.config.long_prefill_token_threshold)
        return n


class PriorityFcfs(VllmV1Scheduler):
    """Priority order broken: admits the head of the queue, ahead of a higher priority."""

    def _peek_waiting(self) -> ArReq:
        return self.waiting[0]


class SjfLongestFirst(VllmV1Scheduler):
    """SJF order broken: the comparison is flipped (longest job first)."""

    def _peek_waiting(self) -> ArReq:
        return max(
            self.waiting, key=lambda r: (r.spec.prompt_len + r.spec.expected_output, -r.arrival)
        )


class SoftEvicts(VllmV1Scheduler):
    """Soft preemption that evicts: when the best waiting request has no seat or blocks, a
    running request of lower priority is preempted for it and it is admitted at once."""

    def _schedule(self) -> None:
        if self.waiting and self.running:
            best = self._peek_waiting()
            key = self._admission_key(best)
            need = self.config.blocks_for(min(best.uncomputed, self.config.max_num_batched_tokens))
            while self.running and (
                len(self.running) >= self.config.max_num_seqs or need > self.pool.num_free
            ):
                victim = max(self.running, key=lambda r: (r.spec.priority, r.arrival))
                if self._admission_key(victim) <= key:
                    break
                self._preempt(victim)
                self.waiting.remove(victim)
                self.waiting.append(victim)
            if self.step_preempted:
                budget = self.config.max_num_batched_tokens
                n = self._waiting_tokens(best, budget)
                if n is not None and self._blocks_needed(best, n) <= self.pool.num_free:
                    self._admit(best)
                    self._grow(best, self._blocks_needed(best, n))
                    self._emit_scheduled(best, n)
                    budget -= n
                self._schedule_running(budget)
                return
        super()._schedule()


class _LeakyPool(CachingBlockPool):
    """Freeing a shared block forgets to drop the freeing request's reference."""

    def release(self, rid: str, blocks: list[int]) -> None:
        super().release(rid, [b for b in blocks if len(self.refs.get(b, ())) <= 1])


class RefcountLeak(PrefixCachingVllmV1):
    """Prefix caching with a reference-count leak: a request that frees a block another
    request shares keeps its reference (the block can never return to the free queue)."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink)
        self.pool = _LeakyPool(config, sink)


class EvictsReferenced(PrefixCachingVllmV1):
    """A cache reset after every step that evicts every cached block, referenced or not."""

    def _update(self) -> None:
        super()._update()
        pool = self.pool
        if isinstance(pool, CachingBlockPool) and pool.cache:
            victims = sorted(pool.cache)
            for b in victims:
                pool._evict(b)
            self.sink(ArCacheEvicted(tuple(victims)))


class HitBeyondCache(PrefixCachingVllmV1):
    """A cache hit that claims one block more than is cached (the next free block)."""

    def _hit(self, req: ArReq) -> list[int]:
        hit = super()._hit(req)
        room = (req.known - 1) // self.config.block_size
        spare = [b for b in self.pool.free_queue if b not in hit]
        if len(hit) < room and spare:
            return [*hit, spare[0]]
        return hit


class KeepsUnwrittenCached(PrefixCachingVllmV1):
    """vLLM 0.33.0 (docs/engines/vllm.md): under priority the victim is chosen among all running
    requests, and one preempted in the step that scheduled it keeps that step's blocks in the
    prefix cache, though no forward writes their KV."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink, VllmOptions(victim_among_all=True))

    def _uncache_unwritten(self, victim: ArReq) -> None:
        pass


class _Watermarked(PrefixCachingVllmV1):
    """`vllm-v1-watermark`: vLLM 0.33.0's options and its watermark, prefix caching as the
    config says."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink, VLLM_033_WATERMARK)


class AdaptiveFloorOverRunning(PrefixCachingVllmV1):
    """vLLM's adaptive long-prefill threshold with the budget shared among the running
    requests only, the waiting ones not counted (vLLM counts both: `get_request_counts`)."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink, VLLM_033_ADAPTIVE)

    def _step_threshold(self) -> int:
        threshold = super()._step_threshold()
        if threshold == self.config.long_prefill_token_threshold and threshold:
            # the fair share over the running requests alone (at least one)
            share = self.config.max_num_batched_tokens // max(1, len(self.running))
            return max(threshold, share)
        return threshold


class CadenceIgnored(PrefixCachingVllmV1):
    """vLLM's scheduler without the prefill cadence its profile declares."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink, VLLM_033)

    def _cadence_holds(self) -> bool:
        return False


class CadenceRestartsOnAdmissions(PrefixCachingVllmV1):
    """The prefill cadence's interval restarted by admissions only, not by a running request's
    next prefill chunk (vLLM restarts it on either: `prefill_scheduled or prefill_admitted`)."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink, VLLM_033_CADENCE)

    def _emit_scheduled(self, req: ArReq, num_tokens: int, drafts: int = 0) -> None:
        carried = self._carried_prefill
        super()._emit_scheduled(req, num_tokens, drafts)
        if req.rid in self._step_running:
            self._carried_prefill = carried


class CadenceCountsAdapterSkips(PrefixCachingVllmV1):
    """vLLM's prefill cadence whose capacity escape counts a request the pass skipped for its
    LoRA adapter as work left waiting (vLLM defers it, `deferred_waiting`, until admitted)."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink, VLLM_033_CADENCE)

    def _defer_skipped(self, upto: ArReq | None) -> None:
        return


class WatermarkIgnored(_Watermarked):
    """vLLM's admission without its watermark, though the profile declares one."""

    def _watermark_now(self) -> int:
        return 0


class WatermarkOfUsableBlocks(_Watermarked):
    """The watermark taken of the usable blocks, not of the whole pool with its null block
    (Vidur's base, where vLLM's is `kv_cache_config.num_blocks`)."""

    def _watermark_now(self) -> int:
        if not self.running:
            return 0
        return int(self.options.watermark * self.config.usable_blocks)


class WatermarkBeforeTheStep(_Watermarked):
    """The watermark binds only where a request ran before the step, not beside one admitted
    earlier in the same step (vLLM passes `bool(self.running)` at each admission)."""

    def _schedule(self) -> None:
        self._ran_before = bool(self.running)
        super()._schedule()

    def _watermark_now(self) -> int:
        return super()._watermark_now() if self._ran_before else 0


class WholeSequenceBelowWatermark(_Watermarked):
    """The whole-sequence gate checked against all free blocks, the watermark not kept above
    it (vLLM adds `watermark_blocks` to the whole sequence's blocks)."""

    def _sequence_margin(self, mark: int) -> int:
        return 0


class _CacheAware(PrefixCachingVllmV1):
    """`VLLM_V1_CACHE_AWARE`: vLLM's options with 0.34.0's cache-aware admission."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink, VLLM_034_CACHE_AWARE)


class CacheAwareIgnored(_CacheAware):
    """Admission in arrival order, though the profile declares the cache-aware window."""

    def _reorder_by_cached_prefix(self) -> None:
        pass


class CacheAwareBelowThreshold(_CacheAware):
    """The cache-aware window engaged at any usage (vLLM skips it below the threshold)."""

    def _usage(self) -> float:
        return 1.0


class CacheAwareMovesPreempted(_CacheAware):
    """A preempted request reordered with the fresh ones (vLLM keeps it in place: only
    requests merely waiting, never computed, take part)."""

    def _reorder_by_cached_prefix(self) -> None:
        restarts = {id(r): r.num_restarts for r in self.waiting}
        for r in self.waiting:
            r.num_restarts = 0
        try:
            super()._reorder_by_cached_prefix()
        finally:
            for r in self.waiting:
                r.num_restarts = restarts[id(r)]


class CacheAwareWholeQueue(_CacheAware):
    """The whole waiting queue reordered, not the first `window` requests."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink)
        self.options = dataclasses.replace(self.options, cache_aware_window=10_000)


@contextlib.contextmanager
def _limit_lifted(req: ArReq) -> Iterator[None]:
    """Within the block `req` carries no cache read limit."""
    spec = req.spec
    req.spec = dataclasses.replace(spec, cache_read_limit=None)
    try:
        yield
    finally:
        req.spec = spec


class CacheReadLimitIgnored(PrefixCachingVllmV1):
    """A cache hit that reaches past the request's `cache_read_limit` (into the rows a
    prompt-scoring request must compute, or for a request that skips the cache)."""

    def _hit(self, req: ArReq) -> list[int]:
        with _limit_lifted(req):
            return super()._hit(req)


class CacheAwareProbeUnbounded(_CacheAware):
    """The cache-aware window ranks a request by its whole cached prefix, past its
    `cache_read_limit` (vLLM 0.34.0's `get_num_cached_tokens` does: a finding)."""

    def _cached_tokens(self, req: ArReq) -> int:
        with _limit_lifted(req):
            return super()._cached_tokens(req)


def _caching() -> st.SearchStrategy[ArConfig]:
    return ar_configs(chunked=(True,), prefix_caching=(True,)).map(
        lambda c: c.replace(num_blocks=c.num_blocks + c.max_blocks_per_request)
    )


def _f(cls: type[ArSchedulerBase]) -> ArImplementationFactory:
    def factory(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        return cls(config, sink)

    factory.__name__ = f"make_{cls.__name__}"
    return factory


def _f033(cls: type[VllmV1Scheduler]) -> ArImplementationFactory:
    """A factory of `cls` with vLLM 0.33.0's options (`VLLM_033`), as the `vllm-v1` and
    `vllm-v1-prefix` it mutates: checked under their profile, whose policy declares those
    options, a mutant built without them would break their rules as well as its own."""

    def factory(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        return cls(config, sink, VLLM_033)

    factory.__name__ = f"make_{cls.__name__}_033"
    return factory


@dataclass(frozen=True)
class ArMutant:
    name: str
    rule: str
    factory: ArImplementationFactory
    configs: st.SearchStrategy[ArConfig]
    description: str
    #: The profile the suite checks the mutant under (None: the idealised spec).
    profile: ArProfile | None = None


def _tight(policies: tuple[Policy, ...] = (Policy.FCFS,)) -> st.SearchStrategy[ArConfig]:
    """Pools of one or two requests' worst case with several seats: preemption pressure."""
    return ar_configs(policies=policies, max_seqs=4).map(
        lambda c: c.replace(
            num_blocks=c.max_blocks_per_request + (1 if c.reserve_null_block else 0),
            max_num_seqs=max(c.max_num_seqs, 2),
            max_num_batched_tokens=max(c.max_num_batched_tokens, 2),
        )
    )


def _policy(policy: Policy, **changes: int) -> st.SearchStrategy[ArConfig]:
    """Roomy pools, one or two seats, chunked prefill: the policy's order decides admission."""
    return ar_configs(policies=(policy,), chunked=(True,), max_seqs=2).map(
        lambda c: c.replace(**changes)
    )


def _unwritten() -> st.SearchStrategy[ArConfig]:
    """Priority, prefix caching, one-token blocks (every scheduled token fills a block), small
    prefill chunks beside a decode (a lower-priority prefill is scheduled first, then a decode
    finds no block) and a pool of one request's worst case (max_model_len 8: 7 blocks)."""
    return ar_configs(
        policies=(Policy.PRIORITY,),
        chunked=(True,),
        block_sizes=st.just(1),
        max_seqs=2,
        prefix_caching=(True,),
    ).map(
        lambda c: c.replace(
            max_num_seqs=2,
            max_num_batched_tokens=3,
            long_prefill_token_threshold=2,
            max_model_len=8,
            reserve_null_block=True,  # as vLLM's space has it (its block 0)
            num_blocks=8,
        )
    )


def _watermarked(chunked: bool, blocks_mod_4: bool = False) -> st.SearchStrategy[ArConfig]:
    """vLLM's space (the null block reserved) under `vllm-v1-watermark`, two to four seats;
    with `blocks_mod_4` pools of a multiple of 4 blocks, where a quarter of the whole pool is
    one block more than a quarter of the usable blocks."""
    configs = ar_configs(
        policies=(Policy.FCFS, Policy.PRIORITY),
        chunked=(chunked,),
        null_block=(True,),
        prefix_caching=(False, True),
    ).map(
        lambda c: c.replace(
            max_num_seqs=max(c.max_num_seqs, 2),
            max_num_batched_tokens=max(c.max_num_batched_tokens, 2),
        )
    )
    if blocks_mod_4:
        configs = configs.map(lambda c: c.replace(num_blocks=c.num_blocks + -c.num_blocks % 4))
    return configs


def _cadenced() -> st.SearchStrategy[ArConfig]:
    """vLLM's space, chunked prefill with a long-prefill threshold (prefills span steps beside
    decodes), two to four seats and a roomy pool."""
    return ar_configs(
        policies=(Policy.FCFS, Policy.PRIORITY), chunked=(True,), null_block=(True,)
    ).map(
        lambda c: c.replace(
            max_num_seqs=max(c.max_num_seqs, 2),
            max_num_batched_tokens=max(c.max_num_batched_tokens, 2),
            long_prefill_token_threshold=max(c.long_prefill_token_threshold, 1),
            num_blocks=c.num_blocks + c.max_blocks_per_request,
        )
    )


def _cache_aware() -> st.SearchStrategy[ArConfig]:
    """vLLM's space (the null block reserved), FCFS, prefix caching, two to four seats."""
    return ar_configs(
        policies=(Policy.FCFS,), chunked=(True, False), null_block=(True,), prefix_caching=(True,)
    ).map(
        lambda c: c.replace(
            max_num_seqs=max(c.max_num_seqs, 2),
            max_num_batched_tokens=max(c.max_num_batched_tokens, 2),
        )
    )


def _cache_aware_tight() -> st.SearchStrategy[ArConfig]:
    """`_cache_aware` with a pool of one request's worst case: preemptions, and so preempted
    requests in the window, come early."""
    return _cache_aware().map(lambda c: c.replace(num_blocks=c.max_blocks_per_request + 1))


def _vidur(chunked: bool = False) -> st.SearchStrategy[ArConfig]:
    return ar_configs(chunked=(chunked,), thresholds=False)


#: `AdapterSlotsIgnored` declaring that it serves adapters: `verify --impl
#: tests.ar_mutants:ADAPTER_SLOTS_IGNORED --loras` catches it (`lora_slots`); without `--loras`
#: no adapter is drawn and it passes.
ADAPTER_SLOTS_IGNORED = ArImplementation(
    _f(AdapterSlotsIgnored), ArProfile(space=ArConfigSpace(max_loras=None))
)


AR_MUTANTS: dict[str, ArMutant] = {
    m.name: m
    for m in (
        ArMutant(
            "accepts_ended_ids",
            "unique_submission",
            _f(AcceptsEndedIds),
            ar_configs(),
            "an ended request's id is accepted again",
        ),
        ArMutant(
            "preempts_head",
            "preemption_victim",
            _f(PreemptsHead),
            _tight(),
            "preempts the head of running instead of the tail",
        ),
        ArMutant(
            "preempts_scheduled",
            "no_preempt_scheduled",
            _f(PreemptsScheduled),
            _tight((Policy.PRIORITY,)),
            "vLLM #23347: priority preemption picks a request already scheduled in this step",
        ),
        ArMutant(
            "skips_to_head",
            "fcfs_admission",
            _f(SkipsToHead),
            _tight(),
            "vLLM PR #33522: skipped waiting requests re-inserted at the head, later ones "
            "admitted first",
        ),
        ArMutant(
            "double_free",
            "free_owned_only",
            _f(DoubleFree),
            ar_configs(),
            "vLLM #42571: a block freed twice",
        ),
        ArMutant(
            "recycles_own_oldest",
            "kv_covers_computed",
            _f(RecyclesOwnOldest),
            _tight(),
            "a running request that grows frees its own oldest block (a sliding window on full "
            "attention) and takes a fresh one in its place",
        ),
        ArMutant(
            "budget_overflow",
            "token_budget",
            _f(BudgetOverflow),
            ar_configs(chunked=(True,)),
            "a prefill chunk one token over the step's budget",
        ),
        ArMutant(
            "vidur_ft_missing_free",
            "terminal_holds_nothing",
            _f(VidurFtMissingFree),
            _vidur().map(lambda c: c.replace(num_blocks=c.num_blocks + 4 * c.max_model_len)),
            "Vidur's FasterTransformer never frees requests that finish before their batch",
        ),
        ArMutant(
            "vidur_one_free_block",
            "progress",
            _f(VidurOneFreeBlock),
            _vidur().map(
                lambda c: c.replace(
                    num_blocks=c.blocks_for(c.max_model_len - 1)
                    + (1 if c.reserve_null_block else 0)
                )
            ),
            "Vidur's vLLM demands a free block it does not need: empty batch at exact fit",
        ),
        ArMutant(
            "mnemosyne_restarts_head",
            "preemption_victim",
            _f(MnemosyneRestartsHead),
            _tight().map(lambda c: c.replace(enable_chunked_prefill=True)),
            "Vidur's Mnemosyne restarting the first request to start decoding, not the last",
        ),
        ArMutant(
            "mnemosyne_unbounded_lookahead",
            "fcfs_admission",
            _f(MnemosyneUnboundedLookahead),
            _tight().map(lambda c: c.replace(enable_chunked_prefill=True)),
            "Vidur's Mnemosyne admitting past more than 9 requests that do not fit",
        ),
        ArMutant(
            "vidur_lightllm_strict",
            "progress",
            _f(VidurLightLlmStrict),
            ar_configs(chunked=(False,), thresholds=False, block_sizes=st.just(1)).map(
                lambda c: c.replace(
                    num_blocks=c.max_model_len - 1 + (1 if c.reserve_null_block else 0)
                )
            ),
            "Vidur's LightLLM admits only when the peak is below the pool: exact fit stalls",
        ),
        ArMutant(
            "vidur_orca_floor",
            "kv_covers_scheduled",
            _f(VidurOrcaFloor),
            _vidur()
            .filter(lambda c: c.max_model_len % c.block_size != 0)
            .map(lambda c: c.replace(num_blocks=c.num_blocks + 4 * c.max_model_len)),
            "Vidur's Orca reserves max_model_len // block_size blocks: too few when not a multiple",
        ),
        ArMutant(
            "aging_ignores_bound",
            "aging_bound",
            _f(AgingIgnoresBound),
            _policy(Policy.AGING, max_num_seqs=1, max_wait_steps=1),
            "aging without the bound: a request waits past max_wait_steps",
        ),
        ArMutant(
            "fair_no_floor",
            "token_fairness_floor",
            _f(FairNoFloor),
            _policy(Policy.FAIR, max_num_seqs=2, max_num_batched_tokens=3, fair_token_cap=0),
            "fairness floor broken: a running request gets 0 tokens in a step",
        ),
        ArMutant(
            "fair_cap_exceeded",
            "token_fairness_cap",
            _f(FairCapExceeded),
            _policy(Policy.FAIR, fair_token_cap=1),
            "fairness cap exceeded: a running request's chunk beyond fair_token_cap",
        ),
        ArMutant(
            "priority_fcfs",
            "policy_admission",
            _f(PriorityFcfs),
            _policy(Policy.PRIORITY, max_num_seqs=1),
            "priority order broken: a lower priority admitted ahead of a higher one",
        ),
        ArMutant(
            "sjf_longest_first",
            "policy_admission",
            _f(SjfLongestFirst),
            _policy(Policy.SJF, max_num_seqs=1),
            "SJF order broken: a longer job admitted ahead of a shorter one",
        ),
        ArMutant(
            "refcount_leak",
            "refcount_matches",
            _f(RefcountLeak),
            _caching(),
            "prefix caching: freeing a shared block keeps the freeing request's reference",
        ),
        ArMutant(
            "evicts_referenced",
            "evict_unreferenced_only",
            _f(EvictsReferenced),
            _caching(),
            "prefix caching: a cache reset evicts blocks that running requests still hold",
        ),
        ArMutant(
            "hit_beyond_cache",
            "cache_hit_cached",
            _f(HitBeyondCache),
            _caching(),
            "prefix caching: a cache hit claims one block more than is cached",
        ),
        ArMutant(
            "keeps_unwritten_cached",
            "snapshot_matches",
            _f(KeepsUnwrittenCached),
            _unwritten(),
            "prefix caching, priority: a request preempted in the step that scheduled it "
            "keeps that step's unwritten blocks cached (vLLM 0.33.0)",
        ),
        ArMutant(
            "admits_one_per_step",
            "admission_progress",
            _f033(AdmitsOnePerStep),
            ar_configs(policies=(Policy.FCFS, Policy.PRIORITY), null_block=(True,), max_seqs=4),
            "a waiting pass that stops after one admission though the next request fits",
            VLLM_V1.profile,
        ),
        ArMutant(
            "whole_prompts_only",
            "admission_progress",
            _f033(WholePromptsOnly),
            # a budget of at least max_model_len: alone, a prompt fits it whole (else the
            # mutant stalls it for good, and `progress` fires first)
            ar_configs(
                policies=(Policy.FCFS, Policy.PRIORITY), chunked=(True,), null_block=(True,)
            ).map(
                lambda c: c.replace(
                    max_num_batched_tokens=max(c.max_num_batched_tokens, c.max_model_len)
                )
            ),
            "chunked prefill: a waiting prompt longer than the budget left waits for a later "
            "step, though a chunk of it fits",
            VLLM_V1.profile,
        ),
        ArMutant(
            "adapter_slots_ignored",
            "lora_slots",
            _f(AdapterSlotsIgnored),
            ar_configs(max_seqs=4, max_loras=(1,)).map(
                lambda c: c.replace(
                    max_num_seqs=max(c.max_num_seqs, 2),
                    max_num_batched_tokens=max(c.max_num_batched_tokens, 2),
                )
            ),
            "admits a request whose adapter finds no room beside the running requests'",
            ArProfile(space=ArConfigSpace(max_loras=None)),
        ),
        ArMutant(
            "adaptive_floor_over_running",
            "long_prefill_threshold",
            _f(AdaptiveFloorOverRunning),
            ar_configs(
                policies=(Policy.FCFS, Policy.PRIORITY), chunked=(True,), null_block=(True,)
            ).filter(lambda c: c.long_prefill_token_threshold > 0),
            "vLLM's adaptive long-prefill threshold sharing the budget among running requests only",
            VLLM_V1_ADAPTIVE.profile,
        ),
        ArMutant(
            "cadence_ignored",
            "prefill_cadence",
            _f(CadenceIgnored),
            _cadenced(),
            "vLLM's scheduler without the prefill cadence its profile declares",
            VLLM_V1_CADENCE.profile,
        ),
        ArMutant(
            "cadence_restarts_on_admissions",
            "prefill_cadence",
            _f(CadenceRestartsOnAdmissions),
            _cadenced(),
            "vLLM's prefill cadence restarted by admissions only, not by running prefill chunks",
            VLLM_V1_CADENCE.profile,
        ),
        ArMutant(
            "cadence_counts_adapter_skips",
            "prefill_cadence",
            _f(CadenceCountsAdapterSkips),
            _cadenced().map(lambda c: c.replace(max_loras=1)),
            "vLLM's prefill cadence whose capacity escape counts the requests skipped for their "
            "LoRA adapter as left waiting",
            VLLM_V1_CADENCE.profile,
        ),
        ArMutant(
            "watermark_ignored",
            "admission_watermark",
            _f(WatermarkIgnored),
            _watermarked(chunked=False),
            "vLLM's admission without the watermark its profile declares",
            VLLM_V1_WATERMARK.profile,
        ),
        ArMutant(
            "watermark_of_usable_blocks",
            "admission_watermark",
            _f(WatermarkOfUsableBlocks),
            _watermarked(chunked=False, blocks_mod_4=True),
            "vLLM's watermark taken of the usable blocks, the null block not counted",
            VLLM_V1_WATERMARK.profile,
        ),
        ArMutant(
            "watermark_before_the_step",
            "admission_watermark",
            _f(WatermarkBeforeTheStep),
            _watermarked(chunked=False),
            "vLLM's watermark kept only beside requests that ran before the step",
            VLLM_V1_WATERMARK.profile,
        ),
        ArMutant(
            "whole_sequence_below_watermark",
            "full_sequence_admission",
            _f(WholeSequenceBelowWatermark),
            _watermarked(chunked=True),
            "vLLM's whole-sequence gate without the watermark above the sequence",
            VLLM_V1_WATERMARK.profile,
        ),
        ArMutant(
            "cache_aware_ignored",
            "waiting_order",
            _f(CacheAwareIgnored),
            _cache_aware(),
            "vLLM's admission in arrival order, though its profile declares the cache-aware window",
            VLLM_V1_CACHE_AWARE.profile,
        ),
        ArMutant(
            "cache_aware_below_threshold",
            "fcfs_admission",
            _f(CacheAwareBelowThreshold),
            _cache_aware(),
            "vLLM's cache-aware window engaged below its usage threshold",
            VLLM_V1_CACHE_AWARE.profile,
        ),
        ArMutant(
            "cache_aware_moves_preempted",
            "waiting_order",
            _f(CacheAwareMovesPreempted),
            _cache_aware_tight(),
            "vLLM's cache-aware window reordering a preempted request with the fresh ones",
            VLLM_V1_CACHE_AWARE.profile,
        ),
        ArMutant(
            "cache_aware_whole_queue",
            "waiting_order",
            _f(CacheAwareWholeQueue),
            _cache_aware(),
            "vLLM's cache-aware reordering applied to the whole queue, not its window",
            VLLM_V1_CACHE_AWARE.profile,
        ),
        ArMutant(
            "cache_read_limit_ignored",
            "cache_hit_bounded",
            _f033(CacheReadLimitIgnored),
            _caching(),
            "prefix-cache hits that reach past a request's cache_read_limit",
            VLLM_V1_PREFIX.profile,
        ),
        ArMutant(
            "cache_aware_probe_unbounded",
            "fcfs_admission",
            _f(CacheAwareProbeUnbounded),
            _cache_aware(),
            "vLLM 0.34.0's cache-aware window ranking a request by cached tokens past its "
            "cache_read_limit",
            VLLM_V1_CACHE_AWARE.profile,
        ),
        ArMutant(
            "soft_evicts",
            "soft_preemption",
            _f(SoftEvicts),
            _policy(Policy.PRIORITY_SOFT, max_num_seqs=1),
            "soft preemption that evicts a running request for a higher-priority arrival",
        ),
    )
}
