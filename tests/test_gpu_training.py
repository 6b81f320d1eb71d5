"""Corpus determinism and split, the [clean ; noised] training mask, and a training smoke test."""

from __future__ import annotations

import json
import random

import pytest
import torch

from gpu.corpus import (
    HELDOUT_WORDS,
    MAX_SAMPLE_TOKENS,
    MIN_LONG_TOKENS,
    counting_cases,
    is_heldout_count,
    is_heldout_fact,
    make_long_sample,
    make_samples,
)
from gpu.model_config import ModelConfig
from gpu.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE
from gpu.train import TrainConfig, encode_batch, sample_batch, train, two_copy_mask
from gpu.weights import DEFAULT_ASSETS

torch.set_num_threads(1)


def test_corpus_is_deterministic_and_fits_the_context() -> None:
    a = make_samples(3, 200, "train")
    assert a == make_samples(3, 200, "train")
    assert a != make_samples(4, 200, "train")
    assert {s.kind for s in a} == {"count", "word", "alpha", "add", "mul"}
    assert all(len(s.token_ids()) <= MAX_SAMPLE_TOKENS for s in a)
    assert all(s.token_ids()[-1] == EOS_ID for s in a)


def test_long_samples_fill_their_length_from_the_training_split() -> None:
    rng = random.Random(7)
    for tokens in (MIN_LONG_TOKENS, 100, 256):
        for kind in ("count", "word"):
            sample = make_long_sample(rng, tokens, kind)
            n = len(sample.token_ids())
            assert tokens - 4 <= n <= tokens, (kind, tokens, n)
            words = sample.text.split()
            if kind == "count":
                numbers = [int(w) for w in words[1:]]
                assert not is_heldout_count(numbers[0])
                assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
            else:
                assert words[1] not in HELDOUT_WORDS and set(words[1:]) == {words[1]}
    with pytest.raises(ValueError, match="at least"):
        make_long_sample(rng, MIN_LONG_TOKENS - 1)


def test_long_batches_cover_the_whole_context() -> None:
    rng = random.Random(0)
    lengths = {sample_batch(rng, 2, 256, long_fraction=1.0).shape[1] for _ in range(200)}
    assert max(lengths) == 256 and min(lengths) == MIN_LONG_TOKENS
    assert all(n % 16 == 0 for n in lengths)


def test_heldout_split_is_disjoint_by_construction() -> None:
    for s in make_samples(0, 2000, "train"):
        words = s.text.split()
        if s.kind == "count":
            assert not is_heldout_count(int(words[1]))
        if s.kind == "word":
            assert words[1] not in HELDOUT_WORDS
        if s.kind == "alpha":
            assert words[1] not in ("h", "r")
        if s.kind in ("add", "mul"):
            for fact in words[1:]:
                a, b = fact.rstrip(";").split("=")[0].replace("*", "+").split("+")
                assert not is_heldout_fact(int(a), int(b))
    for s in make_samples(0, 200, "heldout"):
        if s.kind == "count":
            assert is_heldout_count(int(s.text.split()[1]))
    for case in counting_cases(0, 10):
        assert is_heldout_count(int(case.prompt.split()[1]))


def test_encode_batch_pads_with_eos_to_block_multiples_then_pad() -> None:
    samples = make_samples(1, 4, "train")
    batch = encode_batch(samples, MAX_SAMPLE_TOKENS)
    for row, s in zip(batch.tolist(), samples, strict=True):
        n = len(s.token_ids())
        aligned = -(-n // 16) * 16
        assert row[: n - 1] == s.token_ids()[:-1]
        assert row[n - 1 : aligned] == [EOS_ID] * (aligned - n + 1)
        assert row[aligned:] == [PAD_ID] * (MAX_SAMPLE_TOKENS - aligned)


def test_two_copy_mask_lets_noised_blocks_see_clean_past_and_noised_self() -> None:
    length, bs = 8, 4
    mask = two_copy_mask(length, bs)
    for i in range(2 * length):
        for j in range(2 * length):
            qi, kj = i % length // bs, j % length // bs
            if i < length:  # clean queries: block-causal over clean keys only
                want = j < length and kj <= qi
            else:  # noised queries: clean earlier blocks + own noised block
                want = (j < length and kj < qi) or (j >= length and kj == qi)
            assert bool(mask[i, j]) == want, (i, j)


def test_training_smoke_loss_decreases() -> None:
    config = ModelConfig(
        vocab_size=VOCAB_SIZE,
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=64,
        max_context=64,
        train_block_sizes=(4, 8, 16),
    )
    cfg = TrainConfig(steps=60, batch_size=16, lr=1e-2, warmup=5)
    result = train(config, cfg)
    first = sum(result.masked_ce[:10]) / 10
    last = sum(result.masked_ce[-10:]) / 10
    assert last < first - 0.5, (first, last)
    again = train(config, TrainConfig(steps=3, batch_size=16, lr=1e-2, warmup=5))
    assert again.losses == result.losses[:3]  # seeded: a rerun reproduces the same steps


def test_shipped_train_log_records_the_run() -> None:
    log = json.loads((DEFAULT_ASSETS / "train_log.json").read_text())
    # the run was not cut short by the wall-clock guard (so retraining reproduces it)
    assert log["steps"] == log["planned_steps"] == log["train_config"]["steps"] > 0
    assert log["train_config"]["long_fraction"] > 0
    config = json.loads((DEFAULT_ASSETS / "model_config.json").read_text())
    assert config["max_context"] >= 256
    assert {"final_loss", "corpus_seed", "seconds"} <= set(log)
