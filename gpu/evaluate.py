"""Held-out counting accuracy of a model: the metric the shipped weights are tested on.

For each held-out counting prompt (`corpus.counting_cases`: starts never seen in training,
e.g. `count: 37 38 39`) the model generates a continuation; the score is the fraction of the
expected next numbers (`40 41 42 43`) that appear exactly, in order, as the first generated
numbers. A number counts only when its whole text is right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpu.algorithms import DllmAlgorithm
from gpu.corpus import CountingCase
from gpu.generate import generate
from gpu.model import BlockDiffusionLM


@dataclass(frozen=True, slots=True)
class Accuracy:
    correct: int
    total: int

    @property
    def fraction(self) -> float:
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
    correct = total = 0
    for case in cases:
        out = generate(model, case.prompt, block_size, algorithm, max_new_tokens=32)
        correct += score_continuation(out.text, case.expected)
        total += len(case.expected)
    return Accuracy(correct, total)
