"""Save and load the model as `model.safetensors` + `model_config.json` in one directory."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gpu.errors import WeightsMismatch
from gpu.model import BlockDiffusionLM
from gpu.model_config import ModelConfig

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "model_config.json"
DEFAULT_ASSETS = Path(__file__).resolve().parent / "assets"


def save_model(model: BlockDiffusionLM, config: ModelConfig, path_dir: str | Path) -> None:
    """Write the state dict (CPU copies) as `model.safetensors` and `config` as
    `model_config.json` in `path_dir`, created if missing; what `load_model` reads."""
    out = Path(path_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS_FILE))
    config.save(out / CONFIG_FILE)


def check_state_dict(model: BlockDiffusionLM, state: dict[str, torch.Tensor]) -> None:
    """Raise WeightsMismatch naming the first missing, extra or mis-shaped tensor."""
    expected = model.state_dict()
    for name in sorted(expected):
        if name not in state:
            raise WeightsMismatch(name, "is missing from the weights file")
    for name in sorted(state):
        if name not in expected:
            raise WeightsMismatch(name, "is in the weights file but not in the model")
        want, got = tuple(expected[name].shape), tuple(state[name].shape)
        if want != got:
            raise WeightsMismatch(name, f"has shape {got}, the config needs {want}")


def load_model(
    path_dir: str | Path = DEFAULT_ASSETS, device: torch.device | str = "cpu"
) -> tuple[BlockDiffusionLM, ModelConfig]:
    """(model in eval mode on `device`, its config) from `path_dir`.

    Raises ConfigError for a bad config and WeightsMismatch (naming the tensor) when the weights
    do not fit the config; a missing file raises FileNotFoundError naming it."""
    root = Path(path_dir)
    config = ModelConfig.load(root / CONFIG_FILE)
    weights_path = root / WEIGHTS_FILE
    if not weights_path.exists():
        raise FileNotFoundError(f"no weights file at {weights_path}")
    state = load_file(str(weights_path))
    model = BlockDiffusionLM(config)
    check_state_dict(model, state)
    model.load_state_dict(state, strict=True)
    model.to(torch.device(device))
    model.eval()
    return model, config
