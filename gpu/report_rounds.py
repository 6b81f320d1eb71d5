"""Rounds-per-block distribution of the shipped model: `python -m gpu.report_rounds --json PATH`.

Generates continuations of held-out prompts (all corpus kinds) at one block size with each
algorithm (batch size 1, sync mode) and histograms the forwards each output block took,
including the final forward on the complete block. Predictable text (counting, repeated words)
finishes a block in a few rounds; arithmetic facts, whose operands are random, need many.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu.algorithms import ALGORITHMS, make_algorithm
from gpu.corpus import make_samples
from gpu.generate import generate
from gpu.weights import DEFAULT_ASSETS, load_model


@dataclass(frozen=True, slots=True)
class RoundsReport:
    """One algorithm's forwards per output block: overall and by corpus kind."""

    histogram: Counter[int]  # forwards per block -> number of blocks
    by_kind: dict[str, list[int]]  # corpus kind -> forwards of each of its blocks


def rounds_report(
    assets: Path, block_size: int, n_prompts: int, seed: int, max_new_tokens: int
) -> dict[str, RoundsReport]:
    """Per registered algorithm (default parameters): the forwards each output block took
    when `generate` continues `n_prompts` held-out samples (`make_samples(seed, ...)`) at
    `block_size`, with the model loaded from `assets`."""
    model, _ = load_model(assets)
    samples = make_samples(seed, n_prompts, "heldout")
    out: dict[str, RoundsReport] = {}
    for name in ALGORITHMS:
        algorithm = make_algorithm(name)
        report = RoundsReport(Counter(), {})
        for sample in samples:
            result = generate(model, sample.prompt, block_size, algorithm, max_new_tokens)
            report.histogram.update(result.rounds_per_block)
            report.by_kind.setdefault(sample.kind, []).extend(result.rounds_per_block)
        out[name] = report
    return out


def render(reports: dict[str, RoundsReport], block_size: int) -> str:
    """The reports as text: per algorithm the block count and mean, a bar per round count
    (scaled to at most 60 characters) and the mean rounds by kind."""
    lines = [f"rounds per output block (block_size={block_size}, incl. the final forward)"]
    for name, report in reports.items():
        hist = report.histogram
        total = sum(hist.values())
        mean = sum(r * c for r, c in hist.items()) / max(1, total)
        lines.append(f"{name}: {total} blocks, mean {mean:.2f} rounds")
        scale = max(1.0, max(hist.values(), default=1) / 60)  # bars at most 60 wide
        for rounds in range(1, max(hist, default=1) + 1):
            count = hist.get(rounds, 0)
            lines.append(f"  {rounds:3d} | {count:4d} {'#' * round(count / scale)}")
        kinds = ", ".join(
            f"{kind} {sum(r) / len(r):.1f}" for kind, r in sorted(report.by_kind.items()) if r
        )
        lines.append(f"  mean rounds by kind: {kinds}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpu.report_rounds`: print `render`'s histograms; with `--json PATH` also
    write them (per algorithm the histogram, block count and mean rounds by kind). Returns 0."""
    parser = argparse.ArgumentParser(prog="python -m gpu.report_rounds", description=__doc__)
    parser.add_argument("--json", type=Path, default=None, help="write the histograms here")
    parser.add_argument("--assets", type=Path, default=DEFAULT_ASSETS)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    reports = rounds_report(
        args.assets, args.block_size, args.prompts, args.seed, args.max_new_tokens
    )
    print(render(reports, args.block_size))
    if args.json is not None:
        data = {
            "block_size": args.block_size,
            "prompts": args.prompts,
            "seed": args.seed,
            "max_new_tokens": args.max_new_tokens,
            "algorithm": {
                name: {
                    "histogram": {str(r): rep.histogram[r] for r in sorted(rep.histogram)},
                    "blocks": sum(rep.histogram.values()),
                    "mean_rounds_by_kind": {
                        kind: round(sum(r) / len(r), 3)
                        for kind, r in sorted(rep.by_kind.items())
                        if r
                    },
                }
                for name, rep in reports.items()
            },
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
