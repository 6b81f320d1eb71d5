"""Held-out counting accuracy of a model: the metric the shipped weights are tested on.

For each held-out counting prompt (`corpus.counting_cases`: starts never seen in training,
e.g. `count: 37 38 39`) the model generates a continuation; the score is the fraction of the
expected next numbers (`40 41 42 43`) that appear exactly, in order, as the first generated
numbers. A number counts only when its whole text is right.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu.algorithms import ALGORITHMS, DllmAlgorithm, make_algorithm
from gpu.corpus import CountingCase, counting_cases
from gpu.generate import generate
from gpu.model import BlockDiffusionLM
from gpu.weights import DEFAULT_ASSETS, load_model


@dataclass(frozen=True, slots=True)
class Accuracy:
    """`correct` of `total` expected numbers generated exactly."""

    correct: int
    total: int

    @property
    def fraction(self) -> float:
        """`correct / total` (0.0 when `total` is 0)."""
        return self.correct / self.total if self.total else 0.0


def score_continuation(text: str, expected: Sequence[int]) -> int:
    """How many of `expected` appear exactly at their place among the first words of `text`."""
    words = text.split()
    return sum(1 for i, n in enumerate(expected) if i < len(words) and words[i] == str(n))


def counting_accuracy(
    model: BlockDiffusionLM,
    cases: Sequence[CountingCase],
    block_size: int,
    algorithm: DllmAlgorithm,
) -> Accuracy:
    """Per case, 32 new tokens `generate`d after the prompt, scored by `score_continuation`
    against the case's expected numbers; summed over `cases`."""
    correct = total = 0
    for case in cases:
        out = generate(model, case.prompt, block_size, algorithm, max_new_tokens=32)
        correct += score_continuation(out.text, case.expected)
        total += len(case.expected)
    return Accuracy(correct, total)


LONG_NEW_TOKENS = 128  # the release gate's new tokens per case


def long_counting_accuracy(
    model: BlockDiffusionLM,
    cases: Sequence[CountingCase],
    block_size: int,
    algorithm: DllmAlgorithm,
    new_tokens: int = LONG_NEW_TOKENS,
) -> Accuracy:
    """Held-out counting continued for `new_tokens` tokens: per case, the expected numbers that
    fit in `new_tokens` characters (one space before each) and how many appear exactly, in
    order. Exercises every position of a 128-token continuation, as the release gate does."""
    correct = total = 0
    for case in cases:
        first = case.expected[0]
        expected: list[int] = []
        used = 0
        while used + len(f" {first + len(expected)}") <= new_tokens:
            used += len(f" {first + len(expected)}")
            expected.append(first + len(expected))
        out = generate(model, case.prompt, block_size, algorithm, max_new_tokens=new_tokens)
        correct += score_continuation(out.text, expected)
        total += len(expected)
    return Accuracy(correct, total)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpu.evaluate`: held-out counting accuracy of the shipped model per block size
    and algorithm."""
    parser = argparse.ArgumentParser(prog="python -m gpu.evaluate", description=__doc__)
    parser.add_argument("--assets", type=Path, default=DEFAULT_ASSETS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--long", action="store_true", help=f"also score {LONG_NEW_TOKENS}-token continuations"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, _ = load_model(args.assets)
    cases = counting_cases(args.seed)
    print(f"held-out counting accuracy ({len(cases)} prompts x 4 next numbers)")
    for block_size in (4, 8, 16):
        for name in ALGORITHMS:
            acc = counting_accuracy(model, cases, block_size, make_algorithm(name))
            score = f"{acc.correct}/{acc.total} = {acc.fraction:.3f}"
            print(f"  block {block_size:2d}  {name:15s} {score}")
    if args.long:
        print(
            f"held-out counting continued for {LONG_NEW_TOKENS} new tokens ({len(cases)} prompts)"
        )
        for block_size in (4, 8, 16, 32):
            for name in ALGORITHMS:
                acc = long_counting_accuracy(model, cases, block_size, make_algorithm(name))
                score = f"{acc.correct}/{acc.total} = {acc.fraction:.3f}"
                print(f"  block {block_size:2d}  {name:15s} {score}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
