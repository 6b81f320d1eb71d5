"""The Z3 proof suite behind `schedspec prove`.

`run_all_proofs()` runs, in order (`run_proofs()` runs the same and also keeps the mutants'
counterexamples):

1. `inductive/<invariant>`: every named invariant of `spec.invariants.INVARIANTS` is inductive
   (Inv ∧ Trans ⇒ Inv') over the event-level encoding for several concrete sizes and every
   policy; `lemma/<name>`: the strengthening lemmas, proved the same way. Each invariant's
   detail says whether it is inductive on its own; if not, it shows the counterexample to
   induction, the lemmas that exclude it and a BMC showing it is unreachable;
2. `bmc/<invariant>`: BMC from the initial state to depth `bound` (every policy);
3. `mutant/<name>`: each relaxed guard matters: proved when BMC finds a trace the mutant
   allows and SpecMachine rejects its last event with the expected rule (the detail holds the
   trace, the state before the bad event and the derived workload); not that the inductive
   proofs would fail on the mutant (docs/proofs.md measures which do);
4. `theorem/<name>`: the policy theorems (FDFO vs sync) and the in-place-reuse theorem;
5. `boundary/<name>`: Z3-synthesised boundary workloads ("proved" = a witness exists).

Every result must be "proved"; "counterexample" and "unknown" are failures (see `failed`).
`families` (names of `FAMILIES`) runs some of them alone, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from properties.symbolic.bmc import MutantCounterexample, bmc_invariants, mutant_results
from properties.symbolic.boundary import boundary_workloads
from properties.symbolic.induction import DEFAULT_GEOMETRIES, prove_invariants
from properties.symbolic.policy import PolicyBounds
from properties.symbolic.result import DEFAULT_TIMEOUT_MS, ProofResult, Status
from properties.symbolic.theorems import policy_theorems, reuse_theorem

DEFAULT_BOUND = 6
#: The proofs by family, in the order they run: each family's results and what it proves.
FAMILIES = {
    "inductive": "inductive/ and lemma/: the invariants and their lemmas are inductive",
    "bmc": "bmc/: no invariant breaks within the bound, from the initial state",
    "mutants": "mutant/: each relaxed guard matters (BMC finds a trace it allows that the spec "
    "refuses), and its trace replays",
    "theorems": "theorem/: the policy theorems (FDFO vs sync) and in-place reuse",
    "boundary": "boundary/: Z3-synthesised boundary workloads exist",
}

__all__ = [
    "DEFAULT_BOUND",
    "FAMILIES",
    "ProofResult",
    "ProofRun",
    "Status",
    "failed",
    "run_all_proofs",
    "run_proofs",
]


@dataclass(frozen=True)
class ProofRun:
    """One run of every proof: the results in `run_all_proofs` order, and the trace BMC found
    for each symbolic mutant it caught (by mutant name)."""

    results: tuple[ProofResult, ...]
    counterexamples: dict[str, MutantCounterexample]


def policy_bounds(bound: int) -> PolicyBounds:
    """The policy theorems' bounds for a given `bound`: forwards per block and arrival ticks
    up to `bound`, 4 requests, 2 blocks per request, max_running up to 4."""
    return PolicyBounds(requests=4, blocks=2, max_steps=bound, max_arrival=bound, max_running=4)


def run_all_proofs(
    progress: Callable[[str], None] | None = None,
    bound: int | None = None,
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    families: Collection[str] | None = None,
) -> list[ProofResult]:
    """Run every proof (or those of `families`, names of `FAMILIES`); `bound` is the BMC depth
    (events) and the policy theorems' bound on forwards per block and arrival ticks (default
    6). Sizes of the inductive proofs are fixed
    (`properties.symbolic.induction.DEFAULT_GEOMETRIES`)."""
    run = run_proofs(progress, bound, timeout_ms=timeout_ms, families=families)
    return list(run.results)


def run_proofs(
    progress: Callable[[str], None] | None = None,
    bound: int | None = None,
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    families: Collection[str] | None = None,
) -> ProofRun:
    """`run_all_proofs`, keeping the mutants' counterexamples (each replays through
    SpecMachine and the matching reference mutants) beside the results. A `ValueError` for a
    bound below 1 or a family not in `FAMILIES`."""
    k = DEFAULT_BOUND if bound is None else bound
    if k < 1:
        raise ValueError(f"bound must be >= 1, got {k}")
    chosen = set(FAMILIES) if families is None else set(families)
    unknown = sorted(chosen - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown proof family {unknown[0]!r} (valid: {', '.join(FAMILIES)})")
    results: list[ProofResult] = []
    found: list[MutantCounterexample] = []
    if "inductive" in chosen:
        results += prove_invariants(DEFAULT_GEOMETRIES, timeout_ms=timeout_ms, progress=progress)
    if "bmc" in chosen:
        results += bmc_invariants(k, timeout_ms=timeout_ms, progress=progress)
    if "mutants" in chosen:
        mutants, found = mutant_results(timeout_ms=timeout_ms, progress=progress)
        results += mutants
    if "theorems" in chosen:
        results += policy_theorems(policy_bounds(k), timeout_ms=timeout_ms, progress=progress)
        reuse = reuse_theorem(timeout_ms=timeout_ms)
        if progress:
            progress(f"{reuse.name}: {reuse.status} ({reuse.seconds:.2f}s)")
        results.append(reuse)
    if "boundary" in chosen:
        boundary, _ = boundary_workloads(timeout_ms=timeout_ms, progress=progress)
        results += boundary
    return ProofRun(tuple(results), {c.mutant.name: c for c in found})


def failed(results: list[ProofResult]) -> list[ProofResult]:
    """The results that count as failures (anything not proved)."""
    return [r for r in results if r.status != "proved"]
