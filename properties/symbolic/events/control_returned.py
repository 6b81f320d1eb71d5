"""`ControlReturned` (`SpecMachine._control_returned`): the round ends and control returns to
the caller."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import COMPLETE, DENOISING, DONE, MASKED, NONE_BLOCK, QUEUED
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    round_order                  p.round_index = round_index
    step_per_row                 no step is pending
    work_conserving              round_forwards = 0 ⇒ work_conserved
    and for every active request i:
    row_exclusive                row[i] != -1 ∨ may_lack_row(i)
    committed_prefix_kept        prefix_kept(i)
    fdfo_releases_same_round/finish  ¬finish_due(i)
    sync_yields_when_all_done    a current block ⇒ ¬sync
    fdfo_releases_same_round/done    block_phase[i] != done
    reuse_keeps_slots            unfinished block ∧ reuse ⇒ block_start[i] != -1
    no_reuse_releases            unfinished block ∧ ¬reuse ⇒ block_start[i] = -1
    progress                     round_forwards = 0 ⇒ nothing active ∧ ¬(something queued
                                 ∧ no slot and no row held)"""
    cfg = enc.cfg
    out = [
        Guard("round_order", p.round_index == s.round_index),
        Guard("step_per_row", enc.no_step_pending(s)),
        Guard("work_conserving", z3.Implies(s.round_forwards == 0, enc.work_conserved(s))),
    ]
    for i in range(enc.N):
        present = s.block_phase[i] != NONE_BLOCK
        phase = s.block_phase[i]
        unfinished = z3.Or(phase == MASKED, phase == DENOISING, phase == COMPLETE)
        start = s.block_start[i]
        for rule, expr, tag in (
            ("row_exclusive", z3.Or(s.row[i] != -1, enc.may_lack_row(s, i)), ""),
            ("committed_prefix_kept", enc.prefix_kept(s, i), ""),
            ("fdfo_releases_same_round", z3.Not(enc.finish_due(s, i)), "finish"),
            ("sync_yields_when_all_done", z3.Implies(present, z3.Not(cfg.sync)), ""),
            ("fdfo_releases_same_round", phase != DONE, "done"),
            ("reuse_keeps_slots", z3.Implies(z3.And(unfinished, cfg.reuse), start != -1), ""),
            (
                "no_reuse_releases",
                z3.Implies(z3.And(unfinished, z3.Not(cfg.reuse)), start == -1),
                "",
            ),
        ):
            out.append(Guard(rule, z3.Implies(enc.active(s, i), expr), tag))
    any_active = z3.Or([enc.active(s, i) for i in range(enc.N)])
    queued = z3.Or([s.phase[i] == QUEUED for i in range(enc.N)])
    nothing_held = z3.And(
        z3.And([o == -1 for o in s.owner_request]), z3.And([h == -1 for h in s.row_holder])
    )
    out.append(
        Guard(
            "progress",
            z3.Implies(
                s.round_forwards == 0,
                z3.And(z3.Not(any_active), z3.Not(z3.And(queued, nothing_held))),
            ),
        )
    )
    return out


def effect(enc: Encoding, s: State, p: Params) -> State:
    """round_index' = round_index + 1; round_forwards' = round_committed' = 0;
    newly_done_in_last_forward' = round_admitted' = false; in_batch' = step_pending' =
    committed_this_round' = hit_this_round' = false; pending_masks' = 0."""
    n = enc.N
    return s.replace(
        round_index=s.round_index + 1,
        round_forwards=z3.IntVal(0),
        newly_done_in_last_forward=z3.BoolVal(False),
        round_committed=z3.IntVal(0),
        round_admitted=z3.BoolVal(False),
        in_batch=tuple(z3.BoolVal(False) for _ in range(n)),
        step_pending=tuple(z3.BoolVal(False) for _ in range(n)),
        committed_this_round=tuple(z3.BoolVal(False) for _ in range(n)),
        hit_this_round=tuple(z3.BoolVal(False) for _ in range(n)),
        pending_masks=tuple(z3.IntVal(0) for _ in range(n)),
    )
