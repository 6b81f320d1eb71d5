"""Bounded model checking from the initial state: k copies of the one transition relation.

- `bmc_invariants`: no state reachable with <= k events violates any named invariant.
- Seeded symbolic mutants (`SYMBOLIC_MUTANTS`): the relation with one labelled guard relaxed
  (or replaced by the buggy behaviour), e.g. "a request may finish while it still owns KV".
  BMC finds a trace whose last event is allowed by the mutant but not by the spec; the trace
  is decoded into concrete spec events, replayed through `SpecMachine` (the last event must
  raise `SpecViolation` naming the rule) and converted into a `Workload` that the matching
  reference mutant of the seeded-bug catalogue must fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from properties.symbolic.encoding import (
    ADMITTED,
    COMPLETE,
    DENOISING,
    DONE,
    KIND,
    MASKED,
    QUEUED,
    RUNNING,
    Decoder,
    Encoding,
    Geometry,
    Params,
    Relaxation,
    State,
    SymConfig,
    render_values,
)
from properties.symbolic.result import (
    DEFAULT_TIMEOUT_MS,
    Progress,
    ProofResult,
    Unknown,
    check,
    solver,
    timed,
)
from properties.workload import Abort, Op, Round, Submit, Workload
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SpecViolation
from spec.events import Aborted, ControlReturned, Event, KvFreed, Submitted
from spec.machine import SpecMachine

Z = Any


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
        self.states = [enc.state(f"{prefix}s{j}") for j in range(depth + 1)]
        self.params = [enc.params(f"{prefix}p{j}") for j in range(depth)]
        self.constraints: list[Z] = [enc.init(self.states[0])]
        for j in range(depth):
            relax = last_relax if j == depth - 1 else ()
            self.constraints.append(
                enc.transition(self.states[j], self.params[j], self.states[j + 1], relax)
            )

    def events(self, model: Z, config: DllmConfig) -> list[Event]:
        dec = Decoder(self.enc.geom, config)
        out = [dec.event(model, s, p) for s, p in zip(self.states, self.params, strict=False)]
        return out


def drop_noops(events: Iterable[Event]) -> list[Event]:
    """Empty frees are stutter steps (they let a trace be shorter than the unrolling)."""
    return [e for e in events if not (isinstance(e, KvFreed) and not e.slots)]


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
                detail = f"violated: {sorted(set(bad))}; trace: {evs}"
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


Extra = Callable[[Encoding, State, Params], Z]


@dataclass(frozen=True)
class SymbolicMutant:
    """A seeded bug as a relaxed guard of one event kind."""

    name: str
    description: str
    rule: str  # the rule SpecMachine names on the bad event
    config: DllmConfig
    kind: str  # event kind of the bad step
    relax: tuple[Relaxation, ...]
    violated: tuple[str, str]  # (rule, tag) of the spec guard the bad step breaks
    extra: Extra | None = None  # more constraints on the bad step (what the bug looks like)
    reference: tuple[str, ...] = ()  # matching entries of tests/mutants.py MUTANTS
    requests: int = 2
    depths: tuple[int, ...] = (4, 6, 8, 10, 12, 14)


def _cfg(**kw: Any) -> DllmConfig:
    base: dict[str, Any] = dict(
        block_size=2,
        page_size=4,
        kv_pages=4,
        req_pool_rows=2,
        max_running_requests=2,
        max_context=8,
        mode=Mode.FDFO,
        in_place_reuse=True,
        reloop=False,
        eos_token_id=None,
    )
    base.update(kw)
    return DllmConfig(**base)


def _sel(enc: Encoding, arr: Sequence[Z], idx: Z) -> Z:
    return enc._sel(arr, idx)


def _abort_keeps_current(enc: Encoding, s: State, p: Params) -> Z:
    """The buggy abort: row and committed blocks released, the current block's KV kept."""
    return z3.And(
        [
            z3.Implies(
                p.req == i,
                z3.And(
                    s.row[i] == -1,
                    *[z3.Implies(s.oreq[t] == i, s.oblk[t] == s.com[i]) for t in range(enc.S)],
                ),
            )
            for i in range(enc.N)
        ]
    )


