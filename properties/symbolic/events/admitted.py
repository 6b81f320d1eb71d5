"""`Admitted` (`SpecMachine._admitted`): the head of the queue enters the running set and takes
a request-pool row. r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import ADMITTED, QUEUED, REQ
from properties.symbolic.events.common import at_request, for_request
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import lifecycle_step, select
from spec.lifecycles import REQUEST_LIFECYCLE

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    lifecycle          phase[r] = queued (and the request table has `admitted` from it)
    scheduler_phase    round_forwards = 0
    fcfs_admission     free_queue_order, or every queued j ahead of r may be passed:
                       prefill_first ∧ block 0 of r
                       is prompt-only ∧ block 0 of j is not (`Encoding.ahead`: j < r, indices
                       following submission order, or lexicographically (priority[j] under
                       priority_order, -max_new_tokens[j] under longest_output_first, j) <
                       (the same of r); without PREFILL_FIRST: none is queued)
    max_running        |active| < max_running
    row_exclusive      p.row < rows ∧ row_holder[p.row] = -1"""
    return [
        Guard(
            "lifecycle",
            for_request(
                enc,
                p,
                lambda i: z3.And(
                    s.phase[i] == QUEUED,
                    lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "admitted")[0],
                ),
            ),
        ),
        Guard("scheduler_phase", s.round_forwards == 0),
        Guard(
            "fcfs_admission",
            for_request(
                enc,
                p,
                lambda i: z3.Or(
                    enc.cfg.free_queue_order,
                    z3.And(
                        [
                            z3.Implies(
                                z3.And(s.phase[j] == QUEUED, enc.ahead(s, j, i)),
                                z3.And(
                                    enc.cfg.prefill_first,
                                    enc.prefill_block(s, i, z3.IntVal(0)),
                                    z3.Not(enc.prefill_block(s, j, z3.IntVal(0))),
                                ),
                            )
                            for j in range(enc.N)
                            if j != i
                        ]
                    ),
                ),
            ),
        ),
        Guard("max_running", enc.n_active(s) < enc.cfg.max_running),
        Guard(
            "row_exclusive",
            z3.And(p.row < enc.cfg.rows, select(s.row_holder, p.row) == -1),
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """phase'[r] = admitted; row'[r] = p.row; row_holder'[p.row] = r; round_admitted'."""
    return s.replace(
        round_admitted=z3.BoolVal(True),
        phase=at_request(enc, p, s.phase, lambda i: ADMITTED),
        row=at_request(enc, p, s.row, lambda i: p.row),
        row_holder=tuple(z3.If(p.row == r, p.request, s.row_holder[r]) for r in range(enc.R)),
    )
