"""Shrinking a failing program of vLLM's diffusion path (`integrations.vllm.dllm_shrink`),
without vLLM: `fails` is a predicate over the program itself, so what the shrinker keeps and
drops is known."""

from __future__ import annotations

import itertools

import pytest

from integrations.vllm.diffusion import (
    DllmProgram,
    DllmRequest,
    DllmServing,
    dllm_program,
    validate_dllm_request,
)
from integrations.vllm.dllm_shrink import dllm_program_source, dllm_reductions, shrink_dllm
from integrations.vllm.shrink import size

NAMES = {"DllmProgram": DllmProgram, "DllmServing": DllmServing, "DllmRequest": DllmRequest}
#: Every space `dllm_program` draws from.
SPACES = [
    dict(
        zip(
            ("budget_binds", "reach_model_len", "prefix_caching", "priority_policy"),
            flags,
            strict=True,
        )
    )
    for flags in itertools.product((False, True), repeat=4)
]


def _wide_canvas_beside_another(program: DllmProgram) -> bool:
    """The stand-in failure: a request whose canvas is 3 or wider (its own, or the served one),
    a canvas converging after 2 steps or more, and at least one other request."""
    requests = [r for batch in program.arrivals for r in batch]
    width = [r.width or program.serving.canvas_length for r in requests]
    slow = [max(r.converge_after) for r in requests]
    return len(requests) >= 2 and any(w >= 3 and s >= 2 for w, s in zip(width, slow, strict=True))


def test_a_program_shrinks_to_what_the_failure_needs() -> None:
    """Programs with the stand-in failure keep two requests, one of them a canvas exactly 3
    wide converging after exactly 2 steps; every other size is at its least, no abort, no
    option left; the result still fails, and no single change of it does (1-minimal)."""
    shrunk = 0
    for seed in range(60):
        program = dllm_program(seed, priority_policy=seed % 2 == 0)
        if not _wide_canvas_beside_another(program):
            continue
        result = shrink_dllm(program, _wide_canvas_beside_another)
        small = result.program
        assert not result.exhausted and _wide_canvas_beside_another(small), seed
        requests = [r for batch in small.arrivals for r in batch]
        assert len(requests) == 2 and size(small)[1] == 0, seed
        widths = sorted(r.width or small.serving.canvas_length for r in requests)
        assert widths[-1] == 3 and max(max(r.converge_after) for r in requests) == 2, seed
        for r in requests:
            assert (r.prompt_len, r.max_tokens, r.stop_after, r.read_only) == (1, 1, None, False)
            assert (r.max_steps, r.shared_prompt, r.priority) == (None, False, 0), seed
            assert len(r.converge_after) == 1, seed
        assert small.serving.policy == "fcfs" and small.serving.max_num_seqs == 1, seed
        assert not any(_wide_canvas_beside_another(c) for c in dllm_reductions(small)), seed
        shrunk += 1
    assert shrunk > 10, shrunk


def _odd_with_a_wide_canvas(program: DllmProgram) -> bool:
    """A stand-in failure that needs the requests' parity: an odd number of requests, one of
    them with a canvas 3 or wider. No single removal keeps it failing."""
    requests = [r for batch in program.arrivals for r in batch]
    widths = [r.width or program.serving.canvas_length for r in requests]
    return len(requests) % 2 == 1 and any(w >= 3 for w in widths)


def test_a_failure_that_needs_the_parity_shrinks_two_requests_at_a_time() -> None:
    """Three or more requests shrink to one, removed two at a time; without the pairs the
    shrinker stops at three or more."""
    shrunk = 0
    for seed in range(60):
        program = dllm_program(seed)
        if size(program)[0] < 3 or not _odd_with_a_wide_canvas(program):
            continue
        # a budget past the default: every request's sizes shrink before the pairs go
        result = shrink_dllm(program, _odd_with_a_wide_canvas, budget=50_000)
        small = result.program
        assert not result.exhausted and size(small)[0] == 1, seed
        assert not any(_odd_with_a_wide_canvas(c) for c in dllm_reductions(small)), seed
        shrunk += 1
    assert shrunk > 5, shrunk


def test_every_candidate_is_a_valid_program() -> None:
    """A reduction that would make a request too long, too large for the pool or wider than
    the served canvas, or the serving invalid, is never offered; every kind is offered."""
    kinds: set[str] = set()
    for space, seed in itertools.product(SPACES, range(4)):
        program = dllm_program(seed, **space)
        for candidate in dllm_reductions(program):
            for batch in candidate.arrivals:
                for request in batch:
                    validate_dllm_request(candidate.serving, request)
                    assert (request.width or 0) <= candidate.serving.canvas_length
            if size(candidate)[0] < size(program)[0]:
                kinds.add("request")
            elif candidate.serving != program.serving:
                kinds.add("serving")
            elif candidate.arrivals != program.arrivals:
                kinds.add("script")
            else:
                kinds.add("abort or step")
    assert kinds == {"request", "serving", "script", "abort or step"}, kinds


def test_the_budget_bounds_the_runs_and_a_passing_program_is_refused() -> None:
    program = next(p for p in map(dllm_program, range(60)) if _wide_canvas_beside_another(p))
    result = shrink_dllm(program, _wide_canvas_beside_another, budget=5)
    assert result.exhausted and result.runs == 5
    with pytest.raises(ValueError, match="does not fail"):
        shrink_dllm(program, lambda _program: False)


def test_the_printed_program_builds_the_same_program() -> None:
    for space, seed in itertools.product(SPACES, range(40)):
        program = dllm_program(seed, **space)
        assert eval(dllm_program_source(program), dict(NAMES)) == program, (space, seed)
