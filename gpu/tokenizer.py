"""Character-level tokenizer of the toy block-diffusion model.

Ids 0..2 are specials (PAD, MASK, EOS); then one id per character of a fixed character set:
digits, lowercase letters, space and the punctuation the corpus uses. The mapping is frozen:
shipped weights depend on it, so never reorder CHARSET.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu.errors import UnknownCharacter, UnknownTokenId

PAD_ID = 0
MASK_ID = 1
EOS_ID = 2
SPECIALS: tuple[str, ...] = ("<pad>", "<mask>", "<eos>")
CHARSET = "0123456789abcdefghijklmnopqrstuvwxyz +-=*;:,.?"

_CHAR_TO_ID = {c: i + len(SPECIALS) for i, c in enumerate(CHARSET)}
VOCAB_SIZE = len(SPECIALS) + len(CHARSET)


class CharTokenizer:
    """Encode text to ids and back. Stateless; one shared instance is `TOKENIZER`."""

    pad_id = PAD_ID
    mask_id = MASK_ID
    eos_id = EOS_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, one per character; raises UnknownCharacter naming the first bad one."""
        ids: list[int] = []
        for index, char in enumerate(text):
            token = _CHAR_TO_ID.get(char)
            if token is None:
                raise UnknownCharacter(char, index, CHARSET)
            ids.append(token)
        return ids

    def decode(self, ids: Iterable[int], *, stop_at_eos: bool = True) -> str:
        """Text of `ids`. Stops at the first EOS when `stop_at_eos`; PAD is dropped; MASK (and
        EOS when not stopping) are shown as `<mask>` / `<eos>` so partial blocks stay readable."""
        out: list[str] = []
        for token in ids:
            t = int(token)
            if t == EOS_ID and stop_at_eos:
                break
            if t == PAD_ID:
                continue
            if 0 <= t < len(SPECIALS):
                out.append(SPECIALS[t])
            elif t < VOCAB_SIZE:
                out.append(CHARSET[t - len(SPECIALS)])
            else:
                raise UnknownTokenId(t, VOCAB_SIZE)
        return "".join(out)


TOKENIZER = CharTokenizer()
