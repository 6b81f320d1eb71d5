"""Implementation profiles for autoregressive schedulers: what an implementation supports and
promises.

As for dLLM (`spec.profile`), an AR implementation declares beside its factory:

- its configuration space (`ArConfigSpace`): strategies draw only inside it; a configuration
  outside it is refused with `spec.profile.ConfigOutsideProfile`;
- its policy (`ArPolicy`): the ordering rules (`ArRules`) plus named options the rules take as
  parameters, each citing the engine behaviour that motivates it;
- its accepted deviations (`spec.profile.AcceptedDeviation`).

The AR engineer of this round extends `ArPolicy` with the options real engines need (vLLM's
lone-request threshold exemption, victim choice among all running requests, the full-sequence
admission gate, prefix caching; Vidur's same-step re-admission after preemption) — each a
typed, documented field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from spec.ar.config import ArConfig, ArRules, Policy
from spec.profile import AcceptedDeviation, ConfigOutsideProfile, ProfileError


@dataclass(frozen=True, slots=True)
class ArConfigSpace:
    """The `ArConfig` values an implementation supports.

    policies: the scheduling policies it implements.
    block_sizes: allowed KV block sizes; None = any (LightLLM is token-level: {1}).
    chunked_prefill: the `enable_chunked_prefill` values it supports.
    null_block: the `reserve_null_block` values it supports (vLLM: block 0 is always the null
        block: {True}).
    """

    policies: frozenset[Policy] = frozenset(Policy)
    block_sizes: frozenset[int] | None = None
    chunked_prefill: frozenset[bool] = frozenset({False, True})
    null_block: frozenset[bool] = frozenset({False, True})

    def __post_init__(self) -> None:
        if not self.policies:
            raise ProfileError("space.policies", "{}", "at least one policy")
        if not self.chunked_prefill or not self.null_block:
            raise ProfileError("space", "an empty switch set", "non-empty subsets of {False, True}")
        if self.block_sizes is not None and (
            not self.block_sizes or any(b < 1 for b in self.block_sizes)
        ):
            raise ProfileError(
                "space.block_sizes", sorted(self.block_sizes), "positive integers or None"
            )

    def outside(self, config: ArConfig) -> tuple[str, object, str] | None:
        """(field, value, declared space) of the first field outside the space, else None."""
        if config.policy not in self.policies:
            return ("policy", config.policy.value, _names(p.value for p in self.policies))
        if self.block_sizes is not None and config.block_size not in self.block_sizes:
            return ("block_size", config.block_size, _names(map(str, self.block_sizes)))
        if config.enable_chunked_prefill not in self.chunked_prefill:
            return (
                "enable_chunked_prefill",
                config.enable_chunked_prefill,
                _names(map(str, self.chunked_prefill)),
            )
        if config.reserve_null_block not in self.null_block:
            return (
                "reserve_null_block",
                config.reserve_null_block,
                _names(map(str, self.null_block)),
            )
        return None

    def check(self, config: ArConfig) -> None:
        """Raise `ConfigOutsideProfile` naming the field if `config` is outside the space."""
        bad = self.outside(config)
        if bad is not None:
            name, value, valid = bad
            raise ConfigOutsideProfile(name, value, f"the implementation's declared space: {valid}")


@dataclass(frozen=True, slots=True)
class ArPolicy:
    """Deliberate policy choices; `ArSpecMachine` takes them as parameters.

    rules: the ordering rules (admission order, victim, ...); None = `rules_for(config)`, the
        vLLM-v1-style rules of the configured policy.
    """

    rules: ArRules | None = None


@dataclass(frozen=True, slots=True)
class ArProfile:
    """What an AR implementation supports (`space`), promises (`policy`) and knowingly breaks
    (`deviations`). `ArProfile()` is the idealised spec."""

    space: ArConfigSpace = field(default_factory=ArConfigSpace)
    policy: ArPolicy = field(default_factory=ArPolicy)
    deviations: tuple[AcceptedDeviation, ...] = ()

    def __post_init__(self) -> None:
        rules = [d.rule for d in self.deviations]
        if len(set(rules)) != len(rules):
            raise ProfileError("deviations", rules, "each rule listed once")

    def accepted(self, rule: str) -> AcceptedDeviation | None:
        return next((d for d in self.deviations if d.rule == rule), None)


def _names(values: Iterable[object]) -> str:
    return "{" + ", ".join(sorted(str(v) for v in values)) + "}"


__all__ = ["ArConfigSpace", "ArPolicy", "ArProfile", "ConfigOutsideProfile"]