def _mid_block(enc: Encoding, s: State, p: Params) -> Z:
    """Between rounds, with a stepped but unfinished block retained in place."""
    return z3.And(
        s.nfwd == 0,
        s.round >= 1,
        z3.Or(
            [
                z3.And(
                    p.req == i,
                    s.phase[i] == RUNNING,
                    s.start[i] != -1,
                    z3.Or(s.bph[i] == DENOISING, s.bph[i] == COMPLETE),
                )
                for i in range(enc.N)
            ]
        ),
    )


def _double_free_guard(enc: Encoding, s: State, p: Params) -> Z:
    """The buggy free: slots the request owns, or slots it freed already."""
    return z3.And(
        [
            z3.Implies(
                p.req == i,
                z3.And(
                    [
                        z3.Implies(
                            p.free[t],
                            z3.Or(s.oreq[t] == i, z3.And(s.oreq[t] == -1, s.freed_by[t] == i)),
                        )
                        for t in range(enc.S)
                    ]
                ),
            )
            for i in range(enc.N)
        ]
    )


def _reservation_skip(enc: Encoding, s: State, p: Params) -> Z:
    """AdmitsOutOfOrder: every queued request ahead does not fit the reserved pages; this one
    does (the reference reserves worst-case pages at admission)."""
    k = enc.geom.kv_pages
    res = enc.reserved_pages(s)
    parts = []
    for i in range(enc.N):
        ahead = [z3.Implies(s.phase[j] == QUEUED, res + s.pages[j] > k) for j in range(i)]
        parts.append(z3.Implies(p.req == i, z3.And(res + s.pages[i] <= k, *ahead)))
    return z3.And(parts)


def _first_fit(enc: Encoding, s: State, p: Params) -> Z:
    """The first-fit allocator: the block starts at the lowest free slot (and the running
    requests fit the pool's worst-case reservation, as the reference admits them)."""
    return z3.And(
        [enc.reserved_pages(s) <= enc.geom.kv_pages]
        + [z3.Implies(t < p.start, s.oreq[t] != -1) for t in range(enc.S)]
        + [
            z3.Implies(
                p.req == i,
                z3.Or(s.phase[i] == ADMITTED, s.phase[i] == RUNNING),
            )
            for i in range(enc.N)
        ]
    )


def _done_at_round_end(enc: Encoding, s: State, p: Params) -> Z:
    return z3.Or([s.bph[i] == DONE for i in range(enc.N)])


def _lost_slots(enc: Encoding, s: State, p: Params) -> Z:
    return z3.Or(
        [
            z3.And(
                z3.Or(s.phase[i] == RUNNING),
                s.start[i] == -1,
                z3.Or(s.bph[i] == MASKED, s.bph[i] == DENOISING, s.bph[i] == COMPLETE),
            )
            for i in range(enc.N)
        ]
    )


def _partial_prompt_row(enc: Encoding, s: State, p: Params) -> Z:
    """RaggedRow: the row feeds only the prompt tokens of a partial last prompt block."""
    b = enc.B
    return z3.Or(
        [
            z3.And(
                p.f_in[i],
                p.f_ntok[i] == s.pl[i] - s.com[i] * b,
                p.f_ntok[i] > 0,
                p.f_ntok[i] < b,
            )
            for i in range(enc.N)
        ]
    )


def _mk(*relax: Relaxation) -> tuple[Relaxation, ...]:
    return tuple(relax)


