"""vLLM's admission settings beyond the AR configuration, for the engine-core loop; the rule
each adds is checked by `integrations.vllm.admission_check`. Three are also declared options of
the AR spec, each with a built-in that sets it for the AR suite: the watermark
(`real-vllm-watermark`), the adaptive threshold (`real-vllm-adaptive`) and the whole-sequence
reservation (`real-vllm-no-reserve`).

vLLM 0.33.0's `SchedulerConfig` has five settings that decide when a waiting request joins the
running ones, the first four off by default and the last on (read in
`vllm/config/scheduler.py`, `Scheduler.schedule` and `KVCacheManager.allocate_slots`):

- `watermark` (a fraction of the pool): while a request runs, a waiting or preempted request
  is admitted only if `int(watermark * num_blocks)` blocks stay free after its allocation
  (`allocate_slots(has_scheduled_reqs=bool(self.running))`). Rule `watermark`: a `schedule()`
  call that starts with a request running and admits one leaves at least that many blocks
  free.
- `max_num_active_seqs` (at most `max_num_seqs`, which still sizes the model runner): the
  requests admitted into RUNNING, streaming-input sessions waiting for their next input
  counted (they keep a runner slot). Rule `active_cap`: a call that admits a request leaves
  at most that many running, sessions waiting for input included (counted by status, not by
  vLLM's counter).
- `prefill_schedule_interval` N: while a request decodes, prefill (a prompt admitted with
  tokens left to compute, or the next chunk of one running) rides one executed step in N (an
  executed step: a `schedule()` call that scheduled a token), counted from the last executed
  step that carried prefill; a release step (one not held) that leaves requests waiting that
  vLLM could have considered stops the hold until a release step drains them (vLLM #44558:
  otherwise a backed-up engine caps prefill at one budget per interval). Rule
  `prefill_cadence`: a held step carries no prefill. "Could have considered" is the waiting
  requests less those vLLM set aside that pass (`Scheduler.deferred_waiting`: a grammar
  compiling, a KV load or a streaming input awaited, a connector lookup put off, a LoRA
  adapter without room).
- `long_prefill_token_threshold_adaptive`: a long prefill's cap is floored at a fair share of
  the budget (`max_num_batched_tokens` over the requests queued or running). No rule of its
  own: the shared rules must hold under it.
- `scheduler_reserve_full_isl` (on by default): a waiting request is admitted only if blocks
  for its whole known sequence are free (`allocate_slots(full_sequence_must_fit=True)`); off,
  only the blocks of its next step must be, and running requests are preempted for room
  later. No rule of its own either.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from spec.errors import ConfigError


@dataclass(frozen=True, slots=True)
class AdmissionKnobs:
    """vLLM's admission settings for one scheduler (their defaults: vLLM's). `max_active_seqs`
    is capped at the program's `max_num_seqs` (`active_seats`), as vLLM refuses a larger one."""

    watermark: float = 0.0
    max_active_seqs: int | None = None
    prefill_interval: int = 1
    adaptive_threshold: bool = False
    reserve_full_isl: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError("watermark", self.watermark, "a fraction in [0, 1)")
        if self.max_active_seqs is not None and self.max_active_seqs < 1:
            raise ConfigError(
                "max_active_seqs", self.max_active_seqs, "an int >= 1 (unset: max_num_seqs)"
            )
        if self.prefill_interval < 1:
            raise ConfigError("prefill_interval", self.prefill_interval, "an int >= 1")

    @classmethod
    def of(cls, source: Any) -> AdmissionKnobs:
        """The settings `source` holds under the same names (`LoopOptions`, `DllmServing`, the
        scripts' parsed flags)."""
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls)})

    @property
    def any(self) -> bool:
        """Whether any setting differs from vLLM's default."""
        return self != AdmissionKnobs()  # the defaults are vLLM's

    def active_seats(self, max_num_seqs: int) -> int | None:
        """`max_num_active_seqs` for a scheduler of `max_num_seqs` seats (None: unset)."""
        if self.max_active_seqs is None:
            return None
        return min(self.max_active_seqs, max_num_seqs)

    def scheduler_settings(self, max_num_seqs: int) -> dict[str, Any]:
        """The `SchedulerConfig` keyword arguments these settings are."""
        return {
            "watermark": self.watermark,
            "max_num_active_seqs": self.active_seats(max_num_seqs),
            "prefill_schedule_interval": self.prefill_interval,
            "long_prefill_token_threshold_adaptive": self.adaptive_threshold,
            "scheduler_reserve_full_isl": self.reserve_full_isl,
        }

    def phrases(self) -> list[str]:
        """The settings that differ from vLLM's defaults, in words, one phrase each."""
        words: list[str] = []
        if self.watermark:
            words.append(f"a watermark of {self.watermark:g} of the pool")
        if self.max_active_seqs is not None:
            words.append(f"at most {self.max_active_seqs} active")
        if self.prefill_interval > 1:
            words.append(f"prefill every {self.prefill_interval} executed steps while decoding")
        if self.adaptive_threshold:
            words.append("an adaptive long-prefill threshold")
        if not self.reserve_full_isl:
            words.append("admission without the whole sequence's blocks")
        return words

    def describe(self) -> str:
        """`phrases`, each after "; " (empty if none)."""
        return "".join(f"; {phrase}" for phrase in self.phrases())


#: vLLM's defaults: every setting off.
VLLM_ADMISSION = AdmissionKnobs()

__all__ = ["VLLM_ADMISSION", "AdmissionKnobs"]
