"""Check your own Vidur replica scheduler: `SCHEDSPEC_VIDUR_SCHEDULER_CLS=pkg.module.Class`.

The `real-vidur-<kind>` built-ins build Vidur's own replica scheduler of that kind (vLLM,
Sarathi, Orca, LightLLM, FasterTransformer, Mnemosyne). A Vidur maintainer checking a change
writes it as a subclass of that kind's class and names it in the variable; the built-in whose
class it subclasses then builds it, by the same `__init__` and with the same configuration,
and the adapter's events, snapshot and rules are unchanged:

    SCHEDSPEC_VIDUR_SCHEDULER_CLS=my_sched.MyVLLM schedspec verify --impl real-vidur-vllm

The module is imported after the install is activated and with the placeholder modules of
`integrations.vidur.engine` in place (Vidur's scheduler modules import scikit-learn and pandas
at their top), so it may import Vidur's modules at its top. A name that does not import or is
not a class, a class that subclasses no replica scheduler of this release, and a run of a
built-in whose class it does not subclass are each a `ConfigError` naming the variable (exit 2,
one line). `verify` names the class under its table (`real-vidur-vllm: vidur 0.0.25,
scheduler_cls my_sched.MyVLLM`) and in its JSON (`engine.scheduler_cls`).
"""

from __future__ import annotations

from typing import Any

from integrations.scheduler_class import resolve_class, selected_class
from spec.errors import ConfigError

#: The environment variable naming the replica scheduler class.
SCHEDULER_VARIABLE = "SCHEDSPEC_VIDUR_SCHEDULER_CLS"

_FORM = "a replica scheduler class named 'package.module.Class', importable here"


def selected_scheduler_cls() -> str | None:
    """The class `SCHEDSPEC_VIDUR_SCHEDULER_CLS` names, or None when it is unset or empty."""
    return selected_class(SCHEDULER_VARIABLE)


def _resolved(qualname: str) -> tuple[type[Any], dict[str, Any]]:
    """The class `qualname` names, imported with Vidur loaded and its placeholders in place,
    and Vidur's replica scheduler classes by kind (`engine.load`)."""
    from integrations.vidur import engine

    vidur = engine.load()
    with engine.stubbed_imports():
        return resolve_class(SCHEDULER_VARIABLE, qualname, _FORM), vidur.schedulers


def _kinds_of(cls: type[Any], schedulers: dict[str, Any]) -> list[str]:
    """The kinds whose replica scheduler `cls` is or subclasses."""
    return [kind for kind, own in schedulers.items() if issubclass(cls, own)]


def check_selected(builtin: str | None = None) -> None:
    """Up front, before a run: when the variable is set, its class imports and subclasses one
    of the replica schedulers this Vidur release ships, and, given the `real-vidur-<kind>`
    built-in about to run, that kind's (`scheduler_class_for`). A `ConfigError` if not."""
    qualname = selected_scheduler_cls()
    if qualname is None:
        return
    cls, schedulers = _resolved(qualname)
    if not _kinds_of(cls, schedulers):
        names = ", ".join(own.__name__ for own in schedulers.values())
        raise ConfigError(
            SCHEDULER_VARIABLE,
            qualname,
            f"a subclass of one of Vidur's replica schedulers ({names}); {qualname} "
            "subclasses none",
        )
    kind = (builtin or "").removeprefix("real-vidur-")
    if kind in schedulers:
        scheduler_class_for(kind, schedulers[kind])


def selected_kinds() -> list[str]:
    """The kinds whose replica scheduler the variable's class is or subclasses (none when the
    variable is unset); a `ConfigError` as `check_selected` raises for a class that does not
    import or subclasses no replica scheduler of this release."""
    check_selected()
    qualname = selected_scheduler_cls()
    if qualname is None:
        return []
    cls, schedulers = _resolved(qualname)
    return _kinds_of(cls, schedulers)


def scheduler_class_for(kind: str, default: type[Any]) -> type[Any]:
    """The class to build where the adapter would build Vidur's `kind` scheduler `default`:
    the variable's class when set (it must subclass `default`: a `ConfigError` naming the
    built-in it does subclass), else `default`."""
    qualname = selected_scheduler_cls()
    if qualname is None:
        return default
    cls, schedulers = _resolved(qualname)
    if issubclass(cls, default):
        return cls
    runs = ", ".join(f"real-vidur-{k}" for k in _kinds_of(cls, schedulers)) or "none of them"
    raise ConfigError(
        SCHEDULER_VARIABLE,
        qualname,
        f"a subclass of {default.__module__}.{default.__qualname__}, the class "
        f"real-vidur-{kind} builds ({qualname} is not one; the built-ins it subclasses: {runs})",
    )
