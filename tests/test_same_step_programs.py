"""The narrowed engine-core programs (`integrations.vllm.same_step_programs`), without vLLM:
each is inside the space it promises, and none of its requests would be refused (the loop
drops a refused request silently, so an invalid one would only thin the program)."""

from __future__ import annotations

from integrations.vllm.same_step_programs import same_step_program
from spec.ar.config import Policy
from tests.engine_core_programs import assert_requests_valid

SEEDS = range(500)


def test_every_program_is_priority_with_prefix_caching_and_chunked_prefill() -> None:
    for seed in SEEDS:
        config = same_step_program(seed).config
        assert config.policy is Policy.PRIORITY, seed
        assert config.enable_prefix_caching and config.enable_chunked_prefill, seed
        assert config.reserve_null_block, seed
        assert 2 <= config.long_prefill_token_threshold <= 3, seed


def test_every_request_is_valid_for_its_program() -> None:
    assert_requests_valid(same_step_program, SEEDS)


def test_a_long_less_urgent_request_comes_first_then_short_more_urgent_ones() -> None:
    """The shape the finding needs: the first request's prompt is within 3 tokens of the
    model length, every later one has 1 or 2 prompt tokens, and urgency never falls. Aborts
    name only requests that arrived at an earlier step."""
    for seed in SEEDS:
        program = same_step_program(seed)
        requests = [r for batch in program.arrivals for r in batch]
        assert len(requests) >= 2 and not program.arrivals[0][1:], seed
        first, *later = requests
        assert first.prompt_len >= program.config.max_model_len - 3, seed
        assert all(r.prompt_len <= 2 for r in later), seed
        priorities = [r.priority for r in requests]
        assert priorities == sorted(priorities, reverse=True), seed
        for step, aborts in enumerate(program.aborts):
            earlier = {r.request_id for batch in program.arrivals[:step] for r in batch}
            assert set(aborts) <= earlier, (seed, step, aborts)


def test_some_requests_stop_early_and_some_are_aborted() -> None:
    """Stop tokens and aborts are drawn (so the loops' paths for them are taken), each a
    minority of the requests."""
    requests = [r for seed in SEEDS for batch in same_step_program(seed).arrivals for r in batch]
    stopping = sum(r.stop_after is not None for r in requests) / len(requests)
    aborted = sum(len(a) for seed in SEEDS for a in same_step_program(seed).aborts)
    assert 0.2 < stopping < 0.4
    assert 0 < aborted < len(requests) / 4


def test_most_prompts_share_one_prefix() -> None:
    """Four prompts in five are prefixes of one shared prompt, so a resumed or later request
    can look the victim's blocks up; over 500 programs the share is near that."""
    shared = [
        r.prompt is not None
        for seed in SEEDS
        for batch in same_step_program(seed).arrivals
        for r in batch
    ]
    assert 0.7 < sum(shared) / len(shared) < 0.9
