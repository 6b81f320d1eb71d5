"""`RowAcquired` (`SpecMachine._row_acquired`): a running request that gave its request-pool
row back between rounds (`DllmPolicy.rows_released_between_rounds`) takes one again in the
scheduler phase. r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.events.common import at_request, for_request
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import select

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    known_request      active(r)
    scheduler_phase    round_forwards = 0
    row_exclusive      row[r] = -1 ∧ p.row < rows ∧ row_holder[p.row] = -1"""
    return [
        Guard("known_request", for_request(enc, p, lambda i: enc.active(s, i))),
        Guard("scheduler_phase", s.round_forwards == 0),
        Guard(
            "row_exclusive",
            z3.And(
                for_request(enc, p, lambda i: s.row[i] == -1),
                p.row < enc.cfg.rows,
                select(s.row_holder, p.row) == -1,
            ),
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """row'[r] = p.row; row_holder'[p.row] = r."""
    return s.replace(
        row=at_request(enc, p, s.row, lambda i: p.row),
        row_holder=tuple(z3.If(p.row == r, p.request, s.row_holder[r]) for r in range(enc.R)),
    )
