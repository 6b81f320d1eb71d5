"""Cache-aware admission in the engine-core loop (vLLM 0.34.0's `cache_aware_admission_window`,
`LoopOptions.cache_aware_window`): rule `cache_aware_order`.

Under FCFS with prefix caching, at the start of a `schedule()` call's admission phase vLLM
reorders the first `window` waiting requests once the pool is used at least the threshold
(`Scheduler._reorder_waiting_by_cached_prefix`). The loop watches that moment (it wraps the
method on the built scheduler, after any seeded bug or fix) and decides the order itself, with
the AR spec's order function (`spec.ar.cache_aware`): the pool's usage from its free blocks,
the requests that take part (in vLLM's plain `WAITING` status with nothing computed: never
scheduled, or a streaming-input session's later turn whose kept KV was dropped; a preempted or
blocked request, or a session's turn on its kept KV, keeps its place), and each one ranked by
the hit its admission may take — the leading blocks of its prompt, less its last token and cut
at its cache read limit (`ArRequest.cache_read_limit`), whose keys the prefix cache holds (on
a hybrid cache, the hit vLLM's admission lookup reconciles over every group, so bounded).
`cache_aware_order` fails when

- vLLM's window leaves an order other than that one (what it moved, or failed to move);
- the never-scheduled requests of vLLM's waiting queue are not in the order the window last
  left them (arrival order until it moves them): the queue keeps its new order between calls;
- a call admits a request for the first time without the admission phase reordering first,
  unless the prefill cadence holds it (vLLM skips the window then, by design, and admits only a
  request whose cached prefix leaves it no prefill to run but its last token).

`key(rid)` is a request's place in that order, which the loop's `admission_order` then holds
admissions to instead of arrival within the plain waiting queue (across vLLM's two queues,
with the in-flight load cap, arrival holds and the heads are read from `left`). The counts say
how often the window engaged, moved the queue, and ranked a request below its whole cached
prefix for its read limit (`cut`): a run where the last is 0 cannot tell vLLM's probe from the
lookup it says it mirrors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation
from spec.ar.cache_aware import cache_aware_order, pool_usage

#: The counts the check scripts print, in words (`CacheAwareCounts`).
CACHE_AWARE_MEANING = {
    "window_engaged": "admission phases the cache-aware window engaged in",
    "window_moved": "of those, phases that moved the waiting queue",
    "window_cut": "of those, phases ranking a request below its cached prefix for its limit",
    "window_passes": "requests the other waiting queue passed behind a head the window moved",
}


@dataclass(slots=True)
class CacheAwareCounts:
    """How often the window's cases came up (`CACHE_AWARE_MEANING`)."""

    window_engaged: int = 0
    window_moved: int = 0
    window_cut: int = 0
    window_passes: int = 0


@dataclass(frozen=True, slots=True)
class Depth:
    """What one request may read from the prefix cache now: `cached`, the tokens of its leading
    cached blocks up to its prompt less one token; `allowed`, those its read limit lets it take
    (the rank)."""

    cached: int
    allowed: int

    def text(self, rid: str) -> str:
        """Request `rid`'s rank in words ("r8 0 (its read limit; 2 cached)")."""
        cut = f" (its read limit; {self.cached} cached)" if self.allowed < self.cached else ""
        return f"{rid} {self.allowed}{cut}"


