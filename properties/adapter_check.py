"""A factory's adapter, checked against its family's protocol where the harness builds it.

`schedspec verify` refuses a factory that builds no adapter before a run (`NotAnAdapter`); from
pytest the harness is the first to see what the factory built, and says the same: the
factory, the protocol, what it built and which of the protocol's members that lacks.
"""

from __future__ import annotations

from typing import Any

from spec.errors import ConfigError


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


def require_adapter(built: object, protocol: type[Any], factory: object) -> None:
    """Return when `built` is a `protocol` (a runtime-checkable Protocol); else a
    `ConfigError` naming the factory, the protocol's members and those `built` lacks."""
    if isinstance(built, protocol):
        return
    members = protocol_members(protocol)
    missing = [name for name in members if not hasattr(built, name)]
    lacking = f", lacking {', '.join(missing)}" if missing else ""
    raise ConfigError(
        "impl",
        getattr(factory, "__name__", repr(factory)),
        f"a factory returning {_article(protocol.__name__)} {protocol.__name__} "
        f"({', '.join(members)}); it returned "
        f"{type(built).__name__}{lacking}",
    )


def _article(noun: str) -> str:
    return "an" if noun[:1] in "AEIOU" else "a"
