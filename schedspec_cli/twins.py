"""`verify --twin NAME|module:attribute` -> a decision twin of the implementations' family.

A decision twin makes the same run's decisions a second time; the two must agree (rule
`twin_decisions`).

dLLM (`properties.verify.DllmTwin`): the twin takes one run's events and config and returns a
factory for a scheduler that denoises exactly as that run did, so only the scheduling decisions
(whom to admit when, which blocks each forward runs) can differ.
- A built-in name: a built-in that declares a twin (`Builtin.twin`), checked against the spec
  under that built-in's own profile (the twin of `sglang-dllm-order` is not work-conserving,
  whatever the implementation it checks declares).
- `module:attribute`: a `DecisionTwin` of the user's own (e.g. `reference.dllm.replaying_twin(
  MyScheduler, MY_POLICY)`), checked under the implementation's profile. It is called once for
  an empty run before any example, so an implementation factory named by mistake (it too takes
  two arguments) is an input error, not a failure in every example.

AR (`properties.verify.ArTwin`): an AR scheduler is deterministic given its operations, so the
twin is any AR implementation: a built-in (`vllm-v1` for `real-vllm`) or `module:attribute`
naming an `ArImplementation`, checked under its own profile's policy, or a bare factory, which
declares none and is checked under the implementation's. It is built once for the default
configuration before any example, so a factory of the other family is an input error.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Sequence
from typing import Any

from properties.deadline import CallDeadlineExceeded, TwinHung, call_deadline
from properties.decisions import DecisionTwin
from properties.strategies import drawn_prefix_cache
from properties.verify import ArTwin, DllmTwin, Twin
from schedspec_cli.impls import ADAPTER_METHODS, Resolved, load_engine, resolve, resolve_builtin
from schedspec_cli.loader import load_object
from schedspec_cli.registry import BUILTINS
from schedspec_cli.twin_settings import window_applies_in, with_settings
from spec.ar.config import ArConfig
from spec.ar.profile import ArProfile
from spec.config import DllmConfig, Mode
from spec.errors import ConfigError
from spec.implementation import ArImplementation, Family, family_of_factory
from spec.profile import DllmProfile


def twin_names(family: Family) -> list[str]:
    """The built-ins that serve as `--twin NAME` for implementations of `family`."""
    if family is Family.AR:
        return sorted(b.name for b in BUILTINS.values() if b.family is Family.AR)
    return sorted(b.name for b in BUILTINS.values() if b.twin)


def twin_for_targets(
    name: str,
    targets: Sequence[Resolved],
    modes: frozenset[Mode] | None = None,
    *,
    loras: bool = False,
) -> Twin:
    """`--twin` for a run of `targets`: they must be of one family; a real engine named as
    the twin must be installed; a twin that declares a space must run every configuration
    drawn for each target (dLLM: in `modes`, `--mode`'s, when given; AR: with LoRA adapter
    slots only where `loras`, `--loras`, draws them), as `check-trace` asks of a log's, or
    every example outside it would fail as a finding that is none (each target's settings:
    `twin_for_target`)."""
    families = {t.family for t in targets}
    if len(families) > 1:
        names = ", ".join(f"{t.name} ({t.family.value})" for t in targets)
        raise ConfigError("--twin", name, f"--impl targets of one family ({names})")
    twin = installed_twin(name, targets[0].family)
    if isinstance(twin, ArTwin) and twin.space is not None:
        for t in targets:
            profile = t.implementation.profile
            if isinstance(profile, ArProfile):
                # without --loras the suite draws max_loras 0 whatever the space serves
                drawn_ar = (
                    profile.space if loras else dataclasses.replace(profile.space, max_loras=0)
                )
                _refuse_uncovered(name, t.name, twin.space.uncovered(drawn_ar))
    if isinstance(twin, DllmTwin) and isinstance(twin.profile, DllmProfile):
        for t in targets:
            profile = t.implementation.profile
            if not isinstance(profile, DllmProfile):
                continue
            drawn = dataclasses.replace(
                profile.space, prefix_cache=drawn_prefix_cache(profile.space)
            )
            _refuse_uncovered(name, t.name, twin.profile.space.uncovered(drawn, modes))
    return twin


def twin_for_target(twin: Twin, target: Resolved) -> tuple[Twin, str]:
    """The twin to run beside `target`, and a note ("" for none): an AR twin with the settings
    `target`'s profile declares (`schedspec_cli.twin_settings.with_settings`: a vLLM reference
    twin takes them; the note names those another twin runs otherwise); a bare factory
    declares none, and a dLLM twin runs as it is."""
    profile = target.implementation.profile
    if not isinstance(twin, ArTwin) or not isinstance(profile, ArProfile):
        return twin, ""
    if target.builtin is None and not isinstance(
        load_object(target.target, "impl"), ArImplementation
    ):
        return twin, ""  # a bare factory: checked under no declared policy
    return with_settings(twin, profile.policy, window_applies_in(profile.space), target.name)


def _refuse_uncovered(twin: str, target: str, gap: str | None) -> None:
    """A twin whose declared space lacks `gap` of `target`'s is a bad `--twin`."""
    if gap is not None:
        raise ConfigError(
            "--twin",
            twin,
            f"a twin that runs every configuration {target} is checked in ({twin} declares no "
            f"{gap})",
        )


