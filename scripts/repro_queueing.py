"""Gated DP units: immediate dispatch waits ~T/2, staggering ~T/(2N).

.venv/bin/python scripts/repro_queueing.py
"""

from __future__ import annotations

from reference.sim.queueing import simulate_gated


def main() -> None:
    T = 0.1
    print(f"batch time T = {T} s, 20000 Poisson requests per run, seed 0")
    print(f"{'N':>3} {'immediate':>10} {'T/2':>8} {'staggered':>10} {'T/(2N)':>8} {'ratio':>6}")
    for n in (2, 4, 8, 16):
        a = simulate_gated(n, T, "immediate")
        b = simulate_gated(n, T, "staggered")
        print(
            f"{n:>3} {a.mean_wait:>10.5f} {a.formula:>8.5f} {b.mean_wait:>10.5f} "
            f"{b.formula:>8.5f} {a.mean_wait / b.mean_wait:>6.2f}"
        )


if __name__ == "__main__":
    main()
