"""`verify --twin NAME|module:attribute` -> a decision twin and the profile it is checked under.

A decision twin (`properties.decisions.DecisionTwin`) takes one run's events and config and
returns a factory for a scheduler that denoises exactly as that run did, so the two can differ
only in what they decide: whom they admit when, and which blocks each forward runs (rule
`twin_decisions`).

- A built-in name: a built-in that declares a twin (`Builtin.twin`), checked against the spec
  under that built-in's own profile (the twin of `sglang-dllm-order` is not work-conserving,
  whatever the implementation it checks declares).
- `module:attribute`: a `DecisionTwin` of the user's own (e.g. `reference.dllm.replaying_twin(
  MyScheduler, MY_POLICY)`), checked under the implementation's profile: the twin must decide as
  the implementation does, so it lives in the same declared space.

The twin is loaded and its signature checked before any example runs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from properties.decisions import DecisionTwin
from schedspec_cli.loader import load_object
from schedspec_cli.registry import BUILTINS
from spec.config import DllmConfig
from spec.errors import ConfigError
from spec.profile import DllmProfile


@dataclass(frozen=True, slots=True)
class ResolvedTwin:
    """What `--twin` named: its display name, the twin, and the profile it is checked under
    (None: the implementation's own)."""

    name: str
    twin: DecisionTwin
    profile: DllmProfile | None


def twin_names() -> list[str]:
    """The built-ins that serve as `--twin NAME`."""
    return sorted(b.name for b in BUILTINS.values() if b.twin)


def resolve_twin(name: str) -> ResolvedTwin:
    """Resolve `--twin` (raises ConfigError naming `--twin` and what would be valid)."""
    valid = f"a built-in with a decision twin {twin_names()} or 'module:attribute'"
    builtin = BUILTINS.get(name)
    if builtin is not None and builtin.twin:
        from schedspec_cli.impls import resolve_builtin

        profile: Any = resolve_builtin(builtin).implementation.profile
        return ResolvedTwin(name, _callable_twin(builtin.twin), profile)
    if ":" not in name:
        raise ConfigError("--twin", name, valid)
    return ResolvedTwin(name, _callable_twin(name), None)


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
    """Call the twin once for an empty run: an implementation factory named by mistake (it
    also takes two arguments) fails here, in one line, instead of failing every example."""
    try:
        factory: object = twin((), DllmConfig())
    except Exception as err:  # whatever a wrong object raises, it is an input error
        raise ConfigError(
            "--twin", target, f"{what} (calling it raised {type(err).__name__}: {err})"
        ) from None
    if not callable(factory) or isinstance(factory, type) or _is_adapter(factory):
        raise ConfigError(
            "--twin", target, f"{what} (it returned {type(factory).__name__}, not a factory)"
        )


def _is_adapter(obj: object) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("submit", "run_round", "snapshot"))


__all__ = ["ResolvedTwin", "resolve_twin", "twin_names"]
