"""The Z3 layer: a symbolic encoding of the dLLM lifecycle spec and what is proved with it.

Shaped like the spec machine it encodes (see docs/proofs.md, "Where is what"):

- the encoding: `codes` (phase, event-kind and reason codes from the spec's tables),
  `geometry` (sizes; the policy as z3 terms), `state` (the symbolic `AbstractState`),
  `params` (an event's parameters), `encoding` (`Encoding`: sizes, copies, derived
  predicates), `events/<kind>.py` (one module per event kind, as `SpecMachine._<kind>`: its
  labelled guards and its effect, registered in `events.EVENTS`), `relation` (the one
  transition relation built from them), `invariants` and `lemmas` (one function each),
  `rules` (where each rule of `spec.rules` is encoded);
- concrete <-> symbolic: `concrete` (spec state and events to values), `decode` (models to
  spec events and readable states);
- the proofs: `induction` (Inv ∧ T ⇒ Inv', Ivy-style lemmas, counterexamples to induction),
  `bmc` (bounded model checking, mutant traces), `mutants` (the seeded symbolic mutants;
  `finish_mutants` and `cache_mutants` hold those of the finish rules and the prefix cache),
  `policy` and `theorems` (forward-granularity policy model and its theorems), `boundary`
  (Z3-synthesised boundary workloads), `workloads` (configs, workloads and replay shared by
  the searches), `result` (`ProofResult`, solver settings);
- the drift guard: `drift` and `compile` (the relation evaluated on concrete states).
"""
