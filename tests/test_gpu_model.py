"""Tokenizer, model config, weights loading and the shipped model's held-out accuracy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu.algorithms import make_algorithm
from gpu.corpus import counting_cases
from gpu.errors import UnknownCharacter, WeightsMismatch
from gpu.evaluate import counting_accuracy, score_continuation
from gpu.generate import generate
from gpu.model import BlockDiffusionLM
from gpu.model_config import ModelConfig
from gpu.tokenizer import CHARSET, EOS_ID, MASK_ID, PAD_ID, TOKENIZER, VOCAB_SIZE
from gpu.weights import CONFIG_FILE, DEFAULT_ASSETS, WEIGHTS_FILE, load_model
from spec.errors import ConfigError, EmptyPrompt, PromptTooLong, SchedSpecError

torch.set_num_threads(1)

# The shipped weights must continue held-out counting prompts (starts never seen in training,
# each crossing a decade: "count: 37 38 39" -> "40 41 42 43") with at least this fraction of
# the next numbers exactly right; an untrained model must stay far below it.
ACCURACY_THRESHOLD = 0.9
RANDOM_CEILING = 0.2

# --- tokenizer -------------------------------------------------------------------------------


def test_tokenizer_round_trips_the_corpus_alphabet() -> None:
    text = "count: 12 13; add: 7+5=12; mul: 3*4=12; abc: x y z, ok? -."
    ids = TOKENIZER.encode(text)
    assert min(ids) > EOS_ID and max(ids) < VOCAB_SIZE
    assert TOKENIZER.decode(ids) == text
    assert (PAD_ID, MASK_ID, EOS_ID) == (0, 1, 2)
    assert VOCAB_SIZE == 3 + len(CHARSET) == TOKENIZER.vocab_size


def test_tokenizer_decode_stops_at_eos_and_shows_specials() -> None:
    ids = [*TOKENIZER.encode("ab"), MASK_ID, PAD_ID, EOS_ID, *TOKENIZER.encode("cd")]
    assert TOKENIZER.decode(ids) == "ab<mask>"
    assert TOKENIZER.decode(ids, stop_at_eos=False) == "ab<mask><eos>cd"


def test_tokenizer_unknown_character_is_a_typed_error_naming_it() -> None:
    with pytest.raises(UnknownCharacter) as info:
        TOKENIZER.encode("count: 1 2 X")
    assert isinstance(info.value, SchedSpecError) and isinstance(info.value, ValueError)
    assert info.value.char == "X" and info.value.index == 11
    assert "'X'" in str(info.value)


def test_tokenizer_rejects_out_of_range_ids() -> None:
    with pytest.raises(SchedSpecError, match="out of range"):
        TOKENIZER.decode([VOCAB_SIZE])


# --- config ----------------------------------------------------------------------------------


def valid_config(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "vocab_size": 49,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "d_ff": 64,
        "max_context": 64,
        "rope_theta": 10000.0,
        "train_block_sizes": (4, 8),
    }
    base.update(changes)
    return base


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("d_model", 0),
        ("n_heads", 3),  # 32 not divisible by 3
        ("d_model", 36),  # head_dim 9 is odd
        ("rope_theta", -1.0),
        ("train_block_sizes", (4, 7)),  # 7 does not divide 64
        ("train_block_sizes", ()),
        ("max_context", True),
    ],
)
def test_config_validation_raises_config_error(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        ModelConfig(**valid_config(**{field: value}))  # type: ignore[arg-type]
    assert info.value.field in (field, "d_model")


def test_config_json_round_trip(tmp_path: Path) -> None:
    config = ModelConfig(**valid_config())  # type: ignore[arg-type]
    config.save(tmp_path / "c.json")
    assert ModelConfig.load(tmp_path / "c.json") == config
    data = json.loads(config.to_json())
    data["colour"] = "red"
    with pytest.raises(ConfigError, match="colour"):
        ModelConfig.from_dict(data)


# --- weights ---------------------------------------------------------------------------------


def copy_assets(tmp_path: Path) -> Path:
    out = tmp_path / "assets"
    out.mkdir()
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        shutil.copy(DEFAULT_ASSETS / name, out / name)
    return out


def test_shipped_assets_load() -> None:
    model, config = load_model()
    assert isinstance(model, BlockDiffusionLM) and not model.training
    assert config.vocab_size == VOCAB_SIZE
    assert set(config.train_block_sizes) >= {4, 8, 16}


def test_weights_with_a_missing_tensor_name_it(tmp_path: Path) -> None:
    root = copy_assets(tmp_path)
    state = load_file(str(root / WEIGHTS_FILE))
    del state["lm_head.weight"]
    save_file(state, str(root / WEIGHTS_FILE))
    with pytest.raises(WeightsMismatch, match=r"lm_head\.weight.*missing"):
        load_model(root)


def test_weights_with_an_extra_tensor_name_it(tmp_path: Path) -> None:
    root = copy_assets(tmp_path)
    state = load_file(str(root / WEIGHTS_FILE))
    state["bonus.weight"] = torch.zeros(2)
    save_file(state, str(root / WEIGHTS_FILE))
    with pytest.raises(WeightsMismatch, match=r"bonus\.weight"):
        load_model(root)


def test_weights_not_matching_the_config_shape_name_the_tensor(tmp_path: Path) -> None:
    root = copy_assets(tmp_path)
    data = json.loads((root / CONFIG_FILE).read_text())
    data["d_ff"] = data["d_ff"] + 2
    (root / CONFIG_FILE).write_text(json.dumps(data))
    with pytest.raises(WeightsMismatch) as info:
        load_model(root)
    assert isinstance(info.value, SchedSpecError)
    assert "mlp" in info.value.tensor and "shape" in str(info.value)


# --- generation and held-out accuracy ------------------------------------------------------


def test_score_continuation() -> None:
    assert score_continuation(" 40 41 42 43 44", (40, 41, 42, 43)) == 4
    assert score_continuation(" 40 14 42", (40, 41, 42, 43)) == 2


def test_generate_errors() -> None:
    model, config = load_model()
    algo = make_algorithm("LowConfidence")
    with pytest.raises(EmptyPrompt):
        generate(model, "", 8, algo)
    with pytest.raises(PromptTooLong):
        generate(model, "a" * config.max_context, 8, algo)


def test_generate_keeps_partial_prompt_block_and_reports_rounds() -> None:
    model, _ = load_model()
    out = generate(model, "count: 21 22 23", 8, make_algorithm("LowConfidence"), 16)
    # 15 prompt chars: one full prompt block, then a block holding 7 prompt chars + 1 new token.
    assert out.text.startswith(" 24 25")
    assert len(out.rounds_per_block) >= 2
    assert all(2 <= r <= 9 for r in out.rounds_per_block)  # at least 1 commit round + 1 final


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_shipped_model_counts_held_out_starts(block_size: int) -> None:
    model, _ = load_model()
    cases = counting_cases(seed=0)
    acc = counting_accuracy(model, cases, block_size, make_algorithm("LowConfidence"))
    assert acc.fraction >= ACCURACY_THRESHOLD, acc


def test_random_model_scores_low_on_the_same_metric() -> None:
    _, config = load_model()
    torch.manual_seed(0)
    model = BlockDiffusionLM(config).eval()
    cases = counting_cases(seed=0, n=10)
    acc = counting_accuracy(model, cases, 8, make_algorithm("LowConfidence"))
    assert acc.fraction <= RANDOM_CEILING, acc
