"""A candidate fix for a finding in vLLM 0.34.0's cache-aware admission: it ranks a waiting
request by cached tokens the request may not read.

The finding (docs/engines/vllm-0.34.md, "Cache-aware admission ranks a request by a prefix it may
not read"): with `cache_aware_admission_window` set, `Scheduler._reorder_waiting_by_cached_prefix`
moves the waiting requests with the deepest cached prefix to the front of the window, asking
`KVCacheManager.get_num_cached_tokens`. That probe says it "mirrors `get_computed_blocks`" and
returns 0 for a request that skips the cache, but it bounds the lookup at `num_tokens - 1`,
where `get_computed_blocks` bounds it at `Request.get_max_cache_hit_length()`: the first scored
prompt row of a prompt-scoring request (`prompt_logprob_start`, 0.34.0's
`prefix_cache_hit_limit`). So a request scoring its prompt from row s is moved ahead of others
for cached blocks past row s that its admission will not take, and recomputes them.

The fix: the probe asks for the same bound as the lookup (`get_max_cache_hit_length()`, which
also keeps the last token out). It is an edit of vLLM's own `vllm/v1/core/kv_cache_manager.py`
(`CACHE_PROBE_FIXES`): `fix_as_diff()` prints it as a patch, `apply_cache_probe_fix(sched)`
gives one built scheduler's `KVCacheManager` the edited method through a subclass of its class.
`FixDoesNotApply` if vLLM's file no longer has the statement the fix edits (vLLM 0.33.0 has no
such probe). `REAL_VLLM_CACHE_AWARE_FIXED` is `integrations.vllm:REAL_VLLM_CACHE_AWARE` with the
fix, for `schedspec verify --impl integrations.vllm.cache_probe_fix:REAL_VLLM_CACHE_AWARE_FIXED`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from integrations.patches import EngineFix, FixDoesNotApply, FixSet
from integrations.vllm import REAL_VLLM_CACHE_AWARE_PROFILE, VLLM_CACHE_AWARE_WINDOW
from integrations.vllm.adapter import RealVllmScheduler, load_vllm, make_real_vllm_cache_aware
from integrations.vllm.offload_hit_fix import give_methods
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig
from spec.implementation import ArImplementation

MODULE = "vllm.v1.core.kv_cache_manager"
CACHE_PROBE = "bounded-cache-probe"
_METHOD = "KVCacheManager.get_num_cached_tokens"

#: The probe's lookup, bounded at the request's tokens less one only.
_PROBE = (
    "        _, num_computed_tokens, _ = self.coordinator.find_longest_cache_hit(\n"
    "            request.block_hashes, request.num_tokens - 1\n"
    "        )\n"
)
_PROBE_BOUNDED = (
    "        # Bounded as the lookup is: a prompt-scoring request reads no cached block\n"
    "        # past its first scored row, so it is not ranked by one.\n"
    "        _, num_computed_tokens, _ = self.coordinator.find_longest_cache_hit(\n"
    "            request.block_hashes, request.get_max_cache_hit_length()\n"
    "        )\n"
)

CACHE_PROBE_FIX = EngineFix(
    CACHE_PROBE,
    ((MODULE, _PROBE, _PROBE_BOUNDED),),
    ((MODULE, _METHOD),),
    "cache-aware admission ranks a prompt-scoring request by cached tokens past its first "
    "scored row, which it may not read: bound the probe as the lookup is",
)
CACHE_PROBE_FIXES = FixSet(
    engine="vLLM 0.34.0",
    modules=(MODULE,),
    fixes=(CACHE_PROBE_FIX,),
    exclusive=(),
    load=load_vllm,
    importing=contextlib.nullcontext,
)


@functools.cache
def _fixed_probe() -> Any:
    return CACHE_PROBE_FIXES.fixed_methods((CACHE_PROBE,))[(MODULE, _METHOD)]


def fix_as_diff() -> str:
    """The fix as a unified diff of the installed vLLM's `kv_cache_manager.py` (paths as `git
    apply -p1` in a vLLM checkout wants), made from that file when called."""
    return CACHE_PROBE_FIXES.as_diff((CACHE_PROBE,))


def apply_cache_probe_fix(sched: Any) -> None:
    """Give the `KVCacheManager` of `sched` (a built vLLM scheduler) the fixed
    `get_num_cached_tokens`; `FixDoesNotApply` on a release without the probe."""
    manager = sched.kv_cache_manager
    if not hasattr(manager, "get_num_cached_tokens"):
        raise FixDoesNotApply(
            f"{CACHE_PROBE} edits KVCacheManager.get_num_cached_tokens, which this vLLM "
            "release does not have (it is new in vLLM 0.34.0, with cache-aware admission)"
        )
    give_methods(manager, {"get_num_cached_tokens": _fixed_probe()})


def make_real_vllm_cache_aware_fixed(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: `REAL_VLLM_CACHE_AWARE` (vLLM 0.34.0 with `cache_aware_admission_window`) with
    the fix applied to its scheduler's KV cache manager."""
    adapter = make_real_vllm_cache_aware(config, sink)
    apply_cache_probe_fix(adapter.sched)
    return adapter


REAL_VLLM_CACHE_AWARE_FIXED = ArImplementation(
    make_real_vllm_cache_aware_fixed,
    REAL_VLLM_CACHE_AWARE_PROFILE,
    f"vLLM 0.34.0's real v1 Scheduler (synchronous) with cache_aware_admission_window="
    f"{VLLM_CACHE_AWARE_WINDOW} and the candidate fix {CACHE_PROBE!r}, prefix caching off or on, "
    "with a fabricated model output",
)


__all__ = [
    "CACHE_PROBE",
    "CACHE_PROBE_FIX",
    "CACHE_PROBE_FIXES",
    "REAL_VLLM_CACHE_AWARE_FIXED",
    "apply_cache_probe_fix",
    "fix_as_diff",
    "make_real_vllm_cache_aware_fixed",
]
