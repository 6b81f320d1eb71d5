"""FDFO/sync when the forward is k times heavier and the round's bookkeeping stays as it is.

    .venv/bin/python scripts/probe_heavier_forward.py [--heavier 1 2 4] [--max-running 4 16] \
        [--repeats 3] [--requests 128] [--threads 1] [--json out/heavier-forward.json]

Why: on the shipped model a 16-row forward takes 8-9 ms on CPU. Both modes spend a fixed
amount of host time per round or forward (the step, the scheduler's bookkeeping), and that time
pulls the measured FDFO/sync below the forward-time bound. This probe measures how the ratio
moves when the forward is a larger multiple of that fixed time, as it would be for a larger
model, without training one: every `forward_blocks` call of the shipped model runs `k` times
(the same inputs; each run writes the same K/V to the same slots and the logits of the last run
are returned, so they are the same values). The decisions, forwards and rows are therefore
exactly the benchmark's for every k; only the model work per forward is k times as much.

For every k the benchmark (`gpu.bench.run_bench`: the shipped prompts cycled, 32 new tokens,
block 8, page 16, LowConfidence, the four modes interleaved in 50 ms turns) runs `--repeats`
times. Per k and seat count it reports the paired wall-clock ratios fdfo/sync and
fdfo+reuse/sync (medians over the repeats), the same ratios of forward time alone (tokens per
second of `ModelRunner.forward`, paired the same way: the live counterpart of
`schedspec bench engine --forward-bound`, which replays the forwards in isolation) and the share
of each mode's time spent outside the forward. It also states what the lightest k's own split
predicts for the others: with F the forward seconds and O the rest of a mode's run there, a
forward f times heavier scales the measured ratio by (f F_sync + O_sync) / (f F_fdfo + O_fdfo)
over the same at f = 1. Measured and predicted agreeing says the fixed time is what separates
the ratio from the forward-time ratio.

Prints a table and writes JSON. A measurement, not a test: it asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch

from gpu.bench import BenchReport, run_bench, write_script_report
from gpu.model import BlockDiffusionLM
from gpu.prompts import ASSETS
from gpu.weights import load_model
from schedspec_cli.output import output_file

NUMERATORS = ("fdfo", "fdfo+reuse")
MAX_HEAVIER = 16


def make_heavier(model: BlockDiffusionLM, k: int) -> None:
    """Make `model.forward_blocks` (on this instance only) run the real one `k` times and
    return the last run's logits; k=1 restores the class's method."""
    model.__dict__.pop("forward_blocks", None)
    if k == 1:
        return
    inner: Callable[..., torch.Tensor] = model.forward_blocks

    def heavier(*args: Any, **kwargs: Any) -> torch.Tensor:
        for _ in range(k - 1):
            inner(*args, **kwargs)
        return inner(*args, **kwargs)

    model.__dict__["forward_blocks"] = heavier


def _split(report: BenchReport, max_running: int, mode: str) -> tuple[float, float]:
    """(forward seconds, other seconds) of the mode's median run."""
    run = report.median_run(max_running, mode)
    return run.forward_seconds, run.seconds - run.forward_seconds


def predicted(base: BenchReport, max_running: int, mode: str, factor: float) -> float:
    """mode/sync were the forward of `base`'s runs `factor` times heavier and nothing else
    changed, from `base`'s own split: its measured paired ratio scaled by
    (f F_sync + O_sync) / (f F_mode + O_mode) over the same with f = 1."""
    f_sync, o_sync = _split(base, max_running, "sync")
    f_mode, o_mode = _split(base, max_running, mode)

    def of_medians(f: float) -> float:
        return (f * f_sync + o_sync) / (f * f_mode + o_mode)

    measured = base.ratios()[f"{mode}/sync"][str(max_running)]
    return measured * of_medians(factor) / of_medians(1.0)


