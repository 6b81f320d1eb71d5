"""The seeded-bug catalogue: mutants of the reference dLLM scheduler.

Each mutant overrides one small method of `ReferenceDllmScheduler` to plant one real bug (most
are bugs that shipped in a serving engine). `tests/test_mutants.py` asserts that the conformance
suite FAILS on every mutant and that the violation names `rule`. `configs` narrows the generated
configurations to where the bug can show (for example in-place reuse only exists under FDFO); the
suite itself is unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hypothesis import strategies as st

from properties.strategies import EOS, dllm_configs
from reference.dllm import (
    LONGEST_OUTPUT_FIRST_POLICY,
    PREFILL_FIRST_POLICY,
    PRIORITY_POLICY,
    ROWS_RELEASED_POLICY,
    ReferenceDllmScheduler,
    _Req,
)
from reference.kv_pool import PagedKvPool, RequestPool
from reference.oracle import AlgorithmOracle, DenoiseOracle
from reference.prefix_cache import CACHED_PROFILE, CachingKvPool, CachingReferenceScheduler
from reference.seeded_bugs import (
    AbortLeaksRetainedBlock,
    DoubleFree,
    NoFreeOnFinish,
    StaleContext,
)
from spec.adapter import EventSink, ImplementationFactory
from spec.config import DllmConfig, Mode, RequestSpec
from spec.events import FinishReason, KvAllocated
from spec.machine import finish_of
from spec.profile import DllmPolicy, DllmProfile
from spec.snapshot import FinishedOutput

#: An order of the engine's own (SGLang's lpm): any queued request may be admitted.
FREE_ORDER_POLICY = DllmPolicy(free_queue_order=True)


class AcceptsEndedIds(ReferenceDllmScheduler):
    """Refuses an id only while its request is queued or running: an ended request's id is
    taken again (a scheduler that looks ids up among the requests it holds)."""

    def submit(self, request: RequestSpec) -> None:
        self.seen = {r.rid for r in self.waiting} | {r.rid for r in self.running}
        super().submit(request)


class FreeUnfinishedBlockInBatch(ReferenceDllmScheduler):
    """Under in-place reuse, frees the unfinished block's slots but keeps using them."""

    def _carry(self, req: _Req) -> None:
        super()._carry(req)
        if req.block_slots is not None:
            self.kv.free(req.rid, list(req.block_slots))  # block_slots kept: thinks it reuses


class LostAlgorithmState(ReferenceDllmScheduler):
    """FDFO carries incomplete_ids but drops algo_state between rounds (JointThreshold)."""

    def _carry(self, req: _Req) -> None:
        super()._carry(req)
        req.algo_state = None  # re-initialised from the partial block next round


class SyncReturnsEarly(ReferenceDllmScheduler):
    """Sync hands control back after one forward, before every block is done."""

    def _run_worker(self, batch: list[_Req]) -> None:
        for req in batch:
            if req.incomplete_ids is not None:
                self._restore_carriers(req)
        self._forward_and_step(batch)


class FdfoKeepsDoneRequest(ReferenceDllmScheduler):
    """A done block is committed (and its request released) one round late."""

    def __init__(self, config: DllmConfig, sink: EventSink, oracle: DenoiseOracle | None = None):
        super().__init__(config, sink, oracle)
        self.deferred: set[tuple[str, int]] = set()

    def _complete(self, batch: list[_Req]) -> None:
        late = [
            r for r in batch if r.block_done and (r.rid, r.committed_blocks) not in self.deferred
        ]
        for r in late:
            self.deferred.add((r.rid, r.committed_blocks))
        super()._complete([r for r in batch if r not in late])


class ReallocatesInsteadOfReusing(ReferenceDllmScheduler):
    """Ignores in-place reuse: frees the unfinished block and allocates it afresh next round."""

    def _carry(self, req: _Req) -> None:
        req.incomplete_ids = tuple(req.block_tokens or ())
        self._drop_block_kv(req)


class RaggedRow(ReferenceDllmScheduler):
    """A partial last prompt block is fed as its prompt tokens only (not completed with masks)."""

    def _start_block(self, req: _Req) -> None:
        super()._start_block(req)
        prompt = req.spec.prompt
        start = req.committed_blocks * self.config.block_size
        if start < len(prompt) < start + self.config.block_size:
            req.block_tokens = list(prompt[start:])


