"""`KvFreed` (`SpecMachine._kv_freed`): the request frees the slot set F = {t : p.freed[t]}.
r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import NEW, NONE_BLOCK
from properties.symbolic.events.common import for_request
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    known_request          phase[r] != new
    free_owned_only/owned  every t ∈ F is owned by r
    free_owned_only/whole  no owned block is freed in part: t ∈ F, u ∉ F, t owned
                           ⇒ owner(u) != owner(t)"""
    whole = []
    for t in range(enc.S):
        for u in range(enc.S):
            if t != u:
                whole.append(
                    z3.Not(
                        z3.And(
                            p.freed[t],
                            z3.Not(p.freed[u]),
                            s.owner_request[t] != -1,
                            s.owner_request[u] == s.owner_request[t],
                            s.owner_block[u] == s.owner_block[t],
                        )
                    )
                )
    return [
        Guard("known_request", for_request(enc, p, lambda i: s.phase[i] != NEW)),
        Guard(
            "free_owned_only",
            for_request(
                enc,
                p,
                lambda i: z3.And(
                    [z3.Implies(p.freed[t], s.owner_request[t] == i) for t in range(enc.S)]
                ),
            ),
            "owned",
        ),
        Guard("free_owned_only", z3.And(whole), "whole"),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """For t ∈ F: owner_request'[t] = -1, owner_block'[t] = 0, freed_by'[t] = r (ghost);
    block_start'[r] = -1 when F hits r's current block (it then holds no slots)."""
    hit = [
        z3.And(
            p.request == i,
            s.block_phase[i] != NONE_BLOCK,
            s.block_start[i] != -1,
            z3.Or([z3.And(p.freed[t], enc.in_block(s.block_start[i], t)) for t in range(enc.S)]),
        )
        for i in range(enc.N)
    ]
    return s.replace(
        owner_request=tuple(z3.If(p.freed[t], -1, s.owner_request[t]) for t in range(enc.S)),
        owner_block=tuple(z3.If(p.freed[t], 0, s.owner_block[t]) for t in range(enc.S)),
        freed_by=tuple(z3.If(p.freed[t], p.request, s.freed_by[t]) for t in range(enc.S)),
        block_start=tuple(z3.If(hit[i], -1, s.block_start[i]) for i in range(enc.N)),
    )
