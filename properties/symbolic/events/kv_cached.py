"""`KvCached` (`SpecMachine._kv_cached`): request r puts its committed block k, which it owns
whole at slots [a, a+B), into the prefix cache and keeps reading it. r = p.request,
k = p.block_index, a = p.first_slot."""

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
    prefix_cache_on                   cfg.prefix_cache ∧ the geometry has the cache
    known_request                     active(r)
    cache_committed_only/committed    0 <= k < committed_blocks[r]
    cache_committed_only/read         ¬reads_block(r, k) (it reads that block from the cache)
    cache_committed_only/owned        0 <= a ∧ a + B <= pool
                                      ∧ ∀t: owner(t) = (r, k) ⇔ t ∈ [a, a+B)"""
    k, a = p.block_index, p.first_slot
    return [
        prefix_cache_on(enc),
        Guard("known_request", for_request(enc, p, lambda i: enc.active(s, i))),
        Guard(
            "cache_committed_only",
            for_request(enc, p, lambda i: z3.And(k >= 0, k < s.committed_blocks[i])),
            "committed",
        ),
        Guard(
            "cache_committed_only",
            for_request(enc, p, lambda i: z3.Not(enc.reads_block(s, i, k))),
            "read",
        ),
        Guard(
            "cache_committed_only",
            for_request(
                enc,
                p,
                lambda i: z3.And(
                    a >= 0,
                    a + enc.B <= enc.pool,
                    *[enc.owns(s, t, i, k) == enc.in_block(a, t) for t in range(enc.S)],
                ),
            ),
            "owned",
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """For t ∈ [a, a+B): owner_request'[t] = -1, owner_block'[t] = 0, cached'[t],
    cache_origin'[t] = key_origin(r, k) (the lowest request with that block's key),
    cache_block'[t] = k, read_by'(t, r)."""
    ins = [enc.in_block(p.first_slot, t) for t in range(enc.S)]
    origin: z3.ArithRef = z3.IntVal(0)
    for i in range(enc.N):
        origin = z3.If(p.request == i, enc.key_origin(s, i, p.block_index), origin)
    return s.replace(
        owner_request=tuple(z3.If(ins[t], -1, s.owner_request[t]) for t in range(enc.S)),
        owner_block=tuple(z3.If(ins[t], 0, s.owner_block[t]) for t in range(enc.S)),
        cached=tuple(z3.Or(ins[t], s.cached[t]) for t in range(enc.S)),
        cache_origin=tuple(z3.If(ins[t], origin, s.cache_origin[t]) for t in range(enc.S)),
        cache_block=tuple(z3.If(ins[t], p.block_index, s.cache_block[t]) for t in range(enc.S)),
        read_by=tuple(
            z3.Or(z3.And(ins[t], p.request == i), enc.read_by(s, t, i))
            for t in range(enc.S)
            for i in range(enc.N)
        ),
    )
