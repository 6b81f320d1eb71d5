"""Bounded model checking from the initial state: k copies of the one transition relation.

- `bmc_invariants`: no state reachable with <= k events violates any named invariant.
- Seeded symbolic mutants (`mutants.SYMBOLIC_MUTANTS`): the relation with one labelled guard relaxed
  (or replaced by the buggy behaviour), e.g. "a request may finish while it still owns KV".
  BMC finds a trace whose last event is allowed by the mutant but not by the spec; the trace
  is decoded into concrete spec events, replayed through `SpecMachine` (the last event must
  raise `SpecViolation` naming the rule) and converted into a `Workload` that the matching
  reference mutant of the seeded-bug catalogue must fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import z3

from properties.symbolic.codes import KIND
from properties.symbolic.decode import Decoder, render_values
from properties.symbolic.encoding import Encoding
from properties.symbolic.geometry import Geometry, SymConfig, policy_label
from properties.symbolic.guard import Relaxation
from properties.symbolic.mutant import SymbolicMutant
from properties.symbolic.mutants import SYMBOLIC_MUTANTS
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
from properties.symbolic.terms import Z
from properties.symbolic.workloads import describe_ops, replay, workload_from_events
from properties.workload import Workload
from spec.config import DllmConfig
from spec.errors import SpecViolation
from spec.events import CacheEvicted, Event, KvFreed
from spec.profile import DllmPolicy


class Unrolling:
    """init(s0) ∧ T(s0, p0, s1) ∧ ... ∧ T(s_{k-1}, p_{k-1}, s_k) for one encoding."""

    def __init__(
        self,
        enc: Encoding,
        depth: int,
        *,
        last_relax: Sequence[Relaxation] = (),
        prefix: str = "",
    ) -> None:
        self.enc = enc
        self.depth = depth
        self.states: list[State] = [enc.state(f"{prefix}s{j}") for j in range(depth + 1)]
        self.params: list[Params] = [enc.params(f"{prefix}p{j}") for j in range(depth)]
        self.constraints: list[Z] = [enc.init(self.states[0])]
        for j in range(depth):
            relax = last_relax if j == depth - 1 else ()
            self.constraints.append(
                enc.transition(self.states[j], self.params[j], self.states[j + 1], relax)
            )

    def events(self, model: Z, config: DllmConfig) -> list[Event]:
        """The `depth` events `model` assigns to the transitions, in order, decoded for `config`
        (empty frees included: see `drop_noops`)."""
        dec = Decoder(self.enc.geom, config)
        return [dec.event(model, s, p) for s, p in zip(self.states, self.params, strict=False)]


def drop_noops(events: Iterable[Event]) -> list[Event]:
    """Empty frees and evictions are stutter steps (they let a trace be shorter than the
    unrolling)."""
    return [e for e in events if not (isinstance(e, KvFreed | CacheEvicted) and not e.slots)]


# ---------------------------------------------------------------------------- invariants


BMC_GEOMETRY = Geometry(2, 2, 2, requests=2, rows=2, running=2)
DEFAULT_BMC_DEPTH = 6


def bmc_invariants(
    depth: int = DEFAULT_BMC_DEPTH,
    geom: Geometry = BMC_GEOMETRY,
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    progress: Progress | None = None,
) -> list[ProofResult]:
    """One joint query (every invariant, every frame, every policy) at `depth`; reported per
    invariant as "bmc/<name>"."""
    enc = Encoding(geom, SymConfig.symbolic("cfg"))
    names = list(enc.invariants(enc.state("probe")))
    with timed() as t:
        unr = Unrolling(enc, depth)
        frames = [enc.invariants(s) for s in unr.states[1:]]
        sol = solver(timeout_ms)
        sol.add(*unr.constraints)
        sol.add(z3.Or([z3.Not(f[n]) for f in frames for n in names]))
        status = "proved"
        detail = ""
        try:
            if check(sol):
                status = "counterexample"
                m = sol.model()
                bad = [n for n in names for f in frames if not z3.is_true(m.eval(f[n], True))]
                cfg = enc.cfg.decode(m, geom)
                evs = drop_noops(unr.events(m, cfg))
                policy = policy_label(enc.cfg.decode_policy(m))
                detail = f"violated: {sorted(set(bad))}; {cfg}; policy {policy}; trace: {evs}"
        except Unknown as err:
            status = "unknown"
            detail = f"unknown: {err}"
    share = round(t[0] / len(names), 3)
    results = []
    for n in names:
        d = detail or (
            f"no state reachable from the initial state with <= {depth} events violates it "
            f"(one joint query over all {len(names)} invariants at every frame; every policy; "
            f"{geom.label()}; {t[0]:.2f}s in all)"
        )
        results.append(ProofResult(f"bmc/{n}", status, share, d))  # type: ignore[arg-type]
    if progress:
        progress(f"bmc depth {depth}: {status} ({t[0]:.2f}s)")
    return results


# ---------------------------------------------------------------------------- mutants


@dataclass
class MutantCounterexample:
    """A trace BMC found for one symbolic mutant (its last event allowed by the mutant only),
    what `SpecMachine` made of it, and the workload for the matching reference mutant."""

    mutant: SymbolicMutant
    events: list[Event]  # the last one is the bad event
    state_before: str  # SpecMachine rendering before the bad event
    violation: SpecViolation | None  # what SpecMachine raised on the bad event
    workload: Workload
    depth: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        """The counterexample in lines: the mutant, its policy unless the default, the numbered
        events, the spec state before the last one, the violation raised, and the workload."""
        lines = [f"mutant {self.mutant.name}: {self.mutant.description}"]
        if self.mutant.policy != DllmPolicy():
            lines.append(f"policy: {policy_label(self.mutant.policy)}")
        lines += [f"  {i:2d}. {e}" for i, e in enumerate(self.events)]
        lines.append("state before the last event:")
        lines += ["    " + ln for ln in self.state_before.splitlines()]
        if self.violation is not None:
            lines.append(f"SpecMachine: [{self.violation.rule}] {self.violation.detail}")
        lines.append(f"workload: {describe_ops(self.workload)} (then drain)")
        return "\n".join(lines)


def find_mutant_counterexample(
    mutant: SymbolicMutant, *, timeout_ms: int = DEFAULT_TIMEOUT_MS, max_depth: int | None = None
) -> MutantCounterexample | None:
    """BMC with the relaxed relation on the last step, by increasing depth."""
    geom = Geometry.of(mutant.config, mutant.requests)
    enc = Encoding(geom, SymConfig.concrete(mutant.config, mutant.policy))
    depths = [d for d in mutant.depths if max_depth is None or d <= max_depth] or [mutant.depths[0]]
    with timed() as t:
        for depth in depths:
            unr = Unrolling(enc, depth, last_relax=mutant.relax, prefix=f"{mutant.name}.")
            s, p = unr.states[-2], unr.params[-1]
            rule, tag = mutant.violated
            sol = solver(timeout_ms)
            sol.add(*unr.constraints)
            sol.add(p.kind == KIND[mutant.kind])
            sol.add(z3.Not(enc.rule_guard(s, p, mutant.kind, rule, tag)))
            if mutant.extra is not None:
                sol.add(mutant.extra(enc, s, p))
            if mutant.history is not None:
                sol.add(mutant.history(enc, unr.states, unr.params))
            if check(sol):
                m = sol.model()
                evs = drop_noops(unr.events(m, mutant.config))
                before, violation = replay(mutant.config, evs, mutant.policy)
                wl = workload_from_events(mutant.config, evs, f"z3-mutant-{mutant.name}")
                notes = [f"symbolic state before the bad event:\n{render_values(m, s, geom)}"]
                break
        else:
            return None
    return MutantCounterexample(mutant, evs, before, violation, wl, depth, t[0], notes)


def mutant_results(
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    progress: Progress | None = None,
    max_depth: int | None = None,
) -> tuple[list[ProofResult], list[MutantCounterexample]]:
    """For every symbolic mutant the claim "Z3 catches this seeded bug": "proved" when BMC
    finds a trace whose last event the mutant allows AND SpecMachine rejects that event with
    the expected rule (the detail holds the trace, the state and the workload); "unknown" when
    no trace is found within the depths; "counterexample" when SpecMachine disagrees."""
    results: list[ProofResult] = []
    found: list[MutantCounterexample] = []
    for mut in SYMBOLIC_MUTANTS:
        with timed() as t:
            try:
                cex = find_mutant_counterexample(mut, timeout_ms=timeout_ms, max_depth=max_depth)
                err = ""
            except Unknown as e:
                cex, err = None, f"unknown: {e}"
        name = f"mutant/{mut.name}"
        if cex is None:
            results.append(ProofResult(name, "unknown", round(t[0], 3), err or "no trace found"))
        elif cex.violation is None or cex.violation.rule != mut.rule:
            got = "accepts it" if cex.violation is None else f"names {cex.violation.rule}"
            results.append(
                ProofResult(
                    name,
                    "counterexample",
                    round(t[0], 3),
                    f"Z3 found a trace but SpecMachine {got} (expected {mut.rule}):\n"
                    + cex.render(),
                )
            )
        else:
            found.append(cex)
            results.append(
                ProofResult(
                    name,
                    "proved",
                    round(t[0], 3),
                    f"caught: Z3 finds a {len(cex.events)}-event trace (BMC depth {cex.depth}) "
                    f"that SpecMachine rejects with [{mut.rule}]\n" + cex.render(),
                )
            )
        if progress:
            progress(f"{name}: {results[-1].status} ({t[0]:.2f}s)")
    return results, found
