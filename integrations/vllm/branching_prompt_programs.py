"""Engine-core programs whose prompts branch: a shared start, then tokens of their own.

`core_program` and `shared_prompt_program` share prompts only as prefixes of one shared
prompt. A request that hits another's blocks then goes on with the very tokens those blocks
hold, up to the end of its prompt, so a scheduler that lets it write into a cached block
instead of a private copy writes the same KV there, and no check can tell. Real prompts
branch: a system prompt and then each user's question, a conversation's earlier turns and
then the new message.

`branching_prompt_program(seed)` is `core_program(seed)` (the same configuration, arrivals
and aborts) with, by coins of its own seeded draws, three prompts in four made of a start
taken from a trunk and then tokens no other request has. The trunk is the shared prompt, or
for half of them an earlier request's conversation: its prompt and then the outputs the
scripted model samples for it (`integrations.vllm.adapter.output_token`), as a next turn
would send them. The start is 0 to all of the prompt's tokens, so hits end anywhere: at a
block's end, inside one, on the last token an earlier turn sampled (whose KV nobody
wrote).
"""

from __future__ import annotations

import random
from dataclasses import replace

from integrations.vllm.adapter import output_token
from integrations.vllm.engine_core import SHARED_PROMPT_BASE, CoreProgram, core_program
from integrations.vllm.token_ids import BRANCH_BASE, branch_token
from spec.ar.config import ArRequest

#: Token i of the private part of the prompt of the request submitted n-th is
# The own part of the n-th branching prompt is `token_ids.branch_token(n, i)`: apart from the
# shared prompt, the unshared prompts and the outputs (`integrations.vllm.token_ids`).


def branching_prompt_program(seed: int) -> CoreProgram:
    """`core_program(seed)` with three prompts in four branching: the first k tokens of a
    trunk (the shared prompt, or an earlier request's prompt and outputs), k drawn from 0 to
    the prompt's length, then private tokens to the prompt's length."""
    program = core_program(seed)
    rnd = random.Random(seed * 7919 + 3)
    shared = tuple(range(SHARED_PROMPT_BASE, SHARED_PROMPT_BASE + program.config.max_model_len))
    conversations: list[tuple[int, ...]] = []  # per submitted request: its prompt and outputs
    batches: list[tuple[ArRequest, ...]] = []
    for batch in program.arrivals:
        drawn: list[ArRequest] = []
        for request in batch:
            if rnd.random() < 0.75:
                trunk = shared
                if conversations and rnd.random() < 0.5:
                    trunk = rnd.choice(conversations)
                request = replace(request, prompt=_branch(request, trunk, len(conversations), rnd))
            drawn.append(request)
            conversations.append(_conversation(request, len(conversations)))
        batches.append(tuple(drawn))
    return replace(program, arrivals=tuple(batches))


def _branch(
    request: ArRequest, trunk: tuple[int, ...], number: int, rnd: random.Random
) -> tuple[int, ...]:
    """`request`'s prompt: the first k tokens of `trunk`, then its own to its length."""
    start = rnd.randint(0, min(len(trunk), request.prompt_len))
    own = range(request.prompt_len - start)
    return trunk[:start] + tuple(branch_token(number, i) for i in own)


def _conversation(request: ArRequest, arrival: int) -> tuple[int, ...]:
    """The prompt of `request` (submitted `arrival`-th) and every output it may sample (to its
    stop token or `max_tokens`): what its next turn's prompt starts with. A prompt the program
    leaves unset is the adapter's, which shares nothing: no trunk (empty)."""
    if request.prompt is None:
        return ()
    last = request.max_tokens if request.stop_after is None else request.stop_after
    outputs = tuple(output_token(request, arrival, i) for i in range(1, last + 1))
    return request.prompt + outputs


__all__ = ["BRANCH_BASE", "branching_prompt_program"]
