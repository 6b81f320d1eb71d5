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
scripted model samples for it (`branching_prompt_programs.conversation`, to its stop token or
`max_tokens`), then 1 to 4 tokens of its own
(`token_ids.branch_token`), cut to leave room for its 1 to 4 outputs within `max_model_len`.
"""

from __future__ import annotations

import random
from dataclasses import replace

from integrations.vllm.branching_prompt_programs import conversation
from integrations.vllm.engine_core import CoreProgram, core_program
from integrations.vllm.token_ids import branch_token, unshared_prompt_token
from spec.ar.config import ArConfig, ArRequest

#: The suffix of a second turn's request id (the first turn's id, then this).
NEXT_TURN = ".2"


def gap_steps(config: ArConfig) -> int:
    """Steps with no arrival between the first turns and the second: twice `max_model_len`,
    room for a first turn to run to its end (it computes at least one token a step while it
    runs)."""
    return 2 * config.max_model_len


def multi_turn_program(seed: int) -> CoreProgram:
    """`core_program(seed)` with prefix caching, explicit prompts and, after `gap_steps`, a
    next turn per request it does not abort (see the module)."""
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
            made.append(request)
            if request.request_id not in aborted:
                # what it samples: to its stop token or max_tokens, whichever comes first
                talk = conversation(request, arrival)[: request.prompt_len + request.final_output]
                talks.append((request, talk))
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
