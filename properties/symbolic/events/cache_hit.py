"""`CacheHit` (`SpecMachine._cache_hit`): request r reads the cached block at slots [a, a+B) as
its block k: its next block (committed without a forward) or a block it has committed already
(a duplicate of a cached block, swapped onto the cached copy). r = p.request,
k = p.block_index, a = p.first_slot."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import NONE_BLOCK
from properties.symbolic.events.common import for_request, prefix_cache_on
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula), with nxt(r) = (k = committed_blocks[r]):
    prefix_cache_on            cfg.prefix_cache ∧ the geometry has the cache
    known_request              active(r)
    scheduler_phase            nxt(r) ⇒ round_forwards = 0
    row_exclusive              nxt(r) ⇒ row[r] != -1
    cache_hit_content/current  nxt(r) ⇒ r has no current block
    cache_hit_content/prompt   nxt(r) ⇒ (k + 1) * B <= prompt_len[r]
    cache_hit_content/index    ¬nxt(r) ⇒ 0 <= k < committed_blocks[r] ∧ ¬reads_block(r, k)
    cache_hit_content/block    0 <= a ∧ a + B <= pool ∧ a mod B = 0 ∧ every t ∈ [a, a+B) is
                               cached (a whole cached block: blocks lie at multiples of B)
    cache_hit_content/key      every t ∈ [a, a+B): cache_block[t] = k ∧
                               same_key(cache_origin[t], r, k)"""
    k, a = p.block_index, p.first_slot

    def nxt(i: int) -> z3.BoolRef:
        return k == s.committed_blocks[i]

    block = [z3.Implies(enc.in_block(a, t), s.cached[t]) for t in range(enc.S)]
    return [
        prefix_cache_on(enc),
        Guard("known_request", for_request(enc, p, lambda i: enc.active(s, i))),
        Guard(
            "scheduler_phase",
            for_request(enc, p, lambda i: z3.Implies(nxt(i), s.round_forwards == 0)),
        ),
        Guard("row_exclusive", for_request(enc, p, lambda i: z3.Implies(nxt(i), s.row[i] != -1))),
        Guard(
            "cache_hit_content",
            for_request(enc, p, lambda i: z3.Implies(nxt(i), s.block_phase[i] == NONE_BLOCK)),
            "current",
        ),
        Guard(
            "cache_hit_content",
            for_request(enc, p, lambda i: z3.Implies(nxt(i), (k + 1) * enc.B <= s.prompt_len[i])),
            "prompt",
        ),
        Guard(
            "cache_hit_content",
            for_request(
                enc,
                p,
                lambda i: z3.Implies(
                    z3.Not(nxt(i)),
                    z3.And(k >= 0, k < s.committed_blocks[i], z3.Not(enc.reads_block(s, i, k))),
                ),
            ),
            "index",
        ),
        Guard(
            "cache_hit_content",
            z3.And(a >= 0, a + enc.B <= enc.pool, a % enc.B == 0, *block),
            "block",
        ),
        Guard(
            "cache_hit_content",
            for_request(
                enc,
                p,
                lambda i: z3.And(
                    [
                        z3.Implies(
                            enc.in_block(a, t),
                            z3.And(s.cache_block[t] == k, enc.same_key(s, s.cache_origin[t], i, k)),
                        )
                        for t in range(enc.S)
                    ]
                ),
            ),
            "key",
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """read_by'(t, r) for t ∈ [a, a+B); committed_blocks'[r] = k + 1 and hit_this_round'[r]
    when k was its next block (the block is committed without a forward)."""
    ins = [enc.in_block(p.first_slot, t) for t in range(enc.S)]
    nxt = [z3.And(p.request == i, p.block_index == s.committed_blocks[i]) for i in range(enc.N)]
    return s.replace(
        hit_this_round=tuple(z3.Or(nxt[i], s.hit_this_round[i]) for i in range(enc.N)),
        read_by=tuple(
            z3.Or(z3.And(ins[t], p.request == i), enc.read_by(s, t, i))
            for t in range(enc.S)
            for i in range(enc.N)
        ),
        committed_blocks=tuple(
            z3.If(nxt[i], s.committed_blocks[i] + 1, s.committed_blocks[i]) for i in range(enc.N)
        ),
    )
