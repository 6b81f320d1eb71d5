"""`--impl NAME|module:attribute` -> a typed `Implementation` (family, factory, profile).

The family comes from the object (a `DllmImplementation` / `ArImplementation`), else from the
annotation of the factory's first parameter (`DllmConfig` / `ArConfig`); `--family` overrides.
The factory is wrapped so that one returning something that is not an adapter (a member of its
family's protocol missing, or a `config` / AR `rules` of the wrong type) stops the run with
`NotAnAdapter` (exit 2, one line) instead of a failure deep inside the suite.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from properties.adapter_check import adapter_refusal, article
from properties.deadline import CallDeadlineExceeded, call_deadline, call_timeout_set
from schedspec_cli.engine_cmds import ENGINE_EXTRA
from schedspec_cli.loader import MissingDependency, load_object, module_available
from schedspec_cli.registry import BUILTINS, Builtin
from spec.adapter import SchedulerAdapter
from spec.ar.adapter import ArSchedulerAdapter
from spec.errors import ConfigError, SchedSpecError
from spec.implementation import (
    ArImplementation,
    DllmImplementation,
    Family,
    Implementation,
    declared_implementation,
)

#: each family's adapter protocol, whose every member a factory's adapter must have
PROTOCOLS: dict[Family, type[Any]] = {Family.DLLM: SchedulerAdapter, Family.AR: ArSchedulerAdapter}

# the methods each family's adapter protocol requires (spec.adapter / spec.ar.adapter)
ADAPTER_METHODS: dict[Family, tuple[str, ...]] = {
    Family.DLLM: ("submit", "abort", "run_round", "drain", "snapshot"),
    Family.AR: ("submit", "abort", "step", "drain", "snapshot"),
}


class NotAnAdapter(SchedSpecError, TypeError):
    """A factory returned something that is not an adapter of its family: it lacks a member of
    the protocol, or holds one of the wrong type (a `config` that is not the family's
    configuration, an AR `rules` that is neither an `ArRules` nor None). Said in the form the
    harness refuses it from pytest (`properties.adapter_check.adapter_refusal`):
    `invalid impl='m:f': a factory returning a SchedulerAdapter (...); it returned X, lacking
    drain`. Not a `ConfigError`: the suites read that as a configuration the factory does not
    support."""

    def __init__(
        self, target: str, family: Family, got: object, refusal: str | None = None
    ) -> None:
        if refusal is None:
            refusal = adapter_refusal(got, PROTOCOLS[family]) or (
                f"a factory returning {_protocol_named(family)}; it returned {type(got).__name__}"
            )
        super().__init__(f"invalid impl={target!r}: {refusal}")


def _protocol_named(family: Family) -> str:
    name = PROTOCOLS[family].__name__
    return f"{article(name)} {name}"


@dataclass(frozen=True, slots=True)
class Resolved:
    """What `--impl` named: its display name, the implementation, the built-in entry if any."""

    name: str
    target: str
    implementation: Implementation
    builtin: Builtin | None
    # the real engines whose install importing a module:attribute target activated (a module
    # that imports an engine at its top: `loader.load_object`)
    engines_loaded: frozenset[str] = frozenset()

    @property
    def family(self) -> Family:
        """The implementation's family (dLLM or AR)."""
        return self.implementation.family


#: Each factory `_checked` built -> the factory it checks (a user's own wrapper is not one).
_CHECKED: weakref.WeakKeyDictionary[Callable[..., Any], Any] = weakref.WeakKeyDictionary()


def checked_factory(factory: Any) -> Any:
    """The factory the CLI's check of `factory` wraps, or `factory` itself when the CLI did
    not wrap it: a twin of the project's is told by its own function."""
    return _CHECKED.get(factory, factory)