def installed_twin(name: str, family: Family) -> Twin:
    """`resolve_twin`, and a real engine named as the twin must be installed (`verify --impl`
    runs and `check-trace` logs alike)."""
    twin = resolve_twin(name, family)
    builtin = BUILTINS.get(name)
    if builtin is not None and builtin.engine:
        load_engine(builtin.engine, name)
    return twin


def resolve_twin(name: str, family: Family) -> Twin:
    """Resolve `--twin` for implementations of `family` (raises ConfigError naming `--twin` and
    what would be valid)."""
    valid = f"a built-in {twin_names(family)} or 'module:attribute'"
    builtin = BUILTINS.get(name)
    if builtin is not None and builtin.family is not family:
        raise ConfigError(
            "--twin",
            name,
            f"a twin of the {family.value} family ({name} is {builtin.family.value}): {valid}",
        )
    if builtin is None and ":" not in name:
        raise ConfigError("--twin", name, valid)
    if family is Family.AR:
        return _ar_twin(name)
    if builtin is not None:
        if not builtin.twin:
            raise ConfigError(
                "--twin",
                name,
                f"a built-in with a decision twin ({name} has none): one of "
                f"{twin_names(family)}, or 'module:attribute'",
            )
        profile: Any = resolve_builtin(builtin).implementation.profile
        return DllmTwin(name, _callable_twin(builtin.twin), profile)
    return DllmTwin(name, _callable_twin(name), None)


#: Per real engine whose built-ins run a user's scheduler class: the built-ins that decide as
#: its stock release instead (pure-Python references of its policy).
STOCK_TWINS = {
    "vllm": "--twin vllm-v1 (vllm-v1-prefix with prefix caching)",
    "vidur": (
        "--twin vidur-sarathi-released for a Sarathi class; the other kinds' twins "
        "(vidur-vllm-released, vidur-orca, ...) decide as their release with its findings "
        "fixed, so run those on an install patched by scripts/engine_fixes_diff.py vidur"
    ),
}


def _refuse_the_users_own_class(name: str) -> None:
    """A real-engine built-in as `--twin` while the engine's scheduler class variable names a
    class of the user's: the twin would build that class too, comparing it with itself (and
    passing whatever it decides), or refuse it when it is of another kind. `ConfigError` naming
    the variable and the stock twins."""
    builtin = BUILTINS.get(name)
    if builtin is None or builtin.engine not in STOCK_TWINS:
        return
    module = importlib.import_module(f"integrations.{builtin.engine}.custom_scheduler")
    variable: str = module.SCHEDULER_VARIABLE
    chosen = module.selected_class(variable)
    if chosen is not None:
        raise ConfigError(
            "--twin",
            name,
            f"a twin that does not build your class: with {variable}={chosen} set, {name} "
            f"builds that class in place of {builtin.engine}'s own (or refuses it, when it is "
            f"of another kind), so it is never the stock release; to compare your class with "
            f"the stock release: {STOCK_TWINS[builtin.engine]} (or unset {variable})",
        )


