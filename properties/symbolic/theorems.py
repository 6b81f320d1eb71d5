"""Policy theorems, proved for every step-count vector within the bounds.

Over the forward-granularity policy model (`policy`), for every number of blocks per request,
every step count per block, every arrival pattern (FCFS order) and every max_running_requests
within `PolicyBounds`, these results `theorem/<name>` (seven from `policy_theorems`, the
eighth below from `reuse_theorem`; until 2026-12-06 this list also named a
`horizon_suffices`, which no code produces: completion within a bound is `progress_*`):

- `fdfo_completion_le_sync`: every request completes no later under FDFO than under sync
  (time in forwards; sync counted at the forward that finishes its last block, i.e. before
  the head-of-line wait for the rest of the batch);
- `bs1_same_forwards`: at max_running_requests = 1 the two modes run the identical sequence
  of forwards (same request, block and step in every forward);
- `fdfo_no_waste`: FDFO never forwards a row whose block is already done;
- `progress_fdfo`, `progress_sync`: no forward undoes progress, and from the last arrival on
  every forward advances an unfinished request, so every request completes within (last
  arrival + all blocks' forwards) forwards;
- `sync_waste`: a sync batch of blocks with step counts T_1..T_n wastes exactly
  Σ (max T − T_i) row-steps (re-stepping done rows), for every n <= requests;
- `sync_waste_abc`: the A/B/C example (3, 8, 2) wastes 11;

and over the event-level relation (`encoding`), with ghost variables:

- `reuse_keeps_block`: under in-place reuse, an unfinished block that is forwarded again in a
  later round was neither freed nor re-allocated in between, still holds exactly the slots it
  held when its round ended, and its row is marked reused; KvAllocated is never enabled for a
  request that has a current block.
"""

from __future__ import annotations

import z3

from properties.symbolic.codes import COMPLETE, DENOISING, KIND, MASKED, NONE_BLOCK
from properties.symbolic.encoding import Encoding
from properties.symbolic.geometry import Geometry, SymConfig
from properties.symbolic.induction import kind_steps
from properties.symbolic.policy import (
    WAIT,
    PolicyBounds,
    PolicyInputs,
    PolicyRun,
    Tick,
    finished_at,
    fresh_tick,
    row_key,
    tick,
    total_steps,
    well_formed,
)
from properties.symbolic.policy import progress as progress_of
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

ABC_EXAMPLE = (3, 8, 2)


def _prove(name: str, hyps: list[Z], claim: Z, timeout_ms: int, what: str) -> ProofResult:
    with timed() as t:
        sol = solver(timeout_ms)
        sol.add(*hyps)
        sol.add(z3.Not(claim))
        try:
            if check(sol):
                return ProofResult(
                    name, "counterexample", 0.0, f"counterexample: {_inputs(sol.model())}"
                )
            status, detail = "proved", what
        except Unknown as err:
            status, detail = "unknown", f"unknown: {err}"
    return ProofResult(name, status, round(t[0], 3), detail)  # type: ignore[arg-type]


def _inputs(model: Z) -> str:
    vals = sorted(
        (str(d.name()), model[d]) for d in model.decls() if str(d.name()).startswith("in.")
    )
    return ", ".join(f"{k}={v}" for k, v in vals)


def _bounds_text(b: PolicyBounds) -> str:
    return (
        f"requests <= {b.requests}, blocks per request <= {b.blocks}, forwards per block "
        f"1..{b.max_steps}, arrivals 0..{b.max_arrival}, max_running 1..{b.max_running}, "
        f"horizon {b.horizon} forwards"
    )


DEFAULT_POLICY_BOUNDS = PolicyBounds()
REUSE_GEOMETRY = Geometry(2, 4, 2, requests=3, rows=3, running=3)


