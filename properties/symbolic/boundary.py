"""Z3-synthesised boundary workloads.

Over the FDFO policy model (`policy`, with the reference's worst-case KV reservation and with
aborts), Z3 chooses requests (prompt length, max_new_tokens), arrivals, aborts and step counts
so that a run reaches an edge:

- `kv_pool_exactly_full`: at some forward every KV slot of the pool is owned;
- `blocks_finish_together`: two or more blocks finish in the same round;
- `abort_complete_block`: a request is aborted right after the round in which its block became
  complete (every mask filled, its final-KV forward still pending; under in-place reuse the
  block still holds its KV);
- `abort_as_block_finishes`: a request is aborted between rounds right after another
  request's block finished (the round that committed it);
- `admission_at_max_running`: admission fills the running set to exactly max_running_requests
  while an arrived request waits.

Each becomes a `Workload` (submits, aborts, rounds; a drain is implied) plus the step counts
("block k of request r needs T forwards") that force the edge under a scripted oracle. Every
built-in implementation must pass them; `edge_witnessed` replays a run's events through the
spec and says whether the edge really happened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from properties.symbolic.policy import (
    RUN,
    PolicyBounds,
    PolicyInputs,
    PolicyRun,
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
from properties.symbolic.terms import Z, count, model_int
from properties.symbolic.workloads import describe_ops, dllm_config
from properties.workload import Abort, Op, Round, Submit, Workload
from spec.config import DllmConfig, RequestSpec
from spec.events import (
    Aborted,
    BlockCommitted,
    ControlReturned,
    Event,
    Forward,
    KvAllocated,
)
from spec.lifecycles import BlockPhase
from spec.machine import SpecMachine

PROMPT_TOKEN = 3


@dataclass(frozen=True)
class BoundaryWorkload:
    """A workload Z3 synthesised to reach one edge, with the step counts that force it."""

    name: str
    description: str
    workload: Workload
    # forwards needed by block k of request r (T; a scripted oracle unmasks in T - 1 steps)
    steps: dict[tuple[str, int], int] = field(default_factory=dict)
    edge_round: int = -1  # the round (tick) the model reaches the edge in

    def unmask_rounds(self, request_id: str, block: int) -> int:
        """ScriptedOracle pattern: rounds to unmask block `block` (the final forward aside)."""
        return max(1, self.steps.get((request_id, block), 2) - 1)


@dataclass(frozen=True)
class _Edge:
    """A boundary of the scheduler's state space to reach: a configuration, a request count
    and horizon (with aborts or not), and the Z3 goal that holds when a run reaches it."""

    name: str
    description: str
    config: DllmConfig
    requests: int
    horizon: int
    aborts: bool
    goal: Callable[[PolicyInputs, PolicyRun, DllmConfig], Z]


def _cfg(**kw: Any) -> DllmConfig:
    """`dllm_config` with 3 pages, 3 rows and 3 running requests unless overridden."""
    return dllm_config(**{"kv_pages": 3, "req_pool_rows": 3, "max_running_requests": 3, **kw})


def _held_slots(run: PolicyRun, t: int, b: int) -> Z:
    f = run.forwards[t]
    return z3.Sum([z3.If(f.row[i], (f.blk[i] + 1) * b, 0) for i in range(len(f.row))])


def _pool_full(inp: PolicyInputs, run: PolicyRun, cfg: DllmConfig) -> Z:
    return z3.Or([_held_slots(run, t, cfg.block_size) == cfg.kv_slots for t in range(run.horizon)])


def _together(inp: PolicyInputs, run: PolicyRun, cfg: DllmConfig) -> Z:
    out = []
    for t in range(run.horizon):
        f = run.forwards[t]
        finishing = [z3.And(f.row[i], f.rem[i] == 1) for i in range(len(f.row))]
        out.append(count(finishing) >= 2)
    return z3.Or(out)


def _abort_complete(inp: PolicyInputs, run: PolicyRun, cfg: DllmConfig) -> Z:
    out = []
    n = inp.bounds.requests
    for t in range(1, run.horizon):
        x = run.ticks[t]
        for i in range(n):
            out.append(
                z3.And(
                    inp.abort_at[i] == t,
                    x.st[i] == RUN,
                    x.rem[i] == 1,
                    inp.step_count(i, x.blk[i]) >= 2,
                )
            )
    return z3.Or(out)


def _abort_as_done(inp: PolicyInputs, run: PolicyRun, cfg: DllmConfig) -> Z:
    out = []
    n = inp.bounds.requests
    for t in range(1, run.horizon):
        x = run.ticks[t]
        for i in range(n):
            for j in range(n):
                if i != j:
                    out.append(
                        z3.And(
                            inp.abort_at[j] == t,
                            x.st[j] == RUN,
                            x.rem[j] > 0,
                            x.st[i] == RUN,
                            x.rem[i] == 0,
                        )
                    )
    return z3.Or(out)


def _at_max_running(inp: PolicyInputs, run: PolicyRun, cfg: DllmConfig) -> Z:
    return z3.Or(
        [
            z3.And(
                run.info[t]["admitted"],
                run.info[t]["running_after_admission"] == cfg.max_running_requests,
                run.info[t]["waiting_arrived"],
            )
            for t in range(run.horizon)
        ]
    )


EDGES: tuple[_Edge, ...] = (
    _Edge(
        "kv_pool_exactly_full",
        "every KV slot of the pool is owned at one forward",
        _cfg(block_size=2, page_size=4, kv_pages=3),
        3,
        8,
        False,
        _pool_full,
    ),
    _Edge(
        "blocks_finish_together",
        "two or more blocks finish in the same round",
        _cfg(block_size=2, page_size=4, kv_pages=4),
        3,
        6,
        False,
        _together,
    ),
    _Edge(
        "abort_complete_block",
        "a request is aborted right after the round in which its block became complete "
        "(final-KV forward pending, block retained in place)",
        _cfg(block_size=4, page_size=4, kv_pages=4, max_context=8),
        2,
        6,
        True,
        _abort_complete,
    ),
    _Edge(
        "abort_as_block_finishes",
        "a request is aborted right after the round in which another request's block finished",
        _cfg(block_size=2, page_size=2, kv_pages=6, max_context=8),
        3,
        6,
        True,
        _abort_as_done,
    ),
    _Edge(
        "admission_at_max_running",
        "admission fills the running set to exactly max_running_requests while an arrived "
        "request waits",
        _cfg(max_running_requests=2, req_pool_rows=2, kv_pages=6, page_size=2),
        3,
        6,
        False,
        _at_max_running,
    ),
)


def _request_constraints(inp: PolicyInputs, cfg: DllmConfig, pl: Sequence[Z], mn: Sequence[Z]) -> Z:
    """Tie the model's blocks, step counts and pages to real request sizes."""
    b, p = cfg.block_size, cfg.page_size
    limit = min(cfg.max_context, cfg.kv_slots)
    parts = []
    for i in range(inp.bounds.requests):
        total = pl[i] + mn[i]
        parts += [
            pl[i] >= 1,
            mn[i] >= 1,
            total <= limit,
            b * (inp.nb[i] - 1) < total,
            total <= b * inp.nb[i],
            p * (inp.pages[i] - 1) < total,
            total <= p * inp.pages[i],
        ]
        for k in range(inp.bounds.blocks):
            x = (k + 1) * b - pl[i]
            masks = z3.If(x < 0, 0, z3.If(x > b, b, x))
            parts.append(
                z3.If(
                    masks == 0,
                    inp.steps[i][k] == 1,
                    z3.And(inp.steps[i][k] >= 2, inp.steps[i][k] <= masks + 1),
                )
            )
    return z3.And(parts)