def _checked(impl: Implementation, target: str) -> Implementation:
    family = impl.family
    inner: Any = impl.factory
    protocol = PROTOCOLS[family]
    try:
        inspect.signature(inner).bind(None, None)
    except TypeError:
        raise ConfigError(
            "impl", target, "a factory taking (config, sink) and returning an adapter"
        ) from None
    except ValueError:  # no signature to inspect (a builtin): the call will tell
        pass

    def factory(config: Any, sink: Any) -> Any:
        adapter = inner(config, sink)
        # every member, methods and values (`config`, an AR `rules`) of their types: before
        # the suite reads one (an AR run reads `rules` first) or a harness refuses it as a
        # violation
        refusal = adapter_refusal(adapter, protocol)
        if refusal is not None:
            raise NotAnAdapter(target, family, adapter, refusal)
        return adapter

    factory.__name__ = getattr(inner, "__name__", "factory")
    factory.__qualname__ = getattr(inner, "__qualname__", "factory")
    _CHECKED[factory] = inner
    if isinstance(impl, DllmImplementation):
        return DllmImplementation(factory, impl.profile, impl.description)
    return ArImplementation(factory, impl.profile, impl.description)


def resolve(name: str, family: Family | str | None = None) -> Resolved:
    """Resolve a built-in name or `module:attribute` (raises ConfigError naming `impl`)."""
    builtin = BUILTINS.get(name)
    if builtin is None and ":" not in name:
        raise ConfigError("impl", name, f"a built-in name {sorted(BUILTINS)} or 'module:attribute'")
    if builtin is not None:
        if family is not None and Family.parse(family) is not builtin.family:
            wanted = Family.parse(family).value
            raise ConfigError(
                "impl",
                name,
                f"an implementation of the {wanted} family here; built-in {name} is of the "
                f"{builtin.family.value} family (`schedspec list-impls` gives each one's)",
            )
        return resolve_builtin(builtin)
    before = activated_engines()
    obj = load_object(name, "impl")
    _refuse_an_engines_scheduler_class(obj, name)
    impl = declared_implementation(obj, name, family)
    return Resolved(name, name, _checked(impl, name), None, activated_engines() - before)


#: Vidur's replica scheduler modules (`vidur.scheduler.replica_scheduler.<module>`), by the
#: kind of the `real-vidur-<kind>` built-in that builds their class.
VIDUR_KIND_OF_MODULE = {
    "vllm_replica_scheduler": "vllm",
    "sarathi_replica_scheduler": "sarathi",
    "orca_replica_scheduler": "orca",
    "lightllm_replica_scheduler": "lightllm",
    "faster_transformer_replica_scheduler": "ft",
}


def _refuse_an_engines_scheduler_class(obj: object, target: str) -> None:
    """A scheduler class of vLLM's or Vidur's (or a subclass) given as `--impl` is no
    implementation: it is checked by naming it in the engine's variable and running the
    engine's built-in. A `ConfigError` saying so, with the command; nothing for anything else.
    Without this, the class was refused as a factory whose family cannot be told, or, with
    `--family`, built as one and reported as the user's `implementation_error`."""
    if not isinstance(obj, type):
        return
    modules = [getattr(base, "__module__", "") or "" for base in obj.__mro__]
    qualname = f"{obj.__module__}.{obj.__qualname__}"
    if any(m.startswith("vllm.v1.core.sched.") for m in modules):
        raise ConfigError(
            "impl",
            target,
            "an implementation; a vLLM scheduler class is checked by naming it: "
            f"SCHEDSPEC_VLLM_SCHEDULER_CLS={qualname} schedspec verify --impl real-vllm",
        )
    if any(m.startswith("vidur.scheduler.global_scheduler.") for m in modules):
        raise ConfigError(
            "impl",
            target,
            "an implementation; a Vidur global scheduler is checked only as Vidur's own "
            "routing, by scripts/vidur_pipeline_check.py --routing round_robin|lor (no class of "
            "one's own)",
        )
    prefix = "vidur.scheduler.replica_scheduler."
    found = [m.removeprefix(prefix) for m in modules if m.startswith(prefix)]
    if not found:
        return
    kinds = [
        "mnemosyne" if m.startswith("mnemosyne_") else VIDUR_KIND_OF_MODULE[m]
        for m in found
        if m in VIDUR_KIND_OF_MODULE or m.startswith("mnemosyne_")
    ]
    if not kinds:
        raise ConfigError(
            "impl",
            target,
            "an implementation; a Vidur replica scheduler is checked as a subclass of one of "
            "its kinds' classes (vllm, sarathi, orca, lightllm, ft, mnemosyne), named in "
            "SCHEDSPEC_VIDUR_SCHEDULER_CLS and run by that kind's built-in (real-vidur-<kind>); "
            f"{qualname} subclasses none of them",
        )
    raise ConfigError(
        "impl",
        target,
        "an implementation; a Vidur replica scheduler class is checked by naming it: "
        f"SCHEDSPEC_VIDUR_SCHEDULER_CLS={qualname} schedspec verify --impl real-vidur-{kinds[0]}",
    )


