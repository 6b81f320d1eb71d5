"""`check-trace --profile` and `--twin`: an engine's declared policy, and a decision twin.

A log from a real engine breaks the idealised spec wherever the engine deliberately differs
(SGLang's dLLM path admits prefill first and holds work back), so `--profile NAME|module:
attribute` checks it under the policy that engine declares, exactly as `verify --impl` does:

- a built-in name: that built-in's profile (for AR, with the ordering rules its adapter states
  for the log's configuration); a real engine named here must be installed;
- `module:attribute`: a `DllmProfile` / `ArProfile`, or an implementation declaring one.

The profile's family must be the log's, and its declared space must hold the log's
configuration; its accepted deviations are reported, not failed. A header that declares a
policy of its own must agree with the profile.

`--twin NAME|module:attribute` (the names `verify --twin` takes, `schedspec_cli.twins`)
replays the log's operations through the twin and compares their decisions (rule
`twin_decisions`): a log that ended idle is drained by the twin too; one that stopped with work
running, or a dLLM log cut inside a round, is compared only up to its last complete round or
step. The twin must run the log's
configuration (checked before any event is read). A dLLM twin runs bare (the log was checked;
its decisions are what is compared, and the harness's whole-state comparisons would make a long
log's replay quadratic); an AR twin runs in the AR harness under its policy.

An AR log that declares its scheduler's settings (a watermark, a prefill cadence, a cache-aware
window and threshold, ...) is replayed by a twin with those settings
(`schedspec_cli.twin_settings`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from properties.verify import ArTwin, DllmTwin
from schedspec_cli.impls import require_engine, resolve_builtin
from schedspec_cli.loader import load_object
from schedspec_cli.registry import BUILTINS
from spec.ar.config import ArConfig
from spec.ar.events import ArEvent
from spec.ar.profile import ArPolicy, ArProfile
from spec.config import DllmConfig
from spec.errors import CannotDrive, ConfigError
from spec.events import Aborted, ControlReturned, Event, Submitted
from spec.implementation import ArImplementation, DllmImplementation, Family
from spec.profile import ConfigOutsideProfile, DllmProfile

Profile = DllmProfile | ArProfile


@dataclass(frozen=True, slots=True)
class TraceProfile:
    """What `--profile` named: its name, the profile, and the implementation when it named one
    (an AR policy that leaves its ordering rules open takes them from its adapter)."""

    name: str
    profile: Profile
    implementation: DllmImplementation | ArImplementation | None = None


def resolve_trace_profile(name: str, family: Family) -> TraceProfile:
    """Resolve `--profile` for a log of `family` (ConfigError naming `--profile` otherwise)."""
    names = sorted(b.name for b in BUILTINS.values() if b.family is family)
    valid = f"a built-in of the {family.value} family {names} or 'module:attribute'"
    builtin = BUILTINS.get(name)
    if builtin is None and ":" not in name:
        raise ConfigError("--profile", name, valid)
    if builtin is not None:
        if builtin.family is not family:
            raise ConfigError(
                "--profile",
                name,
                f"{valid} (the log is {family.value}, {name} is {builtin.family.value})",
            )
        if builtin.engine:
            require_engine(builtin.engine)
        impl: Any = resolve_builtin(builtin).implementation
        return TraceProfile(name, impl.profile, impl)
    obj = load_object(name, "--profile")
    kind = DllmProfile if family is Family.DLLM else ArProfile
    impl_kind = DllmImplementation if family is Family.DLLM else ArImplementation
    if isinstance(obj, kind):
        return TraceProfile(name, obj)
    if isinstance(obj, impl_kind):
        return TraceProfile(name, obj.profile, obj)
    raise ConfigError(
        "--profile",
        name,
        f"a profile ({kind.__name__}) or an implementation declaring one ({impl_kind.__name__}; "
        f"the log is {family.value}, this is a {type(obj).__name__})",
    )


def in_space(named: TraceProfile, config: DllmConfig | ArConfig) -> None:
    """The log's configuration must lie in the profile's declared space."""
    try:
        named.profile.space.check(config)  # type: ignore[arg-type]  # same family, checked
    except ConfigOutsideProfile as err:
        raise ConfigError(
            "--profile",
            named.name,
            f"a profile whose declared space holds the log's configuration ({err})",
        ) from None


def ar_policy_for(named: TraceProfile, config: ArConfig) -> ArPolicy:
    """The AR policy `named` (an AR profile) declares for `config`: an implementation's open
    ordering rules are its adapter's own for that configuration (as `verify --impl` takes
    them)."""
    policy = named.profile.policy
    if not isinstance(policy, ArPolicy):
        raise ConfigError("--profile", named.name, "an AR profile for an AR log")
    if policy.rules is not None or not isinstance(named.implementation, ArImplementation):
        return policy
    try:
        adapter = named.implementation.factory(config, lambda e: None)
    except ConfigError as err:
        raise ConfigError(
            "--profile", named.name, f"an implementation that runs the log's configuration ({err})"
        ) from None
    return dataclasses.replace(policy, rules=adapter.rules)


def dllm_log_difference(
    twin: DllmTwin, events: Sequence[Event], config: DllmConfig, ended_idle: bool
) -> str | None:
    """The first decision where the twin parts from the log, or None. The twin runs bare: the
    log was checked against the spec, and what is compared is the twin's decisions (a twin
    that raises is reported with the difference up to then); `twin_runs` checked its space.
    A log that ends idle after its last round is compared whole (the twin drained too); one
    cut short, with work running or inside a round, up to its last complete round."""
    from properties.decisions import twin_difference

    return twin_difference(
        events,
        config,
        twin.replay,
        DllmProfile(),  # unused when unchecked
        drain=ended_idle and not _ends_inside_a_round(events),
        subject="the log",
        checked=False,
    )


def _ends_inside_a_round(events: Sequence[Event]) -> bool:
    """Whether the log stops inside a round: after its last `ControlReturned` (or with none)
    comes an event other than a submission or an abort between rounds."""
    for e in reversed(events):
        if isinstance(e, ControlReturned):
            return False
        if not isinstance(e, Submitted | Aborted):
            return True
    return False


def ar_log_difference(
    twin: ArTwin,
    events: Sequence[ArEvent],
    config: ArConfig,
    policy: ArPolicy | None,
    ended_idle: bool,
    sampled_stops: Mapping[str, int],
    replays: TwinReplays | None = None,
) -> str | None:
    """The first step where the twin decides otherwise than the log, or None; the twin runs
    the log's operations under its own policy, or the log's (`policy`) when it declares none.
    `replays`: what the twin replays, where the caller found it already (`twin_replays`)."""
    from properties.ar.decisions import operations, twin_difference
    from properties.ar.harness import ArDrain

    replays = replays if replays is not None else twin_replays(twin, config)
    ops = operations(
        events, sampled_stops, config, policy, replays.outputs, replays.pauses, replays.drafts
    )
    ops += [ArDrain(10_000)] if ended_idle else []
    own = twin.policy if twin.policy is not None else policy
    return twin_difference(ops, events, config, twin.factory, own, subject="the log")


@dataclass(frozen=True, slots=True)
class TwinReplays:
    """What of a log beyond its submissions, aborts and steps an AR twin replays: hits on
    another request's named outputs (its adapter sets `names_outputs`, as the reference
    schedulers do: a conversation's next turn), an operator's pauses (it is an
    `ArPausingAdapter`, as `vllm-v1` is), and a drafter's proposals (it is an
    `ArDraftingAdapter`, as `vllm-v1` is)."""

    outputs: bool
    pauses: bool
    drafts: bool = False


def twin_replays(twin: ArTwin, config: ArConfig) -> TwinReplays:
    """What the twin, built for `config`, replays (`TwinReplays`)."""
    from spec.ar.adapter import ArDraftingAdapter, ArPausingAdapter

    adapter = twin.factory(config, lambda e: None)
    return TwinReplays(
        outputs=bool(getattr(adapter, "names_outputs", False)),
        pauses=isinstance(adapter, ArPausingAdapter),
        drafts=isinstance(adapter, ArDraftingAdapter),
    )


def twin_runs(
    twin: DllmTwin | ArTwin, config: DllmConfig | ArConfig, named: TraceProfile | None
) -> None:
    """Before any event is read: the twin must run the log's configuration (inside its own
    declared space, or the profile's `named` when it declares none; built without refusing)."""
    if isinstance(twin, ArTwin) and isinstance(config, ArConfig) and twin.space is not None:
        most = twin.space.max_loras
        if most is not None and config.max_loras > most:
            raise CannotDrive(_no_loras(twin.name, config, f"its space serves at most {most}"))
        bad = twin.space.outside(config)
        if bad is not None:  # as `verify --twin` refuses a twin not covering its configurations
            name, value, space = bad
            raise ConfigError(
                "--twin",
                twin.name,
                f"a twin whose declared space holds the log's configuration ({name}={value!r} "
                f"is outside it: the twin declares {space})",
            )
    try:
        if isinstance(twin, DllmTwin) and isinstance(config, DllmConfig):
            own = twin.profile or (named.profile if named is not None else None)
            if not isinstance(own, DllmProfile):
                own = DllmProfile()
            own.space.check(config)
            twin.replay((), config)(config, lambda e: None)
        elif isinstance(twin, ArTwin) and isinstance(config, ArConfig):
            adapter = twin.factory(config, lambda e: None)
            if config.max_loras and not getattr(adapter, "serves_loras", False):
                raise CannotDrive(
                    _no_loras(twin.name, config, "its adapter does not set `serves_loras`")
                )
    except ConfigError as err:
        raise ConfigError(
            "--twin", twin.name, f"a twin that runs the log's configuration ({err})"
        ) from None


def _no_loras(twin: str, config: ArConfig, why: str) -> str:
    """Why `twin` cannot replay a log whose requests run LoRA adapters, in one line."""
    return (
        f"the log's requests run LoRA adapters (max_loras={config.max_loras}), which {twin} "
        f"does not replay ({why}; the reference vllm-v1 serves them): check the log without "
        "--twin, or with --twin vllm-v1"
    )


__all__ = [
    "TraceProfile",
    "TwinReplays",
    "ar_log_difference",
    "ar_policy_for",
    "dllm_log_difference",
    "in_space",
    "resolve_trace_profile",
    "twin_replays",
    "twin_runs",
]
