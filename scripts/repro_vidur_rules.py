"""What Vidur's own rules change in simulated time under memory pressure: the project's
`vidur-vllm` and `vidur-sarathi` (watermark 0, padded prefill budget, restart only for a block
that is needed) against the classes that decide as Vidur's releases
(`reference/ar/vidur_released.py`), with the watermark switched on and off to tell the rules
apart.

    .venv/bin/python scripts/repro_vidur_rules.py [--kv-tokens 8192] [--qps 80] \
        [--requests 1200] [--seeds 5,6,7] [--json out/vidur-rules.json]

Workload: Poisson arrivals, prompts 64-1024 and outputs 16-256 tokens (uniform), one seed per
run; 4 replicas, round-robin, the Llama-3-8B / H100 roofline, 32 seats and a 2,048-token budget
per replica, blocks of 16, `--kv-tokens` of KV per replica (8,192: about 12 requests' worth,
so decodes run the pool dry and requests are restarted). Variants per scheduler:

- `reference`: `vidur-vllm` / `vidur-sarathi` as they are;
- `+ watermark`: the same with Vidur's watermark (a new request must leave 1 % of the blocks
  free);
- `release, no watermark`: `vidur-*-released` with the watermark off (vLLM: summed prefill
  tokens; Sarathi: a free block demanded by every decode, Vidur's restart of a partial prefill);
- Sarathi only, `block demand only, no watermark`: the same with `vidur-sarathi`'s restart (the
  victim prefills all it knows again), so only the one-free-block demand remains;
- `release`: `vidur-*-released` as it is, which decides as Vidur does.

Prints, per variant, the mean over the seeds of output tokens per second, e2e p50 and p90,
restarts and batches, and each mean over the release's; writes every run to JSON. A
measurement, not a test: it asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

from reference.ar.vidur import WATERMARK_FRACTION, VidurReplicaBase, VidurSarathi, VidurVllm
from reference.ar.vidur_released import VidurSarathiReleased, VidurVllmReleased
from reference.sim import workload as wl
from reference.sim.catalog import ReplicaSpec
from reference.sim.cluster import simulate_cluster
from reference.sim.exec_model import DEVICES, MODELS, Roofline
from reference.sim.replica import ArReplica
from schedspec_cli.output import output_file, write_json
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig

REPLICAS = 4
METRICS = ("tokens_per_s", "e2e_p50", "e2e_p90", "restarts", "batches")


def _with_watermark(
    cls: type[VidurReplicaBase], fraction: float, **rules: bool
) -> type[VidurReplicaBase]:
    """`cls` with its watermark fraction (and any other class-level rule) set."""
    attrs: dict[str, object] = {"watermark_fraction": fraction, **rules}
    return type(f"{cls.__name__}Watermark{fraction:g}", (cls,), attrs)


def variants() -> dict[str, dict[str, tuple[type[VidurReplicaBase], bool]]]:
    """Scheduler -> variant -> (class, chunked prefill)."""
    table: dict[str, dict[str, tuple[type[VidurReplicaBase], bool]]] = {}
    for name, reference, released, chunked in (
        ("vidur-vllm", VidurVllm, VidurVllmReleased, False),
        ("vidur-sarathi", VidurSarathi, VidurSarathiReleased, True),
    ):
        table[name] = {
            "reference": (reference, chunked),
            "+ watermark": (_with_watermark(reference, WATERMARK_FRACTION), chunked),
            "release, no watermark": (_with_watermark(released, 0.0), chunked),
            "release": (released, chunked),
        }
    # Sarathi's two rules apart: the one-free-block demand with the reference's restart
    # (listed before the release, which stays last)
    sarathi = table["vidur-sarathi"]
    release = sarathi.pop("release")
    sarathi["block demand only, no watermark"] = (
        _with_watermark(VidurSarathiReleased, 0.0, restart_keeps_processed=False),
        True,
    )
    sarathi["release"] = release
    return table


def _factory(cls: type[VidurReplicaBase]) -> Callable[[ArConfig, ArEventSink], ArSchedulerAdapter]:
    def make(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        return cls(config, sink)

    return make


def run(
    cls: type[VidurReplicaBase], chunked: bool, kv_tokens: int, qps: float, n: int, seed: int
) -> dict[str, Any]:
    spec = ReplicaSpec(
        "vidur-sarathi-ref" if chunked else "vidur-vllm-ref",
        kv_tokens,
        max_batch=32,
        budget=2048,
        max_model_len=1280,
    )
    config = spec.ar_config()
    w = wl.poisson(n, qps, wl.Lengths(64, 1024), wl.Lengths(16, 256), seed=seed)
    model = Roofline(MODELS["llama3-8b"], DEVICES["h100"])
    make = _factory(cls)
    res = simulate_cluster(w, [ArReplica(make, config) for _ in range(REPLICAS)], model)
    stats = res.summary.stats["request_e2e_time"]
    return {
        "seed": seed,
        "completed": res.summary.completed,
        "tokens_per_s": res.summary.throughput_tokens,
        "e2e_p50": stats.p50,
        "e2e_p90": stats.p90,
        "restarts": int(res.metrics.restarts.sum()),
        "batches": res.num_batches,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kv-tokens", type=int, default=8192, help="KV tokens per replica")
    parser.add_argument("--qps", type=float, default=80.0, help="arrivals per second, in all")
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--seeds", default="5,6,7", help="workload seeds, comma-separated")
    parser.add_argument("--json", type=output_file, default=None, help="write every run here")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        seeds = []
    # a pool must hold one request of max_model_len (1,280 tokens) for the spec's config
    if args.kv_tokens < 1280 or args.qps <= 0 or args.requests < 1 or not seeds:
        print(
            "error: need --kv-tokens >= 1280, --qps > 0, --requests >= 1 and --seeds as "
            "integers separated by commas",
            file=sys.stderr,
        )
        return 2
    print(
        f"{args.requests} requests, Poisson {args.qps:g} qps, prompt 64-1024, output 16-256; "
        f"{REPLICAS} replicas, round-robin, roofline Llama-3-8B@H100; {args.kv_tokens} KV "
        f"tokens, 32 seats, budget 2048 per replica; seeds {args.seeds}; means over the seeds"
    )
    print(
        f"{'scheduler':<14} {'variant':<32} {'tok/s':>7} {'e2e p50':>8} {'p90':>7} "
        f"{'restarts':>8} {'batches':>8}   over the release: tok/s  p50  restarts"
    )
    rows: list[dict[str, Any]] = []
    for name, table in variants().items():
        means: dict[str, dict[str, float]] = {}
        for variant, (cls, chunked) in table.items():
            runs = [run(cls, chunked, args.kv_tokens, args.qps, args.requests, s) for s in seeds]
            rows += [{"scheduler": name, "variant": variant, **r} for r in runs]
            means[variant] = {m: statistics.fmean(r[m] for r in runs) for m in METRICS}
        release = means["release"]
        for variant, m in means.items():
            over = {k: m[k] / release[k] if release[k] else float("nan") for k in METRICS}
            print(
                f"{name:<14} {variant:<32} {m['tokens_per_s']:>7.0f} {m['e2e_p50']:>8.3f} "
                f"{m['e2e_p90']:>7.3f} {m['restarts']:>8.1f} {m['batches']:>8.0f}   "
                f"{over['tokens_per_s']:>20.3f} {over['e2e_p50']:>4.2f} {over['restarts']:>9.2f}"
            )
    if args.json is not None:
        write_json(
            args.json,
            {
                "command": " ".join(["scripts/repro_vidur_rules.py", *(argv or sys.argv[1:])]),
                "kv_tokens": args.kv_tokens,
                "qps": args.qps,
                "requests": args.requests,
                "seeds": seeds,
                "replicas": REPLICAS,
                "runs": rows,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
