"""Pipeline stages: a saturated replica with S stages and a constant batch time T ends its
first batch at T and then one batch every T/S (S times the single-stage throughput).

.venv/bin/python scripts/repro_stages.py
"""

from __future__ import annotations

import numpy as np

from reference.sim.exec_model import Constant
from reference.sim.replica import SimpleReplica
from reference.sim.stages import StagedReplica, simulate_stages
from reference.sim.workload import Workload


def main() -> None:
    T, n = 0.1, 800
    w = Workload(np.zeros(n), np.full(n, 16, dtype=np.int64), np.ones(n, dtype=np.int64))
    print(f"constant batch time T = {T} s, {n} one-token requests at t=0, 1 request per batch")
    print(f"{'S':>3} {'makespan s':>11} {'T+(n-1)T/S':>11} {'batches/s':>10} {'speedup':>8}")
    base = 0.0
    for s in (1, 2, 4, 8):
        rep = StagedReplica(lambda: SimpleReplica(max_batch=1), s)
        res = simulate_stages(w, [rep], Constant(T))
        span = float(np.max(res.metrics.completed))
        rate = res.num_batches / span
        base = base or rate
        formula = T + (res.num_batches - 1) * T / s
        print(f"{s:>3} {span:>11.4f} {formula:>11.4f} {rate:>10.2f} {rate / base:>8.2f}")


if __name__ == "__main__":
    main()
