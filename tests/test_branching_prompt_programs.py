"""The branching-prompt engine-core programs (`integrations.vllm.branching_prompt_programs`),
without vLLM: each is `core_program`'s with only prompts changed, every request stays valid,
and prompts share a start (of the shared prompt, or of an earlier request's prompt and
outputs) and then go on with tokens no other request has."""

from __future__ import annotations

from integrations.vllm.adapter import output_token
from integrations.vllm.branching_prompt_programs import branching_prompt_program
from integrations.vllm.engine_core import SHARED_PROMPT_BASE
from integrations.vllm.token_ids import BRANCH_BASE, BRANCH_POSITION_BITS
from spec.ar.config import ArRequest
from tests.engine_core_programs import assert_only_prompts_differ, assert_requests_valid

SEEDS = range(300)


def _submitted(seed: int) -> list[ArRequest]:
    """Program `seed`'s requests in submission order."""
    return [r for batch in branching_prompt_program(seed).arrivals for r in batch]


def test_only_prompts_differ_from_the_random_program() -> None:
    """The configuration, aborts and every request but its prompt are `core_program(seed)`'s,
    and a program is the same on every call (its draws are seeded)."""
    assert_only_prompts_differ(branching_prompt_program, SEEDS)
    assert all(branching_prompt_program(seed) == branching_prompt_program(seed) for seed in SEEDS)


def test_every_request_is_valid_for_its_program() -> None:
    assert_requests_valid(branching_prompt_program, SEEDS)


def _own_start(request: ArRequest, arrival: int) -> int:
    """Where `request`'s own tokens start (its prompt's length when it has none), checking
    they are BRANCH_BASE + (arrival << BRANCH_POSITION_BITS) + 0, 1, ... to the prompt's end."""
    assert request.prompt is not None
    first = BRANCH_BASE + (arrival << BRANCH_POSITION_BITS)
    end = first + (1 << BRANCH_POSITION_BITS)
    start = next(
        (i for i, t in enumerate(request.prompt) if first <= t < end),
        len(request.prompt),
    )
    own = request.prompt[start:]
    assert own == tuple(first + i for i in range(len(own))), own
    return start


def _conversation(request: ArRequest, arrival: int) -> tuple[int, ...]:
    """`request`'s prompt and then every output the scripted model samples for it."""
    if request.prompt is None:
        return ()
    last = request.max_tokens if request.stop_after is None else request.stop_after
    return request.prompt + tuple(output_token(request, arrival, i) for i in range(1, last + 1))


def test_prompts_branch_off_the_shared_prompt_or_an_earlier_conversation() -> None:
    """About three prompts in four branch (fewer have tokens of their own: the start may be all
    of the prompt): a start of a trunk and then tokens of their own. A
    trunk is the shared prompt or an earlier request's prompt followed by the outputs the
    scripted model samples for it. Both kinds occur, starts end inside a block, and some
    reach into an earlier request's outputs."""
    own = total = from_shared = into_outputs = inside_a_block = 0
    shared = tuple(range(SHARED_PROMPT_BASE, SHARED_PROMPT_BASE + 10_000))
    for seed in SEEDS:
        program = branching_prompt_program(seed)
        requests = _submitted(seed)
        conversations = [_conversation(r, a) for a, r in enumerate(requests)]
        total += len(requests)
        for arrival, request in enumerate(requests):
            if request.prompt is None:
                continue
            start = _own_start(request, arrival)
            if start == len(request.prompt):
                continue  # no own tokens: a prefix of a trunk, as core_program draws too
            own += 1
            inside_a_block += start % program.config.block_size != 0
            trunk = request.prompt[:start]
            if trunk == shared[:start]:
                from_shared += 1
                continue
            earlier = [e for e in range(arrival) if conversations[e][:start] == trunk]
            assert earlier, (seed, request)
            into_outputs += any(start > len(requests[e].prompt or ()) for e in earlier)
    assert 0.5 < own / total < 0.75, (own, total)  # 3 in 4, less those with a start of all
    assert from_shared and into_outputs and inside_a_block, (from_shared, into_outputs)
