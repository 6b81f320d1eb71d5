"""`RowAcquired`: `SpecMachine` has no handler for it (rows are taken by `Admitted`), so it is
never enabled, in both."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    lifecycle    false"""
    return [Guard("lifecycle", z3.BoolVal(False))]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """Nothing changes (never enabled)."""
    return s
