"""Vidur's Mnemosyne FCFS fixed-chunk replica scheduler, decision-faithful at constant batch
time, one KV-parallel group, one stage.

Read for facts in vidur 0.0.25 / 0.0.26 `vidur/scheduler/replica_scheduler/
mnemosyne_base_replica_scheduler.py` and `mnemosyne_fcfs_fixed_chunk_replica_scheduler.py`,
written anew here. Token counts map as in `reference.ar.vidur` (Vidur's processed tokens are
our known tokens; a restart folds them into the prefill). One step:

1. Decodes first, in Vidur's decode-queue order (`_preempted_requests`): a request whose prefill
   is complete decodes one token. It needs one free block, whether or not its token outgrows
   its blocks (`_can_append_slot`); while none is free, the last request of the decode queue
   is restarted, or the request itself when the queue is empty (`_ensure_can_append_slot`).
2. Prefills, within the chunk (`chunk_size` = max_num_batched_tokens, counting the decodes'
   tokens), from queues sorted by arrival: 0.0.26 takes the admitted requests whose prefill is
   unfinished first (`_partial_prefill_queue`), then the waiting ones (`_request_queue`); 0.0.25
   keeps both in one queue (`MnemosyneOneQueue`). A queue is read until
   `MAX_NUM_SKIPPED_REQUESTS` = 10 requests were skipped (so an admission passes at most 9).
   Skipped: a new request when every seat is taken, any request when the batch is full, a new
   request whose whole prefill does not fit the free blocks above the watermark
   (`int(0.01 * blocks)`, blocks for all its known tokens at once), or one for which the chunk
   has no token left.
3. At the end of the batch, each request of it that did not finish joins the decode queue, in
   batch order, once its prefill is complete; otherwise it waits for its next chunk.

As the fixed real class decides (`integrations.vidur.fixes`: `mnemosyne-skip-frees`,
`mnemosyne-batch-order`): a new request allocated its prefill and then skipped because the
chunk is full gives those blocks back at once (Vidur as released keeps them: rule
`waiting_holds_nothing`), and the end of a batch visits its requests in the order they were
added. The one-free-block demand of step 1 is Vidur's own and kept (the real class passes the
spec with it: the request restarted for want of a free block is re-admitted in the same batch,
so nothing stalls, though a context is recomputed).
"""

from __future__ import annotations

import dataclasses
from collections import deque

from reference.ar.base import ArReq
from reference.ar.vidur import VIDUR_SPACE, WATERMARK_FRACTION, VidurReplicaBase
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRules, VictimOrder
from spec.ar.events import ArFinishReason
from spec.ar.profile import ArPolicy, ArProfile
from spec.implementation import ArImplementation

# mnemosyne_base_replica_scheduler.py
MAX_NUM_SKIPPED_REQUESTS = 10


