"""`Aborted` (`SpecMachine._aborted`): request r is cancelled between rounds or, under
`DllmPolicy.aborts_after_commit`, in a round's completion phase right after r committed a
block holding a generated token. r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import ABORTED, REQ
from properties.symbolic.events.common import at_request, for_request, without_current_block
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import lifecycle_step
from spec.lifecycles import REQUEST_LIFECYCLE

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    known_request               the request table has `aborted` from phase[r]
    step_per_row                ¬step_pending[r]
    scheduler_phase             round_forwards = 0 ∨
                                (aborts_after_commit ∧ committed_generated_this_round(r))
    terminal_owns_nothing/slots r owns no slot
    terminal_owns_nothing/row   row[r] = -1
    terminal_owns_nothing/reads r reads no cached block"""
    return [
        Guard(
            "known_request",
            for_request(
                enc,
                p,
                lambda i: lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "aborted")[0],
            ),
        ),
        Guard("step_per_row", for_request(enc, p, lambda i: z3.Not(s.step_pending[i]))),
        Guard(
            "scheduler_phase",
            z3.Or(
                s.round_forwards == 0,
                z3.And(
                    enc.cfg.aborts_after_commit,
                    for_request(enc, p, lambda i: enc.committed_generated_this_round(s, i)),
                ),
            ),
        ),
        Guard(
            "terminal_owns_nothing",
            for_request(enc, p, lambda i: z3.Not(enc.owns_any(s, i))),
            "slots",
        ),
        Guard("terminal_owns_nothing", for_request(enc, p, lambda i: s.row[i] == -1), "row"),
        Guard(
            "terminal_owns_nothing",
            for_request(enc, p, lambda i: z3.Not(enc.reads_any(s, i))),
            "reads",
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """phase'[r] = aborted; no current block."""
    return s.replace(
        phase=at_request(enc, p, s.phase, lambda i: ABORTED),
        **without_current_block(enc, s, p),
    )