def resolve_builtin(builtin: Builtin) -> Resolved:
    """Load a built-in by its import string, as its declared family. The torch engine's
    built-ins without torch are one line naming the engine extra."""
    target = builtin.target
    if target.startswith("gpu.") and not module_available("torch"):
        raise MissingDependency(
            f"--impl {builtin.name} (the torch engine)",
            "torch",
            f"the engine extra, {ENGINE_EXTRA}",
        )
    obj = load_object(target, "impl")
    impl = declared_implementation(obj, target, builtin.family)
    return Resolved(builtin.name, target, _checked(impl, target), builtin)


def _manifest(engine: str) -> Any:
    """The `EngineManifest` of the real engine `engine` (an `integrations` package)."""
    return load_object(f"integrations.{engine}:MANIFEST", "impl")


def engine_release(builtin: Builtin | None) -> dict[str, Any] | None:
    """The real engine a built-in drives, `{"name": "vllm", "version": "0.33.0"}` (the release
    selected here, e.g. by `SCHEDSPEC_VLLM_VERSION`), with `"modified"`, the engine's sources
    that differ from the release's wheel (`EngineManifest.modified_sources`), when there are
    any, for vLLM and Vidur `"scheduler_cls"`, the class `SCHEDSPEC_VLLM_SCHEDULER_CLS` or
    `SCHEDSPEC_VIDUR_SCHEDULER_CLS` names, when set, and `"shadowed"`, another copy of the
    engine on the path that the install comes before (`EngineManifest.shadowed`); None for
    the project's own and for `module:attribute` implementations."""
    if builtin is None or not builtin.engine:
        return None
    return release_of(builtin.engine)


#: The real engines an implementation can drive (each an `integrations` package).
REAL_ENGINES = ("vllm", "sglang", "vidur")


def activated_engines() -> frozenset[str]:
    """The real engines whose install this process has activated (put on `sys.path`): those a
    `module:attribute` implementation drove, which names no engine of its own. Read from the
    path alone: no engine's release setting is read (a bad `SCHEDSPEC_VIDUR_VERSION` is no
    error of a run that never drives Vidur)."""
    from integrations.manifest import LAYOUT, cache_root

    root = cache_root()
    found = set()
    for entry in sys.path:
        path = Path(entry)
        if path.name == LAYOUT and path.parent.parent == root:
            found.add(path.parent.name.partition("-")[0])  # <engine>-<version>-<pins>
    return frozenset(found & set(REAL_ENGINES))


def release_driven(
    builtin: Builtin | None,
    active_before: frozenset[str],
    loaded: frozenset[str] = frozenset(),
) -> dict[str, Any] | None:
    """The release a run checked: its built-in's (`engine_release`), else, for a
    `module:attribute` implementation that drove a real engine (a wrapper of an adapter, a
    profile of its own), the one engine activated since `active_before` (`activated_engines`
    taken before the run) or while its module was imported (`loaded`,
    `Resolved.engines_loaded`); None when neither names one."""
    release = engine_release(builtin)
    driven = (activated_engines() - active_before) | loaded
    if release is None and len(driven) == 1:
        release = release_of(next(iter(driven)))
    return release


