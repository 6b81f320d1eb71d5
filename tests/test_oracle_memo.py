"""The reference oracle's memo (`reference.oracle`): the built-in algorithms' rows are stepped one
at a time through a cache keyed by everything a row's step reads, and what comes back equals the
batch stepped at once, whatever the order and whichever rows were asked before; an algorithm of
another type gets its batch in one call; the logits are read-only."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from reference.algorithms import FloatArray, IntArray, JointState, LowConfidence
from reference.oracle import AlgorithmOracle, OracleRow, OracleStep, _batch_step, pseudo_logits

MASK = 16
BLOCK = 4


def _rows(rng: random.Random, oracle: AlgorithmOracle, n: int) -> list[OracleRow]:
    rows = []
    for i in range(n):
        context = tuple(rng.randrange(0, 16) for _ in range(rng.randint(1, 9)))
        tokens = tuple(MASK if rng.random() < 0.5 else rng.randrange(0, 16) for _ in range(BLOCK))
        state = oracle.init_state(tokens)
        if isinstance(state, JointState) and rng.random() < 0.5:  # a block some steps in
            state = JointState(rng.randint(0, 4), rng.random() < 0.3, state.prompt_mask)
        rows.append(OracleRow(f"r{i}", context, rng.randrange(0, 3), tokens, state))
    return rows


@pytest.mark.parametrize("name", ["LowConfidence", "JointThreshold"])
def test_memoised_rows_step_as_the_batch_does(name: str) -> None:
    params = {"max_post_edit_steps": 3} if name == "JointThreshold" else {}
    oracle = AlgorithmOracle.named(name, MASK, **params)
    rng = random.Random(7)
    pool = _rows(rng, oracle, 40)
    for _ in range(200):
        batch = rng.sample(pool, rng.randint(1, 6))  # rows seen before, in other batches
        assert oracle.step(batch) == _batch_step(oracle.algorithm, 0, oracle.vocab, batch)


def test_a_rows_state_is_part_of_its_key() -> None:
    """The same block with a finished and an unfinished JointThreshold state steps differently
    (a finished row stays as it is), and each gets its own answer from the memo."""
    oracle = AlgorithmOracle.named("JointThreshold", MASK)
    tokens = (MASK, MASK, 3, MASK)
    fresh = oracle.init_state(tokens)
    assert isinstance(fresh, JointState)
    done = JointState(0, True, fresh.prompt_mask)
    rows = [OracleRow("a", (1, 2), 0, tokens, fresh), OracleRow("b", (1, 2), 0, tokens, done)]
    first, second = oracle.step(rows)
    assert second == OracleStep(tokens, done, True) and first.tokens != tokens, (first, second)
    assert oracle.step(rows[::-1]) == [second, first]


class _Recording:
    """LowConfidence behind another type: the oracle must hand it the whole batch."""

    name = "LowConfidence"

    def __init__(self) -> None:
        self.inner = LowConfidence(MASK)
        self.batches: list[int] = []

    def init_step_state(self, tokens: IntArray) -> object:
        return None

    def step(
        self, tokens: IntArray, logits: FloatArray, states: Sequence[object]
    ) -> tuple[list[bool], list[object]]:
        self.batches.append(len(tokens))
        return self.inner.step(tokens, logits, states)


def test_another_algorithm_gets_the_batch_in_one_call() -> None:
    recording = _Recording()
    oracle = AlgorithmOracle(recording)
    rows = _rows(random.Random(3), oracle, 5)
    expected = AlgorithmOracle.named("LowConfidence", MASK).step(rows)
    assert oracle.step(rows) == expected
    assert oracle.step(rows) == expected
    assert recording.batches == [5, 5]


def test_the_logits_are_read_only() -> None:
    logits = pseudo_logits(0, (1, 2, 3), 0, (MASK, 4), 16)
    assert logits.shape == (2, 16) and logits.dtype == np.float32
    with pytest.raises(ValueError, match="read-only"):
        logits[0, 0] = 1.0
