"""vLLM 0.34.0's cache-aware admission, as the AR adapter runs it:
`cache_aware_admission_window` (0 by default: off) and `cache_aware_admission_threshold` (0.5).

Under FCFS with prefix caching, once the KV cache is used at least the threshold, vLLM
reorders the first `window` waiting requests by cached prefix
(`Scheduler._reorder_waiting_by_cached_prefix`). The AR spec declares it as
`ArPolicy.cache_aware_window`; `integrations.vllm:REAL_VLLM_CACHE_AWARE` runs vLLM with it.
Kept apart from `AdmissionKnobs` (0.33.0's settings, which the engine-core loop also checks):
the loop does not set this one, and 0.33.0 has no such setting (asking for it there is a
`ConfigError`, `release_api.check_scheduler_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CacheAwareAdmission:
    """The window (0: off, vLLM's default) and the usage threshold (vLLM's default 0.5)."""

    window: int = 0
    threshold: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ConfigError("cache_aware_window", self.window, "an int >= 0 (0: arrival order)")
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError("cache_aware_threshold", self.threshold, "a number in [0, 1]")

    def scheduler_settings(self) -> dict[str, Any]:
        """The `SchedulerConfig` keyword arguments (none while off: 0.33.0 has no such field)."""
        if not self.window:
            return {}
        return {
            "cache_aware_admission_window": self.window,
            "cache_aware_admission_threshold": self.threshold,
        }


#: vLLM's default: off.
NO_CACHE_AWARE = CacheAwareAdmission()

__all__ = ["NO_CACHE_AWARE", "CacheAwareAdmission"]
