"""Deterministic toy corpus for the block-diffusion model, with a held-out split by construction.

Every sample is `prompt + continuation`, tokenised and followed by EOS. Kinds:

- predictable: counting (`count: 12 13 14 15`), repeated words (`word: cat cat cat`),
  alphabet runs (`abc: f g h i`): once the prompt is read, the continuation is determined.
- harder: addition and multiplication facts (`add: 7+5=12; 3+4=7;`): operands are random, only
  the results are determined, so a decoder is unsure about most positions.

Held-out split: two-digit counting starts with `start % 10 == 7`, words in `HELDOUT_WORDS`,
alphabet runs starting at `h` or `r`, and arithmetic facts with `(31 * a + b) % 10 == 3` are
held out; no training sample contains a held-out start, word or fact. Generation is a pure
function of the seed (`random.Random`), so the corpus is reproducible anywhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from gpu.tokenizer import EOS_ID, TOKENIZER

Split = Literal["train", "heldout"]
KINDS: tuple[str, ...] = ("count", "word", "alpha", "add", "mul")
# Counting dominates: it is the held-out accuracy task and carries need the most practice.
KIND_WEIGHTS: tuple[float, ...] = (0.44, 0.14, 0.14, 0.14, 0.14)
MAX_SAMPLE_TOKENS = 48  # prompt + continuation + EOS (the short kinds above)
# Long samples teach the positions of a 256-token context (the release gate decodes 128 new
# tokens after a prompt): long counting runs and long word repeats, training split only.
LONG_KINDS: tuple[str, ...] = ("count", "word")
MIN_LONG_TOKENS = 64

TRAIN_WORDS: tuple[str, ...] = (
    "cat", "dog", "sun", "tree", "blue", "moon", "fish", "bird", "red", "cake",
    "rain", "star", "book", "door", "lamp", "milk", "ship", "king", "road", "snow",
    "leaf", "wind", "gold", "frog", "bell", "hat", "cup", "pen", "box", "owl",
)  # fmt: skip
HELDOUT_WORDS: tuple[str, ...] = ("fox", "rose", "kite", "wolf", "sand", "jam")
HELDOUT_LETTERS = "hr"
ALPHABET = "abcdefghijklmnopqrstuvwxyz"
COUNT_START_MAX = 88  # numbers stay below 100: one- and two-digit counting


@dataclass(frozen=True, slots=True)
class Sample:
    """One corpus sample: its `kind` (one of `KINDS`), a prompt and the continuation after it."""

    kind: str
    prompt: str
    continuation: str

    @property
    def text(self) -> str:
        """`prompt + continuation` (without the EOS that `token_ids` appends)."""
        return self.prompt + self.continuation

    def token_ids(self) -> list[int]:
        """Ids of prompt + continuation, then EOS."""
        return [*TOKENIZER.encode(self.text), EOS_ID]


def is_heldout_count(start: int) -> bool:
    """Whether counting from `start` is held out: two-digit starts ending in 7."""
    # Two-digit starts only: the nine one-digit starts are each a unique position pattern
    # (the 9 -> 10 width change at a fixed offset), so holding one out would test memory of
    # that one pattern rather than counting.
    return start >= 10 and start % 10 == 7


def is_heldout_fact(a: int, b: int) -> bool:
    """Whether the fact with operands `a`, `b` (either op) is held out: `(31a + b) % 10 == 3`."""
    return (31 * a + b) % 10 == 3


def _count(rng: random.Random, split: Split) -> Sample:
    while True:
        start = rng.randrange(COUNT_START_MAX)
        if is_heldout_count(start) == (split == "heldout"):
            break
    total = rng.randint(7, 12)
    shown = rng.randint(2, 4)
    numbers = [str(start + i) for i in range(total)]
    return Sample("count", "count: " + " ".join(numbers[:shown]), " " + " ".join(numbers[shown:]))


def _word(rng: random.Random, split: Split) -> Sample:
    word = rng.choice(HELDOUT_WORDS if split == "heldout" else TRAIN_WORDS)
    total = rng.randint(4, 9)
    shown = rng.randint(1, 2)
    return Sample("word", "word: " + " ".join([word] * shown), (" " + word) * (total - shown))


def _alpha(rng: random.Random, split: Split) -> Sample:
    while True:
        first = rng.randrange(len(ALPHABET) - 5)
        if (ALPHABET[first] in HELDOUT_LETTERS) == (split == "heldout"):
            break
    length = rng.randint(5, min(12, len(ALPHABET) - first))
    letters = list(ALPHABET[first : first + length])
    shown = rng.randint(2, 3)
    return Sample("alpha", "abc: " + " ".join(letters[:shown]), " " + " ".join(letters[shown:]))


def _facts(rng: random.Random, split: Split, op: str) -> Sample:
    limit = 30 if op == "+" else 10
    count = rng.randint(2, 4)
    facts: list[str] = []
    while len(facts) < count:
        a, b = rng.randrange(limit), rng.randrange(limit)
        if is_heldout_fact(a, b) != (split == "heldout"):
            continue
        value = a + b if op == "+" else a * b
        facts.append(f"{a}{op}{b}={value};")
    shown = rng.randint(1, 2)
    name = "add" if op == "+" else "mul"
    return Sample(name, f"{name}: " + " ".join(facts[:shown]), " " + " ".join(facts[shown:]))


def make_sample(rng: random.Random, split: Split, kind: str | None = None) -> Sample:
    """One sample of `kind` (drawn by KIND_WEIGHTS when None) from `split`."""
    chosen = kind if kind is not None else rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
    while True:
        if chosen == "count":
            sample = _count(rng, split)
        elif chosen == "word":
            sample = _word(rng, split)
        elif chosen == "alpha":
            sample = _alpha(rng, split)
        elif chosen in ("add", "mul"):
            sample = _facts(rng, split, "+" if chosen == "add" else "*")
        else:
            raise ValueError(f"unknown sample kind {chosen!r}; valid kinds: {list(KINDS)}")
        if len(sample.text) + 1 <= MAX_SAMPLE_TOKENS:
            return sample


def make_samples(seed: int, n: int, split: Split, kind: str | None = None) -> list[Sample]:
    """`n` samples from `split`, a pure function of (seed, n, split, kind)."""
    rng = random.Random(f"{seed}:{split}:{kind}")
    return [make_sample(rng, split, kind) for _ in range(n)]


@dataclass(frozen=True, slots=True)
class CountingCase:
    """A held-out counting prompt and the numbers that must follow it."""

    prompt: str
    expected: tuple[int, ...]


def counting_cases(seed: int, n: int | None = None, follow: int = 4) -> list[CountingCase]:
    """Distinct held-out counting prompts, shuffled by `seed`: every held-out start with 2, 3
    or 4 numbers shown (24 cases; the first `n` when given), each with the `follow` numbers
    that must come next."""
    pairs = [
        (start, shown)
        for start in range(COUNT_START_MAX)
        if is_heldout_count(start)
        for shown in (2, 3, 4)
    ]
    random.Random(f"{seed}:counting_cases").shuffle(pairs)
    cases: list[CountingCase] = []
    for start, shown in pairs[:n]:
        prompt = "count: " + " ".join(str(start + k) for k in range(shown))
        expected = tuple(start + shown + k for k in range(follow))
        cases.append(CountingCase(prompt, expected))
    return cases


def make_long_sample(rng: random.Random, tokens: int, kind: str | None = None) -> Sample:
    """A training-split sample of `kind` (drawn from LONG_KINDS when None) whose prompt +
    continuation + EOS is at most `tokens` long and within 4 tokens of it: a counting run that
    goes on (past 99 into three digits) or a word repeated, with a short prompt as in the short
    kinds, so the continuation fills the context."""
    if tokens < MIN_LONG_TOKENS:
        raise ValueError(f"tokens={tokens}: a long sample needs at least {MIN_LONG_TOKENS}")
    chosen = kind if kind is not None else rng.choice(LONG_KINDS)
    if chosen == "count":
        while True:
            start = rng.randrange(COUNT_START_MAX)
            if not is_heldout_count(start):
                break
        shown = rng.randint(2, 4)
        prompt = "count: " + " ".join(str(start + i) for i in range(shown))
        pieces = (f" {start + shown + i}" for i in range(tokens))
    elif chosen == "word":
        word = rng.choice(TRAIN_WORDS)
        prompt = "word: " + " ".join([word] * rng.randint(1, 2))
        pieces = (f" {word}" for _ in range(tokens))
    else:
        raise ValueError(f"unknown long sample kind {chosen!r}; valid kinds: {list(LONG_KINDS)}")
    continuation = ""
    for piece in pieces:  # each piece is >= 2 characters, so `tokens` pieces always suffice
        if len(prompt) + len(continuation) + len(piece) + 1 > tokens:
            break
        continuation += piece
    return Sample(chosen, prompt, continuation)