class CacheAwareCheck:
    """Rule `cache_aware_order` over scheduler `sched` with window `window` and usage threshold
    `threshold`, blocks of `block_size` tokens; `read_limit(rid)` is request `rid`'s cache
    read limit (None: unbounded), `ever_scheduled` the loop's set of requests scheduled so far
    (read, not written), `note` the loop's trace."""

    def __init__(
        self,
        sched: Any,
        *,
        window: int,
        threshold: float,
        block_size: int,
        read_limit: Callable[[str], int | None],
        ever_scheduled: set[str],
        note: Callable[[str], None],
    ) -> None:
        self.sched: Any = sched
        #: Whether the cache has more than one group (a sliding window or Mamba beside full
        #: attention): ranks then come from vLLM's lookup (`_hybrid_hit`).
        self.hybrid: bool = len(sched.kv_cache_manager.kv_cache_config.kv_cache_groups) > 1
        #: Whether admission drops EAGLE's last cached block from a hit (EAGLE without
        #: lookahead hashes, as beside a KV connector): a rank is then a block shorter.
        self.drops_eagle_block: bool = bool(getattr(sched, "use_eagle_block_drop", False))
        self.window: int = window
        self.threshold: float = threshold
        self.block_size: int = block_size
        self.read_limit: Callable[[str], int | None] = read_limit
        self.ever_scheduled: set[str] = ever_scheduled
        self.note: Callable[[str], None] = note
        self.counts: CacheAwareCounts = CacheAwareCounts()
        #: Request id -> its place in the admission order (`key`), submission order at first.
        self._place: dict[str, float] = {}
        self._called = False
        #: The plain waiting queue as vLLM's reorder left it in this call (None before it
        #: runs): the order `admission_order` reads heads from (`BatchQueueLoop.queue_order`).
        self.left: list[str] | None = None
        self._broken: str | None = None
        self._schedule = 0
        self._last_moved: int | None = None
        original = sched._reorder_waiting_by_cached_prefix

        def reorder() -> None:
            self._watch(original)

        sched._reorder_waiting_by_cached_prefix = reorder

    # ------------------------------------------------------------------ the loop's hooks
    def submit(self, rid: str) -> None:
        """A request joins: it takes the last place (FCFS)."""
        self._place.setdefault(rid, float(len(self._place)))

    def key(self, rid: str) -> float:
        """`rid`'s place in the order the window leaves, smaller first."""
        return self._place[rid]

    def before_schedule(self, schedule: int) -> None:
        """A `schedule()` call, number `schedule`, is about to run."""
        self._called = False
        self.left = None
        self._broken = None
        self._schedule = schedule

    def after_schedule(self, admitted: Sequence[str], where: str, *, held: bool) -> None:
        """`cache_aware_order` over the call that returned (`admitted`: the requests it
        scheduled for the first time; `held`: whether the prefill cadence held it)."""
        if self._broken is not None:
            raise EngineCoreViolation("cache_aware_order", f"{where}: {self._broken}")
        if admitted and not self._called and not held:
            raise EngineCoreViolation(
                "cache_aware_order",
                f"{where} admitted {sorted(admitted)} for the first time without the "
                f"cache-aware window ordering the waiting queue first (window {self.window})",
            )

    # ------------------------------------------------------------------ the moment vLLM reorders
    def _watch(self, original: Callable[[], None]) -> None:
        """vLLM's reorder, between the order the loop expects and the one it checks."""
        self._called = True
        queue = [r.request_id for r in self.sched.waiting]
        fresh = {r.request_id for r in self.sched.waiting if self._takes_part(r)}
        # the order kept between calls is the never-scheduled requests' (a session's turn
        # rejoins the queue at its tail)
        in_queue = [rid for rid in queue if rid in fresh and rid not in self.ever_scheduled]
        expected_order = sorted(in_queue, key=self.key)
        if in_queue != expected_order and self._broken is None:
            self._broken = (
                f"the never-scheduled waiting requests stand {in_queue}, not in the order "
                f"{expected_order} {self._last_order()}"
            )
        head = queue[: self.window]
        usage = self._usage()
        depths: dict[str, Depth] = {}
        expected = head
        engaged = len(queue) >= 2 and usage >= self.threshold
        if engaged:
            depths = {rid: self._depth(rid) for rid in head if rid in fresh}
            engaged = len(depths) >= 2
        if engaged:
            expected = cache_aware_order(
                head, self.window, fresh.__contains__, lambda rid: depths[rid].allowed
            )
            self.counts.window_engaged += 1
            self.counts.window_cut += any(d.allowed < d.cached for d in depths.values())
        original()
        self.left = [r.request_id for r in self.sched.waiting]
        after = self.left[: len(head)]
        if after != head:
            self.note(f"schedule {self._schedule}: the cache-aware window orders {head} as {after}")
        if expected != head:
            self.counts.window_moved += 1
            self._last_moved = self._schedule
            # only the never-scheduled requests' places order anything (the check above,
            # `admission_order`); one scheduled before may stand anywhere (a failed load
            # put back at the head), so its place says nothing of where it stands
            moved = [rid for rid in expected if rid in depths and rid not in self.ever_scheduled]
            self._reorder_places(moved)
        if after != expected and self._broken is None:
            ranks = ", ".join(depths[rid].text(rid) for rid in head if rid in depths)
            why = (
                f"at usage {usage:.3g} >= {self.threshold:g}, by the tokens each may read "
                f"from the prefix cache ({ranks})"
                if engaged
                else f"the window does not engage ({self._why_not(len(queue), usage, depths)})"
            )
            self._broken = (
                f"the cache-aware window (the first {self.window} waiting requests) ordered "
                f"{head} as {after}; {why}, the order is {expected}"
            )

    @staticmethod
    def _takes_part(request: Any) -> bool:
        """Whether `request` takes part in the window: in vLLM's plain waiting status with
        nothing computed (a request waiting for its grammar, preempted, or holding KV keeps
        its place)."""
        return request.status == type(request.status).WAITING and not request.num_computed_tokens

    def _usage(self) -> float:
        """The pool's usage now: 1 - free / usable blocks (the null block is not usable)."""
        pool = self.sched.kv_cache_manager.block_pool
        return pool_usage(pool.get_num_free_blocks(), pool.num_gpu_blocks - 1)

    def _depth(self, rid: str) -> Depth:
        """What `rid` may read from the prefix cache now (`Depth`): the lookup its admission
        makes, bounded as that lookup is (its prompt less one token, its read limit). With one
        full-attention group, from the pool's cached keys, less the last block where admission
        drops EAGLE's (`drops_eagle_block`); with a hybrid cache, from vLLM's own lookup
        (`_hybrid_hit`)."""
        request = self.sched.requests[rid]
        limit = self.read_limit(rid)
        if self.hybrid:
            bound = max(0, request.num_tokens - 1)
            cached = self._hybrid_hit(request, bound)
            if limit is None or limit >= bound:
                return Depth(cached, cached)
            return Depth(cached, self._hybrid_hit(request, limit))
        pool = self.sched.kv_cache_manager.block_pool
        hashes = request.block_hashes[: max(0, request.num_tokens - 1) // self.block_size]
        run = 0
        for block_hash in hashes:
            if pool.get_cached_block(block_hash, [0]) is None:
                break
            run += 1
        readable = run if limit is None else min(run, limit // self.block_size)
        # the lookup drops EAGLE's block after bounding the run, so a cut run loses one too
        drop = int(self.drops_eagle_block)
        return Depth(
            max(0, run - drop) * self.block_size, max(0, readable - drop) * self.block_size
        )

    def _hybrid_hit(self, request: Any, bound: int) -> int:
        """The hit vLLM's admission lookup takes for `request` at most `bound` tokens long
        (`get_computed_blocks`: its coordinator's `find_longest_cache_hit`, every group's hit
        reconciled). On a hybrid cache the loop takes the hit from vLLM rather than its own
        model: the window is checked to rank by what admission takes, and what admission
        takes is checked against the blocks' content by `cache_hit_written`."""
        coordinator = self.sched.kv_cache_manager.coordinator
        if bound <= 0:
            return 0
        return int(coordinator.find_longest_cache_hit(request.block_hashes, bound)[1])

    def _reorder_places(self, order: list[str]) -> None:
        """The requests of `order` take their places among themselves in that order. They are
        the never-scheduled requests the window ranked: the first of those in the queue, which
        stand in place order, so the new places keep them ahead of the ones behind."""
        places = sorted(self._place[rid] for rid in order)
        self._place.update(zip(order, places, strict=True))

    def _last_order(self) -> str:
        """When the window last moved the queue, in words."""
        if self._last_moved is None:
            return "of their arrival (the window never moved the queue)"
        return f"the window left them in (schedule {self._last_moved})"

    def _why_not(self, waiting: int, usage: float, depths: dict[str, Depth]) -> str:
        """Why the window did not engage, in words."""
        if waiting < 2:
            return f"{waiting} waiting"
        if usage < self.threshold:
            return f"usage {usage:.3g} < {self.threshold:g}"
        return f"{len(depths)} of its requests take part"


__all__ = [
    "CACHE_AWARE_MEANING",
    "CacheAwareCheck",
    "CacheAwareCounts",
    "Depth",
]
