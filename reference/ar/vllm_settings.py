"""vLLM's admission settings as variants of the prefix-caching reference: the decision twins
of vLLM 0.33.0 run with one setting changed from its default.

Each variant is `reference.ar.prefix_cache.PrefixCachingVllmV1` (prefix caching as the
config says) with vLLM 0.33.0's options (`VLLM_033`) and one setting of
`reference.ar.vllm_v1.VllmOptions` changed, and declares vLLM's policy with the matching
`ArPolicy` option:

- `VLLM_V1_WATERMARK` (`vllm-v1-watermark`): `SchedulerConfig.watermark=0.25`, the twin of
  `real-vllm-watermark`;
- `VLLM_V1_NO_RESERVE` (`vllm-v1-no-reserve`): `scheduler_reserve_full_isl=False`, the twin
  of `real-vllm-no-reserve`;
- `VLLM_V1_ADAPTIVE` (`vllm-v1-adaptive`): `long_prefill_token_threshold_adaptive=True`, the
  twin of `real-vllm-adaptive`;
- `VLLM_V1_CADENCE` (by import string only): `prefill_schedule_interval=3`, the twin of
  `integrations.vllm:REAL_VLLM_CADENCE`, an empty held step included (a vLLM finding,
  docs/engines/vllm.md); FCFS and priority only, as a held prefill chunk gets no token, which
  FAIR's floor forbids;
- `VLLM_V1_CADENCE_FIXED`: the same with the finding's candidate fix (`lift_empty_hold`), the
  twin of `integrations.vllm:REAL_VLLM_CADENCE_FIXED`;
- `VLLM_V1_CACHE_AWARE` (by import string only): vLLM 0.34.0's cache-aware admission
  (`cache_aware_admission_window=3`, its default threshold 0.5), the twin of
  `integrations.vllm:REAL_VLLM_CACHE_AWARE` (which needs vLLM 0.34.0: 0.33.0 has no such
  setting); the reordering applies under FCFS with prefix caching, as in vLLM.

`with_vllm_settings` rebuilds any of these twins (and `vllm-v1`, `vllm-v1-prefix`) with the
settings a log declares, for `check-trace --twin`.
"""

from __future__ import annotations

import dataclasses

from reference.ar.prefix_cache import PrefixCachingVllmV1, make_vllm_v1_prefix
from reference.ar.vllm_v1 import VLLM_033, VllmOptions, make_vllm_v1_033
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig, Policy
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile, CacheReadLimits
from spec.implementation import ArImplementation

#: The watermark of `vllm-v1-watermark`, as `real-vllm-watermark` runs vLLM with it.
VLLM_WATERMARK = 0.25

#: The prefill interval of `VLLM_V1_CADENCE`, as `integrations.vllm.REAL_VLLM_CADENCE` runs
#: vLLM with it.
VLLM_PREFILL_INTERVAL = 3

#: The window of `VLLM_V1_CACHE_AWARE`, as `integrations.vllm.REAL_VLLM_CACHE_AWARE` runs vLLM
#: 0.34.0 with it (`cache_aware_admission_window`; 0, off, by default): three waiting
#: requests, so that the suite's queues reach past it.
VLLM_CACHE_AWARE_WINDOW = 3

#: ... and its threshold: vLLM's default (`cache_aware_admission_threshold=0.5`).
VLLM_CACHE_AWARE_THRESHOLD = 0.5

#: vLLM 0.33.0's options with each setting changed.
VLLM_033_WATERMARK = dataclasses.replace(VLLM_033, watermark=VLLM_WATERMARK)
VLLM_033_NO_RESERVE = dataclasses.replace(VLLM_033, full_sequence_admission=False)
VLLM_033_ADAPTIVE = dataclasses.replace(VLLM_033, adaptive_threshold=True)
VLLM_033_CADENCE = dataclasses.replace(VLLM_033, prefill_interval=VLLM_PREFILL_INTERVAL)
#: ... and the candidate fix of the cadence finding (`lift_empty_hold`).
VLLM_033_CADENCE_FIXED = dataclasses.replace(VLLM_033_CADENCE, lift_empty_hold=True)
#: vLLM's options with 0.34.0's cache-aware admission (its other decisions are 0.33.0's).
VLLM_034_CACHE_AWARE = dataclasses.replace(
    VLLM_033,
    cache_aware_window=VLLM_CACHE_AWARE_WINDOW,
    cache_aware_threshold=VLLM_CACHE_AWARE_THRESHOLD,
)

#: What vLLM 0.33.0 declares with its defaults (as `vllm-v1-prefix`).
_VLLM_POLICY = ArPolicy(
    lone_request_threshold_exempt=True, full_sequence_admission=True, admission_progress=True
)