SYMBOLIC_MUTANTS: tuple[SymbolicMutant, ...] = (
    SymbolicMutant(
        "no_free_on_finish",
        "a request finishes (its row released) while it still owns KV slots",
        "terminal_owns_nothing",
        _cfg(mode=Mode.SYNC, in_place_reuse=False, kv_pages=2),
        "finished",
        _mk(Relaxation("finished", "terminal_owns_nothing", "slots")),
        ("terminal_owns_nothing", "slots"),
        reference=("no_free_on_finish",),
        requests=1,
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "abort_leaks_retained_block",
        "SGLang #32992: aborting mid-block frees the committed blocks and the row but not the "
        "retained (in-place reused) block",
        "terminal_owns_nothing",
        _cfg(kv_pages=2),
        "aborted",
        _mk(
            Relaxation(
                "aborted",
                "terminal_owns_nothing",
                "slots",
                lambda s, p: z3.BoolVal(True),
            )
        ),
        ("terminal_owns_nothing", "slots"),
        extra=lambda enc, s, p: z3.And(_abort_keeps_current(enc, s, p), _mid_block(enc, s, p)),
        reference=("abort_leaks_retained_block",),
        requests=1,
        depths=(6, 8, 10),
    ),
    SymbolicMutant(
        "double_free",
        "a request frees KV slots it already freed",
        "free_owned_only",
        _cfg(kv_pages=2),
        "kv_freed",
        _mk(Relaxation("kv_freed", "free_owned_only", "owned")),
        ("free_owned_only", "owned"),
        extra=_double_free_guard,
        reference=("double_free",),
        requests=1,
        depths=(5, 7, 9),
    ),
    SymbolicMutant(
        "admits_beyond_max_running",
        "admission while max_running_requests requests already run",
        "max_running",
        _cfg(max_running_requests=1, req_pool_rows=2, kv_pages=4),
        "admitted",
        _mk(Relaxation("admitted", "max_running")),
        ("max_running", ""),
        reference=("admits_beyond_max_running",),
        depths=(4, 6, 8),
    ),
    SymbolicMutant(
        "admits_out_of_order",
        "a queued request that does not fit the reserved KV is skipped for a later one that does",
        "fcfs_admission",
        _cfg(
            block_size=2,
            page_size=2,
            kv_pages=4,
            max_context=8,
            max_running_requests=3,
            req_pool_rows=3,
        ),
        "admitted",
        _mk(Relaxation("admitted", "fcfs_admission")),
        ("fcfs_admission", ""),
        extra=_reservation_skip,
        reference=("admits_out_of_order",),
        requests=3,
        depths=(5, 7, 9),
    ),
    SymbolicMutant(
        "commits_before_final_forward",
        "a step reports done as soon as the last mask is filled, before the final-KV forward",
        "final_forward_before_commit",
        _cfg(kv_pages=2),
        "step_result",
        _mk(Relaxation("step_result", "final_forward_before_commit")),
        ("final_forward_before_commit", ""),
        reference=("commits_before_final_forward",),
        requests=1,
        depths=(5, 7),
    ),
    SymbolicMutant(
        "misaligned_page",
        "the allocator hands out the first free slots, ignoring page offsets",
        "page_alignment",
        _cfg(block_size=2, page_size=4, kv_pages=2),
        "kv_allocated",
        _mk(
            Relaxation("kv_allocated", "page_alignment", "aligned"),
            Relaxation("kv_allocated", "page_alignment", "continues"),
        ),
        ("page_alignment", ""),
        extra=_first_fit,
        reference=("misaligned_page",),
        depths=(6, 8),
    ),
    SymbolicMutant(
        "sync_returns_early",
        "sync returns control while a block of the batch is unfinished",
        "sync_yields_when_all_done",
        _cfg(mode=Mode.SYNC, in_place_reuse=False, kv_pages=2),
        "control_returned",
        _mk(Relaxation("control_returned", "sync_yields_when_all_done")),
        ("sync_yields_when_all_done", ""),
        reference=("sync_returns_early",),
        requests=1,
        depths=(6, 8),
    ),
    SymbolicMutant(
        "fdfo_keeps_done_request",
        "a done block is not committed in the round it finished",
        "fdfo_releases_same_round",
        _cfg(kv_pages=2),
        "control_returned",
        _mk(Relaxation("control_returned", "fdfo_releases_same_round", "done")),
        ("fdfo_releases_same_round", "done"),
        extra=_done_at_round_end,
        reference=("fdfo_keeps_done_request",),
        requests=1,
        depths=(6, 8),
    ),
    SymbolicMutant(
        "unfinished_block_loses_slots",
        "under in-place reuse an unfinished block's KV is freed before the round ends",
        "reuse_keeps_slots",
        _cfg(kv_pages=2),
        "control_returned",
        _mk(Relaxation("control_returned", "reuse_keeps_slots")),
        ("reuse_keeps_slots", ""),
        extra=_lost_slots,
        reference=("reallocates_instead_of_reusing", "free_unfinished_block_in_batch"),
        requests=1,
        depths=(7, 9),
    ),
    SymbolicMutant(
        "ragged_row",
        "a partial prompt block is fed without its masks (not a whole block)",
        "whole_block_rows",
        _cfg(kv_pages=2),
        "forward",
        _mk(Relaxation("forward", "whole_block_rows")),
        ("whole_block_rows", ""),
        extra=_partial_prompt_row,
        reference=("ragged_row",),
        requests=1,
        depths=(4, 6),
    ),
)


