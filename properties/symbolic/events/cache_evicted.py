"""`CacheEvicted` (`SpecMachine._cache_evicted`): the cached blocks that make up the slot set
E = {t : p.freed[t]} leave the prefix cache; their slots are free."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.events.common import prefix_cache_on
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    prefix_cache_on           cfg.prefix_cache ∧ the geometry has the cache
    evict_unread_only/cached  every t ∈ E is cached
    evict_unread_only/whole   t ∈ E, u cached in t's block (t div B = u div B) ⇒ u ∈ E
    evict_unread_only/unread  no request reads a t ∈ E"""
    e = p.freed
    whole = [
        z3.Implies(z3.And(e[t], s.cached[u]), e[u])
        for t in range(enc.S)
        for u in range(enc.S)
        if u != t and u // enc.B == t // enc.B
    ]
    unread = [
        z3.Implies(e[t], z3.Not(enc.read_by(s, t, i))) for t in range(enc.S) for i in range(enc.N)
    ]
    return [
        prefix_cache_on(enc),
        Guard(
            "evict_unread_only",
            z3.And([z3.Implies(e[t], s.cached[t]) for t in range(enc.S)]),
            "cached",
        ),
        Guard("evict_unread_only", z3.And(whole), "whole"),
        Guard("evict_unread_only", z3.And(unread), "unread"),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """For t ∈ E: ¬cached'[t], cache_origin'[t] = -1, cache_block'[t] = 0."""
    e = p.freed
    return s.replace(
        cached=tuple(z3.And(z3.Not(e[t]), s.cached[t]) for t in range(enc.S)),
        cache_origin=tuple(z3.If(e[t], -1, s.cache_origin[t]) for t in range(enc.S)),
        cache_block=tuple(z3.If(e[t], 0, s.cache_block[t]) for t in range(enc.S)),
    )