def policy_theorems(
    bounds: PolicyBounds = DEFAULT_POLICY_BOUNDS,
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    progress: Progress | None = None,
) -> list[ProofResult]:
    """Relational induction over symbolic time: two copies of the policy state (FDFO, sync)
    stepped by the same tick function from any well-formed pair of states at any tick t."""
    n = bounds.requests
    out: list[ProofResult] = []
    inp = PolicyInputs(bounds)
    t = z3.Int("t")
    fd0, sy0 = fresh_tick(n, "fd"), fresh_tick(n, "sy")
    fd1, fwd_f, _ = tick(inp, False, t, fd0)
    sy1, fwd_s, _ = tick(inp, True, t, sy0)
    text = _bounds_text(bounds)
    inputs = inp.constraints()

    def initial(x: Tick) -> Z:
        return z3.And([s == WAIT for s in x.st] + [b == 0 for b in x.blk + x.rem])

    def wf(x: Tick, at: Z) -> Z:
        return well_formed(inp, x, at)

    def ahead(a: Tick, b: Tick) -> Z:
        return z3.And([progress_of(inp, a, i) >= progress_of(inp, b, i) for i in range(n)])

    def equal(a: Tick, b: Tick) -> Z:
        return z3.And(
            [x == y for x, y in zip(a.st + a.blk + a.rem, b.st + b.blk + b.rem, strict=True)]
        )

    pre = [inputs, t >= 0, wf(fd0, t), wf(sy0, t)]

    # FDFO completes every request no later than sync: FDFO is ahead of sync in every
    # request's progress at every tick (base, step), and being ahead means finishing first.
    out.append(
        _induct(
            "theorem/fdfo_completion_le_sync",
            timeout_ms,
            base=[inputs, initial(fd0), initial(sy0)],
            base_goal=z3.And(wf(fd0, 0), wf(sy0, 0), ahead(fd0, sy0)),
            step=[*pre, ahead(fd0, sy0)],
            step_goal=z3.And(wf(fd1, t + 1), wf(sy1, t + 1), ahead(fd1, sy1)),
            use=[*pre, ahead(fd0, sy0)],
            use_goal=z3.And(
                [z3.Implies(finished_at(inp, sy0, i), finished_at(inp, fd0, i)) for i in range(n)]
            ),
            what="per request, the forward that completes it under FDFO comes no later than "
            "under sync, for every arrival pattern and step counts (same FCFS order and "
            "max_running; time in forwards, unbounded; sync counted at the forward that "
            "finishes its last block). Proved by a simulation: at every tick FDFO has done at "
            f"least as many of each request's forwards as sync; {text}",
        )
    )
    same_rows = z3.And(
        [
            a == b
            for i in range(n)
            for a, b in zip(row_key(fwd_f, i), row_key(fwd_s, i), strict=True)
        ]
    )
    bs1 = inp.max_running == 1
    out.append(
        _induct(
            "theorem/bs1_same_forwards",
            timeout_ms,
            base=[inputs, bs1, initial(fd0), initial(sy0)],
            base_goal=equal(fd0, sy0),
            step=[*pre, bs1, equal(fd0, sy0)],
            step_goal=z3.And(equal(fd1, sy1), same_rows),
            use=None,
            use_goal=None,
            what="at max_running_requests = 1 FDFO and sync are in the same state before "
            "every tick and run the same forward (request, block, step within the block) at "
            f"every tick, for every arrival pattern and step counts; {text}",
        )
    )
    out.append(
        _induct(
            "theorem/fdfo_no_waste",
            timeout_ms,
            base=None,
            base_goal=None,
            step=[inputs, t >= 0, wf(fd0, t)],
            step_goal=z3.And([z3.Not(w) for w in fwd_f.waste]),
            use=None,
            use_goal=None,
            what="FDFO never forwards a row whose block is already done (every forward row "
            f"advances its block); {text}",
        )
    )
    # liveness: after the last arrival every forward advances some unfinished request
    last_arrival = inp.arrival[n - 1]
    for tag, x0, x1 in (("fdfo", fd0, fd1), ("sync", sy0, sy1)):
        remaining0 = z3.Sum([total_steps(inp, i) - progress_of(inp, x0, i) for i in range(n)])
        remaining1 = z3.Sum([total_steps(inp, i) - progress_of(inp, x1, i) for i in range(n)])
        unfinished = z3.Or([z3.Not(finished_at(inp, x0, i)) for i in range(n)])
        out.append(
            _induct(
                f"theorem/progress_{tag}",
                timeout_ms,
                base=None,
                base_goal=None,
                step=[inputs, t >= 0, wf(x0, t)],
                step_goal=z3.And(
                    remaining1 <= remaining0,
                    remaining0 >= 0,
                    z3.Implies(z3.And(t >= last_arrival, unfinished), remaining1 < remaining0),
                ),
                use=None,
                use_goal=None,
                what=f"{tag.upper()}: no forward undoes progress, and from the last arrival on "
                "every forward advances some unfinished request, so every request completes "
                "within (last arrival + Σ forwards of all blocks) forwards; " + text,
            )
        )
    out.append(sync_waste(bounds, timeout_ms=timeout_ms))
    out.append(abc_example(timeout_ms=timeout_ms))
    if progress:
        for r in out:
            progress(f"{r.name}: {r.status} ({r.seconds:.2f}s)")
    return out


