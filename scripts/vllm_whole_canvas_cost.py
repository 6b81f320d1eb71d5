"""What the whole-canvas fix costs: vLLM 0.33.0's diffusion path as released against the same
scheduler with the candidate fix (`integrations.vllm.whole_canvas_fix`), on programs whose
token budget binds.

    .venv/bin/python scripts/vllm_whole_canvas_cost.py --programs 2000 [--pipeline-parallel P]
        [--json FILE]

Each program (`dllm_program(seed, budget_binds=True)`, seeds 0..N-1) runs four times: through
the synchronous and the asynchronous engine-core loop, once with vLLM as released and once
with the fix. The released runs tolerate the canvases the budget cuts (counted, served as
scheduled: `DllmCoreLoop(tolerate_short_canvases=True)`); every other rule is checked in all
four. Per loop and variant the table gives the engine-core steps, the canvas steps (denoise and
commit), the tokens scheduled and the share of the budget they used, the output tokens, the
requests' latency in engine steps (arrival to the step that finished them, finished requests
only), and how often a running request past its prefill was left out of a schedule() call;
then the paired figures over the programs the fix changed (elsewhere it never skipped a request
and the runs are the same): per program the fix's engine steps and canvas steps
over the released run's, and per request that finished in both its latency ratio. Counts only,
no timing.

Exit 1 if a run broke a rule, 2 on bad arguments. Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.custom_scheduler import check_for_loops
from integrations.vllm.diffusion import DllmCoreLoop, DllmProgram, DllmRun, dllm_program
from integrations.vllm.program_tally import (
    MODES,
    add_program_arguments,
    parse_program_arguments,
    refuse_scheduler_cls,
)
from integrations.vllm.whole_canvas_fix import apply_whole_canvas_fix
from schedspec_cli.output import output_file, write_json
from spec.errors import ConfigError

VARIANTS = ("released", "fix")


@dataclass
class Totals:
    """One loop and variant, summed over the programs."""

    engine_steps: int = 0
    schedules: int = 0
    budget_tokens: int = 0  # schedule() calls times the program's token budget
    scheduled_tokens: int = 0
    canvas_steps: int = 0
    short_canvas_steps: int = 0
    output_tokens: int = 0
    canvas_waits: int = 0
    longest_canvas_wait: int = 0
    latencies: list[int] = field(default_factory=list)

    def add(self, run: DllmRun, budget: int) -> None:
        self.engine_steps += run.engine_steps
        self.schedules += run.schedules
        self.budget_tokens += run.schedules * budget
        self.scheduled_tokens += run.scheduled_tokens
        self.canvas_steps += run.denoise_steps + run.commits
        self.short_canvas_steps += run.short_canvas_steps
        self.output_tokens += sum(len(tokens) for tokens in run.outputs.values())
        self.canvas_waits += run.canvas_waits
        self.longest_canvas_wait = max(self.longest_canvas_wait, run.longest_canvas_wait)
        self.latencies.extend(run.latencies.values())

    def figures(self) -> dict[str, float]:
        lat = sorted(self.latencies) or [0]
        return {
            "engine_steps": self.engine_steps,
            "canvas_steps": self.canvas_steps,
            "short_canvas_steps": self.short_canvas_steps,
            "scheduled_tokens": self.scheduled_tokens,
            "budget_used": self.scheduled_tokens / max(1, self.budget_tokens),
            "output_tokens": self.output_tokens,
            "output_tokens_per_canvas_step": self.output_tokens / max(1, self.canvas_steps),
            "finished_requests": len(self.latencies),
            "latency_mean": statistics.fmean(lat),
            "latency_p90": lat[(len(lat) - 1) * 9 // 10],
            "latency_max": lat[-1],
            "canvas_waits": self.canvas_waits,
            "longest_canvas_wait": self.longest_canvas_wait,
        }


ROWS = (
    ("engine_steps", "engine-core steps", "d"),
    ("canvas_steps", "canvas steps (denoise and commit)", "d"),
    ("short_canvas_steps", "  of them cut short by the budget", "d"),
    ("scheduled_tokens", "tokens scheduled (prefill and canvas)", "d"),
    ("budget_used", "share of the token budget used", "%"),
    ("output_tokens", "output tokens", "d"),
    ("output_tokens_per_canvas_step", "output tokens per canvas step", ".3f"),
    ("finished_requests", "requests finished", "d"),
    ("latency_mean", "latency, mean engine steps", ".2f"),
    ("latency_p90", "latency, p90", "d"),
    ("latency_max", "latency, max", "d"),
    ("canvas_waits", "running requests left out of a schedule()", "d"),
    ("longest_canvas_wait", "  most schedule() calls in a row", "d"),
)


def _cell(value: float, fmt: str) -> str:
    if fmt == "%":
        return f"{100 * value:.1f}%"
    return format(int(value) if fmt == "d" else value, fmt)


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median, range and share above 1 of paired ratios; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "share_above_1": sum(v > 1 for v in ordered) / len(ordered),
    }


def _run(program: DllmProgram, variant: str, async_scheduling: bool, stages: int) -> DllmRun:
    serving = replace(program.serving, pipeline_parallel_size=stages if async_scheduling else 1)
    loop = DllmCoreLoop(
        serving,
        async_scheduling=async_scheduling,
        mutate=apply_whole_canvas_fix if variant == "fix" else None,
        tolerate_short_canvases=variant == "released",
    )
    return loop.run(replace(program, serving=serving))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/vllm_whole_canvas_cost.py")
    add_program_arguments(parser, 2000)
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the figures to this file"
    )
    args = parse_program_arguments(parser, argv)
    try:  # a class of the user's must be one vLLM builds in both loops, checked up front
        check_for_loops(MODES, diffusion=True)
    except ConfigError as err:
        return refuse_scheduler_cls(parser.prog, err)
    start = time.perf_counter()
    totals = {(mode, v): Totals() for mode in MODES for v in VARIANTS}
    step_ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
    canvas_ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
    latency_ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
    failures: list[str] = []
    cut = dict.fromkeys(MODES, 0)  # programs where the released run served a cut canvas
    requests = 0
    for seed in range(args.programs):
        program = dllm_program(seed, budget_binds=True)
        requests += sum(len(batch) for batch in program.arrivals)
        for mode in MODES:
            runs: dict[str, DllmRun] = {}
            try:
                for variant in VARIANTS:
                    runs[variant] = _run(program, variant, mode == "async", args.pipeline_parallel)
            except EngineCoreViolation as err:
                failures.append(f"seed {seed}, {mode} loop, {variant}: {err}")
                continue
            for variant, run in runs.items():
                totals[mode, variant].add(run, program.serving.max_num_batched_tokens)
            released, fixed = runs["released"], runs["fix"]
            cut[mode] += released.short_canvas_steps > 0
            if released == fixed:
                continue  # the fix never skipped a request: the same run
            step_ratios[mode].append(fixed.engine_steps / released.engine_steps)
            canvas_ratios[mode].append(
                (fixed.denoise_steps + fixed.commits) / (released.denoise_steps + released.commits)
            )
            latency_ratios[mode].extend(
                fixed.latencies[rid] / max(1, released.latencies[rid])
                for rid in fixed.latencies.keys() & released.latencies.keys()
            )
    elapsed = time.perf_counter() - start
    figures = {f"{mode}/{v}": totals[mode, v].figures() for mode, v in totals}
    p = args.pipeline_parallel
    print(
        f"{args.programs} programs ({requests} requests; token budget binds; async with {p} "
        f"pipeline stage{'s' if p > 1 else ''}): vLLM as released (budget-cut canvases "
        f"tolerated) against the whole-canvas fix"
    )
    print(f"{'':42} {'sync':>9} {'':>9} {'':>7} {'async':>9}")
    print(f"{'':42} " + " ".join(f"{'released':>9} {'fix':>9} {'fix/rel':>7}" for _ in MODES))
    for key, label, fmt in ROWS:
        cells = []
        for mode in MODES:
            rel, fix = figures[f"{mode}/released"][key], figures[f"{mode}/fix"][key]
            ratio = f"{fix / rel:7.3f}" if rel else f"{'-':>7}"
            cells.append(f"{_cell(rel, fmt):>9} {_cell(fix, fmt):>9} {ratio}")
        print(f"{label:42} " + " ".join(cells))
    paired = {
        "engine_steps_per_program": step_ratios,
        "canvas_steps_per_program": canvas_ratios,
        "latency_per_request": latency_ratios,
    }
    spreads = {name: {m: _spread(r[m]) for m in MODES} for name, r in paired.items()}
    changed = ", ".join(f"{m} {len(step_ratios[m])}" for m in MODES)
    print(
        "programs where the released run served a cut canvas: "
        + ", ".join(f"{m} {cut[m]}" for m in MODES)
    )
    print(
        f"paired, fix over released, over the programs the fix changed ({changed}): "
        f"median [min, max], share above 1"
    )
    for name, per_mode in spreads.items():
        cells = [
            f"{m} -"
            if s is None
            else f"{m} {s['median']:.3f} [{s['min']:.2f}, {s['max']:.2f}] "
            f"{100 * s['share_above_1']:.0f}%"
            for m, s in per_mode.items()
        ]
        print(f"  {name.replace('_', ' '):38} " + "   ".join(cells))
    for line in failures[:5]:
        print(f"FAIL {line}")
    if failures:
        print(f"{len(failures)} runs broke a rule")
    print(f"({elapsed:.1f} s)")
    if args.json:
        write_json(
            args.json,
            {
                "programs": args.programs,
                "requests": requests,
                "pipeline_parallel_size": p,
                "figures": figures,
                "programs_with_a_cut_canvas": cut,
                "programs_changed_by_the_fix": {m: len(step_ratios[m]) for m in MODES},
                "paired_fix_over_released": spreads,
                "failures": failures,
                "seconds": elapsed,
            },
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
