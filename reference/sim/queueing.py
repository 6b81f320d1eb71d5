"""The queueing fact behind SBS, simulated: N gated units with batch time T.

A gated unit accepts new work only when a forward starts (its previous forward ended), and a
forward takes T whatever its batch (capacity never binds here). Requests arrive as a Poisson
stream.
- immediate: the units run in lock-step (their forwards start together, every T), and each
  arrival is sent at once to a unit (round-robin); it waits for that unit's next start:
  E[wait] = T/2 (the residual of a period seen by a Poisson arrival).
- staggered: unit u starts forwards at k*T + u*T/N, and the dispatcher holds each arrival and
  hands it to the unit whose forward starts next: the wait is the residual of a period T/N,
  E[wait] = T/(2N).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference.sim.bounds import check_rate, check_seconds
from reference.sim.core import EventQueue
from reference.sim.errors import SimConfigError

START, ARRIVE = 0, 1


@dataclass(frozen=True, slots=True)
class GatedResult:
    """One `simulate_gated` run: the measured mean wait and the formula's (seconds)."""

    dp_units: int
    batch_time: float
    mode: str
    mean_wait: float
    formula: float
    requests: int


def simulate_gated(
    dp_units: int,
    batch_time: float,
    mode: str,
    requests: int = 20_000,
    qps: float | None = None,
    seed: int = 0,
) -> GatedResult:
    """Simulate `requests` Poisson arrivals (rate `qps`, default 3N/T per second) at `dp_units`
    gated units whose forwards take `batch_time`, under `mode` ('immediate' or 'staggered'); the
    wait is arrival to the start of the forward that takes it. A bad mode, unit count, request
    count, time or rate raises `SimConfigError`."""
    if mode not in ("immediate", "staggered"):
        raise SimConfigError("mode", mode, "'immediate' or 'staggered'")
    if dp_units < 1:
        raise SimConfigError("dp_units", dp_units, "an integer >= 1")
    if requests < 1:
        raise SimConfigError("requests", requests, "an integer >= 1")
    check_seconds("batch_time", batch_time, positive=True)
    if qps is not None:
        check_rate("qps", qps)
    N, T = dp_units, batch_time
    rate = qps if qps is not None else 3.0 * N / T
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=requests)).tolist()
    q = EventQueue()
    offset = [0.0 if mode == "immediate" else u * T / N for u in range(N)]
    for u in range(N):
        q.push(offset[u], START, u)
    q.push(arrivals[0], ARRIVE, 0)
    waiting: list[list[float]] = [[] for _ in range(N)]
    held: list[float] = []  # staggered: at the dispatcher until the next start
    rr = 0
    total = 0.0
    served = 0
    while served < requests:
        t, kind, x = q.pop()
        if kind == ARRIVE:
            if x + 1 < requests:
                q.push(arrivals[x + 1], ARRIVE, x + 1)
            if mode == "immediate":
                waiting[rr].append(t)
                rr = (rr + 1) % N
            else:
                held.append(t)
        else:
            batch = waiting[x] if mode == "immediate" else held
            total += sum(t - a for a in batch)
            served += len(batch)
            batch.clear()
            q.push(t + T, START, x)
    formula = T / 2 if mode == "immediate" else T / (2 * N)
    return GatedResult(N, T, mode, total / served, formula, served)
