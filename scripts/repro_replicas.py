"""Vidur-style comparison of the five replica schedulers (vLLM, Sarathi, Orca, LightLLM,
FasterTransformer) on one trace: 4 replicas, round-robin, a Llama-3-8B / H100 roofline; latency
CDFs to --plots DIR. By default the fast replicas (`reference/sim/fast_*.py`); with --reference
the `reference/ar/vidur.py` classes through `ArReplica` (same decisions, so the same figures;
only the wall time differs).

    .venv/bin/python scripts/repro_replicas.py [--plots DIR] [--trace-csv PATH] [--reference]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from reference.sim import workload as wl
from reference.sim.catalog import VIDUR_SCHEDULERS as SCHEDULERS
from reference.sim.catalog import ReplicaSpec
from reference.sim.cluster import simulate_cluster
from reference.sim.exec_model import DEVICES, MODELS, Roofline


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plots")
    ap.add_argument("--trace-csv")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--qps", type=float, default=40.0)
    ap.add_argument("--reference", action="store_true", help="the reference classes (slow)")
    args = ap.parse_args()
    if args.trace_csv:
        w = wl.read_trace(args.trace_csv)
    else:
        w = wl.poisson(args.requests, args.qps, wl.Lengths(64, 1024), wl.Lengths(16, 256), seed=5)
    model = Roofline(MODELS["llama3-8b"], DEVICES["h100"])
    kv_tokens = 16_384
    print(
        f"{len(w)} requests, Poisson {args.qps} qps, prompt 64-1024, output 16-256; 4 replicas, "
        f"round-robin, roofline Llama-3-8B@H100; {kv_tokens} KV tokens, 32 seats, "
        f"budget 2048 tokens per replica"
    )
    print(
        f"{'scheduler':>15} {'e2e p50':>8} {'p90':>7} {'TTFT p50':>8} {'p90':>7} "
        f"{'TPOT p50':>8} {'restarts':>8} {'wall s':>6}"
    )
    cols = {}
    for name in SCHEDULERS:
        spec = ReplicaSpec(
            f"{name}-ref" if args.reference else name,
            kv_tokens,
            max_batch=32,
            budget=2048,
            max_model_len=1280,
        )
        make = spec.factory()
        t0 = time.perf_counter()
        res = simulate_cluster(w, [make() for _ in range(4)], model)
        el = time.perf_counter() - t0
        s = res.summary.stats
        print(
            f"{name:>15} {s['request_e2e_time'].p50:>8.3f} {s['request_e2e_time'].p90:>7.3f} "
            f"{s['prefill_e2e_time'].p50:>8.3f} {s['prefill_e2e_time'].p90:>7.3f} "
            f"{s['decode_time_execution_plus_preemption_normalized'].p50:>8.4f} "
            f"{int(res.metrics.restarts.sum()):>8} {el:>6.1f}"
        )
        c = res.metrics.columns()
        cols[name] = {
            k: c[k]
            for k in (
                "request_e2e_time",
                "prefill_e2e_time",
                "decode_time_execution_plus_preemption_normalized",
            )
        }
    if args.plots:
        from reference.sim.export import latency_cdfs

        p = latency_cdfs(
            cols,
            Path(args.plots) / "replica_schedulers_cdf.png",
            "Vidur replica schedulers, one trace",
        )
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