def _induct(
    name: str,
    timeout_ms: int,
    *,
    base: list[Z] | None,
    base_goal: Z | None,
    step: list[Z],
    step_goal: Z,
    use: list[Z] | None,
    use_goal: Z | None,
    what: str,
) -> ProofResult:
    """Base (initial ⇒ invariant), step (invariant ∧ tick ⇒ invariant'), use (invariant ⇒
    claim); each an unsat check of the negation."""
    total = 0.0
    # non-vacuity: the step's hypotheses have a model
    with timed() as t0:
        sol = solver(timeout_ms)
        sol.add(*step)
        try:
            if not check(sol):
                return ProofResult(name, "unknown", 0.0, "vacuous: the hypotheses are unsat")
        except Unknown as err:
            return ProofResult(name, "unknown", 0.0, f"unknown: {err}")
    total += t0[0]
    parts = [("base", base, base_goal), ("step", step, step_goal), ("use", use, use_goal)]
    for label, hyps, goal in parts:
        if hyps is None or goal is None:
            continue
        r = _prove(name, hyps, goal, timeout_ms, what)
        total += r.seconds
        if r.status != "proved":
            return ProofResult(name, r.status, round(total, 3), f"{label}: {r.detail}")
    return ProofResult(name, "proved", round(total, 3), what)


def _batch(n: int, bounds: PolicyBounds, name: str) -> tuple[PolicyInputs, PolicyRun, list[Z]]:
    """One sync batch: n single-block requests, all arrived, all admitted together."""
    b = PolicyBounds(
        requests=n,
        blocks=1,
        max_steps=bounds.max_steps,
        max_arrival=0,
        max_running=max(n, 1),
    )
    inp = PolicyInputs(b, name=name)
    run = PolicyRun(inp, sync=True, horizon=bounds.max_steps + 1, name=name + ".sync")
    hyps = [inp.constraints(), *run.constraints, inp.max_running == n]
    return inp, run, hyps