def probe(
    heavier: list[int], max_running: list[int], repeats: int, requests: int
) -> dict[int, BenchReport]:
    model, _ = load_model(ASSETS, torch.device("cpu"))
    reports: dict[int, BenchReport] = {}
    try:
        for k in heavier:
            make_heavier(model, k)
            reports[k] = run_bench(max_running, requests=requests, repeats=repeats, model=model)
    finally:
        make_heavier(model, 1)
    return reports


def summarise(reports: dict[int, BenchReport]) -> list[dict[str, Any]]:
    """A row per (k, seats): measured ratios, their prediction from the lightest k, and each
    mode's share of time outside the forward."""
    lightest = min(reports)
    base = reports[lightest]
    rows: list[dict[str, Any]] = []
    for k, report in sorted(reports.items()):
        ratios, forward, work = (report.ratios(c) for c in ("wall", "forward", "work"))
        for m in report.max_running_values():
            row: dict[str, Any] = {"heavier": k, "max_running": m}
            for num in NUMERATORS:
                row[f"{num}/sync"] = ratios[f"{num}/sync"][str(m)]
                row[f"{num}/sync predicted"] = round(predicted(base, m, num, k / lightest), 3)
                row[f"{num}/sync forward time"] = forward[f"{num}/sync"][str(m)]
            for mode in ("sync", *NUMERATORS):
                f, o = _split(report, m, mode)
                row[f"{mode} outside forward"] = round(o / (f + o), 4)
            row["work ratio"] = work["fdfo/sync"][str(m)]
            rows.append(row)
    return rows


def _print(rows: list[dict[str, Any]], threads: int) -> None:
    print(f"device: cpu (torch {torch.__version__}, {threads} thread); forward run k times")
    print(
        f"{'k':>3} {'seats':>5} {'fdfo/sync':>10} {'predicted':>10} {'fwd time':>9} "
        f"{'+reuse/sync':>12} {'predicted':>10} {'fwd time':>9}   outside forward: "
        f"{'sync':>6} {'fdfo':>6} {'+reuse':>7}"
    )
    for r in rows:
        print(
            f"{r['heavier']:>3} {r['max_running']:>5} {r['fdfo/sync']:>10.3f} "
            f"{r['fdfo/sync predicted']:>10.3f} {r['fdfo/sync forward time']:>9.3f} "
            f"{r['fdfo+reuse/sync']:>12.3f} {r['fdfo+reuse/sync predicted']:>10.3f} "
            f"{r['fdfo+reuse/sync forward time']:>9.3f}   {'':>16} "
            f"{r['sync outside forward']:>6.1%} {r['fdfo outside forward']:>6.1%} "
            f"{r['fdfo+reuse outside forward']:>7.1%}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--heavier", type=int, nargs="+", default=[1, 2, 4], help=f"k values (1..{MAX_HEAVIER})"
    )
    parser.add_argument("--max-running", type=int, nargs="+", default=[4, 16], help="seats")
    parser.add_argument("--repeats", type=int, default=3, help="benchmark runs per k (median)")
    parser.add_argument("--requests", type=int, default=128, help="requests served per run")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", type=output_file, default=None, help="write the results here")
    args = parser.parse_args(argv)
    if not all(1 <= k <= MAX_HEAVIER for k in args.heavier) or len(set(args.heavier)) != len(
        args.heavier
    ):
        print(f"error: --heavier takes distinct k in 1..{MAX_HEAVIER}", file=sys.stderr)
        return 2
    if not all(1 <= m <= 64 for m in args.max_running) or args.repeats < 1 or args.threads < 1:
        print("error: need --max-running in 1..64, --repeats >= 1, --threads >= 1", file=sys.stderr)
        return 2
    if args.requests < 1:
        print("error: --requests must be at least 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    reports = probe(
        sorted(args.heavier), sorted(set(args.max_running)), args.repeats, args.requests
    )
    rows = summarise(reports)
    _print(rows, args.threads)
    if args.json is not None:
        write_script_report(
            args.json,
            "scripts/probe_heavier_forward.py",
            argv,
            args.threads,
            {
                "requests": args.requests,
                "repeats": args.repeats,
                "results": rows,
                "runs": {str(k): r.to_json() for k, r in reports.items()},
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