class _FirstFitPool(PagedKvPool):
    def allocate_block(self, request_id: str, block_index: int) -> tuple[int, ...]:
        free = [i for i, o in enumerate(self.owner) if o is None][: self.config.block_size]
        self.take(request_id, block_index, tuple(free))
        p = self.config.page_size
        self.free_pages -= {s // p for s in free}
        self.sink(KvAllocated(request_id, block_index, tuple(free)))
        return tuple(free)


class MisalignedPage(ReferenceDllmScheduler):
    """The allocator hands out the first free slots, ignoring page boundaries."""

    def __init__(self, config: DllmConfig, sink: EventSink, oracle: DenoiseOracle | None = None):
        super().__init__(config, sink, oracle)
        self.kv = _FirstFitPool(config, sink)


class AdmitsBeyondMaxRunning(ReferenceDllmScheduler):
    """Off by one: admits while running <= max_running_requests."""

    def _admit(self) -> None:
        while self.waiting and len(self.running) <= self.config.max_running_requests:
            head = self.waiting[0]
            if not self.rows.has_free():
                return
            if self.reserved_pages + head.pages_needed > self.config.kv_pages:
                return
            self._admit_one(head)


class AdmitsOutOfOrder(ReferenceDllmScheduler):
    """Skips a head that does not fit and admits a later request that does."""

    def _admit(self) -> None:
        for req in list(self.waiting):
            if len(self.running) >= self.config.max_running_requests or not self.rows.has_free():
                return
            if self.reserved_pages + req.pages_needed <= self.config.kv_pages:
                self._admit_one(req)


# CommitsBeforeFinalForward needs the step's `done` to be computed from the new tokens; the
# oracle is wrapped so that its done flag is "no masks after the step".
class OutputPastMaxNewTokens(ReferenceDllmScheduler):
    """Returns whole blocks: the output is not cut at max_new_tokens (only at EOS)."""

    def _finish(self, req: _Req, reason: FinishReason) -> None:
        super()._finish(req, reason)
        gen = list(req.generated)
        eos = self.config.eos_token_id
        if eos is not None and eos in gen:
            gen = gen[: gen.index(eos) + 1]
        self.outputs[req.rid] = FinishedOutput(tuple(gen), reason)


class OutputPastEos(ReferenceDllmScheduler):
    """Returns the tokens after the first EOS too (cut at max_new_tokens only)."""

    def _finish(self, req: _Req, reason: FinishReason) -> None:
        super()._finish(req, reason)
        gen = tuple(req.generated[: req.spec.max_new_tokens])
        self.outputs[req.rid] = FinishedOutput(gen, reason)


class ReportsLengthForEos(ReferenceDllmScheduler):
    """Tells the client LENGTH whatever ended the output (the event says EOS)."""

    def _finish(self, req: _Req, reason: FinishReason) -> None:
        super()._finish(req, reason)
        self.outputs[req.rid] = FinishedOutput(self.outputs[req.rid].tokens, FinishReason.LENGTH)


class EndsAtIgnoredEos(ReferenceDllmScheduler):
    """Ends every request at its first EOS, also one submitted with `ignore_eos`."""

    def _finish_reason(self, req: _Req) -> FinishReason | None:
        eos = self.config.eos_token_id
        if eos is not None and eos in req.generated[: req.spec.max_new_tokens]:
            return FinishReason.EOS
        return super()._finish_reason(req)


class DropsIgnoreEos(ReferenceDllmScheduler):
    """An adapter that does not pass `ignore_eos` on to its engine: the request runs, and is
    logged, as one that ends at EOS."""

    def submit(self, request: RequestSpec) -> None:
        super().submit(dataclasses.replace(request, ignore_eos=False))


class IgnoresStopTokenIds(ReferenceDllmScheduler):
    """Logs a request's stop token ids but never ends it at one (its engine's stop check
    looks at the EOS only)."""

    def _finish_reason(self, req: _Req) -> FinishReason | None:
        end = finish_of(
            self.config, dataclasses.replace(req.spec, stop_token_ids=()), req.generated
        )
        return None if end is None else end[0]


class OutputPastStopToken(ReferenceDllmScheduler):
    """Ends a request at its stop token but returns the whole of its last block (cut at
    max_new_tokens only), as if the stop were sampled."""

    def _finish(self, req: _Req, reason: FinishReason) -> None:
        super()._finish(req, reason)
        if reason is FinishReason.STOP:
            gen = tuple(req.generated[: req.spec.max_new_tokens])
            self.outputs[req.rid] = FinishedOutput(gen, reason)


class DropsStopTokenIds(ReferenceDllmScheduler):
    """An adapter that does not pass `stop_token_ids` on to its engine: the request runs, and
    is logged, as one without them."""

    def submit(self, request: RequestSpec) -> None:
        super().submit(dataclasses.replace(request, stop_token_ids=()))


class AdmitsOnlyWhenIdle(ReferenceDllmScheduler):
    """Not work-conserving: admits new work only once the running batch has drained."""

    def _admit(self) -> None:
        if not self.running:
            super()._admit()


class _PeekingRowPool(RequestPool):
    """A free list of rows whose `acquire` reads the head without popping it."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.free_rows = list(range(rows))

    def acquire(self, request_id: str) -> int | None:
        if not self.free_rows:
            return None
        row = self.free_rows[0]  # the bug: peeked, not popped
        self.holder[row] = request_id
        return row

    def release(self, row: int) -> None:
        self.holder[row] = None
        if row not in self.free_rows:
            self.free_rows.append(row)

    def has_free(self) -> bool:
        return bool(self.free_rows)


class RowPoolPeeks(ReferenceDllmScheduler):
    """The request-pool allocator hands out the head of its free list without removing it, so
    the next admission gets a row that is still held."""

    def __init__(self, config: DllmConfig, sink: EventSink, oracle: DenoiseOracle | None = None):
        super().__init__(config, sink, oracle)
        self.rows = _PeekingRowPool(config.req_pool_rows)


class CarryNotRecordedUnderReuse(ReferenceDllmScheduler):
    """Under in-place reuse the unfinished block's tokens stay in the batch buffer and the
    carrier (`incomplete_ids`) is never recorded: outputs stay right, but nothing says the
    request carries a block (what an abort or retraction path would restore from)."""

    def _carry(self, req: _Req) -> None:
        if not self.config.in_place_reuse:
            super()._carry(req)


class _OneBasedPagePool(PagedKvPool):
    """Numbers pages 1..kv_pages (page 0 held back as a padding page, SGLang's convention for
    slot 0) in a pool sized for kv_pages: the last page runs past the KV tensor."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        super().__init__(config, sink)
        self.owner = self.owner + [None] * config.page_size  # its own table has the room
        self.free_pages = set(range(1, config.kv_pages + 1))
        self._page_heap = sorted(self.free_pages)

    def free_slots(self) -> frozenset[int]:
        live = self.owner[: self.config.kv_slots]
        return frozenset(i for i, o in enumerate(live) if o is None)


class OneBasedPages(ReferenceDllmScheduler):
    """Pages are numbered from 1: a full pool hands out slots beyond its last one."""

    def __init__(self, config: DllmConfig, sink: EventSink, oracle: DenoiseOracle | None = None):
        super().__init__(config, sink, oracle)
        self.kv = _OneBasedPagePool(config, sink)


class PrefetchesNextBlock(ReferenceDllmScheduler):
    """Allocates the next block's slots when a block starts (to overlap allocation with the
    forward), so a block owns KV before it is the request's next uncommitted block."""

    def __init__(self, config: DllmConfig, sink: EventSink, oracle: DenoiseOracle | None = None):
        super().__init__(config, sink, oracle)
        self.prefetched: dict[str, tuple[int, tuple[int, ...]]] = {}

    def _start_block(self, req: _Req) -> None:
        ahead = self.prefetched.pop(req.rid, None)
        if ahead is not None and ahead[0] == req.committed_blocks:
            slots = ahead[1]
            real = self.kv.allocate_block
            self.kv.allocate_block = lambda request_id, block_index: slots  # type: ignore[method-assign]
            try:
                super()._start_block(req)
            finally:
                self.kv.allocate_block = real  # type: ignore[method-assign]
        else:
            super()._start_block(req)
        following = req.committed_blocks + 1
        if following * self.config.block_size < len(req.spec.prompt) + req.spec.max_new_tokens:
            self.prefetched[req.rid] = (following, self.kv.allocate_block(req.rid, following))


class _EagerDoneOracle:
    def __init__(self, inner: DenoiseOracle, mask_id: int) -> None:
        self.inner = inner
        self.mask_id = mask_id

    def init_state(self, row_tokens: tuple[int, ...]) -> object:
        return self.inner.init_state(row_tokens)

    def step(self, rows):  # type: ignore[no-untyped-def]
        from reference.oracle import OracleStep

        return [
            OracleStep(s.tokens, s.state, s.done or self.mask_id not in s.tokens)
            for s in self.inner.step(rows)
        ]


class MixesPrefillAndDecode(ReferenceDllmScheduler):
    """PREFILL_FIRST admission, but every running request in one batch: prompt-only blocks and
    blocks with masks are forwarded together."""

    def _batch_candidates(self) -> list[_Req]:
        return [r for r in self.running if r.row is not None]


class DecodesFirst(MixesPrefillAndDecode):
    """PREFILL_FIRST with the batches the wrong way round: every block is allocated (as in
    `MixesPrefillAndDecode`), then the decode rows run first while the prompt blocks wait."""

    def _prepare_batch(self) -> list[_Req]:
        everyone = super()._prepare_batch()
        decode = [r for r in everyone if not self._prompt_only(r, r.committed_blocks)]
        return decode or everyone


class AdmitsLastPrefillFirst(ReferenceDllmScheduler):
    """PREFILL_FIRST admission that takes the latest prefill request in the queue first."""

    def _admit(self) -> None:
        self._admit_prefill_requests(list(reversed(self.waiting)))
        self._admit_fcfs()


class ReleasesRowUnderReuse(ReferenceDllmScheduler):
    """Rows released between rounds also under in-place reuse, where the carried block keeps
    its KV (and so must keep its row)."""

    def _carry(self, req: _Req) -> None:
        super()._carry(req)
        if self.config.in_place_reuse:
            self._release_row(req)


class PriorityValuesInverted(ReferenceDllmScheduler):
    """Under a priority-ordered queue, higher priority values go first: SGLang's default
    convention (`schedule_low_priority_values_first` off) where the profile declares the lower
    value first (vLLM's, and SGLang's with the flag), a mix-up of porting one to the other."""

    def _enqueue(self, req: _Req) -> None:
        priority = req.spec.priority
        at = next(
            (i for i, w in enumerate(self.waiting) if w.spec.priority < priority),
            len(self.waiting),
        )
        self.waiting.insert(at, req)


class ShortestOutputFirst(ReferenceDllmScheduler):
    """Under longest-output-first the shortest output goes first: the sort key's sign dropped
    (`max_new_tokens` where SGLang sorts by `-max_new_tokens`)."""

    def _queue_key(self, req: _Req) -> tuple[int, int]:
        priority, negated_length = self.policy.queue_key(req.spec.priority, req.spec.max_new_tokens)
        return priority, -negated_length


# --- the prefix cache (reference.prefix_cache) ---------------------------------------------


class CachesBeforeCommit(CachingReferenceScheduler):
    """Caches a done block while it is committed, before the commit is reported (an engine
    that inserts into its tree from the step's results)."""

    def _commit(self, req: _Req) -> None:
        k = req.committed_blocks
        self.kv.cache(req.rid, k, self._key([*req.committed, *(req.block_tokens or ())], k))
        ReferenceDllmScheduler._commit(self, req)


class KeysBlocksAlone(CachingReferenceScheduler):
    """Keys a cached block by its own tokens and position, not by the whole prefix before it
    (the reason vLLM chains each block's hash to its parent's)."""

    def _key(self, tokens: list[int] | tuple[int, ...], block_index: int) -> tuple[int, ...]:
        b = self.config.block_size
        return (block_index, *tokens[block_index * b : (block_index + 1) * b])


class _EvictsReadBlocks(CachingKvPool):
    def _victim(self) -> tuple[int, ...]:
        return min((b.last_used, key) for key, b in self.cached.items())[1]  # read or not


class EvictsReadBlocks(CachingReferenceScheduler):
    """Evicts the least recently used cached block whether or not a request reads it (a tree
    that forgets a hit's lock)."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        super().__init__(config, sink)
        self.kv = _EvictsReadBlocks(config, sink)


class NeverReleasesReads(CachingReferenceScheduler):
    """Finishes and aborts without releasing the request's cached blocks (a lock never
    dropped)."""

    def _release(self, req: _Req) -> None:
        ReferenceDllmScheduler._release(self, req)


class _ReusesCachedPages(CachingKvPool):
    def _evict(self, key: tuple[int, ...]) -> None:
        # handed out while the cache still holds it
        self.page_freed(self.cached[key].slots[0] // self.config.page_size)


class AllocatesCachedPages(CachingReferenceScheduler):
    """Hands out the page of an unread cached block without evicting it (SGLang's refused
    request, whose stale match the tree still held, got its evicted pages back)."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        super().__init__(config, sink)
        self.kv = _ReusesCachedPages(config, sink)


