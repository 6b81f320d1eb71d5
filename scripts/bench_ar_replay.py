"""Benchmark: AR replay and AR trace checking against the number of requests.

Replays a synthetic Vidur-style trace (seeded: arrivals at a fixed rate, prompt and decode
lengths drawn from small ranges) through an AR reference scheduler with every event checked by
the AR spec (`properties.ar.formats.replay_trace`), writes the run's events as an AR trace, and
checks that trace with `check_ar_trace` (streaming). Prints a table and writes JSON.

    .venv/bin/python scripts/bench_ar_replay.py --sizes 500,1000,2000 --json ar-replay.json

Growth should be linear: seconds per request stays flat as the size doubles.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from properties.ar.formats import replay_trace
from properties.ar.harness import ArHarness
from properties.ar.trace_check import check_ar_trace
from reference.ar.vidur import make_vidur_vllm
from reference.ar.vllm_v1 import make_vllm_v1
from schedspec_cli.output import output_file, write_json
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig, ArRequest
from spec.ar.trace import write_ar_trace

SCHEDULERS: dict[str, ArImplementationFactory] = {
    "vidur-vllm": make_vidur_vllm,
    "vllm-v1": make_vllm_v1,
}

CONFIG = ArConfig(
    block_size=16,
    num_blocks=513,
    max_num_batched_tokens=2048,
    max_num_seqs=32,
    max_model_len=1024,
    enable_chunked_prefill=False,
)


def requests(n: int, interval: float, seed: int = 0) -> list[ArRequest]:
    rng = random.Random(seed)
    return [
        ArRequest(f"r{i}", rng.randint(16, 512), rng.randint(1, 128), arrival_time=i * interval)
        for i in range(n)
    ]


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers >= 1") from None
    if not values or any(v < 1 or v > 1_000_000 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: integers in [1, 1000000]")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes", type=_positive_ints, default=[500, 1000, 2000], help="request counts"
    )
    ap.add_argument(
        "--scheduler", choices=sorted(SCHEDULERS), default="vidur-vllm", help="AR scheduler"
    )
    ap.add_argument(
        "--interval",
        type=float,
        default=4.0,
        help="seconds between arrivals (a step takes 1 s; at 2 s and below the queue grows with "
        "the run, and the implementation's per-step snapshot of its queue with it)",
    )
    ap.add_argument("--json", type=output_file, default=None, help="write the results here")
    args = ap.parse_args(argv)
    if not 0.0 < args.interval < 1e6:
        print(
            f"error: --interval {args.interval}: a number of seconds in (0, 1e6)", file=sys.stderr
        )
        return 2
    factory = SCHEDULERS[args.scheduler]
    rows = []
    print(f"AR replay, {args.scheduler}, arrivals every {args.interval} s, config {CONFIG}")
    print("(CPU seconds of this process: wall time on a shared machine is noise)")
    print(
        f"{'requests':>9} {'replay s':>9} {'ms/req':>7} {'events':>9} {'check s':>8} "
        f"{'events/s':>9}"
    )
    for n in args.sizes:
        reqs = requests(n, args.interval)
        t0 = time.process_time()
        metrics = replay_trace(factory, CONFIG, reqs)
        replay_s = time.process_time() - t0
        assert len(metrics) == n, f"only {len(metrics)} of {n} requests finished"
        # the same run recorded as an AR trace, then checked from the file (streaming)
        h = ArHarness(factory, CONFIG, check_invariants=False)
        for r in reqs:
            h.submit(r)
        h.drain(1000 * n + 1000)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.jsonl"
            with path.open("w", encoding="utf-8") as out:
                write_ar_trace(h.events, out, CONFIG)
            t0 = time.process_time()
            result = check_ar_trace(path)
            check_s = time.process_time() - t0
        assert result.ok and result.idle_at_end, result.violation
        row = {
            "requests": n,
            "replay_s": round(replay_s, 3),
            "ms_per_request": round(1000 * replay_s / n, 3),
            "trace_events": result.events,
            "check_s": round(check_s, 3),
            "events_per_s": round(result.events / check_s),
        }
        rows.append(row)
        print(
            f"{n:>9} {replay_s:>9.2f} {row['ms_per_request']:>7.2f} {result.events:>9} "
            f"{check_s:>8.2f} {row['events_per_s']:>9}"
        )
    if args.json is not None:
        write_json(
            args.json,
            {
                "command": "scripts/bench_ar_replay.py " + " ".join(argv or sys.argv[1:]),
                "scheduler": args.scheduler,
                "interval_s": args.interval,
                "timing": "CPU seconds (time.process_time)",
                "host": platform.node(),
                "python": platform.python_version(),
                "rows": rows,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