#: The vLLM options each reference twin's factory runs, for `with_vllm_settings`: `vllm-v1`'s
#: and `vllm-v1-prefix`'s (vLLM 0.33.0's), and each variant's (added as `_variant` builds it).
_OPTIONS_OF: dict[ArImplementationFactory, VllmOptions] = {
    make_vllm_v1_033: VLLM_033,
    make_vllm_v1_prefix: VLLM_033,
}


def vllm_settings_of(factory: ArImplementationFactory) -> ArPolicy | None:
    """The vLLM settings the reference twin `factory` runs (`vllm-v1`, `vllm-v1-prefix` or a
    variant of this module; None for any other factory), as the `ArPolicy` options that
    declare them: what a bare factory of one runs, though it declares no policy."""
    options = _OPTIONS_OF.get(factory)
    if options is None:
        return None
    watermark = bool(options.watermark)
    return ArPolicy(
        watermark_fraction=options.watermark,
        watermark_of_pool=watermark,
        watermark_beside_running=watermark,
        adaptive_long_prefill_threshold=options.adaptive_threshold,
        prefill_interval=options.prefill_interval,
        full_sequence_admission=options.full_sequence_admission,
        cache_aware_window=options.cache_aware_window,
        cache_aware_threshold=options.cache_aware_threshold,
        hash_lookahead_tokens=options.hash_lookahead,
    )


