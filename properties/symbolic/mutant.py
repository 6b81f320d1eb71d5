"""A seeded symbolic mutant (`SymbolicMutant`): the relation with one labelled guard relaxed,
or replaced by the buggy behaviour (`Relaxation`), plus constraints that say what the bug looks
like: on the bad step (`extra`) and on the steps before it (`history`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from properties.symbolic.encoding import Encoding
from properties.symbolic.guard import Relaxation
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z
from spec.config import DllmConfig
from spec.profile import DllmPolicy

Extra = Callable[[Encoding, State, Params], Z]
History = Callable[[Encoding, Sequence[State], Sequence[Params]], Z]


@dataclass(frozen=True)
class SymbolicMutant:
    """A seeded bug as a relaxed guard of one event kind."""

    name: str
    description: str
    rule: str  # the rule SpecMachine names on the bad event
    config: DllmConfig
    kind: str  # event kind of the bad step
    relax: tuple[Relaxation, ...]
    violated: tuple[str, str]  # (rule, tag) of the spec guard the bad step breaks
    extra: Extra | None = None  # more constraints on the bad step (what the bug looks like)
    # constraints on the steps before the bad one (states s0..sk, params p0..p(k-1))
    history: History | None = None
    reference: tuple[str, ...] = ()  # matching entries of tests/mutants.py MUTANTS
    requests: int = 2
    depths: tuple[int, ...] = (4, 6, 8, 10, 12, 14)
    policy: DllmPolicy = field(default_factory=DllmPolicy)  # the policy the trace runs under
