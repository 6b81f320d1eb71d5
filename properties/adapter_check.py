"""A factory's adapter, checked against its family's protocol where the harness builds it.

`schedspec verify` refuses a factory that builds no adapter before a run (`NotAnAdapter`); from
pytest the harness is the first to see what the factory built, and says the same: the
factory, the protocol, what it built and which of the protocol's members that lacks, or holds
of the wrong type (a `config` that is not the family's configuration, an AR `rules` that is
neither an `ArRules` nor None). Both say it in one form (`adapter_refusal`):

    invalid impl='no_drain': a factory returning a SchedulerAdapter (abort, config, drain,
    run_round, snapshot, submit); it returned NoDrain, lacking drain
"""

from __future__ import annotations

from typing import Any

from spec.adapter import SchedulerAdapter
from spec.ar.adapter import ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRules
from spec.config import DllmConfig
from spec.errors import ConfigError

#: The members of each protocol that are values, not methods: the types each may hold and how
#: a refusal names them.
VALUE_MEMBERS: dict[type[Any], dict[str, tuple[tuple[type[Any], ...], str]]] = {
    SchedulerAdapter: {"config": ((DllmConfig,), "a spec.DllmConfig")},
    ArSchedulerAdapter: {
        "config": ((ArConfig,), "a spec.ar.ArConfig"),
        "rules": ((ArRules, type(None)), "a spec.ar.ArRules or None"),
    },
}


def protocol_members(protocol: type[Any]) -> list[str]:
    """The public members a runtime-checkable protocol declares (methods, properties and
    annotated attributes), sorted."""
    declared = set(getattr(protocol, "__annotations__", {}))
    declared |= {
        name
        for name, value in vars(protocol).items()
        if callable(value) or isinstance(value, property)
    }
    return sorted(name for name in declared if not name.startswith("_"))


def adapter_refusal(built: object, protocol: type[Any]) -> str | None:
    """None when `built` has every member of `protocol`, each method callable and each value
    member (`VALUE_MEMBERS`) of its type; else the `valid` part of its refusal: what a factory
    should have returned and what it returned instead, 'a factory returning a SchedulerAdapter
    (abort, config, ...); it returned NoDrain, lacking drain'. Members are read with getattr,
    as the calls read them (an adapter forwarding them through `__getattr__` has them), so
    reading a property runs the adapter's code: what it raises (but AttributeError, a member
    it lacks) propagates."""
    values = VALUE_MEMBERS.get(protocol, {})
    members = protocol_members(protocol)
    missing: list[str] = []
    wrong: list[str] = []
    for name in members:
        if not hasattr(built, name):
            missing.append(name)
        elif name in values:
            value = getattr(built, name)
            types, valid = values[name]
            if not isinstance(value, types):
                wrong.append(f"whose {name} is {_shown(value)}, not {valid}")
        elif not callable(getattr(built, name)):
            wrong.append(f"whose {name} is {_shown(getattr(built, name))}, not a method")
    if not missing and not wrong:
        return None
    parts = ([f"lacking {', '.join(missing)}"] if missing else []) + wrong
    returned = ", ".join([type(built).__name__, *parts])
    return (
        f"a factory returning {article(protocol.__name__)} {protocol.__name__} "
        f"({', '.join(members)}); it returned {returned}"
    )


def require_adapter(built: object, protocol: type[Any], factory: object) -> None:
    """Return when `built` is a `protocol` (a runtime-checkable Protocol) whose value members
    are of their types; else a `ConfigError` naming the factory, the protocol's members and
    those `built` lacks or holds ill-typed (`adapter_refusal`)."""
    refusal = adapter_refusal(built, protocol)
    if refusal is not None:
        raise ConfigError("impl", getattr(factory, "__name__", repr(factory)), refusal)


def article(noun: str) -> str:
    """'an' before a vowel's letter, else 'a' (an ArSchedulerAdapter, a SchedulerAdapter)."""
    return "an" if noun[:1] in "AEIOUaeiou" else "a"


def _shown(value: object) -> str:
    """`value` in a refusal: its type, and a short repr of it (one line)."""
    text = " ".join(repr(value).split())
    if len(text) > 60:
        text = text[:57] + "..."
    return f"the {type(value).__name__} {text}" if value is not None else "None"
