"""The Z3 layer: a symbolic encoding of the dLLM lifecycle spec and what is proved with it.

- `encoding`: finite-domain symbolic state and ONE quantifier-free transition relation over it
  (one symbolic transition per spec event kind, guards labelled with spec rules, phases read
  from the lifecycle tables), the named invariants as formulas, strengthening lemmas, and the
  maps between concrete `SpecMachine` states / events and symbolic values.
- `induction`: Inv ∧ Trans ⇒ Inv' for every named invariant (two copies of the state), with
  Ivy-style strengthening lemmas where an invariant is true but not inductive.
- `bmc`: bounded model checking from the initial state (k copies of the same relation), and
  seeded symbolic mutants whose counterexamples are replayed as concrete events and workloads.
- `policy`: the scheduling policy at forward granularity (one tick function, sync and FDFO).
- `theorems`: policy theorems (FDFO vs sync, batch size 1, waste, progress) and the
  in-place-reuse theorem over the event-level relation.
- `boundary`: Z3-synthesised boundary workloads (exact-fit pool, simultaneous finishes, ...).
- `drift`, `compile`: the symbolic relation evaluated on concrete states (the drift guard).
- `result`: `ProofResult` and the solver settings (timeouts, fixed seeds).

See docs/proofs.md.
"""
