"""Vidur's own wall time on the workloads of `scripts/bench_sim_speed.py` (the same arrays).

Run it with a Python that has Vidur installed, outside the project's venv, e.g.

    python3 -m venv /tmp/vidur-venv
    /tmp/vidur-venv/bin/pip install numpy pandas scikit-learn ddsketch fasteners click randomname \
        paretoset matplotlib seaborn plotly_express kaleido huggingface_hub wandb
    /tmp/vidur-venv/bin/pip install --no-deps vidur==0.0.26
    /tmp/vidur-venv/bin/python scripts/vidur_speed.py --json out/vidur_speed.json

Vidur runs with its execution-time predictor replaced by a constant 50 ms per batch (so no
profiling data or model training is needed and both simulators do the same work per batch),
metrics writing off, 4096 KV blocks of 16 tokens, batch_size_cap 32, a 2,048-token budget
(vLLM's max_tokens_in_batch, Sarathi's chunk size) and round-robin. PyPI's vidur 0.0.26 ships
vLLM, Orca and Sarathi (no LightLLM or FasterTransformer replica schedulers).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # reference.sim.workload: numpy only

NAMES = {"vidur-vllm": "vllm", "vidur-sarathi": "sarathi", "vidur-orca": "orca"}


def run(scheduler: str, replicas: int, n: int, tmp: Path) -> float:
    import pandas as pd
    import vidur.scheduler.global_scheduler.base_global_scheduler as bgs
    from vidur import config as vc
    from vidur.entities.execution_time import ExecutionTime
    from vidur.simulator import Simulator

    from reference.sim import workload as wl

    class ConstantPredictor:
        def get_execution_time(self, batch: Any, stage: int) -> Any:
            # one layer whose MLP up-projection takes 50 ms; everything else 0
            return ExecutionTime(1, 0, 0, 0, 0, 0, 0, 50.0, 0, 0, 0, 0, 0, 0, 0)

    class Registry:
        @staticmethod
        def get(*args: Any, **kwargs: Any) -> ConstantPredictor:
            return ConstantPredictor()

    bgs.ExecutionTimePredictorRegistry = Registry  # type: ignore[attr-defined]
    w = wl.poisson(n, 2.0 * replicas, wl.Lengths(64, 1024), wl.Lengths(16, 256), seed=5)
    trace = tmp / f"trace_{replicas}_{n}.csv"
    pd.DataFrame(
        {
            "Date": "d",
            "Time": w.arrived_at,
            "PromptTokenCount": w.prefill,
            "CompletionTokenCount": w.decode,
        }
    ).to_csv(trace, index=False)
    name = NAMES[scheduler]
    rs = {
        "vllm": lambda: vc.VllmSchedulerConfig(batch_size_cap=32, max_tokens_in_batch=2048),
        "orca": lambda: vc.OrcaSchedulerConfig(batch_size_cap=32),
        "sarathi": lambda: vc.SarathiSchedulerConfig(batch_size_cap=32, chunk_size=2048),
    }[name]()
    cfg = vc.SimulationConfig(
        log_level="error",
        cluster_config=vc.ClusterConfig(
            num_replicas=replicas,
            replica_config=vc.ReplicaConfig(),
            cache_config=vc.CacheConfig(block_size=16, num_blocks=4096),
            global_scheduler_config=vc.RoundRobinGlobalSchedulerConfig(),
            replica_scheduler_config=rs,
        ),
        request_generator_config=vc.TraceRequestGeneratorConfig(
            trace_file=str(trace),
            date="d",
            prefill_scale_factor=1,
            decode_scale_factor=1,
            time_scale_factor=1,
            max_tokens=1280,
        ),
        metrics_config=vc.MetricsConfig(
            write_metrics=False,
            write_json_trace=False,
            store_plots=False,
            enable_chrome_trace=False,
            output_dir=str(tmp / "out"),
        ),
    )
    sim = Simulator(cfg)
    t0 = time.perf_counter()
    sim.run()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--schedulers", default=",".join(NAMES))
    ap.add_argument("--replicas", default="1,8")
    ap.add_argument("--requests", default="2000,10000")
    ap.add_argument("--json", default="out/vidur_speed.json")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # SCHED R N: one run, print wall
    args = ap.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as d:
            print(run(args.one[0], int(args.one[1]), int(args.one[2]), Path(d)))
        return
    rows = []
    # each run in a fresh process: Vidur keeps global state between simulations
    for sched in args.schedulers.split(","):
        for r in (int(x) for x in args.replicas.split(",")):
            for n in (int(x) for x in args.requests.split(",")):
                cmd = [sys.executable, __file__, "--one", sched, str(r), str(n)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                wall = float(done.stdout.strip().splitlines()[-1])
                rows.append({"scheduler": sched, "replicas": r, "requests": n, "wall_s": wall})
                print(f"vidur {sched:>14} x{r} n={n}: {wall:.2f} s ({n / wall:.0f} req/s)")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
