"""Named AR state invariants: predicates over `ArState` that hold after every event.

Each returns None when it holds, or a description of the first counterexample. The rules that
constrain events (budget, order, victim, ...) live in `ArSpecMachine`; `BETWEEN_STEPS` holds
only between steps (not in the middle of a scheduling phase).
"""

from __future__ import annotations

from collections.abc import Callable

from spec.ar.lifecycles import AR_QUEUED_PHASES, AR_TERMINAL_PHASES, ArPhase
from spec.ar.state import ArState

ArInvariant = Callable[[ArState], str | None]


def block_conservation(s: ArState) -> str | None:
    """free + referenced = usable (each block once, whatever its reference count); the holder
    sets (reference counts) and the requests' block tables agree."""
    c = s.config
    held = len(s.block_holders)
    if len(s.free_blocks) + held != c.usable_blocks:
        return f"free {len(s.free_blocks)} + referenced {held} != usable {c.usable_blocks}"
    for b, holders in s.block_holders.items():
        if not holders:
            return f"block {b} is referenced by nobody but counted as held"
        for rid in holders:
            r = s.requests.get(rid)
            if r is None or b not in r.blocks:
                return f"block {b} is held by {rid!r}, whose block table does not list it"
    for rid, r in s.requests.items():
        for b in r.blocks:
            if rid not in s.block_holders.get(b, ()):
                return f"{rid!r} lists block {b}, held by {sorted(s.block_holders.get(b, ()))}"
    return None


def kv_exclusive(s: ArState) -> str | None:
    """Without prefix caching a block has one holder and nothing is cached."""
    if s.config.enable_prefix_caching:
        return None
    for b, holders in s.block_holders.items():
        if len(holders) > 1:
            return f"block {b} is held by {sorted(holders)} with prefix caching off"
    if s.cached:
        return f"blocks {sorted(s.cached)} are cached with prefix caching off"
    return None


def null_block_reserved(s: ArState) -> str | None:
    """The reserved null block (vLLM's block 0) is never held."""
    null = s.config.null_block
    if null is not None and null in s.block_holders:
        return f"the null block {null} is held by {sorted(s.block_holders[null])}"
    return None


def terminal_holds_nothing(s: ArState) -> str | None:
    """A finished or aborted request holds no block; where declared (`free_at_batch_end`), a
    finished one may while a request of its static batch runs (the machine checks, between
    steps and before a step schedules, that it freed them once its batch ended)."""
    for rid, r in s.requests.items():
        if r.phase in AR_TERMINAL_PHASES and r.blocks:
            if r.phase is ArPhase.FINISHED and s.rules.free_at_batch_end:
                continue
            return f"{r.phase.value} request {rid!r} holds blocks {list(r.blocks)}"
    return None


def preempted_holds_nothing(s: ArState) -> str | None:
    """A preempted request holds nothing — except, in the scheduling phase of the step that
    preempted it, the blocks (and cache hits) of its re-admission where the implementation
    re-admits after preempting (Vidur's Sarathi). Between steps no request is in phase
    PREEMPTED, and `waiting_holds_nothing` covers what a re-admission left behind."""
    if s.rules.admit_after_preemption:
        return None
    for rid, r in s.requests.items():
        if r.phase is ArPhase.PREEMPTED and (r.blocks or r.num_computed):
            return (
                f"preempted request {rid!r} holds blocks {list(r.blocks)} and "
                f"{r.num_computed} computed tokens"
            )
    return None


def seat_cap(s: ArState) -> str | None:
    """At most `max_num_seqs` requests run."""
    if len(s.running) > s.config.max_num_seqs:
        return f"{len(s.running)} running > max_num_seqs={s.config.max_num_seqs}"
    return None


def kv_bounded(s: ArState) -> str | None:
    """No request holds more blocks than `max_model_len` tokens need."""
    cap = s.config.max_blocks_per_request
    for rid, r in s.requests.items():
        if len(r.blocks) > cap:
            return f"{rid!r} holds {len(r.blocks)} blocks; max_model_len needs at most {cap}"
    return None


def kv_covers_computed(s: ArState) -> str | None:
    """A running request's blocks hold every token it has computed."""
    bs = s.config.block_size
    for rid in s.running:
        r = s.requests[rid]
        if len(r.blocks) * bs < r.num_computed:
            return (
                f"running {rid!r} computed {r.num_computed} tokens but holds only "
                f"{len(r.blocks)} blocks of {bs}"
            )
    return None


def waiting_holds_nothing(s: ArState) -> str | None:
    """Between steps a waiting or preempted request holds no block and no computed token."""
    for rid, r in s.requests.items():
        if r.phase in AR_QUEUED_PHASES and (r.blocks or r.num_computed):
            return (
                f"waiting {rid!r} holds blocks {list(r.blocks)} / {r.num_computed} computed "
                f"tokens between steps"
            )
    return None


AR_INVARIANTS: dict[str, ArInvariant] = {
    "block_conservation": block_conservation,
    "kv_exclusive": kv_exclusive,
    "null_block_reserved": null_block_reserved,
    "terminal_holds_nothing": terminal_holds_nothing,
    "preempted_holds_nothing": preempted_holds_nothing,
    "seat_cap": seat_cap,
    "kv_bounded": kv_bounded,
}

BETWEEN_STEPS: dict[str, ArInvariant] = {
    "kv_covers_computed": kv_covers_computed,
    "waiting_holds_nothing": waiting_holds_nothing,
}


def check_all(s: ArState, between_steps: bool = False) -> tuple[str, str] | None:
    """(rule, detail) of the first invariant that fails, or None."""
    table = {**AR_INVARIANTS, **BETWEEN_STEPS} if between_steps else AR_INVARIANTS
    for name, inv in table.items():
        detail = inv(s)
        if detail is not None:
            return name, detail
    return None
