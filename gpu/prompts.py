"""The shipped prompt set (`gpu/assets/prompts.json`) and the context a run on it needs, read
without torch.

The benchmark cycles every entry; parity runs each distinct text once (`parity_texts`). No torch
here, so that the command line can check a prompt count or a token count before torch loads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from spec.errors import ConfigError

ASSETS = Path(__file__).resolve().parent / "assets"
PROMPTS_FILE = ASSETS / "prompts.json"
PARITY_BLOCK_SIZE = 8  # tokens per block of a parity run unless told otherwise


def load_prompts(path: Path = PROMPTS_FILE) -> list[str]:
    """The shipped prompt set (texts only), every entry: the benchmark's workload cycles them."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [str(p["prompt"]) for p in data["prompts"]]


def parity_texts(path: Path = PROMPTS_FILE) -> list[str]:
    """The parity cases: the shipped set's distinct texts, in the set's order.

    The set was sampled from the corpus and has a repeated entry (the held-out alphabet split
    holds only four prompts). A repeated case proves nothing and the release gate refuses a
    report with one, so parity runs each text once; the benchmark keeps every entry."""
    return list(dict.fromkeys(load_prompts(path)))


def parity_cases(prompts: int | None) -> list[str]:
    """The first `prompts` distinct shipped texts (None: all of them); `ConfigError` naming how
    many there are otherwise."""
    texts = parity_texts()
    if prompts is None:
        return texts
    if not 1 <= prompts <= len(texts):
        raise ConfigError(
            "prompts", prompts, f"between 1 and {len(texts)} (the shipped set's distinct prompts)"
        )
    return texts[:prompts]


def shipped_context() -> int:
    """The shipped model's context in tokens (its `model_config.json`)."""
    data = json.loads((ASSETS / "model_config.json").read_text(encoding="utf-8"))
    return int(data["max_context"])


def block_context(
    prompt_lengths: Sequence[int], max_new_tokens: int, block_size: int, model_context: int
) -> int:
    """The context, in whole blocks, that holds the longest prompt plus `max_new_tokens`;
    `ConfigError` naming the most new tokens that would fit when the model's context is too
    short."""
    prompt = max(prompt_lengths)
    needed = -(-(prompt + max_new_tokens) // block_size) * block_size
    limit = model_context // block_size * block_size
    if needed > limit:
        raise ConfigError(
            "max_new_tokens",
            max_new_tokens,
            f"the longest of the {len(prompt_lengths)} prompts ({prompt} tokens) plus "
            f"the new tokens need {needed} context tokens in blocks of {block_size}; the "
            f"model's context is {model_context}: use at most {limit - prompt} new tokens",
        )
    return needed
