"""Simulator speed: requests per second of wall time, by request count and replica count.

.venv/bin/python scripts/repro_speed.py [--full]
"""

from __future__ import annotations

import sys
import time

from reference.sim import workload as wl
from reference.sim.cluster import simulate_cluster
from reference.sim.exec_model import Linear
from reference.sim.replica import SimpleReplica


def run(n: int, replicas: int) -> tuple[float, int]:
    w = wl.poisson(n, 8.0 * replicas, wl.Lengths(32, 512), wl.Lengths(8, 64), seed=1)
    reps = [SimpleReplica(64, 200_000, 4096) for _ in range(replicas)]
    t0 = time.perf_counter()
    res = simulate_cluster(w, reps, Linear(0.005, 2e-5, 1e-4, 1e-7))
    el = time.perf_counter() - t0
    assert res.summary.completed == n
    return el, res.num_batches


def main() -> None:
    full = "--full" in sys.argv
    print(
        "SimpleReplica (continuous batching), Linear model, Poisson at 8 qps per replica, "
        "prompt 32-512, output 8-64 tokens"
    )
    print(f"{'requests':>9} {'replicas':>8} {'wall s':>7} {'requests/s':>10} {'batches':>9}")
    cases = [(100_000, r) for r in (1, 4, 16, 64)]
    if full:
        cases.append((1_000_000, 64))
    for n, r in cases:
        el, b = run(n, r)
        print(f"{n:>9} {r:>8} {el:>7.2f} {n / el:>10.0f} {b:>9}")


if __name__ == "__main__":
    main()
