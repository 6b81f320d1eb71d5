"""Can an FDFO round's bookkeeping run beside the forward on a second CPU core?

    .venv/bin/python scripts/probe_overlap.py [--rows 16] [--samples 200] [--threads 1] \
        [--json out/overlap.json]

Why: GPU engines hide their scheduler behind the device (SGLang's overlap scheduler, vLLM's
async scheduling): the host plans batch N+1 while batch N runs. On the CPU with one torch
thread the forward itself runs on the host, so the only place to hide bookkeeping is another
core, i.e. another Python thread, which needs the interpreter lock whenever it runs Python.
This probe measures, on the shipped model, whether that buys anything:

- `forward`: one forward of `--rows` blocks of 8 at mixed context lengths (0 to 152 tokens
  before the block, spread over the rows), each row on contiguous slots;
- `bookkeeping`: a stand-in for a round's scheduler work, made of the engine's own pieces: the
  batch plan (`plan_blocks`) and, per row, the frozen events a round emits (`ForwardRow`,
  `StepResult`, `BlockCommitted`) into a list, all repeated `--bookkeeping-repeats` times;
- `serial`: the forward, then the bookkeeping, on one thread (what the engine does);
- `overlapped`: the bookkeeping handed to a waiting worker thread just before the forward and
  joined after it, at the interpreter's default switch interval (5 ms) and at 0.1 ms;
- `forward beside Python`: a forward while another thread runs a Python loop without pause
  (why the overlap does not pay: each torch call the forward makes must win the lock back).

Prints a table (median milliseconds) with the overlapped/serial ratio (below 1: overlap hides
bookkeeping) and writes JSON. A measurement, not a test: it asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch

from gpu.bench import write_script_report
from schedspec_cli.output import output_file
from spec.events import BlockCommitted, ForwardRow, StepResult

BLOCK = 8
SWITCH_INTERVALS_S = (0.005, 0.0001)  # CPython's default, and one 50 times as short
SPIN_SAMPLES = 5  # a forward beside a spinning thread takes of the order of a second
OVERLAPPED = tuple(f"overlapped@{s * 1e3:g}ms" for s in SWITCH_INTERVALS_S)


class _Worker:
    """A thread that runs `job` each time it is released; `join` waits for that run."""

    def __init__(self, job: Callable[[], object]) -> None:
        self._job = job
        self._go = threading.Event()
        self._done = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._stop:
                return
            self._job()
            self._done.set()

    def release(self) -> None:
        self._go.set()

    def join(self) -> None:
        self._done.wait()
        self._done.clear()

    def close(self) -> None:
        self._stop = True
        self._go.set()
        self._thread.join()


def _median_ms(call: Callable[[], object], samples: int) -> float:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _forward_beside_python(forward: Callable[[], object], samples: int) -> float:
    """Median milliseconds of a forward while another thread runs Python without pause."""
    stop = threading.Event()
    started = threading.Event()

    def spin() -> None:
        started.set()
        n = 0
        while not stop.is_set():
            n += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    started.wait()
    try:
        return _median_ms(forward, samples)
    finally:
        stop.set()
        thread.join()


def probe(rows: int, samples: int, bookkeeping_repeats: int, seed: int = 0) -> dict[str, float]:
    from gpu.engine import _shipped_model
    from gpu.kv_cache import PagedKvCache

    model = _shipped_model("cpu")
    cfg = model.config
    starts = [BLOCK * ((7 * i) % 20) for i in range(rows)]
    row_ids = list(range(rows))
    table = torch.arange(rows * cfg.max_context, dtype=torch.int32).view(rows, cfg.max_context)
    kv = PagedKvCache(cfg.n_layers, cfg.n_heads, cfg.head_dim, rows * cfg.max_context)
    tokens = torch.randint(
        0, cfg.vocab_size, (rows, BLOCK), generator=torch.Generator().manual_seed(seed)
    )
    plan = model.plan_blocks(starts, row_ids, BLOCK, table)
    committed = tuple(range(BLOCK))

    def forward() -> None:
        with torch.inference_mode():
            model.forward_blocks(tokens, starts, row_ids, kv, table, plan)

    def bookkeeping() -> None:
        events: list[object] = []
        for _ in range(bookkeeping_repeats):
            model.plan_blocks(starts, row_ids, BLOCK, table)
            events.append(tuple(ForwardRow(f"r{i}", 3, True, BLOCK, 2) for i in range(rows)))
            events.extend(StepResult(f"r{i}", 3, BLOCK, 0) for i in range(rows))
            events.extend(BlockCommitted(f"r{i}", 3, committed) for i in range(rows))

    for _ in range(10):  # warm-up: first calls pay one-off allocation
        forward()
        bookkeeping()
    worker = _Worker(bookkeeping)
    default_interval = sys.getswitchinterval()

    def serial() -> None:
        forward()
        bookkeeping()

    def overlapped() -> None:
        worker.release()
        forward()
        worker.join()

    # every sample times each variant once, in turn, so a drift of the machine's speed
    # reaches all of them alike; ratios are paired per sample
    variants: dict[str, tuple[Callable[[], None], float]] = {
        "forward": (forward, default_interval),
        "bookkeeping": (bookkeeping, default_interval),
        "serial": (serial, default_interval),
    }
    for name, interval in zip(OVERLAPPED, SWITCH_INTERVALS_S, strict=True):
        variants[name] = (overlapped, interval)
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for _ in range(samples):
            for name, (call, interval) in variants.items():
                sys.setswitchinterval(interval)
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
    finally:
        sys.setswitchinterval(default_interval)
        worker.close()
    result = {f"{name}_ms": statistics.median(ts) * 1e3 for name, ts in times.items()}
    for name in variants:
        if name in OVERLAPPED:
            result[f"{name}_over_serial"] = statistics.median(
                o / s for o, s in zip(times[name], times["serial"], strict=True)
            )
    result["forward_beside_python_ms"] = _forward_beside_python(forward, min(samples, SPIN_SAMPLES))
    return {k: round(v, 4) for k, v in result.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=16, help="blocks in the batch (1..64)")
    parser.add_argument("--samples", type=int, default=200, help="timed calls per measurement")
    parser.add_argument(
        "--bookkeeping-repeats",
        type=int,
        default=3,
        help="the stand-in's pieces run this many times (3: about 0.4 ms, what an FDFO round's "
        "scheduler costs at 16 rows; scripts/profile_round.py)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", type=output_file, default=None, help="write the results here")
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= 64 or min(args.samples, args.bookkeeping_repeats, args.threads) < 1:
        print(
            "error: need 1 <= --rows <= 64, --samples >= 1, --bookkeeping-repeats >= 1, "
            "--threads >= 1",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    result = probe(args.rows, args.samples, args.bookkeeping_repeats)
    print(
        f"device: cpu (torch {torch.__version__}, {args.threads} thread); "
        f"{args.rows} rows of {BLOCK}"
    )
    print(f"{'median of':<22} {'ms':>8} {'/ serial (paired)':>18}")
    for name in ("forward", "bookkeeping", "serial", *OVERLAPPED):
        ratio = result.get(f"{name}_over_serial")
        shown = "" if ratio is None else f"{ratio:>18.3f}"
        print(f"{name:<22} {result[f'{name}_ms']:>8.3f} {shown}")
    print(
        f"forward beside a thread running Python: {result['forward_beside_python_ms']:.1f} ms "
        f"({result['forward_beside_python_ms'] / result['forward_ms']:.0f} times alone)"
    )
    if args.json is not None:
        write_script_report(
            args.json,
            "scripts/probe_overlap.py",
            argv,
            args.threads,
            {
                "rows": args.rows,
                "block_size": BLOCK,
                "samples": args.samples,
                "bookkeeping_repeats": args.bookkeeping_repeats,
                "results": result,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
