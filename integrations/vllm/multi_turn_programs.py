"""Engine-core programs with a conversation's next turn: a prompt that continues another
request's prompt and outputs.

A chat's next turn sends the conversation so far, the earlier turn's prompt and the outputs
the model sampled for it, and then the new message. vLLM's block hashes cover output tokens as
they cover prompt tokens, so the next turn hits the blocks that hold the earlier turn's
outputs. The spec keys those blocks by the outputs' ids once a log names them
(`spec.ar.events.ArOutputTokens`, which `VllmEventLog` writes with prefix caching).

`multi_turn_program(seed)` is `core_program(seed)` with prefix caching on, every prompt made
explicit (an unset one as the adapter invents it: `token_ids.unshared_prompt_token`), and,
after `gap_steps(config)` steps with no arrival (time for the first turns to finish), a second
turn for each request the program does not abort: the first turn's prompt and the outputs the
scripted model samples for it (`adapter.output_token`, to its stop token or `max_tokens`),
then 1 to 4 tokens of its own (`token_ids.branch_token`), cut to leave room for its 1 to 4
outputs within `max_model_len`.

`multi_turn_program(seed, greedy=True)` is for a loop whose model samples greedily
(`EngineCoreLoop(..., greedy_outputs=True)`: equal prompts, equal outputs). A third of its
first turns repeat an earlier request's prompt, so conversations share their outputs' blocks
across requests, and next turns that continue equal conversations part only at their own
tokens: where a block's key must chain its parent's and cover its outputs, not its position.
"""

from __future__ import annotations

import random
from dataclasses import replace

from integrations.vllm.adapter import output_token
from integrations.vllm.engine_core import CoreProgram, core_program
from integrations.vllm.token_ids import branch_token, prompt_stream, unshared_prompt_token
from spec.ar.config import ArConfig, ArRequest

#: The suffix of a second turn's request id (the first turn's id, then this).
NEXT_TURN = ".2"


def gap_steps(config: ArConfig) -> int:
    """Steps with no arrival between the first turns and the second: twice `max_model_len`,
    room for a first turn to run to its end (it computes at least one token a step while it
    runs)."""
    return 2 * config.max_model_len


def multi_turn_program(seed: int, *, greedy: bool = False) -> CoreProgram:
    """`core_program(seed)` with prefix caching, explicit prompts and, after `gap_steps`, a
    next turn per request it does not abort (see the module). With `greedy` (for a loop whose
    model samples greedily, `EngineCoreLoop(..., greedy_outputs=True)`), a third of the first
    turns repeat an earlier request's prompt where it fits (a retried or popular prompt), and
    the outputs a next turn continues are the greedy ones: equal prompts, equal outputs."""
    program = core_program(seed)
    config = program.config.replace(enable_prefix_caching=True)
    rnd = random.Random(seed * 7919 + 5)
    aborted = {rid for batch in program.aborts for rid in batch}
    first: list[tuple[ArRequest, ...]] = []
    talks: list[tuple[ArRequest, tuple[int, ...]]] = []  # kept first turns, conversations
    arrival = 0
    for batch in program.arrivals:
        made: list[ArRequest] = []
        for request in batch:
            if request.prompt is None:
                own = (unshared_prompt_token(arrival),) * request.prompt_len
                request = replace(request, prompt=own)
            if greedy:
                request = _maybe_repeat(request, [r for b in first for r in b] + made, config, rnd)
            made.append(request)
            if request.request_id not in aborted:
                talks.append((request, _talk(request, arrival, greedy)))
            arrival += 1
        first.append(tuple(made))
    # the second turns arrive in this order after every first turn: the n-th's own tokens are
    # numbered by its arrival, `arrival + n`
    second = tuple(
        _next_turn(request, talk, arrival + n, config, rnd)
        for n, (request, talk) in enumerate(talks)
    )
    gap = gap_steps(config)
    arrivals = (*first, *((),) * gap, second)
    aborts = (*program.aborts, *((),) * (gap + 1))
    return CoreProgram(config, arrivals, aborts)


def _talk(request: ArRequest, arrival: int, greedy: bool) -> tuple[int, ...]:
    """`request`'s prompt and the outputs the scripted model samples for it (to its stop token
    or `max_tokens`, whichever comes first), greedily or by arrival."""
    prompt = request.prompt or ()
    stream = prompt_stream(prompt) if greedy else None
    outputs = (
        output_token(request, arrival, i, stream=stream) for i in range(1, request.final_output + 1)
    )
    return (*prompt, *outputs)


def _maybe_repeat(
    request: ArRequest, earlier: list[ArRequest], config: ArConfig, rnd: random.Random
) -> ArRequest:
    """`request`, or by a coin (one in three) with the prompt of an earlier request whose
    prompt and `request`'s `max_tokens` fit `max_model_len`."""
    fits = [
        r
        for r in earlier
        if r.prompt is not None and len(r.prompt) + request.max_tokens <= config.max_model_len
    ]
    if not fits or rnd.random() >= 1 / 3:
        return request
    prompt = rnd.choice(fits).prompt
    assert prompt is not None  # `fits` holds explicit prompts only
    return replace(request, prompt_len=len(prompt), prompt=prompt)


def _next_turn(
    request: ArRequest,
    talk: tuple[int, ...],
    arrival: int,
    config: ArConfig,
    rnd: random.Random,
) -> ArRequest:
    """The next turn of `request`, submitted `arrival`-th: its conversation `talk`, then 1 to 4
    tokens of its own, cut to leave room for its 1 to 4 outputs within `max_model_len`."""
    max_tokens = rnd.randint(1, 4)
    own = tuple(branch_token(arrival, i) for i in range(rnd.randint(1, 4)))
    prompt = (talk + own)[: config.max_model_len - max_tokens]
    return ArRequest(
        request.request_id + NEXT_TURN,
        len(prompt),
        max_tokens,
        priority=request.priority,
        prompt=prompt,
    )


__all__ = ["NEXT_TURN", "gap_steps", "multi_turn_program"]
