"""vLLM 0.34.0's new scheduler settings, as the adapters run them (each off by default):

- `cache_aware_admission_window` (0: off) and `cache_aware_admission_threshold` (0.5): under
  FCFS with prefix caching, once the KV cache is used at least the threshold, vLLM reorders
  the first `window` waiting requests by cached prefix
  (`Scheduler._reorder_waiting_by_cached_prefix`). The AR spec declares it as
  `ArPolicy.cache_aware_window`; `integrations.vllm:REAL_VLLM_CACHE_AWARE` runs vLLM with it.
- `max_num_inflight_kv_loads` (None: no cap): at most that many requests hold KV blocks for an
  asynchronous connector load (loading, or loaded and waiting for a running slot; an aborted
  one until its load is reported), and requests the connector may load asynchronously
  (`KVConnectorBase_V1.may_load_async`) start their loads while the running batch is full
  (`Scheduler.async_kv_waiting`). The engine-core loop runs it with a KV connector or vLLM's
  offloading connector (`--max-inflight-kv-loads N`) and checks the cap (rule
  `inflight_kv_loads`) and the admission order across the two waiting queues.

Kept apart from `AdmissionKnobs` (0.33.0's settings): 0.33.0 has none of these, and asking for
one there is a `ConfigError` (`release_api.check_scheduler_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Vllm034Settings:
    """The cache-aware window (0: off) and its usage threshold, and the cap on in-flight KV
    loads (None: no cap); vLLM's defaults."""

    cache_aware_window: int = 0
    cache_aware_threshold: float = 0.5
    max_inflight_kv_loads: int | None = None

    def __post_init__(self) -> None:
        w = self.cache_aware_window
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ConfigError("cache_aware_window", w, "an int >= 0 (0: arrival order)")
        if not 0.0 <= self.cache_aware_threshold <= 1.0:
            raise ConfigError("cache_aware_threshold", self.cache_aware_threshold, "in [0, 1]")
        n = self.max_inflight_kv_loads
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError("max_inflight_kv_loads", n, "an int >= 1, or None (no cap)")

    def scheduler_settings(self) -> dict[str, Any]:
        """The `SchedulerConfig` keyword arguments of the settings that are on (none while all
        are off: 0.33.0 has no such fields)."""
        settings: dict[str, Any] = {}
        if self.cache_aware_window:
            settings["cache_aware_admission_window"] = self.cache_aware_window
            settings["cache_aware_admission_threshold"] = self.cache_aware_threshold
        if self.max_inflight_kv_loads is not None:
            settings["max_num_inflight_kv_loads"] = self.max_inflight_kv_loads
        return settings


#: vLLM's defaults: every setting off.
VLLM_034_DEFAULTS = Vllm034Settings()

__all__ = ["VLLM_034_DEFAULTS", "Vllm034Settings"]