def _ar_twin(name: str) -> ArTwin:
    _refuse_the_users_own_class(name)
    if name not in BUILTINS:
        _refuse_non_factory(load_object(name, "--twin"), name)
    try:
        resolved = resolve(name, Family.AR)
    except ConfigError as err:  # named for the flag the user gave
        raise ConfigError("--twin", name, err.valid) from None
    impl: Any = resolved.implementation
    _probe_ar(impl.factory, name)
    if resolved.builtin is None and not isinstance(load_object(name, "--twin"), ArImplementation):
        return ArTwin(name, impl.factory, None)  # a bare factory declares no policy of its own
    return ArTwin(name, impl.factory, impl.profile.policy, impl.profile.space)


AR_TWIN = "an AR implementation (ArImplementation) or a factory (config, sink) -> AR adapter"


def _refuse_non_factory(obj: object, target: str) -> None:
    """What the probe build cannot tell (it takes a `ConfigError` for a configuration the
    factory does not support): a class whose instances are no AR adapter (`spec:DllmConfig`
    refuses an `ArConfig` as its block size), or a factory annotated as a dLLM one."""
    if isinstance(obj, type):
        missing = _missing_methods(obj, Family.AR)
        if missing:
            raise ConfigError(
                "--twin",
                target,
                f"{AR_TWIN}: {obj.__name__} is a class whose instances lack {', '.join(missing)}",
            )
    elif callable(obj) and family_of_factory(obj) is Family.DLLM:
        raise ConfigError("--twin", target, f"{AR_TWIN}: this factory takes a DllmConfig")


def _probe_ar(factory: Any, target: str) -> None:
    """Build the twin once for the default configuration: a factory of the other family (it
    too takes two arguments) fails here, in one line, instead of failing every example."""
    try:
        with call_deadline("being built"):
            adapter = factory(ArConfig(), lambda e: None)
    except CallDeadlineExceeded as hang:
        raise ConfigError(
            "--twin", target, f"a twin that returns ({TwinHung(hang.what, hang.seconds)})"
        ) from None
    except ConfigError:
        return  # a configuration it does not support: the examples it does support will run
    except Exception as err:  # whatever a wrong object raises, it is an input error
        raise ConfigError(
            "--twin",
            target,
            f"an AR implementation or factory (building it raised {type(err).__name__}: {err})",
        ) from None
    missing = _missing_methods(adapter, Family.AR)
    if missing:
        raise ConfigError(
            "--twin",
            target,
            f"an AR implementation or factory (it built a {type(adapter).__name__}, lacking "
            f"{', '.join(missing)})",
        )


def _callable_twin(target: str) -> DecisionTwin:
    obj = load_object(target, "--twin")
    what = "a decision twin: a callable taking (events, config) and returning a factory"
    if not callable(obj) or isinstance(obj, type):
        raise ConfigError("--twin", target, f"{what} (got {type(obj).__name__})")
    try:
        inspect.signature(obj).bind(None, None)
    except TypeError:
        raise ConfigError("--twin", target, what) from None
    except ValueError:  # no signature to inspect: the probe below will tell
        pass
    twin: DecisionTwin = obj
    _probe(twin, target, what)
    return twin


def _probe(twin: DecisionTwin, target: str, what: str) -> None:
    """Call the twin once for an empty run: an implementation factory named by mistake fails
    here, in one line, instead of failing every example."""
    try:
        with call_deadline("being given an empty run"):
            factory: object = twin((), DllmConfig())
    except CallDeadlineExceeded as hang:
        raise ConfigError(
            "--twin", target, f"a twin that returns ({TwinHung(hang.what, hang.seconds)})"
        ) from None
    except Exception as err:  # whatever a wrong object raises, it is an input error
        raise ConfigError(
            "--twin", target, f"{what} (calling it raised {type(err).__name__}: {err})"
        ) from None
    if (
        not callable(factory)
        or isinstance(factory, type)
        or not _missing_methods(factory, Family.DLLM)
    ):
        raise ConfigError(
            "--twin", target, f"{what} (it returned {type(factory).__name__}, not a factory)"
        )


def _missing_methods(obj: object, family: Family) -> list[str]:
    """The methods of `family`'s adapter protocol that `obj` lacks."""
    return [m for m in ADAPTER_METHODS[family] if not callable(getattr(obj, m, None))]


__all__ = ["installed_twin", "resolve_twin", "twin_for_target", "twin_for_targets", "twin_names"]
