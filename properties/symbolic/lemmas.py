"""Strengthening lemmas (Ivy-style): facts of every reachable state that make the named
invariants inductive. Each is itself proved (inductive together with the invariants).

One function per lemma, registered in `LEMMAS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import (
    ADMITTED,
    BLK,
    COMMITTED,
    NEW,
    NONE_BLOCK,
    QUEUED,
    REQ,
    RUNNING,
)
from properties.symbolic.state import State
from properties.symbolic.terms import Z

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def domain(enc: Encoding, s: State) -> Z:
    """Value ranges of the representation and a valid configuration: phase and block_phase
    are codes, -1 <= row < R, block_start, masks, alloc_round >= -1, row holders, slot
    owners and cache origins are -1 or request indices, shared prefixes are >= 0, the round
    counters are >= 0."""
    parts = [enc.cfg.constraints(enc.geom)]
    for i in range(enc.N):
        parts += [
            s.phase[i] >= 0,
            s.phase[i] <= max(REQ.values()),
            s.block_phase[i] >= 0,
            s.block_phase[i] <= max(BLK.values()),
            s.row[i] >= -1,
            s.row[i] < enc.R,
            s.block_start[i] >= -1,
            s.masks[i] >= -1,
            s.alloc_round[i] >= -1,
        ]
    parts += [z3.And(h >= -1, h < enc.N) for h in s.row_holder]
    for t in range(enc.S):
        parts += [
            s.owner_request[t] >= -1,
            s.owner_request[t] < enc.N,
            s.freed_by[t] >= -1,
            s.freed_by[t] < enc.N,
            s.cache_origin[t] >= -1,
            s.cache_origin[t] < enc.N,
        ]
    parts += [x >= 0 for x in s.shared_prefix]
    parts += [s.round_index >= 0, s.round_forwards >= 0, s.round_committed >= 0]
    return z3.And(parts)


def unsubmitted_is_blank(enc: Encoding, s: State) -> Z:
    """A request not yet submitted has no block, row, pending step, slot, row holder or cached
    block it reads."""
    return z3.And(
        [
            z3.Implies(
                s.phase[i] == NEW,
                z3.And(
                    s.block_phase[i] == NONE_BLOCK,
                    s.row[i] == -1,
                    z3.Not(s.step_pending[i]),
                    z3.Not(enc.owns_any(s, i)),
                    z3.And([h != i for h in s.row_holder]),
                    z3.Not(enc.reads_any(s, i)),
                ),
            )
            for i in range(enc.N)
        ]
    )


def queued_holds_nothing(enc: Encoding, s: State) -> Z:
    """A queued request has no block, row, pending step, slot or cached block it reads."""
    return z3.And(
        [
            z3.Implies(
                s.phase[i] == QUEUED,
                z3.And(
                    s.block_phase[i] == NONE_BLOCK,
                    s.row[i] == -1,
                    z3.Not(s.step_pending[i]),
                    z3.Not(enc.owns_any(s, i)),
                    z3.Not(enc.reads_any(s, i)),
                ),
            )
            for i in range(enc.N)
        ]
    )


def running_iff_current_block(enc: Encoding, s: State) -> Z:
    """An active request is running exactly when it has a current block."""
    return z3.And(
        [
            z3.Implies(
                z3.Or(s.phase[i] == ADMITTED, s.phase[i] == RUNNING),
                (s.phase[i] == RUNNING) == (s.block_phase[i] != NONE_BLOCK),
            )
            for i in range(enc.N)
        ]
    )


def slotless_block_owns_nothing(enc: Encoding, s: State) -> Z:
    """A current block with block_start = -1 owns no slot."""
    return z3.And(
        [
            z3.Implies(
                z3.And(s.block_phase[i] != NONE_BLOCK, s.block_start[i] == -1),
                z3.And([z3.Not(enc.owns(s, t, i, s.committed_blocks[i])) for t in range(enc.S)]),
            )
            for i in range(enc.N)
        ]
    )


def pending_rows_are_running(enc: Encoding, s: State) -> Z:
    """step_pending[i] ⇒ phase[i] = running."""
    return z3.And([z3.Implies(s.step_pending[i], s.phase[i] == RUNNING) for i in range(enc.N)])


def current_block_allocated(enc: Encoding, s: State) -> Z:
    """A current block is never `committed` and 0 <= alloc_round <= round_index."""
    return z3.And(
        [
            z3.Implies(
                s.block_phase[i] != NONE_BLOCK,
                z3.And(
                    s.block_phase[i] != COMMITTED,
                    s.alloc_round[i] >= 0,
                    s.alloc_round[i] <= s.round_index,
                ),
            )
            for i in range(enc.N)
        ]
    )


def block_runs(enc: Encoding, s: State) -> Z:
    """Local form of whole blocks: an owned slot at its block's page offset starts a run of
    exactly B slots with the same owner. With `page_alignment` (every owned slot is at its
    offset or continues its predecessor, one page per block) this implies
    `whole_block_alloc`, and it is much cheaper to carry through a transition."""
    b, P = enc.B, enc.P
    parts = []
    for t in range(enc.S):
        c = t % P
        if c % b or c + b > P:
            continue
        starts = z3.And(s.owner_request[t] != -1, enc.page_offset(s.owner_block[t]) == c)

        def same_owner(u: int, t: int = t) -> Z:
            return z3.And(
                s.owner_request[u] == s.owner_request[t], s.owner_block[u] == s.owner_block[t]
            )

        same = [same_owner(t + j) for j in range(1, b)]
        if c + b < P:
            same.append(z3.Not(same_owner(t + b)))
        parts.append(z3.Implies(starts, z3.And(same)))
    return z3.And(parts)


def cache_off_holds_nothing(enc: Encoding, s: State) -> Z:
    """Without a prefix cache no slot is cached and no request reads one; with it, only a
    cached slot is read: ¬cfg.prefix_cache ⇒ ∀t: ¬cached[t]; read_by(t, i) ⇒ cached[t]."""
    reads = [
        z3.Implies(enc.read_by(s, t, i), s.cached[t]) for t in range(enc.S) for i in range(enc.N)
    ]
    off = z3.Implies(z3.Not(enc.cfg.prefix_cache), z3.And([z3.Not(c) for c in s.cached]))
    return z3.And(off, *reads)


def cache_reads_are_committed_once(enc: Encoding, s: State) -> Z:
    """A request reads a cached block only as a block it has committed, and each such block
    once: read_by(t, i) ∧ cached[t] ⇒ cache_block[t] < committed_blocks[i], and two slots it
    reads as one block index lie in one block (t div B = u div B)."""
    parts = []
    for i in range(enc.N):
        for t in range(enc.S):
            reads_t = z3.And(enc.read_by(s, t, i), s.cached[t])
            parts.append(z3.Implies(reads_t, s.cache_block[t] < s.committed_blocks[i]))
            for u in range(t + 1, enc.S):
                if u // enc.B == t // enc.B:
                    continue
                both = z3.And(reads_t, enc.read_by(s, u, i), s.cached[u])
                parts.append(z3.Implies(both, s.cache_block[t] != s.cache_block[u]))
    return z3.And(parts)


Lemma = Callable[["Encoding", State], Z]

LEMMAS: Mapping[str, Lemma] = MappingProxyType(
    {
        "domain": domain,
        "unsubmitted_is_blank": unsubmitted_is_blank,
        "queued_holds_nothing": queued_holds_nothing,
        "running_iff_current_block": running_iff_current_block,
        "slotless_block_owns_nothing": slotless_block_owns_nothing,
        "pending_rows_are_running": pending_rows_are_running,
        "current_block_allocated": current_block_allocated,
        "block_runs": block_runs,
        "cache_off_holds_nothing": cache_off_holds_nothing,
        "cache_reads_are_committed_once": cache_reads_are_committed_once,
    }
)


def lemmas(enc: Encoding, s: State) -> dict[str, Z]:
    """Every strengthening lemma over `s`, by name."""
    return {name: lemma(enc, s) for name, lemma in LEMMAS.items()}
