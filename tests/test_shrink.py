"""Shrinking a failing engine-core program (`integrations.vllm.shrink`), without vLLM: `fails`
is a predicate over the program itself, so what the shrinker keeps and drops is known."""

from __future__ import annotations

import pytest

from integrations.vllm.engine_core import CoreProgram, core_program
from integrations.vllm.shrink import program_source, reductions, shrink, size
from spec.ar.config import ArConfig, ArRequest, Policy, validate_ar_request


def _long_prompt_beside_another(program: CoreProgram) -> bool:
    """The stand-in failure: a prompt of 5 tokens or more, and at least one other request."""
    requests = [r for batch in program.arrivals for r in batch]
    return len(requests) >= 2 and any(r.prompt_len >= 5 for r in requests)


def test_a_program_shrinks_to_what_the_failure_needs() -> None:
    """Program 3 (and others) keep two requests, one with a prompt of exactly 5 tokens, every
    other size at its least, no abort; the result still fails, and no single change of it
    does (1-minimal)."""
    shrunk_any = 0
    for seed in range(40):
        program = core_program(seed)
        if not _long_prompt_beside_another(program):
            continue
        result = shrink(program, _long_prompt_beside_another)
        small = result.program
        assert not result.exhausted and _long_prompt_beside_another(small), seed
        requests = [r for batch in small.arrivals for r in batch]
        assert len(requests) == 2 and sorted(r.prompt_len for r in requests) == [1, 5], seed
        assert all(r.max_tokens == 1 and r.prompt is None for r in requests), seed
        assert size(small)[1] == 0, seed
        assert not any(_long_prompt_beside_another(c) for c in reductions(small)), seed
        shrunk_any += size(small) < size(program)
    assert shrunk_any > 10


def _odd_with_a_long_prompt(program: CoreProgram) -> bool:
    """A stand-in failure that needs the requests' parity: an odd number of requests, one of
    them with a prompt of 5 tokens or more. No single removal keeps it failing."""
    requests = [r for batch in program.arrivals for r in batch]
    return len(requests) % 2 == 1 and any(r.prompt_len >= 5 for r in requests)


def test_a_failure_that_needs_the_parity_shrinks_two_requests_at_a_time() -> None:
    """Three or more requests shrink to the one with the long prompt, removed two at a time;
    without the pairs the shrinker stopped at three (or more)."""
    shrunk_any = 0
    for seed in range(40):
        program = core_program(seed)
        if size(program)[0] < 3 or not _odd_with_a_long_prompt(program):
            continue
        small = shrink(program, _odd_with_a_long_prompt).program
        requests = [r for batch in small.arrivals for r in batch]
        assert [r.prompt_len for r in requests] == [5], seed
        assert not any(_odd_with_a_long_prompt(c) for c in reductions(small)), seed
        shrunk_any += 1
    assert shrunk_any > 5


def test_every_candidate_is_a_valid_program() -> None:
    """A reduction that would make a request too long for the configuration, or the
    configuration invalid, is never offered."""
    for seed in range(30):
        for candidate in reductions(core_program(seed)):
            for batch in candidate.arrivals:
                for request in batch:
                    validate_ar_request(candidate.config, request)


def test_the_budget_bounds_the_runs_and_a_passing_program_is_refused() -> None:
    program = core_program(3)
    result = shrink(program, _long_prompt_beside_another, budget=5)
    assert result.exhausted and result.runs == 5
    with pytest.raises(ValueError, match="does not fail"):
        shrink(program, lambda _program: False)


def test_the_printed_program_builds_the_same_program() -> None:
    names = {"CoreProgram": CoreProgram, "ArConfig": ArConfig, "ArRequest": ArRequest}
    for seed in range(300):
        program = core_program(seed)
        assert eval(program_source(program), {**names, "Policy": Policy}) == program, seed
