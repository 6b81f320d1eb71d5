"""Inductive proofs of the named invariants: Inv ∧ Trans ⇒ Inv' over two copies of the state.

For each geometry (concrete sizes; the policy stays symbolic, so one proof covers sync and FDFO,
with and without in-place reuse and re-loop, every max_running_requests / req_pool_rows up to
the bound and every max_context):

1. base case: the initial state satisfies every invariant and lemma;
2. step: H(s) ∧ T(s, p, s') ⇒ G(s') for every goal G, where H is the conjunction of all named
   invariants and strengthening lemmas. The relation is split by event kind, and one query per
   kind proves the conjunction of the goals that kind can affect; a goal none of whose
   variables an event kind can change is discharged by the frame argument (its value is
   unchanged and it is among the hypotheses) instead of a query. A goal's seconds are its
   share of the queries it took part in;
3. `whole_block_alloc` is carried as its local form `block_runs` (a lemma) and derived in each
   state: page_alignment ∧ block_runs ∧ domain ⇒ whole_block_alloc (a one-state query).

Each named invariant is also checked ALONE (Inv ∧ domain ∧ T ⇒ Inv'). Where that fails, the
counterexample to induction (CTI) is reported with the lemmas that exclude it, and BMC from the
initial state shows the CTI state is not reachable within the BMC depth (no more: a CTI whose
bad step is a `Finished` lies beyond that depth, the first `Finished` of `CTI_GEOMETRY` being
16 events deep); the strengthened (lemma) proof, run in the proofs' geometries, is what shows
such states unreachable there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import z3

from properties.symbolic.codes import KIND, KIND_NAME
from properties.symbolic.decode import render_values
from properties.symbolic.encoding import Encoding
from properties.symbolic.geometry import Geometry, SymConfig, policy_label
from properties.symbolic.params import Params
from properties.symbolic.result import (
    DEFAULT_TIMEOUT_MS,
    Progress,
    ProofResult,
    Unknown,
    check,
    solver,
    timed,
)
from properties.symbolic.state import State
from properties.symbolic.terms import Z, mentioned, model_int
from spec.config import DllmConfig
from spec.profile import DllmPolicy

# Block sizes 1..4, page sizes one to four blocks, up to 16 KV slots, 4 requests, 4 rows; three
# with the prefix cache. Three blocks a page is where a page can first be continued
# after another request left part of it (`page_alignment/one_request`).
DEFAULT_GEOMETRIES: tuple[Geometry, ...] = (
    Geometry(2, 4, 4),  # 16 slots, 2 blocks per page
    Geometry(1, 1, 8),  # 8 slots, a block per page
    Geometry(3, 6, 2),  # 12 slots, 2 blocks per page
    Geometry(4, 8, 2),  # 16 slots, 2 blocks per page
    Geometry(2, 4, 2, prefix_cache=True),  # 8 slots, 2 blocks per page, the prefix cache
    Geometry(1, 3, 3),  # 9 slots, 3 blocks per page
    Geometry(1, 3, 3, prefix_cache=True),  # 9 slots, 3 blocks per page, the prefix cache
    Geometry(1, 4, 2),  # 8 slots, 4 blocks per page
    Geometry(1, 4, 2, prefix_cache=True),  # 8 slots, 4 blocks per page, the prefix cache
)
# small enough for readable counterexamples to induction and a BMC over them
CTI_GEOMETRY = Geometry(1, 2, 2, requests=2, rows=2, running=2)
CTI_BMC_DEPTH = 6
WHOLE = "whole_block_alloc"


@dataclass
class KindStep:
    """The relation restricted to one event kind."""

    changed: frozenset[str]  # state labels the kind may change
    relation: Z  # T ∧ p.kind = kind, simplified


def kind_steps(enc: Encoding, s: State, p: Params, s2: State) -> dict[str, KindStep]:
    """The relation split by event kind (kind fixed, simplified)."""
    guards = enc.guards(s, p)
    ok = enc.params_ok(s, p)
    eff = enc.effects(s, p)
    pre = dict(s.items())
    post = dict(s2.items())
    out: dict[str, KindStep] = {}
    for kind, code in KIND.items():
        fixed = [(p.kind, z3.IntVal(code))]
        nxt = {k: z3.simplify(z3.substitute(t, *fixed)) for k, t in eff.items()}
        changed = frozenset(k for k, t in nxt.items() if not t.eq(pre[k]))
        rel = z3.And(
            p.kind == code,
            z3.simplify(z3.substitute(ok, *fixed)),
            *[g.expr for g in guards[kind]],
            *[post[k] == t for k, t in nxt.items()],
        )
        out[kind] = KindStep(changed, rel)
    return out


@dataclass
class _Goal:
    name: str
    kind: str  # "invariant" | "lemma"
    seconds: float = 0.0
    status: str = "proved"
    notes: list[str] = field(default_factory=list)


def _prove_geometry(
    geom: Geometry, goals: dict[str, _Goal], timeout_ms: int, progress: Progress | None
) -> None:
    enc = Encoding(geom, SymConfig.symbolic("cfg"))
    s, p, s2 = enc.state("s"), enc.params("p"), enc.state("t")
    inv, inv2 = enc.invariants(s), enc.invariants(s2)
    lem, lem2 = enc.lemmas(s), enc.lemmas(s2)
    pre_terms: dict[str, Z] = {k: v for k, v in inv.items() if k != WHOLE}
    pre_terms.update(lem)
    post_terms: dict[str, Z] = {k: v for k, v in inv2.items() if k != WHOLE}
    post_terms.update(lem2)
    hyps = list(pre_terms.values())
    label = geom.label()

    # 1. base case
    with timed() as t:
        sol = solver(timeout_ms)
        sol.add(enc.init(s))
        sol.add(z3.Not(z3.And(*pre_terms.values(), inv[WHOLE])))
        try:
            bad = check(sol)
        except Unknown as err:
            for g in goals.values():
                g.status = "unknown"
                g.notes.append(f"{label}: base case unknown ({err})")
            return
    share = t[0] / max(1, len(goals))
    for g in goals.values():
        g.seconds += share
    if bad:
        m = sol.model()
        for name, g in goals.items():
            term = inv[name] if name in inv else lem[name]
            if not z3.is_true(m.eval(term, model_completion=True)):
                g.status = "counterexample"
                g.notes.append(f"{label}: the initial state violates it")

    # 2. inductive step, per event kind
    deps = {name: mentioned(term, "s") for name, term in pre_terms.items()}
    steps = kind_steps(enc, s, p, s2)
    for kind, step in steps.items():
        pending = [n for n in post_terms if deps[n] & step.changed]
        # one query per event kind for the conjunction of the goals it can affect (cheaper
        # than one per goal); a failing goal is reported and the rest re-checked
        while pending:
            sol = solver(timeout_ms)
            sol.add(*hyps)
            sol.add(step.relation)
            sol.add(z3.Not(z3.And([post_terms[n] for n in pending])))
            with timed() as t:
                try:
                    cex = check(sol)
                except Unknown as err:
                    for n in pending:
                        goals[n].status = "unknown"
                        goals[n].notes.append(f"{label}: {kind} step unknown ({err})")
                    cex = False
            for n in pending:
                goals[n].seconds += t[0] / len(pending)
            if not cex:
                break
            m = sol.model()
            broken = [n for n in pending if not z3.is_true(m.eval(post_terms[n], True))]
            for n in broken:
                goals[n].status = "counterexample"
                goals[n].notes.append(
                    f"{label}: a {kind} event breaks it from\n{render_values(m, s, geom)}"
                )
            pending = [n for n in pending if n not in broken]

    # 3. whole_block_alloc from its local form, in one state
    with timed() as t:
        sol = solver(timeout_ms)
        sol.add(lem["domain"], inv["page_alignment"], lem["block_runs"], z3.Not(inv[WHOLE]))
        try:
            if check(sol):
                goals[WHOLE].status = "counterexample"
                goals[WHOLE].notes.append(f"{label}: block_runs does not imply it")
        except Unknown as err:
            goals[WHOLE].status = "unknown"
            goals[WHOLE].notes.append(f"{label}: derivation unknown ({err})")
    goals[WHOLE].seconds += t[0]
    if progress:
        progress(f"induction {label}: done")


def _nice(enc: Encoding, s: State) -> Z:
    """Small values, so that a counterexample to induction reads like a real state."""
    g = enc.geom
    parts = [s.round_index >= 0, s.round_index <= 2, s.round_forwards <= 2]
    parts.append(s.round_committed <= 2)
    for i in range(g.requests):
        parts += [
            s.prompt_len[i] >= 0,
            s.prompt_len[i] <= g.kv_slots,
            s.max_new_tokens[i] >= 0,
            s.max_new_tokens[i] <= g.kv_slots,
            s.committed_blocks[i] >= 0,
            s.committed_blocks[i] <= 2,
            s.masks[i] <= g.block_size,
            s.pending_masks[i] >= 0,
            s.pending_masks[i] <= g.block_size,
            s.alloc_round[i] <= s.round_index,
            s.block_start[i] <= g.kv_slots - g.block_size,
            s.reserved_pages[i] >= 0,
            s.reserved_pages[i] <= g.kv_pages,
        ]
    for t in range(g.kv_slots):
        parts += [s.owner_block[t] >= 0, s.owner_block[t] <= 2]
    return z3.And(parts)


_CTI_CACHE: dict[Geometry, tuple[Encoding, State, Params, State, Z]] = {}
_UNROLL_CACHE: dict[tuple[Geometry, int], tuple[list[State], list[Z]]] = {}


def _cti_encoding(geom: Geometry) -> tuple[Encoding, State, Params, State, Z]:
    if geom not in _CTI_CACHE:
        enc = Encoding(geom, SymConfig.symbolic("cfg"))
        s, p, s2 = enc.state("s"), enc.params("p"), enc.state("t")
        _CTI_CACHE[geom] = (enc, s, p, s2, enc.transition(s, p, s2))
    return _CTI_CACHE[geom]


@dataclass(frozen=True, slots=True)
class CtiReport:
    """What `analyse_cti` found for one invariant: inductive alone or not, and its CTIs in words."""

    invariant: str
    inductive_alone: bool
    detail: str


def analyse_cti(
    name: str,
    geom: Geometry = CTI_GEOMETRY,
    depth: int = CTI_BMC_DEPTH,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> CtiReport:
    """Is invariant `name` inductive on its own? If not: its counterexample to induction (CTI)
    and a BMC from the initial state showing the CTI unreachable within `depth` events. Then:
    is it inductive together with the other NAMED invariants? If not, the CTI of that query
    shows which strengthening lemmas it needs (the lemmas that CTI violates), again with a BMC
    showing that CTI unreachable."""
    enc, s, p, s2, rel = _cti_encoding(geom)
    inv, inv2 = enc.invariants(s), enc.invariants(s2)
    lem = enc.lemmas(s)

    def cti(hyps: list[Z]) -> Z | None:
        base = [enc.domain(s), *hyps, rel, z3.Not(inv2[name])]
        for extra in ([_nice(enc, s)], []):
            sol = solver(timeout_ms)
            sol.add(*base, *extra)
            if check(sol):
                return sol.model()
        return None

    def describe(m: Z, label: str) -> tuple[str, bool]:
        kind = KIND_NAME[model_int(m, p.kind)]
        req = model_int(m, p.request)
        violated = [
            k
            for k, term in list(lem.items()) + [(k, v) for k, v in inv.items() if k != name]
            if not z3.is_true(m.eval(term, model_completion=True))
        ]
        config = enc.cfg.decode(m, geom)
        policy = enc.cfg.decode_policy(m)
        target = {k: m.eval(t, model_completion=True) for k, t in s.items(ghosts=False)}
        reachable, secs = cti_reachable(geom, config, target, depth, timeout_ms, policy)
        verdict = (
            f"REACHABLE within {depth} events (a lemma is wrong)"
            if reachable
            else f"unreachable: BMC from the initial state finds no path of <= {depth} events "
            f"to it ({secs:.2f}s)"
        )
        text = (
            f"{label}: a {kind} event (request r{req}) breaks it from this state "
            f"({geom.label()}, mode={config.mode.value} reuse={config.in_place_reuse} "
            f"reloop={config.reloop}, {policy_label(policy)}):\n{render_values(m, s, geom)}\n"
            f"the CTI violates: {', '.join(violated) or '(nothing?)'}; it is {verdict}"
        )
        return text, reachable

    alone = cti([inv[name]])
    if alone is None:
        return CtiReport(name, True, "inductive on its own (with the domain constraints)")
    text, reach_alone = describe(alone, "not inductive alone")
    others = [v for k, v in inv.items() if k != name]
    relative = cti([inv[name], *others])
    if relative is None:
        text += "\ninductive together with the other named invariants (no lemma needed)"
        reachable = reach_alone
    else:
        more, reachable = describe(relative, "not inductive with the other named invariants")
        needed = [
            k
            for k, term in lem.items()
            if not z3.is_true(relative.eval(term, model_completion=True))
        ]
        text += f"\n{more}\nexcluded by the strengthening lemmas: {', '.join(needed)}"
        reachable = reachable or reach_alone
    return CtiReport(name, False, text + ("\nCTI REACHABLE" if reachable else ""))


def cti_reachable(
    geom: Geometry,
    config: DllmConfig,
    target: dict[str, Z],
    depth: int,
    timeout_ms: int,
    policy: DllmPolicy | None = None,
) -> tuple[bool, float]:
    """BMC: can the state `target` (non-ghost values) be reached in <= depth events under
    `config` and `policy`? (The cached symbolic-policy unrolling, pinned to both.)"""
    enc, *_ = _cti_encoding(geom)
    key = (geom, depth)
    if key not in _UNROLL_CACHE:
        states = [enc.state(f"b{j}") for j in range(depth + 1)]
        params = [enc.params(f"q{j}") for j in range(depth)]
        cons = [enc.init(states[0])]
        cons += [enc.transition(states[j], params[j], states[j + 1]) for j in range(depth)]
        _UNROLL_CACHE[key] = (states, cons)
    states, cons = _UNROLL_CACHE[key]
    with timed() as t:
        sol = solver(timeout_ms)
        sol.add(*cons, enc.cfg.pinned_to(config, policy))
        hits = []
        for st in states:
            mine = dict(st.items(ghosts=False))
            hits.append(z3.And([mine[k] == v for k, v in target.items()]))
        sol.add(z3.Or(hits))
        found = check(sol)
    return found, t[0]


def prove_invariants(
    geometries: Iterable[Geometry] = DEFAULT_GEOMETRIES,
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    progress: Progress | None = None,
    cti_depth: int = CTI_BMC_DEPTH,
) -> list[ProofResult]:
    """One result per named invariant ("inductive/<name>") and per lemma ("lemma/<name>")."""
    geoms = tuple(geometries)
    probe = Encoding(geoms[0])
    ps = probe.state("probe")
    goals: dict[str, _Goal] = {k: _Goal(k, "invariant") for k in probe.invariants(ps)}
    goals.update({k: _Goal(k, "lemma") for k in probe.lemmas(ps)})
    for geom in geoms:
        _prove_geometry(geom, goals, timeout_ms, progress)
    sizes = "; ".join(g.label() for g in geoms)
    results: list[ProofResult] = []
    for name, g in goals.items():
        extra = ""
        secs = g.seconds
        if g.kind == "invariant":
            with timed() as t:
                try:
                    rep = analyse_cti(name, depth=cti_depth, timeout_ms=timeout_ms)
                    extra = rep.detail
                    if "REACHABLE" in rep.detail:
                        g.status = "counterexample"
                except Unknown as err:
                    g.status = "unknown"
                    extra = f"CTI analysis unknown ({err})"
            secs += t[0]
        how = (
            "derived in every state from page_alignment ∧ block_runs; block_runs is inductive"
            if name == WHOLE
            else "inductive relative to all named invariants and lemmas"
        )
        detail = f"{how}; every policy; sizes: {sizes}"
        if g.notes:
            detail += "\n" + "\n".join(g.notes)
        if extra:
            detail += "\n" + extra
        prefix = "inductive" if g.kind == "invariant" else "lemma"
        results.append(ProofResult(f"{prefix}/{name}", g.status, round(secs, 3), detail))  # type: ignore[arg-type]
        if progress:
            progress(f"{prefix}/{name}: {g.status} ({secs:.2f}s)")
    return results
