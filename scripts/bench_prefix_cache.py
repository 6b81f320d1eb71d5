"""The torch engine's prefix cache: throughput with and without it, on prompts that share a
stem and on prompts that do not.

    .venv/bin/python scripts/bench_prefix_cache.py [--max-running 4 16] [--requests 64]
        [--stem-blocks 12] [--max-new-tokens 32] [--block-size 8] [--repeats 3]
        [--threads 1] [--json FILE]

Two workloads of the shipped prompts, cycled to `--requests` requests and each made unique by
its number in front, all submitted at once: `shared`, each prompt after a common stem of
`--stem-blocks` whole blocks (the shipped prompts joined, a few-shot header as a server sees
it), and `distinct`, the prompts alone (nothing to hit: what the cache's bookkeeping costs).
Each is served by the shipped model (LowConfidence, FDFO with in-place reuse, page = block, a
pool twice every running request's worst case) with the cache off and on, one after the other
in every repeat, in alternating order (so the two share the machine's load); the table shows
the median over repeats of output tokens per second, and the ratio cache/none as the median of
the per-repeat ratios with its lowest and highest. Every repeat also checks that both serve
every request the same output, byte for byte, and counts the blocks read from the cache and the
row-forwards (model work) each one ran. Not a test: it prints and writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from gpu.algorithms import make_algorithm
from gpu.device_name import device_name
from gpu.engine import DllmEngine, _shipped_model
from gpu.host import cpu_model
from gpu.model import BlockDiffusionLM
from gpu.prompts import load_prompts
from gpu.tokenizer import EOS_ID, MASK_ID, TOKENIZER
from schedspec_cli.output import output_file, write_json
from spec.config import DllmConfig, Mode, RequestSpec
from spec.events import CacheHit, Event


def workloads(
    requests: int, stem_blocks: int, block_size: int, max_new_tokens: int
) -> dict[str, tuple[RequestSpec, ...]]:
    """`shared` (a stem of whole blocks, then each prompt) and `distinct` (the prompts alone)."""
    texts = load_prompts()
    joined: list[int] = []
    for text in texts:
        joined.extend(TOKENIZER.encode(text + "; "))
    stem = tuple(joined[: stem_blocks * block_size])
    if len(stem) < stem_blocks * block_size:
        raise SystemExit(f"--stem-blocks {stem_blocks}: the shipped prompts hold fewer tokens")
    # a number first makes every prompt unique (the shipped ones repeat past 32 requests)
    prompts = [tuple(TOKENIZER.encode(f"{i:03d} {texts[i % len(texts)]}")) for i in range(requests)]
    return {
        "shared": tuple(
            RequestSpec(f"s{i:04d}", stem + p, max_new_tokens) for i, p in enumerate(prompts)
        ),
        "distinct": tuple(
            RequestSpec(f"d{i:04d}", p, max_new_tokens) for i, p in enumerate(prompts)
        ),
    }


def config_for(
    reqs: tuple[RequestSpec, ...], block_size: int, max_running: int, cache: bool, limit: int
) -> DllmConfig:
    longest = max(len(r.prompt) + r.max_new_tokens for r in reqs)
    context = -(-longest // block_size) * block_size
    if context > limit:
        raise SystemExit(f"requests need a context of {context} tokens; the model has {limit}")
    per_request = context // block_size
    return DllmConfig(
        block_size=block_size,
        page_size=block_size,
        kv_pages=2 * max_running * per_request,  # room to keep what finished requests cached
        req_pool_rows=max_running,
        max_running_requests=max_running,
        max_context=context,
        mode=Mode.FDFO,
        in_place_reuse=True,
        mask_token_id=MASK_ID,
        eos_token_id=EOS_ID,
        prefix_cache=cache,
    )


def serve(
    model: BlockDiffusionLM, config: DllmConfig, reqs: tuple[RequestSpec, ...]
) -> dict[str, Any]:
    """Serve every request to drain; wall time, tokens, row-forwards, blocks hit, outputs."""
    seen: Counter[str] = Counter()

    def sink(e: Event) -> None:
        if isinstance(e, CacheHit):
            seen["hits"] += 1

    engine = DllmEngine(config, sink, model=model, algorithm=make_algorithm("LowConfidence"))
    for r in reqs:
        engine.submit(r)
    start = time.perf_counter()
    engine.drain()
    seconds = time.perf_counter() - start
    outputs = engine.take_outputs()
    tokens = sum(len(o) for o in outputs.values())
    return {
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "row_forwards": engine.rows_forwarded,
        "forwards": engine.runner.forwards,
        "cache_hits": seen["hits"],
        "outputs": outputs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench_prefix_cache.py")
    p.add_argument("--max-running", type=int, nargs="+", default=[4, 16])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--stem-blocks", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    p.add_argument(
        "--json", type=output_file, default=None, help="also write the figures to this file"
    )
    ns = p.parse_args(argv)
    for name in ("requests", "stem_blocks", "max_new_tokens", "block_size", "repeats"):
        if getattr(ns, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if min(ns.max_running) < 1:
        p.error("--max-running: every value must be >= 1")
    if ns.threads:
        torch.set_num_threads(ns.threads)
    model = _shipped_model("cpu")
    loads = workloads(ns.requests, ns.stem_blocks, ns.block_size, ns.max_new_tokens)
    rows: list[dict[str, Any]] = []
    print(
        f"{'workload':<9} {'running':>7} {'none tok/s':>10} {'cache tok/s':>11} "
        f"{'cache/none':>10} {'(range)':>13} {'rows none':>9} {'rows cache':>10} {'hits':>6}"
    )
    with torch.inference_mode():
        for name, reqs in loads.items():
            for running in ns.max_running:
                runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
                for repeat in range(ns.repeats):
                    # the order alternates, so neither mode always runs right after the other
                    for cache in (False, True) if repeat % 2 == 0 else (True, False):
                        config = config_for(
                            reqs, ns.block_size, running, cache, model.config.max_context
                        )
                        runs[cache].append(serve(model, config, reqs))
                    if runs[True][-1]["outputs"] != runs[False][-1]["outputs"]:
                        raise SystemExit(f"{name} at {running}: the cache changed an output")
                ratios = [
                    on["tokens_per_s"] / off["tokens_per_s"]
                    for on, off in zip(runs[True], runs[False], strict=True)
                ]
                row = {
                    "workload": name,
                    "max_running": running,
                    "none_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[False]),
                    "cache_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[True]),
                    "ratio": statistics.median(ratios),
                    "ratio_range": [min(ratios), max(ratios)],
                    "row_forwards_none": runs[False][0]["row_forwards"],
                    "row_forwards_cache": runs[True][0]["row_forwards"],
                    "cache_hits": runs[True][0]["cache_hits"],
                    "tokens": runs[True][0]["tokens"],
                }
                rows.append(row)
                lo, hi = row["ratio_range"]
                print(
                    f"{name:<9} {running:>7} {row['none_tokens_per_s']:>10.1f} "
                    f"{row['cache_tokens_per_s']:>11.1f} {row['ratio']:>10.3f} "
                    f"{f'{lo:.3f}-{hi:.3f}':>13} {row['row_forwards_none']:>9} "
                    f"{row['row_forwards_cache']:>10} {row['cache_hits']:>6}"
                )
    if ns.json:
        write_json(
            ns.json,
            {
                "device": device_name(torch.device("cpu")),
                "cpu": cpu_model(),
                "threads": torch.get_num_threads(),
                "args": {k: v for k, v in vars(ns).items() if k != "json"},
                "rows": rows,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