def release_of(engine: str) -> dict[str, Any]:
    """`engine_release` of the real engine `engine`."""
    manifest = _manifest(engine)
    release: dict[str, Any] = {"name": engine, "version": str(manifest.version)}
    modified = manifest.modified_sources()
    if modified:
        release["modified"] = list(modified)
    chosen = _scheduler_cls(engine)
    if chosen is not None:
        release["scheduler_cls"] = chosen
    shadowed = manifest.shadowed()
    if shadowed is not None:
        release["shadowed"] = shadowed
    return release


def _scheduler_cls(engine: str) -> str | None:
    """The scheduler class of the user's own that `engine`'s variable names, if any."""
    if engine == "vllm":
        from integrations.vllm.custom_scheduler import selected_scheduler_cls

        return selected_scheduler_cls()
    if engine == "vidur":
        from integrations.vidur.custom_scheduler import selected_scheduler_cls as vidur_cls

        return vidur_cls()
    return None  # SGLang has no scheduler class of one's own


def engine_line(impl: str, release: Mapping[str, Any]) -> str:
    """One line naming what a real engine's built-in checked: the release, a scheduler class
    of the user's own, and any source that differs from the release (`engine_release`)."""
    line = f"{impl}: {release['name']} {release['version']}"
    if "scheduler_cls" in release:
        line += f", scheduler_cls {release['scheduler_cls']}"
    modified = release.get("modified", [])
    if modified:
        shown = ", ".join(modified[:5]) + (
            f", ... ({len(modified)} files)" if len(modified) > 5 else ""
        )
        line += f"; MODIFIED from the release: {shown}"
    if "shadowed" in release:
        name = release["name"]
        # a scheduler class of one's own is named where the engine has one and none is set
        named_cls = name in ("vllm", "vidur") and "scheduler_cls" not in release
        ways = "patch the install" + (
            f" or set SCHEDSPEC_{name.upper()}_SCHEDULER_CLS" if named_cls else ""
        )
        line += (
            f"; NOT the {name} at {release['shadowed']}, which the install comes before on the "
            f"path (to check a change: {ways})"
        )
    return line


def require_engine(engine: str) -> None:
    """Raise `EngineNotInstalled` (a ConfigError: exit 2 naming the install command) unless the
    real engine `engine` is installed."""
    _manifest(engine).require()


#: How long loading a real engine (its imports, any scheduler class of the user's) may take.
ENGINE_LOAD_TIMEOUT_S = 600.0


def load_engine(engine: str, name: str) -> None:
    """What `require_engine` checks, then import the engine in this process: for a command that
    runs its built-in implementation `name`. An engine that is installed but lacks a module in
    this Python environment raises `EngineImportFailed`, and an implementation the installed
    release does not ship a `ConfigError` saying why (exit 2 either way, one line) before any
    run starts."""
    from integrations.manifest import EngineNotInstalled

    manifest = _manifest(engine)
    manifest.require_shipped(name)
    # under a deadline of its own, as long as an engine's import may take on a slow machine: a
    # scheduler class of the user's (SCHEDSPEC_VLLM_SCHEDULER_CLS) imported here may never return
    try:
        with call_timeout_set(ENGINE_LOAD_TIMEOUT_S), call_deadline(f"loading {engine}"):
            manifest.load(name)
    except EngineNotInstalled as err:
        raise err.wanted_by(name) from None
    except CallDeadlineExceeded as hang:
        raise ConfigError(
            "impl",
            name,
            f"an engine that loads ({engine}, with any scheduler class of yours its variable "
            f"names, had not loaded after {hang.seconds:g} s: does an import loop or wait?)",
        ) from None


