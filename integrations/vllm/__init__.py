"""vLLM 0.33.0's real v1 Scheduler under the AR spec (`real-vllm`, `real-vllm-prefix`).

Importing this package never imports vLLM: the factories activate the engine install
(`MANIFEST`, `schedspec install-engines vllm`) and import it on first use. The adapter, with every
stub and every engine attribute it reads, is `integrations.vllm.adapter`.

The profile declares vLLM's deliberate choices (each read from vLLM 0.33.0's
`vllm/v1/core/sched/scheduler.py` and `vllm/v1/core/kv_cache_manager.py`, and confirmed by
running it):

- policies FCFS and priority only; block 0 is always the null block
  (`BlockPool.__init__`: `self.null_block = self.free_block_queue.popleft()`);
- a request alone in the scheduler is exempt from `long_prefill_token_threshold`
  (`Scheduler.schedule`: the threshold is 0 unless `num_running + num_waiting > 1`; "when it is
  the only request there is nobody to starve");
- admission needs the blocks of the request's whole known sequence free, not only those of its
  first chunk (`scheduler_reserve_full_isl=True`, the default, passed to
  `KVCacheManager.allocate_slots(..., full_sequence_must_fit=True)`);
- under priority, the victim is the lowest priority (then latest arrival) among *all* running
  requests, an already scheduled one included, which is then unscheduled
  (`max(self.running, key=lambda r: (r.priority, r.arrival_time))`); the adapter's `rules`
  declare `VictimOrder.LOWEST_PRIORITY_ANY` for it;
- with `SchedulerConfig.watermark` set (`real-vllm-watermark`), a waiting request admitted
  while another runs leaves `int(watermark * num_blocks)` blocks free, the null block counted
  in `num_blocks`; with nothing running no watermark binds (`allocate_slots(...,
  has_scheduled_reqs=bool(self.running))`); under `scheduler_reserve_full_isl` the whole
  sequence must fit above it (`num_blocks_to_allocate + watermark_blocks`);
- with `long_prefill_token_threshold_adaptive=True` (`real-vllm-adaptive`) a set threshold is
  floored at `max_num_batched_tokens // (running + waiting)` for the step
  (`adaptive_long_prefill_threshold`);
- with `prefill_schedule_interval=3` (`REAL_VLLM_CADENCE`, not a built-in: released vLLM
  fails `progress` with it, a finding in docs/engines/vllm.md; `REAL_VLLM_CADENCE_FIXED` applies
  its candidate fix, `integrations.vllm.cadence_fix`) prefill is held while a request decodes,
  as `prefill_interval` declares (`VLLM_PREFILL_INTERVAL`);
- with `scheduler_reserve_full_isl=False` (`real-vllm-no-reserve`) admission needs only the
  blocks of the first chunk: `full_sequence_admission` is not declared;
- with vLLM 0.34.0's `cache_aware_admission_window=3` (`REAL_VLLM_CACHE_AWARE`, not a built-in:
  0.33.0 has no such setting and raises `ConfigError`), under FCFS with prefix caching the head
  of the waiting queue is reordered by cached prefix once the pool is half used, as
  `cache_aware_window` declares (`VLLM_CACHE_AWARE_WINDOW`);
- synchronous scheduling only (`async_scheduling=False`; vLLM's default is on: with it the
  scheduler runs one step ahead of the model, which the AR step contract does not describe;
  `integrations.vllm.engine_core` checks that mode in vLLM's engine-core loop instead).

`integrations.vllm.event_log.VllmEventLog` attaches to a live (synchronous) scheduler that
something else drives and writes its decisions as an AR event log for `schedspec check-trace`.

vLLM's diffusion-LLM schedulers (`DiffusionScheduler`, `DiffusionAsyncScheduler`) are checked
in the same loop by `integrations.vllm.diffusion`, with a fabricated denoising runner (with
prefix caching, and pipeline-parallel stages in the asynchronous loop);
`integrations.vllm.whole_canvas_fix` applies a candidate fix for the first of their findings
(a canvas cut by the token budget) to one built scheduler, so the same checks validate it;
`integrations.vllm.async_hold_fixes` does the same for the second (a canvas cut early near
max_model_len in the async loop: the model-len hold) and for the read-only hold's wasted step;
`integrations.vllm.fixes` lists the three as one `FixSet` (`scripts/engine_fixes_diff.py vllm`
prints them as one patch).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from integrations.vllm.manifest import MANIFEST, VLLM_VERSION
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig, Policy
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile, CacheReadLimits
from spec.implementation import ArImplementation

if TYPE_CHECKING:
    from spec.ar.adapter import ArSchedulerAdapter

VLLM_POLICY = ArPolicy(
    lone_request_threshold_exempt=True, full_sequence_admission=True, admission_progress=True
)

#: The watermark `real-vllm-watermark` gives vLLM (`SchedulerConfig.watermark`, 0 by default):
#: a quarter of the pool, so that it binds in the suite's small pools.
VLLM_WATERMARK = 0.25

#: `VLLM_POLICY` with vLLM's watermark declared: of the whole pool, and only beside a running
#: request.
VLLM_WATERMARK_POLICY = dataclasses.replace(
    VLLM_POLICY,
    watermark_fraction=VLLM_WATERMARK,
    watermark_of_pool=True,
    watermark_beside_running=True,
)

REAL_VLLM_PROFILE = ArProfile(
    space=ArConfigSpace(
        policies=frozenset({Policy.FCFS, Policy.PRIORITY}),
        null_block=frozenset({True}),
        prefix_caching=frozenset({False}),
        max_loras=None,
    ),
    policy=VLLM_POLICY,
)

#: The per-request cache read limits (`ArRequest.cache_read_limit`) the selected release
#: honours: 0.33.0 gives a request its whole cached prefix or, with `skip_reading_prefix_cache`
#: (set for every prompt-scoring request), none of it; 0.34.0 also bounds a hit at the first
#: scored prompt row (`prompt_logprob_start`, `Request.prefix_cache_hit_limit`).
VLLM_CACHE_READ_LIMITS = (
    CacheReadLimits.SKIP if VLLM_VERSION == "0.33.0" else CacheReadLimits.BOUNDED
)

REAL_VLLM_PREFIX_PROFILE = ArProfile(
    space=ArConfigSpace(
        policies=frozenset({Policy.FCFS, Policy.PRIORITY}),
        null_block=frozenset({True}),
        prefix_caching=frozenset({True}),
        cache_read_limits=VLLM_CACHE_READ_LIMITS,
        max_loras=None,
    ),
    # the adapter's requests carry no cache salt or multimodal input: vLLM's blocks hash by
    # their tokens and LoRA adapter alone (the spec keys both), and its lookup takes the
    # longest cached prefix
    policy=dataclasses.replace(VLLM_POLICY, longest_cache_hit=True),
)


#: The space of the built-ins that change one of vLLM's admission settings: prefix caching
#: off or on.
SETTINGS_SPACE = ArConfigSpace(
    policies=frozenset({Policy.FCFS, Policy.PRIORITY}),
    null_block=frozenset({True}),
    prefix_caching=frozenset({False, True}),
)

REAL_VLLM_WATERMARK_PROFILE = ArProfile(space=SETTINGS_SPACE, policy=VLLM_WATERMARK_POLICY)

#: `real-vllm-no-reserve` (`scheduler_reserve_full_isl=False`) declares no whole-sequence gate.
REAL_VLLM_NO_RESERVE_PROFILE = ArProfile(
    space=SETTINGS_SPACE,
    policy=dataclasses.replace(VLLM_POLICY, full_sequence_admission=False),
)

#: The prefill interval `REAL_VLLM_CADENCE` gives vLLM (`prefill_schedule_interval`, 1 by
#: default): prefill rides one executed step in 3 while a request decodes.
VLLM_PREFILL_INTERVAL = 3

#: `REAL_VLLM_CADENCE` declares vLLM's local prefill cadence; it serves LoRA adapters too (the
#: spec follows which requests each pass skipped for their adapter, which the capacity escape
#: leaves out).
REAL_VLLM_CADENCE_PROFILE = ArProfile(
    space=dataclasses.replace(SETTINGS_SPACE, max_loras=None),
    policy=dataclasses.replace(VLLM_POLICY, prefill_interval=VLLM_PREFILL_INTERVAL),
)

#: The window `REAL_VLLM_CACHE_AWARE` gives vLLM 0.34.0 (`cache_aware_admission_window`, 0 by
#: default) and its threshold (`cache_aware_admission_threshold`, vLLM's default).
VLLM_CACHE_AWARE_WINDOW = 3
VLLM_CACHE_AWARE_THRESHOLD = 0.5

#: `REAL_VLLM_CACHE_AWARE` declares vLLM 0.34.0's cache-aware admission, with requests that
#: bound their cache reads (which 0.34.0's ranking overlooks: a finding, docs/engines/vllm-0.34.md).
REAL_VLLM_CACHE_AWARE_PROFILE = ArProfile(
    space=dataclasses.replace(SETTINGS_SPACE, cache_read_limits=CacheReadLimits.BOUNDED),
    policy=dataclasses.replace(
        VLLM_POLICY,
        cache_aware_window=VLLM_CACHE_AWARE_WINDOW,
        cache_aware_threshold=VLLM_CACHE_AWARE_THRESHOLD,
    ),
)

#: `real-vllm-adaptive` (`long_prefill_token_threshold_adaptive=True`) declares the floor.
REAL_VLLM_ADAPTIVE_PROFILE = ArProfile(
    space=SETTINGS_SPACE,
    policy=dataclasses.replace(VLLM_POLICY, adaptive_long_prefill_threshold=True),
)


def make_real_vllm(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: vLLM 0.33.0's real v1 Scheduler, prefix caching off (imports vLLM lazily)."""
    from integrations.vllm.adapter import make_real_vllm as make

    return make(config, sink)


