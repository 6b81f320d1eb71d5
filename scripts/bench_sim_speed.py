"""Simulator speed with Vidur's replica schedulers: requests/s by scheduler, replicas and workload
size, with its growth, and (given Vidur's timings of the same workloads) the ratio to Vidur.

    .venv/bin/python scripts/bench_sim_speed.py [--schedulers A,B] [--replicas 1,8]
        [--requests 2000,10000] [--vidur-json PATH] [--json out/sim_speed.json]

The workload is `workload.poisson(n, 2 qps per replica, prompts 64-1024, outputs 16-256,
seed 5)`, a constant 50 ms batch time, 4096 KV blocks of 16 tokens (65,536 tokens: 32 seats x
1,280 tokens always fit), 32 seats, a 2,048-token budget, round-robin. `scripts/vidur_speed.py`
runs Vidur on exactly these arrays. "growth" is wall-time growth over the smallest size divided by
the size growth (1.0 = linear). Timings only; compare within one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from reference.sim import workload as wl
from reference.sim.catalog import VIDUR_SCHEDULERS, ReplicaSpec
from reference.sim.cluster import simulate_cluster
from reference.sim.exec_model import Constant

KV_TOKENS = 4096 * 16
BATCH_TIME = 0.05


def workload(n: int, replicas: int) -> wl.Workload:
    return wl.poisson(n, 2.0 * replicas, wl.Lengths(64, 1024), wl.Lengths(16, 256), seed=5)


def spec(scheduler: str) -> ReplicaSpec:
    return ReplicaSpec(scheduler, KV_TOKENS, max_batch=32, budget=2048, max_model_len=1280)


def run(scheduler: str, replicas: int, n: int) -> dict[str, Any]:
    w = workload(n, replicas)
    make = spec(scheduler).factory()
    t0 = time.perf_counter()
    res = simulate_cluster(w, [make() for _ in range(replicas)], Constant(BATCH_TIME))
    wall = time.perf_counter() - t0
    return {
        "scheduler": scheduler,
        "replicas": replicas,
        "requests": n,
        "wall_s": wall,
        "requests_per_s": n / wall,
        "batches": res.num_batches,
        "completed": res.summary.completed,
        "restarts": int(res.metrics.restarts.sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--schedulers", default=",".join(VIDUR_SCHEDULERS))
    ap.add_argument("--replicas", default="1,8")
    ap.add_argument("--requests", default="2000,10000")
    ap.add_argument("--vidur-json", help="scripts/vidur_speed.py output for the ratio column")
    ap.add_argument("--json", default="out/sim_speed.json")
    args = ap.parse_args()
    vidur: dict[tuple[str, int, int], float] = {}
    if args.vidur_json:
        for row in json.loads(Path(args.vidur_json).read_text()):
            vidur[row["scheduler"], row["replicas"], row["requests"]] = row["wall_s"]
    sizes = [int(x) for x in args.requests.split(",")]
    rows = []
    print(
        f"{'scheduler':>15} {'replicas':>8} {'requests':>9} {'wall s':>8} {'req/s':>8} "
        f"{'batches':>9} {'growth':>6} {'Vidur s':>8} {'x Vidur':>7}"
    )
    for sched in args.schedulers.split(","):
        for r in (int(x) for x in args.replicas.split(",")):
            first: dict[str, Any] | None = None
            for n in sizes:
                row = run(sched, r, n)
                if first is None:
                    first = row
                row["growth"] = (row["wall_s"] / first["wall_s"]) / (n / first["requests"])
                v = vidur.get((sched, r, n))
                row["vidur_wall_s"] = v
                row["x_vidur"] = v / row["wall_s"] if v else None
                rows.append(row)
                xv = f"{row['x_vidur']:>7.1f}" if v else f"{'-':>7}"
                vs = f"{v:>8.2f}" if v else f"{'-':>8}"
                print(
                    f"{sched:>15} {r:>8} {n:>9} {row['wall_s']:>8.2f} "
                    f"{row['requests_per_s']:>8.0f} {row['batches']:>9} {row['growth']:>6.2f} "
                    f"{vs} {xv}",
                    flush=True,
                )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
