"""Where a round's time goes, phase by phase, for each serving mode of the benchmark workload.

    .venv/bin/python scripts/profile_round.py [--max-running 16] [--modes sync,fdfo,fdfo+reuse] \
        [--repeats 3] [--requests 128] [--threads 1] [--device cpu|cuda[:N]] \
        [--json out/profile-round.json]

Why: `schedspec bench engine` splits a forward's time into model, attention, step and
"scheduler" (everything else). This script splits that "everything else" by the engine's own
methods, to say which bookkeeping an FDFO round pays that sync pays once per lock-step round.
Each mode (the benchmark's four, or `fdfo+rows-released`, `bench engine --rows-released`'s
fifth) serves the benchmark's workload (`gpu.bench.serving`: the shipped prompts cycled,
32 new tokens, block 8, page 16, LowConfidence) on the shipped model (on the CPU unless
`--device` says otherwise), with the engine's phase methods wrapped in timers on that engine
instance only (nothing global is patched):

    row re-acquisition  `_reacquire_rows` (only `fdfo+rows-released`: rows taken back)
    admission        `_admit`
    block starts     `_start_blocks` (new blocks' tokens and algorithm states)
    KV + table       the rest of `_prepare_batch` (allocation, the table write)
    plan             `_plan_batch` (the batch layout, rebuilt when the batch changed)
    forward          `ModelRunner.forward` (model and attention)
    step             the algorithm's step (the engine's own `step_seconds`)
    batch + events   the rest of `_run_worker` (inputs, stack, Forward / StepResult events)
    commits          `_commit` (streaming a finished block; finishing a request)
    carries          `_carry` (FDFO: an unfinished block kept for the next round)
    completion rest  the rest of `_complete` (reading tokens back, splitting rows)
    round rest       the rest of `run_round` (its loop, ControlReturned)

A rest, taken by subtraction, also holds the timers' own cost of the calls timed inside it
(about half a microsecond each, warm). On CUDA each timed call is bracketed by device
synchronisations, so the device work a phase launches counts in that phase rather than in the
one that next reads a result back; the synchronisations add their own cost to every phase, so
a CUDA profile is a breakdown, not the benchmark's round time. The step is timed by the engine
itself, without them: its device work counts in "batch + events".

Every mode runs `--repeats` times in rotation (sync, fdfo, ..., sync, fdfo, ...) after one
warm-up; per phase the median over the repeats of milliseconds per round and per forward is
reported. The modes run one after another, so absolute times carry the machine's drift; read
each mode's column as a breakdown, and compare modes by shares. A measurement, not a test: it
asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from gpu.bench import (
    MODES,
    ROWS_RELEASED,
    BenchMode,
    Serving,
    run_once,
    serving,
    write_script_report,
)
from gpu.device_name import device_name
from gpu.engine import resolve_device, wait_for_device
from gpu.prompts import ASSETS
from gpu.weights import load_model
from schedspec_cli.output import output_file
from spec.errors import SchedSpecError

PHASES = (
    "row re-acquisition",
    "admission",
    "block starts",
    "KV + table",
    "plan",
    "forward",
    "step",
    "batch + events",
    "commits",
    "carries",
    "completion rest",
    "round rest",
)


ALL_MODES = (*MODES, ROWS_RELEASED)


class _Timers:
    """Seconds and calls per wrapped method of one engine; `sync` (the device's
    synchronisation, or nothing on the CPU) runs before each clock read."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.sync = sync

    def wrap(self, owner: Any, name: str) -> None:
        """Replace `owner.name` (a bound method) by a timed one, on this instance only."""
        inner: Callable[..., Any] = getattr(owner, name)
        self.seconds[name] = 0.0
        self.calls[name] = 0

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.sync()
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1

        setattr(owner, name, timed)