def sync_waste(bounds: PolicyBounds, *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ProofResult:
    """The theorem "theorem/sync_waste": for n = 1..`bounds.requests`, a sync batch of n
    one-block requests needing T_1..T_n forwards (each 1..`bounds.max_steps`) wastes exactly
    Σ(max T − T_i) row-steps; else the result for the first n not proved."""
    total = 0.0
    for n in range(1, bounds.requests + 1):
        inp, run, hyps = _batch(n, bounds, f"batch{n}")
        ts = [inp.steps[i][0] for i in range(n)]
        mx = ts[0]
        for x in ts[1:]:
            mx = z3.If(x > mx, x, mx)
        claim = run.wasted() == z3.Sum([mx - x for x in ts])
        r = _prove("theorem/sync_waste", hyps, claim, timeout_ms, "")
        total += r.seconds
        if r.status != "proved":
            return ProofResult(r.name, r.status, round(total, 3), f"batch of {n}: {r.detail}")
    return ProofResult(
        "theorem/sync_waste",
        "proved",
        round(total, 3),
        "a sync batch of n blocks with forwards T_1..T_n wastes exactly Σ(max T − T_i) "
        f"row-steps, for n = 1..{bounds.requests} and T_i in 1..{bounds.max_steps}",
    )


def abc_example(*, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ProofResult:
    """The A/B/C example: blocks needing 3, 8 and 2 forwards in one sync batch waste 11."""
    steps = ABC_EXAMPLE
    bounds = PolicyBounds(requests=3, blocks=1, max_steps=max(steps), max_arrival=0)
    inp, run, hyps = _batch(3, bounds, "abc")
    fixed = [inp.steps[i][0] == steps[i] for i in range(3)]
    with timed() as t:
        sol = solver(timeout_ms)
        sol.add(*hyps, *fixed)
        try:
            ok = check(sol)
            waste = sol.model().eval(run.wasted()).as_long() if ok else None
            expected = sum(max(steps) - x for x in steps)
            # and it is the only value the model allows
            sol.add(run.wasted() != expected)
            unique = not check(sol)
        except Unknown as err:
            return ProofResult("theorem/sync_waste_abc", "unknown", 0.0, str(err))
    status = "proved" if ok and waste == expected == 11 and unique else "counterexample"
    return ProofResult(
        "theorem/sync_waste_abc",
        status,  # type: ignore[arg-type]
        round(t[0], 3),
        f"blocks A, B, C needing {steps} forwards in one sync batch: the model wastes {waste} "
        f"row-steps (Σ(max T − T_i) = {expected}); no other value is possible",
    )


# ---------------------------------------------------------------------------- in-place reuse


def reuse_theorem(
    geom: Geometry = REUSE_GEOMETRY,
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> ProofResult:
    """Under in-place reuse a carried block keeps its slots until it is forwarded again.

    Ghosts per request: `carried` (its block was unfinished at the end of a round and has not
    been forwarded since), `saved` (its first slot at that moment), `touched` (a KvFreed hit
    its block while carried). The proof is inductive over the event-level relation, with the
    proved invariants and lemmas as hypotheses:
      J: carried ⇒ running ∧ unfinished block ∧ allocated in an earlier round ∧
         (touched ⇒ holds no slots) ∧ (¬touched ⇒ holds slots starting at saved)
    and from J and the Forward guard: a forwarded carried row is untouched, starts at saved
    and is marked reused.
    """
    cfg = SymConfig.symbolic("cfg")
    enc = Encoding(geom, cfg)
    s, p, s2 = enc.state("s"), enc.params("p"), enc.state("t")
    n = geom.requests

    def ghosts(tag: str) -> tuple[list[Z], list[Z], list[Z]]:
        return (
            [z3.Bool(f"{tag}.carried[{i}]") for i in range(n)],
            [z3.Int(f"{tag}.saved[{i}]") for i in range(n)],
            [z3.Bool(f"{tag}.touched[{i}]") for i in range(n)],
        )

    car, sav, tou = ghosts("g")
    car2, sav2, tou2 = ghosts("g2")
    is_cr = p.kind == KIND["control_returned"]
    is_fwd = p.kind == KIND["forward"]
    is_free = p.kind == KIND["kv_freed"]
    ghost_next = []
    for i in range(n):
        unfinished2 = z3.Or(
            s2.block_phase[i] == MASKED,
            s2.block_phase[i] == DENOISING,
            s2.block_phase[i] == COMPLETE,
        )
        active2 = enc.active(s2, i)
        hit = z3.And(
            is_free,
            p.request == i,
            s.block_start[i] != -1,
            z3.Or([z3.And(p.freed[t], enc.in_block(s.block_start[i], t)) for t in range(enc.S)]),
        )
        ghost_next += [
            car2[i]
            == z3.If(
                is_cr,
                z3.And(active2, unfinished2),
                z3.And(car[i], z3.Not(z3.And(is_fwd, p.forwarded[i])), active2, unfinished2),
            ),
            sav2[i] == z3.If(is_cr, s.block_start[i], sav[i]),
            tou2[i] == z3.If(is_cr, False, z3.Or(tou[i], hit)),
        ]

    def J(st: State, c: list[Z], sv: list[Z], tc: list[Z]) -> Z:
        parts = []
        for i in range(n):
            unfinished = z3.Or(
                st.block_phase[i] == MASKED,
                st.block_phase[i] == DENOISING,
                st.block_phase[i] == COMPLETE,
            )
            parts.append(
                z3.Implies(
                    c[i],
                    z3.And(
                        enc.active(st, i),
                        unfinished,
                        st.alloc_round[i] >= 0,
                        st.alloc_round[i] < st.round_index,
                        z3.Implies(tc[i], st.block_start[i] == -1),
                        z3.Implies(z3.Not(tc[i]), z3.And(st.block_start[i] == sv[i], sv[i] != -1)),
                    ),
                )
            )
        return z3.And(parts)

    hyps = list(enc.invariants(s).values()) + list(enc.lemmas(s).values())
    reuse = cfg.reuse
    claim_fwd = z3.And(
        [
            z3.Implies(
                z3.And(is_fwd, p.forwarded[i], car[i]),
                z3.And(z3.Not(tou[i]), s.block_start[i] == sav[i], p.row_reused[i]),
            )
            for i in range(n)
        ]
    )
    claim_alloc = z3.And(
        [
            z3.Implies(
                z3.And(p.kind == KIND["kv_allocated"], p.request == i),
                s.block_phase[i] == NONE_BLOCK,
            )
            for i in range(n)
        ]
    )
    init_g = z3.And([z3.Not(c) for c in car] + [z3.Not(x) for x in tou])
    total = 0.0
    with timed() as t:
        try:
            # base
            sol = solver(timeout_ms)
            sol.add(enc.init(s), init_g, z3.Not(J(s, car, sav, tou)))
            bad_base = check(sol)
            # step, per event kind
            # non-vacuity: a carried block can be forwarded again
            sol = solver(timeout_ms)
            fwd = kind_steps(enc, s, p, s2)
            sol.add(
                *hyps, reuse, J(s, car, sav, tou), fwd["forward"].relation, car[0], p.forwarded[0]
            )
            if not check(sol):
                return ProofResult("theorem/reuse_keeps_block", "unknown", 0.0, "vacuous")
            bad_step = []
            for kind, step in fwd.items():
                sol = solver(timeout_ms)
                sol.add(*hyps, reuse, J(s, car, sav, tou), step.relation, p.kind == KIND[kind])
                sol.add(*ghost_next)
                sol.add(z3.Not(z3.And(J(s2, car2, sav2, tou2), claim_fwd, claim_alloc)))
                if check(sol):
                    bad_step.append(kind)
        except Unknown as err:
            return ProofResult("theorem/reuse_keeps_block", "unknown", 0.0, str(err))
    total = t[0]
    if bad_base or bad_step:
        return ProofResult(
            "theorem/reuse_keeps_block",
            "counterexample",
            round(total, 3),
            f"base broken: {bad_base}; step broken by: {bad_step}",
        )
    return ProofResult(
        "theorem/reuse_keeps_block",
        "proved",
        round(total, 3),
        "under in-place reuse an unfinished block forwarded again in a later round was not "
        "freed or re-allocated in between, holds the same slots as at the end of its round, "
        "and its row is marked reused; KvAllocated is never enabled for a request with a "
        f"current block (inductive, every policy with reuse, {geom.label()})",
    )
