"""Checks over simulator runs (pure functions over what a run recorded) and the Z3 encoding of
the water-filling problem."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import z3

from properties.harness import Harness
from spec.adapter import ImplementationFactory
from spec.config import DllmConfig
from spec.errors import SpecViolation


def sim_module(name: str) -> Any:
    """Import `reference.sim.<name>` by string (properties never import reference statically)."""
    return importlib.import_module(f"reference.sim.{name}")


def check_time_monotone(times: Sequence[float]) -> None:
    """Raise SpecViolation('sim_time_monotone') at the first time earlier than the one before
    it (equal times are allowed)."""
    for i in range(1, len(times)):
        if times[i] < times[i - 1]:
            raise SpecViolation(
                "sim_time_monotone",
                f"event {i} at t={times[i]!r} comes after one at t={times[i - 1]!r}",
            )


def check_conservation(log: Sequence[tuple[str, int, float]], num_requests: int) -> None:
    """Every request arrives exactly once and completes (or is aborted) exactly once, after it
    arrived; first tokens come between the two."""
    arrived: dict[int, float] = {}
    ended: dict[int, float] = {}
    for what, q, t in log:
        if what == "arrive":
            if q in arrived:
                raise SpecViolation("sim_conservation", f"request {q} arrived twice")
            arrived[q] = t
        elif what in ("done", "abort"):
            if q not in arrived:
                raise SpecViolation("sim_conservation", f"request {q} ended before arriving")
            if q in ended:
                raise SpecViolation("sim_conservation", f"request {q} ended twice")
            if t < arrived[q]:
                raise SpecViolation("sim_conservation", f"request {q} ended before its arrival")
            ended[q] = t
        elif what in ("first", "restart") and (q not in arrived or q in ended):
            raise SpecViolation("sim_conservation", f"{what} of request {q} out of its life")
    missing = set(range(num_requests)) - set(arrived)
    unended = set(arrived) - set(ended)
    if missing or unended:
        raise SpecViolation(
            "sim_conservation",
            f"{len(missing)} request(s) never arrived, {len(unended)} never ended "
            f"(e.g. {sorted(missing | unended)[:5]})",
        )


def harness_driver() -> Callable[[ImplementationFactory, DllmConfig], Harness]:
    """A driver for `reference.sim.dllm.simulate_dllm` that holds the scheduler to the spec
    (every event replayed, invariants and snapshots checked after each round)."""

    def make(factory: ImplementationFactory, config: DllmConfig) -> Harness:
        return Harness(factory, config)

    return make


# ---------------------------------------------------------------------- Z3: water-filling
def z3_better_split(
    loads: Sequence[int], avail: Sequence[int], total: int, max_load: int
) -> list[int] | None:
    """A token split x with 0 <= x_u <= A_u, sum x = total and max_u (L_u + x_u) < max_load, if
    one exists (then the allocation with `max_load` was not optimal); None if Z3 proves none."""
    xs = [z3.Int(f"x{u}") for u in range(len(loads))]
    s = z3.Solver()
    for x, lu, a in zip(xs, loads, avail, strict=True):
        s.add(x >= 0, x <= a, lu + x < max_load)
    s.add(z3.Sum(xs) == total)
    res = s.check()
    if res == z3.unsat:
        return None
    if res == z3.sat:
        model = s.model()
        return [model.eval(x).as_long() for x in xs]
    raise SpecViolation("water_fill_optimal", f"Z3 returned {res} (unknown counts as failure)")


def check_water_fill(loads: Sequence[int], avail: Sequence[int], total: int) -> list[int]:
    """Run the simulator's water_fill and hold it to capacity and Z3-proved optimality."""
    alloc = sim_module("allocation")
    x: list[int] = alloc.water_fill(list(loads), list(avail), total)
    if sum(x) != total:
        raise SpecViolation("water_fill_total", f"split {x} sums to {sum(x)}, not {total}")
    for u, (xu, a) in enumerate(zip(x, avail, strict=True)):
        if not 0 <= xu <= a:
            raise SpecViolation("water_fill_capacity", f"unit {u} gets {xu} of capacity {a}")
    ours = max(lu + xu for lu, xu in zip(loads, x, strict=True))
    better = z3_better_split(loads, avail, total, ours)
    if better is not None:
        raise SpecViolation(
            "water_fill_optimal",
            f"loads {list(loads)}, capacities {list(avail)}, total {total}: our split {x} has "
            f"max load {ours} but {better} has "
            f"{max(lu + b for lu, b in zip(loads, better, strict=True))}",
        )
    return x


def check_pour(caps: Sequence[Any], requests: Sequence[tuple[int, int, int]]) -> Any:
    """`allocation.pour` respects every capacity (tokens, seats, KV), places requests in FCFS
    order (a prefix), never splits a request across units, and — when neither seats nor KV bind
    — realises a Z3-optimal token split."""
    alloc = sim_module("allocation")
    plan = alloc.pour(list(caps), list(requests))
    placed = [rid for ch in plan.chunks for rid, _ in ch]
    if len(set(placed)) != len(placed):
        raise SpecViolation("pour_whole", f"a request was placed on two units: {plan.chunks}")
    order = [r[0] for r in requests]
    if sorted(placed, key=order.index) != order[: len(placed)]:
        raise SpecViolation("pour_fcfs", f"placed {placed} is not a prefix of {order}")
    size = {r[0]: r for r in requests}
    for u, (c, ch) in enumerate(zip(caps, plan.chunks, strict=True)):
        tokens = c.mandatory + sum(t for _, t in ch)
        if ch and tokens > c.token_budget:
            raise SpecViolation("pour_capacity", f"unit {u}: {tokens} > {c.token_budget}")
        if len(ch) > c.seats:
            raise SpecViolation("pour_capacity", f"unit {u}: {len(ch)} > {c.seats} seats")
        kv = sum(size[rid][2] for rid, _ in ch)
        if kv > c.kv_free:
            raise SpecViolation("pour_capacity", f"unit {u}: KV {kv} > {c.kv_free}")
        for rid, t in ch:
            if not 0 < t <= size[rid][1]:
                raise SpecViolation("pour_capacity", f"chunk of {t} for request {rid}")
    unbound = all(
        c.seats >= len(requests) and c.kv_free >= sum(r[2] for r in requests) for c in caps
    )
    loads = [c.mandatory for c in caps]
    avail = [c.avail for c in caps]
    total = min(sum(r[1] for r in requests), sum(avail))
    realised = plan.loads(list(caps))
    plentiful = sum(r[1] for r in requests) - max((r[1] for r in requests), default=0) * len(
        caps
    ) >= sum(avail)
    if unbound and plentiful:
        # enough requests that every unit's share is met: the realised split is the
        # water-filling one, so it must be optimal
        if sum(realised) - sum(loads) != total:
            raise SpecViolation("pour_total", f"poured {sum(realised) - sum(loads)} of {total}")
        if z3_better_split(loads, avail, total, max(realised)) is not None:
            raise SpecViolation("pour_optimal", f"loads {realised} are not optimal")
    return plan
