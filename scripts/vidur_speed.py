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
(vLLM's and LightLLM's max_tokens_in_batch, Sarathi's chunk size), LightLLM's
max_waiting_iters 4 (scripts/bench_sim_speed.py runs the simulator's `vidur-lightllm` with 4
too; both default to Vidur's 10 otherwise) and block size 1 and round-robin.

PyPI's vidur 0.0.26 ships vLLM, Orca and Sarathi only. LightLLM and FasterTransformer are in
microsoft/vidur's GitHub main, whose configuration differs (no CacheConfig: block size and pool
live in the replica scheduler's config; ExecutionTime has CPU-overhead fields); this script
detects which one it runs under. To run GitHub main, put its `vidur/` package first on the path
of the same venv (its imports are the same packages):

    PYTHONPATH=/tmp/msvidur /tmp/vidur-venv/bin/python scripts/vidur_speed.py \
        --schedulers vidur-lightllm,vidur-ft --json out/vidur_main_speed.json

`--workload` picks the workload: `bench` (default; 2 qps per replica, outputs 16-256) or
`simulate` (`schedspec simulate replicas`' default generator: 10 qps in all, the same lengths).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from schedspec_cli.output import output_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # reference.sim.workload: numpy only

NAMES = {
    "vidur-vllm": "vllm",
    "vidur-sarathi": "sarathi",
    "vidur-orca": "orca",
    "vidur-lightllm": "lightllm",
    "vidur-ft": "ft",
}
WORKLOADS = ("bench", "simulate")


def make_workload(kind: str, n: int, replicas: int) -> Any:
    """The arrays `scripts/bench_sim_speed.py` simulates (`workload` there is the same)."""
    from reference.sim import workload as wl

    if kind == "bench":
        return wl.poisson(n, 2.0 * replicas, wl.Lengths(64, 1024), wl.Lengths(16, 256), seed=5)
    return wl.poisson(n, 10.0, wl.Lengths(64, 1024), wl.Lengths(16, 256), seed=0)


def _constant_predictor() -> Any:
    """An execution-time predictor whose every batch takes 50 ms (one layer's MLP
    up-projection; every other field 0), for 0.0.26's and GitHub main's ExecutionTime."""
    import inspect

    from vidur.entities.execution_time import ExecutionTime

    params = [q for q in inspect.signature(ExecutionTime.__init__).parameters if q != "self"]
    values = {q: 0.0 for q in params}
    values["num_layers_per_pipeline_stage"] = 1
    values["mlp_layer_up_proj_execution_time"] = 50.0

    class ConstantPredictor:
        def get_execution_time(self, batch: Any, stage: int) -> Any:
            return ExecutionTime(**values)

    return ConstantPredictor()


def _replica_scheduler(vc: Any, name: str, cache: dict[str, int]) -> Any:
    """Seats 32, budget 2,048 tokens; `cache` is block size and pool where the config has them
    (GitHub main), else empty (0.0.26 has a CacheConfig)."""
    lightllm = {"max_waiting_iters": 4}
    if cache:  # LightLLM needs block size 1: the same pool in tokens
        lightllm |= {"block_size": 1, "num_blocks": cache["block_size"] * cache["num_blocks"]}
    make = {
        "vllm": lambda: vc.VllmSchedulerConfig(
            batch_size_cap=32, max_tokens_in_batch=2048, **cache
        ),
        "orca": lambda: vc.OrcaSchedulerConfig(batch_size_cap=32, **cache),
        "sarathi": lambda: vc.SarathiSchedulerConfig(batch_size_cap=32, chunk_size=2048, **cache),
        "lightllm": lambda: vc.LightllmSchedulerConfig(
            batch_size_cap=32, max_tokens_in_batch=2048, **lightllm
        ),
        "ft": lambda: vc.FasterTransformerSchedulerConfig(batch_size_cap=32, **cache),
    }
    return make[name]()


def run(
    scheduler: str, replicas: int, n: int, tmp: Path, kind: str, leak: bool = False
) -> tuple[float, float, int, int]:
    """Vidur's wall and CPU seconds for one simulation, its number of batches and the requests
    it never started (0 unless the run stopped early)."""
    import pandas as pd
    import vidur.scheduler.global_scheduler.base_global_scheduler as bgs
    from vidur import config as vc
    from vidur.simulator import Simulator

    predictor = _constant_predictor()

    class Registry:
        @staticmethod
        def get(*args: Any, **kwargs: Any) -> Any:
            return predictor

    bgs.ExecutionTimePredictorRegistry = Registry
    w = make_workload(kind, n, replicas)
    trace = tmp / f"trace_{replicas}_{n}.csv"
    main = not hasattr(vc, "CacheConfig")  # GitHub main
    columns = (
        ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
        if main
        else ("Time", "PromptTokenCount", "CompletionTokenCount")
    )
    frame = pd.DataFrame(dict(zip(columns, (w.arrived_at, w.prefill, w.decode), strict=True)))
    if not main:
        frame.insert(0, "Date", "d")
    frame.to_csv(trace, index=False)
    cache = {"block_size": 16, "num_blocks": 4096} if main else {}
    extra = {} if main else {"cache_config": vc.CacheConfig(block_size=16, num_blocks=4096)}
    gen = {} if main else {"date": "d"}
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    cfg = vc.SimulationConfig(
        log_level="error",
        cluster_config=vc.ClusterConfig(
            num_replicas=replicas,
            # one stage, one GPU: the simulator's replicas (0.0.26 defaults to 2 stages x TP 8)
            replica_config=vc.ReplicaConfig(num_pipeline_stages=1, tensor_parallel_size=1),
            global_scheduler_config=vc.RoundRobinGlobalSchedulerConfig(),
            replica_scheduler_config=_replica_scheduler(vc, NAMES[scheduler], cache),
            **extra,
        ),
        request_generator_config=vc.TraceRequestGeneratorConfig(
            trace_file=str(trace),
            prefill_scale_factor=1,
            decode_scale_factor=1,
            time_scale_factor=1,
            max_tokens=1280,
            **gen,
        ),
        metrics_config=vc.MetricsConfig(
            write_metrics=False,
            write_json_trace=False,
            store_plots=False,
            enable_chrome_trace=False,
            output_dir=str(out),
        ),
    )
    sim = Simulator(cfg)
    if NAMES[scheduler] == "ft" and not leak:
        _free_finished_requests(sim)
    batches = _count_batches(sim)
    t0, c0 = time.perf_counter(), time.process_time()
    # its end-of-run check fails when requests are left (GitHub main's FT leaks blocks)
    with contextlib.suppress(AssertionError):
        sim.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    replicas_left = sim._scheduler._replica_schedulers.values()
    never_started = sum(rs.num_pending_requests for rs in replicas_left)
    return wall, cpu, batches[0], never_started


def _free_finished_requests(sim: Any) -> None:
    """GitHub main's FasterTransformer frees a batch's blocks only when all of its requests
    finished, and then only those of the last regenerated batch: a request that finished earlier
    keeps its blocks for ever (docs/engines/vidur.md), the pool shrinks and batches get small. Here
    a batch end frees every finished request's blocks, as the simulator's `vidur-ft` does (FT
    admits only when no batch runs, so when they are freed changes no decision)."""
    for rs in sim._scheduler._replica_schedulers.values():

        def on_batch_end(batch: Any, rs: Any = rs) -> None:
            rs._num_running_batches -= 1
            rs.free(*(q.id for q in batch.requests if q.completed and q.id in rs._allocation_map))
            if not batch.all_requests_completed:
                rs._preempted_batches.append(batch)

        rs.on_batch_end = on_batch_end


def _count_batches(sim: Any) -> list[int]:
    """Counts the batches every replica scheduler forms (a one-element list filled by run)."""
    count = [0]
    for rs in sim._scheduler._replica_schedulers.values():
        orig = rs.on_schedule

        def on_schedule(*args: Any, orig: Any = orig) -> Any:
            out = orig(*args)  # main: a list of batches; 0.0.26: one batch or None
            count[0] += len(out) if isinstance(out, list) else int(out is not None)
            return out

        rs.on_schedule = on_schedule
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--schedulers", default="vidur-vllm,vidur-sarathi,vidur-orca")
    ap.add_argument("--replicas", default="1,8")
    ap.add_argument("--requests", default="2000,10000")
    ap.add_argument("--workload", choices=WORKLOADS, default="bench")
    ap.add_argument(
        "--ft-leak",
        action="store_true",
        help="run GitHub main's FasterTransformer as it is (finished requests keep blocks)",
    )
    ap.add_argument("--json", type=output_file, default="out/vidur_speed.json")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # SCHED R N: one run, print wall
    args = ap.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as d:
            sched, r, n = args.one[0], int(args.one[1]), int(args.one[2])
            out = run(sched, r, n, Path(d), args.workload, args.ft_leak)
            print("RESULT", *out, flush=True)
        return
    import vidur

    # 0.0.26 has a version; GitHub main's `vidur` is a namespace package: name where it is
    version = getattr(vidur, "__version__", None) or f"source at {next(iter(vidur.__path__))}"
    rows = []
    # each run in a fresh process: Vidur keeps global state between simulations
    for sched in args.schedulers.split(","):
        for r in (int(x) for x in args.replicas.split(",")):
            for n in (int(x) for x in args.requests.split(",")):
                cmd = [sys.executable, __file__, "--workload", args.workload, "--one", sched]
                cmd += ["--ft-leak"] if args.ft_leak else []
                done = subprocess.run([*cmd, str(r), str(n)], capture_output=True, text=True)
                if done.returncode != 0:
                    tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
                    print(f"vidur {sched:>14} x{r} n={n}: failed: {tail[0]}")
                    continue
                # GitHub main logs to stdout at exit (after the result line)
                line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
                fields = line.split()[1:]
                wall, cpu = float(fields[0]), float(fields[1])
                batches, never_started = int(fields[2]), int(fields[3])
                rows.append(
                    {
                        "scheduler": sched,
                        "replicas": r,
                        "requests": n,
                        "workload": args.workload,
                        "wall_s": wall,
                        "cpu_s": cpu,
                        "batches": batches,
                        "never_started": never_started,
                        "ft_leak": args.ft_leak,
                        "vidur": version,
                    }
                )
                print(
                    f"vidur {sched:>14} x{r} n={n}: {wall:.2f} s wall, {cpu:.2f} s CPU "
                    f"({n / cpu:.0f} req/CPU-s, {batches} batches"
                    + (f", {never_started} requests never started)" if never_started else ")"),
                    flush=True,
                )
    json_path: Path = args.json
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(rows, indent=2))
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