class VidurMnemosyne(VidurReplicaBase):
    """Vidur 0.0.26's Mnemosyne FCFS fixed-chunk scheduler (see the module docstring).

    `pending` is Vidur's decode queue (`_preempted_requests`), `partials` its partial-prefill
    queue (admitted requests between chunks), `waiting` its request queue, in arrival order.
    """

    name = "vidur-mnemosyne"
    chunked: bool | None = True
    partial_prefills_first = True  # 0.0.26's separate partial-prefill queue, read first
    watermark_fraction = WATERMARK_FRACTION
    sequence_parallel_capable = True

    def _setup(self) -> None:
        self.partials: list[ArReq] = []
        # Vidur's `num_prefill_tokens` of a restarted request, all it knew (the others': their
        # prompt); a batch end reads `is_prefill_complete` from it, which in a pipeline is
        # `num_stages` formations after the batch formed
        self.prefill_tokens: dict[str, int] = {}

    @property
    def rules(self) -> ArRules:
        """`MNEMOSYNE_RULES`: the last request to start decoding is the victim, a step that
        restarted one may still admit, FCFS admission past at most 9 requests that do not fit."""
        return MNEMOSYNE_RULES

    def between_batches(self) -> list[ArReq]:
        """The decode queue, then the admitted requests between prefill chunks."""
        return [*self.pending, *self.partials]

    def _prefill_of(self, req: ArReq) -> int:
        return self.prefill_tokens.get(req.rid, req.spec.prompt_len)

    def decoding(self, req: ArReq) -> bool:
        """Vidur's `is_prefill_complete`: its computed tokens reached its prefill tokens.
        (`ArReq.prefill_done` cannot tell a request one token short of finishing its recompute
        from one that decodes.)"""
        return req.num_computed >= self._prefill_of(req)

    def _requeue(self, req: ArReq) -> None:
        """Vidur's `on_batch_end`: to the decode queue once its prefill is complete, else to wait
        for its next chunk (with sequence parallelism it did when its chunk left stage 0)."""
        if self.decoding(req):
            self.pending.append(req)
        elif not self.sequence_parallel:
            self.partials.append(req)

    def _requeue_chunk(self, req: ArReq) -> None:
        self.partials.append(req)

    def unqueue(self, request_id: str) -> None:
        """As `VidurReplicaBase.unqueue`, and out of the partial-prefill queue too."""
        super().unqueue(request_id)
        self.partials = [r for r in self.partials if r.rid != request_id]

    def abort(self, request_id: str) -> None:
        """As `VidurReplicaBase.abort`; its prefill tokens are forgotten."""
        super().abort(request_id)
        self.prefill_tokens.pop(request_id, None)

    def _finish(self, req: ArReq, reason: ArFinishReason) -> None:
        super()._finish(req, reason)
        self.prefill_tokens.pop(req.rid, None)

    def _preempt(self, victim: ArReq, reset: bool = False) -> None:
        """Vidur's restart: its prefill becomes all it knows, and it goes back to its request
        queue, which is sorted by arrival before prefills are admitted."""
        self.prefill_tokens[victim.rid] = victim.known
        super()._preempt(victim, reset)
        self.waiting: deque[ArReq] = deque(sorted(self.waiting, key=_arrival))

    # ------------------------------------------------------------------ one batch
    def _schedule(self) -> None:
        self._add_decodes()
        partials = sorted(self.partials, key=_arrival)
        if self.partial_prefills_first:
            self._add_prefills(partials)
            self._add_prefills(list(self.waiting))
        else:
            self._add_prefills(sorted([*partials, *self.waiting], key=_arrival))

    def _batch_full(self) -> bool:
        return len(self.batch) >= self.micro_batch_cap

    def _add_decodes(self) -> None:
        while self.pending and not self._batch_full():
            req = self.pending.pop(0)
            if self._free_block_or_restart(req):
                self._grow_existing(req)
                self._add(req, 1)

    def _add_prefills(self, queue: list[ArReq]) -> None:
        """Vidur's `_add_prefill_requests` over `queue` (arrival order)."""
        skipped = 0
        while len(queue) > skipped and skipped < MAX_NUM_SKIPPED_REQUESTS:
            req = queue[skipped]
            if self._prefill_chunk(req):
                queue.pop(skipped)
            else:
                skipped += 1

    def _prefill_chunk(self, req: ArReq) -> bool:
        """Schedule `req`'s next prefill chunk (admitting it if new); False: skipped."""
        is_new = req not in self.running
        if is_new and len(self.running) >= self.config.max_num_seqs:
            return False
        if self._batch_full():
            return False
        if is_new:
            # allocated its whole prefill at once, above the watermark (less what it holds:
            # nothing, unless a skip kept its blocks, as Vidur as released does); a request
            # between chunks has its blocks, whatever is free (`_allocate_request`)
            need = self._blocks_needed(req, req.uncomputed)
            if self.pool.num_free - need < self.watermark:
                return False
            self._grow(req, need)
        n = max(0, min(self._prefill_of(req) - self._chunk_start(req), self._chunk_left()))
        if n == 0:
            if is_new:  # no token for it in this batch: it stays queued, holding nothing
                self._free_all(req)
            return False
        if is_new:
            self.waiting.remove(req)
            self.running.append(req)
        else:
            self.partials.remove(req)
        self._add(req, n)
        return True

    def _chunk_left(self) -> int:
        return self.config.max_num_batched_tokens - sum(self.scheduled.values())


class MnemosyneOneQueue(VidurMnemosyne):
    """Vidur 0.0.25's Mnemosyne: a request between prefill chunks goes back to the request
    queue and is read in arrival order with the waiting ones."""

    name = "vidur-mnemosyne-one-queue"
    partial_prefills_first = False


def _arrival(req: ArReq) -> int:
    return req.arrival


def make_vidur_mnemosyne(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `VidurMnemosyne` (vidur 0.0.26); `ConfigError` unless FCFS, one stage, chunked
    prefill on, no long-prefill threshold and no prefix caching."""
    return VidurMnemosyne(config, sink)


def make_vidur_mnemosyne_one_queue(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `MnemosyneOneQueue` (vidur 0.0.25); `ConfigError` unless FCFS, one stage, chunked
    prefill on, no long-prefill threshold and no prefix caching."""
    return MnemosyneOneQueue(config, sink)


MNEMOSYNE_RULES = ArRules(
    victim=VictimOrder.LAST_DECODING,
    admit_after_preemption=True,
    # a request is read only while fewer than 10 were skipped: at most 9 ahead of an admission
    fcfs_lookahead=MAX_NUM_SKIPPED_REQUESTS - 1,
)
_PROFILE = ArProfile(
    space=dataclasses.replace(VIDUR_SPACE, chunked_prefill=frozenset({True})),
    policy=ArPolicy(rules=MNEMOSYNE_RULES, watermark_fraction=WATERMARK_FRACTION),
)

VIDUR_MNEMOSYNE = ArImplementation(
    make_vidur_mnemosyne,
    _PROFILE,
    "Vidur 0.0.26's Mnemosyne FCFS fixed-chunk replica scheduler: decodes, then chunks of "
    "partial prefills, then new requests, admitting past up to 9 that cannot be scheduled",
)

VIDUR_MNEMOSYNE_ONE_QUEUE = ArImplementation(
    make_vidur_mnemosyne_one_queue,
    _PROFILE,
    "Vidur 0.0.25's Mnemosyne FCFS fixed-chunk replica scheduler: as vidur-mnemosyne, with "
    "partial prefills queued among the waiting requests in arrival order",
)
