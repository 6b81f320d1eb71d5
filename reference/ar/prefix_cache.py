"""The reference vLLM-v1-style scheduler with prefix caching (`vllm-v1-prefix`).

As `reference.ar.vllm_v1` (its subclass), plus vLLM's automatic prefix caching (decisions read
for facts in vLLM's `KVCacheManager.get_computed_blocks` / `allocate_slots`, written anew):
before admitting a waiting request it looks up the longest run of cached full blocks holding
its prefix, capped so that at least its last known token is computed (the model must produce
logits to sample from). The request is admitted only if the blocks for this step's chunk beyond
the hit fit the free blocks, counting hit blocks that are free themselves (a hit takes them off
the free queue). Then it reports `ArCacheHit`, allocates the rest and schedules the chunk. Full
blocks become cached as soon as the step that fills them is scheduled; freed blocks stay cached
until allocated afresh (`reference.ar.base.CachingBlockPool`).
"""

from __future__ import annotations

from reference.ar.base import ArReq, CachingBlockPool
from reference.ar.vllm_v1 import VLLM_033, VllmV1Scheduler
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.cache_aware import pool_usage
from spec.ar.config import ArConfig, Policy
from spec.ar.events import ArCacheHit
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile, CacheReadLimits
from spec.implementation import ArImplementation


class PrefixCachingVllmV1(VllmV1Scheduler):
    """`VllmV1Scheduler` plus prefix-cache hits at admission (module docstring); without
    `enable_prefix_caching` in the config it finds no hit and decides as `VllmV1Scheduler`."""

    name = "vllm-v1-prefix"

    def _hit(self, req: ArReq) -> list[int]:
        """Cached blocks holding the request's prefix: whole blocks, at most known - 1 tokens
        and at most its `cache_read_limit` (vLLM 0.34's `Request.get_max_cache_hit_length`)."""
        pool = self.pool
        if not isinstance(pool, CachingBlockPool):
            return []
        bs = self.config.block_size
        readable = req.known - 1
        if req.spec.cache_read_limit is not None:
            readable = min(readable, req.spec.cache_read_limit)
        most = min(readable // bs, req.hashable(bs, self.hash_ahead))
        return pool.lookup([req.key(k, bs, self.hash_ahead) for k in range(most)])

    def _take_hit(self, req: ArReq, hit: list[int]) -> None:
        pool = self.pool
        assert isinstance(pool, CachingBlockPool)
        pool.touch(req.rid, hit)
        req.blocks = list(hit)
        req.num_computed = len(hit) * self.config.block_size
        self.sink(ArCacheHit(req.rid, tuple(hit)))

    def _cached_tokens(self, req: ArReq) -> int:
        """Tokens of the request's prefix the cache holds now and would give it (a probe:
        nothing taken), within its `cache_read_limit`."""
        return len(self._hit(req)) * self.config.block_size

    def _usage(self) -> float:
        """vLLM's `BlockPool.get_usage`: 1 - free / usable blocks."""
        return pool_usage(self.pool.num_free, self.config.usable_blocks)

    def _reorder_by_cached_prefix(self) -> None:
        """vLLM 0.34.0's cache-aware admission (`VllmOptions.cache_aware_window`): within the
        first `window` waiting requests, the places of those never scheduled are refilled by
        them, deepest cached prefix first, then queue order; a preempted request keeps its
        place. Only under FCFS with prefix caching, at usage >= the threshold, in a step that
        is not held."""
        window = self.options.cache_aware_window
        if (
            not window
            or self.config.policy is not Policy.FCFS
            or not self.config.enable_prefix_caching
            or self._held
            or len(self.waiting) < 2
            or self._usage() < self.options.cache_aware_threshold
        ):
            return
        head = list(self.waiting)[:window]
        # a request not yet promoted keeps its place, as in vLLM (a blocked status)
        places = [i for i, req in enumerate(head) if req.num_restarts == 0 and not req.unpromoted]
        if len(places) < 2:
            return
        depth = {i: self._cached_tokens(head[i]) for i in places}
        ranked = sorted(places, key=lambda i: (-depth[i], i))
        for place, source in zip(places, ranked, strict=True):
            self.waiting[place] = head[source]

    def _schedule_waiting(self, budget: int) -> None:
        bs = self.config.block_size
        self._reorder_by_cached_prefix()
        while (req := self._next_waiting(budget)) is not None:
            hit = self._hit(req)
            req.num_computed = len(hit) * bs  # tentatively, to size the chunk after the hit
            n = self._waiting_tokens(req, budget)
            padded = self._padded(req, req.num_computed, n, budget) if n is not None else None
            n, drafts = padded if padded is not None else (0, 0)
            need = self._blocks_upto(req.num_computed + n) - len(hit) if n else 0
            req.num_computed = 0
            if padded is None or self._held_back(req, len(hit) * bs):
                break
            mark = self._watermark_now()
            free = self.pool.num_free
            if isinstance(self.pool, CachingBlockPool):
                free -= self.pool.newly_referenced(hit)
            if need + mark > free:
                break  # admission stops at the first request whose blocks do not fit
            if self.options.full_sequence_admission and (
                self.config.blocks_for(req.known) - len(hit) + self._sequence_margin(mark) > free
            ):
                break  # vLLM's scheduler_reserve_full_isl, the hit counted as held
            if hit:
                self._take_hit(req, hit)
            self._admit(req)
            self._grow(req, need)
            self._emit_scheduled(req, n, drafts)
            budget -= n + self._rows


def make_vllm_v1_prefix(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: the reference vLLM-v1 scheduler with prefix caching (when the config enables
    it; otherwise it is `vllm-v1`) and vLLM 0.33.0's options (`VLLM_033`), as `vllm-v1`."""
    return PrefixCachingVllmV1(config, sink, VLLM_033)


VLLM_V1_PREFIX = ArImplementation(
    make_vllm_v1_prefix,
    ArProfile(
        space=ArConfigSpace(
            prefix_caching=frozenset({True}),
            cache_read_limits=CacheReadLimits.BOUNDED,
            max_loras=None,
        ),
        policy=ArPolicy(
            lone_request_threshold_exempt=True,
            full_sequence_admission=True,
            admission_progress=True,
        ),
    ),
    "the reference vLLM-v1-style scheduler with prefix caching (shared, reference-counted "
    "blocks; cache hits at admission; vLLM's eviction order) and vLLM 0.33.0's options; "
    "decision-identical to vLLM 0.33.0 with prefix caching on (verify --twin), but with the "
    "candidate fix of a vLLM finding (a request preempted in the step that scheduled it leaves "
    "nothing of that step cached)",
)
