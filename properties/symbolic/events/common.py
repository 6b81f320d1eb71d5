"""Helpers the per-kind guard and effect functions share."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import z3

from properties.symbolic.codes import NONE_BLOCK
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State, Terms
from properties.symbolic.terms import Z

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def for_request(enc: Encoding, p: Params, f: Callable[[int], Z]) -> Z:
    """f at the event's request: ∧_i (request = i ⇒ f(i))."""
    return z3.And([z3.Implies(p.request == i, f(i)) for i in range(enc.N)])


def at_request(enc: Encoding, p: Params, terms: Terms, f: Callable[[int], Z]) -> Terms:
    """`terms` with the event's request's entry set to f: x'[i] = If(request = i, f(i), x[i])."""
    return tuple(z3.If(p.request == i, f(i), terms[i]) for i in range(enc.N))


def without_current_block(enc: Encoding, s: State, p: Params) -> dict[str, Any]:
    """The event's request has no current block afterwards: block_phase' = (none),
    block_start' = -1, masks' = -1, alloc_round' = -1."""
    return {
        "block_phase": at_request(enc, p, s.block_phase, lambda i: NONE_BLOCK),
        "block_start": at_request(enc, p, s.block_start, lambda i: -1),
        "masks": at_request(enc, p, s.masks, lambda i: -1),
        "alloc_round": at_request(enc, p, s.alloc_round, lambda i: -1),
    }


def prefix_cache_on(enc: Encoding) -> Guard:
    """The first guard of every prefix-cache event kind: the configuration has the cache
    (rule prefix_cache_on): cfg.prefix_cache, in a geometry with the cache (false without)."""
    return Guard("prefix_cache_on", z3.And(enc.cfg.prefix_cache, enc.geom.prefix_cache))