def _cached(cls: type[CachingReferenceScheduler]) -> ImplementationFactory:
    def factory(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        if not config.prefix_cache:  # the parity check's solo runs: the plain reference
            return ReferenceDllmScheduler(config, sink)
        return cls(config, sink)

    factory.__name__ = f"make_{cls.__name__}"
    return factory


def _cache_mutant(
    name: str, rule: str, cls: type[CachingReferenceScheduler], description: str
) -> Mutant:
    """A mutant of the caching reference, checked under its profile (prompts sharing stems)."""
    return Mutant(
        name,
        rule,
        _cached(cls),
        dllm_configs(space=CACHED_PROFILE.space),
        description,
        CACHED_PROFILE,
    )


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the rule the suite must name
    factory: ImplementationFactory
    configs: st.SearchStrategy[DllmConfig]
    description: str
    # the profile the suite checks it under (its policy: what the correct scheduler follows)
    profile: DllmProfile = field(default_factory=DllmProfile)


def _f(
    cls: type[ReferenceDllmScheduler], joint: bool = False, policy: DllmPolicy | None = None
) -> ImplementationFactory:
    def factory(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        oracle = (
            AlgorithmOracle.named("JointThreshold", config.mask_token_id, max_post_edit_steps=4)
            if joint
            else None
        )
        if policy is None:  # some mutants' constructors take no policy
            return cls(config, sink, oracle)
        return cls(config, sink, oracle, policy=policy)

    factory.__name__ = f"make_{cls.__name__}"
    return factory


def _under_policy(
    name: str,
    rule: str,
    cls: type[ReferenceDllmScheduler],
    policy: DllmPolicy,
    configs: st.SearchStrategy[DllmConfig],
    description: str,
) -> Mutant:
    """A mutant of the reference under `policy`, checked under that policy's profile (what the
    correct scheduler under the same policy follows)."""
    return Mutant(
        name, rule, _f(cls, policy=policy), configs, description, DllmProfile(policy=policy)
    )


def _eager(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    oracle = _EagerDoneOracle(
        AlgorithmOracle.named("LowConfidence", config.mask_token_id), config.mask_token_id
    )
    return ReferenceDllmScheduler(config, sink, oracle)


def _fdfo_reuse() -> st.SearchStrategy[DllmConfig]:
    return (
        dllm_configs(modes=(Mode.FDFO,))
        .map(lambda c: c.replace(in_place_reuse=True, block_size=c.block_size))
        .filter(lambda c: c.block_size > 1)
    )


def _tight_pool() -> st.SearchStrategy[DllmConfig]:
    """Pools that fit one worst-case request exactly, with several seats: admission must wait."""
    return dllm_configs().map(
        lambda c: c.replace(
            kv_pages=-(-c.max_context // c.page_size),
            max_running_requests=4,
            req_pool_rows=4,
        )
    )


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "accepts_ended_ids",
            "unique_submission",
            _f(AcceptsEndedIds),
            dllm_configs(),
            "an ended request's id is accepted again",
        ),
        Mutant(
            "no_free_on_finish",
            "terminal_owns_nothing",
            _f(NoFreeOnFinish),
            dllm_configs(),
            "finish releases the row but not the KV slots",
        ),
        Mutant(
            "abort_leaks_retained_block",
            "terminal_owns_nothing",
            _f(AbortLeaksRetainedBlock),
            _fdfo_reuse(),
            "SGLang #32992: abort mid-block leaks the retained block's KV",
        ),
        Mutant(
            "double_free",
            "free_owned_only",
            _f(DoubleFree),
            dllm_configs(),
            "a block's slots are freed twice on finish",
        ),
        Mutant(
            "free_unfinished_block_in_batch",
            "reuse_keeps_slots",
            _f(FreeUnfinishedBlockInBatch),
            _fdfo_reuse(),
            "an unfinished FDFO block's slots are freed while it stays in the batch",
        ),
        Mutant(
            "lost_algorithm_state",
            "golden_output",
            _f(LostAlgorithmState, joint=True),
            dllm_configs(modes=(Mode.FDFO,)),
            "algo_state dropped between FDFO rounds (JointThreshold)",
        ),
        Mutant(
            "stale_context",
            "golden_output",
            _f(StaleContext),
            dllm_configs(),
            "the oracle sees the context without the last committed block (sync and FDFO alike)",
        ),
        Mutant(
            "sync_returns_early",
            "sync_yields_when_all_done",
            _f(SyncReturnsEarly),
            dllm_configs(modes=(Mode.SYNC,)),
            "sync returns control before every block of the batch is done",
        ),
        Mutant(
            "fdfo_keeps_done_request",
            "fdfo_releases_same_round",
            _f(FdfoKeepsDoneRequest),
            dllm_configs(modes=(Mode.FDFO,)),
            "a done block is committed one round late",
        ),
        Mutant(
            "reallocates_instead_of_reusing",
            "reuse_keeps_slots",
            _f(ReallocatesInsteadOfReusing),
            _fdfo_reuse(),
            "in-place reuse ignored: free and re-allocate the unfinished block",
        ),
        Mutant(
            "ragged_row",
            "whole_block_rows",
            _f(RaggedRow),
            dllm_configs().filter(lambda c: c.block_size > 1),
            "a partial prompt block is fed without its masks (not a whole block)",
        ),
        Mutant(
            "misaligned_page",
            "page_alignment",
            _f(MisalignedPage),
            dllm_configs().filter(lambda c: c.page_size > c.block_size),
            "the allocator ignores page boundaries",
        ),
        Mutant(
            "admits_beyond_max_running",
            "max_running",
            _f(AdmitsBeyondMaxRunning),
            dllm_configs(),
            "admission off by one on max_running_requests",
        ),
        Mutant(
            "admits_out_of_order",
            "fcfs_admission",
            _f(AdmitsOutOfOrder),
            _tight_pool(),
            "a head that does not fit is skipped for a later request",
        ),
        Mutant(
            "output_past_max_new_tokens",
            "reported_output",
            _f(OutputPastMaxNewTokens),
            dllm_configs().filter(lambda c: c.block_size > 1),
            "the returned output is whole blocks, past max_new_tokens",
        ),
        Mutant(
            "output_past_eos",
            "reported_output",
            _f(OutputPastEos),
            dllm_configs().map(lambda c: c.replace(eos_token_id=EOS)),
            "the returned output runs past the first EOS",
        ),
        Mutant(
            "reports_length_for_eos",
            "reported_output",
            _f(ReportsLengthForEos),
            dllm_configs().map(lambda c: c.replace(eos_token_id=EOS)),
            "the client is told LENGTH where EOS ended the output",
        ),
        Mutant(
            "ends_at_ignored_eos",
            "finish_condition",
            _f(EndsAtIgnoredEos),
            dllm_configs().map(lambda c: c.replace(eos_token_id=EOS)),
            "a request submitted with ignore_eos is ended at its first EOS",
            DllmProfile(ignore_eos=True),
        ),
        Mutant(
            "drops_ignore_eos",
            "valid_request",
            _f(DropsIgnoreEos),
            dllm_configs(),
            "the adapter does not pass ignore_eos on: its engine logs and ends it at EOS",
            DllmProfile(ignore_eos=True),
        ),
        Mutant(
            "ignores_stop_token_ids",
            "fdfo_releases_same_round",
            _f(IgnoresStopTokenIds),
            dllm_configs().map(lambda c: c.replace(eos_token_id=None)),
            "a request runs on past the first of its stop token ids",
            DllmProfile(stop_token_ids=True),
        ),
        Mutant(
            "output_past_stop_token",
            "reported_output",
            _f(OutputPastStopToken),
            dllm_configs().filter(lambda c: c.block_size > 1),
            "the returned output runs past the stop token that ended the request",
            DllmProfile(stop_token_ids=True),
        ),
        Mutant(
            "drops_stop_token_ids",
            "valid_request",
            _f(DropsStopTokenIds),
            dllm_configs(),
            "the adapter does not pass stop_token_ids on: its engine logs and runs it without",
            DllmProfile(stop_token_ids=True),
        ),
        Mutant(
            "admits_only_when_idle",
            "work_conserving",
            _f(AdmitsOnlyWhenIdle),
            dllm_configs().map(
                lambda c: c.replace(
                    max_running_requests=4, req_pool_rows=4, kv_pages=4 * c.kv_pages
                )
            ),
            "no admission while anything runs, though a seat, a row and pages are free",
        ),
        Mutant(
            "row_pool_peeks",
            "row_exclusive",
            _f(RowPoolPeeks),
            dllm_configs(),
            "the row allocator peeks at its free list instead of popping: a held row is reused",
        ),
        Mutant(
            "carry_not_recorded_under_reuse",
            "carriers_iff_unfinished",
            _f(CarryNotRecordedUnderReuse),
            _fdfo_reuse(),
            "under in-place reuse an unfinished block leaves no carrier (incomplete_ids)",
        ),
        Mutant(
            "one_based_pages",
            "kv_exclusive",
            _f(OneBasedPages),
            dllm_configs(),
            "pages numbered from 1: the last page's slots lie outside the pool",
        ),
        Mutant(
            "prefetches_next_block",
            "whole_block_alloc",
            _f(PrefetchesNextBlock),
            dllm_configs(),
            "the next block's slots are allocated before the current block is committed",
        ),
        Mutant(
            "commits_before_final_forward",
            "final_forward_before_commit",
            _eager,
            dllm_configs(),
            "a block is reported done when its last mask is filled, before the final-KV forward",
        ),
        _under_policy(
            "mixes_prefill_and_decode",
            "prefill_first",
            MixesPrefillAndDecode,
            PREFILL_FIRST_POLICY,
            dllm_configs(),
            "under PREFILL_FIRST a batch feeds prompt-only blocks and blocks with masks together",
        ),
        _under_policy(
            "decodes_first",
            "prefill_first",
            DecodesFirst,
            PREFILL_FIRST_POLICY,
            dllm_configs(),
            "under PREFILL_FIRST the decode batch runs while allocated prompt blocks wait",
        ),
        _under_policy(
            "admits_last_prefill_first",
            "fcfs_admission",
            AdmitsLastPrefillFirst,
            PREFILL_FIRST_POLICY,
            dllm_configs(),
            "under PREFILL_FIRST the latest prefill request is admitted ahead of earlier ones",
        ),
        _under_policy(
            "releases_row_under_reuse",
            "row_exclusive",
            ReleasesRowUnderReuse,
            ROWS_RELEASED_POLICY,
            _fdfo_reuse(),
            "rows released between rounds under in-place reuse too: a running request ends the "
            "round without a row while its block keeps its KV",
        ),
        _under_policy(
            "priority_values_inverted",
            "fcfs_admission",
            PriorityValuesInverted,
            PRIORITY_POLICY,
            _tight_pool(),
            "under a priority-ordered queue the higher priority value is admitted first",
        ),
        _under_policy(
            "idles_under_free_order",
            "work_conserving",
            AdmitsOnlyWhenIdle,
            FREE_ORDER_POLICY,
            dllm_configs().map(
                lambda c: c.replace(
                    max_running_requests=4, req_pool_rows=4, kv_pages=4 * c.kv_pages
                )
            ),
            "under a free queue order no admission while anything runs, though a seat, a row "
            "and every queued request's pages are free",
        ),
        _under_policy(
            "shortest_output_first",
            "fcfs_admission",
            ShortestOutputFirst,
            LONGEST_OUTPUT_FIRST_POLICY,
            _tight_pool(),
            "under a longest-output-first queue the shortest output is admitted first",
        ),
        _cache_mutant(
            "caches_before_commit",
            "cache_committed_only",
            CachesBeforeCommit,
            "a done block enters the prefix cache before its commit is reported",
        ),
        _cache_mutant(
            "keys_blocks_alone",
            "cache_hit_content",
            KeysBlocksAlone,
            "cached blocks are keyed by their own tokens, not the whole prefix: a request reads "
            "KV computed after another prefix",
        ),
        _cache_mutant(
            "evicts_read_blocks",
            "evict_unread_only",
            EvictsReadBlocks,
            "eviction takes the least recently used cached block, read or not",
        ),
        _cache_mutant(
            "never_releases_reads",
            "terminal_owns_nothing",
            NeverReleasesReads,
            "a request ends still reading its cached blocks",
        ),
        _cache_mutant(
            "allocates_cached_pages",
            "kv_exclusive",
            AllocatesCachedPages,
            "an allocation takes the page of a cached block the cache still holds",
        ),
    )
}
