"""`CacheReleased` (`SpecMachine._cache_released`): request r stops reading the cached block at
slots [a, a+B), which it reads as its block k. r = p.request, k = p.block_index,
a = p.first_slot."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.events.common import for_request, prefix_cache_on
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    prefix_cache_on    cfg.prefix_cache ∧ the geometry has the cache
    known_request      active(r)
    free_owned_only    0 <= a ∧ a + B <= pool ∧ a mod B = 0 ∧ every t ∈ [a, a+B) is cached,
                       read by r, with cache_block[t] = k"""
    k, a = p.block_index, p.first_slot
    return [
        prefix_cache_on(enc),
        Guard("known_request", for_request(enc, p, lambda i: enc.active(s, i))),
        Guard(
            "free_owned_only",
            for_request(
                enc,
                p,
                lambda i: z3.And(
                    a >= 0,
                    a + enc.B <= enc.pool,
                    a % enc.B == 0,
                    *[
                        z3.Implies(
                            enc.in_block(a, t),
                            z3.And(s.cached[t], enc.read_by(s, t, i), s.cache_block[t] == k),
                        )
                        for t in range(enc.S)
                    ],
                ),
            ),
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """¬read_by'(t, r) for t ∈ [a, a+B)."""
    ins = [enc.in_block(p.first_slot, t) for t in range(enc.S)]
    return s.replace(
        read_by=tuple(
            z3.And(z3.Not(z3.And(ins[t], p.request == i)), enc.read_by(s, t, i))
            for t in range(enc.S)
            for i in range(enc.N)
        ),
    )