def make_real_vllm_prefix(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: vLLM 0.33.0's real v1 Scheduler, prefix caching on (imports vLLM lazily)."""
    from integrations.vllm.adapter import make_real_vllm_prefix as make

    return make(config, sink)


def make_real_vllm_watermark(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: vLLM 0.33.0's real v1 Scheduler with `watermark=VLLM_WATERMARK`, prefix
    caching as the config says (imports vLLM lazily)."""
    from integrations.vllm.adapter import make_real_vllm_watermark as make

    return make(config, sink)


def make_real_vllm_no_reserve(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: vLLM 0.33.0's real v1 Scheduler with `scheduler_reserve_full_isl=False`,
    prefix caching as the config says (imports vLLM lazily)."""
    from integrations.vllm.adapter import make_real_vllm_no_reserve as make

    return make(config, sink)


def make_real_vllm_adaptive(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: vLLM 0.33.0's real v1 Scheduler with `long_prefill_token_threshold_adaptive=
    True`, prefix caching as the config says (imports vLLM lazily)."""
    from integrations.vllm.adapter import make_real_vllm_adaptive as make

    return make(config, sink)


def make_real_vllm_cadence(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: vLLM 0.33.0's real v1 Scheduler with `prefill_schedule_interval=
    VLLM_PREFILL_INTERVAL`, prefix caching as the config says (imports vLLM lazily)."""
    from integrations.vllm.adapter import make_real_vllm_cadence as make

    return make(config, sink)


def make_real_vllm_cadence_fixed(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `make_real_vllm_cadence` with the cadence finding's candidate fix
    (`integrations.vllm.cadence_fix`, `lift-empty-hold`) applied (imports vLLM lazily)."""
    from integrations.vllm.adapter import make_real_vllm_cadence as make
    from integrations.vllm.cadence_fix import apply_cadence_fix

    adapter = make(config, sink)
    apply_cadence_fix(adapter.sched)
    return adapter


REAL_VLLM = ArImplementation(
    make_real_vllm,
    REAL_VLLM_PROFILE,
    f"vLLM {VLLM_VERSION}'s real v1 Scheduler (synchronous, prefix caching off) with a "
    "fabricated model output",
)

REAL_VLLM_PREFIX = ArImplementation(
    make_real_vllm_prefix,
    REAL_VLLM_PREFIX_PROFILE,
    f"vLLM {VLLM_VERSION}'s real v1 Scheduler (synchronous, prefix caching on: cache hits, "
    "shared reference-counted blocks, eviction) with a fabricated model output",
)

REAL_VLLM_WATERMARK = ArImplementation(
    make_real_vllm_watermark,
    REAL_VLLM_WATERMARK_PROFILE,
    f"vLLM {VLLM_VERSION}'s real v1 Scheduler (synchronous) with watermark={VLLM_WATERMARK}, "
    "prefix caching off or on, with a fabricated model output",
)

REAL_VLLM_NO_RESERVE = ArImplementation(
    make_real_vllm_no_reserve,
    REAL_VLLM_NO_RESERVE_PROFILE,
    f"vLLM {VLLM_VERSION}'s real v1 Scheduler (synchronous) with "
    "scheduler_reserve_full_isl=False, prefix caching off or on, with a fabricated model output",
)

REAL_VLLM_ADAPTIVE = ArImplementation(
    make_real_vllm_adaptive,
    REAL_VLLM_ADAPTIVE_PROFILE,
    f"vLLM {VLLM_VERSION}'s real v1 Scheduler (synchronous) with "
    "long_prefill_token_threshold_adaptive=True, prefix caching off or on, with a fabricated "
    "model output",
)


def make_real_vllm_cache_aware(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: vLLM 0.34.0's real v1 Scheduler with `cache_aware_admission_window=
    VLLM_CACHE_AWARE_WINDOW`, prefix caching as the config says (imports vLLM lazily; on
    0.33.0 raises `ConfigError`)."""
    from integrations.vllm.adapter import make_real_vllm_cache_aware as make

    return make(config, sink)


REAL_VLLM_CACHE_AWARE = ArImplementation(
    make_real_vllm_cache_aware,
    REAL_VLLM_CACHE_AWARE_PROFILE,
    f"vLLM {VLLM_VERSION}'s real v1 Scheduler (synchronous) with "
    f"cache_aware_admission_window={VLLM_CACHE_AWARE_WINDOW} (vLLM 0.34.0), prefix caching "
    "off or on, with a fabricated model output",
)

REAL_VLLM_CADENCE = ArImplementation(
    make_real_vllm_cadence,
    REAL_VLLM_CADENCE_PROFILE,
    f"vLLM {VLLM_VERSION}'s real v1 Scheduler (synchronous) with "
    f"prefill_schedule_interval={VLLM_PREFILL_INTERVAL}, prefix caching off or on, with a "
    "fabricated model output",
)

REAL_VLLM_CADENCE_FIXED = ArImplementation(
    make_real_vllm_cadence_fixed,
    REAL_VLLM_CADENCE_PROFILE,
    f"vLLM {VLLM_VERSION}'s real v1 Scheduler (synchronous) with "
    f"prefill_schedule_interval={VLLM_PREFILL_INTERVAL} and the candidate fix lift-empty-hold, "
    "prefix caching off or on, with a fabricated model output",
)

__all__ = [
    "MANIFEST",
    "REAL_VLLM",
    "REAL_VLLM_ADAPTIVE",
    "REAL_VLLM_ADAPTIVE_PROFILE",
    "REAL_VLLM_CACHE_AWARE",
    "REAL_VLLM_CACHE_AWARE_PROFILE",
    "REAL_VLLM_CADENCE",
    "REAL_VLLM_CADENCE_FIXED",
    "REAL_VLLM_CADENCE_PROFILE",
    "REAL_VLLM_NO_RESERVE",
    "REAL_VLLM_NO_RESERVE_PROFILE",
    "REAL_VLLM_PREFIX",
    "REAL_VLLM_PREFIX_PROFILE",
    "REAL_VLLM_PROFILE",
    "REAL_VLLM_WATERMARK",
    "REAL_VLLM_WATERMARK_PROFILE",
    "SETTINGS_SPACE",
    "VLLM_CACHE_AWARE_THRESHOLD",
    "VLLM_CACHE_AWARE_WINDOW",
    "VLLM_POLICY",
    "VLLM_PREFILL_INTERVAL",
    "VLLM_WATERMARK",
    "VLLM_WATERMARK_POLICY",
    "make_real_vllm",
    "make_real_vllm_adaptive",
    "make_real_vllm_cache_aware",
    "make_real_vllm_cadence",
    "make_real_vllm_cadence_fixed",
    "make_real_vllm_no_reserve",
    "make_real_vllm_prefix",
    "make_real_vllm_watermark",
]
