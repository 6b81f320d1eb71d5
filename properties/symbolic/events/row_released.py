"""`RowReleased` (`SpecMachine._row_released`): the request gives back its request-pool row.
r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import NEW
from properties.symbolic.events.common import at_request, for_request
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import select

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    free_owned_only    phase[r] != new ∧ row[r] = p.row ∧ row_holder[p.row] = r"""
    return [
        Guard(
            "free_owned_only",
            for_request(
                enc,
                p,
                lambda i: z3.And(
                    s.phase[i] != NEW,
                    s.row[i] == p.row,
                    select(s.row_holder, p.row) == i,
                ),
            ),
        )
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """row'[r] = -1; row_holder'[p.row] = -1."""
    return s.replace(
        row=at_request(enc, p, s.row, lambda i: -1),
        row_holder=tuple(z3.If(p.row == r, -1, s.row_holder[r]) for r in range(enc.R)),
    )