def synthesize(edge: _Edge, *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> BoundaryWorkload | None:
    """A workload whose FDFO model run reaches `edge` within its horizon (the first request
    arriving at once, at most one abort), or None when there is none; raises `Unknown` when Z3
    answers unknown (e.g. after `timeout_ms`). Per round, through the edge's round and the last
    arrival: that round's aborts, its arrivals, then the round."""
    cfg = edge.config
    blocks = cfg.max_context // cfg.block_size
    bounds = PolicyBounds(
        requests=edge.requests,
        blocks=blocks,
        max_steps=cfg.block_size + 1,
        max_arrival=edge.horizon - 1,
        max_running=cfg.max_running_requests,
    )
    inp = PolicyInputs(bounds, name=f"{edge.name}")
    inp.kv_pages = z3.IntVal(cfg.kv_pages)
    run = PolicyRun(inp, sync=False, horizon=edge.horizon, name=f"{edge.name}.fdfo")
    pl = [z3.Int(f"{edge.name}.pl[{i}]") for i in range(edge.requests)]
    mn = [z3.Int(f"{edge.name}.mn[{i}]") for i in range(edge.requests)]
    sol = solver(timeout_ms)
    sol.add(inp.constraints(aborts=edge.aborts, kv=True))
    sol.add(inp.max_running == cfg.max_running_requests)
    sol.add(*run.constraints)
    sol.add(_request_constraints(inp, cfg, pl, mn))
    sol.add(edge.goal(inp, run, cfg))
    # keep it small: the first request arrives at once, at most one abort
    sol.add(inp.arrival[0] == 0)
    sol.add(count([a >= 0 for a in inp.abort_at]) <= 1)
    if not check(sol):
        return None
    m = sol.model()

    def ev(x: Z) -> int:
        return model_int(m, x)

    ops: list[Op] = []
    n = edge.requests
    arrivals = [ev(a) for a in inp.arrival]
    aborts = [ev(a) for a in inp.abort_at]
    edge_round = _edge_round(m, edge, inp, run)
    last = max(edge_round + 1, max(arrivals) + 1)
    for t in range(last):
        for i in range(n):
            if aborts[i] == t:
                ops.append(Abort(f"r{i}"))
        for i in range(n):
            if arrivals[i] == t:
                ops.append(Submit(RequestSpec(f"r{i}", (PROMPT_TOKEN,) * ev(pl[i]), ev(mn[i]))))
        ops.append(Round())
    steps = {(f"r{i}", k): ev(inp.steps[i][k]) for i in range(n) for k in range(ev(inp.nb[i]))}
    wl = Workload(
        cfg,
        tuple(ops),
        name=f"z3-boundary-{edge.name}",
        notes=(edge.description, f"step counts (forwards per block): {steps}"),
    )
    return BoundaryWorkload(edge.name, edge.description, wl, steps, edge_round)


def _edge_round(m: Z, edge: _Edge, inp: PolicyInputs, run: PolicyRun) -> int:
    """The first tick at which the model is at the edge (for the workload's round count)."""
    cfg = edge.config
    for t in range(run.horizon):
        if edge.name == "kv_pool_exactly_full":
            hit = _held_slots(run, t, cfg.block_size) == cfg.kv_slots
        elif edge.name == "blocks_finish_together":
            f = run.forwards[t]
            hit = count([z3.And(f.row[i], f.rem[i] == 1) for i in range(len(f.row))]) >= 2
        elif edge.name == "admission_at_max_running":
            hit = z3.And(
                run.info[t]["admitted"],
                run.info[t]["running_after_admission"] == cfg.max_running_requests,
                run.info[t]["waiting_arrived"],
            )
        else:
            hit = z3.Or([a == t for a in inp.abort_at])
        if z3.is_true(m.eval(hit, model_completion=True)):
            return t
    return run.horizon - 1


def boundary_workloads(
    *, timeout_ms: int = DEFAULT_TIMEOUT_MS, progress: Progress | None = None
) -> tuple[list[ProofResult], list[BoundaryWorkload]]:
    """`synthesize` every edge of `EDGES`: per edge a "boundary/<name>" result ("proved" with
    the witness, else "unknown": none within the bounds, or Z3 gave up), and the workloads."""
    results: list[ProofResult] = []
    found: list[BoundaryWorkload] = []
    for edge in EDGES:
        with timed() as t:
            try:
                bw = synthesize(edge, timeout_ms=timeout_ms)
                err = ""
            except Unknown as e:
                bw, err = None, str(e)
        if bw is None:
            results.append(
                ProofResult(
                    f"boundary/{edge.name}",
                    "unknown",
                    round(t[0], 3),
                    err or "no workload reaches the edge within the bounds",
                )
            )
        else:
            found.append(bw)
            results.append(
                ProofResult(
                    f"boundary/{edge.name}",
                    "proved",
                    round(t[0], 3),
                    f"witness: {edge.description}; {describe(bw)}",
                )
            )
        if progress:
            progress(f"boundary/{edge.name}: {results[-1].status} ({t[0]:.2f}s)")
    return results, found


def describe(bw: BoundaryWorkload) -> str:
    """One line: the workload's geometry, its operations, the forwards per block and the edge
    round."""
    c = bw.workload.config
    return (
        f"config block={c.block_size} page={c.page_size} kv_slots={c.kv_slots} "
        f"max_running={c.max_running_requests}; ops: {describe_ops(bw.workload)}, drain; "
        f"forwards per block: {bw.steps}; edge at round {bw.edge_round}"
    )


# ---------------------------------------------------------------------------- witnesses


def edge_witnessed(name: str, config: DllmConfig, events: Sequence[Event]) -> bool:
    """Replay an implementation's events through the spec: did the edge really happen?"""
    m = SpecMachine(config)
    commits = 0  # blocks committed in the current round
    previous_round_commits = 0
    for e in events:
        st = m.state()
        if isinstance(e, Aborted):
            r = st.requests.get(e.request_id)
            cur = None if r is None else r.current
            if (
                name == "abort_complete_block"
                and cur is not None
                and cur.phase is BlockPhase.COMPLETE
            ):
                return True
            if (
                name == "abort_as_block_finishes"
                and previous_round_commits
                and cur is not None
                and st.round.forwards == 0
            ):
                return True
        if (
            name == "admission_at_max_running"
            and isinstance(e, Forward)
            and st.round.forwards == 0
            and len(st.running) == config.max_running_requests
            and st.queue
        ):
            return True
        m.apply(e)
        if (
            name == "kv_pool_exactly_full"
            and isinstance(e, KvAllocated)
            and not m.state().free_slots
        ):
            return True
        if isinstance(e, BlockCommitted):
            commits += 1
            if name == "blocks_finish_together" and commits >= 2:
                return True
        if isinstance(e, ControlReturned):
            previous_round_commits, commits = commits, 0
    return False


__all__ = [
    "EDGES",
    "BoundaryWorkload",
    "boundary_workloads",
    "describe",
    "edge_witnessed",
    "synthesize",
]
