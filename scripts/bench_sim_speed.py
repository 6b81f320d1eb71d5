"""Simulator speed with Vidur's replica schedulers: requests per CPU second by scheduler,
replicas and workload size, with its growth, and (given Vidur's timings of the same workloads)
the ratio to Vidur.

    .venv/bin/python scripts/bench_sim_speed.py [--schedulers A,B] [--replicas 1,8]
        [--requests 2000,10000] [--workload bench|simulate] [--vidur-json PATH[,PATH]]
        [--json out/sim_speed.json]

Workloads (`scripts/vidur_speed.py` runs Vidur on exactly these arrays):
- `bench`: `workload.poisson(n, 2 qps per replica, prompts 64-1024, outputs 16-256, seed 5)`;
- `simulate`: `schedspec simulate replicas`' default generator (10 qps in all, the same lengths,
  seed 0), which leaves 8 replicas lightly loaded (a few requests per batch).
Both with a constant 50 ms batch time, 4096 KV blocks of 16 tokens (65,536 tokens: 32 seats x
1,280 tokens always fit), 32 seats, a 2,048-token budget, round-robin.

Speed is requests per CPU second of this process (`time.process_time`), which a loaded machine
disturbs far less than wall time (both simulators are single-threaded Python; wall time is
reported too). "growth" is CPU-time growth over the smallest size divided by the size growth
(1.0 = linear). "x Vidur" is Vidur's CPU seconds over ours on the same workload (for
`vidur-*-released`, Vidur 0.0.26's, the release it decides as).
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
from schedspec_cli.output import output_file

KV_TOKENS = 4096 * 16
BATCH_TIME = 0.05
WORKLOADS = ("bench", "simulate")


def workload(n: int, replicas: int, kind: str = "bench") -> wl.Workload:
    """The same arrays as `scripts/vidur_speed.py`'s `make_workload` (keep the two in step)."""
    if kind == "bench":
        return wl.poisson(n, 2.0 * replicas, wl.Lengths(64, 1024), wl.Lengths(16, 256), seed=5)
    return wl.poisson(n, 10.0, wl.Lengths(64, 1024), wl.Lengths(16, 256), seed=0)


def spec(scheduler: str) -> ReplicaSpec:
    # LightLLM waits 4 decode batches, as scripts/vidur_speed.py runs Vidur (the recorded
    # comparison's setting; the simulator's default is Vidur's 10)
    waits = {"max_waiting_iters": 4} if scheduler.startswith("vidur-lightllm") else {}
    return ReplicaSpec(scheduler, KV_TOKENS, max_batch=32, budget=2048, max_model_len=1280, **waits)


def run(scheduler: str, replicas: int, n: int, kind: str = "bench") -> dict[str, Any]:
    w = workload(n, replicas, kind)
    make = spec(scheduler).factory()
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate_cluster(w, [make() for _ in range(replicas)], Constant(BATCH_TIME))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "scheduler": scheduler,
        "replicas": replicas,
        "requests": n,
        "workload": kind,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_cpu_s": n / cpu,
        "batches": res.num_batches,
        "completed": res.summary.completed,
        "restarts": int(res.metrics.restarts.sum()),
    }


def read_vidur(paths: str | None) -> list[dict[str, Any]]:
    """Vidur's rows from vidur_speed.py JSONs, less GitHub main's FT with its block leak
    (another simulation: ten times the batches)."""
    rows: list[dict[str, Any]] = []
    for path in (paths or "").split(","):
        if path:
            rows += [row for row in json.loads(Path(path).read_text()) if not row.get("ft_leak")]
    return rows


def vidur_baseline(
    rows: list[dict[str, Any]], scheduler: str, replicas: int, requests: int, workload: str
) -> dict[str, Any] | None:
    """Vidur's run of the same point: where several Vidur versions measured it (0.0.26 and
    GitHub main), the fastest one (the smallest ratio). A `vidur-*-released[-ref]` scheduler
    decides as Vidur's releases, so it is compared with 0.0.26's run of `vidur-*` only."""
    released = "-released" in scheduler
    name = scheduler.split("-released")[0] if released else scheduler
    same = [
        row
        for row in rows
        if (row["scheduler"], row["replicas"], row["requests"], row["workload"])
        == (name, replicas, requests, workload)
        and (row["vidur"] == "0.0.26" or not released)
    ]
    return min(same, key=lambda row: row["cpu_s"]) if same else None


HEADER = (
    f"{'scheduler':>18} {'workload':>8} {'replicas':>8} {'requests':>8} {'wall s':>7} "
    f"{'CPU s':>6} {'req/CPU-s':>9} {'batches':>8} {'growth':>6} {'Vidur CPU s':>11} "
    f"{'Vidur batches':>13} {'x Vidur':>7} {'Vidur':>6}"
)


def line(row: dict[str, Any]) -> str:
    v = row["vidur_cpu_s"]
    vs = (
        f"{v:>11.2f} {row['vidur_batches']:>13} {row['x_vidur']:>7.1f} {row['vidur']:>6}"
        if v
        else f"{'-':>11} {'-':>13} {'-':>7} {'-':>6}"
    )
    return (
        f"{row['scheduler']:>18} {row['workload']:>8} {row['replicas']:>8} {row['requests']:>8} "
        f"{row['wall_s']:>7.2f} {row['cpu_s']:>6.2f} {row['requests_per_cpu_s']:>9.0f} "
        f"{row['batches']:>8} {row['growth']:>6.2f} {vs}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--schedulers", default=",".join(VIDUR_SCHEDULERS))
    ap.add_argument("--replicas", default="1,8")
    ap.add_argument("--requests", default="2000,10000")
    ap.add_argument("--workload", choices=WORKLOADS, default="bench")
    ap.add_argument("--vidur-json", help="scripts/vidur_speed.py outputs (comma-separated)")
    ap.add_argument("--json", type=output_file, default="out/sim_speed.json")
    args = ap.parse_args()
    vidur = read_vidur(args.vidur_json)
    sizes = [int(x) for x in args.requests.split(",")]
    rows = []
    print(HEADER)
    for sched in args.schedulers.split(","):
        # a small untimed run first: lazy imports and first calls (Vidur's timing excludes its
        # set-up too: the simulator is built before its clock starts)
        run(sched, 1, 50, args.workload)
        for r in (int(x) for x in args.replicas.split(",")):
            first: dict[str, Any] | None = None
            for n in sizes:
                row = run(sched, r, n, args.workload)
                first = first or row
                row["growth"] = (row["cpu_s"] / first["cpu_s"]) / (n / first["requests"])
                v = vidur_baseline(vidur, sched, r, n, args.workload)
                row["vidur_cpu_s"] = v["cpu_s"] if v else None
                row["vidur_batches"] = v["batches"] if v else None
                row["vidur"] = ("0.0.26" if v["vidur"] == "0.0.26" else "main") if v else None
                row["x_vidur"] = v["cpu_s"] / row["cpu_s"] if v else None
                rows.append(row)
                print(line(row), flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