def profile_summary(impl: Implementation) -> str:
    """The profile's departures from the idealised spec, in one line ('idealised spec' if none)."""
    profile = impl.profile
    parts: list[str] = []
    for part in ("space", "policy"):
        mine: Any = getattr(profile, part, None)
        if mine is not None and dataclasses.is_dataclass(mine):
            kind: Any = type(mine)
            parts += _changes(mine, kind(), "")
    deviations = getattr(profile, "deviations", ())
    if deviations:
        parts.append("accepts " + ", ".join(str(d.rule) for d in deviations))
    return "; ".join(parts) if parts else "idealised spec"


def _changes(mine: Any, base: Any, prefix: str) -> list[str]:
    """`field=value` for every field of dataclass `mine` that differs from `base` (nested
    dataclasses by their own changed fields)."""
    out: list[str] = []
    for f in dataclasses.fields(mine):
        value, expected = getattr(mine, f.name), getattr(base, f.name, None)
        if value == expected:
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            try:
                default = type(value)()
            except TypeError:
                default = None
            if default is not None:
                out += _changes(value, default, f"{prefix}{f.name}.")
                continue
        out.append(f"{prefix}{f.name}={_short(value)}")
    return out


def _short(value: object) -> str:
    if isinstance(value, frozenset):
        return "{" + ",".join(sorted(_short(v) for v in value)) + "}"
    if hasattr(value, "value") and not isinstance(value, int | str):
        return str(value.value)
    return str(value)


def ignored_scheduler_cls(targets: Sequence[Resolved]) -> str | None:
    """One line saying that `SCHEDSPEC_VLLM_SCHEDULER_CLS` (or `SCHEDSPEC_VIDUR_SCHEDULER_CLS`)
    is set but names a class none of `targets` builds: none is a built-in of that engine, nor a
    `module:attribute` implementation whose import loaded it (`Resolved.engines_loaded`). The
    pure-Python references of an engine's policy (`vllm-v1`, `vidur-vllm`) are not the engine:
    a user who set the variable to check their class must not read their pass as its. None
    when no such variable is set, or a target runs that engine. For `verify` to print on stderr
    before any run (`schedspec_cli.verify.plan`)."""
    lines = []
    for engine in ("vllm", "vidur"):
        # as set, blanks too: a value only a run of that engine reads is only noted here
        chosen = os.environ.get(f"SCHEDSPEC_{engine.upper()}_SCHEDULER_CLS", "")
        if not chosen:
            continue
        runs = any(
            (t.builtin is not None and t.builtin.engine == engine) or engine in t.engines_loaded
            for t in targets
        )
        if runs:
            continue
        names = ", ".join(b.name for b in BUILTINS.values() if b.engine == engine)
        verified = ", ".join(t.name for t in targets)
        lines.append(
            f"SCHEDSPEC_{engine.upper()}_SCHEDULER_CLS={chosen.strip() or repr(chosen)} ignored: "
            "no implementation "
            f"verified ({verified}) runs {engine}; it applies to {engine}'s built-ins ({names})"
        )
    return "; ".join(lines) or None


def refuse_parity_for_ar_only(parity: str | None, targets: Sequence[Resolved]) -> None:
    """`--parity` given when every target is AR is an input error: an AR run has no outputs to
    compare, so the flag would be ignored."""
    if parity is not None and all(t.family is Family.AR for t in targets):
        names = ", ".join(t.name for t in targets)
        raise ConfigError(
            "--parity", parity, f"dLLM implementations only (an AR run has no outputs: {names})"
        )


__all__ = [
    "ADAPTER_METHODS",
    "PROTOCOLS",
    "ArImplementation",
    "DllmImplementation",
    "NotAnAdapter",
    "Resolved",
    "checked_factory",
    "engine_release",
    "ignored_scheduler_cls",
    "load_engine",
    "profile_summary",
    "refuse_parity_for_ar_only",
    "require_engine",
    "resolve",
]
