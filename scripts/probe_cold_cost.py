"""What a scheduler call costs right after a forward, against the same call repeated warm.

    .venv/bin/python scripts/probe_cold_cost.py [--rows 16] [--samples 300] [--threads 1] \
        [--json out/cold-cost.json]

Why: an FDFO round is one forward, so every piece of its bookkeeping (planning, allocation,
commits) runs right after a forward, when the forward's weights and KV have pushed the
interpreter's and the scheduler's own data out of the CPU caches. This probe measures that
penalty on the shipped model, on CPU: a batch of `--rows` blocks of 8 at mixed context lengths
(a seeded draw of contexts up to 167 tokens) is forwarded, then each probed call runs
once timed ("after a forward") and then again until its 5th call in a row, which is timed
("warm"). Calls probed:

- `plan_blocks`: the batch layout the engine builds every round in which a block finished;
- `stack + unbind`: the batch's token rows stacked and split again, two dispatch-bound torch
  calls the engine makes per round (a stand-in for any small torch op).

Prints a table (median microseconds per call, and the ratio) and writes JSON. A measurement,
not a test: it asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable

import torch

from gpu.bench import write_script_report
from schedspec_cli.output import output_file

BLOCK = 8
WARM_REPEATS = 5  # the call timed warm is the 5th in a row after the forward


def _layout(rows: int, seed: int, width: int) -> tuple[list[int], list[int], torch.Tensor]:
    """Block starts (block multiples, up to 160 tokens of context before the block), rows
    0..rows-1, and a table giving each row contiguous slots (as the page rule does)."""
    rng = random.Random(seed)
    starts = [BLOCK * rng.randrange(0, 160 // BLOCK) for _ in range(rows)]
    table = torch.arange(rows * width, dtype=torch.int32).view(rows, width)
    return starts, list(range(rows)), table


def probe(rows: int, samples: int, seed: int = 0) -> dict[str, dict[str, float]]:
    from gpu.engine import _shipped_model
    from gpu.kv_cache import PagedKvCache

    model = _shipped_model("cpu")
    cfg = model.config
    starts, row_ids, table = _layout(rows, seed, cfg.max_context)
    kv = PagedKvCache(cfg.n_layers, cfg.n_heads, cfg.head_dim, rows * cfg.max_context)
    tokens = torch.randint(
        0, cfg.vocab_size, (rows, BLOCK), generator=torch.Generator().manual_seed(seed)
    )
    plan = model.plan_blocks(starts, row_ids, BLOCK, table)
    token_rows = list(tokens.unbind(0))

    def plan_call() -> None:
        model.plan_blocks(starts, row_ids, BLOCK, table)

    def stack_unbind() -> None:
        torch.stack(token_rows).unbind(0)

    calls: dict[str, Callable[[], None]] = {
        "plan_blocks": plan_call,
        "stack + unbind": stack_unbind,
    }
    after: dict[str, list[float]] = {name: [] for name in calls}
    warm: dict[str, list[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        for i in range(samples):
            for name, call in calls.items():
                model.forward_blocks(tokens, starts, row_ids, kv, table, plan)
                t0 = time.perf_counter()
                call()
                t1 = time.perf_counter()
                for _ in range(WARM_REPEATS - 1):
                    call()
                t2 = time.perf_counter()
                call()
                t3 = time.perf_counter()
                if i:  # the first sample also pays one-off warm-up
                    after[name].append(t1 - t0)
                    warm[name].append(t3 - t2)
    result: dict[str, dict[str, float]] = {}
    for name in calls:
        a = statistics.median(after[name]) * 1e6
        w = statistics.median(warm[name]) * 1e6
        result[name] = {
            "after_forward_us": round(a, 1),
            "warm_us": round(w, 1),
            "ratio": round(a / w, 2),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=16, help="blocks in the batch (1..64)")
    parser.add_argument("--samples", type=int, default=300, help="forwards per probed call")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", type=output_file, default=None, help="write the results here")
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= 64 or args.samples < 2 or args.threads < 1:
        print("error: need 1 <= --rows <= 64, --samples >= 2, --threads >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    result = probe(args.rows, args.samples)
    print(
        f"device: cpu (torch {torch.__version__}, {args.threads} thread); "
        f"{args.rows} rows of {BLOCK}"
    )
    print(f"{'call':<16} {'warm us':>9} {'after a forward us':>19} {'ratio':>6}")
    for name, r in result.items():
        print(f"{name:<16} {r['warm_us']:>9.1f} {r['after_forward_us']:>19.1f} {r['ratio']:>6.2f}")
    if args.json is not None:
        write_script_report(
            args.json,
            "scripts/probe_cold_cost.py",
            argv,
            args.threads,
            {
                "rows": args.rows,
                "block_size": BLOCK,
                "samples": args.samples - 1,
                "results": result,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
