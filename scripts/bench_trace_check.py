"""Benchmark: check-trace throughput against log size (events/s should stay flat: linear time).

Writes reference-scheduler logs of growing size (JSON Lines with a config header, as
`schedspec check-trace` reads them), checks each with `properties.trace_check.check_trace`
(streaming, incremental invariants) and prints a table of requests, events, wall and CPU seconds
and events per CPU second (the CPU figure is what a loaded, shared machine cannot distort); the
same figures go to a JSON file. Peak memory of each check is measured with tracemalloc in a
separate pass (tracing slows Python down, so it is not timed). The last two columns time the
whole command a user runs, `schedspec check-trace LOG` and `schedspec check-trace - < LOG`, in a
fresh interpreter (start-up, reading and the verdict included). With `--repeats N` each log is
checked N times and the fastest check counts (on a shared machine other jobs only ever slow a
run down). With `--twin NAME` two more columns time `schedspec check-trace LOG --twin NAME`
(the log is held in memory and replayed through the twin after the check) and its ratio to
the plain command on the same log.

    .venv/bin/python scripts/bench_trace_check.py --json docs/trace-check-bench.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from properties.trace_check import check_trace
from reference.dllm import ReferenceDllmScheduler
from schedspec_cli.output import output_file, write_json
from spec.config import DllmConfig, Mode, RequestSpec
from spec.events import Event
from spec.trace import config_to_dict, event_to_dict

CONFIG = DllmConfig(
    block_size=4,
    page_size=8,
    kv_pages=256,
    req_pool_rows=16,
    max_running_requests=16,
    max_context=64,
    mode=Mode.FDFO,
    in_place_reuse=True,
    eos_token_id=15,
)


def write_log(path: Path, requests: int, seed: int = 0) -> int:
    """A reference run of `requests` requests (one arrival per round, ~10% aborted) as a trace;
    returns the number of events."""
    rng = random.Random(seed)
    events = 0
    with path.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(config_to_dict(CONFIG)) + "\n")

        def sink(e: Event) -> None:
            nonlocal events
            events += 1
            fh.write(json.dumps(event_to_dict(e), separators=(",", ":")) + "\n")

        sched = ReferenceDllmScheduler(CONFIG, sink, id_memory=1000)
        live: list[str] = []
        for i in range(requests):
            prompt = tuple(rng.randint(0, 14) for _ in range(rng.randint(1, 24)))
            rid = f"r{i}"
            sched.submit(RequestSpec(rid, prompt, rng.randint(1, 24)))
            live.append(rid)
            if rng.random() < 0.1:
                victim = live.pop(rng.randrange(len(live)))
                if victim in {r.rid for r in sched.waiting} | {r.rid for r in sched.running}:
                    sched.abort(victim)
            sched.run_round()
            sched.collect_outputs()
            if len(live) > 64:
                live = live[-64:]
        sched.drain()
    return events


def cli_seconds(path: Path, from_stdin: bool, *flags: str) -> float:
    """Wall seconds of one `schedspec check-trace` run on `path` (as a file, or piped to `-`),
    with `flags`; raises if the command does not pass."""
    cmd = [sys.executable, "-m", "schedspec_cli.main", "check-trace"]
    start = time.perf_counter()
    if from_stdin:
        with path.open("rb") as fh:
            res = subprocess.run([*cmd, "-", *flags], stdin=fh, capture_output=True, check=False)
    else:
        res = subprocess.run([*cmd, str(path), *flags], capture_output=True, check=False)
    seconds = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"check-trace exited {res.returncode}: {res.stderr.decode().strip()}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        default="250,500,1000,2000,4000,8000",
        help="comma-separated request counts (default %(default)s)",
    )
    ap.add_argument(
        "--json",
        type=output_file,
        default="trace-check-bench.json",
        help="where to write the figures",
    )
    ap.add_argument(
        "--repeats", type=int, default=1, help="checks per log; the fastest counts (default 1)"
    )
    ap.add_argument(
        "--twin",
        metavar="NAME",
        help="also time the command with --twin NAME (e.g. reference-dllm), and its ratio",
    )
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        print(f"--sizes: comma-separated integers, got {args.sizes!r}", file=sys.stderr)
        return 2
    if any(n < 1 for n in sizes):
        print("--sizes: every count must be >= 1", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print(f"--repeats: a count >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    out: Path = args.json
    rows = []
    print(
        f"{'requests':>9} {'events':>9} {'wall s':>8} {'cpu s':>7} {'events/cpu-s':>13} "
        f"{'peak MiB':>9} {'cli file s':>11} {'cli stdin s':>12}"
        + (f" {'cli twin s':>11} {'twin/plain':>11}" if args.twin else "")
    )
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"trace-{n}.jsonl"
            events = write_log(path, n)
            seconds = cpu = float("inf")
            for _ in range(args.repeats):
                start, cpu_start = time.perf_counter(), time.process_time()
                res = check_trace(path)
                seconds = min(seconds, time.perf_counter() - start)
                cpu = min(cpu, time.process_time() - cpu_start)
            if not res.ok:
                print(
                    f"unexpected violation in the reference log: {res.violation}", file=sys.stderr
                )
                return 1
            tracemalloc.start()
            check_trace(path)
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            cli_file = min(cli_seconds(path, False) for _ in range(args.repeats))
            cli_stdin = min(cli_seconds(path, True) for _ in range(args.repeats))
            twin: dict[str, float] = {}
            if args.twin:
                flags = ("--twin", args.twin)
                with_twin = min(cli_seconds(path, False, *flags) for _ in range(args.repeats))
                twin = {
                    "cli_twin_wall_seconds": round(with_twin, 3),
                    "twin_over_plain": round(with_twin / cli_file, 2),
                }
            rate = events / max(cpu, 1e-9)
            rows.append(
                {
                    "requests": n,
                    "events": events,
                    "wall_seconds": round(seconds, 3),
                    "cpu_seconds": round(cpu, 3),
                    "events_per_cpu_second": round(rate),
                    "peak_mib": round(peak, 1),
                    "cli_file_wall_seconds": round(cli_file, 3),
                    "cli_stdin_wall_seconds": round(cli_stdin, 3),
                    **twin,
                }
            )
            print(
                f"{n:>9} {events:>9} {seconds:>8.2f} {cpu:>7.2f} {rate:>13.0f} {peak:>9.1f} "
                f"{cli_file:>11.2f} {cli_stdin:>12.2f}"
                + (
                    f" {twin['cli_twin_wall_seconds']:>11.2f} {twin['twin_over_plain']:>11.2f}"
                    if twin
                    else ""
                )
            )
    write_json(
        out,
        {
            "command": "python scripts/bench_trace_check.py " + " ".join(argv or sys.argv[1:]),
            "python": platform.python_version(),
            "host": platform.node(),
            "repeats": args.repeats,
            "twin": args.twin,
            "config": config_to_dict(CONFIG),
            "rows": rows,
        },
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
