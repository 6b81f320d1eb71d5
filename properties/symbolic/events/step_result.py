"""`StepResult` (`SpecMachine._step_result`): the step of request r's row of the latest forward
(accept_length tokens accepted, masks_remaining masks left). r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import BLK, DONE
from properties.symbolic.events.common import at_request, for_request
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z, lifecycle_step, select
from spec.lifecycles import (
    BLOCK_LIFECYCLE,
    STEP_DONE,
    STEP_NOT_DONE_COMPLETE,
    STEP_NOT_DONE_MASKED,
)

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    step_per_row                 step_pending[r] ∧ block_index = committed_blocks[r]
    accept_length                accept ∈ {0, B} ∧ 0 <= masks_remaining <= pending_masks[r]
    final_forward_before_commit  accept = B ⇒ pending_masks[r] = 0
    lifecycle                    the block table has the step's trigger from block_phase[r]
                                 (done: accept = B; else masks_remaining > 0 or = 0)"""
    b = enc.B
    pending_masks = select(s.pending_masks, p.request)
    done = p.accept_length == b
    trigger_condition = {
        STEP_DONE: done,
        STEP_NOT_DONE_MASKED: z3.And(z3.Not(done), p.masks_remaining > 0),
        STEP_NOT_DONE_COMPLETE: z3.And(z3.Not(done), p.masks_remaining == 0),
    }

    def step_enabled(i: int) -> Z:
        return z3.Or(
            [
                z3.And(cond, lifecycle_step(BLOCK_LIFECYCLE, BLK, s.block_phase[i], trig)[0])
                for trig, cond in trigger_condition.items()
            ]
        )

    return [
        Guard(
            "step_per_row",
            for_request(
                enc,
                p,
                lambda i: z3.And(s.step_pending[i], p.block_index == s.committed_blocks[i]),
            ),
        ),
        Guard(
            "accept_length",
            z3.And(
                z3.Or(p.accept_length == 0, p.accept_length == b),
                p.masks_remaining >= 0,
                p.masks_remaining <= pending_masks,
            ),
        ),
        Guard("final_forward_before_commit", z3.Implies(done, pending_masks == 0)),
        Guard("lifecycle", for_request(enc, p, step_enabled)),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """block_phase'[r] = the block table's target (step_done / step_not_done_masked /
    step_not_done_complete); masks'[r] = masks_remaining; step_pending'[r] = false;
    pending_masks'[r] = 0; newly_done_in_last_forward' |= (accept = B ∧ block_phase[r] != done)."""
    done = p.accept_length == enc.B

    def target(i: int) -> Z:
        cur = s.block_phase[i]
        to_done = lifecycle_step(BLOCK_LIFECYCLE, BLK, cur, STEP_DONE)[1]
        to_masked = lifecycle_step(BLOCK_LIFECYCLE, BLK, cur, STEP_NOT_DONE_MASKED)[1]
        to_complete = lifecycle_step(BLOCK_LIFECYCLE, BLK, cur, STEP_NOT_DONE_COMPLETE)[1]
        return z3.If(done, to_done, z3.If(p.masks_remaining > 0, to_masked, to_complete))

    newly_done = z3.Or(
        [z3.And(p.request == i, done, s.block_phase[i] != DONE) for i in range(enc.N)]
    )
    return s.replace(
        block_phase=at_request(enc, p, s.block_phase, target),
        masks=at_request(enc, p, s.masks, lambda i: p.masks_remaining),
        step_pending=at_request(enc, p, s.step_pending, lambda i: False),
        pending_masks=at_request(enc, p, s.pending_masks, lambda i: 0),
        newly_done_in_last_forward=z3.Or(s.newly_done_in_last_forward, newly_done),
    )
