"""`Forward` (`SpecMachine._forward`): one forward pass over the rows R = {i : p.forwarded[i]}
(row i feeds request i's current block)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import DONE, MASKED, NONE_BLOCK
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    step_per_row                no step is pending
    forward_ready               R is not empty
    forward_policy/after_commit round_committed = 0
    batch_stable                round_forwards > 0 ⇒ R = in_batch
    forward_policy/again        round_forwards > 0 ⇒ (sync ? some row of R is not done
                                                        : reloop ∧ ¬newly_done_in_last_forward)
    work_conserving             round_forwards = 0 ⇒ work_conserved
    prefill_first/mixed         prefill_first ⇒ the rows are all prefill rows or all not
                                (`prefill_kind`: a prompt-only block, or the block after a
                                cache hit in this round)
    prefill_first/waiting       prefill_first ∧ no row is a prefill row ⇒ no active request
                                outside R has a masked, allocated block of the prefill kind
    and for every row i ∈ R:
    known_request               active(i)
    forward_ready/row           row[i] != -1
    forward_ready/cur           a current block ∧ row_block_index[i] = committed_blocks[i]
    whole_block_rows            row_num_tokens[i] = B
    forward_ready/slots         block_start[i] != -1 ∧ [start, start+B) is owned by
                                (i, committed_blocks[i]) ∧ start + B <= S
    committed_prefix_kept       prefix_kept(i)
    reuse_keeps_slots/flag      row_reused[i] = (0 <= alloc_round[i] < round_index)
    carrier_continuity          row_masked[i] = (masks[i] = -1 ? initial masks : masks[i])"""
    n, b, cfg = enc.N, enc.B, enc.cfg
    rows = p.forwarded
    all_done = z3.And([z3.Implies(rows[i], s.block_phase[i] == DONE) for i in range(n)])
    prefill_rows = [z3.And(rows[i], enc.prefill_kind(s, i, p.row_block_index[i])) for i in range(n)]
    decode_rows = [
        z3.And(rows[i], z3.Not(enc.prefill_kind(s, i, p.row_block_index[i]))) for i in range(n)
    ]
    prompt_waits = [
        z3.And(
            enc.active(s, i),
            z3.Not(rows[i]),
            s.block_phase[i] == MASKED,
            s.block_start[i] != -1,
            enc.prefill_kind(s, i, s.committed_blocks[i]),
        )
        for i in range(n)
    ]
    out = [
        Guard("step_per_row", enc.no_step_pending(s)),
        Guard("forward_ready", z3.Or(rows)),
        Guard("forward_policy", s.round_committed == 0, "after_commit"),
        Guard(
            "batch_stable",
            z3.Implies(s.round_forwards > 0, z3.And([rows[i] == s.in_batch[i] for i in range(n)])),
        ),
        Guard(
            "forward_policy",
            z3.Implies(
                s.round_forwards > 0,
                z3.If(
                    cfg.sync,
                    z3.Not(all_done),
                    z3.And(cfg.reloop, z3.Not(s.newly_done_in_last_forward)),
                ),
            ),
            "again",
        ),
        Guard("work_conserving", z3.Implies(s.round_forwards == 0, enc.work_conserved(s))),
        Guard(
            "prefill_first",
            z3.Implies(cfg.prefill_first, z3.Not(z3.And(z3.Or(prefill_rows), z3.Or(decode_rows)))),
            "mixed",
        ),
        Guard(
            "prefill_first",
            z3.Implies(
                z3.And(cfg.prefill_first, z3.Not(z3.Or(prefill_rows))), z3.Not(z3.Or(prompt_waits))
            ),
            "waiting",
        ),
    ]
    for i in range(n):
        start = s.block_start[i]
        holds = z3.And(
            start != -1,
            z3.And(
                [
                    z3.Implies(enc.in_block(start, t), enc.owns(s, t, i, s.committed_blocks[i]))
                    for t in range(enc.S)
                ]
            ),
            start + b <= enc.S,
        )
        expected = z3.If(
            s.masks[i] == -1,
            enc.initial_masks(s.prompt_len[i], s.committed_blocks[i]),
            s.masks[i],
        )
        retained = z3.And(s.alloc_round[i] >= 0, s.alloc_round[i] < s.round_index)
        current = z3.And(
            s.block_phase[i] != NONE_BLOCK, p.row_block_index[i] == s.committed_blocks[i]
        )
        for rule, expr, tag in (
            ("known_request", enc.active(s, i), ""),
            ("forward_ready", s.row[i] != -1, "row"),
            ("forward_ready", current, "cur"),
            ("whole_block_rows", p.row_num_tokens[i] == b, ""),
            ("forward_ready", holds, "slots"),
            ("committed_prefix_kept", enc.prefix_kept(s, i), ""),
            ("reuse_keeps_slots", p.row_reused[i] == retained, "flag"),
            ("carrier_continuity", p.row_masked[i] == expected, ""),
        ):
            out.append(Guard(rule, z3.Implies(rows[i], expr), tag))
    return out


def effect(enc: Encoding, s: State, p: Params) -> State:
    """in_batch' = step_pending' = R; pending_masks'[i] = (i ∈ R ? row_masked[i] : 0);
    round_forwards' = round_forwards + 1; newly_done_in_last_forward' = false."""
    rows = p.forwarded
    return s.replace(
        in_batch=tuple(rows),
        step_pending=tuple(rows),
        pending_masks=tuple(z3.If(rows[i], p.row_masked[i], 0) for i in range(enc.N)),
        round_forwards=s.round_forwards + 1,
        newly_done_in_last_forward=z3.BoolVal(False),
    )
