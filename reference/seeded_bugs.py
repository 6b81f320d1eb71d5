"""Seeded bugs that ship with schedspec: the reference dLLM scheduler with one bug planted.

Each is a factory named by an import string, so that a user can see, from an install, what a
failing check looks like: `schedspec verify --impl reference.seeded_bugs:no_free_on_finish`
exits 1 and names the rule in `SEEDED_BUGS`. They are the same classes the project's own
seeded-bug catalogue checks (the checkout's `tests/mutants.py`, 39 of them, with the
configurations each needs); these four are the ones `verify` catches under its default
configurations. Never use them to serve anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.dllm import ReferenceDllmScheduler, _Req
from reference.oracle import OracleRow
from spec.adapter import EventSink
from spec.config import DllmConfig
from spec.events import FinishReason, RowReleased


@dataclass(frozen=True)
class SeededBug:
    """One shipped seeded bug: `target` is the import string to pass to `verify --impl`, and
    `rule` the rule a run that catches it names."""

    target: str
    rule: str
    description: str


class NoFreeOnFinish(ReferenceDllmScheduler):
    """Finishing releases the row but forgets the KV slots."""

    def _finish(self, req: _Req, reason: FinishReason) -> None:
        real_free = self.kv.free
        self.kv.free = lambda request_id, slots: None  # type: ignore[method-assign]
        try:
            super()._finish(req, reason)
        finally:
            self.kv.free = real_free  # type: ignore[method-assign]


class AbortLeaksRetainedBlock(ReferenceDllmScheduler):
    """SGLang #32992: release frees only committed blocks, leaking an unresolved FDFO block."""

    # `ReferenceDllmScheduler`'s count, declared again because this class's `_release` updates it
    reserved_pages: int

    def _release(self, req: _Req) -> None:
        committed = [
            s
            for s in self.kv.slots_of(req.rid)
            if self.kv.owner[s][1] < req.committed_blocks  # type: ignore[index]
        ]
        self.kv.free(req.rid, committed)
        req.block_slots = None
        if req.row is not None:
            self.rows.release(req.row)
            self.sink(RowReleased(req.rid, req.row))
            req.row = None
        self.reserved_pages -= req.pages_needed


class DoubleFree(ReferenceDllmScheduler):
    """Finishing frees the last block, then frees a stale list of all the request's slots."""

    def _finish(self, req: _Req, reason: FinishReason) -> None:
        stale = self.kv.slots_of(req.rid)
        last = self.kv.slots_of_block(req.rid, req.committed_blocks - 1)
        self.kv.free(req.rid, last)
        self.kv.free(req.rid, stale)  # frees `last` a second time
        super()._finish(req, reason)


class StaleContext(ReferenceDllmScheduler):
    """The oracle row gets a stale context: the committed tokens without the last committed
    block (a context cache refreshed one block late). Sync and FDFO are corrupted alike, so
    FDFO-vs-sync parity cannot see it; only the golden decoding can."""

    def _oracle_row(self, req: _Req) -> OracleRow:
        row = super()._oracle_row(req)
        stale = row.context[: max(0, len(row.context) - self.config.block_size)]
        return OracleRow(row.request_id, stale, row.block_index, row.tokens, row.state)


def no_free_on_finish(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference with `NoFreeOnFinish` planted."""
    return NoFreeOnFinish(config, sink)


def abort_leaks_retained_block(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference with `AbortLeaksRetainedBlock` planted."""
    return AbortLeaksRetainedBlock(config, sink)


def double_free(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference with `DoubleFree` planted."""
    return DoubleFree(config, sink)


def stale_context(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    """The reference with `StaleContext` planted."""
    return StaleContext(config, sink)


SEEDED_BUGS: tuple[SeededBug, ...] = (
    SeededBug(
        "reference.seeded_bugs:no_free_on_finish",
        "terminal_owns_nothing",
        "finishing releases the row but not the KV slots",
    ),
    SeededBug(
        "reference.seeded_bugs:abort_leaks_retained_block",
        "terminal_owns_nothing",
        "SGLang #32992: an abort mid-block leaks the retained FDFO block's KV",
    ),
    SeededBug(
        "reference.seeded_bugs:double_free",
        "free_owned_only",
        "a finishing request's last block is freed twice",
    ),
    SeededBug(
        "reference.seeded_bugs:stale_context",
        "golden_output",
        "the denoiser sees the context without its last committed block",
    ),
)
"""The shipped dLLM seeded bugs, each with the rule `verify` names when it catches it."""
