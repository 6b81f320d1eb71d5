"""The shared-prompt engine-core programs (`integrations.vllm.shared_prompt_programs`), without
vLLM: each is `core_program`'s with only prompts changed, every request stays valid, and
programs without prefix caching share prompts too."""

from __future__ import annotations

from collections.abc import Callable

from integrations.vllm.engine_core import SHARED_PROMPT_BASE, CoreProgram, core_program
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArRequest
from tests.engine_core_programs import assert_only_prompts_differ, assert_requests_valid

SEEDS = range(300)


def test_only_prompts_differ_from_the_random_program() -> None:
    """The configuration, aborts and every request but its prompt are `core_program(seed)`'s;
    a prefix-caching program is that program unchanged."""
    assert_only_prompts_differ(shared_prompt_program, SEEDS)
    for seed in SEEDS:
        if core_program(seed).config.enable_prefix_caching:
            assert shared_prompt_program(seed) == core_program(seed), seed


def test_every_request_is_valid_for_its_program() -> None:
    assert_requests_valid(shared_prompt_program, SEEDS)


def _unprefixed_requests(generate: Callable[[int], CoreProgram]) -> list[ArRequest]:
    """The requests of `generate`'s programs without prefix caching, over SEEDS."""
    programs = [generate(seed) for seed in SEEDS]
    return [
        r
        for program in programs
        if not program.config.enable_prefix_caching
        for batch in program.arrivals
        for r in batch
    ]


def test_about_half_the_prompts_without_prefix_caching_are_shared() -> None:
    """Programs without prefix caching (about two in three) now share prompts, as the random
    ones did not: a shared prompt is the first `prompt_len` tokens of one prompt, and about
    half the requests have one."""
    requests = _unprefixed_requests(shared_prompt_program)
    shared = [r for r in requests if r.prompt is not None]
    base = SHARED_PROMPT_BASE
    assert all(r.prompt == tuple(range(base, base + r.prompt_len)) for r in shared)
    assert 0.4 < len(shared) / len(requests) < 0.6, (len(shared), len(requests))
    assert all(r.prompt is None for r in _unprefixed_requests(core_program))
