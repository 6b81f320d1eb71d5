"""Typed errors of the torch engine's model side (tokenizer, weights, model inputs).

All derive from `spec.errors.SchedSpecError` so callers can catch schedspec errors uniformly;
configuration errors reuse `spec.errors.ConfigError` (field, value, what would be valid).
"""

from __future__ import annotations

from spec.errors import ConfigError, SchedSpecError


class UnknownCharacter(SchedSpecError, ValueError):
    """The text holds a character outside the tokenizer's fixed character set."""

    def __init__(self, char: str, index: int, valid: str) -> None:
        self.char = char
        self.index = index
        super().__init__(
            f"character {char!r} at index {index} is not in the tokenizer's character set; "
            f"valid characters: {valid!r}"
        )


class UnknownTokenId(SchedSpecError, ValueError):
    """A token id is outside [0, vocab_size)."""

    def __init__(self, token_id: int, vocab_size: int) -> None:
        self.token_id = token_id
        super().__init__(f"token id {token_id} is out of range: valid ids are 0..{vocab_size - 1}")


class WeightsMismatch(SchedSpecError, ValueError):
    """A weights file does not match the model built from its config (names the tensor)."""

    def __init__(self, tensor: str, detail: str) -> None:
        self.tensor = tensor
        self.detail = detail
        super().__init__(f"weights do not match the model config: tensor {tensor!r} {detail}")


class ForwardInputError(SchedSpecError, ValueError):
    """Inputs to a model forward are inconsistent (shape, alignment or context overflow)."""

    def __init__(self, what: str, detail: str) -> None:
        self.what = what
        super().__init__(f"invalid forward input {what}: {detail}")


class UnknownAlgorithm(ConfigError):
    """The algorithm name is not registered; lists the valid names."""

    def __init__(self, name: object, valid: tuple[str, ...]) -> None:
        self.valid_names = valid
        super().__init__("algorithm", name, f"valid algorithms: {list(valid)}")


class UnknownAlgorithmKey(ConfigError):
    """An algorithm config holds a key the algorithm does not take; lists the valid keys."""

    def __init__(self, algorithm: str, key: str, value: object, valid: tuple[str, ...]) -> None:
        self.algorithm = algorithm
        self.key = key
        self.valid_keys = valid
        super().__init__(
            f"{algorithm}.{key}", value, f"unknown key {key!r}; valid keys: {list(valid)}"
        )
