"""The named invariants of `spec.invariants.INVARIANTS`, as formulas over one state copy.

One function per invariant, registered in `INVARIANTS` (same names and order as the spec's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import COMPLETE, DENOISING, NEW, NONE_BLOCK
from properties.symbolic.state import State
from properties.symbolic.terms import Z, count, select

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def no_leak(enc: Encoding, s: State) -> Z:
    """Every owned slot t is inside the pool and its owner (i, k) is a live block of a
    submitted request: k < committed_blocks[i], or i has a current block and
    k = committed_blocks[i]; a cached slot is inside the pool and owned by no request (free +
    owned + cached = total)."""
    parts = []
    for t in range(enc.S):
        o = s.owner_request[t]
        live = z3.Or(
            [
                z3.And(
                    o == i,
                    s.phase[i] != NEW,
                    z3.Or(
                        s.owner_block[t] < s.committed_blocks[i],
                        z3.And(
                            s.block_phase[i] != NONE_BLOCK,
                            s.owner_block[t] == s.committed_blocks[i],
                        ),
                    ),
                )
                for i in range(enc.N)
            ]
        )
        parts.append(z3.Implies(o != -1, z3.And(t < enc.pool, live)))
        parts.append(z3.Implies(s.cached[t], z3.And(t < enc.pool, o == -1)))
    return z3.And(parts)


def terminal_owns_nothing(enc: Encoding, s: State) -> Z:
    """terminal(i) ⇒ i owns no slot ∧ row[i] = -1 ∧ no row_holder is i ∧ i reads no cached
    block."""
    return z3.And(
        [
            z3.Implies(
                enc.terminal(s, i),
                z3.And(
                    z3.Not(enc.owns_any(s, i)),
                    s.row[i] == -1,
                    z3.And([h != i for h in s.row_holder]),
                    z3.Not(enc.reads_any(s, i)),
                ),
            )
            for i in range(enc.N)
        ]
    )


def max_running(enc: Encoding, s: State) -> Z:
    """|active| <= max_running."""
    return enc.n_active(s) <= enc.cfg.max_running


def row_exclusive(enc: Encoding, s: State) -> Z:
    """row_holder[r] = h != -1 ⇒ r < rows ∧ h submitted ∧ row[h] = r; and
    a submitted request with row[i] = r != -1 ⇒ row_holder[r] = i."""
    submitted = [s.phase[j] != NEW for j in range(enc.N)]
    parts = []
    for r in range(enc.R):
        h = s.row_holder[r]
        parts.append(
            z3.Implies(
                h != -1,
                z3.And(r < enc.cfg.rows, select(submitted, h), select(s.row, h) == r),
            )
        )
    for i in range(enc.N):
        parts.append(
            z3.Implies(
                z3.And(s.phase[i] != NEW, s.row[i] != -1),
                select(s.row_holder, s.row[i]) == i,
            )
        )
    return z3.And(parts)


def whole_block_alloc(enc: Encoding, s: State) -> Z:
    """Every owned slot's owner (i, k) owns exactly B slots."""
    parts = []
    for t in range(enc.S):
        same = count(
            [
                z3.And(
                    s.owner_request[u] == s.owner_request[t],
                    s.owner_block[u] == s.owner_block[t],
                )
                for u in range(enc.S)
            ]
        )
        parts.append(z3.Implies(s.owner_request[t] != -1, same == enc.B))
    return z3.And(parts)


def page_alignment(enc: Encoding, s: State) -> Z:
    """An owned slot t is at its block's page offset (t mod P = offset(k)) or continues its
    predecessor's block inside the page; slots of one block lie in one page; two owned slots
    of one page have the same owner request."""
    P = enc.P
    parts = []
    for t in range(enc.S):
        owned = s.owner_request[t] != -1
        at_offset = (t % P) == enc.page_offset(s.owner_block[t])
        cont = (
            z3.And(
                s.owner_request[t - 1] == s.owner_request[t],
                s.owner_block[t - 1] == s.owner_block[t],
            )
            if t % P != 0
            else z3.BoolVal(False)
        )
        parts.append(z3.Implies(owned, z3.Or(at_offset, cont)))
        for u in range(t + 1, enc.S):
            both = z3.And(owned, s.owner_request[u] != -1)
            if t // P != u // P:
                parts.append(
                    z3.Implies(
                        both,
                        z3.Not(
                            z3.And(
                                s.owner_request[u] == s.owner_request[t],
                                s.owner_block[u] == s.owner_block[t],
                            )
                        ),
                    )
                )
            else:
                parts.append(z3.Implies(both, s.owner_request[u] == s.owner_request[t]))
    return z3.And(parts)


def reuse_keeps_slots(enc: Encoding, s: State) -> Z:
    """An active request's current block with block_start != -1 owns exactly
    [block_start, block_start + B), inside the slot variables."""
    parts = []
    for i in range(enc.N):
        start = s.block_start[i]
        has = z3.And(enc.active(s, i), s.block_phase[i] != NONE_BLOCK, start != -1)
        parts.append(
            z3.Implies(
                has,
                z3.And(
                    start >= 0,
                    start + enc.B <= enc.S,
                    z3.And(
                        [
                            z3.Implies(
                                enc.in_block(start, t),
                                enc.owns(s, t, i, s.committed_blocks[i]),
                            )
                            for t in range(enc.S)
                        ]
                    ),
                ),
            )
        )
    return z3.And(parts)


def carriers_iff_unfinished(enc: Encoding, s: State) -> Z:
    """A carried block (denoising or complete) knows its masks (masks != -1); only active
    requests have a current block."""
    parts = []
    for i in range(enc.N):
        carried = z3.Or(s.block_phase[i] == DENOISING, s.block_phase[i] == COMPLETE)
        parts.append(z3.Implies(carried, s.masks[i] != -1))
        parts.append(
            z3.Implies(z3.And(s.phase[i] != NEW, s.block_phase[i] != NONE_BLOCK), enc.active(s, i))
        )
    return z3.And(parts)


Invariant = Callable[["Encoding", State], Z]

INVARIANTS: Mapping[str, Invariant] = MappingProxyType(
    {
        "no_leak": no_leak,
        "terminal_owns_nothing": terminal_owns_nothing,
        "max_running": max_running,
        "row_exclusive": row_exclusive,
        "whole_block_alloc": whole_block_alloc,
        "page_alignment": page_alignment,
        "reuse_keeps_slots": reuse_keeps_slots,
        "carriers_iff_unfinished": carriers_iff_unfinished,
    }
)


def invariants(enc: Encoding, s: State) -> dict[str, Z]:
    """Every named invariant over `s`, by name."""
    return {name: inv(enc, s) for name, inv in INVARIANTS.items()}
