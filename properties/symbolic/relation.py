"""The transition relation T(s, p, s'): ONE quantifier-free formula over two state copies and
the event parameters,

    T(s, p, s') = well_formed(s, p) ∧ ∨_kind (p.kind = kind ∧ guards_kind(s, p))
                  ∧ s' = next_state(s, p)

where next_state is, for every variable, an if-then-else over the kinds whose effect changes
it. The guards and effects of each kind are in `events/<kind>.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import z3

from properties.symbolic.codes import KIND, NEW, REASON
from properties.symbolic.events import EVENTS
from properties.symbolic.guard import Guard, Relaxation
from properties.symbolic.params import Params
from properties.symbolic.state import FIELDS, Scope, State
from properties.symbolic.terms import Z, select
from spec.events import CacheEvicted, CacheHit, CacheReleased, KvCached, Submitted

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


CACHE_KINDS = frozenset(t.kind for t in (KvCached, CacheHit, CacheReleased, CacheEvicted))


def well_formed(enc: Encoding, s: State, p: Params) -> Z:
    """Well-formed parameters (not spec guards):
    0 <= kind < #kinds, 0 <= request < N, 0 <= row < R, reason a `codes.REASON` code;
    Submitted takes the next unsubmitted index (request = i ⇒ every j < i is submitted: the
    symmetry reduction that makes the FCFS queue "the queued requests by index");
    reserved_pages = ceil((prompt_len + max_new_tokens) / P) (ghost);
    block_has_eos ⇒ an EOS is configured and the block [k*B, k*B+B), k = committed_blocks,
    overlaps the generated positions [prompt_len, prompt_len + max_new_tokens);
    block_has_stop_token ⇒ the request lists stop token ids and the block overlaps them too;
    stop_token_first ⇒ block_has_stop_token ∧ block_has_eos (the order matters only then);
    Submitted of request i: 0 <= shared_with[j], shared_with[j] * B <= prompt_len and
    shared_with[j] * B <= prompt_len[j] for j < i (whole blocks of both prompts),
    shared_with[j] = 0 for j >= i, and the shared prefixes are those of a tree of prompts:
    shared_with[k] >= min(shared_with[j], shared_prefix(j, k)) and
    shared_prefix(j, k) >= min(shared_with[j], shared_with[k]) for j, k < i."""
    n = enc.N
    committed = select(s.committed_blocks, p.request)
    prompt_len = select(s.prompt_len, p.request)
    max_new = select(s.max_new_tokens, p.request)
    block_start = committed * enc.B
    overlaps_generated = z3.And(
        block_start < prompt_len + max_new,
        block_start + enc.B > prompt_len,
    )
    eos_possible = z3.And(enc.cfg.eos, overlaps_generated)
    stop_possible = z3.And(select(s.has_stop_token_ids, p.request), overlaps_generated)
    return z3.And(
        p.kind >= 0,
        p.kind < len(KIND),
        p.request >= 0,
        p.request < n,
        p.row >= 0,
        p.row < enc.R,
        z3.Or([p.reason == code for code in REASON.values()]),
        z3.Implies(
            p.is_kind(Submitted.kind),
            z3.And(
                [
                    z3.Implies(p.request == i, z3.And([s.phase[j] != NEW for j in range(i)]))
                    for i in range(n)
                ]
            ),
        ),
        enc.P * (p.reserved_pages - 1) < p.prompt_len + p.max_new_tokens,
        p.prompt_len + p.max_new_tokens <= enc.P * p.reserved_pages,
        z3.Implies(p.block_has_eos, eos_possible),
        z3.Implies(p.block_has_stop_token, stop_possible),
        z3.Implies(p.stop_token_first, z3.And(p.block_has_stop_token, p.block_has_eos)),
        z3.Implies(p.is_kind(Submitted.kind), _a_tree_of_prompts(enc, s, p)),
    )


def _a_tree_of_prompts(enc: Encoding, s: State, p: Params) -> Z:
    """The `Submitted` part of `well_formed` on `shared_with` (see there); true in a geometry
    without the cache, where it is the constant 0."""
    if not enc.geom.prefix_cache:
        return z3.BoolVal(True)
    n, sw = enc.N, p.shared_with
    parts = []
    for i in range(n):
        mine = []
        for j in range(n):
            if j >= i:
                mine.append(sw[j] == 0)
                continue
            mine += [sw[j] >= 0, sw[j] * enc.B <= p.prompt_len, sw[j] * enc.B <= s.prompt_len[j]]
            for k in range(j):
                theirs = s.shared_prefix[j * n + k]
                mine.append(sw[k] >= z3.If(sw[j] < theirs, sw[j], theirs))
                mine.append(sw[j] >= z3.If(sw[k] < theirs, sw[k], theirs))
                mine.append(theirs >= z3.If(sw[j] < sw[k], sw[j], sw[k]))
        parts.append(z3.Implies(p.request == i, z3.And(mine)))
    return z3.And(parts)


def guards(enc: Encoding, s: State, p: Params) -> dict[str, list[Guard]]:
    """The labelled guards of every event kind, by kind (`events.EVENTS`)."""
    return {kind: e.guards(enc, s, p) for kind, e in EVENTS.items()}


def next_state(enc: Encoding, s: State, p: Params) -> State:
    """The successor terms: x' = If(kind = k1, x_k1, If(kind = k2, x_k2, ... x)) over the kinds
    k1, k2, ... whose effect changes x (later kinds outermost). In a geometry without the
    prefix cache its event kinds are never enabled (`prefix_cache_on`), so their effects are
    left out: smaller terms for every other query."""
    after = {
        kind: e.effect(enc, s, p)
        for kind, e in EVENTS.items()
        if enc.geom.prefix_cache or kind not in CACHE_KINDS
    }
    changes: dict[str, Any] = {}
    for f in FIELDS:
        old = getattr(s, f.name)
        if f.scope is Scope.ROUND:
            value = old
            for kind, nxt in after.items():
                new = getattr(nxt, f.name)
                if new is not old:
                    value = z3.If(p.kind == KIND[kind], new, value)
            changes[f.name] = value
            continue
        values = list(old)
        for kind, nxt in after.items():
            new_terms = getattr(nxt, f.name)
            if new_terms is old:
                continue
            for i, (new, was) in enumerate(zip(new_terms, old, strict=True)):
                if new is not was:
                    values[i] = z3.If(p.kind == KIND[kind], new, values[i])
        changes[f.name] = tuple(values)
    return s.replace(**changes)


def enabled(
    enc: Encoding,
    s: State,
    p: Params,
    relax: Sequence[Relaxation] = (),
    by_kind: Mapping[str, list[Guard]] | None = None,
) -> Z:
    """∨_kind (p.kind = kind ∧ its guards), with the relaxations applied (a relaxed guard is
    dropped or replaced)."""
    table = by_kind if by_kind is not None else guards(enc, s, p)
    alts = []
    for kind, gs in table.items():
        conj = []
        for g in gs:
            rx = next((r for r in relax if r.matches(kind, g)), None)
            if rx is None:
                conj.append(g.expr)
            elif rx.replacement is not None:
                conj.append(rx.replacement(s, p))
        alts.append(z3.And(p.kind == KIND[kind], *conj))
    return z3.Or(alts)


def build_transition(
    enc: Encoding, s: State, p: Params, s2: State, relax: Sequence[Relaxation] = ()
) -> Z:
    """T(s, p, s2) = well_formed(s, p) ∧ enabled(s, p) ∧ s2 = next_state(s, p)."""
    nxt = next_state(enc, s, p)
    return z3.And(well_formed(enc, s, p), enabled(enc, s, p, relax), s2.equals(nxt))


def transition(
    enc: Encoding, s: State, p: Params, s2: State, relax: Sequence[Relaxation] = ()
) -> Z:
    """T(s, p, s2): event p is well-formed, enabled in s, and s2 is its effect.

    The relation is built once per encoding (and relaxation) over template copies and
    instantiated for (s, p, s2) by substitution: every copy is the same definition."""
    key = tuple(relax)
    if key not in enc.templates:
        ts, tp, ts2 = enc.state("T.s"), enc.params("T.p"), enc.state("T.t")
        enc.templates[key] = (ts, tp, ts2, build_transition(enc, ts, tp, ts2, relax))
    ts, tp, ts2, rel = enc.templates[key]
    pairs = list(zip(ts.terms(), s.terms(), strict=True))
    pairs += list(zip(tp.items().values(), p.items().values(), strict=True))
    pairs += list(zip(ts2.terms(), s2.terms(), strict=True))
    return z3.substitute(rel, *pairs)


def rule_guard(enc: Encoding, s: State, p: Params, kind: str, rule: str, tag: str = "") -> Z:
    """The conjunction of the guards of `kind` labelled `rule` (and `tag`)."""
    gs = [
        g.expr
        for g in EVENTS[kind].guards(enc, s, p)
        if g.rule == rule and (not tag or g.tag == tag)
    ]
    return z3.And(gs) if gs else z3.BoolVal(True)
