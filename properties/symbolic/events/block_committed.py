"""`BlockCommitted` (`SpecMachine._block_committed`): request r's done current block becomes
part of its output. r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import BLK, NONE_BLOCK, REQ
from properties.symbolic.events.common import at_request, for_request, without_current_block
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z, lifecycle_step
from spec.lifecycles import BLOCK_LIFECYCLE, REQUEST_LIFECYCLE

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    known_request                active(r)
    step_per_row                 no step is pending
    lifecycle                    a current block ∧ block_index = committed_blocks[r]
    final_forward_before_commit  the block table has `block_committed` from block_phase[r]
    prompt_preserved             tokens_valid
    lifecycle/request            the request table has `block_committed` from phase[r]"""
    return [
        Guard("known_request", for_request(enc, p, lambda i: enc.active(s, i))),
        Guard("step_per_row", enc.no_step_pending(s)),
        Guard(
            "lifecycle",
            for_request(
                enc,
                p,
                lambda i: z3.And(
                    s.block_phase[i] != NONE_BLOCK, p.block_index == s.committed_blocks[i]
                ),
            ),
        ),
        Guard(
            "final_forward_before_commit",
            for_request(
                enc,
                p,
                lambda i: lifecycle_step(BLOCK_LIFECYCLE, BLK, s.block_phase[i], "block_committed")[
                    0
                ],
            ),
        ),
        Guard("prompt_preserved", p.tokens_valid),
        Guard(
            "lifecycle",
            for_request(
                enc,
                p,
                lambda i: lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "block_committed")[0],
            ),
            "request",
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """committed_blocks'[r] += 1; phase'[r] per the request table; the first token that ends
    r, if this block holds it (none ended r before, and not ignore_eos[r]):
    eos_committed'[r] |= fresh ∧ block_has_eos ∧ ¬(block_has_stop_token ∧ stop_token_first),
    stop_token_committed'[r] |= fresh ∧ block_has_stop_token ∧ (stop_token_first ∨
    ¬block_has_eos), fresh = ¬eos_committed[r] ∧ ¬stop_token_committed[r] ∧ ¬ignore_eos[r];
    committed_this_round'[r] = true; no current block; round_committed' = round_committed + 1."""

    def fresh(i: int) -> Z:
        return z3.Not(z3.Or(s.eos_committed[i], s.stop_token_committed[i], s.ignore_eos[i]))

    stop_first = z3.And(p.block_has_stop_token, p.stop_token_first)
    return s.replace(
        committed_blocks=at_request(
            enc, p, s.committed_blocks, lambda i: s.committed_blocks[i] + 1
        ),
        phase=at_request(
            enc,
            p,
            s.phase,
            lambda i: lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "block_committed")[1],
        ),
        eos_committed=at_request(
            enc,
            p,
            s.eos_committed,
            lambda i: z3.Or(
                s.eos_committed[i], z3.And(fresh(i), p.block_has_eos, z3.Not(stop_first))
            ),
        ),
        stop_token_committed=at_request(
            enc,
            p,
            s.stop_token_committed,
            lambda i: z3.Or(
                s.stop_token_committed[i],
                z3.And(
                    fresh(i),
                    p.block_has_stop_token,
                    z3.Or(p.stop_token_first, z3.Not(p.block_has_eos)),
                ),
            ),
        ),
        committed_this_round=at_request(enc, p, s.committed_this_round, lambda i: z3.BoolVal(True)),
        round_committed=s.round_committed + 1,
        **without_current_block(enc, s, p),
    )
