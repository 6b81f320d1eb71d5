"""The token ids the vLLM adapters invent: every prompt, output, stop, reasoning and draft token
of a driven request, each in a region of its own below 2**31.

vLLM 0.34.0 stores a request's tokens as int32 (`vllm.v1.token_buffer.TokenBuffer`), so every
id must fit one; 0.33.0 took any Python int. Only equality matters to the scheduler (prefix
caching hashes blocks by their ids; a stop token ends a request; a draft is accepted when it is
the true next token), so the layout's one contract is that ids of different roles, requests,
turns or positions never meet. The regions, from the bottom:

| ids | what |
|---|---|
| 3 | a diffusion canvas token (`diffusion.CANVAS_TOKEN`) |
| 100 + i | token i of the engine-core loop's shared prompt (`engine_core.SHARED_PROMPT_BASE`) |
| `UNSHARED_BASE` + a | the prompt of the a-th request that shares nothing |
| 2,000,000 + i | token i of the diffusion loop's shared prompt |
| `BRANCH_BASE` + (n << 12) + i | token i of the n-th branching prompt's own part |
| `SESSION_INPUT_BASE` + (a << 16) + (t << 10) + i | token i of a session's input for turn t |
| `STOP_BASE` + a | the stop token of the a-th request |
| `REASONING_END`, `REASONING_START` | a reasoning part's end and start |
| `WRONG_DRAFT` + n | the n-th wrong draft of the speculative model |
| `OUTPUT_BASE` + (a << 16) + ((t - 1) << 12) + i | output i of turn t of the a-th request |

A greedy model's outputs (`prompt_stream`) take its stream for a: equal prompts, equal outputs.

A number outside its field (a 16,384th request, a 4,096th output of one turn) raises a
`ConfigError` naming the bound, never a silent collision.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from spec.errors import ConfigError

UNSHARED_BASE = 1_000_000
BRANCH_BASE = 1 << 24
SESSION_INPUT_BASE = 1 << 26
STOP_BASE = 1 << 28
REASONING_END = (1 << 28) + (1 << 27)
REASONING_START = REASONING_END + 1
WRONG_DRAFT = 1 << 29
OUTPUT_BASE = 1 << 30

#: Field widths (bits) of the packed regions.
BRANCH_POSITION_BITS = 12
SESSION_TURN_SHIFT = 10
SESSION_ARRIVAL_SHIFT = 16
OUTPUT_TURN_SHIFT = 12
OUTPUT_ARRIVAL_SHIFT = 16


def _field(name: str, value: int, bits: int, low: int = 0) -> int:
    """`value - low` when it is low <= value < low + 2**bits, else a `ConfigError` naming the
    bound."""
    if not low <= value < low + (1 << bits):
        raise ConfigError(
            name,
            value,
            f"{low}..{low + (1 << bits) - 1} (the adapter's token ids fit vLLM's int32 token "
            "buffers)",
        )
    return value - low


def output_token_id(arrival: int, index: int, turn: int = 1) -> int:
    """Output number `index` (1-based) of turn `turn` of the request submitted `arrival`-th."""
    return (
        OUTPUT_BASE
        + (_field("arrival", arrival, 30 - OUTPUT_ARRIVAL_SHIFT) << OUTPUT_ARRIVAL_SHIFT)
        + (_field("turn", turn, OUTPUT_ARRIVAL_SHIFT - OUTPUT_TURN_SHIFT, 1) << OUTPUT_TURN_SHIFT)
        + _field("output index", index, OUTPUT_TURN_SHIFT)
    )


#: The answers of the greedy model (`prompt_stream`): few, so that different prompts often
#: sample the same outputs (a canned reply), as well as equal prompts always.
GREEDY_ANSWERS = 4


def prompt_stream(prompt: Sequence[int]) -> int:
    """The output stream (`output_token_id`'s `arrival` field) of the greedy model's request
    with `prompt`: a hash of the prompt, one of `GREEDY_ANSWERS`, so equal prompts sample equal
    outputs and different ones often do too."""
    text = ",".join(str(int(t)) for t in prompt).encode()
    return zlib.crc32(text) % GREEDY_ANSWERS


def stop_token_id(arrival: int) -> int:
    """The stop token (its only `stop_token_ids` entry) of the request submitted `arrival`-th."""
    return STOP_BASE + _field("arrival", arrival, 27)


def unshared_prompt_token(arrival: int) -> int:
    """The one token an adapter-made prompt of the `arrival`-th request repeats."""
    return UNSHARED_BASE + _field("arrival", arrival, 19)


def session_input_token(arrival: int, turn: int, position: int) -> int:
    """Token `position` of the input starting turn `turn` of the session submitted
    `arrival`-th."""
    return (
        SESSION_INPUT_BASE
        + (_field("arrival", arrival, 28 - 2 - SESSION_ARRIVAL_SHIFT) << SESSION_ARRIVAL_SHIFT)
        + (_field("turn", turn, SESSION_ARRIVAL_SHIFT - SESSION_TURN_SHIFT) << SESSION_TURN_SHIFT)
        + _field("input position", position, SESSION_TURN_SHIFT)
    )


def branch_token(number: int, position: int) -> int:
    """Token `position` of the own part of the `number`-th branching prompt."""
    return (
        BRANCH_BASE
        + (_field("branch", number, 24 - BRANCH_POSITION_BITS) << BRANCH_POSITION_BITS)
        + _field("branch position", position, BRANCH_POSITION_BITS)
    )


def wrong_draft(n: int) -> int:
    """The `n`-th wrong draft of the speculative model: never a token of a request."""
    return WRONG_DRAFT + _field("wrong draft", n, 29)


__all__ = [
    "BRANCH_BASE",
    "OUTPUT_BASE",
    "REASONING_END",
    "REASONING_START",
    "SESSION_INPUT_BASE",
    "STOP_BASE",
    "UNSHARED_BASE",
    "WRONG_DRAFT",
    "branch_token",
    "output_token_id",
    "session_input_token",
    "stop_token_id",
    "unshared_prompt_token",
    "wrong_draft",
]
