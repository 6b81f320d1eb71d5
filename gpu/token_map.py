"""Mapping between the spec's token ids (what events carry) and the model's vocabulary.

The engine's model speaks the character tokenizer's ids (`gpu.tokenizer`: PAD=0, MASK=1, EOS=2,
then one id per character). A `DllmConfig` names its own `mask_token_id` and `eos_token_id`;
the conformance suite, for instance, uses mask -1, EOS 15 and prompts over ids 0..15. Events
must use the config's ids (the harness replays them into a `SpecMachine` built from that very
config), so the engine keeps two vocabularies and a fixed bijection between them:

- *Native configs* (mask_token_id == tokenizer MASK): the identity, except that a configured
  eos_token_id other than the tokenizer's EOS swaps places with it.
- *Foreign configs* (any other mask id, e.g. -1): spec id t maps to internal id (t + 3) mod V
  (V = the model vocabulary, 49 for the character tokenizer), so spec ids 0..V-4 land on the
  characters '0'..'9', 'a'..'z', ... in order (the model sees digits and letters, its training
  domain) and spec ids V-3, V-2, V-1 on PAD, MASK, EOS. Then the configured eos_token_id (if in
  range) swaps places with the id that maps to the tokenizer's EOS, so committing the model's EOS
  is the spec's EOS. The spec id that lands on the tokenizer's MASK (the *hole*, V-2 unless
  swapped) is not a valid prompt token; the tokenizer's MASK maps back to the config's mask id.

Spec prompts must use ids in [0, V) (V = the model vocabulary size) other than the mask and
the hole; anything else is rejected with `TokenOutOfVocabulary` before anything is allocated.
Finish conditions are evaluated on spec ids, exactly as the spec does.
"""

from __future__ import annotations

import torch

from spec.config import DllmConfig
from spec.errors import InvalidRequest

SPECIAL_OFFSET = 3  # PAD, MASK, EOS precede the characters in the tokenizer


class TokenOutOfVocabulary(InvalidRequest):
    """A prompt token id has no counterpart in the engine's model vocabulary."""

    def __init__(self, request_id: str, token: int, valid: str) -> None:
        self.token = token
        super().__init__(request_id, "prompt", token, valid)


class TokenMap:
    """Bijection spec id <-> internal id for one configuration."""

    def __init__(self, config: DllmConfig, vocab_size: int, mask_id: int, eos_id: int) -> None:
        self.vocab_size = vocab_size
        self.internal_mask = mask_id
        self.internal_eos = eos_id
        self.spec_mask: int = config.mask_token_id
        self.spec_eos: int | None = config.eos_token_id
        v = vocab_size
        native = 0 <= config.mask_token_id < v
        to_internal = list(range(v)) if native else [(t + SPECIAL_OFFSET) % v for t in range(v)]
        self.native: bool = native

        def swap_to(spec_id: int, internal_id: int) -> None:
            j = to_internal.index(internal_id)
            to_internal[spec_id], to_internal[j] = to_internal[j], to_internal[spec_id]

        if native:
            swap_to(config.mask_token_id, mask_id)
        eos = config.eos_token_id
        if eos is not None and 0 <= eos < v and eos != config.mask_token_id:
            swap_to(eos, eos_id)
        self._to_internal = to_internal
        self._to_spec = [0] * v
        for spec_id, internal in enumerate(to_internal):
            self._to_spec[internal] = spec_id
        # The tokenizer's MASK always reads back as the config's mask id.
        self.hole: int = self._to_spec[mask_id]
        self._to_spec[mask_id] = config.mask_token_id
        self._to_spec_t = torch.tensor(self._to_spec, dtype=torch.int64)

    def check_prompt(self, request_id: str, prompt: tuple[int, ...]) -> None:
        """Raise TokenOutOfVocabulary unless every id maps to a non-mask model token."""
        for tok in prompt:
            if not 0 <= tok < self.vocab_size or tok == self.hole:
                raise TokenOutOfVocabulary(
                    request_id,
                    tok,
                    f"token ids must be in [0, {self.vocab_size}) (the engine's model "
                    f"vocabulary) and not {self.hole} (it maps onto the model's mask token)",
                )

    def to_internal(self, tokens: tuple[int, ...] | list[int]) -> list[int]:
        """Spec ids -> model ids. No range check: pass ids `check_prompt` accepts."""
        return [self._to_internal[t] for t in tokens]

    def to_spec(self, tokens: list[int]) -> tuple[int, ...]:
        """Model ids in [0, vocab_size) -> spec ids (the model's mask -> the config's mask)."""
        return tuple(self._to_spec[t] for t in tokens)

    def to_spec_tensor(self, tokens: torch.Tensor) -> torch.Tensor:
        """As `to_spec` on an integer tensor, elementwise: int64 of the same shape, on its
        device."""
        return self._to_spec_t.to(tokens.device)[tokens]