def with_vllm_settings(
    factory: ArImplementationFactory, settings: ArPolicy
) -> ArImplementationFactory | None:
    """The reference twin `factory` (`vllm-v1`, `vllm-v1-prefix` or a variant of this module,
    the very function: a wrapper of one is another scheduler) with vLLM's scheduler settings as
    `settings` declares them: its watermark, adaptive long-prefill threshold, prefill cadence,
    whole-sequence reservation, cache-aware window and threshold, and the tokens after a block
    its cache keys cover (`hash_lookahead_tokens`); its other options (a
    candidate fix included) kept. None when `factory` is none of these, or `settings` declares
    a watermark other than vLLM's (of the whole pool, binding beside a running request)."""
    base = _OPTIONS_OF.get(factory)
    if base is None or not has_vllms_watermark(settings):
        return None
    options = dataclasses.replace(
        base,
        watermark=settings.watermark_fraction,
        adaptive_threshold=settings.adaptive_long_prefill_threshold,
        prefill_interval=settings.prefill_interval,
        full_sequence_admission=settings.full_sequence_admission,
        cache_aware_window=settings.cache_aware_window,
        cache_aware_threshold=settings.cache_aware_threshold,
        hash_lookahead=settings.hash_lookahead_tokens,
    )

    def with_settings(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        # without prefix caching the prefix-caching reference is `vllm-v1` itself
        return PrefixCachingVllmV1(config, sink, options)

    return with_settings


def has_vllms_watermark(settings: ArPolicy) -> bool:
    """Whether `settings` declares no watermark or vLLM's (of the whole pool, binding beside a
    running request): the settings vLLM's reference twins can take."""
    vllms = settings.watermark_of_pool and settings.watermark_beside_running
    return not settings.watermark_fraction or vllms


def _variant(
    options: VllmOptions,
    policy: ArPolicy,
    setting: str,
    policies: frozenset[Policy] | None = None,
    cache_read_limits: CacheReadLimits = CacheReadLimits.NONE,
) -> ArImplementation:
    """The reference with `options`, prefix caching off or on, declaring `policy` (and the
    per-request cache read limits `cache_read_limits`, which it always honours), serving
    LoRA adapters."""

    def factory(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        return PrefixCachingVllmV1(config, sink, options)

    _OPTIONS_OF[factory] = options
    both = frozenset({False, True})
    space = ArConfigSpace(
        policies=frozenset(Policy) if policies is None else policies,
        prefix_caching=both,
        cache_read_limits=cache_read_limits,
        max_loras=None,
    )
    return ArImplementation(
        factory,
        ArProfile(space=space, policy=policy),
        f"the reference vLLM-v1-style scheduler with vLLM 0.33.0's options and {setting}, "
        "prefix caching off or on",
    )


VLLM_V1_WATERMARK = _variant(
    VLLM_033_WATERMARK,
    dataclasses.replace(
        _VLLM_POLICY,
        watermark_fraction=VLLM_WATERMARK,
        watermark_of_pool=True,
        watermark_beside_running=True,
    ),
    f"its watermark ({VLLM_WATERMARK} of the pool, binding beside a running request); "
    "decision-identical to `real-vllm-watermark` (verify --twin)",
)
VLLM_V1_NO_RESERVE = _variant(
    VLLM_033_NO_RESERVE,
    dataclasses.replace(_VLLM_POLICY, full_sequence_admission=False),
    "no whole-sequence admission gate (scheduler_reserve_full_isl=False); decision-identical to "
    "`real-vllm-no-reserve` (verify --twin)",
)
VLLM_V1_ADAPTIVE = _variant(
    VLLM_033_ADAPTIVE,
    dataclasses.replace(_VLLM_POLICY, adaptive_long_prefill_threshold=True),
    "its adaptive long-prefill threshold (floored at a fair share of the budget); "
    "decision-identical to `real-vllm-adaptive` (verify --twin)",
)
VLLM_V1_CADENCE = _variant(
    VLLM_033_CADENCE,
    dataclasses.replace(_VLLM_POLICY, prefill_interval=VLLM_PREFILL_INTERVAL),
    f"its local prefill cadence (prefill_schedule_interval={VLLM_PREFILL_INTERVAL}); "
    "decision-identical to vLLM with that interval (`integrations.vllm:REAL_VLLM_CADENCE`, "
    "verify --twin), an empty held step included (a vLLM finding, docs/engines/vllm.md)",
    policies=frozenset({Policy.FCFS, Policy.PRIORITY}),
)

VLLM_V1_CADENCE_FIXED = _variant(
    VLLM_033_CADENCE_FIXED,
    VLLM_V1_CADENCE.profile.policy,
    f"its local prefill cadence (prefill_schedule_interval={VLLM_PREFILL_INTERVAL}) with the "
    "candidate fix `lift-empty-hold`; decision-identical to vLLM with that interval and the "
    "fix (`integrations.vllm:REAL_VLLM_CADENCE_FIXED`, verify --twin)",
    policies=frozenset({Policy.FCFS, Policy.PRIORITY}),
)

VLLM_V1_CACHE_AWARE = _variant(
    VLLM_034_CACHE_AWARE,
    dataclasses.replace(
        _VLLM_POLICY,
        cache_aware_window=VLLM_CACHE_AWARE_WINDOW,
        cache_aware_threshold=VLLM_CACHE_AWARE_THRESHOLD,
    ),
    f"vLLM 0.34.0's cache-aware admission (cache_aware_admission_window="
    f"{VLLM_CACHE_AWARE_WINDOW}, threshold {VLLM_CACHE_AWARE_THRESHOLD}); decision-identical to "
    "vLLM 0.34.0 with that window (`integrations.vllm:REAL_VLLM_CACHE_AWARE`, verify --twin), "
    "but ranking a request by the cached prefix it may read (its cache_read_limit): a vLLM "
    "finding, docs/engines/vllm-0.34.md",
    policies=frozenset({Policy.FCFS, Policy.PRIORITY}),
    cache_read_limits=CacheReadLimits.BOUNDED,
)

#: Each variant's factory, for `--impl module:callable`.
make_vllm_v1_watermark: ArImplementationFactory = VLLM_V1_WATERMARK.factory
make_vllm_v1_no_reserve: ArImplementationFactory = VLLM_V1_NO_RESERVE.factory
make_vllm_v1_adaptive: ArImplementationFactory = VLLM_V1_ADAPTIVE.factory
make_vllm_v1_cadence: ArImplementationFactory = VLLM_V1_CADENCE.factory
make_vllm_v1_cadence_fixed: ArImplementationFactory = VLLM_V1_CADENCE_FIXED.factory
make_vllm_v1_cache_aware: ArImplementationFactory = VLLM_V1_CACHE_AWARE.factory

__all__ = [
    "VLLM_033_ADAPTIVE",
    "VLLM_033_CADENCE",
    "VLLM_033_CADENCE_FIXED",
    "VLLM_033_NO_RESERVE",
    "VLLM_033_WATERMARK",
    "VLLM_034_CACHE_AWARE",
    "VLLM_CACHE_AWARE_THRESHOLD",
    "VLLM_CACHE_AWARE_WINDOW",
    "VLLM_PREFILL_INTERVAL",
    "VLLM_V1_ADAPTIVE",
    "VLLM_V1_CACHE_AWARE",
    "VLLM_V1_CADENCE",
    "VLLM_V1_CADENCE_FIXED",
    "VLLM_V1_NO_RESERVE",
    "VLLM_V1_WATERMARK",
    "VLLM_WATERMARK",
    "has_vllms_watermark",
    "make_vllm_v1_adaptive",
    "make_vllm_v1_cache_aware",
    "make_vllm_v1_cadence",
    "make_vllm_v1_cadence_fixed",
    "make_vllm_v1_no_reserve",
    "make_vllm_v1_watermark",
    "vllm_settings_of",
    "with_vllm_settings",
]
