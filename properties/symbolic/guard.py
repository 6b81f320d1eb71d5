"""Guards (labelled conjuncts of an event's enabling condition) and relaxations (seeded bugs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z


@dataclass(frozen=True, slots=True)
class Guard:
    """One conjunct of an event's enabling condition, labelled with the `spec.rules` rule that
    `SpecMachine` names when the check fails (`tag` tells apart several guards of one rule)."""

    rule: str
    expr: Z
    tag: str = ""


@dataclass(frozen=True, slots=True)
class Relaxation:
    """A seeded bug: in events of `kind`, the guards labelled `rule` (and `tag`, if given)
    are replaced by `replacement(s, p)` (None = dropped)."""

    kind: str
    rule: str
    tag: str = ""
    replacement: Callable[[State, Params], Z] | None = None

    def matches(self, kind: str, g: Guard) -> bool:
        """Whether this relaxation replaces guard `g` of events of `kind`."""
        return kind == self.kind and g.rule == self.rule and (not self.tag or g.tag == self.tag)
