"""The AR seeded-bug catalogue: mutants of the reference AR schedulers.

Each mutant overrides one small method to plant one bug (most shipped in a real scheduler).
`tests/test_ar_mutants.py` asserts the AR conformance suite FAILS on every mutant with the
violation naming `rule`. `configs` narrows generated configurations to where the bug can show;
the suite itself is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from properties.ar.strategies import ar_configs
from reference.ar.base import ArReq, ArSchedulerBase
from reference.ar.vidur import VidurFasterTransformer, VidurVllm
from reference.ar.vllm_v1 import VllmV1Scheduler
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig, Policy
from spec.ar.events import ArBlocksFreed, ArFinished, ArFinishReason


class PreemptsHead(VllmV1Scheduler):
    """Preempts the head of the unscheduled running requests instead of the tail."""

    def _pick_victim(self, req: ArReq, index: int) -> ArReq:
        return next(r for r in self.running if r.rid not in self.scheduled)


class PreemptsScheduled(VllmV1Scheduler):
    """vLLM #23347: under priority the victim is the lowest priority among *all* running
    requests, including one already scheduled in this step (its tokens stay in the batch)."""

    def _pick_victim(self, req: ArReq, index: int) -> ArReq:
        return max(self.running, key=lambda r: (r.spec.priority, r.arrival))


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


def _f(cls: type[ArSchedulerBase]) -> ArImplementationFactory:
    def factory(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        return cls(config, sink)

    factory.__name__ = f"make_{cls.__name__}"
    return factory


@dataclass(frozen=True)
class ArMutant:
    name: str
    rule: str
    factory: ArImplementationFactory
    configs: st.SearchStrategy[ArConfig]
    description: str


def _tight(policies: tuple[Policy, ...] = (Policy.FCFS,)) -> st.SearchStrategy[ArConfig]:
    """Pools of one or two requests' worst case with several seats: preemption pressure."""
    return ar_configs(policies=policies, max_seqs=4).map(
        lambda c: c.replace(
            num_blocks=c.max_blocks_per_request + (1 if c.reserve_null_block else 0),
            max_num_seqs=max(c.max_num_seqs, 2),
            max_num_batched_tokens=max(c.max_num_batched_tokens, 2),
        )
    )


def _vidur(chunked: bool = False) -> st.SearchStrategy[ArConfig]:
    return ar_configs(chunked=(chunked,), thresholds=False)


AR_MUTANTS: dict[str, ArMutant] = {
    m.name: m
    for m in (
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
    )
}
