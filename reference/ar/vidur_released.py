"""Vidur's vLLM and Sarathi replica schedulers as Vidur's releases decide (0.0.25 and 0.0.26
alike), where `reference.ar.vidur` deviates from them; decision-faithful at constant batch
time, one stage.

Read for facts in vidur 0.0.25 / 0.0.26 `vidur/scheduler/replica_scheduler/
vllm_replica_scheduler.py`, `sarathi_replica_scheduler.py` and `vidur/entities/request.py`,
written anew here. What each takes from the release that `reference.ar.vidur` does not:

- both: a new request is admitted only when its whole prefill leaves the watermark free
  (`int(0.01 * blocks)`, Vidur's default `watermark_blocks_fraction`);
- `vidur-vllm-released`: a prefill batch counts its tokens summed against
  `max_tokens_in_batch` (`total_num_q_tokens + next_num_q_tokens`), where microsoft/vidur's main
  branch, which `vidur-vllm` follows, pads every prompt to the longest. A decode that needs no
  block does not demand a free one: that demand is a finding (an empty batch at an exact fit,
  rule `progress`), and this is the class with its fix (`vllm-decode-block`) applied;
- `vidur-sarathi-released`: every decode demands one free block, needed or not
  (`_can_allocate_request`: `num_blocks - allocated >= 1`); while none is free the last request
  of the decode queue is restarted, or the request itself, which is then re-admitted from the
  head of the queue in the same batch. Whether a request decodes is Vidur's
  `is_prefill_complete`: set when a batch brings its processed tokens to its prefill tokens,
  cleared by a restart. And a restart makes the prefill what was processed
  (`Request.restart`: `num_prefill_tokens = num_processed_tokens`): a request restarted in the
  middle of its prompt is re-admitted with blocks for that part only, prefills that part in
  chunks and then computes the rest of its prompt one token a batch, as decodes, each demanding
  a free block. (Vidur counts one more processed token than was computed once a prefill
  completes, its first output; so a request restarted while decoding has all its known tokens
  as its prefill, as in `reference.ar.vidur`.)

Both pass the AR spec under Vidur's profiles; the twin tests in tests/test_real_vidur.py run the
real classes with these as decision twins.
"""

from __future__ import annotations

import dataclasses

from reference.ar.base import ArReq
from reference.ar.vidur import (
    VIDUR_SARATHI,
    VIDUR_VLLM,
    WATERMARK_FRACTION,
    VidurSarathi,
    VidurVllm,
)
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.ar.events import ArFinishReason
from spec.ar.profile import ArPolicy
from spec.implementation import ArImplementation


class VidurVllmReleased(VidurVllm):
    """Vidur's vLLM scheduler with summed prefill tokens and the watermark (module docstring)."""

    name = "vidur-vllm-released"
    watermark_fraction = WATERMARK_FRACTION

    def _over_budget(self, tokens: list[int], n: int) -> bool:
        return sum(tokens) + n > self.config.max_num_batched_tokens


class VidurSarathiReleased(VidurSarathi):
    """Vidur's Sarathi scheduler with its one-free-block demand, its prefill flag and its
    restart (module docstring)."""

    name = "vidur-sarathi-released"
    watermark_fraction = WATERMARK_FRACTION
    sequence_parallel_capable = True
    # Vidur's restart; False: the victim prefills all it knows again, as `vidur-sarathi` (for
    # telling the release's rules apart: scripts/repro_vidur_rules.py)
    restart_keeps_processed = True

    def _setup(self) -> None:
        # Vidur's `num_prefill_tokens` of a restarted request (the others': their prompt)
        self.prefill_tokens: dict[str, int] = {}
        # Vidur's `is_prefill_complete`, by request id
        self.prefill_completed: set[str] = set()

    def _prefill_of(self, req: ArReq) -> int:
        return self.prefill_tokens.get(req.rid, req.spec.prompt_len)

    def _full_for_new(self) -> bool:
        """Vidur's `len(requests) == self._max_micro_batch_size`: once running prefills took the
        batch past its cap, new requests are admitted again (up to the seats)."""
        return len(self.batch) == self.micro_batch_cap

    def _prefill_complete(self, req: ArReq) -> bool:
        return req.rid in self.prefill_completed

    def decoding(self, req: ArReq) -> bool:
        """Vidur's `is_prefill_complete` (its flag, as `_prefill_complete`)."""
        return self._prefill_complete(req)

    def _prefill_left(self, req: ArReq) -> int:
        return self._prefill_of(req) - self._chunk_start(req)

    def _new_blocks(self, req: ArReq) -> int:
        """Blocks for Vidur's prefill tokens: after a restart mid-prompt, fewer than known."""
        return self.config.blocks_for(self._prefill_of(req))

    def _decode_or_restart(self, req: ArReq) -> bool:
        """One token, after Vidur's one-free-block demand (False: `req` restarted)."""
        if not self._free_block_or_restart(req):
            return False
        self._grow(req, self._blocks_needed(req, 1))
        return True

    def _restart(self, victim: ArReq) -> None:
        # Vidur's processed tokens: one past the computed ones once the prefill completed
        complete = victim.rid in self.prefill_completed
        processed = victim.num_computed + (1 if complete else 0)
        self.prefill_tokens[victim.rid] = (
            processed if self.restart_keeps_processed else victim.known
        )
        self.prefill_completed.discard(victim.rid)
        super()._restart(victim)

    def _requeue(self, req: ArReq) -> None:
        """Vidur's `on_batch_end`: a request whose prefill is now complete sets its flag; with
        sequence parallelism only those return here (the others did when their chunk left stage
        0)."""
        if req.num_computed >= self._prefill_of(req):
            self.prefill_completed.add(req.rid)
        elif self.sequence_parallel:
            return
        super()._requeue(req)

    def abort(self, request_id: str) -> None:
        """As `VidurSarathi.abort`, and the request's prefill tokens and prefill flag forgotten."""
        super().abort(request_id)
        self._forget(request_id)

    def _finish(self, req: ArReq, reason: ArFinishReason) -> None:
        super()._finish(req, reason)
        self._forget(req.rid)

    def _forget(self, request_id: str) -> None:
        self.prefill_tokens.pop(request_id, None)
        self.prefill_completed.discard(request_id)


def make_vidur_vllm_released(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `VidurVllmReleased`; `ConfigError` as `make_vidur_vllm`."""
    return VidurVllmReleased(config, sink)


def make_vidur_sarathi_released(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `VidurSarathiReleased`; `ConfigError` as `make_vidur_sarathi`."""
    return VidurSarathiReleased(config, sink)


def _with_watermark(impl: ArImplementation) -> ArPolicy:
    return dataclasses.replace(impl.profile.policy, watermark_fraction=WATERMARK_FRACTION)


VIDUR_VLLM_RELEASED = ArImplementation(
    make_vidur_vllm_released,
    dataclasses.replace(VIDUR_VLLM.profile, policy=_with_watermark(VIDUR_VLLM)),
    "Vidur's vLLM replica scheduler as its releases decide, its decode-block finding fixed: "
    "prefill tokens summed against the budget, Vidur's watermark",
)

VIDUR_SARATHI_RELEASED = ArImplementation(
    make_vidur_sarathi_released,
    dataclasses.replace(VIDUR_SARATHI.profile, policy=_with_watermark(VIDUR_SARATHI)),
    "Vidur's Sarathi-Serve replica scheduler as its releases decide: every decode demands a "
    "free block, a restart mid-prompt decodes the prompt's rest, Vidur's watermark",
)