def profile_mode(setup: Serving, mode: BenchMode, max_running: int) -> dict[str, Any]:
    """Serve the workload once in `mode`; seconds per phase (see the module docstring)."""
    engine = setup.engine(mode, max_running)
    timers = _Timers(lambda: wait_for_device(setup.device))
    for name in (
        "run_round", "_reacquire_rows", "_admit", "_prepare_batch", "_start_blocks",
        "_run_worker", "_plan_batch", "_complete", "_commit", "_carry",
    ):  # fmt: skip
        timers.wrap(engine, name)
    timers.wrap(engine.runner, "forward")
    engine.drain()
    s = timers.seconds
    step = engine.step_seconds
    phases = {
        "row re-acquisition": s["_reacquire_rows"],
        "admission": s["_admit"],
        "block starts": s["_start_blocks"],
        "KV + table": s["_prepare_batch"] - s["_start_blocks"],
        "plan": s["_plan_batch"],
        "forward": s["forward"],
        "step": step,
        "batch + events": s["_run_worker"] - s["_plan_batch"] - s["forward"] - step,
        "commits": s["_commit"],
        "carries": s["_carry"],
        "completion rest": s["_complete"] - s["_commit"] - s["_carry"],
        "round rest": s["run_round"]
        - s["_reacquire_rows"]
        - s["_admit"]
        - s["_prepare_batch"]
        - s["_run_worker"]
        - s["_complete"],
    }
    return {
        "rounds": engine.round_index,
        "forwards": engine.runner.forwards,
        "plans_built": engine.runner.plans_built,
        "commits": timers.calls["_commit"],
        "carries": timers.calls["_carry"],
        "seconds": s["run_round"],
        "phases": phases,
    }


def profile(
    max_running: int, mode_names: list[str], repeats: int, requests: int, device: torch.device
) -> dict[str, dict[str, Any]]:
    by_name = {m.name: m for m in ALL_MODES}
    model, _ = load_model(ASSETS, device)
    setup = serving(
        model, requests=requests, max_new_tokens=32, block_size=8, page_size=16,
        algorithm="LowConfidence", device=device,
    )  # fmt: skip
    run_once(replace(setup, requests=setup.requests[:4]), by_name["fdfo"], max_running)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in mode_names}
    for _ in range(repeats):
        for name in mode_names:
            runs[name].append(profile_mode(setup, by_name[name], max_running))
    result: dict[str, dict[str, Any]] = {}
    for name, mode_runs in runs.items():
        first = mode_runs[0]
        rounds, forwards = first["rounds"], first["forwards"]
        per_round = {
            p: 1000 * statistics.median(r["phases"][p] for r in mode_runs) / rounds for p in PHASES
        }
        result[name] = {
            "rounds": rounds,
            "forwards": forwards,
            "plans_built": first["plans_built"],
            "commits": first["commits"],
            "carries": first["carries"],
            "round_ms": 1000 * statistics.median(r["seconds"] for r in mode_runs) / rounds,
            "ms_per_round": {p: round(v, 4) for p, v in per_round.items()},
            "ms_per_forward": {p: round(v * rounds / forwards, 4) for p, v in per_round.items()},
        }
    return result


def _print(result: dict[str, dict[str, Any]], max_running: int, device_name: str) -> None:
    names = list(result)
    print(f"device: {device_name}; max running {max_running}; median ms per round / per forward")
    print(f"{'phase':<16}" + "".join(f"{n:>24}" for n in names))
    for phase in PHASES:
        cells = "".join(
            f"{result[n]['ms_per_round'][phase]:>12.3f}{result[n]['ms_per_forward'][phase]:>12.3f}"
            for n in names
        )
        print(f"{phase:<16}{cells}")
    print(f"{'round':<16}" + "".join(f"{result[n]['round_ms']:>12.3f}{'':>12}" for n in names))
    print(
        f"{'rounds/forwards':<16}"
        + "".join(f"{result[n]['rounds']:>12}{result[n]['forwards']:>12}" for n in names)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--max-running", type=int, default=16, help="seats (1..64)")
    parser.add_argument("--modes", default="sync,fdfo,fdfo+reuse", help="comma-separated modes")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (median)")
    parser.add_argument("--requests", type=int, default=128, help="requests served per run")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--json", type=output_file, default=None, help="write the results here")
    args = parser.parse_args(argv)
    valid = [m.name for m in ALL_MODES]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in valid]
    if not modes or unknown:
        print(
            f"error: unknown mode(s) {unknown or modes}; valid: {', '.join(valid)}", file=sys.stderr
        )
        return 2
    if not 1 <= args.max_running <= 64 or args.repeats < 1 or args.requests < 1 or args.threads < 1:
        print(
            "error: need 1 <= --max-running <= 64, --repeats >= 1, --requests >= 1, --threads >= 1",
            file=sys.stderr,
        )
        return 2
    try:
        device = resolve_device(args.device)
    except SchedSpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    result = profile(args.max_running, modes, args.repeats, args.requests, device)
    name = device_name(device)
    _print(result, args.max_running, name)
    if args.json is not None:
        write_script_report(
            args.json,
            "scripts/profile_round.py",
            argv,
            args.threads,
            {
                "max_running": args.max_running,
                "device_name": name,
                "repeats": args.repeats,
                "requests": args.requests,
                "results": result,
            },
            device=str(device),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
