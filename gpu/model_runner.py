"""The model runner: one batched forward over whole blocks against the paged KV pool.

It owns the KV tensors' consumer side: given a batch of block tokens, their start positions
and their request-pool rows, it calls `BlockDiffusionLM.forward_blocks`, which writes each
block's K/V into the slots the request-to-token table names and attends to the request's
earlier blocks through the same table.

For the parity property it records a digest of every forward's raw logits (sha256 of the
float tensor's bytes, taken before any post-processing): at batch size 1, FDFO and sync must
produce the same digests, forward by forward.

Post-processing: the mask token's logit is set to -inf, so no step can ever "predict" the mask
(which would leave a position masked forever, or make masks reappear under token-to-token
edits).
"""

from __future__ import annotations

import hashlib
import time

import torch

from gpu.device_timer import DeviceTimer
from gpu.kv_cache import PagedKvCache
from gpu.model import BlockDiffusionLM, BlockPlan
from gpu.request_pool import ReqToTokenPool


def logits_digest(logits: torch.Tensor) -> str:
    """sha256 of the tensor's raw bytes (row-major, its own dtype), hex."""
    data = logits.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


class ModelRunner:
    """Runs `BlockDiffusionLM.forward_blocks` on the engine's KV pool and request-to-token
    table; counts forwards and their time, and keeps the last forward's logits digest when
    `record_digests` is on."""

    def __init__(
        self,
        model: BlockDiffusionLM,
        kv: PagedKvCache,
        req_pool: ReqToTokenPool,
        mask_id: int,
        record_digests: bool = True,
    ) -> None:
        self.model = model
        self.kv = kv
        self.req_pool = req_pool
        self.mask_id = mask_id
        self.record_digests = record_digests
        self.forwards: int = 0
        self.forward_seconds: float = 0.0  # host wall time in forwards (on CUDA: until the digest)
        # on CUDA, the forwards' device time from timing events, when one is attached
        # (`gpu.bench` does); see `device_forward_seconds`
        self.device_timer: DeviceTimer | None = None
        self.attention_seconds: float = 0.0  # the part of it the model spent in attention
        self.attention_groups: int = 0  # per forward its distinct context lengths, summed
        self.last_digest: str | None = None
        self._last_plan: tuple[tuple[object, ...], BlockPlan] | None = None
        self.plans_built: int = 0  # plans read from the table (the others were the last one again)

    @property
    def device_forward_seconds(self) -> float:
        """The forwards' time on the device: the attached `device_timer`'s (CUDA events;
        reading it waits for the device), else the host wall time `forward_seconds` (on a CPU
        device the same thing)."""
        timer = self.device_timer
        return timer.seconds if timer is not None else self.forward_seconds

    def plan(self, start_positions: list[int], rows: list[int], block_size: int) -> BlockPlan:
        """The batch layout for this round's forwards (host lists in, one read of the table):
        valid while the table's entries for these rows do not change.

        Incremental: when the batch (rows, starts, block size) and the table's `version` are
        those of the last plan, that plan is returned as it is. An FDFO round where no block
        finished, with in-place reuse (or a re-allocation that got the same slots back), runs
        exactly the last round's layout."""
        pool = self.req_pool
        key = (tuple(start_positions), tuple(rows), block_size, pool.version)
        last = self._last_plan
        if last is not None and last[0] == key:
            return last[1]
        plan = self.model.plan_blocks(start_positions, rows, block_size, pool.req_to_token)
        self._last_plan = (key, plan)
        self.plans_built += 1
        return plan

    def forward(
        self,
        block_tokens: torch.Tensor,
        start_positions: torch.Tensor | list[int],
        rows: torch.Tensor | list[int],
        plan: BlockPlan | None = None,
    ) -> torch.Tensor:
        """Logits [b, B, V] (mask logit suppressed) for one block per row."""
        start = time.perf_counter()
        attn_before = self.model.attention_seconds
        groups_before = self.model.attention_groups
        timer = self.device_timer
        mark = timer.start() if timer is not None else None
        with torch.no_grad():
            logits = self.model.forward_blocks(
                block_tokens, start_positions, rows, self.kv, self.req_pool.req_to_token, plan
            )
            if timer is not None and mark is not None:
                timer.stop(mark)
            self.forwards += 1
            self.last_digest = logits_digest(logits) if self.record_digests else None
            logits[..., self.mask_id] = float("-inf")
        self.forward_seconds += time.perf_counter() - start
        self.attention_seconds += self.model.attention_seconds - attn_before
        self.attention_groups += self.model.attention_groups - groups_before
        return logits
