"""The bookkeeping every fast replica shares (`fast_vllm.FastVidurVllm`, `fast_vidur`'s
classes): the `ReplicaScheduler` protocol's counters and queries, and request validation.

Subclasses hold their own request records in `waiting` and `running` and decide batches.
"""

from __future__ import annotations

from collections.abc import Sized

from reference.sim.errors import NeverAdmitted, RequestRefused, watermark_stall
from spec.ar.config import ArConfig, ArRequest, validate_ar_request
from spec.errors import RequestError


class FastReplicaCore:
    """Counters and protocol queries of a fast replica over `config` (one pool, one stage cap).

    `free` counts free KV blocks; `G` is the decode-step clock and `base_sum` the sum of the
    running requests' base lengths (see the subclasses' module docs)."""

    waiting: Sized
    running: Sized

    name: str = "fast replica"  # the scheduler's catalog name, for messages
    watermark_fraction: float = 0.0  # a new request leaves this share of the usable blocks free

    def __init__(self, config: ArConfig) -> None:
        self.config = config
        self.watermark: int = int(self.watermark_fraction * config.usable_blocks)
        self.bs: int = config.block_size
        self.kv_capacity: int = config.usable_blocks * config.block_size
        self.free: int = config.usable_blocks
        self.cap: int = max(1, config.max_num_seqs // config.num_stages)
        self.base_sum: int = 0
        self.G: int = 0
        self._new: list[int] = []
        self._result: tuple[list[int], list[int], list[int]] = ([], [], [])

    @property
    def newly_scheduled(self) -> list[int]:
        """Requests the last `next_batch` scheduled for the first time (a restarted request is not
        listed again)."""
        return self._new

    def _validate(self, req: int, prefill: int, decode: int) -> None:
        """Raise `Unschedulable` for a request the spec refuses for this configuration."""
        try:
            validate_ar_request(self.config, ArRequest(str(req), prefill, decode))
        except RequestError as err:
            raise RequestRefused(req, prefill + decode, str(err)) from None

    def _stalled(self, head: tuple[int, int] | None) -> NeverAdmitted:
        """The error of a batch that runs, restarts and finishes nothing: nothing runs, and the
        head of the queue, `head` = (request, tokens of its prefill), is not admitted. With a
        watermark that is Vidur's admission (`watermark_stall`); otherwise no configuration the
        spec accepts gets here (`validate_ar_request` refuses what could never fit)."""
        cfg = self.config
        req, tokens = head if head is not None else (-1, 0)
        if (
            head is not None
            and self.watermark
            and -(-tokens // self.bs) > cfg.usable_blocks - self.watermark
        ):
            return watermark_stall(
                req, tokens, self.bs, cfg.usable_blocks, self.watermark_fraction, self.name
            )
        return NeverAdmitted(
            req,
            tokens,
            self.name,
            f"nothing runs and its admission refuses this request, the head of its queue, with "
            f"{self.outstanding()} request(s) outstanding and {self.free} of "
            f"{cfg.usable_blocks} KV blocks free (a simulator bug: please report it)",
        )

    def kv_used(self) -> int:
        """KV tokens in allocated blocks: (usable - free blocks) * block size."""
        return (self.config.usable_blocks - self.free) * self.bs

    def outstanding(self) -> int:
        """Requests queued or running."""
        return len(self.waiting) + len(self.running)

    def pending(self) -> int:
        """Requests in `waiting` (restarted ones included), as LOR reads them."""
        return len(self.waiting)

    def end_batch(self) -> tuple[list[int], list[int], list[int]]:
        """The ended batch's (first tokens, finished, restarted), decided by `next_batch`; reported
        once."""
        r, self._result = self._result, ([], [], [])
        return r
