"""`ModelConfig`: the shape of the block-diffusion transformer, validated, JSON round-trip."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from spec.errors import ConfigError
from spec.input_file import read_input_text
from spec.json_text import parse_json


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Hyper-parameters of `gpu.model.BlockDiffusionLM`.

    Invariants (checked on construction, each violation a `ConfigError`): all sizes positive,
    `d_model` divisible by `n_heads` with an even head dimension (RoPE rotates pairs),
    `rope_theta > 0`, and every train block size positive and dividing `max_context`.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_context: int
    rope_theta: float = 10000.0
    train_block_sizes: tuple[int, ...] = (4, 8, 16)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "a positive integer")
        if self.d_model % self.n_heads != 0:
            raise ConfigError("d_model", self.d_model, f"a multiple of n_heads={self.n_heads}")
        if self.head_dim % 2 != 0:
            raise ConfigError(
                "d_model", self.d_model, "d_model / n_heads must be even (RoPE rotates pairs)"
            )
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 0:
            raise ConfigError("rope_theta", theta, "a positive number")
        sizes = self.train_block_sizes
        if not isinstance(sizes, tuple) or not sizes:
            raise ConfigError("train_block_sizes", sizes, "a non-empty tuple of block sizes")
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError("train_block_sizes", sizes, "positive integers")
            if self.max_context % size != 0:
                raise ConfigError(
                    "train_block_sizes",
                    sizes,
                    f"each must divide max_context={self.max_context}",
                )

    @property
    def head_dim(self) -> int:
        """`d_model // n_heads` (even, by the invariants)."""
        return self.d_model // self.n_heads

    def to_json(self) -> str:
        """Every field as indented JSON with sorted keys, ending in a newline."""
        data = asdict(self)
        data["train_block_sizes"] = list(self.train_block_sizes)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from a parsed mapping; unknown or missing fields are `ConfigError`s."""
        valid = [f.name for f in fields(cls)]
        for key in data:
            if key not in valid:
                raise ConfigError(key, data[key], f"unknown field; valid fields: {valid}")
        values = dict(data)
        if "train_block_sizes" in values and isinstance(values["train_block_sizes"], list):
            values["train_block_sizes"] = tuple(values["train_block_sizes"])
        required = [
            f.name for f in fields(cls) if f.name not in ("rope_theta", "train_block_sizes")
        ]
        for name in required:
            if name not in values:
                raise ConfigError(name, None, "missing required field")
        return cls(**values)

    def save(self, path: str | Path) -> None:
        """Write `to_json()` to `path` (UTF-8), replacing any file there."""
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Read a config `save` wrote. `ConfigError` for a file that is not a JSON object or
        fails `from_dict`; `OSError` (incl. `InputTooLarge`) for one that cannot be read,
        `UnicodeDecodeError` for one that is not UTF-8."""
        text = read_input_text(path)
        try:
            data = parse_json(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("model_config", str(path), f"a JSON object ({exc})") from exc
        if not isinstance(data, dict):
            raise ConfigError("model_config", str(path), "a JSON object")
        return cls.from_dict(data)
