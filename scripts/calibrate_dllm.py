"""Write the dLLM simulator's calibration table from the engine's measured rounds.

    .venv/bin/python scripts/calibrate_dllm.py --measure [--max-running 1 4 16] [--repeats 5] \
        [--threads 1] [--device cpu] [--bench-json PATH] --out docs/dllm-calibration-cpu.json
    .venv/bin/python scripts/calibrate_dllm.py --from-bench BENCH.json [MORE.json ...] --out PATH

--measure runs the shipped engine through `gpu.bench.run_bench` (the public API behind
`schedspec bench engine`; --bench-json keeps its JSON); --from-bench reads that command's --json
output (several files of the same workload pool their repeats; each must record row_rounds and
block_allocations per run, else the script names the file, says to re-run the benchmark and
exits with 2). Either way every repeat's run is summed per (mode, max_running) into the table
described in `reference/sim/calibration.py`, and the benchmark's prompts are then served once
more by the engine (FDFO with reuse at the largest max_running, untimed, its events recorded) to
measure each prompt's profile: how many forwards each output block took until done, and how many
blocks and tokens the request had. The profile run's row-forwards are checked against the
benchmark's (the engine's forwards are batch-invariant, so they must agree). The script prints
each row's measured costs and the shared time model fitted to them. Then `schedspec simulate
dllm --calibration PATH` predicts the FDFO/sync throughput ratios and prints them next to the
measured ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from reference.sim.calibration import Calibration, CalibrationError, read_json
from reference.sim.dllm_profile import RequestProfile
from schedspec_cli.output import output_file


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu.bench import run_bench

    report = run_bench(args.max_running, repeats=args.repeats, device=args.device, progress=True)
    bench = report.to_json()
    bench["runs"] = [dataclasses.asdict(r) for r in report.runs]
    cmd = (
        f"scripts/calibrate_dllm.py --measure --max-running "
        f"{' '.join(map(str, args.max_running))} --repeats {args.repeats} "
        f"--threads {args.threads} --device {args.device}"
    )
    bench["command"] = cmd
    if args.bench_json:
        Path(args.bench_json).write_text(json.dumps(bench, indent=2) + "\n")
    return bench, cmd


def profile(settings: dict[str, Any], max_running: int, device: str) -> list[RequestProfile]:
    """Serve the benchmark's prompt set once (FDFO + reuse, the benchmark's configuration) and
    read each request's per-block forwards from its StepResult events."""
    from gpu.algorithms import make_algorithm
    from gpu.bench import MODES, bench_config
    from gpu.engine import DllmEngine, resolve_device
    from gpu.prompts import ASSETS, load_prompts
    from gpu.tokenizer import TOKENIZER
    from gpu.weights import load_model
    from spec.config import RequestSpec
    from spec.events import Event, StepResult

    b, new = int(settings["block_size"]), int(settings["max_new_tokens"])
    texts = load_prompts()
    n = min(len(texts), int(settings["requests"]))
    reqs = [RequestSpec(f"q{i:04d}", tuple(TOKENIZER.encode(texts[i])), new) for i in range(n)]
    # the benchmark sizes max_context by the longest of its (cycled) requests
    longest = max(len(TOKENIZER.encode(t)) for t in texts[: int(settings["requests"])]) + new
    max_context = -(-longest // b) * b
    dev = resolve_device(device)
    model, _ = load_model(ASSETS, dev)
    mode = next(m for m in MODES if m.name == "fdfo+reuse")
    config = bench_config(mode, max_running, b, int(settings["page_size"]), max_context)
    events: list[Event] = []
    engine = DllmEngine(
        config,
        events.append,
        model=model,
        algorithm=make_algorithm(str(settings["algorithm"])),
        device=dev,
        record=False,
    )
    for r in reqs:
        engine.submit(r)
    engine.drain()
    steps: dict[tuple[str, int], int] = {}
    done: set[tuple[str, int]] = set()
    for e in events:
        if isinstance(e, StepResult) and (e.request_id, e.block_index) not in done:
            key = (e.request_id, e.block_index)
            steps[key] = steps.get(key, 0) + 1
            if e.accept_length:
                done.add(key)
    out = []
    for r in reqs:
        first = len(r.prompt) // b  # the prompt-only blocks take one forward each
        blocks = sorted(k for rid, k in steps if rid == r.request_id and k >= first)
        out.append(
            RequestProfile(
                len(r.prompt),
                tuple(steps[(r.request_id, k)] for k in blocks),
                len(engine.outputs[r.request_id]),
            )
        )
    return out


def check_profiles(cal: Calibration) -> None:
    """The profiles, cycled over the benchmark's requests, must do the measured FDFO work."""
    b = cal.block_size
    replayed = sum(
        p.prompt_len // b + sum(p.forwards)
        for p in (cal.profiles[i % len(cal.profiles)] for i in range(cal.requests))
    )
    for row in cal.of("fdfo"):
        measured = row.row_forwards / cal.repeats
        print(
            f"fdfo x{row.max_running}: profiles replay {replayed} row-forwards, measured {measured}"
        )
        if abs(measured - replayed) > 0.01 * measured:
            sys.exit("the profile run's forwards differ from the benchmark's: not batch-invariant")


def read_benches(files: list[str]) -> list[dict[str, Any]]:
    """The --from-bench files, each checked to make a table alone (`Calibration.from_benches`:
    the counts the table needs, in range), naming the file that cannot."""
    benches = []
    for f in files:
        bench = read_json(f)
        Calibration.from_benches([bench], f)
        benches.append(bench)
    return benches


def print_table(cal: Calibration) -> None:
    print(
        f"{'mode':>18} {'seats':>5} {'s/forward':>10} {'rows/fwd':>8} {'s/round':>9} "
        f"{'rows/rnd':>8} {'allocs':>7}"
    )
    for r in cal.rows:
        print(
            f"{r.mode:>18} {r.max_running:>5} {r.seconds_per_forward:>10.5f} "
            f"{r.rows_per_forward:>8.2f} {r.seconds_per_round:>9.5f} "
            f"{r.row_rounds / r.rounds:>8.2f} {r.block_allocations // cal.repeats:>7}"
        )
    try:
        t = cal.shared_time()
    except CalibrationError as err:  # the table stays usable with --time-model per-mode
        print(f"no shared time model: {err}")
        return
    print(
        f"shared time model: {1000 * t.per_forward:.4f} ms/forward, {1000 * t.per_row:.4f} "
        f"ms/row, {1000 * t.per_round:.4f} ms/round, {1000 * t.per_row_round:.4f} ms/row-round, "
        f"{1000 * t.per_alloc:.4f} ms/allocation"
    )
    for r in cal.rows:
        off = 100 * (t.seconds(r) / r.seconds - 1)
        print(f"{r.mode:>18} {r.max_running:>5} fit error {off:+.1f}%")


def main() -> None:
    try:
        run(parse_args())
    except CalibrationError as err:
        print(f"calibrate_dllm: {err}", file=sys.stderr)
        sys.exit(2)  # an input error (1 is for a mismatch)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-bench", nargs="+", help="`schedspec bench engine --json` files")
    src.add_argument("--measure", action="store_true", help="run the engine benchmark now")
    ap.add_argument("--max-running", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--bench-json",
        type=output_file,
        help="with --measure: also write the benchmark's JSON here",
    )
    ap.add_argument("--out", type=output_file, required=True)
    return ap.parse_args()


def set_threads(threads: int) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> None:
    if args.measure:
        set_threads(args.threads)
        bench, source = measure(args)
        benches = [bench]
    else:
        benches = read_benches(args.from_bench)  # checked before torch is imported
        set_threads(args.threads)
        source = " + ".join(
            str(b.get("command", f)) for b, f in zip(benches, args.from_bench, strict=True)
        )
    seats = sorted({int(r["max_running"]) for b in benches for r in b["runs"]})
    profiles = profile(benches[0]["settings"], max(seats), args.device)
    cal = Calibration.from_benches(benches, source, tuple(profiles))
    check_profiles(cal)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cal.to_json(), indent=1) + "\n")
    print_table(cal)
    print(f"wrote {out} ({len(profiles)} prompt profiles)")


if __name__ == "__main__":
    main()
