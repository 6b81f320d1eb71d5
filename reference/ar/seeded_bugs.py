"""Seeded bugs that ship with schedspec: the reference vLLM v1 scheduler with one bug planted.

The autoregressive twin of `reference.seeded_bugs`: factories named by import strings, so that
`schedspec verify --impl reference.ar.seeded_bugs:double_free` shows from an install what a
caught bug looks like (exit 1, the rule in `AR_SEEDED_BUGS` named). They are the same classes
the checkout's AR catalogue (`tests/ar_mutants.py`) checks; these are the ones `verify` catches
under its default configurations. Never use them to serve anything.
"""

from __future__ import annotations

from reference.ar.base import ArReq
from reference.ar.vllm_v1 import VllmV1Scheduler
from reference.seeded_bugs import SeededBug
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig
from spec.ar.events import ArBlocksFreed, ArFinishReason


class PreemptsHead(VllmV1Scheduler):
    """Preempts the head of the unscheduled running requests instead of the tail."""

    def _pick_victim(self, req: ArReq, index: int) -> ArReq:
        return next(r for r in self.running if r.rid not in self.scheduled)


class SkipsToHead(VllmV1Scheduler):
    """vLLM PR #33522: a waiting request whose blocks do not fit is skipped, later requests are
    admitted, and the skipped ones are re-inserted at the head: FCFS is broken."""

    def _schedule_waiting(self, budget: int) -> None:
        skipped: list[ArReq] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            n = self._waiting_tokens(req, budget)
            if n is None:
                break
            need = self._blocks_needed(req, n)
            if need > self.pool.num_free:
                skipped.append(self.waiting.popleft())
                continue
            self._admit(req)
            self._grow(req, need)
            self._emit_scheduled(req, n)
            budget -= n
        self.waiting.extendleft(reversed(skipped))


class DoubleFree(VllmV1Scheduler):
    """vLLM #42571: a finishing request's last block is freed twice (it lands in the free
    queue twice)."""

    def _finish(self, req: ArReq, reason: ArFinishReason) -> None:
        last = req.blocks[-1] if req.blocks else None
        super()._finish(req, reason)
        if last is not None:
            self.pool.free_queue.append(last)
            self.sink(ArBlocksFreed(req.rid, (last,)))


class BudgetOverflow(VllmV1Scheduler):
    """A prefill chunk takes one token more than the budget left."""

    def _waiting_tokens(self, req: ArReq, budget: int) -> int | None:
        n = super()._waiting_tokens(req, budget)
        if n is not None and n == budget and req.uncomputed > budget:
            return budget + 1
        return n


def preempts_head(config: ArConfig, sink: ArEventSink) -> VllmV1Scheduler:
    """The reference vLLM v1 scheduler with `PreemptsHead` planted."""
    return PreemptsHead(config, sink)


def skips_to_head(config: ArConfig, sink: ArEventSink) -> VllmV1Scheduler:
    """The reference vLLM v1 scheduler with `SkipsToHead` planted."""
    return SkipsToHead(config, sink)


def double_free(config: ArConfig, sink: ArEventSink) -> VllmV1Scheduler:
    """The reference vLLM v1 scheduler with `DoubleFree` planted."""
    return DoubleFree(config, sink)


def budget_overflow(config: ArConfig, sink: ArEventSink) -> VllmV1Scheduler:
    """The reference vLLM v1 scheduler with `BudgetOverflow` planted."""
    return BudgetOverflow(config, sink)


AR_SEEDED_BUGS: tuple[SeededBug, ...] = (
    SeededBug(
        "reference.ar.seeded_bugs:preempts_head",
        "preemption_victim",
        "preempts the head of the running requests instead of the tail",
    ),
    SeededBug(
        "reference.ar.seeded_bugs:skips_to_head",
        "fcfs_admission",
        "vLLM PR #33522: a waiting request that does not fit is skipped for later ones",
    ),
    SeededBug(
        "reference.ar.seeded_bugs:double_free",
        "free_owned_only",
        "vLLM #42571: a finishing request's last block is freed twice",
    ),
    SeededBug(
        "reference.ar.seeded_bugs:budget_overflow",
        "token_budget",
        "a prefill chunk one token over the step's budget",
    ),
)
"""The shipped AR seeded bugs, each with the rule `verify` names when it catches it."""
