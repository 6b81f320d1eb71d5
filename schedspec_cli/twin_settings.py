"""An AR decision twin run with the scheduler settings of what it is compared with.

A watermark, the adaptive long-prefill threshold, a prefill cadence, the whole-sequence
reservation, vLLM 0.34.0's cache-aware window and threshold, and the tokens after a block its
cache keys cover (`hash_lookahead_tokens`, 1 beside an EAGLE drafter) are settings an operator
picks (`AR_SETTINGS`), declared in an `ArPolicy`: a log's header (`check-trace --twin`) or an
implementation's profile (`verify --twin`). A setting counts as declared where it differs
from the idealised spec's (`ArPolicy()`), or where a header writes it out at that value
(`stated`: the live vLLM log writes `"full_sequence_admission": false` for a vLLM that
reserves no whole sequence); a setting a header leaves out says nothing (a header of
`{"lone_request_threshold_exempt": true}` does not say its engine reserves no whole
sequence). `with_settings`:

- keeps the twin when it runs every declared setting;
- rebuilds a vLLM reference twin (`vllm-v1`, `vllm-v1-prefix`, a `reference.ar.vllm_settings`
  variant, or the bare factory of one) with the declared settings it runs otherwise
  (`reference.ar.vllm_settings.with_vllm_settings`), its other settings and options kept,
  recording what it took (`ArTwin.took`);
- otherwise (another twin, or a setting vLLM does not have) keeps the twin, and says which
  declared settings it runs otherwise: a difference it finds may come from them.

Settings no decision reads are not compared: the cache-aware window where vLLM applies none
(other than FCFS with prefix caching), its threshold without a window, and, for a log, a
watermark by the blocks it keeps free in the log's pool (Vidur's 0.01 of fewer than 100 blocks
keeps none) and its kind only where it keeps some. `--twin-as-declared` skips all this: the
twin runs as it declares itself.
"""

from __future__ import annotations

import dataclasses

from properties.verify import ArTwin
from schedspec_cli.impls import checked_factory
from spec.ar.config import ArConfig, Policy
from spec.ar.profile import ArConfigSpace, ArPolicy

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
    "hash_lookahead_tokens",
)
_WATERMARK_KIND = ("watermark_of_pool", "watermark_beside_running")


def window_applies(config: ArConfig) -> bool:
    """Whether vLLM applies a cache-aware window under `config`: FCFS with prefix caching."""
    return config.policy is Policy.FCFS and config.enable_prefix_caching


def window_applies_in(space: ArConfigSpace) -> bool:
    """Whether some configuration of `space` is one where vLLM applies a cache-aware window."""
    return Policy.FCFS in space.policies and True in space.prefix_caching


def settings_in_effect(
    policy: ArPolicy, window: bool, config: ArConfig | None = None
) -> dict[str, object]:
    """`policy`'s `AR_SETTINGS` that bear on decisions: the cache-aware window only where one
    applies (`window`) and its threshold only with a window; a watermark's kind only with a
    watermark. Under `config` (a log's) the watermark is the blocks it keeps free there
    (`watermark_blocks`, its kind folded in), and where it keeps none it has no kind."""
    in_effect = {name: getattr(policy, name) for name in AR_SETTINGS}
    if config is not None:
        del in_effect["watermark_fraction"], in_effect["watermark_of_pool"]
        in_effect = {"watermark_blocks": policy.watermark_blocks(config), **in_effect}
        watermark = bool(in_effect["watermark_blocks"])
    else:
        watermark = bool(policy.watermark_fraction)
    if not watermark:
        in_effect.pop("watermark_of_pool", None)
        del in_effect["watermark_beside_running"]
    if not window:
        in_effect["cache_aware_window"] = 0
    if not in_effect["cache_aware_window"]:
        del in_effect["cache_aware_threshold"]
    return in_effect


def declared(policy: ArPolicy, stated: frozenset[str] = frozenset()) -> list[str]:
    """The `AR_SETTINGS` `policy` declares: those off the idealised default, those in `stated`
    (a header wrote them out), a watermark's kind with its watermark, and the threshold with a
    window (a header leaves out a threshold of 0.5, the default, and still declares it)."""
    idle = ArPolicy()
    names = []
    for name in AR_SETTINGS:
        if name in stated:
            said = True
        elif name in _WATERMARK_KIND:
            said = bool(policy.watermark_fraction)
        elif name == "cache_aware_threshold":
            said = bool(policy.cache_aware_window) or policy.cache_aware_threshold != (
                idle.cache_aware_threshold
            )
        else:
            said = getattr(policy, name) != getattr(idle, name)
        if said:
            names.append(name)
    return names


def with_settings(
    twin: ArTwin,
    settings: ArPolicy | None,
    window: bool,
    whose: str,
    config: ArConfig | None = None,
    stated: frozenset[str] = frozenset(),
) -> tuple[ArTwin, str]:
    """The twin to compare with what declares `settings` (None: declares none, and `twin` runs
    as it is), and a note ("" when none) naming the declared settings it runs otherwise;
    `whose` names what declares them ("the log", an implementation); `window`: whether a
    cache-aware window applies there; `config`: the log's configuration, where there is one;
    `stated`: the settings a header wrote out, declared at any value. See the module
    docstring."""
    from reference.ar.vllm_settings import vllm_settings_of, with_vllm_settings

    factory = checked_factory(twin.factory)
    own = twin.policy if twin.policy is not None else vllm_settings_of(factory)
    if settings is None or own is None:
        return twin, ""
    # the twin's own settings, with those declared put in: what it should run
    named = declared(settings, stated)
    wanted = dataclasses.replace(own, **{n: getattr(settings, n) for n in named})
    ours = settings_in_effect(own, window, config)
    theirs = settings_in_effect(wanted, window, config)
    differing = [n for n in {**theirs, **ours} if ours.get(n) != theirs.get(n)]
    # a watermark's kind where only one side keeps a watermark is said by the watermark
    shown = [n for n in differing if n not in _WATERMARK_KIND or (n in ours and n in theirs)]
    if not differing:
        return twin, ""
    rebuilt = with_vllm_settings(factory, wanted)
    if rebuilt is None:
        said = "; ".join(
            f"{n}: {whose} {theirs.get(n, '-')!r}, the twin {ours.get(n, '-')!r}"
            for n in shown or differing
        )
        return twin, (
            f"{twin.name} runs its own settings, not those {whose} declares ({said}): a "
            "difference it finds may come from them"
        )
    took = tuple(_as_declared(n, wanted, theirs) for n in shown or differing if n in theirs)
    policy = None  # a bare factory runs under the policy of what it is compared with
    if twin.policy is not None:
        policy = dataclasses.replace(twin.policy, **{n: getattr(wanted, n) for n in AR_SETTINGS})
    return ArTwin(twin.name, rebuilt, policy, twin.space, took), ""


def _as_declared(name: str, settings: ArPolicy, in_effect: dict[str, object]) -> tuple[str, object]:
    """`(name, value)` as `settings` declares it (a log's watermark: its fraction)."""
    if name == "watermark_blocks":
        return "watermark_fraction", settings.watermark_fraction
    return name, in_effect[name]


__all__ = [
    "AR_SETTINGS",
    "declared",
    "settings_in_effect",
    "window_applies",
    "window_applies_in",
    "with_settings",
]
