"""How an implementation declares itself: its family, its factory and its profile.

`schedspec verify --impl module:attr` loads `attr` and hands it to `declared_implementation`:

- the preferred form is a `DllmImplementation` or `ArImplementation` object: it names the
  family in its type and carries the profile (configuration space, policy options, accepted
  deviations);
- a bare factory is accepted too when its first parameter is annotated `DllmConfig` or
  `ArConfig` (the family is read from the annotation) — it then gets the default profile, the
  idealised spec;
- `family` (the CLI's `--family`) overrides what cannot be told; otherwise a `ConfigError` says
  how to declare it.
"""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

from spec.adapter import ImplementationFactory
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig
from spec.ar.profile import ArProfile
from spec.config import DllmConfig
from spec.errors import ConfigError
from spec.profile import DllmProfile


class Family(enum.Enum):
    """The two halves of the spec."""

    DLLM = "dllm"  # block diffusion: spec.SpecMachine, spec.adapter.SchedulerAdapter
    AR = "ar"  # autoregressive: spec.ar.ArSpecMachine, spec.ar.adapter.ArSchedulerAdapter

    @classmethod
    def parse(cls, value: str | Family) -> Family:
        """The family named `value` ('dllm' or 'ar'), or `value` itself; else a
        `ConfigError`."""
        if isinstance(value, Family):
            return value
        for f in cls:
            if f.value == value:
                return f
        raise ConfigError("family", value, "dllm or ar")


@dataclass(frozen=True, slots=True)
class DllmImplementation:
    """A dLLM scheduler: `factory(config, sink) -> SchedulerAdapter` and its profile."""

    factory: ImplementationFactory
    profile: DllmProfile = field(default_factory=DllmProfile)
    description: str = ""

    @property
    def family(self) -> Family:
        """`Family.DLLM`."""
        return Family.DLLM


@dataclass(frozen=True, slots=True)
class ArImplementation:
    """An AR scheduler: `factory(config, sink) -> ArSchedulerAdapter` and its profile."""

    factory: ArImplementationFactory
    profile: ArProfile = field(default_factory=ArProfile)
    description: str = ""

    @property
    def family(self) -> Family:
        """`Family.AR`."""
        return Family.AR


Implementation = DllmImplementation | ArImplementation


def family_of_factory(factory: Callable[..., object]) -> Family | None:
    """The family named by the annotation of the factory's first parameter, if any."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    if not params:
        return None
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # unresolvable annotations: fall back to the raw annotation text
        hints = {}
    annotation = hints.get(params[0].name, params[0].annotation)
    if annotation is DllmConfig or annotation == "DllmConfig":
        return Family.DLLM
    if annotation is ArConfig or annotation == "ArConfig":
        return Family.AR
    return None


def declared_implementation(
    obj: object, target: str, family: Family | str | None = None
) -> Implementation:
    """The implementation `obj` (loaded from `target`) declares, as a typed object.

    Raises `ConfigError` naming `impl` (or `family`) when the object is not an implementation,
    or its family cannot be told, or `family` contradicts its declaration.
    """
    wanted = Family.parse(family) if family is not None else None
    if isinstance(obj, DllmImplementation | ArImplementation):
        if wanted is not None and wanted is not obj.family:
            raise ConfigError(
                "family",
                wanted.value,
                f"{obj.family.value}: {target} declares itself a {type(obj).__name__}",
            )
        return obj
    if not callable(obj):
        raise ConfigError(
            "impl",
            target,
            "a DllmImplementation, an ArImplementation or a factory (config, sink) -> adapter; "
            f"got {type(obj).__name__}",
        )
    found = family_of_factory(obj)
    chosen = wanted or found
    if chosen is None:
        raise ConfigError(
            "impl",
            target,
            "a factory whose family can be told: declare it as DllmImplementation(...) or "
            "ArImplementation(...), annotate its first parameter as DllmConfig or ArConfig, "
            "or pass --family dllm|ar",
        )
    if chosen is Family.DLLM:
        return DllmImplementation(typing.cast(ImplementationFactory, obj))
    return ArImplementation(typing.cast(ArImplementationFactory, obj))


__all__ = [
    "ArImplementation",
    "DllmImplementation",
    "Family",
    "Implementation",
    "declared_implementation",
    "family_of_factory",
]
