"""Write the dLLM simulator's calibration table from the engine's measured rounds.

    .venv/bin/python scripts/calibrate_dllm.py --from-bench docs/engine-bench-cpu.json \
        --out docs/dllm-calibration-cpu.json
    .venv/bin/python scripts/calibrate_dllm.py --measure [--max-running 1 4 16] [--repeats 5] \
        [--device cpu] --out PATH

--measure runs the shipped engine through `gpu.bench.run_bench` (the public API behind
`schedspec bench engine`); --from-bench reads that command's --json output. Either way every
repeat's run is summed per (mode, max_running) into the table described in
`reference/sim/calibration.py`. Then `schedspec simulate dllm --calibration PATH` predicts the
FDFO/sync throughput ratios and prints them next to the measured ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from reference.sim.calibration import Calibration


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu.bench import run_bench

    report = run_bench(args.max_running, repeats=args.repeats, device=args.device, progress=True)
    bench = report.to_json()
    bench["runs"] = [dataclasses.asdict(r) for r in report.runs]
    cmd = (
        f"scripts/calibrate_dllm.py --measure --max-running "
        f"{' '.join(map(str, args.max_running))} --repeats {args.repeats} --device {args.device}"
    )
    return bench, cmd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-bench", help="a `schedspec bench engine --json` file")
    src.add_argument("--measure", action="store_true", help="run the engine benchmark now")
    ap.add_argument("--max-running", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.measure:
        bench, source = measure(args)
    else:
        bench = json.loads(Path(args.from_bench).read_text())
        source = str(bench.get("command", args.from_bench))
    cal = Calibration.from_bench(bench, source)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cal.to_json(), indent=1) + "\n")
    print(f"{'mode':>18} {'seats':>5} {'s/forward':>10} {'rows/fwd':>8} {'s/round':>9}")
    for r in cal.rows:
        print(
            f"{r.mode:>18} {r.max_running:>5} {r.seconds_per_forward:>10.5f} "
            f"{r.rows_per_forward:>8.2f} {r.seconds_per_round:>9.5f}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
