"""The Z3 layer: a symbolic encoding of the dLLM lifecycle spec and what is proved with it.

- `encoding`: finite-domain symbolic state and ONE quantifier-free transition relation over it
  (one symbolic transition per spec event kind), the named invariants as formulas, and the
  maps between concrete `SpecMachine` states / events and symbolic values.
- `induction`: Inv ∧ Trans ⇒ Inv' for every named invariant (two copies of the state), with
  Ivy-style strengthening lemmas where an invariant is true but not inductive.
- `bmc`: bounded model checking from the initial state (k copies of the same relation), and
  seeded symbolic mutants whose counterexamples are replayed as concrete events and workloads.
- `theorems`: policy theorems (FDFO vs sync) over a forward-granularity model, and the
  in-place-reuse theorem over the event-level relation.
- `boundary`: Z3-synthesised boundary workloads (exact-fit pool, simultaneous finishes, ...).
- `drift`: evaluation of the symbolic relation on concrete states (the drift guard's oracle).
"""
