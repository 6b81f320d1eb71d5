"""An AR decision twin run with the scheduler settings of what it is compared with.

A watermark, the adaptive long-prefill threshold, a prefill cadence, the whole-sequence
reservation and vLLM 0.34.0's cache-aware window and threshold are settings an operator picks
(`AR_SETTINGS`), declared in an `ArPolicy`: a log's header (`check-trace --twin`) or an
implementation's profile (`verify --twin`). A twin run with other settings decides otherwise by
construction, which says nothing of the scheduler, so `with_settings`:

- keeps the twin when its settings in effect are those compared with;
- rebuilds a vLLM reference twin (`vllm-v1`, `vllm-v1-prefix`, a `reference.ar.vllm_settings`
  variant) with them (`reference.ar.vllm_settings.with_vllm_settings`), named with them;
- refuses any other twin (`ConfigError`, exit 2), naming each setting with both values.

Settings no decision reads are not compared: the cache-aware window where vLLM applies none
(other than FCFS with prefix caching), its threshold without a window, a watermark's kind
without a watermark.
"""

from __future__ import annotations

import dataclasses

from properties.verify import ArTwin
from spec.ar.config import ArConfig, Policy
from spec.ar.profile import ArConfigSpace, ArPolicy
from spec.errors import ConfigError

#: The `ArPolicy` fields that are an engine's settings (options an operator sets) rather than
#: its fixed rules.
AR_SETTINGS = (
    "watermark_fraction",
    "watermark_of_pool",
    "watermark_beside_running",
    "adaptive_long_prefill_threshold",
    "prefill_interval",
    "full_sequence_admission",
    "cache_aware_window",
    "cache_aware_threshold",
)


def window_applies(config: ArConfig) -> bool:
    """Whether vLLM applies a cache-aware window under `config`: FCFS with prefix caching."""
    return config.policy is Policy.FCFS and config.enable_prefix_caching


def window_applies_in(space: ArConfigSpace) -> bool:
    """Whether some configuration of `space` is one where vLLM applies a cache-aware window."""
    return Policy.FCFS in space.policies and True in space.prefix_caching


def settings_in_effect(policy: ArPolicy, window: bool) -> dict[str, object]:
    """`policy`'s `AR_SETTINGS` that bear on decisions: a watermark's kind only with a
    watermark, the cache-aware window only where one applies (`window`) and its threshold only
    with a window."""
    in_effect = {name: getattr(policy, name) for name in AR_SETTINGS}
    if not policy.watermark_fraction:
        del in_effect["watermark_of_pool"], in_effect["watermark_beside_running"]
    if not window:
        in_effect["cache_aware_window"] = 0
    if not in_effect["cache_aware_window"]:
        del in_effect["cache_aware_threshold"]
    return in_effect


def with_settings(twin: ArTwin, settings: ArPolicy | None, window: bool, whose: str) -> ArTwin:
    """The twin to compare with what declares `settings` (None: declares none, and `twin` runs
    as it is), `whose` naming it ("the log", an implementation's name); `window`: whether a
    cache-aware window applies there. See the module docstring."""
    from reference.ar.vllm_settings import with_vllm_settings

    if settings is None or twin.policy is None:
        return twin
    ours = settings_in_effect(twin.policy, window)
    theirs = settings_in_effect(settings, window)
    differing = [n for n in AR_SETTINGS if ours.get(n) != theirs.get(n)]
    if not differing:
        return twin
    factory = with_vllm_settings(twin.factory, settings)
    if factory is None:
        said = "; ".join(
            f"{n}: {whose} {theirs.get(n, '-')!r}, the twin {ours.get(n, '-')!r}" for n in differing
        )
        raise ConfigError(
            "--twin",
            twin.name,
            f"a twin run with the settings {whose} declares ({said}); vLLM's reference twins "
            "(vllm-v1, vllm-v1-prefix) take them where vLLM has them (its watermark is of the "
            "whole pool, binding beside a running request)",
        )
    taken = ", ".join(f"{n}={theirs[n]!r}" for n in differing if n in theirs)
    policy = dataclasses.replace(twin.policy, **{n: getattr(settings, n) for n in AR_SETTINGS})
    owner = "the log's" if whose == "the log" else f"{whose}'s"
    return ArTwin(f"{twin.name} with {owner} {taken}", factory, policy, twin.space)


__all__ = [
    "AR_SETTINGS",
    "settings_in_effect",
    "window_applies",
    "window_applies_in",
    "with_settings",
]
