"""`KvAllocated` (`SpecMachine._kv_allocated`): the request's next block gets B contiguous KV
slots starting at p.first_slot (or, without a current block, a new block starts). r = p.request,
k = p.block_index, a = p.first_slot."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import MASKED, NONE_BLOCK, REQ
from properties.symbolic.events.common import for_request
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import lifecycle_step
from spec.lifecycles import REQUEST_LIFECYCLE

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    known_request             active(r)
    scheduler_phase           round_forwards = 0
    row_exclusive             row[r] != -1
    whole_block_alloc         k = committed_blocks[r]
    kv_exclusive              0 <= a ∧ a + B <= pool ∧ every slot of [a, a+B) is free (not
                              owned, not cached)
    page_alignment/aligned    a mod P = offset(k) ∧ (offset(k) = 0 ⇒ [a, a+P) is free)
    page_alignment/continues  offset(k) != 0 ⇒ a >= 1 ∧ slot a-1 is owned by (r, k-1), or is
                              in the cached block r reads as its block k-1
    page_alignment/one_request offset(k) != 0 ⇒ every owned slot of a's page is owned by r
    whole_block_alloc/holds   a current block holds no slots (block_start[r] = -1)
    reuse_keeps_slots         a current block ⇒ ¬reuse
    lifecycle                 a current block, or the request table has `kv_allocated`"""
    b, k, a = enc.B, p.block_index, p.first_slot
    off = enc.page_offset(k)
    free_block = z3.And([z3.Implies(enc.in_block(a, t), enc.free(s, t)) for t in range(enc.S)])
    free_page = z3.And(
        [z3.Implies(z3.And(a <= t, t < a + enc.P), enc.free(s, t)) for t in range(enc.S)]
    )
    return [
        Guard("known_request", for_request(enc, p, lambda i: enc.active(s, i))),
        Guard("scheduler_phase", s.round_forwards == 0),
        Guard("row_exclusive", for_request(enc, p, lambda i: s.row[i] != -1)),
        Guard("whole_block_alloc", for_request(enc, p, lambda i: k == s.committed_blocks[i])),
        Guard("kv_exclusive", z3.And(a >= 0, a + b <= enc.pool, free_block)),
        Guard(
            "page_alignment",
            z3.And(a % enc.P == off, z3.Implies(off == 0, free_page)),
            "aligned",
        ),
        Guard(
            "page_alignment",
            for_request(
                enc,
                p,
                lambda i: z3.Implies(
                    off != 0,
                    z3.And(
                        a >= 1,
                        z3.And(
                            [
                                z3.Implies(
                                    a - 1 == t,
                                    z3.Or(
                                        enc.owns(s, t, i, k - 1),
                                        z3.And(
                                            s.cached[t],
                                            enc.read_by(s, t, i),
                                            s.cache_block[t] == k - 1,
                                        ),
                                    ),
                                )
                                for t in range(enc.S)
                            ]
                        ),
                    ),
                ),
            ),
            "continues",
        ),
        Guard(
            "page_alignment",
            for_request(
                enc,
                p,
                lambda i: z3.Implies(
                    off != 0,
                    z3.And(
                        [
                            z3.Implies(
                                z3.And(a - off <= t, t < a - off + enc.P, s.owner_request[t] != -1),
                                s.owner_request[t] == i,
                            )
                            for t in range(enc.S)
                        ]
                    ),
                ),
            ),
            "one_request",
        ),
        Guard(
            "whole_block_alloc",
            for_request(
                enc,
                p,
                lambda i: z3.Implies(s.block_phase[i] != NONE_BLOCK, s.block_start[i] == -1),
            ),
            "holds",
        ),
        Guard(
            "reuse_keeps_slots",
            for_request(
                enc,
                p,
                lambda i: z3.Implies(s.block_phase[i] != NONE_BLOCK, z3.Not(enc.cfg.reuse)),
            ),
        ),
        Guard(
            "lifecycle",
            for_request(
                enc,
                p,
                lambda i: z3.Or(
                    s.block_phase[i] != NONE_BLOCK,
                    lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "kv_allocated")[0],
                ),
            ),
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """owner'[t] = (r, k) for t in [a, a+B); block_start'[r] = a; alloc_round'[r] = round_index;
    without a current block: block_phase'[r] = masked, masks'[r] = -1 and phase'[r] follows
    the request table's `kv_allocated` row (admitted -> running)."""
    owner_request, owner_block = [], []
    for t in range(enc.S):
        ins = enc.in_block(p.first_slot, t)
        owner_request.append(z3.If(ins, p.request, s.owner_request[t]))
        owner_block.append(z3.If(ins, p.block_index, s.owner_block[t]))
    block_start, alloc_round, block_phase, masks, phase = [], [], [], [], []
    for i in range(enc.N):
        sel = p.request == i
        new_block = z3.And(sel, z3.Not(s.block_phase[i] != NONE_BLOCK))
        target = lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "kv_allocated")[1]
        block_start.append(z3.If(sel, p.first_slot, s.block_start[i]))
        alloc_round.append(z3.If(sel, s.round_index, s.alloc_round[i]))
        block_phase.append(z3.If(new_block, MASKED, s.block_phase[i]))
        masks.append(z3.If(new_block, -1, s.masks[i]))
        phase.append(z3.If(new_block, target, s.phase[i]))
    return s.replace(
        owner_request=tuple(owner_request),
        owner_block=tuple(owner_block),
        block_start=tuple(block_start),
        alloc_round=tuple(alloc_round),
        block_phase=tuple(block_phase),
        masks=tuple(masks),
        phase=tuple(phase),
    )