@dataclass
class MutantCounterexample:
    mutant: SymbolicMutant
    events: list[Event]  # the last one is the bad event
    state_before: str  # SpecMachine rendering before the bad event
    violation: SpecViolation | None  # what SpecMachine raised on the bad event
    workload: Workload
    depth: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"mutant {self.mutant.name}: {self.mutant.description}"]
        lines += [f"  {i:2d}. {e}" for i, e in enumerate(self.events)]
        lines.append("state before the last event:")
        lines += ["    " + ln for ln in self.state_before.splitlines()]
        if self.violation is not None:
            lines.append(f"SpecMachine: [{self.violation.rule}] {self.violation.detail}")
        lines.append(f"workload: {describe_workload(self.workload)}")
        return "\n".join(lines)


def describe_workload(w: Workload) -> str:
    parts = []
    for op in w.ops:
        if isinstance(op, Submit):
            r = op.request
            parts.append(
                f"submit({r.request_id}, prompt_len={len(r.prompt)}, max_new={r.max_new_tokens})"
            )
        elif isinstance(op, Abort):
            parts.append(f"abort({op.request_id})")
        elif isinstance(op, Round):
            parts.append("round")
        else:
            parts.append("drain")
    return ", ".join(parts) + " (then drain)"


def workload_from_events(config: DllmConfig, events: Sequence[Event], name: str) -> Workload:
    """The operations an implementation needs to see to produce (roughly) this trace:
    submissions and aborts in order, a round per `ControlReturned`; a drain is implied."""
    ops: list[Op] = []
    for e in events:
        if isinstance(e, Submitted):
            ops.append(Submit(RequestSpec(e.request_id, tuple(e.prompt), e.max_new_tokens)))
        elif isinstance(e, Aborted):
            ops.append(Abort(e.request_id))
        elif isinstance(e, ControlReturned):
            ops.append(Round())
    return Workload(config, tuple(ops), name=name, notes=("synthesised by Z3 BMC",))


def replay(config: DllmConfig, events: Sequence[Event]) -> tuple[str, SpecViolation | None]:
    """Apply all but the last event (must be accepted), then the last; return the state
    rendering before the last event and the violation it raised (None if accepted)."""
    m = SpecMachine(config)
    for e in events[:-1]:
        m.apply(e)
    before = m.render()
    try:
        m.apply(events[-1])
    except SpecViolation as v:
        return before, v
    return before, None


def find_mutant_counterexample(
    mutant: SymbolicMutant, *, timeout_ms: int = DEFAULT_TIMEOUT_MS, max_depth: int | None = None
) -> MutantCounterexample | None:
    """BMC with the relaxed relation on the last step, by increasing depth."""
    geom = Geometry.of(mutant.config, mutant.requests)
    enc = Encoding(geom, SymConfig.concrete(mutant.config))
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
            if check(sol):
                m = sol.model()
                evs = drop_noops(unr.events(m, mutant.config))
                before, violation = replay(mutant.config, evs)
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
